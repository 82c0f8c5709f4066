/* Model presets: a JSON file listing a model's tensors by layer kind, with named dims and
 * scaling knobs, expanded into the flat list of tensors a trainer would register. Shared by the
 * benchmarks and tools (not part of the library). */
#ifndef BENCH_PRESET_H
#define BENCH_PRESET_H

#include <stddef.h>
#include <stdint.h>

struct preset_tensor {
    char name[128];
    int ndim;
    int64_t shape[3];
    int expert; /* placement expert ([E, out, in] stack) */
};

struct preset {
    char name[64];
    struct preset_tensor *t;
    int n;
    int64_t total; /* elements */
    int dense_layers, moe_layers;
};

struct preset_scale {
    int layers;      /* > 0: this many MoE layers (dense layers for a dense model) */
    int width_div;   /* > 1: divide the width dims by this (at least 1 left) */
    int experts_div; /* > 1: divide the expert count by this */
};

/* Load `name` (a file path, or a preset name looked up in dir) and expand it. Returns 0, or -1
 * with a message in err naming the file, the entry and what is wrong. */
int preset_load(const char *name, const char *dir, const struct preset_scale *scale,
                struct preset *out, char *err, size_t errlen);

void preset_free(struct preset *p);

struct cJSON;

/* `path` read as a regular file and parsed as strict JSON (runtime/config/json_strict.h: a key
 * twice, text after the value, NaN refused): 0 with *root (cJSON_Delete it), or -1 with err
 * "<what> <path>: cannot read" or "<what> <path>: not JSON (byte N: ...)". */
int preset_json_read(const char *path, const char *what, struct cJSON **root, char *err,
                     size_t errlen);

/* 1 when s is text a table or a JSON string may hold as it is: not empty, no control byte, no
 * quote, no backslash. */
int preset_name_ok(const char *s);

/* 1 when every key of obj is in known (NULL-terminated); else 0 with *bad the first other. */
int preset_keys_known(const struct cJSON *obj, const char *const *known, const char **bad);

/* A whole file into a malloc'd, NUL-terminated string (the caller frees it). 0, or -1. */
int preset_file_read(const char *path, char **text);

#endif

/* A checkpoint's index.json as a load holds it once read and checked (checkpoint_index.c), for
 * checkpoint_load.c. Private to the checkpoint files. */
#ifndef RUNTIME_CHECKPOINT_INDEX_H
#define RUNTIME_CHECKPOINT_INDEX_H

#include <cjson/cJSON.h>

#include "runtime/checkpoint/checkpoint.h"

struct ck_shard {
    const char *file;    /* points into the parsed JSON */
    struct plan_box box; /* 3-D, leading dims of 1 */
    uint32_t crc;
    uint32_t *blocks; /* CRC32C of each CKPT_BLOCK bytes */
};

struct ck_tensor {
    const char *name;
    int is_weight; /* named as its parameter: the parameter itself ("weights": true) */
    int dtype, ndim;
    int64_t shape[3];
    struct ck_shard *shards;
    int nshards;
};

/* A "params" record. */
struct ck_param {
    const char *name; /* points into the parsed JSON */
    int algo, ndim;
    int64_t shape[3];
    uint64_t step;
};

/* The parsed index: every pointer into `root`, which it owns. */
struct ck_index {
    char dir[4096]; /* the step directory, as messages name it */
    cJSON *root;
    uint64_t step;
    struct ck_tensor *t;
    int nt;
    const struct ck_tensor **by; /* t sorted by name */
    struct ck_param *p;          /* sorted by name */
    int np;
    int weights; /* the index says "weights": true */
};

/* Rank 0: which step directory `dir` means (dir itself when it holds index.json, else the one
 * dir/latest names) into stepdir (len bytes), its index text (*text_len bytes, a NUL after them;
 * free it) and whether its integrity record matched (*verified; an index of format_version 1 may
 * have none). A damaged record or latest is refused. */
shardopt_status_t ckpt_index_read(const char *dir, char *stepdir, size_t len, char **text,
                                  size_t *text_len, int *verified);

/* Every check of the index text (len bytes, a NUL after them), before a shard is read; L->dir
 * set, the rest zeroed. `verified`: rank 0 found index.json.crc32c beside it and it matched;
 * `quiet`: no notice (every rank but 0). On failure too, release L with ckpt_index_free. */
shardopt_status_t ckpt_index_parse(struct ck_index *L, const char *text, size_t len, int verified,
                                   int quiet);

/* The tensor, or the params record, called name; NULL when there is none. O(log n). */
const struct ck_tensor *ckpt_index_find(const struct ck_index *L, const char *name);
const struct ck_param *ckpt_index_param(const struct ck_index *L, const char *name);

/* Release what ckpt_index_parse allocated (a zeroed index is fine). */
void ckpt_index_free(struct ck_index *L);

#endif

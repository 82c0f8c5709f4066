/* A checkpoint's index.json as a load holds it once read and checked (checkpoint_index.c, the
 * writers' indexes: checkpoint_writer_index.c, what they share: checkpoint_records.c), for
 * checkpoint_load.c. Private to the checkpoint files. */
#ifndef RUNTIME_CHECKPOINT_INDEX_H
#define RUNTIME_CHECKPOINT_INDEX_H

#include <cjson/cJSON.h>

#include "runtime/checkpoint/checkpoint.h"

struct ck_shard {
    const char *file;    /* points into the parsed JSON (version 4: into ck_index.files) */
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
    int cap;         /* version 4: shards allocated */
    int need;        /* version 4: 1 + its entry in the needs (0: not needed) */
    int seen_writer; /* version 4: 1 + the last writer whose record of it was read */
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
    int version;
    int writers;  /* version 4: how many rank-NNNNN.index.json (the saving world's dense ranks) */
    int ep;       /* version 4: the saving world's EP size (layout.ep) */
    char **files; /* version 4: the rank file names the records read name, owned */
    int nfiles, files_cap;
    int writers_read; /* version 4: how many writer indexes ckpt_index_select read */
};

/* A part of a tensor this rank needs (version 4): its name and box (3-D, leading dims of 1), and
 * how this rank's trainer shards it (a hint to where the saving world's writers held it: the
 * layout the loader guesses the saver had, checked by what the writers' indexes say). */
struct ck_need {
    const char *tensor;
    struct plan_box box;
    int dim;    /* the shard dim, 3-D */
    int expert; /* an expert stack: split over EP (dim 0), then chunked over the expert group */
};

/* Reads writer w's index text (*len bytes, a NUL after them; the caller frees it) after checking
 * its integrity record: the loader reads step/rank-NNNNN.index.json; the simulated-world harness
 * (tests/unit/test_ckpt_index_scale.c) synthesizes it. */
typedef shardopt_status_t (*ck_writer_read_fn)(void *ctx, const char *stepdir, int w, char **text,
                                               size_t *len);

/* The loader's reader: stepdir/rank-NNNNN.index.json and its record rank-NNNNN.index.json.crc32c
 * (ctx unused). */
shardopt_status_t ckpt_index_writer_read(void *ctx, const char *stepdir, int w, char **text,
                                         size_t *len);

/* Version 4: read writer indexes, one at a time, until every need is covered: writer 0 first (a
 * replicated tensor is only there); then, for each need still uncovered, the writers that held
 * its part if the saving world sharded it as this rank's trainer does (torch.chunk pieces over the
 * saved layout's dense group, or EP then the expert group: index.json's layout); then, for what
 * is still uncovered, every other writer outward from this rank's relative position (me of nme).
 * A load on the layout that saved reads two, a load on another layout the writers its parts span;
 * a trainer that shards otherwise is loaded as correctly, reading more. Every record of every
 * writer index read is
 * checked whole; the shards overlapping a need are kept (t->shards), the others dropped. Then
 * the kept shards of each need must tile its box exactly (no overlap, no gap) before a byte of a
 * rank file is read. Versions 1-3: nothing to do (the index held every shard, tiling checked). */
shardopt_status_t ckpt_index_select(struct ck_index *L, const struct ck_need *need, int nneed,
                                    int me, int nme, ck_writer_read_fn rd, void *ctx);

/* For the simulated-world harness: called after each writer index is parsed, while its tree is
 * alive (the peak of a load's index memory), and in a save where a writer's index and rank 0's
 * index.json are held as a tree and its text at once (the peaks of a save's). NULL otherwise. */
extern void (*ckpt_index_test_probe)(void);

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

/* ---- what index.json and the writers' indexes share (checkpoint_records.c) ---- */

/* Every integer in the index is at most this: doubles (cJSON's numbers) are exact below 2^53. */
#define CK_INT_MAX 9.0e15

/* A JSON number holding an integer in [0, max]; the only conversion of an index number to an
 * integer goes through here or ckpt_json_i64s (an array of at most max such, at most CK_INT_MAX
 * each: 0, or -1 when it is not one). */
int ckpt_json_uint(const cJSON *v, double max, uint64_t *out);

/* A parameter's step count in an index is below this: shardopt_param_set_step's bound
 * (PARAM_STEP_LIMIT, runtime/param_state.c), what a JSON number read as a double holds exactly. */
#define CKPT_STEP_LIMIT (1ull << 53)
int ckpt_json_i64s(const cJSON *a, int64_t *out, int max, int *n);

/* SHARDOPT_ERR_CORRUPT, logged as "load: dir/file: what" and the tensor's name escaped when
 * tensor is not NULL. file: "index.json", or a writer's index (version 4). */
shardopt_status_t ckpt_index_bad_in(const char *dir, const char *file, const char *what,
                                    const char *tensor);

/* The rank file's header entry st of shard sh of tensor t: t's dtype, and the shard's shape (as
 * the writer wrote both), else ERR_CORRUPT naming the file, the tensor and both. */
struct st_tensor;
shardopt_status_t ckpt_shard_header_check(const char *dir, const struct ck_tensor *t,
                                          const struct ck_shard *sh, const struct st_tensor *st);

/* One shard record of tensor t (whose shape, ndim long, is `shape`): its file (with_file; else
 * the caller sets it), offset and shape inside the tensor, CRC lists that fit; the box made 3-D.
 * ixfile: the index file that holds it, for messages. */
shardopt_status_t ckpt_shard_parse(const char *dir, const char *ixfile, const struct ck_tensor *t,
                                   const int64_t *shape, const cJSON *s, int with_file,
                                   struct ck_shard *sh);

/* A corner of a shard's box, with its sign, for ckpt_shards_tile. */
struct ck_corner {
    int64_t x[3];
    int sign;
};

/* Do t's shards tile it exactly (every element in exactly one shard)? `c` holds 8 (nshards + 1)
 * corners. If not, ckpt_tiling_problem says why, from the volumes. */
int ckpt_shards_tile(const struct ck_tensor *t, struct ck_corner *c);
const char *ckpt_tiling_problem(const struct ck_tensor *t);

#endif

/* shardopt_load: follow DIR/latest (or take a step directory), read the index, and fill every
 * rank's state from the shards that overlap it, reading only the blocks it needs and checking
 * each block's CRC32C. Everything lands in a staging copy first; the state changes only when
 * every rank succeeded, so a refused checkpoint leaves memory as it was on every rank. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/crc32c.h"
#include "base/fault.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/status.h"
#include "checkpoint.h"
#include "comm_wait.h"
#include "json_strict.h"
#include "json_util.h"
#include "safetensors.h"
#include "sharding/reshard.h"

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

struct ck_file {
    const char *name;
    int fd;
    uint64_t size;
    struct st_header hdr;
    int opened;
};

struct ck_load {
    char dir[4096];
    cJSON *root;
    uint64_t step;
    struct ck_tensor *t;
    int nt;
    const struct ck_tensor **by; /* t sorted by name */
    struct ck_param *p;          /* sorted by name */
    int np;
    struct ck_file *files;
    int nfiles;
    unsigned char *staging; /* the new state, in the arena's kind of memory */
    unsigned char *fill;    /* what rank_fill writes: staging, or its host copy (device state) */
    const unsigned char *current; /* the state now, as host memory (load_allow_missing) */
    void *current_copy, *fill_copy;
    uint64_t *steps;     /* per registered param */
    unsigned char *read; /* per registered param: state read from the checkpoint */
    unsigned char *chunk;
    int converted;
    int weights;          /* the index says "weights": true */
    unsigned char *wfill; /* ckpt_weights: the parameters read, host memory, at woff[i] */
    size_t *woff;         /* per registered param */
    unsigned char *wread; /* per registered param: its weight was read */
    const struct state_store *store; /* staging is a buffer of its kind */
    char converted_names[512];
};

/* ---- the index ---- */

/* Every integer in the index is at most this: doubles (cJSON's numbers) are exact below 2^53. */
#define CK_INT_MAX 9.0e15

/* A JSON number holding an integer in [0, max]; the only conversion of an index number to an
 * integer goes through here or json_i64s. */
static int json_uint(const cJSON *v, double max, uint64_t *out)
{
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble <= max) ||
        v->valuedouble != floor(v->valuedouble))
        return 0;
    *out = (uint64_t)v->valuedouble;
    return 1;
}

static int json_i64s(const cJSON *a, int64_t *out, int max, int *n)
{
    const cJSON *e;
    *n = 0;
    if (!cJSON_IsArray(a))
        return -1;
    cJSON_ArrayForEach(e, a)
    {
        uint64_t v;
        if (*n == max || !json_uint(e, CK_INT_MAX, &v))
            return -1;
        out[(*n)++] = (int64_t)v;
    }
    return 0;
}

static shardopt_status_t index_bad(const char *dir, const char *what, const char *tensor)
{
    char shown[600]; /* the name as the file has it: escaped */
    return log_fail(SHARDOPT_ERR_CORRUPT, "load: %s/index.json: %s%s%s%s", dir, what,
                    tensor ? " (tensor '" : "",
                    tensor ? log_escape(shown, sizeof shown, tensor, strlen(tensor)) : "",
                    tensor ? "')" : "");
}

static int tensor_ptr_by_name(const void *a, const void *b)
{
    return strcmp((*(const struct ck_tensor *const *)a)->name,
                  (*(const struct ck_tensor *const *)b)->name);
}

static int param_by_name(const void *a, const void *b)
{
    return strcmp(((const struct ck_param *)a)->name, ((const struct ck_param *)b)->name);
}

static const struct ck_param *param_find(const struct ck_load *L, const char *name)
{
    const struct ck_param key = {.name = name};
    return L->np > 0 ? bsearch(&key, L->p, (size_t)L->np, sizeof *L->p, param_by_name) : NULL;
}

/* format, format_version, step, layout, config. `verified`: index.json.crc32c matched the text
 * (rank 0 checked it before any of this was read). */
static shardopt_status_t index_top(struct ck_load *L, int verified, int quiet)
{
    static int v1_noticed;
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(L->root, "format");
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(L->root, "format_version");
    const cJSON *step = cJSON_GetObjectItemCaseSensitive(L->root, "step");
    const cJSON *lay = cJSON_GetObjectItemCaseSensitive(L->root, "layout");
    const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(L->root, "config"), *e;
    uint64_t version, v[6];
    static const char *const lay_keys[6] = {"ranks", "dp_replicate", "dp_shard",
                                            "cp",    "ep",           "block_bytes"};

    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "shardopt-checkpoint") != 0)
        return index_bad(L->dir, "\"format\" is not \"shardopt-checkpoint\"", NULL);
    if (!json_uint(ver, CK_INT_MAX, &version))
        return index_bad(L->dir, "\"format_version\" is not an integer", NULL);
    if (version < CKPT_FORMAT_OLDEST || version > CKPT_FORMAT_VERSION)
        return log_fail(SHARDOPT_ERR_UNSUPPORTED,
                        "load: %s/index.json: format_version %llu: this version reads %d to %d",
                        L->dir, (unsigned long long)version, CKPT_FORMAT_OLDEST,
                        CKPT_FORMAT_VERSION);
    if (version >= 2 && !verified) {
        char what[200];
        snprintf(what, sizeof what,
                 "format_version %llu and no " CKPT_INDEX_CRC_NAME
                 " beside it: the index's integrity record is missing",
                 (unsigned long long)version);
        return index_bad(L->dir, what, NULL);
    }
    /* "weights" came with version 3 (and every version-3 index says whether it has them) */
    const cJSON *weights = cJSON_GetObjectItemCaseSensitive(L->root, "weights");
    if (weights != NULL && !cJSON_IsBool(weights))
        return index_bad(L->dir, "\"weights\" is not true or false", NULL);
    if ((weights != NULL) != (version >= CKPT_FORMAT_WEIGHTS_FIRST))
        return index_bad(L->dir,
                         weights != NULL ? "\"weights\" in an index of format_version 1 or 2 "
                                           "(it came with version 3)"
                                         : "format_version 3 and no \"weights\"",
                         NULL);
    L->weights = cJSON_IsTrue(weights);
    if (version == 1 && !verified && !quiet && !v1_noticed) {
        v1_noticed = 1;
        log_warn("load: %s/index.json: format_version 1, written before indexes carried "
                 "an integrity record (" CKPT_INDEX_CRC_NAME "): damage to the index itself is "
                 "not detected; the next save writes version %d",
                 L->dir, CKPT_FORMAT_STATE_ONLY);
    }
    if (!json_uint(step, CK_INT_MAX, &L->step))
        return index_bad(L->dir, "\"step\" is not an integer in [0, 9e15]", NULL);
    if (!cJSON_IsObject(lay))
        return index_bad(L->dir, "\"layout\" is not an object", NULL);
    for (int k = 0; k < 6; k++)
        if (!json_uint(cJSON_GetObjectItemCaseSensitive(lay, lay_keys[k]), 2147483647.0, &v[k]) ||
            v[k] == 0) {
            char what[128];
            snprintf(what, sizeof what, "\"layout\": \"%s\" is not an integer in [1, 2^31)",
                     lay_keys[k]);
            return index_bad(L->dir, what, NULL);
        }
    /* ranks = dp_replicate x dp_shard x cp, and ep divides a replica's dp_shard x cp */
    if (v[0] != v[1] * v[2] * v[3] || (v[2] * v[3]) % v[4] != 0)
        return index_bad(L->dir,
                         "\"layout\": ranks is not dp_replicate x dp_shard x cp, or ep does not "
                         "divide dp_shard x cp",
                         NULL);
    if (v[5] != CKPT_BLOCK) /* the block CRCs are of 1 MiB blocks: the only size read */
        return index_bad(L->dir, "\"layout\": block_bytes is not 1048576", NULL);
    if (!cJSON_IsObject(cfg))
        return index_bad(L->dir, "\"config\" is not an object", NULL);
    cJSON_ArrayForEach(e, cfg) if (!cJSON_IsString(e)) return index_bad(
        L->dir, "a \"config\" value is not a string (every key is recorded as printed)", NULL);
    return SHARDOPT_OK;
}

/* "params": a name, an algorithm, a shape and a step count each, every name once. */
static shardopt_status_t index_params(struct ck_load *L)
{
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(L->root, "params"), *e;
    if (!cJSON_IsArray(params))
        return index_bad(L->dir, "\"params\" missing", NULL);
    const int n = cJSON_GetArraySize(params);
    L->p = mem_calloc((size_t)n + 1, sizeof(*L->p));
    if (L->p == NULL)
        return log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                        "load: %s/index.json: out of memory allocating %zu bytes for %d parameter "
                        "records",
                        L->dir, ((size_t)n + 1) * sizeof(*L->p), n);
    cJSON_ArrayForEach(e, params)
    {
        struct ck_param *p = &L->p[L->np];
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
        const cJSON *algo = cJSON_GetObjectItemCaseSensitive(e, "algo");
        const cJSON *step = cJSON_GetObjectItemCaseSensitive(e, "step");
        char what[256];
        if (!cJSON_IsString(name) || name->valuestring[0] == '\0')
            return index_bad(L->dir, "a \"params\" record without a name", NULL);
        p->name = name->valuestring;
        p->algo = !cJSON_IsString(algo)                     ? -1
                  : strcmp(algo->valuestring, "muon") == 0  ? SHARDOPT_ALGO_MUON
                  : strcmp(algo->valuestring, "adamw") == 0 ? SHARDOPT_ALGO_ADAMW
                                                            : -1;
        if (p->algo < 0) {
            snprintf(what, sizeof what, "parameter '%.100s': \"algo\" is not muon or adamw",
                     p->name);
            return index_bad(L->dir, what, NULL);
        }
        if (json_i64s(cJSON_GetObjectItemCaseSensitive(e, "shape"), p->shape, 3, &p->ndim) != 0 ||
            p->ndim < 1) {
            snprintf(what, sizeof what, "parameter '%.100s': shape is not 1-3 integers", p->name);
            return index_bad(L->dir, what, NULL);
        }
        /* the update reads it (AdamW's bias correction): -1, 2.5 or 1e300 became NaN there */
        if (!json_uint(step, (double)L->step, &p->step)) {
            snprintf(what, sizeof what,
                     "parameter '%.100s': \"step\" is not an integer in [0, %llu] (the "
                     "checkpoint's step)",
                     p->name, (unsigned long long)L->step);
            return index_bad(L->dir, what, NULL);
        }
        L->np++;
    }
    if (L->np > 1)
        qsort(L->p, (size_t)L->np, sizeof *L->p, param_by_name);
    for (int k = 1; k < L->np; k++)
        if (strcmp(L->p[k - 1].name, L->p[k].name) == 0) {
            char what[160];
            snprintf(what, sizeof what, "parameter '%.100s' is listed twice in \"params\"",
                     L->p[k].name);
            return index_bad(L->dir, what, NULL);
        }
    return SHARDOPT_OK;
}

/* A tensor's name is "<param>.<kind>" with a kind its parameter's algorithm has, and its shape is
 * the parameter's: a load checks the tensor against the registered parameter. */
static int tensor_names_param(const struct ck_tensor *t, const struct ck_param *p)
{
    const size_t n = strlen(p->name);
    if (strncmp(t->name, p->name, n) != 0 || t->name[n] != '.')
        return 0;
    const char *kind = t->name + n + 1;
    return p->algo == SHARDOPT_ALGO_MUON
               ? strcmp(kind, "momentum") == 0
               : strcmp(kind, "exp_avg") == 0 || strcmp(kind, "exp_avg_sq") == 0;
}

struct corner {
    int64_t x[3];
    int sign;
};

static int corner_cmp(const void *a, const void *b)
{
    const struct corner *p = a, *q = b;
    for (int d = 0; d < 3; d++)
        if (p->x[d] != q->x[d])
            return p->x[d] < q->x[d] ? -1 : 1;
    return 0;
}

/* Do the shards tile the tensor exactly (every element in exactly one shard)? The indicator of a
 * box [lo, hi) is the signed sum of the orthants {x >= c} at its 8 corners c (sign -1 per
 * coordinate taken from hi); orthants at distinct points are linearly independent, so the
 * shards' indicators sum to the tensor's exactly when, at every point, the corner signs of the
 * shards equal the tensor's. Sorting the 8 (n + 1) corners makes that O(n log n) in the shards:
 * a pairwise overlap test would be quadratic, and thousands of shards per tensor is normal at
 * scale. `c` holds 8 (n + 1) corners. */
static int shards_tile(const struct ck_tensor *t, struct corner *c)
{
    size_t n = 0;
    for (int s = 0; s <= t->nshards; s++) {
        const int64_t *lo = s < t->nshards ? t->shards[s].box.lo : (const int64_t[3]){0, 0, 0};
        const int64_t *len = s < t->nshards ? t->shards[s].box.len : t->shape;
        for (int m = 0; m < 8; m++, n++) {
            int hi = 0;
            for (int d = 0; d < 3; d++) {
                const int up = (m >> d) & 1;
                c[n].x[d] = lo[d] + (up ? len[d] : 0);
                hi += up;
            }
            c[n].sign = (hi & 1 ? -1 : 1) * (s < t->nshards ? 1 : -1);
        }
    }
    qsort(c, n, sizeof *c, corner_cmp);
    for (size_t i = 0; i < n;) {
        long sum = 0;
        size_t j = i;
        for (; j < n && corner_cmp(&c[i], &c[j]) == 0; j++)
            sum += c[j].sign;
        if (sum != 0)
            return 0;
        i = j;
    }
    return 1;
}

/* Why shards_tile said no, from the volumes (each shard lies inside the tensor). */
static const char *tiling_problem(const struct ck_tensor *t)
{
    unsigned __int128 vol = 1, sum = 0;
    for (int d = 0; d < 3; d++)
        vol *= (uint64_t)t->shape[d];
    for (int s = 0; s < t->nshards; s++) {
        unsigned __int128 v = 1;
        for (int d = 0; d < 3; d++)
            v *= (uint64_t)t->shards[s].box.len[d];
        sum += v;
    }
    return sum > vol   ? "the shards overlap (they must tile the tensor exactly)"
           : sum < vol ? "the shards leave part of the tensor uncovered (they must tile it "
                         "exactly)"
                       : "the shards overlap and leave part of the tensor uncovered (they must "
                         "tile it exactly)";
}

/* One tensor record: everything but the tiling. */
static shardopt_status_t index_tensor(struct ck_load *L, const cJSON *e, struct ck_tensor *t)
{
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
    const cJSON *param = cJSON_GetObjectItemCaseSensitive(e, "param");
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *shards = cJSON_GetObjectItemCaseSensitive(e, "shards"), *s;
    if (!cJSON_IsString(name))
        return index_bad(L->dir, "a tensor without a name", NULL);
    t->name = name->valuestring;
    t->dtype = cJSON_IsString(dt) ? ckpt_dtype_parse(dt->valuestring) : -1;
    if (t->dtype < 0)
        return index_bad(L->dir, "dtype not F32 or BF16", t->name);
    if (json_i64s(cJSON_GetObjectItemCaseSensitive(e, "shape"), t->shape, 3, &t->ndim) != 0 ||
        t->ndim < 1)
        return index_bad(L->dir, "shape is not 1-3 integers", t->name);
    const struct ck_param *p = cJSON_IsString(param) ? param_find(L, param->valuestring) : NULL;
    if (p == NULL)
        return index_bad(L->dir, "\"param\" names no record of \"params\"", t->name);
    t->is_weight = strcmp(t->name, p->name) == 0;
    if (t->is_weight && !L->weights)
        return index_bad(L->dir,
                         "a tensor named as its parameter (a weight) in an index without "
                         "\"weights\": true",
                         t->name);
    if (!t->is_weight && !tensor_names_param(t, p))
        return index_bad(L->dir,
                         L->weights ? "the name is neither its parameter's name (its weight) nor "
                                      "its parameter's name and a state kind of its algorithm"
                                    : "the name is not its parameter's name and a state kind of "
                                      "its algorithm",
                         t->name);
    if (p->ndim != t->ndim || memcmp(p->shape, t->shape, sizeof(int64_t) * (size_t)t->ndim) != 0)
        return index_bad(L->dir, "shape differs from its parameter's", t->name);
    if (!cJSON_IsArray(shards))
        return index_bad(L->dir, "\"shards\" missing", t->name);
    t->shards = mem_calloc((size_t)cJSON_GetArraySize(shards) + 1, sizeof(*t->shards));
    if (t->shards == NULL)
        return log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                        "load: %s/index.json: out of memory allocating %zu bytes for the shards "
                        "of '%s'",
                        L->dir, mem_failed_bytes(), t->name);
    t->nshards = cJSON_GetArraySize(shards); /* only now: load_free walks them */
    int j = 0;
    cJSON_ArrayForEach(s, shards)
    {
        struct ck_shard *sh = &t->shards[j++];
        const cJSON *file = cJSON_GetObjectItemCaseSensitive(s, "file");
        const cJSON *crc = cJSON_GetObjectItemCaseSensitive(s, "crc32c");
        uint64_t v;
        int n1, n2;
        if (!cJSON_IsString(file) || !ckpt_name_is_plain(file->valuestring))
            return index_bad(L->dir,
                             "a shard's \"file\" is not a plain file name inside the "
                             "checkpoint directory",
                             t->name);
        sh->file = file->valuestring;
        int64_t *lo = sh->box.lo, *ln = sh->box.len;
        if (json_i64s(cJSON_GetObjectItemCaseSensitive(s, "offset"), lo, 3, &n1) != 0 ||
            json_i64s(cJSON_GetObjectItemCaseSensitive(s, "shape"), ln, 3, &n2) != 0 ||
            n1 != t->ndim || n2 != t->ndim)
            return index_bad(L->dir, "a shard's offset/shape do not match the tensor's dims",
                             t->name);
        uint64_t bytes = kdtype_size(t->dtype);
        for (int d = 0; d < t->ndim; d++) {
            if (lo[d] + ln[d] > t->shape[d]) /* each at most 9e15: no overflow */
                return index_bad(L->dir, "a shard lies outside the tensor", t->name);
            if (__builtin_mul_overflow(bytes, (uint64_t)ln[d], &bytes))
                return index_bad(L->dir, "a shard's byte size overflows 64 bits", t->name);
        }
        const cJSON *blocks = cJSON_GetObjectItemCaseSensitive(s, "block_crc32c"), *bc;
        if (!json_uint(crc, 4294967295.0, &v) || !cJSON_IsArray(blocks) ||
            (uint64_t)cJSON_GetArraySize(blocks) != (bytes + CKPT_BLOCK - 1) / CKPT_BLOCK)
            return index_bad(L->dir, "a shard's CRC32C list does not match its size", t->name);
        sh->crc = (uint32_t)v;
        sh->blocks = mem_malloc(sizeof(uint32_t) * ((size_t)cJSON_GetArraySize(blocks) + 1));
        if (sh->blocks == NULL)
            return log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                            "load: %s/index.json: out of memory allocating %zu bytes for the "
                            "block CRCs of '%s'",
                            L->dir, mem_failed_bytes(), t->name);
        int b = 0;
        cJSON_ArrayForEach(bc, blocks)
        {
            if (!json_uint(bc, 4294967295.0, &v))
                return index_bad(L->dir, "a block CRC32C is not an integer in [0, 2^32)", t->name);
            sh->blocks[b++] = (uint32_t)v;
        }
        /* 3-D, leading dims of 1 */
        for (int d = 2; d >= 0; d--) {
            int s3 = d - (3 - t->ndim);
            lo[d] = s3 >= 0 ? lo[s3] : 0;
            ln[d] = s3 >= 0 ? ln[s3] : 1;
        }
    }
    for (int d = 2; d >= 0; d--) {
        int s3 = d - (3 - t->ndim);
        t->shape[d] = s3 >= 0 ? t->shape[s3] : 1;
    }
    return SHARDOPT_OK;
}

static const struct ck_tensor *index_find(const struct ck_load *L, const char *name)
{
    const struct ck_tensor key = {.name = name}, *kp = &key;
    const struct ck_tensor **hit =
        L->nt > 0 ? bsearch(&kp, L->by, (size_t)L->nt, sizeof(*L->by), tensor_ptr_by_name) : NULL;
    return hit != NULL ? *hit : NULL;
}

/* Every check of the index text, before a shard is read. `verified`: rank 0 found
 * index.json.crc32c beside it and it matched (ckpt_index_check passes 1: the fuzz target reaches
 * the structure); `quiet`: no notice (every rank but 0). */
static shardopt_status_t index_parse(struct ck_load *L, const char *text, size_t len, int verified,
                                     int quiet)
{
    const cJSON *e, *tensors;
    char why[256];
    shardopt_status_t status =
        json_strict_parse(text, len, JSON_STRICT_INTEGERS, &L->root, why, sizeof why);
    if (status == SHARDOPT_ERR_OUT_OF_MEMORY)
        return log_fail(status, "load: %s/index.json: %s while parsing it", L->dir, why);
    if (status != SHARDOPT_OK)
        return log_fail(SHARDOPT_ERR_CORRUPT, "load: %s/index.json: %s", L->dir, why);
    if (!cJSON_IsObject(L->root))
        return index_bad(L->dir, "not a JSON object", NULL);
    if ((status = index_top(L, verified, quiet)) != SHARDOPT_OK ||
        (status = index_params(L)) != SHARDOPT_OK)
        return status;
    tensors = cJSON_GetObjectItemCaseSensitive(L->root, "tensors");
    if (!cJSON_IsArray(tensors))
        return index_bad(L->dir, "\"tensors\" missing", NULL);
    const int nt = cJSON_GetArraySize(tensors);
    L->t = mem_calloc((size_t)nt + 1, sizeof(*L->t));
    if (L->t == NULL)
        return log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                        "load: %s/index.json: out of memory allocating %zu bytes for %d tensors",
                        L->dir, ((size_t)nt + 1) * sizeof(*L->t), nt);
    L->nt = nt; /* only now: load_free walks them */
    int i = 0, most = 0;
    cJSON_ArrayForEach(e, tensors)
    {
        struct ck_tensor *t = &L->t[i++];
        if ((status = index_tensor(L, e, t)) != SHARDOPT_OK)
            return status;
        most = t->nshards > most ? t->nshards : most;
    }
    /* the shards of every tensor tile it exactly: checked before any byte is copied, so a
     * flipped offset (overlap, and a gap) is refused, never read over or around */
    const size_t cbytes = sizeof(struct corner) * 8 * ((size_t)most + 1);
    struct corner *corners = mem_malloc(cbytes);
    if (corners == NULL)
        return log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                        "load: %s/index.json: out of memory allocating %zu bytes to check that "
                        "the shards tile their tensors",
                        L->dir, cbytes);
    for (int k = 0; k < L->nt; k++)
        if (!shards_tile(&L->t[k], corners)) {
            free(corners);
            return index_bad(L->dir, tiling_problem(&L->t[k]), L->t[k].name);
        }
    free(corners);
    /* one entry per tensor name, found by binary search */
    L->by = mem_malloc(sizeof(*L->by) * ((size_t)L->nt + 1));
    if (L->by == NULL)
        return log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                        "load: %s/index.json: out of memory allocating %zu bytes to sort %d tensor "
                        "names",
                        L->dir, sizeof(*L->by) * ((size_t)L->nt + 1), L->nt);
    for (int k = 0; k < L->nt; k++)
        L->by[k] = &L->t[k];
    if (L->nt > 1)
        qsort(L->by, (size_t)L->nt, sizeof(*L->by), tensor_ptr_by_name);
    for (int k = 1; k < L->nt; k++)
        if (strcmp(L->by[k - 1]->name, L->by[k]->name) == 0)
            return index_bad(L->dir, "a tensor is listed twice", L->by[k]->name);
    /* "weights": true is a promise that every parameter is in it */
    for (int k = 0; L->weights && k < L->np; k++) {
        const struct ck_tensor *t = index_find(L, L->p[k].name);
        if (t == NULL || !t->is_weight) {
            char what[200];
            snprintf(what, sizeof what,
                     "\"weights\": true and parameter '%.100s' has no tensor of its own name",
                     L->p[k].name);
            return index_bad(L->dir, what, NULL);
        }
    }
    return SHARDOPT_OK;
}

/* ---- files ---- */

/* len bytes at `at`: 0; -1 for an I/O error (errno set; SHARDOPT_FAULT=ckpt.read:<n> injects
 * EIO, or hang@ckpt.read a rank that stops mid-load); 1 when the file ends first. */
static int pread_all(int fd, void *buf, size_t len, uint64_t at)
{
    unsigned char *p = buf;
    if (fault_hit("ckpt.read"))
        return -1;
    while (len > 0) {
        ssize_t r = pread(fd, p, len, (off_t)at);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -1;
        if (r == 0)
            return 1;
        p += r;
        len -= (size_t)r;
        at += (uint64_t)r;
    }
    return 0;
}

/* A read that did not return every byte: the disk or filesystem failed (ERR_IO, as for a save),
 * or the file is shorter than its header says (ERR_CORRUPT). */
static shardopt_status_t read_fail(int r, const char *path, const char *file, const char *what)
{
    if (r < 0)
        return log_fail(SHARDOPT_ERR_IO, "load: %s%s%s: %s: read failed: %s", path, file ? "/" : "",
                        file ? file : "", what, strerror(errno));
    return log_fail(SHARDOPT_ERR_CORRUPT, "load: %s%s%s: %s: file truncated", path, file ? "/" : "",
                    file ? file : "", what);
}

static shardopt_status_t file_open(struct ck_load *L, const char *name, struct ck_file **out)
{
    char path[4400], err[256];
    unsigned char first8[8];
    uint64_t json_len;

    for (int i = 0; i < L->nfiles; i++)
        if (strcmp(L->files[i].name, name) == 0) {
            *out = &L->files[i];
            return SHARDOPT_OK;
        }
    struct ck_file *f = &L->files[L->nfiles];
    memset(f, 0, sizeof *f);
    f->name = name;
    snprintf(path, sizeof path, "%s/%s", L->dir, name);
    f->fd = open(path, O_RDONLY);
    if (f->fd < 0)
        return log_fail(SHARDOPT_ERR_IO, "load: %s: %s", path, strerror(errno));
    L->nfiles++;
    struct stat st;
    if (fstat(f->fd, &st) != 0)
        return log_fail(SHARDOPT_ERR_IO, "load: %s: %s", path, strerror(errno));
    int r = pread_all(f->fd, first8, 8, 0);
    if (r != 0)
        return read_fail(r, path, NULL, "shorter than a safetensors header");
    f->size = (uint64_t)st.st_size;
    if (st_header_len(first8, f->size, &json_len, err, sizeof err) != 0)
        return log_fail(SHARDOPT_ERR_CORRUPT, "load: %s: %s", path, err);
    char *json = mem_malloc(json_len + 1);
    if (json == NULL)
        return log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                        "load: %s: out of memory allocating %llu bytes for the header", path,
                        (unsigned long long)json_len + 1);
    if ((r = pread_all(f->fd, json, json_len, 8)) != 0) {
        free(json);
        return read_fail(r, path, NULL, "header");
    }
    const shardopt_status_t rc = st_header_parse(json, json_len, f->size, &f->hdr, err, sizeof err);
    free(json);
    if (rc != SHARDOPT_OK) /* refused (corrupt), or out of memory reading it */
        return log_fail(rc == SHARDOPT_ERR_OUT_OF_MEMORY ? rc : SHARDOPT_ERR_CORRUPT,
                        "load: %s: %s", path, err);
    f->opened = 1;
    *out = f;
    return SHARDOPT_OK;
}

/* dst[i] <- src[i] converted between the checkpoint's dtype and the configured one. */
static void elems_convert(void *dst, int ddt, const void *src, int sdt, size_t n)
{
    if (ddt == sdt) {
        memcpy(dst, src, n * kdtype_size(ddt));
    } else if (ddt == KDT_F32) {
        for (size_t i = 0; i < n; i++)
            ((float *)dst)[i] = f32_from_bf16(((const uint16_t *)src)[i]);
    } else {
        for (size_t i = 0; i < n; i++)
            ((uint16_t *)dst)[i] = bf16_from_f32(((const float *)src)[i]);
    }
}

/* Copy the overlap of one saved shard into this rank's staging tensor. Reads whole CRC blocks
 * covering the runs, in chunks, and checks every block. Returns elements copied in *copied. */
static shardopt_status_t shard_read(struct ck_load *L, const struct ck_tensor *t,
                                    const struct ck_shard *sh, const struct plan_box *mine,
                                    unsigned char *dst, int ddt, int64_t *copied)
{
    struct reshard_runs runs;
    struct ck_file *f = NULL;
    shardopt_status_t status;
    const size_t es = kdtype_size(t->dtype), des = kdtype_size(ddt);
    int64_t so, doff, len;

    if (!reshard_runs_init(&runs, &sh->box, mine))
        return SHARDOPT_OK;
    status = file_open(L, sh->file, &f);
    if (status != SHARDOPT_OK)
        return status;
    const struct st_tensor *st = st_header_find(&f->hdr, t->name);
    if (st == NULL)
        return log_fail(SHARDOPT_ERR_CORRUPT, "load: %s/%s: tensor '%s' missing", L->dir, sh->file,
                        t->name);
    int64_t numel = 1;
    for (int d = 0; d < 3; d++)
        numel *= sh->box.len[d];
    int64_t st_numel = 1;
    for (int d = 0; d < st->ndim; d++)
        st_numel *= st->shape[d];
    if (st->dtype != t->dtype || st_numel != numel)
        return log_fail(SHARDOPT_ERR_CORRUPT,
                        "load: %s/%s: tensor '%s' is %s with %lld elements, the index says %s "
                        "with %lld",
                        L->dir, sh->file, t->name, ckpt_dtype_name(st->dtype), (long long)st_numel,
                        ckpt_dtype_name(t->dtype), (long long)numel);
    const uint64_t tensor_bytes = (uint64_t)numel * es, base = f->hdr.data_start + st->begin;

    /* the saved shard is exactly this rank's, in the same dtype (a load on the layout that
     * saved): read it straight into place and check the blocks there */
    if (ddt == t->dtype && memcmp(&sh->box, mine, sizeof *mine) == 0) {
        int r = pread_all(f->fd, dst, (size_t)tensor_bytes, base);
        if (r != 0) {
            char what[300];
            snprintf(what, sizeof what, "tensor '%s'", t->name);
            return read_fail(r, L->dir, sh->file, what);
        }
        uint32_t whole = 0;
        for (uint64_t k = 0; k < tensor_bytes; k += CKPT_BLOCK) {
            const size_t blen =
                (size_t)(tensor_bytes - k < CKPT_BLOCK ? tensor_bytes - k : CKPT_BLOCK);
            const uint32_t c = crc32c_update(0, dst + k, blen);
            whole = crc32c_combine(whole, c, blen);
            if (c != sh->blocks[k / CKPT_BLOCK])
                return log_fail(SHARDOPT_ERR_CORRUPT,
                                "load: %s/%s: tensor '%s': CRC32C mismatch in bytes [%llu, %llu) "
                                "(the file is damaged)",
                                L->dir, sh->file, t->name, (unsigned long long)k,
                                (unsigned long long)(k + blen));
        }
        /* read whole, the tensor's own CRC (what external tools see) is checked too */
        if (whole != sh->crc)
            return log_fail(SHARDOPT_ERR_CORRUPT,
                            "load: %s/%s: tensor '%s': CRC32C %08x, the index says %08x", L->dir,
                            sh->file, t->name, whole, sh->crc);
        *copied += numel;
        return SHARDOPT_OK;
    }

    /* the source byte range the runs span, widened to whole blocks */
    struct reshard_runs scan = runs;
    int64_t first = -1, last = 0;
    while (reshard_runs_next(&scan, &so, &doff, &len)) {
        if (first < 0)
            first = so;
        last = so + len;
    }
    uint64_t a = (uint64_t)first * es / CKPT_BLOCK * CKPT_BLOCK;
    uint64_t b = ((uint64_t)last * es + CKPT_BLOCK - 1) / CKPT_BLOCK * CKPT_BLOCK;
    b = b < tensor_bytes ? b : tensor_bytes;

    int have = reshard_runs_next(&runs, &so, &doff, &len);
    for (uint64_t c0 = a; c0 < b; c0 += CKPT_CHUNK) {
        const uint64_t c1 = c0 + CKPT_CHUNK < b ? c0 + CKPT_CHUNK : b;
        int r = pread_all(f->fd, L->chunk, (size_t)(c1 - c0), base + c0);
        if (r != 0) {
            char what[300];
            snprintf(what, sizeof what, "tensor '%s'", t->name);
            return read_fail(r, L->dir, sh->file, what);
        }
        for (uint64_t k = c0; k < c1; k += CKPT_BLOCK) {
            const size_t blen = (size_t)(c1 - k < CKPT_BLOCK ? c1 - k : CKPT_BLOCK);
            if (crc32c_update(0, L->chunk + (k - c0), blen) != sh->blocks[k / CKPT_BLOCK])
                return log_fail(SHARDOPT_ERR_CORRUPT,
                                "load: %s/%s: tensor '%s': CRC32C mismatch in bytes [%llu, %llu) "
                                "(the file is damaged)",
                                L->dir, sh->file, t->name, (unsigned long long)k,
                                (unsigned long long)(k + blen));
        }
        /* the runs' parts inside this chunk */
        const int64_t e0 = (int64_t)(c0 / es), e1 = (int64_t)(c1 / es);
        while (have && so < e1) {
            const int64_t lo = so > e0 ? so : e0, hi = so + len < e1 ? so + len : e1;
            elems_convert(dst + (size_t)(doff + (lo - so)) * des, ddt,
                          L->chunk + (size_t)(lo - e0) * es, t->dtype, (size_t)(hi - lo));
            *copied += hi - lo;
            if (so + len <= e1)
                have = reshard_runs_next(&runs, &so, &doff, &len);
            else
                break;
        }
    }
    return SHARDOPT_OK;
}

/* ---- one rank's part ---- */

static shardopt_status_t rank_fill(shardopt_runtime_t rt, struct ck_load *L)
{
    const int allow_missing = rt->cfg.load_allow_missing, weights = rt->cfg.ckpt_weights;
    if (weights && !L->weights)
        return log_fail(SHARDOPT_ERR_MISMATCH,
                        "load: %s/index.json: ckpt_weights = true and the checkpoint holds no "
                        "weights (saved with ckpt_weights = false): the parameters cannot be "
                        "restored from it (load with ckpt_weights = false for the optimizer state "
                        "alone)",
                        L->dir);
    for (int i = 0; i < rt->nparams; i++) {
        const struct shardopt_param *p = rt->params[i];
        struct ckpt_kind k[3];
        const int nk = ckpt_tensors(rt, p, weights, k);
        int64_t shape[3];
        struct plan_box mine;
        char name[1100];
        ckpt_box3(&p->layout, shape, &mine);
        L->steps[i] = p->step;
        for (int j = 0; j < nk; j++) {
            const int is_weight = k[j].suffix == NULL;
            ckpt_tensor_name(p, k[j].suffix, name, sizeof name);
            const struct ck_tensor *t = index_find(L, name);
            if (t != NULL && t->is_weight != is_weight)
                t = NULL; /* "x.momentum" the weight of another parameter: not x's state */
            if (t == NULL) {
                if (allow_missing && is_weight) /* keeps its current value: not written */
                    continue;
                if (allow_missing) { /* keeps its current state */
                    memcpy(L->fill + k[j].offset, L->current + k[j].offset,
                           (size_t)p->layout.local_numel * kdtype_size(k[j].dtype));
                    continue;
                }
                return log_fail(SHARDOPT_ERR_MISMATCH,
                                "load: %s/index.json: %s '%s' of parameter '%s' is not in the "
                                "checkpoint (set load_allow_missing to keep its current %s)",
                                L->dir, is_weight ? "weight" : "tensor", name, p->name,
                                is_weight ? "value" : "state");
            }
            if (memcmp(t->shape, shape, sizeof shape) != 0)
                return log_fail(SHARDOPT_ERR_MISMATCH,
                                "load: %s/index.json: tensor '%s' has shape [%lld, %lld, %lld] in "
                                "the checkpoint, the registered parameter [%lld, %lld, %lld]",
                                L->dir, name, (long long)t->shape[0], (long long)t->shape[1],
                                (long long)t->shape[2], (long long)shape[0], (long long)shape[1],
                                (long long)shape[2]);
            if (t->dtype != k[j].dtype && L->converted++ < 8) {
                size_t o = strlen(L->converted_names);
                snprintf(L->converted_names + o, sizeof L->converted_names - o,
                         "%s%.120s%s (%s -> %s)", o ? ", " : "", name, is_weight ? " (weight)" : "",
                         ckpt_dtype_name(t->dtype), ckpt_dtype_name(k[j].dtype));
            }
            int64_t copied = 0;
            unsigned char *dst = is_weight ? L->wfill + L->woff[i] : L->fill + k[j].offset;
            if (is_weight)
                L->wread[i] = 1;
            else
                L->read[i] = 1;
            for (int s = 0; s < t->nshards; s++) {
                shardopt_status_t status =
                    shard_read(L, t, &t->shards[s], &mine, dst, k[j].dtype, &copied);
                if (status != SHARDOPT_OK)
                    return status;
            }
            if (copied != p->layout.local_numel)
                return log_fail(SHARDOPT_ERR_CORRUPT,
                                "load: %s/index.json: tensor '%s': the shards cover %lld of the "
                                "%lld elements this rank needs",
                                L->dir, name, (long long)copied, (long long)p->layout.local_numel);
        }
    }
    /* per-parameter step counts, each checked by index_params: a parameter whose state was read
     * takes its record's; one kept (load_allow_missing) keeps its own unless it has a record,
     * capped at the checkpoint's step: no count may exceed the global one (a later save would
     * write an index that every load refuses) */
    for (int i = 0; i < rt->nparams; i++) {
        const struct ck_param *rec = param_find(L, rt->params[i]->name);
        if (rec != NULL)
            L->steps[i] = rec->step;
        else if (!L->read[i] && L->steps[i] > L->step)
            L->steps[i] = L->step;
        else if (L->read[i])
            return log_fail(SHARDOPT_ERR_CORRUPT,
                            "load: %s/index.json: parameter '%s' has state in the checkpoint but "
                            "no record in \"params\" (its step count)",
                            L->dir, rt->params[i]->name);
    }
    return SHARDOPT_OK;
}

/* DIR/latest: exactly what a save writes, a plain name and one '\n' (the '\n' may be missing).
 * Anything else is refused, its bytes shown escaped: a CR (a file edited on Windows) or a NUL
 * printed raw would hide itself in the message, and a name cut at the first line end or NUL would
 * follow a file that does not say what it seems to. */
static shardopt_status_t latest_read(const char *dir, const char *path, char *name, size_t name_len)
{
    char buf[512], shown[2100];
    size_t n = 0;
    struct stat st;
    /* O_NONBLOCK: a FIFO named latest must not stop the load until someone writes to it */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return log_fail(SHARDOPT_ERR_IO, "load: %s: neither index.json nor latest (%s)", dir,
                        strerror(errno));
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return log_fail(SHARDOPT_ERR_CORRUPT,
                        "load: %s: not a regular file (a save writes latest as one)", path);
    }
    while (n < sizeof buf) {
        ssize_t r = read(fd, buf + n, sizeof buf - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            const int err = errno;
            close(fd);
            return log_fail(SHARDOPT_ERR_IO, "load: %s: read failed: %s", path, strerror(err));
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    close(fd);
    if (n == sizeof buf)
        return log_fail(SHARDOPT_ERR_CORRUPT,
                        "load: %s: %zu bytes or more, not a step directory name ('%s')", path,
                        sizeof buf, log_escape(shown, 80, buf, 64));
    const size_t len = n > 0 && buf[n - 1] == '\n' ? n - 1 : n;
    buf[len] = '\0';
    if (len >= name_len || memchr(buf, '\0', len) != NULL || !ckpt_name_is_plain(buf))
        return log_fail(SHARDOPT_ERR_CORRUPT,
                        "load: %s: '%s' is not a step directory name (accepted: a name without '/' "
                        "or control characters, then at most one '\\n'%s)",
                        path, log_escape(shown, sizeof shown, buf, len),
                        len > 0 && buf[len - 1] == '\r' ? "; this line ends in \\r, as Windows "
                                                          "writes it: remove the \\r"
                                                        : "");
    memcpy(name, buf, len + 1);
    return SHARDOPT_OK;
}

/* Rank 0: the index's integrity record, index.json.crc32c (8 lowercase hex digits and a newline:
 * the CRC-32C of index.json's exact bytes), checked before a byte of the index is parsed. Absent:
 * *verified stays 0 (an index of format_version 1, written before the record existed, still
 * loads; index_top refuses a later version without it). Present: it must read so and match. */
static shardopt_status_t index_crc_check(const char *stepdir, const char *text, size_t len,
                                         int *verified)
{
    char path[4400], rec[16];
    snprintf(path, sizeof path, "%s/" CKPT_INDEX_CRC_NAME, stepdir);
    *verified = 0;
    FILE *f = fopen(path, "rb");
    if (f == NULL && errno == ENOENT)
        return SHARDOPT_OK;
    if (f == NULL)
        return log_fail(SHARDOPT_ERR_IO, "load: %s: %s", path, strerror(errno));
    const size_t n = fread(rec, 1, sizeof rec, f);
    const int failed = ferror(f);
    fclose(f);
    if (failed)
        return log_fail(SHARDOPT_ERR_IO, "load: %s: read failed", path);
    int ok = n == 9 && rec[8] == '\n';
    for (int i = 0; ok && i < 8; i++)
        ok = (rec[i] >= '0' && rec[i] <= '9') || (rec[i] >= 'a' && rec[i] <= 'f');
    if (!ok)
        return log_fail(SHARDOPT_ERR_CORRUPT,
                        "load: %s: not 8 lowercase hex digits and a newline (the CRC-32C of "
                        "index.json): the record is damaged",
                        path);
    rec[8] = '\0';
    const uint32_t want = (uint32_t)strtoul(rec, NULL, 16), have = crc32c_update(0, text, len);
    if (want != have)
        return log_fail(SHARDOPT_ERR_CORRUPT,
                        "load: %s/index.json: CRC32C %08x, " CKPT_INDEX_CRC_NAME
                        " says %08x: the index is damaged",
                        stepdir, have, want);
    *verified = 1;
    return SHARDOPT_OK;
}

/* Rank 0: which step directory, its index text (*text_len bytes, NUL after them) and whether its
 * integrity record matched. */
static shardopt_status_t index_read(const char *dir, char *stepdir, size_t len, char **text,
                                    size_t *text_len, int *verified)
{
    char path[4400], name[300];
    struct stat st;
    FILE *f;

    snprintf(path, sizeof path, "%s/index.json", dir);
    if (stat(path, &st) == 0) {
        snprintf(stepdir, len, "%s", dir);
    } else {
        snprintf(path, sizeof path, "%s/latest", dir);
        const shardopt_status_t status = latest_read(dir, path, name, sizeof name);
        if (status != SHARDOPT_OK)
            return status;
        snprintf(stepdir, len, "%s/%s", dir, name);
    }
    snprintf(path, sizeof path, "%s/index.json", stepdir);
    f = fopen(path, "rb");
    if (f == NULL)
        return log_fail(SHARDOPT_ERR_IO, "load: %s: %s", path, strerror(errno));
    if (fstat(fileno(f), &st) != 0 || (size_t)st.st_size > CKPT_INDEX_MAX) {
        fclose(f);
        return log_fail(SHARDOPT_ERR_CORRUPT, "load: %s: larger than %zu bytes", path,
                        CKPT_INDEX_MAX);
    }
    *text = mem_malloc((size_t)st.st_size + 1);
    if (*text == NULL) {
        fclose(f);
        return log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                        "load: rank 0: %s: out of memory allocating %zu bytes for its text", path,
                        (size_t)st.st_size + 1);
    }
    if (fread(*text, 1, (size_t)st.st_size, f) != (size_t)st.st_size) {
        fclose(f);
        free(*text);
        *text = NULL;
        return log_fail(SHARDOPT_ERR_IO, "load: %s: read failed", path);
    }
    (*text)[st.st_size] = '\0';
    fclose(f);
    *text_len = (size_t)st.st_size; /* a NUL inside is the parser's to refuse, not an end */
    const shardopt_status_t status = index_crc_check(stepdir, *text, *text_len, verified);
    if (status != SHARDOPT_OK) {
        free(*text);
        *text = NULL;
    }
    return status;
}

static void load_free(struct ck_load *L)
{
    for (int i = 0; i < L->nfiles; i++) {
        if (L->files[i].fd >= 0)
            close(L->files[i].fd);
        if (L->files[i].opened)
            st_header_free(&L->files[i].hdr);
    }
    for (int i = 0; i < L->nt; i++) {
        for (int j = 0; j < L->t[i].nshards; j++)
            free(L->t[i].shards[j].blocks);
        free(L->t[i].shards);
    }
    free(L->t);
    free(L->by);
    free(L->p);
    free(L->read);
    free(L->files);
    if (L->staging != NULL)
        state_store_buffer_free(L->store, L->staging);
    free(L->current_copy);
    free(L->fill_copy);
    free(L->steps);
    free(L->chunk);
    free(L->wfill);
    free(L->woff);
    free(L->wread);
    cJSON_Delete(L->root);
}

/* ckpt_weights: host memory for every registered parameter's local shard, filled by rank_fill
 * and written to the parameters only once every rank succeeded. */
static shardopt_status_t weights_staging_alloc(shardopt_runtime_t rt, struct ck_load *L)
{
    size_t total = 0;
    L->woff = mem_calloc((size_t)rt->nparams + 1, sizeof(*L->woff));
    L->wread = L->woff != NULL ? mem_calloc((size_t)rt->nparams + 1, 1) : NULL;
    if (L->wread == NULL)
        return log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                        "load: rank %d: out of memory allocating %zu bytes for the weight table",
                        rt->groups.me.rank, mem_failed_bytes());
    for (int i = 0; i < rt->nparams; i++) {
        const struct shardopt_param *p = rt->params[i];
        L->woff[i] = total;
        total += (size_t)p->layout.local_numel *
                 kdtype_size(p->param_dtype == SHARDOPT_DTYPE_BF16 ? KDT_BF16 : KDT_F32);
    }
    if ((L->wfill = mem_malloc(total + 1)) == NULL)
        return log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                        "load: rank %d: out of memory allocating %zu bytes of staging for the "
                        "parameters (ckpt_weights)",
                        rt->groups.me.rank, total + 1);
    return SHARDOPT_OK;
}

/* The weights read into the registered parameters: host memory is copied (nothing can fail);
 * device memory is uploaded and waited for, and a failure there is reported (not agreed: the
 * caller agrees) with the parameters possibly part written. */
static shardopt_status_t weights_store(shardopt_runtime_t rt, const struct ck_load *L)
{
    for (int i = 0; i < rt->nparams; i++) {
        const struct shardopt_param *p = rt->params[i];
        const size_t bytes =
            (size_t)p->layout.local_numel *
            kdtype_size(p->param_dtype == SHARDOPT_DTYPE_BF16 ? KDT_BF16 : KDT_F32);
        if (!L->wread[i] || bytes == 0)
            continue;
        if (rt_on_device(rt))
            rt->ops->copy(&rt->kctx, p->data, L->wfill + L->woff[i], bytes);
        else
            memcpy(p->data, L->wfill + L->woff[i], bytes);
    }
    if (rt_on_device(rt) && (fault_hit("copy") || rt->ops->sync(&rt->kctx) != 0))
        return log_fail(SHARDOPT_ERR_DEVICE,
                        "load: rank %d: %s: copying the parameters read to the device failed "
                        "(%s): they may be part written (the optimizer state is unchanged); load "
                        "again",
                        rt->groups.me.rank, L->dir, rt->ops->name);
    return SHARDOPT_OK;
}

shardopt_status_t ckpt_index_check(const char *text, size_t len)
{
    struct ck_load L;
    memset(&L, 0, sizeof L);
    snprintf(L.dir, sizeof L.dir, "(index text)");
    shardopt_status_t status = index_parse(&L, text, len, 1, 1);
    load_free(&L);
    return status;
}

shardopt_status_t shardopt_load(shardopt_runtime_t rt, const char *dir)
{
    struct ck_load L;
    shardopt_status_t status = SHARDOPT_OK;
    char *text = NULL;
    size_t len0 = 0;
    int verified = 0;
    long long head[2] = {0, 0}; /* the text's length, and whether its integrity record matched */

    if (rt == NULL || dir == NULL)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "load: NULL %s",
                        rt == NULL ? "runtime" : "dir");
    if (!rt->committed)
        return log_fail(SHARDOPT_ERR_STATE, "load: runtime not committed");
    comm_phase("load", -1);
    status = rt_device_enter_all(rt, "load"); /* its uploads to init's device */
    if (status != SHARDOPT_OK)
        return status;
    memset(&L, 0, sizeof L);
    L.store = &rt->store;
    if (rt->groups.me.rank == 0) {
        status = index_read(dir, L.dir, sizeof L.dir, &text, &len0, &verified);
        head[0] = (long long)len0;
        head[1] = verified;
    }
    status = ckpt_agree(rt, status, "load");
    if (status != SHARDOPT_OK) {
        free(text);
        return status;
    }
    groups_bcast(&rt->groups, L.dir, sizeof L.dir, MPI_CHAR);
    groups_bcast(&rt->groups, head, 2, MPI_LONG_LONG);
    const long long text_len = head[0];
    if (rt->groups.me.rank != 0)
        text = mem_malloc((size_t)text_len + 1);
    status = text != NULL ? SHARDOPT_OK
                          : log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                                     "load: rank %d: out of memory allocating %lld bytes for the "
                                     "index text",
                                     rt->groups.me.rank, text_len + 1);
    status = ckpt_agree(rt, status, "load");
    if (status != SHARDOPT_OK) {
        free(text);
        return status;
    }
    groups_bcast(&rt->groups, text, (int)text_len + 1, MPI_CHAR);

    status = index_parse(&L, text, (size_t)text_len, (int)head[1], rt->groups.me.rank != 0);
    if (status == SHARDOPT_OK) {
        /* the same allocator as the state: on success it becomes the state */
        char err[256] = "";
        int nf = 0;
        for (int i = 0; i < L.nt; i++)
            nf += L.t[i].nshards;
        const size_t steps_bytes = ((size_t)rt->nparams + 1) * sizeof(uint64_t);
        const size_t files_bytes = ((size_t)nf + 1) * sizeof(*L.files);
        if ((L.staging = state_store_buffer_alloc(&rt->store, err, sizeof err)) == NULL)
            status = log_fail(SHARDOPT_ERR_OUT_OF_MEMORY, "load: rank %d: staging copy: %s",
                              rt->groups.me.rank, err);
        else if ((L.steps = mem_calloc((size_t)rt->nparams + 1, sizeof(uint64_t))) == NULL ||
                 (L.read = mem_calloc((size_t)rt->nparams + 1, 1)) == NULL)
            status = log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                              "load: rank %d: out of memory allocating %zu bytes for step counts",
                              rt->groups.me.rank,
                              L.steps == NULL ? steps_bytes : (size_t)rt->nparams + 1);
        else if ((L.chunk = mem_malloc(CKPT_CHUNK)) == NULL)
            status = log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                              "load: rank %d: out of memory allocating %zu bytes for a read chunk",
                              rt->groups.me.rank, (size_t)CKPT_CHUNK);
        else if ((L.files = mem_calloc((size_t)nf + 1, sizeof(*L.files))) == NULL)
            status =
                log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                         "load: rank %d: out of memory allocating %zu bytes for the file table",
                         rt->groups.me.rank, files_bytes);
        else if (rt->cfg.ckpt_weights)
            status = weights_staging_alloc(rt, &L);
    }
    if (status == SHARDOPT_OK) {
        /* device state: files are read into host memory, then go up in one copy */
        char err[256] = "";
        L.fill = L.staging;
        mem_failed_clear();
        L.current = state_store_host_view(&rt->store, &rt->kctx, state_store_ptr(&rt->store, 0),
                                          &L.current_copy, err, sizeof err);
        if (L.current != NULL && state_store_on_device(&rt->store)) {
            L.fill = L.fill_copy = mem_malloc(rt->store.bytes ? rt->store.bytes : 1);
            if (L.fill == NULL)
                snprintf(err, sizeof err, "out of memory allocating %zu bytes of host staging",
                         rt->store.bytes ? rt->store.bytes : 1);
        }
        if (L.current == NULL || L.fill == NULL) /* out of memory, or the device failed */
            status =
                log_fail(mem_failed_bytes() > 0 ? SHARDOPT_ERR_OUT_OF_MEMORY : SHARDOPT_ERR_DEVICE,
                         "load: rank %d: %s", rt->groups.me.rank, err);
    }
    if (status == SHARDOPT_OK) {
        /* every element of every tensor is covered once (index_parse proved the tiling), and
         * what lies between tensors (alignment) is zero, as in a fresh arena: nothing of the
         * staging memory's previous contents can become state */
        memset(L.fill, 0, rt->store.bytes);
        status = rank_fill(rt, &L);
    }
    if (status == SHARDOPT_OK && L.fill != L.staging) {
        char err[256] = "";
        if (state_store_upload(&rt->store, &rt->kctx, L.staging, L.fill, err, sizeof err) != 0)
            status = log_fail(SHARDOPT_ERR_DEVICE, "load: rank %d: %s", rt->groups.me.rank, err);
    }
    status = ckpt_agree(rt, status, "load");
    /* every rank has everything: the parameters are written, then the state swapped in */
    if (status == SHARDOPT_OK && rt->cfg.ckpt_weights && weights_store(rt, &L) != SHARDOPT_OK)
        status = ckpt_agree(rt, SHARDOPT_ERR_DEVICE, "load");
    else if (status == SHARDOPT_OK && rt->cfg.ckpt_weights && rt_on_device(rt))
        status = ckpt_agree(rt, SHARDOPT_OK, "load"); /* another rank's copies may have failed */
    if (status == SHARDOPT_OK) {
        state_store_swap(&rt->store, (void **)&L.staging); /* the old state is freed below */
        for (int i = 0; i < rt->nparams; i++)
            rt->params[i]->step = L.steps[i];
        rt->counters.steps = L.step;
        if (L.converted && rt->groups.me.rank == 0)
            log_warn("load: %s: %d tensor(s) converted to the configured (state) or registered "
                     "(weight) dtype: %s%s",
                     L.dir, L.converted, L.converted_names, L.converted > 8 ? ", ..." : "");
        if (rt->groups.me.rank == 0)
            log_info("load: %s (step %llu)", L.dir, (unsigned long long)L.step);
    }
    load_free(&L);
    free(text);
    return status;
}

/* A checkpoint's index.json, as shardopt_load reads it (checkpoint_load.c does the rest): rank 0
 * finds the step directory (DIR itself, or the one DIR/latest names) and checks the index's
 * integrity record, index.json.crc32c; every rank then parses the same text and checks all of it
 * strictly (the top level, the params records, each tensor and shard, that the shards tile their
 * tensors) before a byte of any shard is read. */
#include "runtime/checkpoint/checkpoint_index.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/crc32c.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/status.h"
#include "runtime/checkpoint/checkpoint_dir.h"
#include "runtime/config/json_strict.h"

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

/* file: "index.json", or a writer's index (version 4) */
static shardopt_status_t index_bad_in(const char *dir, const char *file, const char *what,
                                      const char *tensor)
{
    char shown[600]; /* the name as the file has it: escaped */
    return log_fail(
        SHARDOPT_ERR_CORRUPT, "load: %s/%s: %s%s%s%s", dir, file, what, tensor ? " (tensor '" : "",
        tensor ? log_escape(shown, sizeof shown, tensor, strlen(tensor)) : "", tensor ? "')" : "");
}

static shardopt_status_t index_bad(const char *dir, const char *what, const char *tensor)
{
    return index_bad_in(dir, "index.json", what, tensor);
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

const struct ck_param *ckpt_index_param(const struct ck_index *L, const char *name)
{
    const struct ck_param key = {.name = name};
    return L->np > 0 ? bsearch(&key, L->p, (size_t)L->np, sizeof *L->p, param_by_name) : NULL;
}

/* format, format_version, step, layout, config. `verified`: index.json.crc32c matched the text
 * (rank 0 checked it before any of this was read). */
static shardopt_status_t index_top(struct ck_index *L, int verified, int quiet)
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
    if ((weights != NULL) != (version >= CKPT_FORMAT_WEIGHTS_FIRST)) {
        char what[128];
        snprintf(what, sizeof what, "format_version %llu and no \"weights\"",
                 (unsigned long long)version);
        return index_bad(L->dir,
                         weights != NULL ? "\"weights\" in an index of format_version 1 or 2 "
                                           "(it came with version 3)"
                                         : what,
                         NULL);
    }
    L->weights = cJSON_IsTrue(weights);
    L->version = (int)version;
    if (version == 1 && !verified && !quiet && !v1_noticed) {
        v1_noticed = 1;
        log_warn("load: %s/index.json: format_version 1, written before indexes carried "
                 "an integrity record (" CKPT_INDEX_CRC_NAME "): damage to the index itself is "
                 "not detected; the next save writes version %d",
                 L->dir, CKPT_FORMAT_VERSION);
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
    /* version 4: one writer index per dense rank of the saving world (replica 0 writes) */
    const cJSON *writers = cJSON_GetObjectItemCaseSensitive(L->root, "writers");
    uint64_t nw = 0;
    if ((writers != NULL) != (version >= CKPT_FORMAT_WRITERS_FIRST))
        return index_bad(L->dir,
                         writers != NULL ? "\"writers\" in an index of format_version 1 to 3 (it "
                                           "came with version 4)"
                                         : "format_version 4 and no \"writers\"",
                         NULL);
    if (writers != NULL && (!json_uint(writers, 2147483647.0, &nw) || nw != v[0] / v[1]))
        return index_bad(
            L->dir, "\"writers\" is not the layout's dense ranks (ranks / dp_replicate)", NULL);
    L->writers = (int)nw;
    L->ep = (int)v[4];
    if (!cJSON_IsObject(cfg))
        return index_bad(L->dir, "\"config\" is not an object", NULL);
    cJSON_ArrayForEach(e, cfg) if (!cJSON_IsString(e)) return index_bad(
        L->dir, "a \"config\" value is not a string (every key is recorded as printed)", NULL);
    return SHARDOPT_OK;
}

/* "params": a name, an algorithm, a shape and a step count each, every name once. */
static shardopt_status_t index_params(struct ck_index *L)
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

/* One shard record of tensor t (whose shape, ndim long, is `shape`): its file (with_file; else
 * the caller sets it), offset and shape inside the tensor, CRC lists that fit; the box made 3-D.
 * ixfile: the index file that holds it, for messages. */
static shardopt_status_t shard_parse(const char *dir, const char *ixfile, const struct ck_tensor *t,
                                     const int64_t *shape, const cJSON *s, int with_file,
                                     struct ck_shard *sh)
{
    const cJSON *file = cJSON_GetObjectItemCaseSensitive(s, "file");
    const cJSON *crc = cJSON_GetObjectItemCaseSensitive(s, "crc32c");
    uint64_t v;
    int n1, n2;
    if (with_file) {
        if (!cJSON_IsString(file) || !ckpt_name_is_plain(file->valuestring))
            return index_bad_in(dir, ixfile,
                                "a shard's \"file\" is not a plain file name inside the "
                                "checkpoint directory",
                                t->name);
        sh->file = file->valuestring;
    }
    int64_t *lo = sh->box.lo, *ln = sh->box.len;
    if (json_i64s(cJSON_GetObjectItemCaseSensitive(s, "offset"), lo, 3, &n1) != 0 ||
        json_i64s(cJSON_GetObjectItemCaseSensitive(s, "shape"), ln, 3, &n2) != 0 || n1 != t->ndim ||
        n2 != t->ndim)
        return index_bad_in(dir, ixfile, "a shard's offset/shape do not match the tensor's dims",
                            t->name);
    uint64_t bytes = kdtype_size(t->dtype);
    for (int d = 0; d < t->ndim; d++) {
        if (lo[d] + ln[d] > shape[d]) /* each at most 9e15: no overflow */
            return index_bad_in(dir, ixfile, "a shard lies outside the tensor", t->name);
        if (__builtin_mul_overflow(bytes, (uint64_t)ln[d], &bytes))
            return index_bad_in(dir, ixfile, "a shard's byte size overflows 64 bits", t->name);
    }
    const cJSON *blocks = cJSON_GetObjectItemCaseSensitive(s, "block_crc32c"), *bc;
    if (!json_uint(crc, 4294967295.0, &v) || !cJSON_IsArray(blocks) ||
        (uint64_t)cJSON_GetArraySize(blocks) != (bytes + CKPT_BLOCK - 1) / CKPT_BLOCK)
        return index_bad_in(dir, ixfile, "a shard's CRC32C list does not match its size", t->name);
    sh->crc = (uint32_t)v;
    sh->blocks = mem_malloc(sizeof(uint32_t) * ((size_t)cJSON_GetArraySize(blocks) + 1));
    if (sh->blocks == NULL)
        return log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                        "load: %s/%s: out of memory allocating %zu bytes for the block CRCs of "
                        "'%s'",
                        dir, ixfile, sizeof(uint32_t) * ((size_t)cJSON_GetArraySize(blocks) + 1),
                        t->name);
    int b = 0;
    cJSON_ArrayForEach(bc, blocks)
    {
        if (!json_uint(bc, 4294967295.0, &v))
            return index_bad_in(dir, ixfile, "a block CRC32C is not an integer in [0, 2^32)",
                                t->name);
        sh->blocks[b++] = (uint32_t)v;
    }
    /* 3-D, leading dims of 1 */
    for (int d = 2; d >= 0; d--) {
        int s3 = d - (3 - t->ndim);
        lo[d] = s3 >= 0 ? lo[s3] : 0;
        ln[d] = s3 >= 0 ? ln[s3] : 1;
    }
    return SHARDOPT_OK;
}

/* One tensor record: everything but the tiling. */
static shardopt_status_t index_tensor(struct ck_index *L, const cJSON *e, struct ck_tensor *t)
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
    const struct ck_param *p =
        cJSON_IsString(param) ? ckpt_index_param(L, param->valuestring) : NULL;
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
    if (L->version >= CKPT_FORMAT_WRITERS_FIRST) { /* in the writers' indexes */
        if (shards != NULL)
            return index_bad(L->dir,
                             "\"shards\" in index.json of format_version 4 (they are in the "
                             "writers' rank-NNNNN.index.json)",
                             t->name);
        goto dims;
    }
    if (!cJSON_IsArray(shards))
        return index_bad(L->dir, "\"shards\" missing", t->name);
    t->shards = mem_calloc((size_t)cJSON_GetArraySize(shards) + 1, sizeof(*t->shards));
    if (t->shards == NULL)
        return log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                        "load: %s/index.json: out of memory allocating %zu bytes for the shards "
                        "of '%s'",
                        L->dir, mem_failed_bytes(), t->name);
    t->nshards = cJSON_GetArraySize(shards); /* only now: ckpt_index_free walks them */
    int j = 0;
    cJSON_ArrayForEach(s, shards)
    {
        shardopt_status_t status =
            shard_parse(L->dir, "index.json", t, t->shape, s, 1, &t->shards[j++]);
        if (status != SHARDOPT_OK)
            return status;
    }
dims:
    for (int d = 2; d >= 0; d--) {
        int s3 = d - (3 - t->ndim);
        t->shape[d] = s3 >= 0 ? t->shape[s3] : 1;
    }
    return SHARDOPT_OK;
}

const struct ck_tensor *ckpt_index_find(const struct ck_index *L, const char *name)
{
    const struct ck_tensor key = {.name = name}, *kp = &key;
    const struct ck_tensor **hit =
        L->nt > 0 ? bsearch(&kp, L->by, (size_t)L->nt, sizeof(*L->by), tensor_ptr_by_name) : NULL;
    return hit != NULL ? *hit : NULL;
}

/* Every check of the index text, before a shard is read. `verified`: rank 0 found
 * index.json.crc32c beside it and it matched (ckpt_index_check passes 1: the fuzz target reaches
 * the structure); `quiet`: no notice (every rank but 0). */
shardopt_status_t ckpt_index_parse(struct ck_index *L, const char *text, size_t len, int verified,
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
    L->nt = nt; /* only now: ckpt_index_free walks them */
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
    for (int k = 0; k < L->nt && L->version < CKPT_FORMAT_WRITERS_FIRST; k++)
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
        const struct ck_tensor *t = ckpt_index_find(L, L->p[k].name);
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
shardopt_status_t ckpt_index_read(const char *dir, char *stepdir, size_t len, char **text,
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
        const shardopt_status_t status = ckpt_dir_latest_read(dir, path, name, sizeof name);
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

void ckpt_index_free(struct ck_index *L)
{
    for (int i = 0; i < L->nt; i++) {
        for (int j = 0; j < L->t[i].nshards; j++)
            free(L->t[i].shards[j].blocks);
        free(L->t[i].shards);
    }
    free(L->t);
    free(L->by);
    free(L->p);
    for (int i = 0; i < L->nfiles; i++)
        free(L->files[i]);
    free(L->files);
    cJSON_Delete(L->root);
}

/* ---- version 4: the writers' indexes ---- */

void (*ckpt_index_test_probe)(void);

shardopt_status_t ckpt_index_writer_read(void *ctx, const char *stepdir, int w, char **text,
                                         size_t *len)
{
    char name[64], path[4400], rec[16];
    struct stat st;
    (void)ctx;
    *text = NULL;
    snprintf(name, sizeof name, CKPT_WRITER_INDEX_FMT, w);
    snprintf(path, sizeof path, "%s/%s", stepdir, name);
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return log_fail(SHARDOPT_ERR_IO, "load: %s: %s", path, strerror(errno));
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode) || (size_t)st.st_size > CKPT_INDEX_MAX) {
        fclose(f);
        return log_fail(SHARDOPT_ERR_CORRUPT, "load: %s: not a regular file of at most %zu bytes",
                        path, CKPT_INDEX_MAX);
    }
    *text = mem_malloc((size_t)st.st_size + 1);
    if (*text == NULL) {
        fclose(f);
        return log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                        "load: %s: out of memory allocating %zu bytes for its text", path,
                        (size_t)st.st_size + 1);
    }
    const int ok = fread(*text, 1, (size_t)st.st_size, f) == (size_t)st.st_size;
    fclose(f);
    if (!ok) {
        free(*text);
        *text = NULL;
        return log_fail(SHARDOPT_ERR_IO, "load: %s: read failed", path);
    }
    (*text)[st.st_size] = '\0';
    *len = (size_t)st.st_size;
    /* its integrity record, checked before a byte is parsed: version 4 always has one */
    snprintf(path, sizeof path, "%s/%s.crc32c", stepdir, name);
    f = fopen(path, "rb");
    size_t n = 0;
    int failed = 1;
    if (f != NULL) {
        n = fread(rec, 1, sizeof rec, f);
        failed = ferror(f);
        fclose(f);
    }
    int good = !failed && n == 9 && rec[8] == '\n';
    for (int i = 0; good && i < 8; i++)
        good = (rec[i] >= '0' && rec[i] <= '9') || (rec[i] >= 'a' && rec[i] <= 'f');
    shardopt_status_t status = SHARDOPT_OK;
    if (f == NULL)
        status = log_fail(errno == ENOENT ? SHARDOPT_ERR_CORRUPT : SHARDOPT_ERR_IO,
                          "load: %s: %s: the integrity record of %s is missing", path,
                          strerror(errno), name);
    else if (!good)
        status =
            log_fail(failed ? SHARDOPT_ERR_IO : SHARDOPT_ERR_CORRUPT,
                     "load: %s: %s (the CRC-32C of %s): the record is damaged", path,
                     failed ? "read failed" : "not 8 lowercase hex digits and a newline", name);
    else {
        rec[8] = '\0';
        const uint32_t want = (uint32_t)strtoul(rec, NULL, 16);
        const uint32_t have = crc32c_update(0, *text, *len);
        if (want != have)
            status = log_fail(SHARDOPT_ERR_CORRUPT,
                              "load: %s/%s: CRC32C %08x, %s.crc32c says %08x: the writer's index "
                              "is damaged",
                              stepdir, name, have, name, want);
    }
    if (status != SHARDOPT_OK) {
        free(*text);
        *text = NULL;
    }
    return status;
}

/* Elements of a and b's overlap (3-D boxes), and that box. */
static int64_t box_overlap(const struct plan_box *a, const struct plan_box *b, struct plan_box *o)
{
    int64_t v = 1;
    for (int d = 0; d < 3; d++) {
        const int64_t lo = a->lo[d] > b->lo[d] ? a->lo[d] : b->lo[d];
        const int64_t ahi = a->lo[d] + a->len[d], bhi = b->lo[d] + b->len[d];
        const int64_t hi = ahi < bhi ? ahi : bhi;
        if (hi <= lo)
            return 0;
        o->lo[d] = lo;
        o->len[d] = hi - lo;
        v *= hi - lo;
    }
    return v;
}

/* Keep shard sh of t (its blocks move to t). */
static shardopt_status_t shard_keep(struct ck_index *L, const char *ixfile, struct ck_tensor *t,
                                    struct ck_shard *sh)
{
    if (t->nshards == t->cap) {
        const int cap = t->cap ? 2 * t->cap : 4;
        struct ck_shard *n = mem_realloc(t->shards, sizeof(*n) * (size_t)cap);
        if (n == NULL)
            return log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                            "load: %s/%s: out of memory allocating %zu bytes for the shards of "
                            "'%s'",
                            L->dir, ixfile, sizeof(*n) * (size_t)cap, t->name);
        t->shards = n;
        t->cap = cap;
    }
    t->shards[t->nshards++] = *sh;
    sh->blocks = NULL;
    return SHARDOPT_OK;
}

/* One writer's index: every record checked, the shards overlapping a need kept (covered[k]
 * counts the elements of need k they cover). */
static shardopt_status_t writer_parse(struct ck_index *L, int w, const char *text, size_t len,
                                      const struct ck_need *need, int64_t *covered, int *left)
{
    char ixfile[64], why[256], rankfile[64];
    cJSON *root = NULL;
    const cJSON *e;
    uint64_t v;
    snprintf(ixfile, sizeof ixfile, CKPT_WRITER_INDEX_FMT, w);
    snprintf(rankfile, sizeof rankfile, CKPT_RANK_FILE_FMT, w);
    shardopt_status_t status =
        json_strict_parse(text, len, JSON_STRICT_INTEGERS, &root, why, sizeof why);
    if (status == SHARDOPT_ERR_OUT_OF_MEMORY)
        return log_fail(status, "load: %s/%s: %s while parsing it", L->dir, ixfile, why);
    if (status != SHARDOPT_OK)
        return log_fail(SHARDOPT_ERR_CORRUPT, "load: %s/%s: %s", L->dir, ixfile, why);
    if (ckpt_index_test_probe != NULL)
        ckpt_index_test_probe();
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    const cJSON *shards = cJSON_GetObjectItemCaseSensitive(root, "shards");
    const cJSON *file = cJSON_GetObjectItemCaseSensitive(root, "file");
    if (!cJSON_IsObject(root) || !cJSON_IsString(fmt) ||
        strcmp(fmt->valuestring, "shardopt-checkpoint-shards") != 0)
        status =
            index_bad_in(L->dir, ixfile, "\"format\" is not \"shardopt-checkpoint-shards\"", NULL);
    else if (!json_uint(cJSON_GetObjectItemCaseSensitive(root, "format_version"), CK_INT_MAX, &v) ||
             v != (uint64_t)L->version)
        status = index_bad_in(L->dir, ixfile, "\"format_version\" is not index.json's", NULL);
    else if (!json_uint(cJSON_GetObjectItemCaseSensitive(root, "step"), CK_INT_MAX, &v) ||
             v != L->step)
        status =
            index_bad_in(L->dir, ixfile,
                         "\"step\" is not index.json's (a writer's index of another save)", NULL);
    else if (!json_uint(cJSON_GetObjectItemCaseSensitive(root, "writer"), 2147483647.0, &v) ||
             v != (uint64_t)w)
        status = index_bad_in(L->dir, ixfile, "\"writer\" is not the number in its name", NULL);
    /* the rank file of the same number: nothing else a writer writes */
    else if (!cJSON_IsString(file) || strcmp(file->valuestring, rankfile) != 0)
        status = index_bad_in(L->dir, ixfile, "\"file\" is not the rank file of its number", NULL);
    else if (!cJSON_IsArray(shards))
        status = index_bad_in(L->dir, ixfile, "\"shards\" missing", NULL);
    const char *kept_name = NULL;
    const cJSON *list = status == SHARDOPT_OK ? shards : (const cJSON *)NULL;
    cJSON_ArrayForEach(e, list)
    {
        const cJSON *tn = cJSON_GetObjectItemCaseSensitive(e, "tensor");
        struct ck_tensor *t =
            cJSON_IsString(tn) ? (struct ck_tensor *)ckpt_index_find(L, tn->valuestring) : NULL;
        if (t == NULL) {
            status =
                index_bad_in(L->dir, ixfile, "a shard's \"tensor\" names no tensor of index.json",
                             cJSON_IsString(tn) ? tn->valuestring : NULL);
            break;
        }
        if (t->seen_writer == w + 1) { /* a writer holds one shard of a tensor */
            status = index_bad_in(L->dir, ixfile, "a tensor has two shards in one writer's index",
                                  t->name);
            break;
        }
        t->seen_writer = w + 1;
        struct ck_shard sh;
        memset(&sh, 0, sizeof sh);
        status = shard_parse(L->dir, ixfile, t, t->shape + (3 - t->ndim), e, 0, &sh);
        struct plan_box o;
        const int k = t->need - 1;
        const int64_t vol =
            status == SHARDOPT_OK && k >= 0 ? box_overlap(&sh.box, &need[k].box, &o) : 0;
        if (vol > 0) {
            if (kept_name == NULL) { /* the rank file's name, once per writer */
                if (L->nfiles == L->files_cap) {
                    const int cap = L->files_cap ? 2 * L->files_cap : 16;
                    char **n = mem_realloc(L->files, sizeof(*n) * (size_t)cap);
                    if (n == NULL)
                        status = log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                                          "load: %s/%s: out of memory allocating %zu bytes for "
                                          "the file names",
                                          L->dir, ixfile, sizeof(*n) * (size_t)cap);
                    else
                        L->files = n, L->files_cap = cap;
                }
                char *copy = status == SHARDOPT_OK ? mem_strdup(rankfile) : NULL;
                if (status == SHARDOPT_OK && copy == NULL)
                    status = log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                                      "load: %s/%s: out of memory allocating %zu bytes for a file "
                                      "name",
                                      L->dir, ixfile, strlen(rankfile) + 1);
                if (copy != NULL)
                    kept_name = L->files[L->nfiles++] = copy;
            }
            sh.file = kept_name;
            covered[k] += vol;
            int64_t want = 1;
            for (int d = 0; d < 3; d++)
                want *= need[k].box.len[d];
            if (covered[k] > want) /* a valid checkpoint's shards never overlap */
                status = index_bad_in(
                    L->dir, ixfile,
                    "the shards overlap (they must tile the tensor exactly): more than this "
                    "rank's part is covered",
                    t->name);
            else if (covered[k] == want)
                (*left)--;
            if (status == SHARDOPT_OK)
                status = shard_keep(L, ixfile, t, &sh);
        }
        free(sh.blocks);
        if (status != SHARDOPT_OK)
            break;
    }
    cJSON_Delete(root);
    return status;
}

static int need_covered(const struct ck_need *n, int64_t covered)
{
    return covered == n->box.len[0] * n->box.len[1] * n->box.len[2];
}

/* Writer w's index, once: read, checked, its overlapping shards kept. */
static shardopt_status_t writer_visit(struct ck_index *L, int w, unsigned char *done,
                                      const struct ck_need *need, int64_t *covered, int *left,
                                      ck_writer_read_fn rd, void *ctx)
{
    if (done[w])
        return SHARDOPT_OK;
    done[w] = 1;
    char *text = NULL;
    size_t len = 0;
    shardopt_status_t status = rd(ctx, L->dir, w, &text, &len);
    if (status == SHARDOPT_OK)
        status = writer_parse(L, w, text, len, need, covered, left);
    free(text);
    L->writers_read++;
    return status;
}

/* torch.chunk's piece of n over `parts` that holds index i: ceil-sized pieces */
static int64_t chunk_of(int64_t n, int64_t parts, int64_t i)
{
    const int64_t c = (n + parts - 1) / parts;
    return c > 0 ? i / c : 0;
}

#define CK_GUESS_MAX 64

/* The writers that held need n's part of t had the saving world sharded it as n says (dense:
 * torch.chunk along n->dim over the dense group, writer = dense rank; expert stack: E / ep experts
 * per EP rank, then chunks along n->dim over the expert group; dense rank = expert-group rank x
 * ep + EP rank, as sharding/mesh.h numbers them). Only a first guess: the caller reads them
 * and checks what they hold. At most CK_GUESS_MAX. */
static int writers_guess(const struct ck_index *L, const struct ck_tensor *t,
                         const struct ck_need *n, int *ws)
{
    const int W = L->writers, dim = n->dim >= 0 && n->dim < 3 ? n->dim : 0;
    const int64_t lo = n->box.lo[dim], hi = lo + n->box.len[dim] - 1;
    int k = 0;
    if (!n->expert) {
        for (int64_t w = chunk_of(t->shape[dim], W, lo);
             w <= chunk_of(t->shape[dim], W, hi) && w < W && k < CK_GUESS_MAX; w++)
            ws[k++] = (int)w;
        return k;
    }
    const int ep = L->ep, xs = W / L->ep;
    const int64_t per = t->shape[0] / ep; /* experts per EP rank */
    if (per <= 0 || xs <= 0 || dim == 0)  /* chunks of the EP rank's own experts: not guessed */
        return 0;
    for (int64_t e = n->box.lo[0] / per;
         e <= (n->box.lo[0] + n->box.len[0] - 1) / per && e < ep && k < CK_GUESS_MAX; e++)
        for (int64_t x = chunk_of(t->shape[dim], xs, lo);
             x <= chunk_of(t->shape[dim], xs, hi) && x < xs && k < CK_GUESS_MAX; x++)
            ws[k++] = (int)(x * ep + e);
    return k;
}

shardopt_status_t ckpt_index_select(struct ck_index *L, const struct ck_need *need, int nneed,
                                    int me, int nme, ck_writer_read_fn rd, void *ctx)
{
    if (L->version < CKPT_FORMAT_WRITERS_FIRST)
        return SHARDOPT_OK;
    shardopt_status_t status = SHARDOPT_OK;
    int left = 0, most = 0;
    int64_t *covered = mem_calloc((size_t)nneed + 1, sizeof(*covered));
    if (covered == NULL)
        return log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                        "load: %s: out of memory allocating %zu bytes for what each writer covers",
                        L->dir, ((size_t)nneed + 1) * sizeof(*covered));
    for (int k = 0; k < nneed; k++) {
        struct ck_tensor *t = (struct ck_tensor *)ckpt_index_find(L, need[k].tensor);
        if (t == NULL || need[k].box.len[0] * need[k].box.len[1] * need[k].box.len[2] == 0)
            continue; /* not in the checkpoint (the loader decides), or nothing of it here */
        t->need = k + 1;
        left++;
    }
    const int W = L->writers;
    unsigned char *done = status == SHARDOPT_OK ? mem_calloc((size_t)W + 1, 1) : NULL;
    if (done == NULL) {
        free(covered);
        return log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                        "load: %s: out of memory allocating %zu bytes for the writers read", L->dir,
                        (size_t)W + 1);
    }
    /* writer 0: replicated tensors are only there */
    status = writer_visit(L, 0, done, need, covered, &left, rd, ctx);
    /* the writers a need's part lies in, if the saver sharded it as this rank's trainer does */
    for (int k = 0; left > 0 && status == SHARDOPT_OK && k < nneed; k++) {
        const struct ck_tensor *t = ckpt_index_find(L, need[k].tensor);
        int ws[CK_GUESS_MAX];
        const int n = t != NULL && t->need == k + 1 ? writers_guess(L, t, &need[k], ws) : 0;
        for (int i = 0; i < n && status == SHARDOPT_OK && !need_covered(&need[k], covered[k]); i++)
            status = writer_visit(L, ws[i], done, need, covered, &left, rd, ctx);
    }
    /* then every other writer, outward from this rank's relative position */
    const int w0 = nme > 0 ? (int)((int64_t)me * W / nme) : 0;
    for (int i = 1; left > 0 && status == SHARDOPT_OK && i <= 2 * W; i++) {
        const int w = i & 1 ? w0 + (i + 1) / 2 - 1 : w0 - i / 2;
        if (w >= 0 && w < W)
            status = writer_visit(L, w, done, need, covered, &left, rd, ctx);
    }
    free(done);
    /* the shards kept for each need tile its box: checked before any byte of a rank file is
     * read (a gap is a writer's index missing a record; an overlap was refused as it came) */
    for (int k = 0; status == SHARDOPT_OK && k < nneed; k++) {
        const struct ck_tensor *t = ckpt_index_find(L, need[k].tensor);
        if (t != NULL && t->need == k + 1)
            most = t->nshards > most ? t->nshards : most;
    }
    const size_t cbytes = sizeof(struct corner) * 8 * ((size_t)most + 1);
    struct corner *corners = status == SHARDOPT_OK ? mem_malloc(cbytes) : NULL;
    if (status == SHARDOPT_OK && corners == NULL)
        status = log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                          "load: %s: out of memory allocating %zu bytes to check that the shards "
                          "tile this rank's part",
                          L->dir, cbytes);
    for (int k = 0; status == SHARDOPT_OK && k < nneed; k++) {
        const struct ck_tensor *t = ckpt_index_find(L, need[k].tensor);
        if (t == NULL || t->need != k + 1)
            continue;
        /* the kept shards clipped to the need, in its coordinates, against the need's box */
        struct ck_tensor part = {.name = t->name, .nshards = t->nshards};
        struct ck_shard *clip = mem_calloc((size_t)t->nshards + 1, sizeof(*clip));
        if (clip == NULL) {
            status = log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                              "load: %s: out of memory allocating %zu bytes to check the shards of "
                              "'%s'",
                              L->dir, ((size_t)t->nshards + 1) * sizeof(*clip), t->name);
            break;
        }
        for (int d = 0; d < 3; d++)
            part.shape[d] = need[k].box.len[d];
        for (int s = 0; s < t->nshards; s++) {
            box_overlap(&t->shards[s].box, &need[k].box, &clip[s].box);
            for (int d = 0; d < 3; d++)
                clip[s].box.lo[d] -= need[k].box.lo[d];
        }
        part.shards = clip;
        if (covered[k] != part.shape[0] * part.shape[1] * part.shape[2] ||
            !shards_tile(&part, corners))
            status = index_bad_in(L->dir, "rank-*.index.json",
                                  covered[k] < part.shape[0] * part.shape[1] * part.shape[2]
                                      ? "the shards leave part of the tensor uncovered (they "
                                        "must tile it exactly): this rank's part is not covered "
                                        "whole"
                                      : tiling_problem(&part),
                                  t->name);
        free(clip);
    }
    free(corners);
    free(covered);
    return status;
}

shardopt_status_t ckpt_index_check(const char *text, size_t len)
{
    struct ck_index L;
    memset(&L, 0, sizeof L);
    snprintf(L.dir, sizeof L.dir, "(index text)");
    shardopt_status_t status = ckpt_index_parse(&L, text, len, 1, 1);
    ckpt_index_free(&L);
    return status;
}

shardopt_status_t ckpt_writer_index_check(const char *index_text, size_t index_len,
                                          const char *text, size_t len)
{
    struct ck_index L;
    int left = 0;
    memset(&L, 0, sizeof L);
    snprintf(L.dir, sizeof L.dir, "(index text)");
    shardopt_status_t status = ckpt_index_parse(&L, index_text, index_len, 1, 1);
    if (status != SHARDOPT_OK || L.version < CKPT_FORMAT_WRITERS_FIRST)
        status = SHARDOPT_ERR_INVALID_ARGUMENT;
    else /* no needs: every record is checked, none kept */
        status = writer_parse(&L, 0, text, len, NULL, NULL, &left);
    ckpt_index_free(&L);
    return status;
}

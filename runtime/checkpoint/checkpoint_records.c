/* What index.json and the writers' indexes (format_version 4) share, as a load checks them: the
 * one conversion of an index number to an integer, the refusal naming the index file, one shard
 * record's checks, and the check that shards tile a box exactly. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/mem.h"
#include "base/status.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/checkpoint_index.h"
#include "runtime/checkpoint/safetensors.h"

/* A JSON number holding an integer in [0, max]; the only conversion of an index number to an
 * integer goes through here or ckpt_json_i64s. */
int ckpt_json_uint(const cJSON *v, double max, uint64_t *out)
{
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble <= max) ||
        v->valuedouble != floor(v->valuedouble))
        return 0;
    *out = (uint64_t)v->valuedouble;
    return 1;
}

int ckpt_json_i64s(const cJSON *a, int64_t *out, int max, int *n)
{
    const cJSON *e;
    *n = 0;
    if (!cJSON_IsArray(a))
        return -1;
    cJSON_ArrayForEach(e, a)
    {
        uint64_t v;
        if (*n == max || !ckpt_json_uint(e, CK_INT_MAX, &v))
            return -1;
        out[(*n)++] = (int64_t)v;
    }
    return 0;
}

/* file: "index.json", or a writer's index (version 4) */
shardopt_status_t ckpt_index_bad_in(const char *dir, const char *file, const char *what,
                                    const char *tensor)
{
    char shown[600]; /* the name as the file has it: escaped */
    return log_fail(
        SHARDOPT_ERR_CORRUPT, "load: %s/%s: %s%s%s%s", dir, file, what, tensor ? " (tensor '" : "",
        tensor ? log_escape(shown, sizeof shown, tensor, strlen(tensor)) : "", tensor ? "')" : "");
}

static int corner_cmp(const void *a, const void *b)
{
    const struct ck_corner *p = a, *q = b;
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
int ckpt_shards_tile(const struct ck_tensor *t, struct ck_corner *c)
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

/* Why ckpt_shards_tile said no, from the volumes (each shard lies inside the tensor). */
const char *ckpt_tiling_problem(const struct ck_tensor *t)
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
shardopt_status_t ckpt_shard_parse(const char *dir, const char *ixfile, const struct ck_tensor *t,
                                   const int64_t *shape, const cJSON *s, int with_file,
                                   struct ck_shard *sh)
{
    const cJSON *file = cJSON_GetObjectItemCaseSensitive(s, "file");
    const cJSON *crc = cJSON_GetObjectItemCaseSensitive(s, "crc32c");
    uint64_t v;
    int n1, n2;
    if (with_file) {
        if (!cJSON_IsString(file) || !ckpt_name_is_plain(file->valuestring))
            return ckpt_index_bad_in(dir, ixfile,
                                     "a shard's \"file\" is not a plain file name inside the "
                                     "checkpoint directory",
                                     t->name);
        sh->file = file->valuestring;
    }
    int64_t *lo = sh->box.lo, *ln = sh->box.len;
    if (ckpt_json_i64s(cJSON_GetObjectItemCaseSensitive(s, "offset"), lo, 3, &n1) != 0 ||
        ckpt_json_i64s(cJSON_GetObjectItemCaseSensitive(s, "shape"), ln, 3, &n2) != 0 ||
        n1 != t->ndim || n2 != t->ndim)
        return ckpt_index_bad_in(dir, ixfile,
                                 "a shard's offset/shape do not match the tensor's dims", t->name);
    uint64_t bytes = kdtype_size(t->dtype);
    for (int d = 0; d < t->ndim; d++) {
        if (lo[d] + ln[d] > shape[d]) { /* each at most 9e15: no overflow */
            char what[160];
            snprintf(what, sizeof what,
                     "a shard lies outside the tensor (dim %d: offset %lld + shape %lld > %lld)", d,
                     (long long)lo[d], (long long)ln[d], (long long)shape[d]);
            return ckpt_index_bad_in(dir, ixfile, what, t->name);
        }
        if (__builtin_mul_overflow(bytes, (uint64_t)ln[d], &bytes))
            return ckpt_index_bad_in(dir, ixfile, "a shard's byte size overflows 64 bits", t->name);
    }
    const cJSON *blocks = cJSON_GetObjectItemCaseSensitive(s, "block_crc32c"), *bc;
    if (!ckpt_json_uint(crc, 4294967295.0, &v) || !cJSON_IsArray(blocks) ||
        (uint64_t)cJSON_GetArraySize(blocks) != (bytes + CKPT_BLOCK - 1) / CKPT_BLOCK)
        return ckpt_index_bad_in(dir, ixfile, "a shard's CRC32C list does not match its size",
                                 t->name);
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
        if (!ckpt_json_uint(bc, 4294967295.0, &v))
            return ckpt_index_bad_in(dir, ixfile, "a block CRC32C is not an integer in [0, 2^32)",
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

/* The dtype, and the shape rather than the element count only: a header whose shape disagrees
 * with the index (a [4, 8] entry for an [8, 4] shard, [32] for it) was loaded as the index says,
 * a file a reader of its own header takes for another tensor, accepted silently. */
shardopt_status_t ckpt_shard_header_check(const char *dir, const struct ck_tensor *t,
                                          const struct ck_shard *sh, const struct st_tensor *st)
{
    int64_t h3[3] = {1, 1, 1}, numel = sh->box.len[0] * sh->box.len[1] * sh->box.len[2], hn = 1;
    for (int d = 0; d < st->ndim; d++) {
        h3[3 - st->ndim + d] = st->shape[d];
        hn *= st->shape[d]; /* the header's own check bounds its byte size by the file */
    }
    if (st->dtype == t->dtype && st->ndim == t->ndim && memcmp(h3, sh->box.len, sizeof h3) == 0)
        return SHARDOPT_OK;
    char hs[96], is[96];
    return log_fail(SHARDOPT_ERR_CORRUPT,
                    "load: %s/%s: tensor '%s' is %s %s (%lld elements) in the file's header, the "
                    "index says %s %s (%lld): the file does not match its index",
                    dir, sh->file, t->name, ckpt_dtype_name(st->dtype),
                    st->ndim == 0 ? "[]" : ckpt_shape_text(hs, sizeof hs, h3, st->ndim),
                    (long long)hn, ckpt_dtype_name(t->dtype),
                    ckpt_shape_text(is, sizeof is, sh->box.len, t->ndim), (long long)numel);
}

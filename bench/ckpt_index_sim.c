#include "bench/ckpt_index_sim.h"

#include <malloc.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/preset_shards.h"
#include "runtime/checkpoint/checkpoint_index.h"

/* ---- the heap, as glibc counts it (every allocation: ours, cJSON's, the texts) ---- */

static size_t heap_now(void)
{
    const struct mallinfo2 m = mallinfo2();
    return m.uordblks + m.hblkhd;
}

static size_t heap_max;

static void heap_probe(void)
{
    const size_t now = heap_now();
    heap_max = now > heap_max ? now : heap_max;
}

/* ---- text ---- */

struct text {
    char *s;
    size_t len, cap;
    int failed;
};

__attribute__((format(printf, 2, 3))) static void put(struct text *t, const char *fmt, ...)
{
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        const int n = t->failed ? 0 : vsnprintf(t->s + t->len, t->cap - t->len, fmt, ap);
        va_end(ap);
        if (t->failed || (size_t)n < t->cap - t->len) {
            t->len += (size_t)n;
            return;
        }
        const size_t cap = 2 * t->cap + (size_t)n + 4096;
        char *s = realloc(t->s, cap);
        if (s == NULL) {
            t->failed = 1;
            return;
        }
        t->s = s;
        t->cap = cap;
    }
}

static void put_ints(struct text *t, const int64_t *v, int n)
{
    put(t, "[");
    for (int i = 0; i < n; i++)
        put(t, "%s%lld", i ? "," : "", (long long)v[i]);
    put(t, "]");
}

/* ---- the model as a save writes it ---- */

/* The optimizer state a preset tensor has: Muon's momentum for a matrix, AdamW's two moments for
 * a vector and for the embedding and output matrices (the default adamw_patterns). */
static int kinds_of(const struct preset_tensor *t, const char *const **kinds)
{
    static const char *const muon[1] = {"momentum"}, *const adamw[2] = {"exp_avg", "exp_avg_sq"};
    if (t->ndim >= 2 && strstr(t->name, "embed") == NULL && strstr(t->name, "lm_head") == NULL) {
        *kinds = muon;
        return 1;
    }
    *kinds = adamw;
    return 2;
}

/* Rank r's part of t in world s, in t's own dims (global coordinates). */
static void box_of(const struct ckpt_sim *s, const struct preset_tensor *t, int r, int64_t lo[3],
                   int64_t len[3])
{
    struct preset_shard sh;
    const int ep_rank = r % s->ep, xs_rank = r / s->ep;
    if (t->expert)
        preset_shard_of(t, s->ep, s->world / s->ep, xs_rank, s->expert_dim, &sh);
    else
        preset_shard_of(t, s->ep, s->world, r, s->expert_dim, &sh);
    if (t->expert) /* the EP rank's experts, in the stack's coordinates */
        sh.lo[0] += (int64_t)ep_rank * (t->shape[0] / s->ep);
    memcpy(lo, sh.lo, sizeof sh.lo);
    memcpy(len, sh.len, sizeof sh.len);
}

static void shard_put(struct text *t, const struct ckpt_sim *s, const struct preset_tensor *pt,
                      int w, const char *tensor, int first);

/* index.json of format_version 4, or with `v2` of version 2: every writer's records inline (what
 * a save wrote before version 4) */
static char *index_text(const struct ckpt_sim *s, int v2, size_t *len)
{
    struct text t = {0};
    put(&t,
        "{\"format\":\"shardopt-checkpoint\",\"format_version\":%d,%s\"step\":10,"
        "\"layout\":{\"ranks\":%d,\"dp_replicate\":1,\"dp_shard\":%d,\"cp\":1,\"ep\":%d,"
        "\"block_bytes\":%zu},",
        v2 ? 2 : CKPT_FORMAT_VERSION, v2 ? "" : "\"weights\":false,", s->world, s->world, s->ep,
        CKPT_BLOCK);
    if (!v2)
        put(&t, "\"writers\":%d,", s->world);
    put(&t, "\"config\":{},\"params\":[");
    for (int i = 0; i < s->p->n; i++) {
        const struct preset_tensor *pt = &s->p->t[i];
        const char *const *k;
        kinds_of(pt, &k);
        put(&t, "%s{\"name\":\"%s\",\"algo\":\"%s\",\"shape\":", i ? "," : "", pt->name,
            strcmp(k[0], "momentum") == 0 ? "muon" : "adamw");
        put_ints(&t, pt->shape, pt->ndim);
        put(&t, ",\"step\":10}");
    }
    put(&t, "],\"tensors\":[");
    for (int i = 0, first = 1; i < s->p->n; i++) {
        const struct preset_tensor *pt = &s->p->t[i];
        const char *const *k;
        const int nk = kinds_of(pt, &k);
        for (int j = 0; j < nk; j++, first = 0) {
            put(&t, "%s{\"name\":\"%s.%s\",\"param\":\"%s\",\"dtype\":\"F32\",\"shape\":",
                first ? "" : ",", pt->name, k[j], pt->name);
            put_ints(&t, pt->shape, pt->ndim);
            if (v2) {
                char name[300];
                snprintf(name, sizeof name, "%s.%s", pt->name, k[j]);
                put(&t, ",\"shards\":[");
                for (int w = 0, none = 1; w < s->world; w++) {
                    const size_t before = t.len;
                    shard_put(&t, s, pt, w, name, none);
                    none = none && t.len == before;
                }
                put(&t, "]");
            }
            put(&t, "}");
        }
    }
    put(&t, "]}");
    if (t.failed) {
        free(t.s);
        return NULL;
    }
    *len = t.len;
    return t.s;
}

/* Writer w's record of `tensor` (a part of pt), if it holds any: in a writer's index (version 4),
 * or with its "file" in index.json (version 2, s->v2). */
static void shard_put(struct text *t, const struct ckpt_sim *s, const struct preset_tensor *pt,
                      int w, const char *tensor, int first)
{
    int64_t lo[3], ln[3];
    box_of(s, pt, w, lo, ln);
    const uint64_t bytes = (uint64_t)(ln[0] * ln[1] * ln[2]) * 4;
    if (bytes == 0) /* a rank that holds nothing of it writes nothing */
        return;
    if (tensor != NULL)
        put(t, "%s{\"file\":\"" CKPT_RANK_FILE_FMT "\",\"offset\":", first ? "" : ",", w);
    else
        put(t, "\"offset\":");
    put_ints(t, lo, pt->ndim);
    put(t, ",\"shape\":");
    put_ints(t, ln, pt->ndim);
    put(t, ",\"crc32c\":0,\"block_crc32c\":[");
    for (uint64_t b = 0; b < (bytes + CKPT_BLOCK - 1) / CKPT_BLOCK; b++)
        put(t, b ? ",0" : "0");
    put(t, "]}");
}

/* The reader ckpt_index_select calls: writer w's index as its save writes it (CRCs of zero bytes:
 * the index code checks their count, not what they are of). */
static shardopt_status_t writer_text(void *ctx, const char *stepdir, int w, char **text,
                                     size_t *len)
{
    const struct ckpt_sim *s = ctx;
    struct text t = {0};
    (void)stepdir;
    put(&t,
        "{\"format\":\"shardopt-checkpoint-shards\",\"format_version\":%d,\"step\":10,"
        "\"writer\":%d,\"file\":\"" CKPT_RANK_FILE_FMT "\",\"shards\":[",
        CKPT_FORMAT_VERSION, w, w);
    for (int i = 0, first = 1; i < s->p->n; i++) {
        const struct preset_tensor *pt = &s->p->t[i];
        const char *const *k;
        const int nk = kinds_of(pt, &k);
        int64_t lo[3], ln[3];
        box_of(s, pt, w, lo, ln);
        if (ln[0] * ln[1] * ln[2] == 0) /* a rank that holds nothing of it writes nothing */
            continue;
        for (int j = 0; j < nk; j++, first = 0) {
            put(&t, "%s{\"tensor\":\"%s.%s\",", first ? "" : ",", pt->name, k[j]);
            shard_put(&t, s, pt, w, NULL, 1);
        }
    }
    put(&t, "]}");
    if (t.failed) {
        free(t.s);
        return SHARDOPT_ERR_OUT_OF_MEMORY;
    }
    *text = t.s;
    *len = t.len;
    heap_probe();
    return SHARDOPT_OK;
}

static int64_t records_of(const struct ckpt_sim *s)
{
    int64_t n = 0;
    for (int i = 0; i < s->p->n; i++) {
        const char *const *k;
        const int nk = kinds_of(&s->p->t[i], &k);
        for (int w = 0; w < s->world; w++) {
            int64_t lo[3], ln[3];
            box_of(s, &s->p->t[i], w, lo, ln);
            n += ln[0] * ln[1] * ln[2] > 0 ? nk : 0;
        }
    }
    return n;
}

/* The saving writers that hold some of what `rank` of `loading` holds: what a load must read. */
static int writers_needed(const struct ckpt_sim *saved, const struct ckpt_sim *loading, int rank)
{
    int n = 0;
    for (int w = 0; w < saved->world; w++) {
        int hit = 0;
        for (int i = 0; i < saved->p->n && !hit; i++) {
            int64_t a[3], al[3], b[3], bl[3];
            box_of(saved, &saved->p->t[i], w, a, al);
            box_of(loading, &loading->p->t[i], rank, b, bl);
            hit = 1;
            for (int d = 0; d < 3; d++)
                hit = hit && (a[d] > b[d] ? a[d] : b[d]) <
                                 (a[d] + al[d] < b[d] + bl[d] ? a[d] + al[d] : b[d] + bl[d]);
        }
        n += hit;
    }
    return n;
}

shardopt_status_t ckpt_sim_load_rank(const struct ckpt_sim *saved, const struct ckpt_sim *loading,
                                     int rank, struct ckpt_sim_result *out)
{
    struct ck_index L;
    struct timespec t0, t1;
    shardopt_status_t status = SHARDOPT_ERR_OUT_OF_MEMORY;
    const int n = 2 * loading->p->n;
    struct ck_need *need = calloc((size_t)n + 1, sizeof(*need));
    char(*names)[300] = calloc((size_t)n + 1, sizeof(*names));
    int nn = 0;

    memset(out, 0, sizeof *out);
    memset(&L, 0, sizeof L);
    snprintf(L.dir, sizeof L.dir, "(simulated %d-rank world)", saved->world);
    out->records = records_of(saved);
    out->writers_needed = writers_needed(saved, loading, rank);
    if (need == NULL || names == NULL)
        goto done;
    /* the parts this rank holds: what the loader asks the index for */
    for (int i = 0; i < loading->p->n; i++) {
        const struct preset_tensor *pt = &loading->p->t[i];
        const char *const *k;
        const int nk = kinds_of(pt, &k);
        int64_t lo[3], ln[3];
        box_of(loading, pt, rank, lo, ln);
        for (int j = 0; j < nk; j++, nn++) {
            snprintf(names[nn], sizeof names[nn], "%s.%s", pt->name, k[j]);
            need[nn].tensor = names[nn];
            need[nn].dim = (pt->expert ? loading->expert_dim : 0) + (3 - pt->ndim);
            need[nn].expert = pt->expert;
            for (int d = 0; d < 3; d++) { /* 3-D, leading dims of 1 */
                const int s3 = d - (3 - pt->ndim);
                need[nn].box.lo[d] = s3 >= 0 ? lo[s3] : 0;
                need[nn].box.len[d] = s3 >= 0 ? ln[s3] : 1;
            }
        }
    }
    const size_t base = heap_now();
    heap_max = base;
    ckpt_index_test_probe = heap_probe;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    size_t len = 0;
    char *text = index_text(saved, 0, &len);
    if (text != NULL) {
        status = ckpt_index_parse(&L, text, len, 1, 1);
        heap_probe();
        free(text);
    }
    if (status == SHARDOPT_OK)
        status = ckpt_index_select(&L, need, nn, rank, loading->world, writer_text, (void *)saved);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    heap_probe();
    ckpt_index_test_probe = NULL;
    out->heap_peak = heap_max - base;
    out->heap_kept = heap_now() > base ? heap_now() - base : 0;
    out->writers_read = L.writers_read;
    for (int i = 0; i < L.nt; i++)
        out->shards += L.t[i].nshards;
    out->seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    ckpt_index_free(&L);
done:
    free(need);
    free(names);
    return status;
}

shardopt_status_t ckpt_sim_load_v2(const struct ckpt_sim *saved, struct ckpt_sim_result *out)
{
    struct ck_index L;
    struct timespec t0, t1;
    shardopt_status_t status = SHARDOPT_ERR_OUT_OF_MEMORY;
    memset(out, 0, sizeof *out);
    memset(&L, 0, sizeof L);
    snprintf(L.dir, sizeof L.dir, "(simulated %d-rank world, version 2)", saved->world);
    out->records = records_of(saved);
    const size_t base = heap_now();
    heap_max = base;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    size_t len = 0;
    char *text = index_text(saved, 1, &len);
    heap_probe();
    if (text != NULL) {
        status = ckpt_index_parse(&L, text, len, 1, 1);
        heap_probe();
        free(text);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    out->heap_peak = heap_max - base;
    for (int i = 0; i < L.nt; i++)
        out->shards += L.t[i].nshards;
    out->seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    ckpt_index_free(&L);
    return status;
}

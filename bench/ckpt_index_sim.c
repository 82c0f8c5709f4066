#include "bench/ckpt_index_sim.h"

#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/mem.h"
#include "base/status.h"
#include "bench/preset_shards.h"
#include "runtime/checkpoint/checkpoint_dir.h"
#include "runtime/checkpoint/checkpoint_index.h"
#include "runtime/checkpoint/checkpoint_write.h"

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

/* ---- the save side: what a writer and rank 0 build and write of the index ---- */

/* A runtime as the save's index code reads it: the mesh of `s`, the preset's parameters with
 * writer w's parts (no state, no MPI). ckpt_sim_writer_set moves it to another writer. */
struct sim_rt {
    struct shardopt_runtime *rt;
    struct shardopt_param *p, **pp;
};

static void sim_rt_free(struct sim_rt *r)
{
    free(r->pp);
    free(r->p);
    free(r->rt);
}

static int sim_rt_make(const struct ckpt_sim *s, struct sim_rt *r)
{
    const shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    r->rt = calloc(1, sizeof *r->rt);
    r->p = calloc((size_t)s->p->n + 1, sizeof *r->p);
    r->pp = calloc((size_t)s->p->n + 1, sizeof *r->pp);
    if (r->rt == NULL || r->p == NULL || r->pp == NULL) {
        sim_rt_free(r);
        return -1;
    }
    struct shardopt_runtime *rt = r->rt;
    rt->cfg = cfg;
    rt->groups.mesh.world = rt->groups.mesh.dp_shard = rt->groups.mesh.dense = s->world;
    rt->groups.mesh.dp_replicate = rt->groups.mesh.cp = 1;
    rt->groups.mesh.ep = s->ep;
    rt->counters.steps = 10;
    rt->params = r->pp;
    rt->nparams = s->p->n;
    for (int i = 0; i < s->p->n; i++) {
        const struct preset_tensor *pt = &s->p->t[i];
        struct shardopt_param *p = &r->p[i];
        const char *const *k;
        kinds_of(pt, &k);
        p->rt = rt;
        p->name = (char *)pt->name;
        p->index = i;
        p->algo = strcmp(k[0], "momentum") == 0 ? SHARDOPT_ALGO_MUON : SHARDOPT_ALGO_ADAMW;
        p->placement = pt->expert ? SHARDOPT_PLACEMENT_EXPERT : SHARDOPT_PLACEMENT_DENSE;
        p->param_dtype = SHARDOPT_DTYPE_FP32;
        p->step = 10;
        p->layout.ndim = pt->ndim;
        memcpy(p->layout.shape, pt->shape, sizeof pt->shape);
        r->pp[i] = p;
    }
    return 0;
}

/* Writer w's records as its rank file's writing collects them (ckpt_rank_file_write: one per
 * tensor it holds a part of, then its block CRCs; zero CRCs here), into *blob. */
static int writer_blob(const struct ckpt_sim *s, struct sim_rt *r, int w, char **blob, size_t *len)
{
    size_t cap = 0;
    struct shardopt_runtime *rt = r->rt;
    rt->groups.me.d = rt->groups.me.rank = rt->groups.me.shard = w;
    *blob = NULL;
    *len = 0;
    for (int i = 0; i < s->p->n; i++) {
        struct shardopt_param *p = &r->p[i];
        box_of(s, &s->p->t[i], w, p->layout.lo, p->layout.len);
        p->layout.local_numel = p->layout.len[0] * p->layout.len[1] * p->layout.len[2];
        if (p->layout.local_numel == 0) /* a rank that holds nothing of it writes nothing */
            continue;
        struct ckpt_kind k[3];
        const int nk = ckpt_tensors(rt, p, 0, k);
        for (int j = 0; j < nk; j++) {
            const size_t bytes = (size_t)p->layout.local_numel * kdtype_size(k[j].dtype);
            struct ckpt_shard_record rec = {.param = i, .kind = j, .dtype = k[j].dtype};
            rec.nblocks = (uint32_t)((bytes + CKPT_BLOCK - 1) / CKPT_BLOCK);
            memcpy(rec.lo, p->layout.lo, sizeof rec.lo);
            memcpy(rec.len, p->layout.len, sizeof rec.len);
            const uint32_t zero = 0;
            if (ckpt_blob_add(blob, len, &cap, &rec, sizeof rec) != 0)
                return -1;
            for (uint32_t b = 0; b < rec.nblocks; b++)
                if (ckpt_blob_add(blob, len, &cap, &zero, sizeof zero) != 0)
                    return -1;
        }
    }
    return 0;
}

static double seconds_since(const struct timespec *t0)
{
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0->tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0->tv_nsec);
}

/* An empty file dir/name (the rank files and unsampled writers' indexes: rank 0 checks their
 * sizes, which are what they are). */
static int file_touch(int dfd, const char *name)
{
    const int fd = openat(dfd, name, O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);
    return fd >= 0 && close(fd) == 0 ? 0 : -1;
}

shardopt_status_t ckpt_sim_save(const struct ckpt_sim *s, const char *scratch,
                                struct ckpt_sim_save_result *out)
{
    struct sim_rt r;
    char tmp[4200], name[64];
    const char *tmpname = ".tmp-step-00000010-1";
    const int writers[3] = {0, s->world / 2 + 1, s->world - 1};
    int64_t wbytes[3] = {0, 0, 0};
    shardopt_status_t status = SHARDOPT_OK;
    int dfd = -1, tfd = -1;
    int64_t *sizes = NULL;

    memset(out, 0, sizeof *out);
    if (sim_rt_make(s, &r) != 0)
        return SHARDOPT_ERR_OUT_OF_MEMORY;
    snprintf(tmp, sizeof tmp, "%s/%s", scratch, tmpname);
    if (mkdir(scratch, 0755) != 0 || (dfd = open(scratch, O_RDONLY | O_DIRECTORY)) < 0 ||
        mkdir(tmp, 0755) != 0 || (tfd = open(tmp, O_RDONLY | O_DIRECTORY)) < 0) {
        status = log_fail(SHARDOPT_ERR_IO, "ckpt_sim_save: %s: %s", tmp, strerror(errno));
        goto done;
    }
    /* sampled writers: the records their rank files' writing collected, then their index */
    ckpt_index_test_probe = heap_probe;
    for (int i = 0; i < 3 && status == SHARDOPT_OK; i++) {
        char *blob = NULL;
        size_t len = 0;
        struct timespec t0;
        const size_t base = heap_now();
        heap_max = base;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        if (writer_blob(s, &r, writers[i], &blob, &len) != 0)
            status = log_fail(SHARDOPT_ERR_OUT_OF_MEMORY, "ckpt_sim_save: writer %d's records",
                              writers[i]);
        heap_probe();
        if (status == SHARDOPT_OK)
            status = ckpt_writer_index_write(r.rt, tmp, blob, len, &wbytes[i]);
        const double secs = seconds_since(&t0);
        free(blob);
        out->writer_heap = heap_max - base > out->writer_heap ? heap_max - base : out->writer_heap;
        out->writer_bytes = wbytes[i] > out->writer_bytes ? wbytes[i] : out->writer_bytes;
        out->writer_seconds = secs > out->writer_seconds ? secs : out->writer_seconds;
        out->writer_records =
            (int64_t)(len / sizeof(struct ckpt_shard_record)) > out->writer_records
                ? (int64_t)(len / sizeof(struct ckpt_shard_record))
                : out->writer_records;
    }
    /* every other writer's two files, empty: rank 0 finds each and checks its size */
    for (int d = 0; d < s->world && status == SHARDOPT_OK; d++) {
        snprintf(name, sizeof name, CKPT_RANK_FILE_FMT, d);
        int fail = file_touch(tfd, name) != 0;
        snprintf(name, sizeof name, CKPT_WRITER_INDEX_FMT, d);
        if (d != writers[0] && d != writers[1] && d != writers[2])
            fail = fail || file_touch(tfd, name) != 0;
        if (fail)
            status =
                log_fail(SHARDOPT_ERR_IO, "ckpt_sim_save: %s/%s: %s", tmp, name, strerror(errno));
    }
    if (status == SHARDOPT_OK) {
        /* rank 0, from the gather of the files' sizes to latest: what the save does there */
        struct timespec t0;
        const size_t base = heap_now();
        heap_max = base;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        sizes = mem_calloc((size_t)s->world * 2, sizeof(int64_t));
        heap_probe();
        if (sizes == NULL)
            status = SHARDOPT_ERR_OUT_OF_MEMORY;
        for (int i = 0; i < 3 && sizes != NULL; i++)
            sizes[2 * writers[i] + 1] = wbytes[i];
        r.rt->groups.me.d = r.rt->groups.me.rank = 0;
        if (status == SHARDOPT_OK)
            status = ckpt_save_publish(r.rt, dfd, scratch, tmpname, "step-00000010", sizes);
        free(sizes);
        out->rank0_seconds = seconds_since(&t0);
        out->rank0_heap = heap_max - base;
        struct stat st;
        snprintf(tmp, sizeof tmp, "%s/step-00000010/index.json", scratch);
        out->index_bytes = stat(tmp, &st) == 0 ? (int64_t)st.st_size : 0;
    }
done:
    ckpt_index_test_probe = NULL;
    if (tfd >= 0)
        close(tfd);
    if (dfd >= 0) {
        close(dfd);
        /* the scratch directory and everything in it, never through a link */
        char parent[4200];
        snprintf(parent, sizeof parent, "%s", scratch);
        char *slash = strrchr(parent, '/');
        const char *base = slash != NULL ? slash + 1 : parent;
        if (slash != NULL)
            *slash = '\0';
        const int pfd =
            open(slash != NULL ? (parent[0] ? parent : "/") : ".", O_RDONLY | O_DIRECTORY);
        if (pfd >= 0) {
            ckpt_dir_tree_remove(pfd, base);
            close(pfd);
        }
    }
    sim_rt_free(&r);
    return status;
}

/* shardopt_save: one safetensors file per rank of replica 0 and an index, written under a
 * temporary directory, fsynced, renamed to DIR/step-NNNNNNNN; then DIR/latest is replaced
 * atomically; then old steps are pruned. A failure or a crash anywhere leaves the previous
 * checkpoint and DIR/latest as they were. */
/* sync_file_range(2) is Linux's */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "comm_wait.h"
#include "config_keys.h"
#include "crc32c.h"
#include "fault.h"
#include "json_util.h"
#include "log.h"
#include "mem.h"
#include "safetensors.h"
#include "status.h"

/* NULL when out of memory: never an array with elements missing. */
static cJSON *json_i64_array(const int64_t *v, int n)
{
    cJSON *a = cJSON_CreateArray();
    int ok = a != NULL;
    for (int i = 0; ok && i < n; i++)
        json_put(&ok, a, NULL, cJSON_CreateNumber((double)v[i]));
    if (!ok) {
        cJSON_Delete(a);
        return NULL;
    }
    return a;
}

/* What a writer tells rank 0 about one tensor it wrote. */
struct shard_record {
    int32_t param, kind, dtype, pad;
    int64_t lo[3], len[3];
    uint32_t crc, nblocks; /* followed by nblocks block CRCs */
};

/* Start writing back what this file holds every CKPT_CHUNK bytes, so that the device works
 * while we go on writing and checksumming, and the final fsync has little left to wait for. */
static void writeback_kick(int fd, uint64_t *written, size_t len)
{
#ifdef SYNC_FILE_RANGE_WRITE
    const uint64_t before = *written;
    *written += len;
    if (before / CKPT_CHUNK != *written / CKPT_CHUNK)
        sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE); /* best effort: fsync follows */
#else
    (void)fd;
    *written += len;
#endif
}

static int write_all(int fd, const void *buf, size_t len, const char *site)
{
    const char *p = buf;
    while (len > 0) {
        if (fault_hit(site)) {
            errno = EIO;
            return -1;
        }
        ssize_t w = write(fd, p, len < CKPT_CHUNK ? len : CKPT_CHUNK);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

/* Append a record to a growing blob. */
static int blob_add(char **blob, size_t *len, size_t *cap, const void *p, size_t n)
{
    if (*len + n > *cap) {
        size_t c = (*cap ? 2 * *cap : 4096) + n;
        char *b = mem_realloc(*blob, c);
        if (b == NULL)
            return -1;
        *blob = b;
        *cap = c;
    }
    memcpy(*blob + *len, p, n);
    *len += n;
    return 0;
}

/* Does this rank write p's state? Every element once: a replicated tensor only from dense
 * rank 0 (of replica 0, the only replica that writes). */
static int ckpt_writes(const shardopt_runtime_t rt, const struct shardopt_param *p)
{
    if (p->layout.local_numel == 0)
        return 0;
    return p->placement != SHARDOPT_PLACEMENT_REPLICATED || rt->groups.me.d == 0;
}

/* This rank's file: header, then each state tensor's bytes, CRCs taken as they are written. */
static shardopt_status_t rank_file_write(shardopt_runtime_t rt, const char *path, char **blob,
                                         size_t *blob_len)
{
    struct st_tensor *t = NULL;
    int n = 0, fd = -1, json_ok = 1;
    uint64_t written = 0;
    char *hdr = NULL, *meta_json = NULL;
    size_t hdr_len, cap = 0;
    shardopt_status_t status = SHARDOPT_OK;
    cJSON *meta = NULL, *mt = NULL;
    void *copy = NULL; /* device state: its host copy */
    char err[256] = "", nb[64];
    const int rank = rt->groups.me.rank;
    const size_t t_bytes = (size_t)(2 * rt->nparams + 1) * sizeof(*t);

    mem_failed_clear();
    const unsigned char *state = state_store_host_view(
        &rt->store, &rt->kctx, state_store_ptr(&rt->store, 0), &copy, err, sizeof err);
    if (state == NULL) { /* out of host memory for the copy, or the device failed */
        status = log_fail(mem_failed_bytes() > 0 ? SHARDOPT_ERR_OUT_OF_MEMORY : SHARDOPT_ERR_DEVICE,
                          "save: rank %d: %s: %s", rank, path, err);
        goto out;
    }
    t = mem_calloc((size_t)(2 * rt->nparams + 1), sizeof(*t));
    if (t == NULL) {
        status = log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                          "save: rank %d: %s: out of memory allocating %zu bytes for the tensor "
                          "table",
                          rank, path, t_bytes);
        goto out;
    }
    mem_failed_clear();
    meta = cJSON_CreateObject();
    mt = json_put(&json_ok, meta, "tensors", cJSON_CreateObject());
    json_put(&json_ok, meta, "format_version", cJSON_CreateNumber(CKPT_FORMAT_VERSION));
    json_put(&json_ok, meta, "rank", cJSON_CreateNumber(rank));
    for (int i = 0; i < rt->nparams; i++) {
        const struct shardopt_param *p = rt->params[i];
        struct ckpt_kind k[2];
        int nk = ckpt_kinds(rt, p, k);
        if (!ckpt_writes(rt, p))
            continue;
        for (int j = 0; j < nk; j++) {
            struct st_tensor *s = &t[n++];
            ckpt_tensor_name(p, k[j].suffix, s->name, sizeof s->name);
            s->dtype = k[j].dtype;
            s->ndim = p->layout.ndim;
            for (int d = 0; d < p->layout.ndim; d++)
                s->shape[d] = p->layout.len[d];
            cJSON *e = json_put(&json_ok, mt, s->name, cJSON_CreateObject());
            json_put(&json_ok, e, "global_shape", json_i64_array(p->layout.shape, p->layout.ndim));
            json_put(&json_ok, e, "offset", json_i64_array(p->layout.lo, p->layout.ndim));
        }
    }
    meta_json = json_ok ? cJSON_PrintUnformatted(meta) : NULL;
    struct st_meta sm = {.key = "shardopt", .value = meta_json};
    if (meta_json == NULL) {
        status = log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                          "save: rank %d: %s: out of memory allocating %s for the header metadata",
                          rank, path, json_oom_bytes(nb, sizeof nb));
        goto out;
    }
    mem_failed_clear();
    status = st_header_build(t, n, &sm, 1, &hdr, &hdr_len);
    if (status == SHARDOPT_ERR_OUT_OF_MEMORY) {
        status =
            log_fail(status, "save: rank %d: %s: out of memory allocating %zu bytes for the header",
                     rank, path, mem_failed_bytes());
        goto out;
    }
    if (status != SHARDOPT_OK) {
        status = log_fail(status, "save: %s: building the header failed", path);
        goto out;
    }
    fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    if (fd < 0 || write_all(fd, hdr, hdr_len, "ckpt.write") != 0) {
        status = log_fail(SHARDOPT_ERR_IO, "save: %s: %s", path, strerror(errno));
        goto out;
    }
    n = 0;
    for (int i = 0; i < rt->nparams && status == SHARDOPT_OK; i++) {
        const struct shardopt_param *p = rt->params[i];
        struct ckpt_kind k[2];
        int nk = ckpt_kinds(rt, p, k);
        if (!ckpt_writes(rt, p))
            continue;
        for (int j = 0; j < nk; j++, n++) {
            const unsigned char *data = state + k[j].offset;
            const size_t bytes = (size_t)p->layout.local_numel * kdtype_size(k[j].dtype);
            const uint32_t nblocks = (uint32_t)((bytes + CKPT_BLOCK - 1) / CKPT_BLOCK);
            struct shard_record r = {
                .param = i, .kind = j, .dtype = k[j].dtype, .nblocks = nblocks};
            memcpy(r.lo, p->layout.lo, sizeof r.lo);
            memcpy(r.len, p->layout.len, sizeof r.len);
            for (int d = p->layout.ndim; d < 3; d++)
                r.lo[d] = 0, r.len[d] = 1;
            size_t rec_at = *blob_len;
            if (blob_add(blob, blob_len, &cap, &r, sizeof r) != 0) {
                status = log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                                  "save: rank %d: out of memory allocating %zu bytes for the index "
                                  "records",
                                  rank, mem_failed_bytes());
                break;
            }
            /* write a block, then CRC it while it is still in cache; the tensor's CRC follows
             * from the blocks' */
            uint32_t whole = 0;
            for (uint32_t b = 0; b < nblocks && status == SHARDOPT_OK; b++) {
                const size_t lo = (size_t)b * CKPT_BLOCK;
                const size_t len = bytes - lo < CKPT_BLOCK ? bytes - lo : CKPT_BLOCK;
                if (write_all(fd, data + lo, len, "ckpt.write") != 0) {
                    status = log_fail(SHARDOPT_ERR_IO, "save: %s: tensor '%s': %s", path, t[n].name,
                                      strerror(errno));
                    break;
                }
                writeback_kick(fd, &written, len);
                uint32_t c = crc32c_update(0, data + lo, len);
                whole = crc32c_combine(whole, c, len);
                if (blob_add(blob, blob_len, &cap, &c, sizeof c) != 0)
                    status = log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                                      "save: rank %d: out of memory allocating %zu bytes for the "
                                      "index records",
                                      rank, mem_failed_bytes());
            }
            if (status != SHARDOPT_OK)
                break;
            memcpy(*blob + rec_at + offsetof(struct shard_record, crc), &whole, sizeof whole);
        }
    }
    if (status == SHARDOPT_OK && (fault_hit("ckpt.fsync") || fsync(fd) != 0))
        status = log_fail(SHARDOPT_ERR_IO, "save: %s: fsync: %s", path,
                          errno ? strerror(errno) : "injected fault");
out:
    if (fd >= 0 && close(fd) != 0 && status == SHARDOPT_OK)
        status = log_fail(SHARDOPT_ERR_IO, "save: %s: close: %s", path, strerror(errno));
    free(hdr);
    free(meta_json);
    cJSON_Delete(meta);
    free(t);
    free(copy);
    return status;
}

/* Rank 0: the index from every writer's records. NULL when out of memory: an index with
 * entries missing is never written. */
static cJSON *index_build(shardopt_runtime_t rt, const char *all, const int *lens, int writers)
{
    cJSON *root = cJSON_CreateObject();
    cJSON **by = mem_calloc((size_t)(2 * rt->nparams + 1), sizeof(cJSON *));
    char text[1024];
    const struct groups *g = &rt->groups;
    int ok = root != NULL && by != NULL;

    json_put(&ok, root, "format", cJSON_CreateString("shardopt-checkpoint"));
    json_put(&ok, root, "format_version", cJSON_CreateNumber(CKPT_FORMAT_VERSION));
    json_put(&ok, root, "step", cJSON_CreateNumber((double)rt->counters.steps));
    cJSON *lay = json_put(&ok, root, "layout", cJSON_CreateObject());
    json_put(&ok, lay, "ranks", cJSON_CreateNumber(g->mesh.world));
    json_put(&ok, lay, "dp_replicate", cJSON_CreateNumber(g->mesh.dp_replicate));
    json_put(&ok, lay, "dp_shard", cJSON_CreateNumber(g->mesh.dp_shard));
    json_put(&ok, lay, "cp", cJSON_CreateNumber(g->mesh.cp));
    json_put(&ok, lay, "ep", cJSON_CreateNumber(g->mesh.ep));
    json_put(&ok, lay, "block_bytes", cJSON_CreateNumber((double)CKPT_BLOCK));
    cJSON *cfg = json_put(&ok, root, "config", cJSON_CreateObject());
    for (size_t i = 0; ok && i < config_key_count; i++) {
        config_key_format(&config_keys[i], &rt->cfg, text, sizeof text);
        json_put(&ok, cfg, config_keys[i].name, cJSON_CreateString(text));
    }
    cJSON *params = json_put(&ok, root, "params", cJSON_CreateArray());
    cJSON *tensors = json_put(&ok, root, "tensors", cJSON_CreateArray());
    for (int i = 0; ok && i < rt->nparams; i++) {
        const struct shardopt_param *p = rt->params[i];
        struct ckpt_kind k[2];
        int nk = ckpt_kinds(rt, p, k);
        cJSON *e = json_put(&ok, params, NULL, cJSON_CreateObject());
        json_put(&ok, e, "name", cJSON_CreateString(p->name));
        json_put(&ok, e, "algo",
                 cJSON_CreateString(p->algo == SHARDOPT_ALGO_MUON ? "muon" : "adamw"));
        json_put(&ok, e, "shape", json_i64_array(p->layout.shape, p->layout.ndim));
        json_put(&ok, e, "step", cJSON_CreateNumber((double)p->step));
        for (int j = 0; j < nk; j++) {
            cJSON *te = json_put(&ok, tensors, NULL, cJSON_CreateObject());
            ckpt_tensor_name(p, k[j].suffix, text, sizeof text);
            json_put(&ok, te, "name", cJSON_CreateString(text));
            json_put(&ok, te, "param", cJSON_CreateString(p->name));
            json_put(&ok, te, "dtype", cJSON_CreateString(ckpt_dtype_name(k[j].dtype)));
            json_put(&ok, te, "shape", json_i64_array(p->layout.shape, p->layout.ndim));
            by[2 * i + j] = json_put(&ok, te, "shards", cJSON_CreateArray());
        }
    }
    /* writers' records, in rank order */
    size_t at = 0;
    for (int w = 0; ok && w < writers; w++) {
        const size_t end = at + (size_t)lens[w];
        snprintf(text, sizeof text, "rank-%05d.safetensors", w);
        while (ok && at < end) {
            struct shard_record r;
            memcpy(&r, all + at, sizeof r);
            at += sizeof r;
            const int ndim = rt->params[r.param]->layout.ndim;
            cJSON *s = json_put(&ok, by[2 * r.param + r.kind], NULL, cJSON_CreateObject());
            json_put(&ok, s, "file", cJSON_CreateString(text));
            json_put(&ok, s, "offset", json_i64_array(r.lo, ndim));
            json_put(&ok, s, "shape", json_i64_array(r.len, ndim));
            json_put(&ok, s, "crc32c", cJSON_CreateNumber(r.crc));
            cJSON *blocks = json_put(&ok, s, "block_crc32c", cJSON_CreateArray());
            for (uint32_t b = 0; ok && b < r.nblocks; b++) {
                uint32_t c;
                memcpy(&c, all + at, sizeof c);
                at += sizeof c;
                json_put(&ok, blocks, NULL, cJSON_CreateNumber(c));
            }
        }
    }
    free(by);
    if (!ok) {
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

static int name_is_step(const char *s)
{
    if (strncmp(s, "step-", 5) != 0 || strlen(s) != 13)
        return 0;
    for (int i = 5; i < 13; i++)
        if (s[i] < '0' || s[i] > '9')
            return 0;
    return 1;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void rmtree(const char *path)
{
    DIR *d = opendir(path);
    struct dirent *e;
    char p[4096];
    if (d == NULL)
        return;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
            snprintf(p, sizeof p, "%s/%s", path, e->d_name);
            unlink(p);
        }
    closedir(d);
    rmdir(path);
}

/* Does DIR/latest name step_name? */
static int latest_names(const char *dir, const char *step_name)
{
    char path[4200], line[64] = "";
    snprintf(path, sizeof path, "%s/latest", dir);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return 0;
    if (fgets(line, sizeof line, f) == NULL)
        line[0] = '\0';
    fclose(f);
    line[strcspn(line, "\n")] = '\0';
    return strcmp(line, step_name) == 0;
}

/* Temporary directories of saves that crashed: never published, never read. */
static void leftovers_clear(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[4200];
    if (d == NULL)
        return;
    while ((e = readdir(d)) != NULL)
        if (strncmp(e->d_name, ".tmp-step-", 10) == 0) {
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            rmtree(p);
        }
    closedir(d);
}

/* Keep keep_last step directories: the one just published (which latest names) and the
 * highest-numbered others; only ever after latest moved. The new step is kept whatever its
 * number: a run that went back to an earlier step saves below the ones already there. A failure
 * here leaves extra checkpoints behind: worth a warning, not a failed save. */
static void steps_prune(const char *dir, int keep_last, const char *published)
{
    DIR *d;
    struct dirent *e;
    char **names = NULL;
    int n = 0, cap = 0, oom = 0;

    if (keep_last <= 0 || (d = opendir(dir)) == NULL)
        return;
    while ((e = readdir(d)) != NULL)
        if (name_is_step(e->d_name) && strcmp(e->d_name, published) != 0) {
            if (n == cap) {
                char **nn = mem_realloc(names, sizeof(char *) * (size_t)(cap ? 2 * cap : 16));
                if (nn == NULL) {
                    oom = 1;
                    break;
                }
                names = nn;
                cap = cap ? 2 * cap : 16;
            }
            if ((names[n] = mem_strdup(e->d_name)) == NULL) {
                oom = 1;
                break;
            }
            n++;
        }
    /* out of memory: the steps not listed stay; pruning among those listed still never removes
     * one of the keep_last highest, which all rank above the ones it removes */
    if (oom)
        log_warn("save: pruning %s: out of memory allocating %zu bytes for the list of steps; "
                 "some older steps are left in place",
                 dir, mem_failed_bytes());
    closedir(d);
    if (n > 0)
        qsort(names, (size_t)n, sizeof(char *), by_name);
    for (int i = 0; i < n - (keep_last - 1); i++) {
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        if (fault_hit("ckpt.prune"))
            log_warn("save: pruning %s: injected fault; left in place", p);
        else
            rmtree(p);
    }
    for (int i = 0; i < n; i++)
        free(names[i]);
    free(names);
    ckpt_fsync_dir(dir);
}

/* Rank 0: index, rename, latest. */
static shardopt_status_t publish(shardopt_runtime_t rt, const char *dir, const char *tmp,
                                 const char *step_name, cJSON *index)
{
    char path[4200], final[4200], latest[4200], latest_tmp[4200];
    char nb[64];
    int fd;

    mem_failed_clear();
    char *text = cJSON_PrintUnformatted(index);
    if (text == NULL)
        return log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                        "save: rank 0: out of memory allocating %s for the index text",
                        json_oom_bytes(nb, sizeof nb));
    /* one shard record per state tensor and dense rank: a checkpoint no load would read is not
     * published (ERR_CORRUPT at load, after the previous checkpoint was pruned) */
    const size_t text_len = strlen(text);
    if (text_len > CKPT_INDEX_MAX) {
        free(text);
        return log_fail(SHARDOPT_ERR_UNSUPPORTED,
                        "save: rank 0: index.json would be %zu bytes, more than a load reads "
                        "(%zu): one record per state tensor and dense rank (%d ranks); nothing "
                        "was published",
                        text_len, CKPT_INDEX_MAX, rt->groups.mesh.dense);
    }
    snprintf(path, sizeof path, "%s/index.json", tmp);
    fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    int ok = fd >= 0 && !fault_hit("ckpt.index") &&
             write_all(fd, text, text_len, "ckpt.index") == 0 && fsync(fd) == 0;
    if (fd >= 0)
        ok = close(fd) == 0 && ok;
    /* its integrity record: a load checks every byte of the index against it (docs/checkpoint.md)
     */
    char crc_line[16];
    snprintf(crc_line, sizeof crc_line, "%08x\n", crc32c_update(0, text, text_len));
    free(text);
    if (ok) {
        snprintf(path, sizeof path, "%s/" CKPT_INDEX_CRC_NAME, tmp);
        fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
        ok = fd >= 0 && write_all(fd, crc_line, strlen(crc_line), "ckpt.index") == 0 &&
             fsync(fd) == 0;
        if (fd >= 0)
            ok = close(fd) == 0 && ok;
    }
    if (!ok)
        return log_fail(SHARDOPT_ERR_IO, "save: %s: %s", path, errno ? strerror(errno) : "failed");
    snprintf(final, sizeof final, "%s/%s", dir, step_name);
    if (ckpt_fsync_dir(tmp) != 0 || fault_hit("ckpt.rename") || rename(tmp, final) != 0 ||
        ckpt_fsync_dir(dir) != 0)
        return log_fail(SHARDOPT_ERR_IO, "save: publishing %s as %s: %s", tmp, final,
                        errno ? strerror(errno) : "injected fault");
    snprintf(latest, sizeof latest, "%s/latest", dir);
    snprintf(latest_tmp, sizeof latest_tmp, "%s/.latest.tmp", dir);
    fd = open(latest_tmp, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    char line[64];
    snprintf(line, sizeof line, "%s\n", step_name);
    ok = fd >= 0 && !fault_hit("ckpt.latest") &&
         write_all(fd, line, strlen(line), "ckpt.latest") == 0 && fsync(fd) == 0;
    if (fd >= 0)
        ok = close(fd) == 0 && ok;
    if (!ok || rename(latest_tmp, latest) != 0 || ckpt_fsync_dir(dir) != 0)
        return log_fail(SHARDOPT_ERR_IO,
                        "save: %s: %s (the new step directory %s is complete "
                        "but latest still names the previous one)",
                        latest, errno ? strerror(errno) : "injected fault", final);
    steps_prune(dir, rt->cfg.keep_last, step_name);
    return SHARDOPT_OK;
}

shardopt_status_t shardopt_save(shardopt_runtime_t rt, const char *dir)
{
    shardopt_status_t status = SHARDOPT_OK;
    char step_name[32], tmp[3200], path[4096];
    char *blob = NULL, *all = NULL;
    size_t blob_len = 0;
    int *lens = NULL, *displs = NULL;
    const struct groups *g;

    if (rt == NULL || dir == NULL)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "save: NULL %s",
                        rt == NULL ? "runtime" : "dir");
    if (!rt->committed)
        return log_fail(SHARDOPT_ERR_STATE, "save: runtime not committed");
    if (strlen(dir) > 3000)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "save: directory path longer than 3000");
    comm_phase("save", -1);
    status = rt_device_enter_all(rt, "save"); /* its copies from init's device */
    if (status != SHARDOPT_OK)
        return status;
    g = &rt->groups;
    snprintf(step_name, sizeof step_name, "step-%08llu", (unsigned long long)rt->counters.steps);

    /* rank 0 makes the directories and names the temporary one */
    int nonce = (int)getpid();
    if (g->me.rank == 0) {
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, step_name);
        if (mkdir(dir, 0755) != 0 && errno != EEXIST)
            status = log_fail(SHARDOPT_ERR_IO, "save: %s: %s", dir, strerror(errno));
        else
            leftovers_clear(dir);
        if (status == SHARDOPT_OK && stat(path, &st) == 0 && latest_names(dir, step_name))
            status = log_fail(SHARDOPT_ERR_IO,
                              "save: %s is the latest checkpoint (step %llu): saving the same "
                              "step again would replace it; save elsewhere",
                              path, (unsigned long long)rt->counters.steps);
        else if (status == SHARDOPT_OK && stat(path, &st) == 0)
            rmtree(path); /* a crashed save's complete but never published step */
        if (status == SHARDOPT_OK) {
            snprintf(tmp, sizeof tmp, "%s/.tmp-%s-%d", dir, step_name, nonce);
            if (mkdir(tmp, 0755) != 0)
                status = log_fail(SHARDOPT_ERR_IO, "save: %s: %s", tmp, strerror(errno));
        }
    }
    groups_bcast(g, &nonce, 1, MPI_INT);
    snprintf(tmp, sizeof tmp, "%s/.tmp-%s-%d", dir, step_name, nonce);
    status = ckpt_agree(rt, status, "save");
    if (status != SHARDOPT_OK)
        return status;

    /* replica 0 writes; the other replicas hold the same state */
    if (g->me.rep == 0) {
        snprintf(path, sizeof path, "%s/rank-%05d.safetensors", tmp, g->me.d);
        status = rank_file_write(rt, path, &blob, &blob_len);
    }
    status = ckpt_agree(rt, status, "save");
    const int written = status == SHARDOPT_OK; /* the same on every rank */
    if (status == SHARDOPT_OK && g->me.rep == 0) {
        int len = (int)blob_len, ok = 1;
        const size_t count_bytes = sizeof(int) * (size_t)g->mesh.dense;
        char nb[64];
        /* dense rank 0 gathers; the others learn whether it could make room before sending */
        if (g->me.d == 0) {
            lens = mem_malloc(count_bytes);
            displs = lens != NULL ? mem_malloc(count_bytes) : NULL;
            ok = lens != NULL && displs != NULL;
            if (!ok)
                status = log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                                  "save: rank %d: out of memory allocating %zu bytes for the "
                                  "index record counts",
                                  g->me.rank, count_bytes);
        }
        comm_bcast(g, g->dense, &ok, 1, MPI_INT, 0, "broadcast");
        if (ok) {
            comm_gather(g, g->dense, &len, 1, MPI_INT, lens, 0, "gather of index record sizes");
            size_t total = 0;
            if (g->me.d == 0) {
                for (int i = 0; i < g->mesh.dense; i++) {
                    displs[i] = total <= (size_t)INT_MAX ? (int)total : -1;
                    total += (size_t)lens[i];
                }
                /* the gather's displacements are ints: past 2^31 bytes of records they would
                 * wrap and the gather would write outside the buffer */
                if (total > (size_t)INT_MAX) {
                    ok = 0;
                    status = log_fail(SHARDOPT_ERR_UNSUPPORTED,
                                      "save: rank %d: the index records of %d ranks total %zu "
                                      "bytes, more than one MPI gather takes (2^31 - 1); nothing "
                                      "was published",
                                      g->me.rank, g->mesh.dense, total);
                } else {
                    all = mem_malloc(total + 1);
                    ok = all != NULL;
                    if (!ok)
                        status = log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                                          "save: rank %d: out of memory allocating %zu bytes for "
                                          "the index records",
                                          g->me.rank, total + 1);
                }
            }
            comm_bcast(g, g->dense, &ok, 1, MPI_INT, 0, "broadcast");
        }
        if (ok)
            comm_gatherv(g, g->dense, blob, len, MPI_BYTE, all, lens, displs, 0,
                         "gather of index records");
        if (ok && g->me.rank == 0) {
            mem_failed_clear();
            cJSON *index = index_build(rt, all, lens, g->mesh.dense);
            status = index == NULL ? log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                                              "save: rank 0: out of memory allocating %s for the "
                                              "index",
                                              json_oom_bytes(nb, sizeof nb))
                                   : publish(rt, dir, tmp, step_name, index);
            cJSON_Delete(index);
        }
    }
    if (written) /* else agreed already: a second round would nest the message in itself */
        status = ckpt_agree(rt, status, "save");
    if (status != SHARDOPT_OK && g->me.rank == 0)
        rmtree(tmp); /* the previous checkpoint and latest are untouched */
    else if (status == SHARDOPT_OK && g->me.rank == 0)
        log_info("save: %s/%s", dir, step_name);
    free(blob);
    free(all);
    free(lens);
    free(displs);
    return status;
}

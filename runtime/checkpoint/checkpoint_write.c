/* A writer's two files in the temporary directory of shardopt_save (checkpoint_save.c orders the
 * save and publishes it): its rank file (a safetensors header, then each tensor's bytes, CRCs taken
 * as they are written) and its index (rank-NNNNN.index.json, format_version 4: the shard records
 * the rank file's writing collected), each with its integrity record. */
/* sync_file_range(2) is Linux's */
#define _GNU_SOURCE
#include "runtime/checkpoint/checkpoint_write.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/crc32c.h"
#include "base/fault.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/status.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/checkpoint_index.h"
#include "runtime/checkpoint/safetensors.h"
#include "runtime/config/json_util.h"

/* NULL when out of memory: never an array with elements missing. */
cJSON *ckpt_json_i64_array(const int64_t *v, int n)
{
    cJSON *a = cJSON_CreateArray();
    int ok = a != NULL;
    for (int i = 0; ok && i < n; i++)
        json_put(&ok, a, NULL, json_uint((uint64_t)v[i]));
    if (!ok) {
        cJSON_Delete(a);
        return NULL;
    }
    return a;
}

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

int ckpt_blob_add(char **blob, size_t *len, size_t *cap, const void *p, size_t n)
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

/* ckpt_weights: where each parameter this rank writes is, as host memory (w[i]; NULL for one it
 * does not write): its registered data, or, when the parameters are device memory, a host copy
 * of them all made here in *copy (checked as the state's copy is). */
static shardopt_status_t weights_host_view(shardopt_runtime_t rt, const char *path,
                                           const unsigned char **w, void **copy)
{
    size_t total = 0;
    for (int i = 0; i < rt->nparams; i++)
        if (ckpt_writes(rt, rt->params[i]))
            total +=
                (size_t)rt->params[i]->layout.local_numel *
                kdtype_size(rt->params[i]->param_dtype == SHARDOPT_DTYPE_BF16 ? KDT_BF16 : KDT_F32);
    if (rt_on_device(rt) && (*copy = mem_malloc(total + 1)) == NULL)
        return log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                        "save: rank %d: %s: out of memory allocating %zu bytes for a host copy of "
                        "the parameters (ckpt_weights)",
                        rt->groups.me.rank, path, total + 1);
    size_t at = 0;
    for (int i = 0; i < rt->nparams; i++) {
        const struct shardopt_param *p = rt->params[i];
        if (!ckpt_writes(rt, p))
            continue;
        const size_t bytes =
            (size_t)p->layout.local_numel *
            kdtype_size(p->param_dtype == SHARDOPT_DTYPE_BF16 ? KDT_BF16 : KDT_F32);
        if (*copy == NULL) {
            w[i] = p->data;
            continue;
        }
        w[i] = (const unsigned char *)*copy + at;
        rt->dev->copy(&rt->kctx, (unsigned char *)*copy + at, p->data, bytes);
        at += bytes;
    }
    /* host parameters: the step's last writes to them may still be in flight on a device */
    if ((*copy != NULL && fault_hit("copy")) || rt->dev->sync(&rt->kctx) != 0)
        return log_fail(SHARDOPT_ERR_DEVICE,
                        "save: rank %d: %s: copying %zu bytes of parameters from the device "
                        "failed (%s)",
                        rt->groups.me.rank, path, total, rt->ops->name);
    return SHARDOPT_OK;
}

/* This rank's file: header, then each tensor's bytes (state, then with ckpt_weights the
 * parameter), CRCs taken as they are written. */
shardopt_status_t ckpt_rank_file_write(shardopt_runtime_t rt, const char *path, char **blob,
                                       size_t *blob_len, int64_t *file_bytes)
{
    struct st_tensor *t = NULL;
    int n = 0, fd = -1, json_ok = 1;
    uint64_t written = 0;
    char *hdr = NULL, *meta_json = NULL;
    size_t hdr_len, cap = 0;
    shardopt_status_t status = SHARDOPT_OK;
    cJSON *meta = NULL, *mt = NULL;
    void *copy = NULL;              /* device state: its host copy */
    void *wcopy = NULL;             /* device parameters: their host copy (ckpt_weights) */
    const unsigned char **w = NULL; /* each parameter's bytes (ckpt_weights) */
    char nb[64];
    const int rank = rt->groups.me.rank, weights = rt->cfg.ckpt_weights;
    const size_t t_bytes = (size_t)(3 * rt->nparams + 1) * sizeof(*t);

    const unsigned char *state = NULL;
    /* out of host memory for the copy, or the device failed: the store says which */
    status =
        state_store_host_view(&rt->store, &rt->kctx, state_store_ptr(&rt->store, 0), &state, &copy);
    if (status != SHARDOPT_OK) {
        status = log_fail_context(status, "save: rank %d: %s", rank, path);
        goto out;
    }
    t = mem_calloc((size_t)(3 * rt->nparams + 1), sizeof(*t));
    w = t != NULL ? mem_calloc((size_t)rt->nparams + 1, sizeof(*w)) : NULL;
    if (t == NULL || w == NULL) {
        status = log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                          "save: rank %d: %s: out of memory allocating %zu bytes for the tensor "
                          "table",
                          rank, path, t == NULL ? t_bytes : ((size_t)rt->nparams + 1) * sizeof(*w));
        goto out;
    }
    if (weights && (status = weights_host_view(rt, path, w, &wcopy)) != SHARDOPT_OK)
        goto out;
    mem_failed_clear();
    meta = cJSON_CreateObject();
    mt = json_put(&json_ok, meta, "tensors", cJSON_CreateObject());
    json_put(&json_ok, meta, "format_version", json_uint((uint64_t)CKPT_FORMAT_VERSION));
    json_put(&json_ok, meta, "rank", json_uint((uint64_t)rank));
    for (int i = 0; i < rt->nparams; i++) {
        const struct shardopt_param *p = rt->params[i];
        struct ckpt_kind k[3];
        int nk = ckpt_tensors(rt, p, weights, k);
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
            json_put(&json_ok, e, "global_shape",
                     ckpt_json_i64_array(p->layout.shape, p->layout.ndim));
            json_put(&json_ok, e, "offset", ckpt_json_i64_array(p->layout.lo, p->layout.ndim));
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
    fd = ckpt_file_create(AT_FDCWD, path);
    if (fd < 0 || ckpt_write_all(fd, hdr, hdr_len, "ckpt.write") != 0) {
        const int err = errno;
        /* rank 0 made the temporary directory under its own dir: not there under this rank's
         * (ranks given different dirs, or a dir not on a filesystem they share) */
        status = log_fail(SHARDOPT_ERR_IO, "save: %s: %s%s%s", path, strerror(err),
                          fd < 0 ? ckpt_file_create_note(err) : "",
                          fd < 0 && err == ENOENT && rank != 0
                              ? " (rank 0 made this temporary directory under its dir: every "
                                "writing rank's dir must name that directory, on a filesystem "
                                "they share)"
                              : "");
        goto out;
    }
    *file_bytes = (int64_t)hdr_len;
    n = 0;
    for (int i = 0; i < rt->nparams && status == SHARDOPT_OK; i++) {
        const struct shardopt_param *p = rt->params[i];
        struct ckpt_kind k[3];
        int nk = ckpt_tensors(rt, p, weights, k);
        if (!ckpt_writes(rt, p))
            continue;
        for (int j = 0; j < nk; j++, n++) {
            const unsigned char *data = k[j].suffix != NULL ? state + k[j].offset : w[i];
            const size_t bytes = (size_t)p->layout.local_numel * kdtype_size(k[j].dtype);
            const uint32_t nblocks = (uint32_t)((bytes + CKPT_BLOCK - 1) / CKPT_BLOCK);
            struct ckpt_shard_record r = {
                .param = i, .kind = j, .dtype = k[j].dtype, .nblocks = nblocks};
            memcpy(r.lo, p->layout.lo, sizeof r.lo);
            memcpy(r.len, p->layout.len, sizeof r.len);
            for (int d = p->layout.ndim; d < 3; d++)
                r.lo[d] = 0, r.len[d] = 1;
            size_t rec_at = *blob_len;
            if (ckpt_blob_add(blob, blob_len, &cap, &r, sizeof r) != 0) {
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
                if (ckpt_write_all(fd, data + lo, len, "ckpt.write") != 0) {
                    status = log_fail(SHARDOPT_ERR_IO, "save: %s: tensor '%s': %s", path, t[n].name,
                                      strerror(errno));
                    break;
                }
                writeback_kick(fd, &written, len);
                *file_bytes += (int64_t)len;
                uint32_t c = crc32c_update(0, data + lo, len);
                whole = crc32c_combine(whole, c, len);
                if (ckpt_blob_add(blob, blob_len, &cap, &c, sizeof c) != 0)
                    status = log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                                      "save: rank %d: out of memory allocating %zu bytes for the "
                                      "index records",
                                      rank, mem_failed_bytes());
            }
            if (status != SHARDOPT_OK)
                break;
            memcpy(*blob + rec_at + offsetof(struct ckpt_shard_record, crc), &whole, sizeof whole);
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
    free(w);
    free(copy);
    free(wcopy);
    return status;
}

/* Write `text` as dir/name (tfd open on dir) and its integrity record name.crc32c ("%08x\n", the
 * CRC-32C of its bytes), each fsynced: 0, or -1 with errno set and *failed naming the file. */
int ckpt_text_file_put(int tfd, const char *name, const char *text, size_t len, const char **failed,
                       char *crc_name, size_t crc_len)
{
    char crc_line[16];
    snprintf(crc_name, crc_len, "%s.crc32c", name);
    *failed = name;
    int fd = ckpt_file_create(tfd, name);
    int ok = fd >= 0 && !fault_hit("ckpt.index") &&
             ckpt_write_all(fd, text, len, "ckpt.index") == 0 && fsync(fd) == 0;
    if (fd >= 0)
        ok = close(fd) == 0 && ok;
    if (!ok)
        return -1;
    /* its integrity record: a load checks every byte of the index against it */
    snprintf(crc_line, sizeof crc_line, "%08x\n", crc32c_update(0, text, len));
    *failed = crc_name;
    fd = ckpt_file_create(tfd, crc_name);
    ok = fd >= 0 && ckpt_write_all(fd, crc_line, strlen(crc_line), "ckpt.index") == 0 &&
         fsync(fd) == 0;
    if (fd >= 0)
        ok = close(fd) == 0 && ok;
    return ok ? 0 : -1;
}

/* Each writer: its shard records (blob, from ckpt_rank_file_write) as tmp/rank-NNNNN.index.json
 * with its integrity record (format_version 4): what a load reads of this writer, and only the
 * loads whose parts overlap it. Nothing of them travels to rank 0. *bytes: the file's size. */
shardopt_status_t ckpt_writer_index_write(shardopt_runtime_t rt, const char *tmp, const char *blob,
                                          size_t blob_len, int64_t *bytes)
{
    const struct groups *g = &rt->groups;
    char name[64], crc_name[96], file[64], tname[1100], nb[64];
    int ok = 1;
    snprintf(name, sizeof name, CKPT_WRITER_INDEX_FMT, g->me.d);
    snprintf(file, sizeof file, CKPT_RANK_FILE_FMT, g->me.d);
    mem_failed_clear();
    cJSON *root = cJSON_CreateObject();
    ok = root != NULL;
    json_put(&ok, root, "format", cJSON_CreateString("shardopt-checkpoint-shards"));
    json_put(&ok, root, "format_version", json_uint((uint64_t)CKPT_FORMAT_VERSION));
    json_put(&ok, root, "step", json_uint((uint64_t)rt->counters.steps));
    json_put(&ok, root, "writer", json_uint((uint64_t)g->me.d));
    json_put(&ok, root, "file", cJSON_CreateString(file));
    cJSON *shards = json_put(&ok, root, "shards", cJSON_CreateArray());
    for (size_t at = 0; ok && at < blob_len;) {
        struct ckpt_shard_record r;
        memcpy(&r, blob + at, sizeof r);
        at += sizeof r;
        const struct shardopt_param *p = rt->params[r.param];
        struct ckpt_kind k[3];
        ckpt_tensors(rt, p, rt->cfg.ckpt_weights, k);
        ckpt_tensor_name(p, k[r.kind].suffix, tname, sizeof tname);
        cJSON *e = json_put(&ok, shards, NULL, cJSON_CreateObject());
        json_put(&ok, e, "tensor", cJSON_CreateString(tname));
        json_put(&ok, e, "offset", ckpt_json_i64_array(r.lo, p->layout.ndim));
        json_put(&ok, e, "shape", ckpt_json_i64_array(r.len, p->layout.ndim));
        json_put(&ok, e, "crc32c", json_uint((uint64_t)r.crc));
        cJSON *blocks = json_put(&ok, e, "block_crc32c", cJSON_CreateArray());
        for (uint32_t b = 0; ok && b < r.nblocks; b++) {
            uint32_t c;
            memcpy(&c, blob + at, sizeof c);
            at += sizeof c;
            json_put(&ok, blocks, NULL, json_uint((uint64_t)c));
        }
    }
    char *text = ok ? cJSON_PrintUnformatted(root) : NULL;
    if (ckpt_index_test_probe != NULL)
        ckpt_index_test_probe(); /* the tree and its text: this writer's most */
    cJSON_Delete(root);
    if (text == NULL)
        return log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                        "save: rank %d: out of memory allocating %s for %s", g->me.rank,
                        json_oom_bytes(nb, sizeof nb), name);
    const size_t len = strlen(text);
    shardopt_status_t status = SHARDOPT_OK;
    const char *failed = name;
    int tfd = open(tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (len > CKPT_INDEX_MAX)
        status = log_fail(SHARDOPT_ERR_UNSUPPORTED,
                          "save: rank %d: %s would be %zu bytes, more than a load reads (%zu); "
                          "nothing was published",
                          g->me.rank, name, len, CKPT_INDEX_MAX);
    else if (tfd < 0 ||
             ckpt_text_file_put(tfd, name, text, len, &failed, crc_name, sizeof crc_name) != 0)
        status = log_fail(SHARDOPT_ERR_IO, "save: %s/%s: %s%s", tmp, failed,
                          errno ? strerror(errno) : "failed", ckpt_file_create_note(errno));
    if (tfd >= 0)
        close(tfd);
    free(text);
    *bytes = (int64_t)len;
    return status;
}

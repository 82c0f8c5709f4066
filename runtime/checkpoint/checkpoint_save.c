/* shardopt_save: one safetensors file per rank of replica 0 and an index, written under a
 * temporary directory, fsynced, renamed to DIR/step-NNNNNNNN; then DIR/latest is replaced
 * atomically; then old steps are pruned. A failure or a crash anywhere leaves the previous
 * checkpoint and DIR/latest as they were. Each writer's files: checkpoint_write.c. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
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
#include "runtime/checkpoint/checkpoint_dir.h"
#include "runtime/checkpoint/checkpoint_index.h"
#include "runtime/checkpoint/checkpoint_write.h"
#include "runtime/checkpoint/safetensors.h"
#include "runtime/comm/comm_wait.h"
#include "runtime/config/config_keys.h"
#include "runtime/config/json_util.h"

/* Rank 0: index.json, the global facts alone: O(parameters), whatever the world (the shard
 * records are in the writers' indexes). NULL when out of memory: an index with entries missing
 * is never written. */
static cJSON *index_build(shardopt_runtime_t rt)
{
    cJSON *root = cJSON_CreateObject();
    char text[CONFIG_TEXT_MAX];
    const struct groups *g = &rt->groups;
    int ok = root != NULL;

    json_put(&ok, root, "format", cJSON_CreateString("shardopt-checkpoint"));
    const int weights = rt->cfg.ckpt_weights;
    json_put(&ok, root, "format_version", json_uint((uint64_t)CKPT_FORMAT_VERSION));
    /* with weights, one more tensor named as each parameter */
    json_put(&ok, root, "weights", cJSON_CreateBool(weights));
    json_put(&ok, root, "step", json_uint((uint64_t)rt->counters.steps));
    cJSON *lay = json_put(&ok, root, "layout", cJSON_CreateObject());
    json_put(&ok, lay, "ranks", json_uint((uint64_t)g->mesh.world));
    json_put(&ok, lay, "dp_replicate", json_uint((uint64_t)g->mesh.dp_replicate));
    json_put(&ok, lay, "dp_shard", json_uint((uint64_t)g->mesh.dp_shard));
    json_put(&ok, lay, "cp", json_uint((uint64_t)g->mesh.cp));
    json_put(&ok, lay, "ep", json_uint((uint64_t)g->mesh.ep));
    json_put(&ok, lay, "block_bytes", json_uint((uint64_t)CKPT_BLOCK));
    json_put(&ok, root, "writers", json_uint((uint64_t)g->mesh.dense));
    cJSON *cfg = json_put(&ok, root, "config", cJSON_CreateObject());
    for (size_t i = 0; ok && i < config_key_count; i++) {
        config_key_format(&config_keys[i], &rt->cfg, text, sizeof text);
        json_put(&ok, cfg, config_keys[i].name, cJSON_CreateString(text));
    }
    cJSON *params = json_put(&ok, root, "params", cJSON_CreateArray());
    cJSON *tensors = json_put(&ok, root, "tensors", cJSON_CreateArray());
    for (int i = 0; ok && i < rt->nparams; i++) {
        const struct shardopt_param *p = rt->params[i];
        struct ckpt_kind k[3];
        int nk = ckpt_tensors(rt, p, weights, k);
        cJSON *e = json_put(&ok, params, NULL, cJSON_CreateObject());
        json_put(&ok, e, "name", cJSON_CreateString(p->name));
        json_put(&ok, e, "algo",
                 cJSON_CreateString(p->algo == SHARDOPT_ALGO_MUON ? "muon" : "adamw"));
        json_put(&ok, e, "shape", ckpt_json_i64_array(p->layout.shape, p->layout.ndim));
        json_put(&ok, e, "step", json_uint((uint64_t)p->step));
        for (int j = 0; j < nk; j++) {
            cJSON *te = json_put(&ok, tensors, NULL, cJSON_CreateObject());
            ckpt_tensor_name(p, k[j].suffix, text, sizeof text);
            json_put(&ok, te, "name", cJSON_CreateString(text));
            json_put(&ok, te, "param", cJSON_CreateString(p->name));
            json_put(&ok, te, "dtype", cJSON_CreateString(ckpt_dtype_name(k[j].dtype)));
            json_put(&ok, te, "shape", ckpt_json_i64_array(p->layout.shape, p->layout.ndim));
        }
    }
    if (!ok) {
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

/* For tests: called on rank 0 with the temporary directory's path just before publish checks
 * the rank files in it. */
void (*ckpt_test_before_publish)(const char *tmp_path);

/* Every dense rank's files (its rank file and its index) are in the temporary directory, plain
 * files of the sizes their writer wrote: a file removed or cut short after its writer closed it
 * is never published. sizes: two per dense rank. */
static shardopt_status_t rank_files_check(int tfd, const char *tmp, const int64_t *sizes, int n)
{
    for (int r = 0; r < n; r++)
        for (int f = 0; f < 2; f++) {
            char name[64];
            struct stat st;
            const int64_t want = sizes[2 * r + f];
            snprintf(name, sizeof name, f == 0 ? CKPT_RANK_FILE_FMT : CKPT_WRITER_INDEX_FMT, r);
            if (fstatat(tfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0)
                return log_fail(SHARDOPT_ERR_IO,
                                "save: %s/%s: %s before publishing (dense rank %d wrote %lld "
                                "bytes there); nothing was published",
                                tmp, name, strerror(errno), r, (long long)want);
            if (!S_ISREG(st.st_mode) || st.st_size != want)
                return log_fail(SHARDOPT_ERR_IO,
                                "save: %s/%s: %s%lld bytes before publishing, dense rank %d wrote "
                                "%lld; nothing was published",
                                tmp, name, S_ISREG(st.st_mode) ? "" : "not a plain file, ",
                                (long long)st.st_size, r, (long long)want);
        }
    return SHARDOPT_OK;
}

/* Rank 0: check the rank files, index, rename, latest. */
static shardopt_status_t publish(shardopt_runtime_t rt, int dfd, const char *dir,
                                 const char *tmpname, const char *step_name, cJSON *index,
                                 const int64_t *sizes)
{
    char tmp[4200], final[4200];
    char nb[64];
    shardopt_status_t status;

    snprintf(tmp, sizeof tmp, "%s/%s", dir, tmpname);
    snprintf(final, sizeof final, "%s/%s", dir, step_name);
    if (ckpt_test_before_publish != NULL)
        ckpt_test_before_publish(tmp);
    int tfd = openat(dfd, tmpname, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (tfd < 0)
        return log_fail(SHARDOPT_ERR_IO, "save: %s: %s before publishing; nothing was published",
                        tmp, strerror(errno));
    status = rank_files_check(tfd, tmp, sizes, rt->groups.mesh.dense);
    if (status != SHARDOPT_OK) {
        close(tfd);
        return status;
    }
    mem_failed_clear();
    char *text = cJSON_PrintUnformatted(index);
    if (text == NULL) {
        close(tfd);
        return log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                        "save: rank 0: out of memory allocating %s for the index text",
                        json_oom_bytes(nb, sizeof nb));
    }
    if (ckpt_index_test_probe != NULL)
        ckpt_index_test_probe(); /* the tree and its text: rank 0's most */
    /* a checkpoint no load would read is not published (ERR_CORRUPT at load, after the previous
     * checkpoint was pruned) */
    const size_t text_len = strlen(text);
    if (text_len > CKPT_INDEX_MAX) {
        free(text);
        close(tfd);
        return log_fail(SHARDOPT_ERR_UNSUPPORTED,
                        "save: rank 0: index.json would be %zu bytes, more than a load reads "
                        "(%zu); nothing was published",
                        text_len, CKPT_INDEX_MAX);
    }
    const char *failed_file = "index.json";
    char crc_name[96];
    int ok = ckpt_text_file_put(tfd, "index.json", text, text_len, &failed_file, crc_name,
                                sizeof crc_name) == 0;
    free(text);
    if (!ok) {
        close(tfd);
        return log_fail(SHARDOPT_ERR_IO, "save: %s/%s: %s%s", tmp, failed_file,
                        errno ? strerror(errno) : "failed", ckpt_file_create_note(errno));
    }
    ok = fsync(tfd) == 0;
    close(tfd);
    if (!ok || fault_hit("ckpt.rename") || renameat(dfd, tmpname, dfd, step_name) != 0 ||
        fsync(dfd) != 0)
        return log_fail(SHARDOPT_ERR_IO, "save: publishing %s as %s: %s", tmp, final,
                        errno ? strerror(errno) : "injected fault");
    status = ckpt_dir_latest_replace(dfd, dir, step_name, final);
    if (status == SHARDOPT_OK)
        ckpt_dir_steps_prune(dfd, dir, rt->cfg.keep_last, step_name);
    return status;
}

/* ckpt_weights: a parameter named as another's state tensor ("x.momentum" beside a Muon "x")
 * would give two tensors one name, which every load refuses: refused before anything is written
 * (the same on every rank: the registrations agreed at commit). Only names ending in a state
 * kind are looked up. */
static shardopt_status_t weight_names_check(const shardopt_runtime_t rt, const char *dir)
{
    static const char *const kinds[3] = {"momentum", "exp_avg", "exp_avg_sq"};
    for (int i = 0; i < rt->nparams; i++) {
        const char *name = rt->params[i]->name;
        const size_t n = strlen(name);
        for (int s = 0; s < 3; s++) {
            const size_t ks = strlen(kinds[s]);
            if (n <= ks + 1 || name[n - ks - 1] != '.' || strcmp(name + n - ks, kinds[s]) != 0)
                continue;
            for (int o = 0; o < rt->nparams; o++) {
                const struct shardopt_param *q = rt->params[o];
                struct ckpt_kind k[2];
                const int nk = ckpt_kinds(rt, q, k);
                for (int j = 0; j < nk; j++)
                    if (strlen(q->name) == n - ks - 1 && strncmp(q->name, name, n - ks - 1) == 0 &&
                        strcmp(k[j].suffix, kinds[s]) == 0)
                        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                                        "save: %s: ckpt_weights: parameter '%s' has the name of "
                                        "parameter '%s''s %s state tensor: the checkpoint would "
                                        "hold two tensors of one name (rename one, or save with "
                                        "ckpt_weights = false)",
                                        dir, name, q->name, kinds[s]);
            }
        }
    }
    return SHARDOPT_OK;
}

shardopt_status_t ckpt_save_publish(shardopt_runtime_t rt, int dfd, const char *dir,
                                    const char *tmpname, const char *step_name,
                                    const int64_t *sizes)
{
    char nb[64];
    mem_failed_clear();
    cJSON *index = index_build(rt);
    const shardopt_status_t status =
        index == NULL ? log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                                 "save: rank 0: out of memory allocating %s for the index",
                                 json_oom_bytes(nb, sizeof nb))
                      : publish(rt, dfd, dir, tmpname, step_name, index, sizes);
    cJSON_Delete(index);
    return status;
}

/* Temporary names a save tries before it gives up (see ckpt_save_run). */
#define CKPT_TMP_NAMES 64

shardopt_status_t ckpt_save_run(shardopt_runtime_t rt, const char *dir)
{
    shardopt_status_t status = SHARDOPT_OK;
    char step_name[32], tmp[3200], tmpname[64], path[4096];
    char *blob = NULL;
    size_t blob_len = 0;
    int64_t *sizes = NULL, file_bytes = 0;
    int dfd = -1, lock_fd = -1, tmp_made = 0;
    const struct groups *g;

    if (rt == NULL)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "save: NULL runtime");
    comm_phase("save", -1);
    /* a refusal of this rank alone joins the opening agreement: the others would wait in it */
    status =
        rt_open_call(rt, "save",
                     dir == NULL      ? log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "save: NULL dir")
                     : !rt->committed ? log_fail(SHARDOPT_ERR_STATE, "save: runtime not committed")
                                      : SHARDOPT_OK); /* its copies from init's device */
    if (status != SHARDOPT_OK)
        return status;
    /* Each rank writes into its own dir, so each checks it; the refusal joins the agreement
     * below, which every rank reaches: a rank that returned here alone left the others in the
     * save's collectives while it went on to its next call (mismatched MPI messages, a hang) */
    status = ckpt_dir_check("", dir);
    if (status == SHARDOPT_OK && rt->cfg.ckpt_weights)
        status = weight_names_check(rt, dir);
    g = &rt->groups;
    snprintf(step_name, sizeof step_name, "step-%08llu", (unsigned long long)rt->counters.steps);

    /* Rank 0 makes the directories, takes the directory's lock (one writer per directory) and
     * names the temporary one. DIR is followed if it is a link (the caller named it); everything
     * inside is reached relative to it, never through a link. */
    int nonce = (int)getpid();
    if (g->me.rank == 0 && status == SHARDOPT_OK) {
        snprintf(tmpname, sizeof tmpname, ".tmp-%s-%d", step_name, nonce);
        if (mkdir(dir, 0755) != 0 && errno != EEXIST)
            status = log_fail(SHARDOPT_ERR_IO, "save: %s: %s", dir, strerror(errno));
        else if ((dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
            status = log_fail(SHARDOPT_ERR_IO, "save: %s: %s", dir, strerror(errno));
        else
            status = ckpt_dir_lock_take(dfd, dir, &lock_fd);
        if (status == SHARDOPT_OK)
            status = ckpt_dir_not_a_step(dfd, dir);
        if (status == SHARDOPT_OK) {
            if (lock_fd >= 0)
                ckpt_dir_leftovers_clear(dfd, dir);
            status = ckpt_dir_stale_step_clear(dfd, dir, step_name,
                                               (unsigned long long)rt->counters.steps);
        }
        /* The name may be taken: a crashed save of this step by a process of the same pid
         * (containers reuse pids), without flock to clear it, or what the clearing leaves in
         * place (a link, a FIFO, a file, a tree deeper than it enters). None of it is removed,
         * entered or opened: the save takes the next name of this process, pid + k * 2^22
         * (pid_max is at most 2^22, so no other process's), up to 64 of them. */
        for (int k = 1; status == SHARDOPT_OK && !tmp_made; k++) {
            const int err = mkdirat(dfd, tmpname, 0755) == 0 ? 0 : errno;
            if (err == 0)
                tmp_made = 1;
            else if (err != EEXIST || k == CKPT_TMP_NAMES)
                status = log_fail(SHARDOPT_ERR_IO, "save: %s/%s: %s%s", dir, tmpname, strerror(err),
                                  err == EEXIST ? " (as are the 63 other temporary names of this "
                                                  "process: remove the .tmp-step-* entries)"
                                                : "");
            else {
                nonce = (int)getpid() + k * (1 << 22);
                snprintf(tmpname, sizeof tmpname, ".tmp-%s-%d", step_name, nonce);
            }
        }
    }
    groups_bcast(g, &nonce, 1, MPI_INT);
    snprintf(tmp, sizeof tmp, "%s/.tmp-%s-%d", dir, step_name, nonce);
    status = ckpt_agree(rt, status, "save");
    if (status != SHARDOPT_OK)
        goto out;

    /* replica 0 writes: its rank file, then its own shard records beside it; the other replicas
     * hold the same state */
    int64_t mine[2] = {0, 0}; /* the sizes of this writer's two files */
    if (g->me.rep == 0) {
        snprintf(path, sizeof path, "%s/" CKPT_RANK_FILE_FMT, tmp, g->me.d);
        status = ckpt_rank_file_write(rt, path, &blob, &blob_len, &file_bytes);
        mine[0] = file_bytes;
        if (status == SHARDOPT_OK)
            status = ckpt_writer_index_write(rt, tmp, blob, blob_len, &mine[1]);
    }
    status = ckpt_agree(rt, status, "save");
    const int written = status == SHARDOPT_OK; /* the same on every rank */
    if (status == SHARDOPT_OK && g->me.rep == 0) {
        int ok = 1;
        const size_t size_bytes = 2 * sizeof(int64_t) * (size_t)g->mesh.dense;
        /* dense rank 0 gathers the files' sizes (16 bytes a writer, no records); the others
         * learn whether it could make room before sending */
        if (g->me.d == 0) {
            sizes = mem_malloc(size_bytes);
            ok = sizes != NULL;
            if (!ok)
                status = log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                                  "save: rank %d: out of memory allocating %zu bytes for the rank "
                                  "file sizes",
                                  g->me.rank, size_bytes);
        }
        comm_bcast(g, g->dense, &ok, 1, MPI_INT, 0, "broadcast");
        if (ok)
            comm_gather(g, g->dense, mine, 2, MPI_INT64_T, sizes, 0, "gather of rank file sizes");
        if (ok && g->me.rank == 0)
            status = ckpt_save_publish(rt, dfd, dir, tmpname, step_name, sizes);
    }
    if (written) /* else agreed already: a second round would nest the message in itself */
        status = ckpt_agree(rt, status, "save");
out:
    if (g->me.rank == 0) {
        if (status != SHARDOPT_OK && tmp_made)
            ckpt_dir_tree_remove(dfd,
                                 tmpname); /* the previous checkpoint and latest are untouched */
        else if (status == SHARDOPT_OK)
            log_info("save: %s/%s", dir, step_name);
        ckpt_dir_lock_release(lock_fd);
        if (dfd >= 0)
            close(dfd);
    }
    free(blob);
    free(sizes);
    return status;
}

/* A checkpoint's index.json, as shardopt_load reads it (checkpoint_load.c does the rest): rank 0
 * finds the step directory (DIR itself, or the one DIR/latest names) and checks the index's
 * integrity record, index.json.crc32c; every rank then parses the same text and checks all of it
 * strictly (the top level, the params records, each tensor and shard, that the shards tile their
 * tensors) before a byte of any shard is read. A shard record's checks and the tiling check, which
 * the writers' indexes share, are checkpoint_records.c; version 4's writers' indexes and the order
 * a load reads them in, checkpoint_writer_index.c. */
#include "runtime/checkpoint/checkpoint_index.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/crc32c.h"
#include "base/file_read.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/status.h"
#include "runtime/checkpoint/checkpoint_dir.h"
#include "runtime/config/json_strict.h"

static shardopt_status_t index_bad(const char *dir, const char *what, const char *tensor)
{
    return ckpt_index_bad_in(dir, "index.json", what, tensor);
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
    if (!ckpt_json_uint(ver, CK_INT_MAX, &version))
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
    if (!ckpt_json_uint(step, CK_INT_MAX, &L->step))
        return index_bad(L->dir, "\"step\" is not an integer in [0, 9e15]", NULL);
    if (!cJSON_IsObject(lay))
        return index_bad(L->dir, "\"layout\" is not an object", NULL);
    for (int k = 0; k < 6; k++)
        if (!ckpt_json_uint(cJSON_GetObjectItemCaseSensitive(lay, lay_keys[k]), 2147483647.0,
                            &v[k]) ||
            v[k] == 0) {
            char what[128];
            snprintf(what, sizeof what, "\"layout\": \"%s\" is not an integer in [1, 2^31)",
                     lay_keys[k]);
            return index_bad(L->dir, what, NULL);
        }
    /* ranks = dp_replicate x dp_shard x cp, and ep divides a replica's dp_shard x cp */
    if (v[0] != v[1] * v[2] * v[3] || (v[2] * v[3]) % v[4] != 0) {
        char what[300];
        snprintf(what, sizeof what,
                 "\"layout\": ranks %llu is not dp_replicate x dp_shard x cp (%llu x %llu x %llu), "
                 "or ep does not divide dp_shard x cp (ep %llu)",
                 (unsigned long long)v[0], (unsigned long long)v[1], (unsigned long long)v[2],
                 (unsigned long long)v[3], (unsigned long long)v[4]);
        return index_bad(L->dir, what, NULL);
    }
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
    if (writers != NULL && (!ckpt_json_uint(writers, 2147483647.0, &nw) || nw != v[0] / v[1])) {
        char what[300], shown[40];
        if (cJSON_IsNumber(writers))
            snprintf(shown, sizeof shown, "%.17g", writers->valuedouble);
        else
            snprintf(shown, sizeof shown, "not a number");
        snprintf(what, sizeof what,
                 "\"writers\" is %s, not the layout's dense ranks (ranks %llu / dp_replicate "
                 "%llu = %llu)",
                 shown, (unsigned long long)v[0], (unsigned long long)v[1],
                 (unsigned long long)(v[0] / v[1]));
        return index_bad(L->dir, what, NULL);
    }
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
        if (ckpt_json_i64s(cJSON_GetObjectItemCaseSensitive(e, "shape"), p->shape, 3, &p->ndim) !=
                0 ||
            p->ndim < 1) {
            snprintf(what, sizeof what, "parameter '%.100s': shape is not 1-3 integers", p->name);
            return index_bad(L->dir, what, NULL);
        }
        /* the update reads it (AdamW's bias correction): -1, 2.5 or 1e300 became NaN there. The
         * bound is shardopt_param_set_step's, not the checkpoint's step: a run resumed through
         * set_step (a state dict) counts past its runtime's steps, and every load refused the
         * checkpoints it saved */
        if (!ckpt_json_uint(step, (double)(CKPT_STEP_LIMIT - 1), &p->step)) {
            snprintf(what, sizeof what,
                     "parameter '%.100s': \"step\" is not an integer in [0, 2^53) (the step "
                     "counts shardopt_param_set_step takes)",
                     p->name);
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
    if (t->dtype < 0) {
        char what[160], dv[100];
        if (cJSON_IsString(dt))
            log_escape(dv, sizeof dv, dt->valuestring, strlen(dt->valuestring));
        snprintf(what, sizeof what, "dtype %s%s%s is not F32 or BF16",
                 cJSON_IsString(dt) ? "'" : "", cJSON_IsString(dt) ? dv : "(not a string)",
                 cJSON_IsString(dt) ? "'" : "");
        return index_bad(L->dir, what, t->name);
    }
    if (ckpt_json_i64s(cJSON_GetObjectItemCaseSensitive(e, "shape"), t->shape, 3, &t->ndim) != 0 ||
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
    if (!t->is_weight && !tensor_names_param(t, p)) {
        /* the parameter's algorithm and the names it gives: an algo edited, or a tensor renamed */
        char what[700], pn[260];
        log_escape(pn, sizeof pn, p->name, strlen(p->name));
        snprintf(what, sizeof what,
                 "the name is %sits parameter's name and a state kind of its algorithm "
                 "(parameter '%s' is %s: its state is %s)",
                 L->weights ? "neither its parameter's name (its weight) nor " : "not ", pn,
                 p->algo == SHARDOPT_ALGO_MUON ? "muon" : "adamw",
                 p->algo == SHARDOPT_ALGO_MUON ? "'<name>.momentum'"
                                               : "'<name>.exp_avg' and '<name>.exp_avg_sq'");
        return index_bad(L->dir, what, t->name);
    }
    if (p->ndim != t->ndim || memcmp(p->shape, t->shape, sizeof(int64_t) * (size_t)t->ndim) != 0) {
        char what[200], ts[80], ps[80];
        int64_t t3[3] = {1, 1, 1}, p3[3] = {1, 1, 1}; /* ckpt_shape_text reads the last ndim */
        memcpy(t3 + 3 - t->ndim, t->shape, sizeof(int64_t) * (size_t)t->ndim);
        memcpy(p3 + 3 - p->ndim, p->shape, sizeof(int64_t) * (size_t)p->ndim);
        snprintf(what, sizeof what, "shape %s differs from its parameter's %s",
                 ckpt_shape_text(ts, sizeof ts, t3, t->ndim),
                 ckpt_shape_text(ps, sizeof ps, p3, p->ndim));
        return index_bad(L->dir, what, t->name);
    }
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
            ckpt_shard_parse(L->dir, "index.json", t, t->shape, s, 1, &t->shards[j++]);
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
    const size_t cbytes = sizeof(struct ck_corner) * 8 * ((size_t)most + 1);
    struct ck_corner *corners = mem_malloc(cbytes);
    if (corners == NULL)
        return log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                        "load: %s/index.json: out of memory allocating %zu bytes to check that "
                        "the shards tile their tensors",
                        L->dir, cbytes);
    for (int k = 0; k < L->nt && L->version < CKPT_FORMAT_WRITERS_FIRST; k++)
        if (!ckpt_shards_tile(&L->t[k], corners)) {
            free(corners);
            return index_bad(L->dir, ckpt_tiling_problem(&L->t[k]), L->t[k].name);
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
    char path[4400], *rec = NULL;
    size_t n = 0;
    struct file_read_error e;
    snprintf(path, sizeof path, "%s/" CKPT_INDEX_CRC_NAME, stepdir);
    *verified = 0;
    /* 16 bytes: more is refused as not the record's form, below */
    if (file_read_text(path, 16, &rec, &n, &e) != 0) {
        if (e.fault == FILE_READ_OPEN && e.err == ENOENT)
            return SHARDOPT_OK;
        if (e.fault != FILE_READ_SIZE)
            return ckpt_file_refused("load", path, &e);
    }
    int ok = rec != NULL && n == 9 && rec[8] == '\n';
    for (int i = 0; ok && i < 8; i++)
        ok = (rec[i] >= '0' && rec[i] <= '9') || (rec[i] >= 'a' && rec[i] <= 'f');
    if (!ok) {
        free(rec);
        return log_fail(SHARDOPT_ERR_CORRUPT,
                        "load: %s: not 8 lowercase hex digits and a newline (the CRC-32C of "
                        "index.json): the record is damaged",
                        path);
    }
    rec[8] = '\0';
    const uint32_t want = (uint32_t)strtoul(rec, NULL, 16), have = crc32c_update(0, text, len);
    free(rec);
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

    snprintf(path, sizeof path, "%s/index.json", dir);
    if (stat(path, &st) == 0) {
        /* a save writes latest only beside step directories, never in one: both here is a
         * step's files copied into the checkpoint directory (or a save into a step
         * directory), and taking index.json loaded that stale step, not the one latest names */
        snprintf(path, sizeof path, "%s/latest", dir);
        if (lstat(path, &st) == 0)
            return log_fail(SHARDOPT_ERR_CORRUPT,
                            "load: %s holds both index.json (as a step directory does) and latest "
                            "(as a checkpoint directory does): which checkpoint to load is not "
                            "clear, so neither is loaded; load the step directory latest names "
                            "by its path, or remove the stray files",
                            dir);
        snprintf(stepdir, len, "%s", dir);
    } else {
        snprintf(path, sizeof path, "%s/latest", dir);
        const shardopt_status_t status = ckpt_dir_latest_read(dir, path, name, sizeof name);
        if (status != SHARDOPT_OK)
            return status;
        snprintf(stepdir, len, "%s/%s", dir, name);
    }
    snprintf(path, sizeof path, "%s/index.json", stepdir);
    struct file_read_error e;
    if (file_read_text(path, CKPT_INDEX_MAX, text, text_len, &e) != 0)
        return ckpt_file_refused("load", path, &e);
    /* a NUL inside is the parser's to refuse, not an end */
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

shardopt_status_t ckpt_index_check(const char *text, size_t len)
{
    struct ck_index L;
    memset(&L, 0, sizeof L);
    snprintf(L.dir, sizeof L.dir, "(index text)");
    shardopt_status_t status = ckpt_index_parse(&L, text, len, 1, 1);
    ckpt_index_free(&L);
    return status;
}

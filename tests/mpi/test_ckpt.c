/* Checkpoints. Modes (SHARDOPT_TEST_MODE), driven by tests/mpi/ckpt_driver.sh across separate
 * mpiexec runs, i.e. fresh processes:
 *   save    5 steps on SHARDOPT_TEST_LAYOUT, save to SHARDOPT_TEST_DIR
 *   crash   8 steps, then save: SHARDOPT_FAULT kills the processes inside the save
 *   resume  load SHARDOPT_TEST_DIR on this layout with the parameters of step 5, run steps 6-10,
 *           compare the state just after the load and everything after step 10 bitwise with
 *           10 uninterrupted steps on one rank (computed here on rank 0)
 * Without a mode: in-process tests of every refusal (state unchanged, error on every rank), an
 * injected save failure, keep_last, and bf16 momentum staying bf16 across save and load.
 * SHARDOPT_TEST_DTYPE: fp32 (default), bf16 (nearest) or bf16sr (stochastic).
 * SHARDOPT_TEST_WEIGHTS=1: ckpt_weights, the parameters saved and loaded by the library too (resume
 * then starts from parameters that are not step 5's: the load alone must restore them).
 *
 * One file, over 600 lines: every mode is one program that ckpt_driver.sh runs again in fresh
 * processes, so a save, the crash in it and the load that checks it share the same model, steps
 * and comparison; in separate files the modes could drift apart and still pass. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/crc32c.h"
#include "base/fault.h"
#include "model_run.h"
#include "runtime/checkpoint/checkpoint.h"
#include "stderr_capture.h"

static const char *test_dir(void)
{
    const char *d = getenv("SHARDOPT_TEST_DIR");
    if (d == NULL) { /* the modes run under ckpt_driver.sh, which names the directory */
        fprintf(stderr, "SHARDOPT_TEST_MODE needs SHARDOPT_TEST_DIR\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    return d;
}

/* The in-process tests' directories and files: under one directory rank 0 makes with mkdtemp for
 * this run (every rank gets its name) and removes at the end, so concurrent runs (checkouts, ctest
 * -j) never share a path. Fixed /tmp names collided across checkouts. */
static char scratch_base[64];

static void scratch_begin(void)
{
    if (me == 0) {
        strcpy(scratch_base, "/tmp/shardopt_ckpt_XXXXXX");
        if (mkdtemp(scratch_base) == NULL) {
            perror("mkdtemp");
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    MPI_Bcast(scratch_base, sizeof scratch_base, MPI_CHAR, 0, MPI_COMM_WORLD);
}

static void scratch_end(void)
{
    MPI_Barrier(MPI_COMM_WORLD);
    if (me == 0) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", scratch_base);
        if (system(cmd) != 0)
            fprintf(stderr, "cannot remove %s\n", scratch_base);
    }
}

/* scratch_base/name; a ring of buffers: a test holds a few of these at once */
static const char *scratch(const char *name)
{
    static char ring[16][160];
    static int next;
    char *p = ring[next++ % 16];
    snprintf(p, sizeof ring[0], "%s/%s", scratch_base, name);
    return p;
}

static shardopt_config_t test_config(void)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    const char *dt = getenv("SHARDOPT_TEST_DTYPE");
    const char *w = getenv("SHARDOPT_TEST_WEIGHTS");
    cfg.num_threads = 1;
    cfg.ckpt_weights = w != NULL && strcmp(w, "1") == 0;
    if (dt != NULL && strncmp(dt, "bf16", 4) == 0) {
        cfg.momentum_dtype = SHARDOPT_DTYPE_BF16;
        cfg.adam_state_dtype = SHARDOPT_DTYPE_BF16;
        if (strcmp(dt, "bf16sr") == 0) {
            cfg.momentum_rounding = SHARDOPT_ROUNDING_STOCHASTIC;
            cfg.param_rounding = SHARDOPT_ROUNDING_STOCHASTIC;
        }
    }
    return cfg;
}

/* Every rank's copy of the single-rank reference: parameters at step 5, and everything
 * (parameters and states) after steps 5 and 10, as global tensors. */
struct reference {
    unsigned char *w5[MODEL_NPARAMS], *at5[MODEL_NPARAMS][3], *at10[MODEL_NPARAMS][3];
    size_t bytes[MODEL_NPARAMS][3];
};

static void snapshot_global(const struct run *r, unsigned char *(*out)[3], size_t (*bytes)[3])
{
    for (int p = 0; p < MODEL_NPARAMS; p++)
        for (int k = 0; k < 3; k++) {
            size_t es;
            const void *src = kind_data(r, p, k, &es);
            const struct tparam *t = &model_params[p];
            bytes[p][k] = src ? (size_t)(t->shape[0] * t->shape[1] * t->shape[2]) * es : 0;
            out[p][k] = malloc(bytes[p][k] + 1);
            if (src != NULL)
                memcpy(out[p][k], src, bytes[p][k]);
        }
}

/* A committed checkpoint with parameters (SHARDOPT_TEST_FIXTURE=1 and ckpt_weights) was written
 * by another machine, whose BLAS kernels round Newton-Schulz's products otherwise than this one's
 * (AVX-512 against AVX2 sgemm: the parameters after 5 steps differ in the last bits; layouts
 * agree bitwise on one machine, not across machines). Its parameters are then the reference's
 * too: the one-rank run loads them at step 5 and continues from them. The optimizer state (the
 * elementwise kernels, bitwise on every CPU) stays the 5 uninterrupted steps'. */
static void reference_take_fixture_params(struct run *r, struct reference *ref)
{
    unsigned char *loaded[MODEL_NPARAMS][3];
    size_t bytes[MODEL_NPARAMS][3];
    if (shardopt_load(r->rt, test_dir()) != SHARDOPT_OK) {
        fprintf(stderr, "reference: load: %s\n", shardopt_last_error());
        return; /* the parameters stay step 5's: the comparison then fails */
    }
    snapshot_global(r, loaded, bytes);
    for (int p = 0; p < MODEL_NPARAMS; p++)
        for (int k = 0; k < 3; k++) {
            if (k == 0)
                memcpy(ref->at5[p][0], loaded[p][0], bytes[p][0]);
            free(loaded[p][k]);
        }
}

static void reference_build(struct reference *ref, shardopt_config_t cfg)
{
    struct run r = {0};
    const char *fixture = getenv("SHARDOPT_TEST_FIXTURE");
    if (me == 0) {
        run_setup(&r, MPI_COMM_SELF, cfg, 0);
        run_steps(&r, 1, 5);
        snapshot_global(&r, ref->at5, ref->bytes);
        if (cfg.ckpt_weights && fixture != NULL && strcmp(fixture, "1") == 0)
            reference_take_fixture_params(&r, ref);
        run_steps(&r, 6, 10);
        snapshot_global(&r, ref->at10, ref->bytes);
        run_free(&r);
    }
    MPI_Bcast(ref->bytes, MODEL_NPARAMS * 3 * sizeof(size_t), MPI_BYTE, 0, MPI_COMM_WORLD);
    for (int p = 0; p < MODEL_NPARAMS; p++)
        for (int k = 0; k < 3; k++) {
            if (me != 0) {
                ref->at5[p][k] = malloc(ref->bytes[p][k] + 1);
                ref->at10[p][k] = malloc(ref->bytes[p][k] + 1);
            }
            MPI_Bcast(ref->at5[p][k], (int)ref->bytes[p][k], MPI_BYTE, 0, MPI_COMM_WORLD);
            MPI_Bcast(ref->at10[p][k], (int)ref->bytes[p][k], MPI_BYTE, 0, MPI_COMM_WORLD);
        }
}

static void reference_free(struct reference *ref)
{
    for (int p = 0; p < MODEL_NPARAMS; p++)
        for (int k = 0; k < 3; k++) {
            free(ref->at5[p][k]);
            free(ref->at10[p][k]);
        }
}

/* This rank's shard of a global tensor. */
static void shard_take(const struct run *r, int p, const unsigned char *global, void *dst,
                       size_t es)
{
    const struct tparam *t = &model_params[p];
    for (int64_t i = 0; i < r->box[p].numel; i++)
        memcpy((unsigned char *)dst + (size_t)i * es,
               global + (size_t)model_global(t, &r->box[p], i) * es, es);
}

/* Elements of this rank's tensors that differ from the global reference `want`. */
static long shard_diff(const struct run *r, unsigned char *(*want)[3])
{
    long bad = 0;
    for (int p = 0; p < MODEL_NPARAMS; p++)
        for (int k = 0; k < 3; k++) {
            size_t es;
            const unsigned char *mine = kind_data(r, p, k, &es);
            if (mine == NULL)
                continue;
            for (int64_t i = 0; i < r->box[p].numel; i++)
                bad +=
                    memcmp(mine + (size_t)i * es,
                           want[p][k] + (size_t)model_global(&model_params[p], &r->box[p], i) * es,
                           es) != 0;
        }
    return bad;
}

/* A JSON array of n elements of dtype es (4: fp32, 2: bf16), as floats. */
static cJSON *values_json(const void *data, size_t es, int64_t n)
{
    cJSON *vals = cJSON_CreateArray();
    for (int64_t i = 0; i < n; i++)
        cJSON_AddItemToArray(vals,
                             cJSON_CreateNumber(es == 2 ? f32_from_bf16(((const uint16_t *)data)[i])
                                                        : ((const float *)data)[i]));
    return vals;
}

/* For the Python interop test with ckpt_weights (collective): every parameter whole, gathered
 * from the ranks' memory (not from the checkpoint), in report-weights.json on rank 0. */
static void report_weights_write(const struct run *d, const char *dir)
{
    cJSON *root = cJSON_CreateObject();
    for (int p = 0; p < MODEL_NPARAMS; p++) {
        const struct tparam *t = &model_params[p];
        const size_t es = model_esize(t->dtype);
        const int64_t numel = t->shape[0] * t->shape[1] * t->shape[2];
        unsigned char *whole = malloc((size_t)numel * es + 1);
        gather(d, p, 0, whole);
        if (me == 0) {
            cJSON *e = cJSON_AddObjectToObject(root, t->name), *shape;
            cJSON_AddStringToObject(e, "dtype", es == 2 ? "BF16" : "F32");
            shape = cJSON_AddArrayToObject(e, "shape");
            for (int dd = 0; dd < t->ndim; dd++)
                cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[dd]));
            cJSON_AddItemToObject(e, "values", values_json(whole, es, numel));
        }
        free(whole);
    }
    if (me == 0) {
        char path[4200];
        snprintf(path, sizeof path, "%s/report-weights.json", dir);
        char *text = cJSON_PrintUnformatted(root);
        FILE *f = fopen(path, "w");
        if (f != NULL) {
            fputs(text, f);
            fclose(f);
        }
        free(text);
    }
    cJSON_Delete(root);
}

/* For the Python interop test: what this rank's file should hold, as the runtime has it. */
static void report_write(const struct run *d, const char *dir)
{
    shardopt_stats_t st = SHARDOPT_STATS_INIT;
    shardopt_get_stats(d->rt, &st);
    if (st.replica != 0)
        return;
    cJSON *root = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(root, "tensors");
    for (int p = 0; p < MODEL_NPARAMS; p++) {
        const struct tparam *t = &model_params[p];
        if (d->box[p].numel == 0 ||
            (t->placement == SHARDOPT_PLACEMENT_REPLICATED && st.dense_rank != 0))
            continue;
        /* kind 0, the parameter, is in the file with ckpt_weights, named as it is */
        for (int k = d->rt->cfg.ckpt_weights ? 0 : 1; k < 3; k++) {
            size_t es;
            const void *data = kind_data(d, p, k, &es);
            if (data == NULL)
                continue;
            const char *suffix = k == 0                                ? NULL
                                 : d->h[p]->algo == SHARDOPT_ALGO_MUON ? "momentum"
                                 : k == 1                              ? "exp_avg"
                                                                       : "exp_avg_sq";
            char name[300];
            if (suffix == NULL)
                snprintf(name, sizeof name, "%s", t->name);
            else
                snprintf(name, sizeof name, "%s.%s", t->name, suffix);
            cJSON *e = cJSON_CreateObject(), *shape = cJSON_AddArrayToObject(e, "shape");
            cJSON_AddStringToObject(e, "name", name);
            cJSON_AddStringToObject(e, "dtype", es == 2 ? "BF16" : "F32");
            for (int dd = 0; dd < t->ndim; dd++)
                cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)d->box[p].len[dd]));
            cJSON_AddItemToObject(e, "values", values_json(data, es, d->box[p].numel));
            cJSON_AddItemToArray(arr, e);
        }
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/report-rank-%05d.json", dir, st.dense_rank);
    char *text = cJSON_PrintUnformatted(root);
    FILE *f = fopen(path, "w");
    if (f != NULL) {
        fputs(text, f);
        fclose(f);
    }
    free(text);
    cJSON_Delete(root);
}

static int mode_save(int steps)
{
    struct run d = {0};
    shardopt_config_t cfg = test_config();
    if (run_setup(&d, MPI_COMM_WORLD, cfg, 0) != SHARDOPT_OK ||
        run_steps(&d, 1, steps) != SHARDOPT_OK)
        return 1;
    shardopt_status_t status = shardopt_save(d.rt, test_dir());
    if (status != SHARDOPT_OK)
        fprintf(stderr, "save: %s\n", shardopt_last_error());
    if (getenv("SHARDOPT_TEST_REPORT") != NULL) {
        report_write(&d, getenv("SHARDOPT_TEST_REPORT"));
        if (cfg.ckpt_weights)
            report_weights_write(&d, getenv("SHARDOPT_TEST_REPORT"));
    }
    run_free(&d);
    return status != SHARDOPT_OK;
}

static int mode_resume(void)
{
    struct reference ref;
    struct run d = {0};
    shardopt_config_t cfg = test_config();
    long bad5, bad10;

    reference_build(&ref, cfg);
    if (run_setup(&d, MPI_COMM_WORLD, cfg, 0) != SHARDOPT_OK)
        return 1;
    /* the trainer restores its parameters and shardopt the optimizer state, or (ckpt_weights)
     * shardopt both: the parameters then hold something else until the load */
    for (int p = 0; p < MODEL_NPARAMS; p++)
        if (cfg.ckpt_weights)
            memset(d.w[p], 0x5a, (size_t)d.box[p].numel * model_esize(model_params[p].dtype));
        else
            shard_take(&d, p, ref.at5[p][0], d.w[p], model_esize(model_params[p].dtype));
    shardopt_status_t status = shardopt_load(d.rt, test_dir());
    if (status != SHARDOPT_OK) {
        fprintf(stderr, "rank %d: load: %s\n", me, shardopt_last_error());
        return 1;
    }
    bad5 = shard_diff(&d, ref.at5);
    shardopt_stats_t st = SHARDOPT_STATS_INIT;
    shardopt_get_stats(d.rt, &st);
    /* SHARDOPT_TEST_SAVE_AT=8: save again on the way (after a crash, over the orphan that
     * crashed save left); saving changes no state, so the comparison below still holds */
    const char *save_at = getenv("SHARDOPT_TEST_SAVE_AT");
    const int at = save_at != NULL ? atoi(save_at) : 0;
    if (run_steps(&d, 6, at > 5 && at < 10 ? at : 10) != SHARDOPT_OK)
        return 1;
    if (at > 5 && at < 10) {
        if (shardopt_save(d.rt, test_dir()) != SHARDOPT_OK) {
            fprintf(stderr, "rank %d: save at %d: %s\n", me, at, shardopt_last_error());
            return 1;
        }
        if (run_steps(&d, at + 1, 10) != SHARDOPT_OK)
            return 1;
    }
    bad10 = shard_diff(&d, ref.at10);
    long all[2] = {bad5, bad10};
    MPI_Allreduce(MPI_IN_PLACE, all, 2, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (me == 0)
        printf("resume: %ld elements differ right after the load, %ld after step 10 (steps %llu "
               "after load)\n",
               all[0], all[1], (unsigned long long)st.steps);
    run_free(&d);
    reference_free(&ref);
    return all[0] != 0 || all[1] != 0 || st.steps != 5;
}

/* ---- in-process tests ---- */

static void dir_clear(const char *dir)
{
    if (me == 0) {
        char cmd[4200];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd) != 0)
            fprintf(stderr, "cannot clear %s\n", dir);
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

/* Save a fresh 3-step checkpoint in dir and return the run (3 steps done). */
static void saved_run(struct run *d, const char *dir, shardopt_config_t cfg)
{
    dir_clear(dir);
    memset(d, 0, sizeof *d);
    run_setup(d, MPI_COMM_WORLD, cfg, 0);
    run_steps(d, 1, 3);
    if (shardopt_save(d->rt, dir) != SHARDOPT_OK)
        fprintf(stderr, "save: %s\n", shardopt_last_error());
}

/* Rank 0 damages a file of the latest checkpoint, then every rank loads; the load must fail on
 * every rank with `words` in the message, and leave this rank's state as it was. */
static void expect_refused(struct run *d, const char *dir, void (*damage)(const char *step),
                           shardopt_status_t want, const char *w1, const char *w2)
{
    unsigned char *before, *after;
    size_t nb, na;
    char step[4200];
    snprintf(step, sizeof step, "%s/step-00000003", dir);
    if (me == 0)
        damage(step);
    MPI_Barrier(MPI_COMM_WORLD);
    run_steps(d, 4, 4); /* the state moves on from what was saved */
    snapshot(d, &before, &nb);
    EXPECT_EQ_INT(shardopt_load(d->rt, dir), want);
    EXPECT_STR_CONTAINS(shardopt_last_error(), w1);
    if (w2 != NULL)
        EXPECT_STR_CONTAINS(shardopt_last_error(), w2);
    /* another rank's message comes with its rank once ("load: rank 0: load: ..." before) */
    EXPECT_TRUE(strstr(shardopt_last_error(), ": load: ") == NULL);
    /* what came from the files is shown escaped: a raw CR or NUL would hide part of it */
    for (const char *c = shardopt_last_error(); *c != '\0'; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f) {
            EXPECT_TRUE(!"a control character in the message");
            break;
        }
    snapshot(d, &after, &na);
    EXPECT_TRUE(na == nb && memcmp(before, after, nb) == 0);
    free(before);
    free(after);
}

static void file_patch(const char *path, long at, const void *bytes, size_t n)
{
    int fd = open(path, O_WRONLY);
    if (fd < 0 || pwrite(fd, bytes, n, at) != (ssize_t)n)
        fprintf(stderr, "patch %s failed\n", path);
    close(fd);
}

static void damage_remove_index(const char *step)
{
    char p[4300];
    snprintf(p, sizeof p, "%s/index.json", step);
    unlink(p);
}

static void damage_remove_rank1(const char *step)
{
    char p[4300];
    snprintf(p, sizeof p, "%s/rank-00001.safetensors", step);
    unlink(p);
}

static void damage_truncate(const char *step)
{
    char p[4300];
    struct stat st;
    snprintf(p, sizeof p, "%s/rank-00000.safetensors", step);
    stat(p, &st);
    if (truncate(p, st.st_size - 40) != 0)
        fprintf(stderr, "truncate failed\n");
}

static void damage_flip(const char *step)
{
    char p[4300];
    struct stat st;
    unsigned char b;
    snprintf(p, sizeof p, "%s/rank-00000.safetensors", step);
    stat(p, &st);
    int fd = open(p, O_RDWR);
    if (pread(fd, &b, 1, st.st_size - 3) == 1) {
        b ^= 0x10;
        if (pwrite(fd, &b, 1, st.st_size - 3) != 1)
            fprintf(stderr, "flip failed\n");
    }
    close(fd);
}

static void damage_header_size(const char *step)
{
    char p[4300];
    const unsigned char huge[8] = {0, 0, 0, 0, 0, 0, 1, 0}; /* 2^48 */
    snprintf(p, sizeof p, "%s/rank-00000.safetensors", step);
    file_patch(p, 0, huge, 8);
}

static char *file_slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)n + 1);
    if (fread(text, 1, (size_t)n, f) != (size_t)n)
        fprintf(stderr, "read of %s failed\n", path);
    text[n] = '\0';
    fclose(f);
    *len = (size_t)n;
    return text;
}

static void file_put(const char *path, const char *bytes, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(bytes, 1, n, f) != n)
        fprintf(stderr, "write of %s failed\n", path);
    if (f != NULL)
        fclose(f);
}

/* Write index.json as `text` (n bytes) and, when the index has its integrity record, a record
 * that matches: what is refused is then the index's content, not its CRC. */
static void ix_put(const char *step, const char *file, const char *text, size_t n)
{
    char p[4300], line[16];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", step, file);
    file_put(p, text, n);
    snprintf(p, sizeof p, "%s/%s.crc32c", step, file);
    if (stat(p, &st) == 0) {
        snprintf(line, sizeof line, "%08x\n", crc32c_update(0, text, n));
        file_put(p, line, strlen(line));
    }
}

static void index_put(const char *step, const char *text, size_t n)
{
    ix_put(step, "index.json", text, n);
}

/* Rewrite an index file (index.json, or a writer's rank-NNNNN.index.json) through a JSON edit
 * (its integrity record follows). */
static void ix_edit(const char *step, const char *file, void (*edit)(cJSON *))
{
    char p[4300];
    size_t n;
    snprintf(p, sizeof p, "%s/%s", step, file);
    char *text = file_slurp(p, &n);
    if (text == NULL)
        return;
    cJSON *root = cJSON_Parse(text);
    edit(root);
    char *out = cJSON_PrintUnformatted(root);
    ix_put(step, file, out, strlen(out));
    free(out);
    free(text);
    cJSON_Delete(root);
}

static void index_edit(const char *step, void (*edit)(cJSON *))
{
    ix_edit(step, "index.json", edit);
}

/* The same edit of every writer's index (format_version 4: the shard records). */
static void writers_edit(const char *step, void (*edit)(cJSON *))
{
    for (int w = 0; w < 16; w++) {
        char f[64];
        snprintf(f, sizeof f, "rank-%05d.index.json", w);
        ix_edit(step, f, edit);
    }
}

/* Replace the first `from` in index.json with `to` (n bytes), its integrity record following
 * when `fix_crc`, else left as it was (the damage a flipped byte does). */
static void ix_replace(const char *step, const char *file, const char *from, const char *to,
                       size_t n, int fix_crc)
{
    char p[4300];
    size_t len;
    snprintf(p, sizeof p, "%s/%s", step, file);
    char *text = file_slurp(p, &len);
    char *at = strstr(text, from);
    if (at == NULL) {
        fprintf(stderr, "ix_replace: '%s' not in %s\n", from, file);
        free(text);
        return;
    }
    const size_t head = (size_t)(at - text), tail = len - head - strlen(from);
    char *out = malloc(head + n + tail + 1);
    memcpy(out, text, head);
    memcpy(out + head, to, n);
    memcpy(out + head + n, at + strlen(from), tail);
    if (fix_crc)
        ix_put(step, file, out, head + n + tail);
    else
        file_put(p, out, head + n + tail);
    free(out);
    free(text);
}

static void index_replace(const char *step, const char *from, const char *to, size_t n, int fix_crc)
{
    ix_replace(step, "index.json", from, to, n, fix_crc);
}

/* One bit of an index file flipped at the `nth` byte of the first `where`, the record untouched. */
static void ix_flip(const char *step, const char *file, const char *where, size_t nth,
                    unsigned char bit)
{
    char p[4300];
    size_t len;
    snprintf(p, sizeof p, "%s/%s", step, file);
    char *text = file_slurp(p, &len);
    char *at = strstr(text, where);
    if (at != NULL) {
        at[nth] = (char)(at[nth] ^ bit);
        file_put(p, text, len);
    } else {
        fprintf(stderr, "ix_flip: '%s' not in %s\n", where, file);
    }
    free(text);
}

static void index_flip(const char *step, const char *where, size_t nth, unsigned char bit)
{
    ix_flip(step, "index.json", where, nth, bit);
}

/* A writer's index naming a rank file outside the step directory (format_version 4: the
 * writer's "file", the rank file of its number and nothing else) */
static void edit_file_name(cJSON *root)
{
    cJSON_ReplaceItemInObject(root, "file", cJSON_CreateString("../rank-00000.safetensors"));
}

static void damage_file_name(const char *step)
{
    ix_edit(step, "rank-00000.index.json", edit_file_name);
}

/* The checkpoint without its 5th tensor: gone from index.json and from every writer's index */
static char dropped[256];
static void edit_drop_tensor(cJSON *root)
{
    cJSON *t = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "tensors"), 4);
    snprintf(dropped, sizeof dropped, "%s", cJSON_GetObjectItem(t, "name")->valuestring);
    cJSON_DeleteItemFromArray(cJSON_GetObjectItem(root, "tensors"), 4);
}

/* a writer's shard records of the tensors `keep` says no to */
static void writer_drop(cJSON *root, int (*drop)(const char *tensor))
{
    cJSON *list = cJSON_GetObjectItem(root, "shards");
    for (int i = cJSON_GetArraySize(list) - 1; i >= 0; i--)
        if (drop(cJSON_GetObjectItem(cJSON_GetArrayItem(list, i), "tensor")->valuestring))
            cJSON_DeleteItemFromArray(list, i);
}
static int is_dropped(const char *tensor) { return strcmp(tensor, dropped) == 0; }
static void edit_writer_drop_tensor(cJSON *root) { writer_drop(root, is_dropped); }

static void damage_drop_tensor(const char *step)
{
    index_edit(step, edit_drop_tensor);
    writers_edit(step, edit_writer_drop_tensor);
}

/* A checkpoint of a model without layers.0.input_norm.weight: its params record and its tensors
 * are gone (a parameter added to the model since). */
static void edit_drop_param(cJSON *root)
{
    const char *param = "layers.0.input_norm.weight";
    cJSON *list = cJSON_GetObjectItem(root, "params");
    for (int i = cJSON_GetArraySize(list) - 1; i >= 0; i--)
        if (strcmp(cJSON_GetObjectItem(cJSON_GetArrayItem(list, i), "name")->valuestring, param) ==
            0)
            cJSON_DeleteItemFromArray(list, i);
    list = cJSON_GetObjectItem(root, "tensors");
    for (int i = cJSON_GetArraySize(list) - 1; i >= 0; i--)
        if (strcmp(cJSON_GetObjectItem(cJSON_GetArrayItem(list, i), "param")->valuestring, param) ==
            0)
            cJSON_DeleteItemFromArray(list, i);
}

static int of_dropped_param(const char *tensor)
{
    return strncmp(tensor, "layers.0.input_norm.weight.", 27) == 0;
}
static void edit_writer_drop_param(cJSON *root) { writer_drop(root, of_dropped_param); }

static void damage_drop_param(const char *step)
{
    index_edit(step, edit_drop_param);
    writers_edit(step, edit_writer_drop_param);
}

/* A checkpoint of a model whose layers.0.input_norm.weight had 25 elements, not 16: its record,
 * both its tensors and their last shards say 25 (the shards still tile each tensor). */
static void edit_shape(cJSON *root)
{
    const char *param = "layers.0.input_norm.weight";
    cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(root, "params"))
    {
        if (strcmp(cJSON_GetObjectItem(e, "name")->valuestring, param) == 0)
            cJSON_ReplaceItemInArray(cJSON_GetObjectItem(e, "shape"), 0, cJSON_CreateNumber(25));
    }
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(root, "tensors"))
    {
        if (strcmp(cJSON_GetObjectItem(e, "param")->valuestring, param) != 0)
            continue;
        cJSON_ReplaceItemInArray(cJSON_GetObjectItem(e, "shape"), 0, cJSON_CreateNumber(25));
        cJSON *shards = cJSON_GetObjectItem(e, "shards");
        if (shards == NULL) /* format_version 4: in the writers' indexes */
            continue;
        cJSON *last = cJSON_GetArrayItem(shards, cJSON_GetArraySize(shards) - 1);
        cJSON *len = cJSON_GetObjectItem(last, "shape");
        const double grown = cJSON_GetArrayItem(len, 0)->valuedouble + 9;
        cJSON_ReplaceItemInArray(len, 0, cJSON_CreateNumber(grown));
    }
}

/* ... and in the writers' indexes, the shard that ends the tensor grown by 9 */
static void edit_writer_shape(cJSON *root)
{
    cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(root, "shards"))
    {
        cJSON *len = cJSON_GetObjectItem(e, "shape");
        if (strncmp(cJSON_GetObjectItem(e, "tensor")->valuestring, "layers.0.input_norm.weight.",
                    27) != 0 ||
            cJSON_GetArrayItem(cJSON_GetObjectItem(e, "offset"), 0)->valuedouble +
                    cJSON_GetArrayItem(len, 0)->valuedouble !=
                16)
            continue;
        cJSON_ReplaceItemInArray(len, 0,
                                 cJSON_CreateNumber(cJSON_GetArrayItem(len, 0)->valuedouble + 9));
    }
}

static void damage_shape(const char *step)
{
    index_edit(step, edit_shape);
    writers_edit(step, edit_writer_shape);
}

/* `latest` (next to the step directories) rewritten to name something else */
static void latest_write(const char *step, const char *text)
{
    char p[4300];
    snprintf(p, sizeof p, "%s/../latest", step);
    FILE *f = fopen(p, "w");
    if (f != NULL) {
        fputs(text, f);
        fclose(f);
    }
}

/* the same with bytes fputs cannot write (a NUL) */
static void latest_write_n(const char *step, const char *bytes, size_t n)
{
    char p[4300];
    snprintf(p, sizeof p, "%s/../latest", step);
    FILE *f = fopen(p, "wb");
    if (f != NULL) {
        if (fwrite(bytes, 1, n, f) != n)
            fprintf(stderr, "writing %s failed\n", p);
        fclose(f);
    }
}

static void damage_latest_dotdot(const char *step) { latest_write(step, "../step-00000003\n"); }
static void damage_latest_slash(const char *step) { latest_write(step, "step-00000003/x"); }
static void damage_latest_dot(const char *step) { latest_write(step, "."); }
static void damage_latest_empty(const char *step) { latest_write(step, ""); }
static void damage_latest_missing(const char *step) { latest_write(step, "step-00000099\n"); }
/* a Windows line end (refused: a save writes a bare \n; the message must show the \r), a CR
 * alone, a NUL and what follows it (it used to be cut there and the name followed), a second
 * line, DEL, and a byte that is not UTF-8 */
static void damage_latest_crlf(const char *step) { latest_write(step, "step-00000003\r\n"); }
static void damage_latest_cr(const char *step) { latest_write(step, "step-00000003\r"); }
static void damage_latest_nul(const char *step)
{
    latest_write_n(step, "step-00000003\0junk\n", 19);
}
static void damage_latest_two_lines(const char *step) { latest_write(step, "step-00000003\n\n"); }
static void damage_latest_del(const char *step) { latest_write(step, "step-00000003\x7f\n"); }
/* a FIFO: opening it for reading used to wait for a writer for good */
static void damage_latest_fifo(const char *step)
{
    char p[4300];
    snprintf(p, sizeof p, "%s/../latest", step);
    unlink(p);
    if (mkfifo(p, 0644) != 0)
        fprintf(stderr, "mkfifo %s failed\n", p);
}
/* a plain name that is not a step's: a complete checkpoint renamed "vm" and latest naming it
 * loaded (any plain directory name was followed); a save only writes step-NNNNNNNN */
static void damage_latest_other_name(const char *step)
{
    char p[4400];
    snprintf(p, sizeof p, "%s/../vm", step);
    latest_write(step, "vm\n"); /* step/../latest: before step is gone */
    if (rename(step, p) != 0)
        fprintf(stderr, "rename %s failed\n", step);
}
static void damage_latest_not_utf8(const char *step)
{
    latest_write(step, "step-\xff"
                       "3\n");
}

/* The per-parameter step counts (AdamW's bias correction reads them: -1, 2.5 or 1e300 loaded and
 * the next step wrote NaN everywhere; the loader cast the double unchecked). The record follows
 * each edit: the content is what is refused. The first `"step":3}` is params[0]'s. */
#define STEP_EDIT(fn, to)                                                                          \
    static void fn(const char *step) { index_replace(step, "\"step\":3}", to, strlen(to), 1); }
STEP_EDIT(damage_param_step_negative, "\"step\":-1}")
STEP_EDIT(damage_param_step_fraction, "\"step\":2.5}")
STEP_EDIT(damage_param_step_huge, "\"step\":1e300}")
STEP_EDIT(damage_param_step_digits, "\"step\":99999999999999999999}")
STEP_EDIT(damage_param_step_above, "\"step\":9007199254740992}")

/* other numbers of the index: the layout (ep 3 does not divide 2 ranks), the block size */
static void damage_layout_ep(const char *step)
{
    index_replace(step, "\"ep\":1,", "\"ep\":3,", 7, 1);
}
static void damage_block_bytes(const char *step)
{
    index_replace(step, "\"block_bytes\":1048576", "\"block_bytes\":1048577", 21, 1);
}

/* JSON that is not exactly one value: text after it, a raw NUL, "\u0000" in a tensor name
 * (cJSON cut it there: the name read as the undamaged one), a key twice (cJSON took the first) */
static void index_append(const char *step, const char *bytes, size_t n)
{
    char p[4300];
    size_t len;
    snprintf(p, sizeof p, "%s/index.json", step);
    char *text = file_slurp(p, &len);
    char *out = malloc(len + n + 1);
    memcpy(out, text, len);
    memcpy(out + len, bytes, n);
    index_put(step, out, len + n);
    free(out);
    free(text);
}
static void damage_index_trailing(const char *step) { index_append(step, " {\"step\":1}", 11); }
static void damage_index_nul(const char *step) { index_append(step, "\0", 1); }
static void damage_index_u0000(const char *step)
{
    index_replace(step, ".exp_avg\"", ".exp_avg\\u0000x\"", 16, 1);
}
static void damage_index_key_twice(const char *step)
{
    index_replace(step, "\"step\":3,", "\"step\":3,\"step\":2,", 18, 1);
}

/* One flipped bit anywhere in index.json, its integrity record as saved: inside a step count
 * ('3' -> '2': it loaded and trained differently), a key ("algo" -> "amgo"), a shard's file name,
 * a shard offset ('3' -> '2'), the first brace */
static void damage_flip_step(const char *step) { index_flip(step, "\"step\":3}", 7, 0x01); }
static void damage_flip_key(const char *step) { index_flip(step, "\"algo\"", 2, 0x01); }
/* ... and in a writer's index (format_version 4: the shard records), its record untouched: the
 * rank file it names, a shard offset */
static void damage_flip_file(const char *step)
{
    ix_flip(step, "rank-00001.index.json", "rank-00001", 5, 0x02);
}
static void damage_flip_offset(const char *step)
{
    ix_flip(step, "rank-00001.index.json", "\"offset\":[32", 10, 0x01);
}
/* a writer's index gone, its integrity record gone or damaged, a writer's index of another step
 * (its record following) */
static void damage_writer_remove(const char *step)
{
    char p[4300];
    snprintf(p, sizeof p, "%s/rank-00001.index.json", step);
    unlink(p);
}
static void damage_writer_crc_remove(const char *step)
{
    char p[4300];
    snprintf(p, sizeof p, "%s/rank-00001.index.json.crc32c", step);
    unlink(p);
}
static void damage_writer_crc_garbage(const char *step)
{
    char p[4300];
    snprintf(p, sizeof p, "%s/rank-00001.index.json.crc32c", step);
    file_put(p, "1234567\n", 8);
}
static void damage_writer_step(const char *step)
{
    ix_replace(step, "rank-00001.index.json", "\"step\":3,", "\"step\":2,", 9, 1);
}
static void damage_flip_brace(const char *step) { index_flip(step, "{", 0, 0x01); }

/* the integrity record itself: gone (a version 2 index is never read without it), damaged */
static void damage_crc_remove(const char *step)
{
    char p[4300];
    snprintf(p, sizeof p, "%s/index.json.crc32c", step);
    unlink(p);
}
static void damage_crc_garbage(const char *step)
{
    char p[4300];
    snprintf(p, sizeof p, "%s/index.json.crc32c", step);
    file_put(p, "1234567\n", 8);
}

/* a rank file's header with text after its JSON object, or a NUL there (its blank padding) */
static void header_last_byte(const char *step, char c)
{
    char p[4300];
    unsigned char len8[8];
    uint64_t n = 0;
    snprintf(p, sizeof p, "%s/rank-00001.safetensors", step);
    int fd = open(p, O_RDWR);
    if (fd < 0 || pread(fd, len8, 8, 0) != 8 || (n = len8[0] | (uint64_t)len8[1] << 8) < 2 ||
        pwrite(fd, &c, 1, (off_t)(8 + n - 1)) != 1)
        fprintf(stderr, "header patch failed\n");
    if (fd >= 0)
        close(fd);
}
static void damage_header_trailing(const char *step) { header_last_byte(step, 'x'); }
static void damage_header_nul(const char *step) { header_last_byte(step, '\0'); }

TEST(every_refusal_leaves_the_state_unchanged_on_every_rank)
{
    setup();
    const char *dir = scratch("refusals");
    struct {
        void (*damage)(const char *);
        shardopt_status_t status;
        const char *w1, *w2;
    } cases[] = {
        {damage_remove_index, SHARDOPT_ERR_IO, "index.json", NULL},
        {damage_remove_rank1, SHARDOPT_ERR_IO, "rank-00001.safetensors", NULL},
        {damage_truncate, SHARDOPT_ERR_CORRUPT, "rank-00000.safetensors", NULL},
        {damage_flip, SHARDOPT_ERR_CORRUPT, "rank-00000.safetensors", "CRC32C mismatch"},
        {damage_header_size, SHARDOPT_ERR_CORRUPT, "rank-00000.safetensors", NULL},
        {damage_file_name, SHARDOPT_ERR_CORRUPT, "rank-00000.index.json",
         "\"file\" is not the rank file of its number"},
        {damage_drop_tensor, SHARDOPT_ERR_MISMATCH, "is not in the checkpoint", NULL},
        {damage_shape, SHARDOPT_ERR_MISMATCH, "has shape [25] in the checkpoint",
         "the registered parameter [16]"},
        /* a crafted latest is never followed outside the directory */
        {damage_latest_dotdot, SHARDOPT_ERR_CORRUPT, "'../step-00000003' is not a step directory",
         NULL},
        {damage_latest_slash, SHARDOPT_ERR_CORRUPT, "'step-00000003/x' is not a step directory",
         NULL},
        {damage_latest_dot, SHARDOPT_ERR_CORRUPT, "'.' is not a step directory", NULL},
        {damage_latest_empty, SHARDOPT_ERR_CORRUPT, "'' is not a step directory", NULL},
        {damage_latest_missing, SHARDOPT_ERR_IO, "step-00000099/index.json", NULL},
        {damage_param_step_negative, SHARDOPT_ERR_CORRUPT, "number '-1'", "plain digits"},
        {damage_param_step_fraction, SHARDOPT_ERR_CORRUPT, "number '2.5'", "plain digits"},
        {damage_param_step_huge, SHARDOPT_ERR_CORRUPT, "number '1e300'", "plain digits"},
        {damage_param_step_digits, SHARDOPT_ERR_CORRUPT, "'model.embed_tokens.weight'",
         "\"step\" is not an integer in [0, 2^53)"},
        {damage_param_step_above, SHARDOPT_ERR_CORRUPT, "'model.embed_tokens.weight'",
         "\"step\" is not an integer in [0, 2^53)"},
        {damage_layout_ep, SHARDOPT_ERR_CORRUPT, "\"layout\"", "ep does not divide"},
        {damage_block_bytes, SHARDOPT_ERR_CORRUPT, "block_bytes is not 1048576", NULL},
        {damage_index_trailing, SHARDOPT_ERR_CORRUPT, "index.json: byte", "text after the JSON"},
        {damage_index_nul, SHARDOPT_ERR_CORRUPT, "index.json: byte", "is a NUL byte"},
        {damage_index_u0000, SHARDOPT_ERR_CORRUPT, "index.json: byte", "\\u0000 in a string"},
        {damage_index_key_twice, SHARDOPT_ERR_CORRUPT, "key 'step' appears twice", NULL},
        {damage_flip_step, SHARDOPT_ERR_CORRUPT, "index.json.crc32c says", "damaged"},
        {damage_flip_key, SHARDOPT_ERR_CORRUPT, "index.json.crc32c says", "damaged"},
        {damage_flip_file, SHARDOPT_ERR_CORRUPT, "rank-00001.index.json.crc32c says",
         "the writer's index is damaged"},
        {damage_flip_offset, SHARDOPT_ERR_CORRUPT, "rank-00001.index.json.crc32c says",
         "the writer's index is damaged"},
        {damage_writer_remove, SHARDOPT_ERR_IO, "rank-00001.index.json: No such file", NULL},
        {damage_writer_crc_remove, SHARDOPT_ERR_CORRUPT,
         "the integrity record of rank-00001.index.json is missing", NULL},
        {damage_writer_crc_garbage, SHARDOPT_ERR_CORRUPT,
         "rank-00001.index.json.crc32c: not 8 lowercase hex", NULL},
        {damage_writer_step, SHARDOPT_ERR_CORRUPT,
         "rank-00001.index.json: \"step\" is 2, not index.json's 3", "another save"},
        {damage_flip_brace, SHARDOPT_ERR_CORRUPT, "index.json.crc32c says", "damaged"},
        {damage_crc_remove, SHARDOPT_ERR_CORRUPT, "format_version 4 and no index.json.crc32c",
         NULL},
        {damage_crc_garbage, SHARDOPT_ERR_CORRUPT, "index.json.crc32c: not 8 lowercase hex", NULL},
        {damage_header_trailing, SHARDOPT_ERR_CORRUPT, "rank-00001.safetensors",
         "text after the JSON object"},
        {damage_header_nul, SHARDOPT_ERR_CORRUPT, "rank-00001.safetensors", "is a NUL byte"},
        {damage_latest_crlf, SHARDOPT_ERR_CORRUPT, "'step-00000003\\r' is not a step directory",
         "as Windows writes it"},
        {damage_latest_cr, SHARDOPT_ERR_CORRUPT, "'step-00000003\\r' is not a step directory",
         NULL},
        {damage_latest_nul, SHARDOPT_ERR_CORRUPT,
         "'step-00000003\\x00junk' is not a step directory", NULL},
        {damage_latest_two_lines, SHARDOPT_ERR_CORRUPT,
         "'step-00000003\\n' is not a step directory", NULL},
        {damage_latest_del, SHARDOPT_ERR_CORRUPT, "'step-00000003\\x7f' is not a step directory",
         NULL},
        {damage_latest_not_utf8, SHARDOPT_ERR_CORRUPT, "'step-\\xff3' is not a step directory",
         NULL},
        {damage_latest_fifo, SHARDOPT_ERR_CORRUPT, "latest: is a FIFO, expected a regular file",
         NULL},
        {damage_latest_other_name, SHARDOPT_ERR_CORRUPT, "latest: 'vm' is not a step directory",
         "step-NNNNNNNN"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct run d;
        saved_run(&d, dir, test_config());
        if (world < 2 &&
            (cases[i].damage == damage_remove_rank1 || cases[i].damage == damage_flip_file ||
             cases[i].damage == damage_flip_offset || cases[i].damage == damage_writer_remove ||
             cases[i].damage == damage_writer_crc_remove ||
             cases[i].damage == damage_writer_crc_garbage ||
             cases[i].damage == damage_writer_step)) {
            run_free(&d);
            continue;
        }
        expect_refused(&d, dir, cases[i].damage, cases[i].status, cases[i].w1, cases[i].w2);
        run_free(&d);
    }
    dir_clear(dir);
}

/* Shards that do not tile their tensor exactly, the index's record following each edit so that
 * the structure is what is refused: the second shard of the first tensor moved onto the first
 * (overlap and gap: a 1-rank load counted 1024 of 1024 elements and loaded, rows shifted and
 * half the tensor never written), grown by a row over it (overlap), shrunk by a row (gap). Loaded
 * on every rank, then on one rank alone, which reads every shard: refused before a byte is
 * copied, the state unchanged. */
/* (format_version 4: the second shard is the record in writer 1's index) */
static void damage_tile_moved(const char *step)
{
    ix_replace(step, "rank-00001.index.json", "\"offset\":[32,0]", "\"offset\":[0,0]", 14, 1);
}
static void damage_tile_overlap(const char *step)
{
    const char *to = "\"offset\":[31,0],\"shape\":[33,16]";
    ix_replace(step, "rank-00001.index.json", "\"offset\":[32,0],\"shape\":[32,16]", to, strlen(to),
               1);
}
static void damage_tile_gap(const char *step)
{
    const char *to = "\"offset\":[33,0],\"shape\":[31,16]";
    ix_replace(step, "rank-00001.index.json", "\"offset\":[32,0],\"shape\":[32,16]", to, strlen(to),
               1);
}

TEST(shards_that_do_not_tile_their_tensor_are_refused_before_any_read)
{
    setup();
    const char *dir = scratch("tiling");
    /* each rank checks the shards of the parts it holds (format_version 4 reads only the writers'
     * indexes that have them): on 2 ranks rank 1 finds its part uncovered where the moved or
     * shrunk shard left it, and the shard grown over rank 0's part does not match the tensor its
     * rank file holds; one rank, which reads every writer, finds each fault as such */
    struct {
        void (*damage)(const char *);
        const char *words, *words_one;
    } cases[] = {
        {damage_tile_moved, "leave part of the tensor uncovered (they must tile",
         "overlap and leave part of the tensor uncovered"},
        {damage_tile_overlap,
         "is F32 [32, 16] (512 elements) in the file's header, the index says F32 [33, 16] (528)",
         "the shards overlap (they must tile"},
        {damage_tile_gap, "leave part of the tensor uncovered (they must tile",
         "leave part of the tensor uncovered (they must tile"},
    };
    if (world < 2) /* a saved tensor of one shard tiles whatever the edit */
        return;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct run d;
        saved_run(&d, dir, test_config());
        /* every rank refuses, whichever part it holds */
        expect_refused(&d, dir, cases[i].damage, SHARDOPT_ERR_CORRUPT,
                       "model.embed_tokens.weight.exp_avg", cases[i].words);
        run_free(&d);
        if (me == 0) { /* one rank, which reads every shard */
            struct run one = {0};
            unsigned char *before, *after;
            size_t nb, na;
            ASSERT_EQ_INT(run_setup(&one, MPI_COMM_SELF, test_config(), 0), SHARDOPT_OK);
            run_steps(&one, 1, 2);
            snapshot(&one, &before, &nb);
            EXPECT_EQ_INT(shardopt_load(one.rt, dir), SHARDOPT_ERR_CORRUPT);
            EXPECT_STR_CONTAINS(shardopt_last_error(), "model.embed_tokens.weight.exp_avg");
            EXPECT_STR_CONTAINS(shardopt_last_error(), cases[i].words_one);
            snapshot(&one, &after, &na);
            EXPECT_TRUE(na == nb && memcmp(before, after, nb) == 0);
            free(before);
            free(after);
            run_free(&one);
        }
        MPI_Barrier(MPI_COMM_WORLD);
    }
    dir_clear(dir);
}

TEST(missing_tensors_are_allowed_when_asked)
{
    setup();
    const char *dir = scratch("missing");
    struct run d;
    shardopt_config_t cfg = test_config();
    cfg.load_allow_missing = 1;
    saved_run(&d, dir, cfg);
    if (me == 0) {
        char step[4200];
        snprintf(step, sizeof step, "%s/step-00000003", dir);
        damage_drop_tensor(step);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    EXPECT_EQ_INT(shardopt_load(d.rt, dir), SHARDOPT_OK);
    run_free(&d);
    dir_clear(dir);

    /* A parameter the checkpoint has no record of keeps its state, but its step count may not
     * stay above the checkpoint's: a runtime at step 6 loading step 3 would otherwise carry a
     * count of 6 into the next save, whose index every later load refuses (a count above the
     * global step). */
    saved_run(&d, dir, cfg);
    run_steps(&d, 4, 6);
    if (me == 0) {
        char step[4200];
        snprintf(step, sizeof step, "%s/step-00000003", dir);
        damage_drop_param(step);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    EXPECT_EQ_INT(shardopt_load(d.rt, dir), SHARDOPT_OK);
    run_steps(&d, 4, 4);
    EXPECT_EQ_INT(shardopt_save(d.rt, dir), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_load(d.rt, dir), SHARDOPT_OK);
    run_free(&d);
    dir_clear(dir);
}

/* ---- files that are not files: what a load opens (latest, index.json and its record, each
 * writer's index and its record, the rank files), each planted as something a save never writes.
 * Before base/file_read.c a FIFO there stopped the load for good (open for reading waits for a
 * writer), so each load runs under alarm(): a hang kills the test instead of the CI job. ---- */

static void plant_path(const char *step, const char *file, char *p, size_t n)
{
    snprintf(p, n, "%s/%s", step, file);
    unlink(p);
}
static void plant_fifo(const char *step, const char *file)
{
    char p[4300];
    plant_path(step, file, p, sizeof p);
    if (mkfifo(p, 0644) != 0)
        fprintf(stderr, "mkfifo %s failed\n", p);
}
static void plant_dir(const char *step, const char *file)
{
    char p[4300];
    plant_path(step, file, p, sizeof p);
    if (mkdir(p, 0755) != 0)
        fprintf(stderr, "mkdir %s failed\n", p);
}
static void plant_link(const char *step, const char *file, const char *target)
{
    char p[4300];
    plant_path(step, file, p, sizeof p);
    if (symlink(target, p) != 0)
        fprintf(stderr, "symlink %s failed\n", p);
}
static void fifo_writer_index(const char *step) { plant_fifo(step, "rank-00001.index.json"); }
static void fifo_writer_crc(const char *step) { plant_fifo(step, "rank-00001.index.json.crc32c"); }
static void fifo_rank_file(const char *step) { plant_fifo(step, "rank-00001.safetensors"); }
static void fifo_index(const char *step) { plant_fifo(step, "index.json"); }
static void fifo_index_crc(const char *step) { plant_fifo(step, "index.json.crc32c"); }
static void dir_rank_file(const char *step) { plant_dir(step, "rank-00001.safetensors"); }
static void dir_index(const char *step) { plant_dir(step, "index.json"); }
static void dir_writer_index(const char *step) { plant_dir(step, "rank-00000.index.json"); }
/* a device: reads of /dev/zero never end, of a terminal wait for input */
static void device_rank_file(const char *step)
{
    plant_link(step, "rank-00001.safetensors", "/dev/zero");
}
static void loop_writer_index(const char *step)
{
    plant_link(step, "rank-00001.index.json", "rank-00001.index.json");
}

/* A fresh 2-rank save, `plant` run on rank 0, then a load on every rank: refused with `status`
 * and w1, naming the rank that found it (w2), the state unchanged on every rank. */
static void planted_refused(void (*plant)(const char *), shardopt_status_t status, const char *w1,
                            const char *w2)
{
    const char *dir = scratch("notfiles");
    struct run d;
    setup();
    if (world != 2) /* the files planted, and the rank each names, are a 2-rank save's */
        return;
    saved_run(&d, dir, test_config());
    alarm(60); /* the load used to wait here for good: SIGALRM ends the test instead */
    expect_refused(&d, dir, plant, status, w1, w2);
    alarm(0);
    run_free(&d);
    dir_clear(dir);
}

TEST(a_fifo_as_a_writer_s_index_is_refused)
{
    planted_refused(fifo_writer_index, SHARDOPT_ERR_CORRUPT,
                    "rank-00001.index.json: is a FIFO, expected a regular file", "load: rank 1: ");
}
TEST(a_fifo_as_a_writer_s_integrity_record_is_refused)
{
    planted_refused(fifo_writer_crc, SHARDOPT_ERR_CORRUPT,
                    "rank-00001.index.json.crc32c: is a FIFO, expected a regular file",
                    "load: rank 1: ");
}
TEST(a_fifo_as_a_rank_file_is_refused)
{
    planted_refused(fifo_rank_file, SHARDOPT_ERR_CORRUPT,
                    "rank-00001.safetensors: is a FIFO, expected a regular file", "load: rank 1: ");
}
TEST(a_fifo_as_the_top_level_index_is_refused)
{
    planted_refused(fifo_index, SHARDOPT_ERR_CORRUPT,
                    "index.json: is a FIFO, expected a regular file", "load: rank 0: ");
}
TEST(a_fifo_as_the_index_s_integrity_record_is_refused)
{
    planted_refused(fifo_index_crc, SHARDOPT_ERR_CORRUPT,
                    "index.json.crc32c: is a FIFO, expected a regular file", "load: rank 0: ");
}
TEST(a_directory_as_a_rank_file_is_refused)
{
    planted_refused(dir_rank_file, SHARDOPT_ERR_CORRUPT,
                    "rank-00001.safetensors: is a directory, expected a regular file",
                    "load: rank 1: ");
}
TEST(a_directory_as_the_top_level_index_is_refused)
{
    planted_refused(dir_index, SHARDOPT_ERR_CORRUPT,
                    "index.json: is a directory, expected a regular file", "load: rank 0: ");
}
TEST(a_directory_as_a_writer_s_index_is_refused)
{
    planted_refused(dir_writer_index, SHARDOPT_ERR_CORRUPT,
                    "rank-00000.index.json: is a directory, expected a regular file",
                    "load: rank 0: ");
}
TEST(a_device_as_a_rank_file_is_refused)
{
    planted_refused(device_rank_file, SHARDOPT_ERR_CORRUPT,
                    "rank-00001.safetensors: is a character device, expected a regular file",
                    "load: rank 1: ");
}
TEST(a_symbolic_link_loop_as_a_writer_s_index_is_refused)
{
    planted_refused(loop_writer_index, SHARDOPT_ERR_IO,
                    "rank-00001.index.json: Too many levels of symbolic links", "load: rank 1: ");
}

/* A read that fails with an I/O error on the last rank only (SHARDOPT_FAULT=ckpt.read, EIO) at
 * its 1st, 2nd or 4th read (a header, a tensor): ERR_IO on every rank, naming the error (it used
 * to read as ERR_CORRUPT "file truncated"), and the state unchanged everywhere; once the disk
 * answers again the same load succeeds. */
TEST(a_read_error_on_one_rank_fails_the_load_everywhere_with_the_state_unchanged)
{
    setup();
    const char *dir = scratch("readerr");
    const char *sites[] = {"ckpt.read:1", "ckpt.read:2", "ckpt.read:4"};
    struct run d;
    saved_run(&d, dir, test_config());
    run_steps(&d, 4, 4); /* the state moves on from what was saved */
    for (int i = 0; i < 3; i++) {
        unsigned char *before, *after;
        size_t nb, na;
        snapshot(&d, &before, &nb);
        if (me == world - 1)
            fault_arm(sites[i]);
        EXPECT_EQ_INT(shardopt_load(d.rt, dir), SHARDOPT_ERR_IO);
        EXPECT_STR_CONTAINS(shardopt_last_error(), "read failed: Input/output error");
        fault_arm(NULL);
        snapshot(&d, &after, &na);
        EXPECT_TRUE(na == nb && memcmp(before, after, nb) == 0);
        free(before);
        free(after);
    }
    EXPECT_EQ_INT(shardopt_load(d.rt, dir), SHARDOPT_OK);
    run_free(&d);
    dir_clear(dir);
}

TEST(a_failed_save_keeps_the_previous_checkpoint)
{
    setup();
    const char *dir = scratch("failsave");
    struct run d;
    saved_run(&d, dir, test_config());
    run_steps(&d, 4, 6);
    /* each site in turn makes the save fail: latest and the previous step stay */
    const char *sites[] = {"ckpt.write:1", "ckpt.fsync:1", "ckpt.index:1", "ckpt.rename:1",
                           "ckpt.latest:1"};
    for (int i = 0; i < 5; i++) {
        fault_arm(sites[i]);
        EXPECT_EQ_INT(shardopt_save(d.rt, dir), SHARDOPT_ERR_IO);
        EXPECT_STR_CONTAINS(shardopt_last_error(), "Input/output error");
    }
    fault_arm(NULL);
    if (me == 0) {
        char p[4200];
        FILE *f;
        snprintf(p, sizeof p, "%s/latest", dir);
        f = fopen(p, "r");
        char line[64] = "";
        if (f != NULL && fgets(line, sizeof line, f) != NULL)
            EXPECT_STR_CONTAINS(line, "step-00000003");
        if (f != NULL)
            fclose(f);
        /* no temporary directory is left behind */
        DIR *dd = opendir(dir);
        struct dirent *e;
        int tmps = 0;
        while ((e = readdir(dd)) != NULL)
            tmps += strncmp(e->d_name, ".tmp-", 5) == 0;
        closedir(dd);
        EXPECT_EQ_INT(tmps, 0);
    }
    EXPECT_EQ_INT(shardopt_load(d.rt, dir), SHARDOPT_OK);
    shardopt_stats_t st = SHARDOPT_STATS_INIT;
    shardopt_get_stats(d.rt, &st);
    EXPECT_EQ_INT(st.steps, 3);
    run_free(&d);
    dir_clear(dir);
}

TEST(keep_last_prunes_only_older_steps)
{
    setup();
    const char *dir = scratch("keep");
    struct run d;
    shardopt_config_t cfg = test_config();
    cfg.keep_last = 2;
    saved_run(&d, dir, cfg);
    for (int s = 4; s <= 6; s++) {
        run_steps(&d, s, s);
        EXPECT_EQ_INT(shardopt_save(d.rt, dir), SHARDOPT_OK);
    }
    if (me == 0) {
        char p[4200];
        struct stat st;
        const char *want[] = {"step-00000005", "step-00000006"};
        const char *gone[] = {"step-00000003", "step-00000004"};
        for (int i = 0; i < 2; i++) {
            snprintf(p, sizeof p, "%s/%s", dir, want[i]);
            EXPECT_TRUE(stat(p, &st) == 0);
            snprintf(p, sizeof p, "%s/%s", dir, gone[i]);
            EXPECT_TRUE(stat(p, &st) != 0);
        }
    }
    run_free(&d);
    dir_clear(dir);
}

/* A run that went back (restarted from an earlier checkpoint, or a fresh one) saves a step
 * lower than those already in the directory: the step just published must survive the pruning
 * (it used to keep the highest step numbers, delete the new step and leave latest naming a
 * directory that was gone). */
TEST(keep_last_never_prunes_the_step_just_published)
{
    setup();
    const char *dir = scratch("keep_back");
    struct run d, back;
    shardopt_config_t cfg = test_config();
    cfg.keep_last = 2;
    saved_run(&d, dir, cfg); /* step 3 */
    for (int s = 4; s <= 6; s++) {
        run_steps(&d, s, s);
        EXPECT_EQ_INT(shardopt_save(d.rt, dir), SHARDOPT_OK);
    }
    memset(&back, 0, sizeof back);
    ASSERT_EQ_INT(run_setup(&back, MPI_COMM_WORLD, cfg, 0), SHARDOPT_OK);
    ASSERT_EQ_INT(run_steps(&back, 1, 2), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_save(back.rt, dir), SHARDOPT_OK); /* step 2, now latest */
    if (me == 0) {
        char p[4200];
        struct stat st;
        snprintf(p, sizeof p, "%s/step-00000002", dir);
        EXPECT_TRUE(stat(p, &st) == 0);
        snprintf(p, sizeof p, "%s/step-00000006", dir); /* the newest of the others stays */
        EXPECT_TRUE(stat(p, &st) == 0);
        snprintf(p, sizeof p, "%s/step-00000005", dir);
        EXPECT_TRUE(stat(p, &st) != 0);
    }
    EXPECT_EQ_INT(shardopt_load(d.rt, dir), SHARDOPT_OK);
    shardopt_stats_t st = SHARDOPT_STATS_INIT;
    shardopt_get_stats(d.rt, &st);
    EXPECT_EQ_INT(st.steps, 2);
    run_free(&back);
    run_free(&d);
    dir_clear(dir);
}

/* ---- the checkpoint directory: links, a second writer, latest ---- */

static void text_put(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (f != NULL) {
        fputs(text, f);
        fclose(f);
    }
}

static int is_link(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0 && S_ISLNK(st.st_mode);
}

static int exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

/* Does DIR/latest say step? */
static int latest_is(const char *dir, const char *step)
{
    char p[4200];
    snprintf(p, sizeof p, "%s/latest", dir);
    char *t = text_of(p);
    int ok = strncmp(t, step, strlen(step)) == 0 && strcmp(t + strlen(step), "\n") == 0;
    free(t);
    return ok;
}

/* Outside the checkpoint directory: files a save must never touch (collective). */
static const char *outside_make(void)
{
    const char *out = scratch("outside");
    dir_clear(out);
    if (me == 0) {
        char p[4200];
        mkdir(out, 0755);
        snprintf(p, sizeof p, "%s/sub", out);
        mkdir(p, 0755);
        const char *files[] = {"sentinel", "sub/sentinel", "file", "deep"};
        for (int i = 0; i < 4; i++) {
            snprintf(p, sizeof p, "%s/%s", out, files[i]);
            text_put(p, "precious\n");
        }
    }
    return out;
}

static int outside_intact(const char *out)
{
    const char *files[] = {"sentinel", "sub/sentinel", "file", "deep"};
    int ok = 1;
    for (int i = 0; i < 4; i++) {
        char p[4200];
        snprintf(p, sizeof p, "%s/%s", out, files[i]);
        char *t = text_of(p);
        ok = ok && strcmp(t, "precious\n") == 0;
        free(t);
    }
    return ok;
}

/* keep_last prunes a step-N that is a symbolic link to a directory elsewhere: it used to delete
 * the files there. Now the link and what it points to stay and a warning names it; links inside a
 * pruned step directory (to a directory, to a file, one inside a subdirectory) are removed as
 * links, their targets kept. */
TEST(pruning_never_deletes_through_a_symbolic_link)
{
    setup();
    const char *dir = scratch("links");
    const char *log = scratch("links.log");
    struct run d;
    shardopt_config_t cfg = test_config();
    cfg.keep_last = 2;
    saved_run(&d, dir, cfg); /* step 3 */
    const char *out = outside_make();
    char p[4200], q[4200];
    if (me == 0) {
        snprintf(p, sizeof p, "%s/step-00000001", dir);
        ASSERT_TRUE(symlink(out, p) == 0);
        snprintf(p, sizeof p, "%s/step-00000002", dir); /* a link to a file */
        snprintf(q, sizeof q, "%s/file", out);
        ASSERT_TRUE(symlink(q, p) == 0);
        /* inside step 3, which pruning removes */
        snprintf(p, sizeof p, "%s/step-00000003/linkdir", dir);
        snprintf(q, sizeof q, "%s/sub", out);
        ASSERT_TRUE(symlink(q, p) == 0);
        snprintf(p, sizeof p, "%s/step-00000003/linkfile", dir);
        snprintf(q, sizeof q, "%s/file", out);
        ASSERT_TRUE(symlink(q, p) == 0);
        snprintf(p, sizeof p, "%s/step-00000003/extra", dir);
        mkdir(p, 0755);
        snprintf(p, sizeof p, "%s/step-00000003/extra/link", dir);
        snprintf(q, sizeof q, "%s/deep", out);
        ASSERT_TRUE(symlink(q, p) == 0);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    int saved = me == 0 ? stderr_to(log) : -1;
    for (int s = 4; s <= 5; s++) {
        run_steps(&d, s, s);
        EXPECT_EQ_INT(shardopt_save(d.rt, dir), SHARDOPT_OK);
    }
    if (me == 0) {
        stderr_back(saved);
        EXPECT_TRUE(outside_intact(out));
        snprintf(p, sizeof p, "%s/step-00000001", dir);
        EXPECT_TRUE(is_link(p));
        snprintf(p, sizeof p, "%s/step-00000002", dir);
        EXPECT_TRUE(is_link(p));
        snprintf(p, sizeof p, "%s/step-00000003", dir); /* pruned, links and all */
        EXPECT_TRUE(!exists(p));
        snprintf(p, sizeof p, "%s/step-00000004", dir);
        EXPECT_TRUE(exists(p));
        char *t = text_of(log);
        EXPECT_STR_CONTAINS(t, "step-00000001 is a symbolic link, not a step directory");
        EXPECT_STR_CONTAINS(t, "step-00000002 is a symbolic link, not a step directory");
        free(t);
        unlink(log);
    }
    EXPECT_EQ_INT(shardopt_load(d.rt, dir), SHARDOPT_OK);
    run_free(&d);
    dir_clear(dir);
    dir_clear(out);
}

/* The step being saved exists already: a crashed save's unpublished step-N is cleared first. A
 * step-N that is a symbolic link (to a directory elsewhere, or to a file) was not made by a save:
 * it used to be emptied through the link. Now the save fails on every rank naming it, nothing is
 * touched, and the save succeeds once it is gone. A real unpublished step-N with links inside is
 * cleared, the links' targets kept. */
TEST(a_stale_step_that_is_a_symbolic_link_is_left_and_named)
{
    setup();
    const char *dir = scratch("stale");
    struct run d;
    saved_run(&d, dir, test_config()); /* step 3 */
    const char *out = outside_make();
    run_steps(&d, 4, 4);
    char p[4200], q[4200];
    for (int c = 0; c < 2; c++) {
        if (me == 0) {
            snprintf(p, sizeof p, "%s/step-00000004", dir);
            snprintf(q, sizeof q, c == 0 ? "%s" : "%s/file", out);
            ASSERT_TRUE(symlink(q, p) == 0);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        EXPECT_EQ_INT(shardopt_save(d.rt, dir), SHARDOPT_ERR_IO);
        EXPECT_STR_CONTAINS(shardopt_last_error(), "step-00000004 is a symbolic link");
        if (me == 0) {
            EXPECT_TRUE(outside_intact(out));
            EXPECT_TRUE(is_link(p));
            EXPECT_TRUE(latest_is(dir, "step-00000003"));
            unlink(p);
        }
        MPI_Barrier(MPI_COMM_WORLD);
    }
    /* a real unpublished step 4 holding links */
    if (me == 0) {
        snprintf(p, sizeof p, "%s/step-00000004", dir);
        mkdir(p, 0755);
        snprintf(p, sizeof p, "%s/step-00000004/linkdir", dir);
        ASSERT_TRUE(symlink(out, p) == 0);
        snprintf(p, sizeof p, "%s/step-00000004/rank-00000.safetensors", dir);
        snprintf(q, sizeof q, "%s/file", out);
        ASSERT_TRUE(symlink(q, p) == 0);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    EXPECT_EQ_INT(shardopt_save(d.rt, dir), SHARDOPT_OK);
    if (me == 0) {
        EXPECT_TRUE(outside_intact(out));
        EXPECT_TRUE(latest_is(dir, "step-00000004"));
        snprintf(p, sizeof p, "%s/step-00000004/linkdir", dir);
        EXPECT_TRUE(!exists(p));
    }
    EXPECT_EQ_INT(shardopt_load(d.rt, dir), SHARDOPT_OK);
    run_free(&d);
    dir_clear(dir);
    dir_clear(out);
}

/* Two jobs saving into one directory: the second one's leftover clearing used to delete the
 * first one's save in progress, which then published a step that did not load. Now a save holds
 * DIR/.lock (flock) and another writer's save fails on every rank naming the directory and the
 * holder recorded in the file, touching nothing; once the lock is released the save succeeds and
 * clears the leftovers. The holder here is this test (rank 0, its own open of the file: flock
 * locks belong to an open file, so the library's own open is refused as another process's). */
TEST(a_second_writer_is_refused_and_touches_nothing)
{
    setup();
    const char *dir = scratch("lock");
    struct run d;
    saved_run(&d, dir, test_config()); /* step 3 */
    run_steps(&d, 4, 4);
    char p[4400], theirs[4200];
    int fd = -1;
    snprintf(theirs, sizeof theirs, "%s/.tmp-step-00000009-4242", dir);
    if (me == 0) {
        snprintf(p, sizeof p, "%s/.lock", dir);
        fd = open(p, O_RDWR | O_CREAT, 0644);
        ASSERT_TRUE(fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) == 0);
        const char who[] = "host othernode pid 4242 since 2026-12-01T00:00:00Z\r\n";
        ASSERT_TRUE(ftruncate(fd, 0) == 0 && pwrite(fd, who, strlen(who), 0) > 0);
        /* the other job's save in progress */
        mkdir(theirs, 0755);
        snprintf(p, sizeof p, "%s/rank-00000.safetensors", theirs);
        text_put(p, "in progress\n");
    }
    MPI_Barrier(MPI_COMM_WORLD);
    EXPECT_EQ_INT(shardopt_save(d.rt, dir), SHARDOPT_ERR_IO);
    EXPECT_STR_CONTAINS(shardopt_last_error(), dir);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "another writer is saving into this directory");
    /* the holder as the file has it, escaped */
    EXPECT_STR_CONTAINS(shardopt_last_error(),
                        "held by host othernode pid 4242 since 2026-12-01T00:00:00Z\\r)");
    if (me == 0) {
        char *t = text_of(p);
        EXPECT_TRUE(strcmp(t, "in progress\n") == 0);
        free(t);
        EXPECT_TRUE(latest_is(dir, "step-00000003"));
        snprintf(p, sizeof p, "%s/step-00000004", dir);
        EXPECT_TRUE(!exists(p));
    }
    /* the previous checkpoint loads (a load takes no lock) */
    struct run e = {0};
    run_setup(&e, MPI_COMM_WORLD, test_config(), 0);
    EXPECT_EQ_INT(shardopt_load(e.rt, dir), SHARDOPT_OK);
    shardopt_stats_t st = SHARDOPT_STATS_INIT;
    shardopt_get_stats(e.rt, &st);
    EXPECT_EQ_INT(st.steps, 3);
    run_free(&e);
    if (me == 0)
        close(fd); /* the other writer is done (or died: the kernel drops its lock the same way) */
    MPI_Barrier(MPI_COMM_WORLD);
    EXPECT_EQ_INT(shardopt_save(d.rt, dir), SHARDOPT_OK);
    if (me == 0) {
        EXPECT_TRUE(latest_is(dir, "step-00000004"));
        EXPECT_TRUE(!exists(theirs)); /* no live writer: a leftover, cleared */
        snprintf(p, sizeof p, "%s/.lock", dir);
        char *t = text_of(p); /* released: no holder recorded */
        EXPECT_TRUE(t[0] == '\0');
        free(t);
    }
    EXPECT_EQ_INT(shardopt_load(d.rt, dir), SHARDOPT_OK);
    run_free(&d);
    dir_clear(dir);
}

/* A filesystem without flock (Lustre mounted without -o flock: ENOLCK, ENOSYS or EOPNOTSUPP from
 * flock): the save goes ahead with a warning (refusing would leave such a job no save at all),
 * and because a live writer cannot be told from a crashed one there, another save's temporary
 * directory is left in place. */
TEST(a_filesystem_without_flock_saves_and_leaves_other_temporary_directories)
{
    setup();
    const char *dir = scratch("nolock");
    struct run d;
    saved_run(&d, dir, test_config()); /* step 3 */
    run_steps(&d, 4, 4);
    char p[4400], theirs[4200];
    snprintf(theirs, sizeof theirs, "%s/.tmp-step-00000009-4242", dir);
    if (me == 0) {
        mkdir(theirs, 0755);
        snprintf(p, sizeof p, "%s/rank-00000.safetensors", theirs);
        text_put(p, "in progress\n");
        fault_arm("ckpt.lock:1:ENOLCK");
    }
    MPI_Barrier(MPI_COMM_WORLD);
    EXPECT_EQ_INT(shardopt_save(d.rt, dir), SHARDOPT_OK);
    fault_arm(NULL);
    if (me == 0) {
        EXPECT_TRUE(latest_is(dir, "step-00000004"));
        char *t = text_of(p);
        EXPECT_TRUE(t != NULL && strcmp(t, "in progress\n") == 0);
        free(t);
    }
    EXPECT_EQ_INT(shardopt_load(d.rt, dir), SHARDOPT_OK);
    run_free(&d);
    dir_clear(dir);
}

/* What a killed save can leave at the very name the next save of that step takes
 * (.tmp-step-N-<pid>, pids being reused): a FIFO, a symbolic link to a directory outside, a
 * directory holding files, a FIFO, a link outside and a tree deeper than the clearing enters; and
 * with no flock, a directory the clearing must leave. The save used to fail with "File exists"
 * (every save of that step in that process); now it never opens, enters or follows what is there,
 * takes the next name of its process and publishes. */
static void stale_tmp_plant(const char *tmp, int kind, const char *out)
{
    char p[4400];
    if (kind == 0)
        mkfifo(tmp, 0644);
    else if (kind == 1)
        symlink(out, tmp);
    else {
        mkdir(tmp, 0755);
        snprintf(p, sizeof p, "%s/rank-00000.safetensors", tmp);
        text_put(p, "half written\n");
        snprintf(p, sizeof p, "%s/fifo", tmp);
        mkfifo(p, 0644);
        snprintf(p, sizeof p, "%s/out", tmp);
        symlink(out, p);
        snprintf(p, sizeof p, "%s/sub", tmp);
        mkdir(p, 0755);
        snprintf(p, sizeof p, "%s/sub/file-link", tmp);
        symlink("../../../shardopt_ckpt_outside/file", p);
        snprintf(p, sizeof p, "%s", tmp);
        for (int d = 0; d < 12; d++) { /* deeper than the clearing goes: the name stays taken */
            strcat(p, "/d");
            mkdir(p, 0755);
        }
    }
}

TEST(a_killed_saves_leftover_at_the_temporary_name_is_stepped_around)
{
    setup();
    const char *dir = scratch("staletmp");
    const char *out = outside_make();
    struct run d;
    saved_run(&d, dir, test_config()); /* step 3 */
    int pid = (int)getpid();
    MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD); /* rank 0 names the temporary directory */
    for (int kind = 0; kind < 4; kind++) {
        const int step = 4 + kind;
        char tmp[4200], want[32];
        run_steps(&d, step, step);
        snprintf(tmp, sizeof tmp, "%s/.tmp-step-%08d-%d", dir, step, pid);
        snprintf(want, sizeof want, "step-%08d", step);
        if (me == 0) {
            stale_tmp_plant(tmp, kind < 3 ? kind : 2, out);
            if (kind == 3) /* no flock: the clearing leaves every leftover */
                fault_arm("ckpt.lock:1:ENOLCK");
        }
        MPI_Barrier(MPI_COMM_WORLD);
        EXPECT_EQ_INT(shardopt_save(d.rt, dir), SHARDOPT_OK);
        fault_arm(NULL);
        if (me == 0) {
            EXPECT_TRUE(latest_is(dir, want));
            EXPECT_TRUE(outside_intact(out));       /* nothing followed out of the directory */
            EXPECT_TRUE(kind != 1 || is_link(tmp)); /* a link stays a link */
            struct stat st;
            EXPECT_TRUE(kind != 0 || (lstat(tmp, &st) == 0 && S_ISFIFO(st.st_mode)));
        }
        EXPECT_EQ_INT(shardopt_load(d.rt, dir), SHARDOPT_OK);
    }
    run_free(&d);
    dir_clear(dir);
    dir_clear(out);
}

static const char *damaged_rank_file; /* for the hooks below */

static void hook_remove(const char *tmp)
{
    char p[4300];
    snprintf(p, sizeof p, "%s/%s", tmp, damaged_rank_file);
    unlink(p);
}

static void hook_cut(const char *tmp)
{
    char p[4300];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", tmp, damaged_rank_file);
    if (stat(p, &st) != 0 || truncate(p, st.st_size - 1) != 0)
        fprintf(stderr, "cutting %s failed\n", p);
}

static void hook_grow(const char *tmp)
{
    char p[4300];
    snprintf(p, sizeof p, "%s/%s", tmp, damaged_rank_file);
    FILE *f = fopen(p, "ab");
    if (f != NULL) {
        fputc(0, f);
        fclose(f);
    }
}

/* A rank file removed, cut short or grown between its writer's close and the publication (as
 * another writer's clearing did): publish checks every rank's file against the size its writer
 * wrote and publishes nothing; latest and the previous step stay, no temporary directory is
 * left, and the next save succeeds. */
TEST(publish_refuses_a_rank_file_missing_or_of_another_size)
{
    setup();
    const char *dir = scratch("verify");
    struct run d;
    saved_run(&d, dir, test_config()); /* step 3 */
    run_steps(&d, 4, 4);
    damaged_rank_file = world > 1 ? "rank-00001.safetensors" : "rank-00000.safetensors";
    void (*hooks[])(const char *) = {hook_remove, hook_cut, hook_grow};
    const char *words[] = {"No such file or directory before publishing", "bytes before publishing",
                           "bytes before publishing"};
    for (int i = 0; i < 3; i++) {
        ckpt_test_before_publish = hooks[i];
        EXPECT_EQ_INT(shardopt_save(d.rt, dir), SHARDOPT_ERR_IO);
        EXPECT_STR_CONTAINS(shardopt_last_error(), damaged_rank_file);
        EXPECT_STR_CONTAINS(shardopt_last_error(), words[i]);
        EXPECT_STR_CONTAINS(shardopt_last_error(), "nothing was published");
        ckpt_test_before_publish = NULL;
        if (me == 0) {
            char p[4200];
            snprintf(p, sizeof p, "%s/step-00000004", dir);
            EXPECT_TRUE(!exists(p));
            EXPECT_TRUE(latest_is(dir, "step-00000003"));
            DIR *dd = opendir(dir);
            struct dirent *e;
            int tmps = 0;
            while ((e = readdir(dd)) != NULL)
                tmps += strncmp(e->d_name, ".tmp-", 5) == 0;
            closedir(dd);
            EXPECT_EQ_INT(tmps, 0);
        }
    }
    EXPECT_EQ_INT(shardopt_save(d.rt, dir), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_load(d.rt, dir), SHARDOPT_OK);
    run_free(&d);
    dir_clear(dir);
}

/* Writing latest failing at each point (ckpt.latest counts 1 before the write, 2 the write, 3
 * the fsync, 4 the rename; ENOSPC or EIO): the save fails on every rank with the error, and
 * .latest.tmp is gone (it used to stay). A .latest.tmp that is a symbolic link to a file
 * elsewhere (a crash's leftover replaced by one) is replaced, never written through. */
TEST(a_failure_writing_latest_leaves_no_latest_tmp)
{
    setup();
    const char *dir = scratch("latest");
    struct run d;
    saved_run(&d, dir, test_config()); /* step 3 */
    run_steps(&d, 4, 4);
    const char *specs[] = {"ckpt.latest:1:ENOSPC", "ckpt.latest:2:ENOSPC", "ckpt.latest:3:EIO",
                           "ckpt.latest:4:ENOSPC", "ckpt.latest:2:EDQUOT"};
    const char *words[] = {"No space left on device", "No space left on device",
                           "Input/output error", "No space left on device", "quota exceeded"};
    char p[4200];
    snprintf(p, sizeof p, "%s/.latest.tmp", dir);
    for (int i = 0; i < 5; i++) {
        if (me == 0)
            fault_arm(specs[i]);
        EXPECT_EQ_INT(shardopt_save(d.rt, dir), SHARDOPT_ERR_IO);
        EXPECT_STR_CONTAINS(shardopt_last_error(), words[i]);
        EXPECT_STR_CONTAINS(shardopt_last_error(), "latest still names the previous one");
        fault_arm(NULL);
        if (me == 0) {
            EXPECT_TRUE(!exists(p));
            EXPECT_TRUE(latest_is(dir, "step-00000003"));
        }
    }
    const char *out = outside_make();
    if (me == 0) {
        char q[4200];
        snprintf(q, sizeof q, "%s/file", out);
        ASSERT_TRUE(symlink(q, p) == 0);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    EXPECT_EQ_INT(shardopt_save(d.rt, dir), SHARDOPT_OK);
    if (me == 0) {
        EXPECT_TRUE(outside_intact(out));
        EXPECT_TRUE(latest_is(dir, "step-00000004"));
        snprintf(p, sizeof p, "%s/latest", dir);
        EXPECT_TRUE(!is_link(p));
    }
    EXPECT_EQ_INT(shardopt_load(d.rt, dir), SHARDOPT_OK);
    run_free(&d);
    dir_clear(dir);
    dir_clear(out);
}

/* Offsets of the state kinds (k >= 1) inside a snapshot, for a run of this model. */
static long state_compare(const struct run *a, const unsigned char *snap_a, const struct run *b,
                          int widen_momentum)
{
    size_t off_a = 0;
    long bad = 0;
    for (int p = 0; p < MODEL_NPARAMS; p++)
        for (int k = 0; k < 3; k++) {
            size_t ea, eb;
            const unsigned char *mine = kind_data(b, p, k, &eb);
            if (kind_data(a, p, k, &ea) == NULL)
                continue;
            const int64_t n = a->box[p].numel;
            if (k > 0 && widen_momentum && eb == 4 && ea == 2) {
                for (int64_t i = 0; i < n; i++) {
                    uint16_t h;
                    memcpy(&h, snap_a + off_a + (size_t)i * 2, 2);
                    bad += ((const float *)mine)[i] != f32_from_bf16(h);
                }
            } else if (k > 0) {
                bad += ea != eb || memcmp(snap_a + off_a, mine, (size_t)n * ea) != 0;
            }
            off_a += (size_t)n * ea;
        }
    return bad;
}

TEST(bf16_momentum_stays_bf16_and_converts_when_asked)
{
    setup();
    const char *dir = scratch("dtype");
    shardopt_config_t cfg = test_config();
    cfg.momentum_dtype = SHARDOPT_DTYPE_BF16;
    struct run d;
    unsigned char *saved;
    size_t n;
    saved_run(&d, dir, cfg);
    snapshot(&d, &saved, &n);

    /* the same config: the momentum comes back bf16 (2 bytes), bit for bit */
    struct run e = {0};
    run_setup(&e, MPI_COMM_WORLD, cfg, 0);
    EXPECT_EQ_INT(shardopt_load(e.rt, dir), SHARDOPT_OK);
    EXPECT_EQ_INT(state_compare(&d, saved, &e, 0), 0);
    size_t es;
    kind_data(&e, 2, 1, &es); /* a Muon matrix's momentum */
    EXPECT_EQ_INT(es, 2);
    run_free(&e);

    /* an fp32 config converts once (a warning names the tensors): the same values, widened */
    shardopt_config_t c32 = cfg;
    c32.momentum_dtype = SHARDOPT_DTYPE_FP32;
    struct run f = {0};
    run_setup(&f, MPI_COMM_WORLD, c32, 0);
    EXPECT_EQ_INT(shardopt_load(f.rt, dir), SHARDOPT_OK);
    EXPECT_EQ_INT(state_compare(&d, saved, &f, 1), 0);
    kind_data(&f, 2, 1, &es);
    EXPECT_EQ_INT(es, 4);
    run_free(&f);
    free(saved);
    run_free(&d);
    dir_clear(dir);
}

/* ---- ckpt_weights: the parameters in the checkpoint ---- */

/* This rank's parameter shards, back to back. */
static unsigned char *params_copy(const struct run *r, size_t *len)
{
    size_t total = 0, es;
    for (int p = 0; p < MODEL_NPARAMS; p++)
        total += (size_t)r->box[p].numel * model_esize(model_params[p].dtype);
    unsigned char *out = malloc(total + 1);
    *len = 0;
    for (int p = 0; p < MODEL_NPARAMS; p++) {
        const void *src = kind_data(r, p, 0, &es);
        memcpy(out + *len, src, (size_t)r->box[p].numel * es);
        *len += (size_t)r->box[p].numel * es;
    }
    return out;
}

static void damage_nothing(const char *step) { (void)step; }

static void edit_drop_weight(cJSON *root)
{
    cJSON *tensors = cJSON_GetObjectItem(root, "tensors"), *t;
    int i = 0;
    cJSON_ArrayForEach(t, tensors)
    {
        if (strcmp(cJSON_GetObjectItem(t, "name")->valuestring, "lm_head.weight") == 0) {
            cJSON_DeleteItemFromArray(tensors, i);
            return;
        }
        i++;
    }
}
static void damage_drop_weight(const char *step) { index_edit(step, edit_drop_weight); }

/* The same checkpoint without "weights" (format_version 3 and later say it must have it). */
static void edit_weights_key(cJSON *root) { cJSON_DeleteItemFromObject(root, "weights"); }
static void damage_weights_key(const char *step) { index_edit(step, edit_weights_key); }

/* Saved with ckpt_weights, 2 more steps taken, loaded: parameters and state are those saved, bit
 * for bit (the index is version 3, the parameters' tensors named as they are). With ckpt_weights
 * off the same checkpoint restores the state alone and the parameters keep their values. */
TEST(ckpt_weights_restores_the_parameters_and_off_leaves_them)
{
    setup();
    const char *dir = scratch("weights");
    shardopt_config_t cfg = test_config();
    cfg.ckpt_weights = 1;
    struct run d;
    unsigned char *saved, *now, *before;
    size_t n, m, nb;
    saved_run(&d, dir, cfg);
    snapshot(&d, &saved, &n);
    if (me == 0) {
        char p[4300];
        size_t len;
        snprintf(p, sizeof p, "%s/step-00000003/index.json", dir);
        char *text = file_slurp(p, &len);
        EXPECT_STR_CONTAINS(text, "\"format_version\":4,\"weights\":true");
        EXPECT_STR_CONTAINS(text, "{\"name\":\"lm_head.weight\",\"param\":\"lm_head.weight\"");
        free(text);
    }
    run_steps(&d, 4, 5);
    EXPECT_EQ_INT(shardopt_load(d.rt, dir), SHARDOPT_OK);
    snapshot(&d, &now, &m);
    EXPECT_TRUE(n == m && memcmp(saved, now, n) == 0);
    free(now);

    run_steps(&d, 4, 4);
    before = params_copy(&d, &nb);
    d.rt->cfg.ckpt_weights = 0;
    EXPECT_EQ_INT(shardopt_load(d.rt, dir), SHARDOPT_OK);
    now = params_copy(&d, &m);
    EXPECT_TRUE(nb == m && memcmp(before, now, nb) == 0);
    EXPECT_EQ_INT(state_compare(&d, saved, &d, 0), 0);
    free(now);
    free(before);
    free(saved);
    run_free(&d);
    dir_clear(dir);
}

/* A weights load refused, whatever the reason, changes no parameter and no state on any rank:
 * a checkpoint without weights (ERR_MISMATCH naming it), a flipped byte in a weight's data, a
 * weight missing from an index that promises them, and a version-3 index without "weights". */
TEST(a_refused_weights_load_leaves_parameters_and_state_unchanged)
{
    setup();
    const char *dir = scratch("weights_refused");
    struct {
        int save_weights;
        void (*damage)(const char *);
        shardopt_status_t status;
        const char *w1, *w2;
    } cases[] = {
        {0, damage_nothing, SHARDOPT_ERR_MISMATCH,
         "ckpt_weights = true and the checkpoint holds "
         "no weights",
         "ckpt_weights = false"},
        /* the last bytes of rank 0's file: its last tensor, lm_head's weight */
        {1, damage_flip, SHARDOPT_ERR_CORRUPT, "tensor 'lm_head.weight'", "CRC32C mismatch"},
        {1, damage_drop_weight, SHARDOPT_ERR_CORRUPT,
         "\"weights\": true and parameter 'lm_head.weight' has no tensor of its own name", NULL},
        {1, damage_weights_key, SHARDOPT_ERR_CORRUPT, "format_version 4 and no \"weights\"", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct run d;
        shardopt_config_t cfg = test_config();
        cfg.ckpt_weights = cases[i].save_weights;
        saved_run(&d, dir, cfg);
        d.rt->cfg.ckpt_weights = 1; /* the load asks for weights */
        expect_refused(&d, dir, cases[i].damage, cases[i].status, cases[i].w1, cases[i].w2);
        run_free(&d);
    }
    dir_clear(dir);
}

/* ckpt_weights and a parameter named as another's state tensor ("x.momentum" beside a Muon "x"):
 * two tensors of one name, which every load would refuse. The save is refused on every rank
 * before anything is written; without ckpt_weights the same model saves. */
TEST(ckpt_weights_refuses_a_parameter_named_as_a_state_tensor)
{
    setup();
    const char *dir = scratch("weights_names");
    for (int weights = 1; weights >= 0; weights--) {
        shardopt_config_t cfg = test_config();
        cfg.ckpt_weights = weights;
        shardopt_runtime_t rt;
        float w[2][64], g[2][64];
        memset(w, 0, sizeof w);
        memset(g, 0, sizeof g);
        dir_clear(dir);
        ASSERT_EQ_INT(shardopt_init(MPI_COMM_WORLD, &cfg, &rt), SHARDOPT_OK);
        const char *names[2] = {"x", "x.momentum"};
        for (int i = 0; i < 2; i++) {
            shardopt_param_desc_t d = SHARDOPT_PARAM_DESC_INIT;
            d.name = names[i];
            d.ndim = 2;
            d.shape[0] = 8, d.shape[1] = 8;
            d.algo = SHARDOPT_ALGO_MUON;
            EXPECT_EQ_INT(shardopt_shard_range(rt, &d, &d.shard_offset, &d.shard_length, NULL),
                          SHARDOPT_OK);
            d.data = w[i];
            d.grad = g[i];
            shardopt_param_t h;
            EXPECT_EQ_INT(shardopt_register(rt, &d, &h), SHARDOPT_OK);
        }
        EXPECT_EQ_INT(shardopt_commit(rt), SHARDOPT_OK);
        const shardopt_status_t st = shardopt_save(rt, dir);
        if (weights) {
            struct stat sb;
            EXPECT_EQ_INT(st, SHARDOPT_ERR_INVALID_ARGUMENT);
            EXPECT_STR_CONTAINS(shardopt_last_error(),
                                "parameter 'x.momentum' has the name of parameter 'x''s momentum");
            EXPECT_TRUE(stat(dir, &sb) != 0); /* nothing written, not even the directory */
        } else {
            EXPECT_EQ_INT(st, SHARDOPT_OK);
        }
        shardopt_finalize(rt);
    }
    dir_clear(dir);
}

/* A parameter renamed since the save ("old.bias" saved, "new.bias" registered), loaded with
 * load_allow_missing: the load succeeds and new.bias keeps its fresh state, but rank 0's log says
 * so, naming both sides and counting them (before: nothing was said, and the old state was lost
 * without a word). A load where everything matches says nothing. */
static shardopt_runtime_t two_params(const char *bias, int allow_missing, float *w, float *b,
                                     const float *g)
{
    shardopt_config_t cfg = test_config();
    cfg.load_allow_missing = allow_missing;
    shardopt_runtime_t rt = fixture_runtime_on(MPI_COMM_WORLD, &cfg);
    shardopt_param_desc_t d = fixture_desc("keep.weight", 2, 8, 4, 1, w, g);
    d.placement = SHARDOPT_PLACEMENT_REPLICATED;
    shardopt_param_t h;
    shardopt_register(rt, &d, &h);
    d = fixture_desc(bias, 1, 4, 1, 1, b, g);
    d.placement = SHARDOPT_PLACEMENT_REPLICATED;
    shardopt_register(rt, &d, &h);
    if (shardopt_commit(rt) != SHARDOPT_OK)
        fprintf(stderr, "commit: %s\n", shardopt_last_error());
    return rt;
}

TEST(a_parameter_renamed_since_the_save_is_named_when_allow_missing_keeps_it)
{
    setup();
    const char *dir = scratch("renamed"), *log = scratch("renamed.log");
    float w[32], b[4], g[32];
    for (int i = 0; i < 32; i++)
        w[i] = g[i] = 0.01f * (float)(i + 1);
    memcpy(b, w, sizeof b);
    dir_clear(dir);
    shardopt_runtime_t rt = two_params("old.bias", 0, w, b, g);
    shardopt_step_args_t a = SHARDOPT_STEP_ARGS_INIT;
    a.lr = 0.01;
    ASSERT_EQ_INT(shardopt_step(rt, &a), SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_save(rt, dir), SHARDOPT_OK);
    shardopt_finalize(rt);

    const char *cases[2] = {"new.bias", "old.bias"}; /* renamed, then as saved */
    for (int c = 0; c < 2; c++) {
        rt = two_params(cases[c], 1, w, b, g);
        MPI_Barrier(MPI_COMM_WORLD);
        const int saved = me == 0 ? stderr_to(log) : -1;
        const shardopt_status_t st = shardopt_load(rt, dir);
        if (me == 0)
            stderr_back(saved);
        EXPECT_EQ_INT(st, SHARDOPT_OK);
        shardopt_stats_t stats = SHARDOPT_STATS_INIT; /* the counts, on every rank */
        shardopt_get_stats(rt, &stats);
        EXPECT_EQ_INT(stats.load_kept_tensors, c == 0 ? 2 : 0);
        EXPECT_EQ_INT(stats.load_unused_params, c == 0 ? 1 : 0);
        if (me == 0) {
            char *text = text_of(log);
            if (c == 0) {
                EXPECT_STR_CONTAINS(text, "warn");
                EXPECT_STR_CONTAINS(text, "2 tensor(s) of registered parameters are not in the "
                                          "checkpoint and keep their current values "
                                          "(load_allow_missing): new.bias.exp_avg, "
                                          "new.bias.exp_avg_sq; 1 parameter(s) of the checkpoint "
                                          "match no registered parameter and were not loaded: "
                                          "old.bias");
                EXPECT_STR_CONTAINS(text, "register it under its saved name");
            } else {
                EXPECT_TRUE(strstr(text, "not in the checkpoint") == NULL);
                EXPECT_TRUE(strstr(text, "match no registered parameter") == NULL);
            }
            free(text);
            unlink(log);
        }
        shardopt_finalize(rt);
    }
    dir_clear(dir);
}

/* A checkpoint whose exp_avg_sq holds a negative value with every CRC matching (written by a save
 * here: the test puts -1 into the store behind the library's back, as a foreign or damaged writer
 * would). Before: loaded, and the next step returned OK with the tensor's weights NaN. */
TEST(a_negative_second_moment_in_a_checkpoint_is_refused)
{
    setup();
    const char *dir = scratch("negative_v");
    struct run d;
    dir_clear(dir);
    memset(&d, 0, sizeof d);
    ASSERT_EQ_INT(run_setup(&d, MPI_COMM_WORLD, test_config(), 0), SHARDOPT_OK);
    ASSERT_EQ_INT(run_steps(&d, 1, 2), SHARDOPT_OK);
    int p = -1; /* the first AdamW tensor this rank holds elements of, in fp32 state */
    for (int i = 0; i < MODEL_NPARAMS && p < 0; i++)
        if (d.h[i]->algo == SHARDOPT_ALGO_ADAMW && d.box[i].numel > 1 &&
            d.rt->cfg.adam_v_dtype == SHARDOPT_DTYPE_FP32)
            p = i;
    size_t es;
    float *v = p >= 0 ? (float *)kind_data(&d, p, 2, &es) : NULL;
    float saved = 0;
    if (v != NULL && me == world - 1) {
        saved = v[1];
        v[1] = -1.0f;
    }
    ASSERT_EQ_INT(shardopt_save(d.rt, dir), SHARDOPT_OK);
    if (v != NULL && me == world - 1)
        v[1] = saved;
    unsigned char *before, *after;
    size_t nb, na;
    snapshot(&d, &before, &nb);
    const shardopt_status_t st = shardopt_load(d.rt, dir);
    EXPECT_EQ_INT(st, SHARDOPT_ERR_CORRUPT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), ".exp_avg_sq': element ");
    EXPECT_STR_CONTAINS(shardopt_last_error(), "is -1: a second moment is never negative");
    snapshot(&d, &after, &na);
    EXPECT_TRUE(na == nb && memcmp(before, after, nb) == 0);
    free(before);
    free(after);
    run_free(&d);
    dir_clear(dir);
}

int test_main(int argc, char **argv);
extern int test_quiet;

/* A mode replaces the tests (see the top of the file); without one, the tests run. */
int main(int argc, char **argv)
{
    int rc, failed;
    MPI_Init(&argc, &argv);
    setup();
    test_quiet = me != 0;
    const char *mode = getenv("SHARDOPT_TEST_MODE");
    if (mode == NULL) {
        scratch_begin();
        rc = test_main(argc, argv);
        scratch_end();
    } else if (strcmp(mode, "save") == 0)
        rc = mode_save(5);
    else if (strcmp(mode, "crash") == 0)
        rc = mode_save(8);
    else if (strcmp(mode, "resume") == 0)
        rc = mode_resume();
    else {
        fprintf(stderr, "SHARDOPT_TEST_MODE=%s: accepted save, crash, resume\n", mode);
        rc = 2;
    }
    failed = rc != 0;
    MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Finalize();
    return failed;
}

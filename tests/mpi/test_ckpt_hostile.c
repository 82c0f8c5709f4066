/* Checkpoint directories a hostile user or a broken cluster leaves, beyond test_ckpt.c's single
 * damages: rank files swapped or duplicated, an index naming a tensor twice, a momentum dtype the
 * index records otherwise than the file holds (the project began from a bf16 momentum that came
 * back as fp32), offsets past the tensor's end, huge counts, a parameter's algorithm changed,
 * links that loop. Every load must be refused on every rank with the same status, naming the
 * file and the tensor, with the state as it was: the run then steps on to the same bits as a run
 * that never tried the load (nothing lost). Saves: a FIFO planted in the save's temporary
 * directory fails the save at once (its open waited for a reader for good), and, where this
 * process may mount (root in a container that allows it), a full filesystem and a read-only one
 * fail the save with the previous checkpoint loadable. Layout: dp_shard over the world (2). */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/crc32c.h"
#include "model_run.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/checkpoint_index.h"

static shardopt_config_t cfg_of(int bf16)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    cfg.num_threads = 1;
    if (bf16)
        cfg.momentum_dtype = SHARDOPT_DTYPE_BF16;
    return cfg;
}

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

static char *slurp(const char *path, size_t *len)
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

static void put(const char *path, const char *bytes, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(bytes, 1, n, f) != n)
        fprintf(stderr, "write of %s failed\n", path);
    if (f != NULL)
        fclose(f);
}

/* Rewrite step/file through a JSON edit, its integrity record following: what is refused is the
 * content, not a CRC. */
static void json_edit(const char *step, const char *file, void (*edit)(cJSON *))
{
    char p[4300], line[16];
    size_t n;
    snprintf(p, sizeof p, "%s/%s", step, file);
    char *text = slurp(p, &n);
    cJSON *root = text != NULL ? cJSON_Parse(text) : NULL;
    if (root == NULL) {
        fprintf(stderr, "json_edit: %s unreadable\n", p);
        free(text);
        return;
    }
    edit(root);
    char *out = cJSON_PrintUnformatted(root);
    put(p, out, strlen(out));
    snprintf(p, sizeof p, "%s/%s.crc32c", step, file);
    snprintf(line, sizeof line, "%08x\n", crc32c_update(0, out, strlen(out)));
    put(p, line, strlen(line));
    free(out);
    free(text);
    cJSON_Delete(root);
}

static void path_of(char *p, size_t n, const char *step, const char *file)
{
    snprintf(p, n, "%s/%s", step, file);
}

/* ---- the damages ---- */

static void swap_files(const char *step, const char *a, const char *b)
{
    char pa[4300], pb[4300], pt[4300];
    path_of(pa, sizeof pa, step, a);
    path_of(pb, sizeof pb, step, b);
    path_of(pt, sizeof pt, step, "swap.tmp");
    if (rename(pa, pt) != 0 || rename(pb, pa) != 0 || rename(pt, pb) != 0)
        fprintf(stderr, "swap %s %s failed\n", a, b);
}
static void damage_swap_rank_files(const char *step)
{
    swap_files(step, "rank-00000.safetensors", "rank-00001.safetensors");
}
/* the whole writer swapped: rank file, its index and the index's record */
static void damage_swap_writers(const char *step)
{
    damage_swap_rank_files(step);
    swap_files(step, "rank-00000.index.json", "rank-00001.index.json");
    swap_files(step, "rank-00000.index.json.crc32c", "rank-00001.index.json.crc32c");
}
static void copy_file(const char *step, const char *from, const char *to)
{
    char pf[4300], pt[4300];
    size_t n;
    path_of(pf, sizeof pf, step, from);
    path_of(pt, sizeof pt, step, to);
    char *text = slurp(pf, &n);
    if (text != NULL)
        put(pt, text, n);
    free(text);
}
static void damage_dup_rank_file(const char *step)
{
    copy_file(step, "rank-00000.safetensors", "rank-00001.safetensors");
}
static void damage_dup_writer(const char *step)
{
    damage_dup_rank_file(step);
    copy_file(step, "rank-00000.index.json", "rank-00001.index.json");
    copy_file(step, "rank-00000.index.json.crc32c", "rank-00001.index.json.crc32c");
}

/* index.json's first momentum tensor recorded in the other dtype */
static void momentum_dtype_flip(cJSON *root)
{
    cJSON *t;
    cJSON_ArrayForEach(t, cJSON_GetObjectItem(root, "tensors"))
    {
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(t, "name"));
        const char *dt = cJSON_GetStringValue(cJSON_GetObjectItem(t, "dtype"));
        if (name != NULL && dt != NULL && strstr(name, ".momentum") != NULL) {
            cJSON_ReplaceItemInObject(t, "dtype",
                                      cJSON_CreateString(strcmp(dt, "BF16") == 0 ? "F32" : "BF16"));
            return;
        }
    }
}
static void damage_momentum_dtype(const char *step)
{
    json_edit(step, "index.json", momentum_dtype_flip);
}
static void tensor_twice(cJSON *root)
{
    cJSON *ts = cJSON_GetObjectItem(root, "tensors");
    cJSON_AddItemToArray(ts, cJSON_Duplicate(cJSON_GetArrayItem(ts, 0), 1));
}
static void damage_tensor_twice(const char *step) { json_edit(step, "index.json", tensor_twice); }
static void shard_twice(cJSON *root)
{
    cJSON *ss = cJSON_GetObjectItem(root, "shards");
    cJSON_AddItemToArray(ss, cJSON_Duplicate(cJSON_GetArrayItem(ss, 0), 1));
}
static void damage_shard_twice(const char *step)
{
    json_edit(step, "rank-00001.index.json", shard_twice);
}
static void first_shard_set(cJSON *root, const char *key, double v0)
{
    cJSON *s = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "shards"), 0);
    cJSON *a = cJSON_GetObjectItem(s, key);
    cJSON_ReplaceItemInArray(a, 0, cJSON_CreateNumber(v0));
}
static void offset_past_end(cJSON *root) { first_shard_set(root, "offset", 4096); }
static void damage_offset_past_end(const char *step)
{
    json_edit(step, "rank-00001.index.json", offset_past_end);
}
static void shape_huge(cJSON *root) { first_shard_set(root, "shape", 1099511627776.0); }
static void damage_shape_huge(const char *step)
{
    json_edit(step, "rank-00001.index.json", shape_huge);
}
static void writers_huge(cJSON *root)
{
    cJSON_ReplaceItemInObject(root, "writers", cJSON_CreateNumber(2147483648.0));
}
static void damage_writers_huge(const char *step) { json_edit(step, "index.json", writers_huge); }
static void ranks_huge(cJSON *root)
{
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(root, "layout"), "ranks",
                              cJSON_CreateNumber(1e18));
}
static void damage_ranks_huge(const char *step) { json_edit(step, "index.json", ranks_huge); }
/* a Muon parameter recorded as AdamW: its momentum would be taken for exp_avg */
static void algo_flip(cJSON *root)
{
    cJSON *p;
    cJSON_ArrayForEach(p, cJSON_GetObjectItem(root, "params"))
    {
        const char *a = cJSON_GetStringValue(cJSON_GetObjectItem(p, "algo"));
        if (a != NULL && strcmp(a, "muon") == 0) {
            cJSON_ReplaceItemInObject(p, "algo", cJSON_CreateString("adamw"));
            return;
        }
    }
}
static void damage_algo(const char *step) { json_edit(step, "index.json", algo_flip); }
/* a parameter record whose name holds an escape sequence (JSON's \u001b) and whose algo, shape
 * or shape is refused, or that is listed twice: the refusal quotes the name escaped */
static void param_bad(cJSON *root, const char *key, cJSON *value)
{
    cJSON *p = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "params"), 0);
    cJSON_ReplaceItemInObject(p, "name", cJSON_CreateString("\x1b[2Jw\r"));
    cJSON_ReplaceItemInObject(p, key, value);
}
static void param_algo_esc(cJSON *root) { param_bad(root, "algo", cJSON_CreateString("sgd")); }
static void damage_param_algo_esc(const char *step)
{
    json_edit(step, "index.json", param_algo_esc);
}
static void param_shape_esc(cJSON *root) { param_bad(root, "shape", cJSON_CreateString("x")); }
static void damage_param_shape_esc(const char *step)
{
    json_edit(step, "index.json", param_shape_esc);
}
static void param_twice_esc(cJSON *root)
{
    cJSON *ps = cJSON_GetObjectItem(root, "params");
    cJSON_ReplaceItemInObject(cJSON_GetArrayItem(ps, 0), "name", cJSON_CreateString("\x1b[2Jw"));
    cJSON_AddItemToArray(ps, cJSON_Duplicate(cJSON_GetArrayItem(ps, 0), 1));
}
static void damage_param_twice_esc(const char *step)
{
    json_edit(step, "index.json", param_twice_esc);
}

/* index.json's first tensor of another shape than its parameter, of a dtype no save writes */
static void tensor_shape(cJSON *root)
{
    cJSON *t = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "tensors"), 0);
    cJSON_ReplaceItemInArray(cJSON_GetObjectItem(t, "shape"), 0, cJSON_CreateNumber(7));
}
static void damage_tensor_shape(const char *step) { json_edit(step, "index.json", tensor_shape); }
static void tensor_dtype(cJSON *root)
{
    cJSON *t = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "tensors"), 0);
    cJSON_ReplaceItemInObject(t, "dtype", cJSON_CreateString("F16"));
}
static void damage_tensor_dtype(const char *step) { json_edit(step, "index.json", tensor_dtype); }
/* a file replaced by a link to itself */
static void loop_at(const char *step, const char *file)
{
    char p[4300];
    path_of(p, sizeof p, step, file);
    if (unlink(p) != 0 || symlink(file, p) != 0)
        fprintf(stderr, "symlink failed\n");
}
static void damage_index_loop(const char *step) { loop_at(step, "index.json"); }
static void damage_step_loop(const char *step)
{
    char cmd[4400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && ln -s step-00000003 '%s'", step, step);
    if (system(cmd) != 0)
        fprintf(stderr, "step loop failed\n");
}
static void damage_rank_file_loop(const char *step) { loop_at(step, "rank-00001.safetensors"); }

/* Save 3 steps in dir, step 4, damage (rank 0), load: refused with `want` on every rank, the
 * message naming w1 and w2, the state as it was; then step 5, bitwise as a run of steps 1-5 that
 * never saved nor loaded. */
static void expect_refused(const char *dir, int bf16, void (*damage)(const char *), const char *w1,
                           const char *w2)
{
    struct run d = {0}, twin = {0};
    unsigned char *before, *after, *want;
    size_t nb, na, nw;
    char step[4200];
    dir_clear(dir);
    snprintf(step, sizeof step, "%s/step-00000003", dir);
    run_setup(&d, MPI_COMM_WORLD, cfg_of(bf16), 0);
    run_steps(&d, 1, 3);
    if (shardopt_save(d.rt, dir) != SHARDOPT_OK) {
        EXPECT_STR_CONTAINS(shardopt_last_error(), "(the first save succeeds)");
        run_free(&d);
        return;
    }
    if (me == 0)
        damage(step);
    MPI_Barrier(MPI_COMM_WORLD);
    run_steps(&d, 4, 4);
    snapshot(&d, &before, &nb);
    const shardopt_status_t s = shardopt_load(d.rt, dir);
    int st[2] = {(int)s, -(int)s};
    MPI_Allreduce(MPI_IN_PLACE, st, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    EXPECT_TRUE(s != SHARDOPT_OK);
    EXPECT_TRUE(st[0] == -st[1]); /* the same status on every rank */
    EXPECT_STR_CONTAINS(shardopt_last_error(), w1);
    if (w2 != NULL)
        EXPECT_STR_CONTAINS(shardopt_last_error(), w2);
    /* what came from the files is shown escaped: a raw ESC or CR would hide part of it */
    for (const char *c = shardopt_last_error(); *c != '\0'; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f) {
            EXPECT_TRUE(!"a control character in the message");
            break;
        }
    if (me == 0 && getenv("SHARDOPT_TEST_SHOW") != NULL)
        fprintf(stderr, "refused (%d): %s\n", (int)s, shardopt_last_error());
    snapshot(&d, &after, &na);
    EXPECT_TRUE(na == nb && memcmp(before, after, nb) == 0);
    /* nothing lost: the next step is the step that run would have taken */
    EXPECT_EQ_INT(run_steps(&d, 5, 5), SHARDOPT_OK);
    run_setup(&twin, MPI_COMM_WORLD, cfg_of(bf16), 0);
    run_steps(&twin, 1, 5);
    free(after);
    snapshot(&d, &after, &na);
    snapshot(&twin, &want, &nw);
    EXPECT_TRUE(na == nw && memcmp(want, after, nw) == 0);
    free(before);
    free(after);
    free(want);
    run_free(&twin);
    run_free(&d);
}

TEST(tampered_directories_are_refused_on_every_rank_and_the_run_steps_on)
{
    setup();
    const char *dir = "/tmp/shardopt_ckpt_hostile";
    struct {
        void (*damage)(const char *);
        int bf16;
        const char *w1, *w2;
    } cases[] = {
        {damage_swap_rank_files, 0, "rank-0000", ".safetensors"},
        {damage_swap_writers, 0, "rank-0000", "\"writer\" is "},
        {damage_dup_rank_file, 0, "rank-00001.safetensors", NULL},
        {damage_dup_writer, 0, "rank-00001.index.json", NULL},
        {damage_momentum_dtype, 1, ".momentum", "BF16"},
        {damage_momentum_dtype, 0, ".momentum", "F32"},
        {damage_tensor_twice, 0, "model.embed_tokens.weight", "twice"},
        {damage_shard_twice, 0, "rank-00001.index.json", "model.embed_tokens.weight"},
        {damage_offset_past_end, 0, "rank-00001.index.json",
         "(dim 0: offset 4096 + shape 32 > 64)"},
        {damage_shape_huge, 0, "rank-00001.index.json", "offset 32 + shape 1099511627776 > 64"},
        {damage_writers_huge, 0, "index.json",
         "\"writers\" is 2147483648, not the layout's dense ranks (ranks 2 / dp_replicate 1 = 2)"},
        {damage_ranks_huge, 0, "index.json", "number '1e+18'"},
        {damage_algo, 0, "index.json",
         "(parameter 'layers.0.attn.q_proj.weight' is adamw: its state is '<name>.exp_avg'"},
        {damage_param_algo_esc, 0, "index.json", "parameter '\\x1b[2Jw\\r'"},
        {damage_param_shape_esc, 0, "index.json", "parameter '\\x1b[2Jw\\r'"},
        {damage_param_twice_esc, 0, "index.json", "parameter '\\x1b[2Jw' is listed twice"},
        {damage_tensor_shape, 0, "index.json",
         "shape [7, 16] differs from its parameter's [64, 16]"},
        {damage_tensor_dtype, 0, "index.json", "dtype 'F16' is not F32 or BF16"},
        {damage_index_loop, 0, "index.json", "Too many levels of symbolic links"},
        {damage_step_loop, 0, "step-00000003", "Too many levels of symbolic links"},
        {damage_rank_file_loop, 0, "rank-00001.safetensors", "Too many levels of symbolic links"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        expect_refused(dir, cases[i].bf16, cases[i].damage, cases[i].w1, cases[i].w2);
    dir_clear(dir);
}

/* Saved with a parameter on Muon, loaded where adamw_patterns puts it on AdamW: its state has
 * other names there. Refused on every rank saying so (before: only that 'x.exp_avg' is not in
 * the checkpoint), the state unchanged, the run steps on. */
TEST(a_checkpoint_of_another_algorithm_is_refused_naming_both)
{
    setup();
    const char *dir = "/tmp/shardopt_ckpt_hostile_algo";
    struct run d = {0}, e = {0};
    unsigned char *before, *after;
    size_t nb, na;
    dir_clear(dir);
    run_setup(&d, MPI_COMM_WORLD, cfg_of(0), 0);
    run_steps(&d, 1, 3);
    EXPECT_EQ_INT(shardopt_save(d.rt, dir), SHARDOPT_OK);
    run_free(&d);
    shardopt_config_t cfg = cfg_of(0);
    snprintf(cfg.adamw_patterns, sizeof cfg.adamw_patterns, "%s,=layers.0.attn.q_proj.weight",
             SHARDOPT_DEFAULT_ADAMW_PATTERNS);
    run_setup(&e, MPI_COMM_WORLD, cfg, 0);
    run_steps(&e, 1, 4);
    snapshot(&e, &before, &nb);
    EXPECT_EQ_INT(shardopt_load(e.rt, dir), SHARDOPT_ERR_MISMATCH);
    EXPECT_STR_CONTAINS(shardopt_last_error(),
                        "tensor 'layers.0.attn.q_proj.weight.exp_avg' of parameter "
                        "'layers.0.attn.q_proj.weight' is not in the checkpoint; the checkpoint "
                        "holds parameter 'layers.0.attn.q_proj.weight' as muon");
    EXPECT_STR_CONTAINS(shardopt_last_error(), "this runtime steps it with adamw");
    snapshot(&e, &after, &na);
    EXPECT_TRUE(na == nb && memcmp(before, after, nb) == 0);
    EXPECT_EQ_INT(run_steps(&e, 5, 5), SHARDOPT_OK);
    free(before);
    free(after);
    run_free(&e);
    dir_clear(dir);
}

/* ---- saves ---- */

static const char *plant_dir;
static int plant_done;

/* The save's temporary directory under plant_dir (rank 0 made it before any writer runs). */
static int tmp_dir_find(char *out, size_t n)
{
    DIR *d = opendir(plant_dir);
    struct dirent *e;
    int found = 0;
    while (d != NULL && (e = readdir(d)) != NULL)
        if (strncmp(e->d_name, ".tmp-step-", 10) == 0) {
            snprintf(out, n, "%s/%s", plant_dir, e->d_name);
            found = 1;
        }
    if (d != NULL)
        closedir(d);
    return found;
}

/* a FIFO where this writer's index is about to be created (no process reads it) */
static void plant_writer_index_fifo(void)
{
    char tmp[4200], p[4300];
    if (plant_done || !tmp_dir_find(tmp, sizeof tmp))
        return;
    plant_done = 1;
    snprintf(p, sizeof p, "%s/rank-%05d.index.json", tmp, me);
    if (mkfifo(p, 0644) != 0)
        fprintf(stderr, "mkfifo %s: %s\n", p, strerror(errno));
}

/* a FIFO where rank 0 is about to write index.json */
static void plant_index_fifo(const char *tmp)
{
    char p[4300];
    snprintf(p, sizeof p, "%s/index.json", tmp);
    if (mkfifo(p, 0644) != 0)
        fprintf(stderr, "mkfifo %s: %s\n", p, strerror(errno));
}

static void expect_previous_loads(struct run *d, const char *dir)
{
    char p[4200];
    snprintf(p, sizeof p, "%s/latest", dir);
    size_t n;
    char *latest = me == 0 ? slurp(p, &n) : NULL;
    if (me == 0)
        EXPECT_TRUE(latest != NULL && strncmp(latest, "step-00000003", 13) == 0);
    free(latest);
    EXPECT_EQ_INT(shardopt_load(d->rt, dir), SHARDOPT_OK);
    if (me == 0) { /* no temporary directory left behind */
        const char *saved = plant_dir;
        plant_dir = dir;
        EXPECT_TRUE(!tmp_dir_find(p, sizeof p));
        plant_dir = saved;
    }
}

TEST(a_fifo_planted_in_the_temporary_directory_fails_the_save_at_once)
{
    setup();
    const char *dir = "/tmp/shardopt_ckpt_hostile_fifo";
    struct run d = {0};
    dir_clear(dir);
    run_setup(&d, MPI_COMM_WORLD, cfg_of(0), 0);
    run_steps(&d, 1, 3);
    if (shardopt_save(d.rt, dir) != SHARDOPT_OK) {
        EXPECT_STR_CONTAINS(shardopt_last_error(), "(the first save succeeds)");
        run_free(&d);
        return;
    }
    run_steps(&d, 4, 4);
    alarm(120); /* a blocking open waits for a reader for good: fail rather than hang */
    /* a writer's index (rank 1's: the message reaches every rank) */
    plant_dir = dir;
    plant_done = 0;
    if (me == world - 1)
        ckpt_index_test_probe = plant_writer_index_fifo;
    EXPECT_EQ_INT(shardopt_save(d.rt, dir), SHARDOPT_ERR_IO);
    ckpt_index_test_probe = NULL;
    EXPECT_STR_CONTAINS(shardopt_last_error(), ".index.json: No such device or address");
    EXPECT_STR_CONTAINS(shardopt_last_error(), "not a plain file");
    expect_previous_loads(&d, dir);
    /* the top-level index, written by rank 0 once the writers are done */
    run_steps(&d, 4, 4);
    if (me == 0)
        ckpt_test_before_publish = plant_index_fifo;
    EXPECT_EQ_INT(shardopt_save(d.rt, dir), SHARDOPT_ERR_IO);
    ckpt_test_before_publish = NULL;
    EXPECT_STR_CONTAINS(shardopt_last_error(), "/index.json: No such device or address");
    expect_previous_loads(&d, dir);
    alarm(0);
    run_free(&d);
    dir_clear(dir);
}

/* A path through a regular file (ENOTDIR): refused on every rank, nothing created. */
TEST(a_save_under_a_regular_file_is_refused_on_every_rank)
{
    setup();
    const char *file = "/tmp/shardopt_ckpt_hostile_file";
    struct run d = {0};
    if (me == 0)
        put(file, "x", 1);
    MPI_Barrier(MPI_COMM_WORLD);
    run_setup(&d, MPI_COMM_WORLD, cfg_of(0), 0);
    run_steps(&d, 1, 1);
    EXPECT_EQ_INT(shardopt_save(d.rt, "/tmp/shardopt_ckpt_hostile_file/ckpt"), SHARDOPT_ERR_IO);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "shardopt_ckpt_hostile_file/ckpt");
    EXPECT_STR_CONTAINS(shardopt_last_error(), "Not a directory");
    EXPECT_EQ_INT(shardopt_load(d.rt, "/tmp/shardopt_ckpt_hostile_file/ckpt"), SHARDOPT_ERR_IO);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "Not a directory");
    EXPECT_EQ_INT(run_steps(&d, 2, 2), SHARDOPT_OK);
    run_free(&d);
    MPI_Barrier(MPI_COMM_WORLD);
    if (me == 0)
        unlink(file);
}

static void full_and_read_only(const char *mnt);

/* Rank 0 alone, on a tmpfs of its own (unmounted at the end, and at the start if a killed run
 * left it): too small for a second save (ENOSPC), then remounted read-only (EROFS, which stops
 * root where chmod does not). A note and nothing more where this process may not mount. */
TEST(a_full_or_read_only_filesystem_fails_the_save_and_keeps_the_previous)
{
    setup();
    const char *mnt = "/tmp/shardopt_ckpt_hostile_mnt";
    int can = 0, err = 0;
    if (me == 0) {
        umount2(mnt, MNT_DETACH); /* a killed run's */
        mkdir(mnt, 0755);
        can = mount("tmpfs", mnt, "tmpfs", MS_NOSUID | MS_NODEV, "size=96k") == 0;
        err = errno;
        if (!can)
            fprintf(stderr,
                    "note: cannot mount a tmpfs at %s (%s): the full and read-only "
                    "filesystem probes did not run\n",
                    mnt, strerror(err));
    }
    if (me == 0 && !can)
        EXPECT_TRUE(err == EPERM || err == EACCES || err == ENODEV); /* not allowed here */
    if (me == 0 && can) {
        full_and_read_only(mnt);
        umount2(mnt, MNT_DETACH);
    }
    /* every rank learns whether rank 0's probe passed (a rank that checked nothing fails) */
    int failures = test_failures;
    MPI_Bcast(&failures, 1, MPI_INT, 0, MPI_COMM_WORLD);
    EXPECT_EQ_INT(failures, 0);
}

static void full_and_read_only(const char *mnt)
{
    struct run d = {0};
    run_setup(&d, MPI_COMM_SELF, cfg_of(0), 0);
    run_steps(&d, 1, 3);
    if (shardopt_save(d.rt, mnt) != SHARDOPT_OK) {
        EXPECT_STR_CONTAINS(shardopt_last_error(), "(the first save succeeds)");
        run_free(&d);
        return;
    }
    run_steps(&d, 4, 4);
    unsigned char *before, *after;
    size_t nb, na;
    snapshot(&d, &before, &nb);
    EXPECT_EQ_INT(shardopt_save(d.rt, mnt), SHARDOPT_ERR_IO);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "No space left on device");
    snapshot(&d, &after, &na);
    EXPECT_TRUE(na == nb && memcmp(before, after, nb) == 0);
    free(after);
    EXPECT_TRUE(mount(NULL, mnt, NULL, MS_REMOUNT | MS_RDONLY, NULL) == 0);
    EXPECT_EQ_INT(shardopt_save(d.rt, mnt), SHARDOPT_ERR_IO);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "Read-only file system");
    EXPECT_STR_CONTAINS(shardopt_last_error(), mnt);
    snapshot(&d, &after, &na);
    EXPECT_TRUE(na == nb && memcmp(before, after, nb) == 0);
    /* the previous checkpoint loads from the read-only filesystem, and the run steps on */
    EXPECT_EQ_INT(shardopt_load(d.rt, mnt), SHARDOPT_OK);
    EXPECT_EQ_INT(run_steps(&d, 4, 4), SHARDOPT_OK);
    free(before);
    free(after);
    run_free(&d);
}

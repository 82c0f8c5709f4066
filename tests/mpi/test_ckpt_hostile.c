/* Checkpoint directories a hostile user or a broken cluster leaves, beyond test_ckpt.c's single
 * damages: rank files swapped or duplicated, an index naming a tensor twice, a momentum dtype the
 * index records otherwise than the file holds (the project began from a bf16 momentum that came
 * back as fp32), offsets past the tensor's end, a rank file's header giving a shard another
 * shape than the index or a byte appended to it, huge counts, a parameter's algorithm changed,
 * links that loop. Every load must be refused on every rank with the same status, naming the file
 * and the tensor, with the state as it was: the run then steps on to the same bits as a run that
 * never tried the load (nothing lost). A checkpoint of another world or layout than its rank files,
 * and one holding a parameter under the other algorithm, are refused the same way. Saves:
 * test_ckpt_hostile_save.c. Layout: dp_shard over the world (2). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/crc32c.h"
#include "ckpt_hostile.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/checkpoint_index.h"

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
/* a checkpoint of 2 ranks whose index says another world: 4 (writers 2 and 3 have no files), 1
 * (writer 0's shards then cover only half of each tensor) */
static void world_set(cJSON *root, int n)
{
    cJSON *l = cJSON_GetObjectItem(root, "layout");
    cJSON_ReplaceItemInObject(l, "ranks", cJSON_CreateNumber(n));
    cJSON_ReplaceItemInObject(l, "dp_shard", cJSON_CreateNumber(n));
    cJSON_ReplaceItemInObject(root, "writers", cJSON_CreateNumber(n));
}
static void world4(cJSON *root) { world_set(root, 4); }
static void world1(cJSON *root) { world_set(root, 1); }
static void damage_world4(const char *step) { json_edit(step, "index.json", world4); }
static void damage_world1(const char *step) { json_edit(step, "index.json", world1); }
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
/* rank 1's file: its header gives a tensor another shape of the same element count than the
 * index ([16, 32] for its [32, 16] shard; before: loaded as the index says, silently) */
static void damage_header_shape(const char *step)
{
    char p[4300];
    size_t n;
    path_of(p, sizeof p, step, "rank-00001.safetensors");
    char *b = slurp(p, &n);
    char *k = b != NULL ? strstr(b + 8, "\"model.embed_tokens.weight.exp_avg\":{") : NULL;
    char *at = k != NULL ? strstr(k, "\"shape\":[32,16]") : NULL;
    if (at == NULL)
        fprintf(stderr, "header shape edit failed\n");
    else {
        memcpy(at, "\"shape\":[16,32]", 15);
        put(p, b, n);
    }
    free(b);
}
/* rank 1's file with a byte appended, every CRC still matching (before: loaded; safetensors
 * files index every byte of their data area) */
static void damage_rank_file_appended(const char *step)
{
    char p[4300];
    path_of(p, sizeof p, step, "rank-00001.safetensors");
    FILE *f = fopen(p, "ab");
    if (f == NULL || fputc('x', f) == EOF)
        fprintf(stderr, "append failed\n");
    if (f != NULL)
        fclose(f);
}
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
    char dir[64];
    scratch_dir(dir, sizeof dir, "ckpt_hostile");
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
        {damage_world4, 0, "rank-00002.index.json", "No such file or directory"},
        {damage_world1, 0, "model.embed_tokens.weight", "leave part of the tensor uncovered"},
        {damage_algo, 0, "index.json",
         "(parameter 'layers.0.attn.q_proj.weight' is adamw: its state is '<name>.exp_avg'"},
        {damage_param_algo_esc, 0, "index.json", "parameter '\\x1b[2Jw\\r'"},
        {damage_param_shape_esc, 0, "index.json", "parameter '\\x1b[2Jw\\r'"},
        {damage_param_twice_esc, 0, "index.json", "parameter '\\x1b[2Jw' is listed twice"},
        {damage_tensor_shape, 0, "index.json",
         "shape [7, 16] differs from its parameter's [64, 16]"},
        {damage_tensor_dtype, 0, "index.json", "dtype 'F16' is not F32 or BF16"},
        {damage_header_shape, 0, "rank-00001.safetensors",
         "tensor 'model.embed_tokens.weight.exp_avg' is F32 [16, 32] (512 elements) in the file's "
         "header, the index says F32 [32, 16] (512)"},
        {damage_rank_file_appended, 0, "rank-00001.safetensors",
         "bytes after the header, its tensors hold"},
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
    char dir[64];
    scratch_dir(dir, sizeof dir, "ckpt_hostile_algo");
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

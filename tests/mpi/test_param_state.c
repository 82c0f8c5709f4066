/* shardopt_param_get_state / set_state / get_step / set_step on the layout in
 * SHARDOPT_TEST_LAYOUT, for offload none, optimizer and cpu, fp32 and bf16 state: get gives the
 * bytes a save writes for the same state; a fresh runtime given the state and step counts with
 * set_state / set_step steps to the same bits as one that loaded the checkpoint; bf16 state
 * stays bf16; a wrong kind, size, dtype or a call before commit is refused naming the
 * parameter, and changes nothing. */
#include <sys/stat.h>

#include "model_run.h"

static shardopt_config_t cfg_of(int offload, int bf16)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    cfg.offload = (shardopt_offload_t)offload;
    if (bf16) {
        cfg.momentum_dtype = cfg.adam_state_dtype = cfg.adam_v_dtype = SHARDOPT_DTYPE_BF16;
        cfg.momentum_rounding = SHARDOPT_ROUNDING_STOCHASTIC;
    }
    return cfg;
}

/* The kinds of tensor p: 1 (momentum) or 2 (exp_avg, exp_avg_sq). */
static int kinds_of(const struct run *r, int p, shardopt_state_kind_t k[2])
{
    if (r->h[p]->algo == SHARDOPT_ALGO_MUON) {
        k[0] = SHARDOPT_STATE_MOMENTUM;
        return 1;
    }
    k[0] = SHARDOPT_STATE_EXP_AVG;
    k[1] = SHARDOPT_STATE_EXP_AVG_SQ;
    return 2;
}

/* The data of tensor `name` in the safetensors file at path (malloc'd, *len bytes), or NULL. */
static unsigned char *file_tensor(const char *path, const char *name, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    uint64_t hl = 0;
    unsigned char *out = NULL;
    if (fread(&hl, 8, 1, f) == 1) {
        char *hdr = calloc(hl + 1, 1), key[320];
        snprintf(key, sizeof key, "\"%s\":", name);
        const char *at = fread(hdr, 1, hl, f) == hl ? strstr(hdr, key) : NULL;
        const char *off = at != NULL ? strstr(at, "\"data_offsets\":[") : NULL;
        unsigned long long a, b;
        if (off != NULL && sscanf(off, "\"data_offsets\":[%llu,%llu]", &a, &b) == 2) {
            *len = (size_t)(b - a);
            out = malloc(*len + 1);
            if (fseek(f, (long)(8 + hl + a), SEEK_SET) != 0 || fread(out, 1, *len, f) != *len) {
                free(out);
                out = NULL;
            }
        }
        free(hdr);
    }
    fclose(f);
    return out;
}

static void make_dir(char *dir)
{
    if (me == 0 && mkdtemp(dir) == NULL)
        MPI_Abort(MPI_COMM_WORLD, 2);
    MPI_Bcast(dir, (int)strlen(dir) + 1, MPI_CHAR, 0, MPI_COMM_WORLD);
}

TEST(get_gives_the_saved_bytes_and_set_then_step_equals_load_then_step)
{
    setup();
    for (int offload = 0; offload < 3; offload++)
        for (int bf16 = 0; bf16 < 2; bf16++) {
            const shardopt_config_t cfg = cfg_of(offload, bf16);
            char dir[] = "/tmp/shardopt_pstate_XXXXXX";
            make_dir(dir);
            struct run a = {0};
            ASSERT_EQ_INT(run_setup(&a, MPI_COMM_WORLD, cfg, 0), SHARDOPT_OK);
            ASSERT_EQ_INT(run_steps(&a, 1, 3), SHARDOPT_OK);
            ASSERT_EQ_INT(shardopt_save(a.rt, dir), SHARDOPT_OK);
            shardopt_stats_t st = SHARDOPT_STATS_INIT;
            shardopt_get_stats(a.rt, &st);
            char file[512];
            snprintf(file, sizeof file, "%s/step-00000003/rank-%05d.safetensors", dir,
                     st.dense_rank);

            /* every tensor's state as get_state gives it, against the rank file (replica 0
             * writes it; the others hold the same bytes) */
            void *saved[MODEL_NPARAMS][2] = {{0}};
            size_t bytes[MODEL_NPARAMS][2] = {{0}};
            uint64_t steps[MODEL_NPARAMS];
            long wrong_file = 0, wrong_dtype = 0;
            for (int p = 0; p < MODEL_NPARAMS; p++) {
                shardopt_state_kind_t k[2];
                const int nk = kinds_of(&a, p, k);
                ASSERT_EQ_INT(shardopt_param_get_step(a.h[p], &steps[p]), SHARDOPT_OK);
                EXPECT_EQ_INT((int)steps[p], 3);
                for (int j = 0; j < nk; j++) {
                    shardopt_dtype_t dt;
                    int64_t n;
                    ASSERT_EQ_INT(shardopt_param_state_info(a.h[p], k[j], &dt, &n), SHARDOPT_OK);
                    wrong_dtype += dt != (bf16 ? SHARDOPT_DTYPE_BF16 : SHARDOPT_DTYPE_FP32);
                    EXPECT_EQ_INT((int)n, (int)a.box[p].numel);
                    bytes[p][j] = (size_t)n * (bf16 ? 2 : 4);
                    saved[p][j] = malloc(bytes[p][j] + 1);
                    ASSERT_EQ_INT(
                        shardopt_param_get_state(a.h[p], k[j], saved[p][j], bytes[p][j], dt),
                        SHARDOPT_OK);
                    /* replica 0 writes the files; a replicated tensor, dense rank 0 */
                    if (st.replica != 0 || n == 0 ||
                        (model_params[p].placement == SHARDOPT_PLACEMENT_REPLICATED &&
                         st.dense_rank != 0))
                        continue;
                    char name[300];
                    size_t len = 0;
                    snprintf(name, sizeof name, "%s.%s", model_params[p].name,
                             shardopt_state_kind_name(k[j]));
                    unsigned char *in_file = file_tensor(file, name, &len);
                    wrong_file += in_file == NULL || len != bytes[p][j] ||
                                  memcmp(in_file, saved[p][j], len) != 0;
                    free(in_file);
                }
            }
            EXPECT_EQ_INT(wrong_dtype, 0);
            EXPECT_EQ_INT(wrong_file, 0);

            /* b: a fresh runtime given a's parameters, state and step counts; c: loads */
            struct run b = {0}, c = {0};
            ASSERT_EQ_INT(run_setup(&b, MPI_COMM_WORLD, cfg, 0), SHARDOPT_OK);
            ASSERT_EQ_INT(run_setup(&c, MPI_COMM_WORLD, cfg, 0), SHARDOPT_OK);
            ASSERT_EQ_INT(shardopt_load(c.rt, dir), SHARDOPT_OK);
            for (int p = 0; p < MODEL_NPARAMS; p++) {
                const size_t pb = (size_t)a.box[p].numel * model_esize(model_params[p].dtype);
                memcpy(b.w[p], a.w[p], pb);
                memcpy(c.w[p], a.w[p], pb);
                shardopt_state_kind_t k[2];
                const int nk = kinds_of(&b, p, k);
                for (int j = 0; j < nk; j++)
                    ASSERT_EQ_INT(
                        shardopt_param_set_state(b.h[p], k[j], saved[p][j], bytes[p][j],
                                                 bf16 ? SHARDOPT_DTYPE_BF16 : SHARDOPT_DTYPE_FP32),
                        SHARDOPT_OK);
                ASSERT_EQ_INT(shardopt_param_set_step(b.h[p], steps[p]), SHARDOPT_OK);
            }
            ASSERT_EQ_INT(run_steps(&b, 4, 5), SHARDOPT_OK);
            ASSERT_EQ_INT(run_steps(&c, 4, 5), SHARDOPT_OK);
            unsigned char *xb, *xc;
            size_t nb, nc;
            snapshot(&b, &xb, &nb);
            snapshot(&c, &xc, &nc);
            EXPECT_TRUE(nb == nc && memcmp(xb, xc, nb) == 0);
            for (int p = 0; p < MODEL_NPARAMS; p++) {
                uint64_t sb, sc;
                shardopt_param_get_step(b.h[p], &sb);
                shardopt_param_get_step(c.h[p], &sc);
                EXPECT_TRUE(sb == 5 && sc == 5);
                free(saved[p][0]);
                free(saved[p][1]);
            }
            free(xb);
            free(xc);
            run_free(&a);
            run_free(&b);
            run_free(&c);
            MPI_Barrier(MPI_COMM_WORLD);
            if (me == 0) {
                char cmd[128];
                snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
                EXPECT_EQ_INT(system(cmd), 0);
            }
        }
}

/* Step counts set_step accepts ([0, 2^53)) that a save writes and its own load reads back, the
 * same counts and the same next step as a runtime never saved (found by test_xcheck's draw_v10,
 * seed 10900334 at 7 ranks: a step count of 4503599627370440, written through cJSON's "%1.15g"
 * as 4.50359962737044e+15, which load refused as not plain digits; every count from 1e15 up
 * that 15 significant digits give back). The runtime's own step (index.json's "step") follows
 * the loaded checkpoint's, so a second save and load carries it too. */
TEST(step_counts_past_1e15_survive_a_save_and_load)
{
    setup();
    static const uint64_t counts[] = {1000000000000000ull, 4503599627370440ull, 9007199254740990ull,
                                      2147483648ull, 9007199254740991ull};
    const int nc = (int)(sizeof counts / sizeof counts[0]);
    const shardopt_config_t cfg = cfg_of(0, 0);
    char dir[] = "/tmp/shardopt_pstate_XXXXXX";
    make_dir(dir);
    struct run a = {0}, b = {0};
    ASSERT_EQ_INT(run_setup(&a, MPI_COMM_WORLD, cfg, 0), SHARDOPT_OK);
    for (int p = 0; p < MODEL_NPARAMS; p++) /* 2^53 - 1 only where no step follows */
        ASSERT_EQ_INT(shardopt_param_set_step(a.h[p], counts[p % (nc - 1)]), SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_save(a.rt, dir), SHARDOPT_OK);
    ASSERT_EQ_INT(run_setup(&b, MPI_COMM_WORLD, cfg, 0), SHARDOPT_OK);
    const shardopt_status_t st = shardopt_load(b.rt, dir);
    if (st != SHARDOPT_OK && me == 0)
        fprintf(stderr, "  load: %s\n", shardopt_last_error());
    ASSERT_EQ_INT(st, SHARDOPT_OK);
    long wrong = 0;
    for (int p = 0; p < MODEL_NPARAMS; p++) {
        uint64_t s = 0;
        shardopt_param_get_step(b.h[p], &s);
        wrong += s != counts[p % (nc - 1)];
    }
    EXPECT_EQ_INT(wrong, 0);
    /* and the step after it, from the loaded counts and from the set ones: the same bits */
    ASSERT_EQ_INT(run_steps(&a, 1, 1), SHARDOPT_OK);
    ASSERT_EQ_INT(run_steps(&b, 1, 1), SHARDOPT_OK);
    unsigned char *xa, *xb;
    size_t na, nb;
    snapshot(&a, &xa, &na);
    snapshot(&b, &xb, &nb);
    EXPECT_TRUE(na == nb && memcmp(xa, xb, na) == 0);
    free(xa);
    free(xb);
    /* 2^53 - 1, the largest count set_step takes, saved and loaded too */
    for (int p = 0; p < MODEL_NPARAMS; p++)
        ASSERT_EQ_INT(shardopt_param_set_step(b.h[p], counts[nc - 1]), SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_save(b.rt, dir), SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_load(a.rt, dir), SHARDOPT_OK);
    for (int p = 0; p < MODEL_NPARAMS; p++) {
        uint64_t s = 0;
        shardopt_param_get_step(a.h[p], &s);
        EXPECT_TRUE(s == counts[nc - 1]);
    }
    run_free(&a);
    run_free(&b);
    MPI_Barrier(MPI_COMM_WORLD);
    if (me == 0) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        EXPECT_EQ_INT(system(cmd), 0);
    }
}

TEST(wrong_kind_size_dtype_or_time_is_refused_naming_the_parameter)
{
    setup();
    struct run r = {0};
    shardopt_config_t cfg = cfg_of(0, 1); /* bf16 state */
    cfg.dp_replicate = L_rep;
    cfg.dp_shard = L_shard;
    cfg.cp = L_cp;
    cfg.ep = L_ep;
    r.rt = fixture_runtime_on(MPI_COMM_WORLD, &cfg);
    /* before commit: the state does not exist yet */
    float w[16] = {0}, g[16] = {0}, buf[16];
    shardopt_param_desc_t d = SHARDOPT_PARAM_DESC_INIT;
    d.name = "layers.0.norm.weight";
    d.ndim = 1;
    d.shape[0] = 16;
    d.placement = SHARDOPT_PLACEMENT_REPLICATED;
    d.data = w;
    d.grad = g;
    shardopt_param_t h;
    ASSERT_EQ_INT(shardopt_register(r.rt, &d, &h), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_param_get_state(h, SHARDOPT_STATE_EXP_AVG, buf, 32, SHARDOPT_DTYPE_BF16),
                  SHARDOPT_ERR_STATE);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "'layers.0.norm.weight': runtime not committed");
    EXPECT_EQ_INT(shardopt_param_set_step(h, 3), SHARDOPT_ERR_STATE);
    shardopt_finalize(r.rt);

    ASSERT_EQ_INT(run_setup(&r, MPI_COMM_WORLD, cfg_of(0, 1), 0), SHARDOPT_OK);
    ASSERT_EQ_INT(run_steps(&r, 1, 1), SHARDOPT_OK);
    int muon = -1, adamw = -1;
    for (int p = 0; p < MODEL_NPARAMS; p++) {
        if (r.box[p].numel == 0)
            continue;
        if (r.h[p]->algo == SHARDOPT_ALGO_MUON && muon < 0)
            muon = p;
        if (r.h[p]->algo == SHARDOPT_ALGO_ADAMW && adamw < 0)
            adamw = p;
    }
    ASSERT_TRUE(muon >= 0 && adamw >= 0);
    unsigned char *before, *after;
    size_t nb, na;
    snapshot(&r, &before, &nb);
    const size_t n = (size_t)r.box[muon].numel;
    uint16_t *m = calloc(n + 1, 2);
    float *f = calloc(n + 1, 4);
    /* a Muon tensor has no AdamW moments */
    EXPECT_EQ_INT(
        shardopt_param_set_state(r.h[muon], SHARDOPT_STATE_EXP_AVG, m, n * 2, SHARDOPT_DTYPE_BF16),
        SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), model_params[muon].name);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "a muon parameter has momentum (0)");
    EXPECT_EQ_INT(shardopt_param_state_info(r.h[adamw], SHARDOPT_STATE_MOMENTUM, NULL, NULL),
                  SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "exp_avg (1) and exp_avg_sq (2)");
    EXPECT_EQ_INT(shardopt_param_get_state(r.h[muon], (shardopt_state_kind_t)7, m, n * 2,
                                           SHARDOPT_DTYPE_BF16),
                  SHARDOPT_ERR_INVALID_ARGUMENT);
    /* bf16 state stays bf16: an fp32 buffer is refused, either way */
    EXPECT_EQ_INT(
        shardopt_param_set_state(r.h[muon], SHARDOPT_STATE_MOMENTUM, f, n * 4, SHARDOPT_DTYPE_FP32),
        SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(),
                        "buffer dtype fp32 (0), but the state is held in bf16");
    EXPECT_STR_CONTAINS(shardopt_last_error(), model_params[muon].name);
    EXPECT_EQ_INT(
        shardopt_param_get_state(r.h[muon], SHARDOPT_STATE_MOMENTUM, f, n * 4, SHARDOPT_DTYPE_FP32),
        SHARDOPT_ERR_INVALID_ARGUMENT);
    /* one element short, or a NULL buffer */
    EXPECT_EQ_INT(shardopt_param_set_state(r.h[muon], SHARDOPT_STATE_MOMENTUM, m, n * 2 - 2,
                                           SHARDOPT_DTYPE_BF16),
                  SHARDOPT_ERR_INVALID_ARGUMENT);
    char want[200];
    snprintf(want, sizeof want, "%zu bytes given, this rank holds %zu bf16 elements", n * 2 - 2, n);
    EXPECT_STR_CONTAINS(shardopt_last_error(), want);
    EXPECT_EQ_INT(shardopt_param_set_state(r.h[muon], SHARDOPT_STATE_MOMENTUM, NULL, n * 2,
                                           SHARDOPT_DTYPE_BF16),
                  SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ_INT(
        shardopt_param_get_state(NULL, SHARDOPT_STATE_MOMENTUM, m, n * 2, SHARDOPT_DTYPE_BF16),
        SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ_INT(shardopt_param_get_step(r.h[muon], NULL), SHARDOPT_ERR_INVALID_ARGUMENT);
    snapshot(&r, &after, &na);
    EXPECT_TRUE(na == nb && memcmp(before, after, nb) == 0);
    free(before);
    free(after);
    free(m);
    free(f);
    run_free(&r);
}

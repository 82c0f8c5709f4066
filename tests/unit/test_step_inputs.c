/* What a step reads and starts from, given badly through the API: parameter buffers that share
 * memory, and optimizer state no step can start from. Each is refused before anything is written,
 * and the runtime goes on once the input is right. */
#include <math.h>

#include "fixture.h"

/* Parameters whose buffers share memory: the same data pointer registered twice (before: both
 * updates applied to one buffer, OK returned), data overlapping another's data by a few elements,
 * data that is another parameter's gradient or its own (read while written), each at register and
 * through set_pointers; gradients shared by two parameters are only read and are accepted. */
TEST(parameters_whose_buffers_share_memory_are_refused_before_anything_is_written)
{
    static float buf[4][64], keep[4][64];
    struct {
        int a_data, a_off, b_data, b_off, b_grad; /* rows of buf; b_grad -1: buf[3] */
        const char *want;
    } cases[] = {
        {0, 0, 0, 0, 3, "the data of parameter 'a' [%p, +256 bytes) and the data of parameter 'b'"},
        {0, 0, 0, 8, 3, "the data of parameter 'a' [%p, +256 bytes) and the data of parameter 'b'"},
        {0, 0, 1, 0, 0, "the data of parameter 'a' [%p, +256 bytes) and the grad of parameter 'b'"},
        {0, 0, 1, 0, 1, "the data of parameter 'b'"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
        shardopt_runtime_t rt = fixture_runtime(&cfg);
        for (int r = 0; r < 4; r++)
            for (int i = 0; i < 64; i++)
                buf[r][i] = keep[r][i] = 0.01f * (float)((r * 64 + i) % 13) - 0.05f;
        /* b is 56 elements when it starts 8 into a's buffer: inside buf */
        const int nb = cases[c].b_off ? 56 : 64;
        shardopt_param_desc_t da =
            fixture_desc("a", 2, 8, 8, 0, buf[cases[c].a_data] + cases[c].a_off, buf[2]);
        shardopt_param_desc_t db = fixture_desc(
            "b", 2, nb / 8, 8, 0, buf[cases[c].b_data] + cases[c].b_off, buf[cases[c].b_grad]);
        shardopt_param_t pa, pb;
        ASSERT_EQ_INT(shardopt_register(rt, &da, &pa), SHARDOPT_OK);
        ASSERT_EQ_INT(shardopt_register(rt, &db, &pb), SHARDOPT_OK);
        ASSERT_EQ_INT(shardopt_commit(rt), SHARDOPT_OK);
        shardopt_step_args_t args = SHARDOPT_STEP_ARGS_INIT;
        args.lr = 0.01;
        EXPECT_EQ_INT(shardopt_step(rt, &args), SHARDOPT_ERR_INVALID_ARGUMENT);
        char want[256];
        snprintf(want, sizeof want, cases[c].want, (void *)(buf[cases[c].a_data] + cases[c].a_off));
        EXPECT_STR_CONTAINS(shardopt_last_error(), c == 3 ? cases[c].want : want);
        EXPECT_STR_CONTAINS(shardopt_last_error(), "share memory");
        EXPECT_STR_CONTAINS(shardopt_last_error(), "nothing was updated");
        EXPECT_TRUE(memcmp(buf, keep, sizeof buf) == 0);
        shardopt_stats_t st = SHARDOPT_STATS_INIT;
        shardopt_get_stats(rt, &st);
        EXPECT_EQ_INT(st.steps, 0);
        /* b on buffers of its own, sharing a's gradient: read twice, accepted */
        EXPECT_EQ_INT(shardopt_param_set_pointers(pb, buf[3], buf[2]), SHARDOPT_OK);
        EXPECT_EQ_INT(shardopt_step(rt, &args), SHARDOPT_OK);
        EXPECT_TRUE(memcmp(buf[3], keep[3], sizeof buf[3]) != 0);
        /* and back onto a's data through set_pointers: refused at the next step */
        memcpy(keep, buf, sizeof buf);
        EXPECT_EQ_INT(shardopt_param_set_pointers(pb, buf[0], buf[2]), SHARDOPT_OK);
        EXPECT_EQ_INT(shardopt_step(rt, &args), SHARDOPT_ERR_INVALID_ARGUMENT);
        EXPECT_TRUE(memcmp(buf, keep, sizeof buf) == 0);
        EXPECT_EQ_INT(shardopt_finalize(rt), SHARDOPT_OK);
    }
}

/* State no step can start from, through shardopt_param_set_state: NaN in a momentum, +Inf in an
 * exp_avg, a negative exp_avg_sq (before: each was taken, and the next step returned OK with every
 * weight of the tensor NaN). The state stays as it was; finite values (and -0 in exp_avg_sq) are
 * taken and the step stays finite. */
TEST(state_a_step_cannot_start_from_is_refused_by_set_state)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_runtime_t rt = fixture_runtime(&cfg);
    static float wm[64], gm[64], wb[8], gb[8];
    for (int i = 0; i < 64; i++) {
        wm[i] = 0.5f;
        gm[i] = (float)(i % 5) * 0.1f - 0.2f;
    }
    for (int i = 0; i < 8; i++) {
        wb[i] = 1.0f;
        gb[i] = 0.1f * (float)(i + 1);
    }
    shardopt_param_desc_t dm = fixture_desc("m.weight", 2, 8, 8, 0, wm, gm);
    shardopt_param_desc_t db = fixture_desc("m.bias", 1, 8, 0, 0, wb, gb);
    shardopt_param_t pm, pb;
    ASSERT_EQ_INT(shardopt_register(rt, &dm, &pm), SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_register(rt, &db, &pb), SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_commit(rt), SHARDOPT_OK);
    shardopt_step_args_t args = SHARDOPT_STEP_ARGS_INIT;
    args.lr = 0.01;
    ASSERT_EQ_INT(shardopt_step(rt, &args), SHARDOPT_OK);
    float m[64], v[8], before_m[64], before_v[8], bad[64];
    ASSERT_EQ_INT(shardopt_param_get_state(pm, SHARDOPT_STATE_MOMENTUM, before_m, sizeof before_m,
                                           SHARDOPT_DTYPE_FP32),
                  SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_param_get_state(pb, SHARDOPT_STATE_EXP_AVG_SQ, before_v, sizeof before_v,
                                           SHARDOPT_DTYPE_FP32),
                  SHARDOPT_OK);
    memcpy(bad, before_m, sizeof bad);
    bad[5] = NAN;
    EXPECT_EQ_INT(
        shardopt_param_set_state(pm, SHARDOPT_STATE_MOMENTUM, bad, sizeof bad, SHARDOPT_DTYPE_FP32),
        SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(),
                        "param_set_state 'm.weight' momentum: element 5 is nan: accepted finite "
                        "values; the state is unchanged");
    bad[5] = 0;
    bad[0] = INFINITY;
    EXPECT_EQ_INT(
        shardopt_param_set_state(pb, SHARDOPT_STATE_EXP_AVG, bad, 32, SHARDOPT_DTYPE_FP32),
        SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "'m.bias' exp_avg: element 0 is inf");
    for (int i = 0; i < 8; i++)
        bad[i] = i == 3 ? -1.0f : 0.5f;
    EXPECT_EQ_INT(
        shardopt_param_set_state(pb, SHARDOPT_STATE_EXP_AVG_SQ, bad, 32, SHARDOPT_DTYPE_FP32),
        SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(),
                        "'m.bias' exp_avg_sq: element 3 is -1: accepted finite values >= 0");
    shardopt_param_get_state(pm, SHARDOPT_STATE_MOMENTUM, m, sizeof m, SHARDOPT_DTYPE_FP32);
    shardopt_param_get_state(pb, SHARDOPT_STATE_EXP_AVG_SQ, v, sizeof v, SHARDOPT_DTYPE_FP32);
    EXPECT_TRUE(memcmp(m, before_m, sizeof m) == 0 && memcmp(v, before_v, sizeof v) == 0);
    /* -0 and 0 are a second moment a step can start from */
    for (int i = 0; i < 8; i++)
        bad[i] = i % 2 ? -0.0f : 0.0f;
    EXPECT_EQ_INT(
        shardopt_param_set_state(pb, SHARDOPT_STATE_EXP_AVG_SQ, bad, 32, SHARDOPT_DTYPE_FP32),
        SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_step(rt, &args), SHARDOPT_OK);
    for (int i = 0; i < 8; i++)
        EXPECT_TRUE(isfinite(wb[i]));
    for (int i = 0; i < 64; i++)
        EXPECT_TRUE(isfinite(wm[i]));
    EXPECT_EQ_INT(shardopt_finalize(rt), SHARDOPT_OK);
}

/* Pointers not aligned to their element size (one byte into an fp32 buffer, an odd address for
 * bf16), through register, set_pointers and params_set_pointers: refused where given, naming the
 * parameter and the element size (before: accepted; misaligned accesses are undefined in C and
 * end the CUDA context on a GPU). Aligned pointers into the same buffers are accepted. */
TEST(pointers_not_aligned_to_their_dtype_are_refused_where_given)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_runtime_t rt = fixture_runtime(&cfg);
    static float w[80], g[80];
    static uint16_t hb[80], hg[80];
    shardopt_param_desc_t d = fixture_desc("m.weight", 2, 8, 8, 0, (char *)w + 1, g);
    shardopt_param_t pm, pb;
    EXPECT_EQ_INT(shardopt_register(rt, &d, &pm), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "register 'm.weight': data ");
    EXPECT_STR_CONTAINS(shardopt_last_error(), "is not aligned to its 4-byte fp32 elements");
    d.data = w;
    d.grad = (const char *)g + 2;
    EXPECT_EQ_INT(shardopt_register(rt, &d, &pm), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "register 'm.weight': grad ");
    /* a refused register poisons commit: a fresh runtime for the rest */
    shardopt_finalize(rt);
    rt = fixture_runtime(&cfg);
    d.grad = g;
    ASSERT_EQ_INT(shardopt_register(rt, &d, &pm), SHARDOPT_OK);
    shardopt_param_desc_t b = fixture_desc("m.bias", 1, 8, 0, 0, hb + 1, hg);
    b.param_dtype = b.grad_dtype = SHARDOPT_DTYPE_BF16;
    ASSERT_EQ_INT(shardopt_register(rt, &b, &pb), SHARDOPT_OK); /* 2-byte aligned: fine */
    ASSERT_EQ_INT(shardopt_commit(rt), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_param_set_pointers(pb, (char *)hb + 1, hg),
                  SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "param_set_pointers 'm.bias': data ");
    EXPECT_STR_CONTAINS(shardopt_last_error(), "2-byte bf16 elements");
    const shardopt_param_t both[2] = {pm, pb};
    void *const data[2] = {w + 8, (char *)hb + 3};
    const void *const grad[2] = {g, hg};
    EXPECT_EQ_INT(shardopt_params_set_pointers(rt, 2, both, data, grad),
                  SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(),
                        "params_set_pointers: entry 1 of 2 ('m.bias'): data ");
    EXPECT_STR_CONTAINS(shardopt_last_error(), "no pointer was changed");
    /* nothing changed: the step reads and writes the buffers registered */
    shardopt_step_args_t args = SHARDOPT_STEP_ARGS_INIT;
    args.lr = 0.01;
    for (int i = 0; i < 64; i++)
        g[i] = 0.1f;
    EXPECT_EQ_INT(shardopt_step(rt, &args), SHARDOPT_OK);
    EXPECT_TRUE(w[0] != 0 && w[8 + 63] == 0);
    EXPECT_EQ_INT(shardopt_finalize(rt), SHARDOPT_OK);
}

/* Epsilons the kernels cannot hold: adamw_eps and ns_eps are taken as fp32 there, and a value
 * below FLT_MIN (1e-39, 1e-300) is 0 or a denormal (flushed to 0 where the CPU does): a gradient
 * of zeros then gave 0/0, and the step returned OK with every weight NaN. Refused where given
 * (config, JSON, environment and the step's own adamw_eps), naming the key and the floor; the
 * smallest normal float is taken and steps to finite weights. */
TEST(epsilons_below_the_smallest_normal_float_are_refused)
{
    static const char *const keys[] = {"adamw_eps", "ns_eps"};
    static const double tiny[] = {1e-300, 5e-324, 1e-45, 1e-39, 1.1e-38};
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < sizeof tiny / sizeof tiny[0]; i++) {
            shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
            char text[32];
            snprintf(text, sizeof text, "%.17g", tiny[i]);
            EXPECT_EQ_INT(shardopt_config_set(&cfg, keys[k], text), SHARDOPT_ERR_INVALID_ARGUMENT);
            EXPECT_STR_CONTAINS(shardopt_last_error(), keys[k]);
            EXPECT_STR_CONTAINS(shardopt_last_error(), "1.17549");
            *(k == 0 ? &cfg.adamw_eps : &cfg.ns_eps) = tiny[i];
            EXPECT_EQ_INT(shardopt_config_validate(&cfg), SHARDOPT_ERR_INVALID_ARGUMENT);
            EXPECT_STR_CONTAINS(shardopt_last_error(), keys[k]);
        }
    /* the step's adamw_eps likewise; at the floor (and a zero gradient) the weights stay finite */
    static float w[64], g[64], v[8], gv[8];
    for (int i = 0; i < 64; i++)
        w[i] = 0.01f * (float)(i % 7);
    for (int i = 0; i < 8; i++)
        v[i] = 1.0f;
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    cfg.apply_env = 0;
    cfg.ns_eps = 1.1754943508222875e-38;
    cfg.adamw_eps = 1.1754943508222875e-38;
    shardopt_runtime_t rt = fixture_runtime(&cfg);
    shardopt_param_desc_t dm = fixture_desc("m", 2, 8, 8, 0, w, g);
    shardopt_param_desc_t da = fixture_desc("v", 1, 8, 0, 0, v, gv);
    shardopt_param_t pm, pa;
    ASSERT_EQ_INT(shardopt_register(rt, &dm, &pm), SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_register(rt, &da, &pa), SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_commit(rt), SHARDOPT_OK);
    shardopt_step_args_t args = SHARDOPT_STEP_ARGS_INIT;
    args.lr = 0.01;
    args.adamw_eps = 1e-300;
    EXPECT_EQ_INT(shardopt_step(rt, &args), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "adamw_eps");
    EXPECT_STR_CONTAINS(shardopt_last_error(), "1.17549");
    EXPECT_TRUE(w[1] == 0.01f && v[0] == 1.0f); /* nothing written */
    args.adamw_eps = -1;
    EXPECT_EQ_INT(shardopt_step(rt, &args), SHARDOPT_OK);
    for (int i = 0; i < 64; i++)
        EXPECT_TRUE(isfinite(w[i]));
    for (int i = 0; i < 8; i++)
        EXPECT_TRUE(isfinite(v[i]));
    EXPECT_EQ_INT(shardopt_finalize(rt), SHARDOPT_OK);
}

/* A Muon matrix with a side past 2^31 - 1 ([2, 2^31 + 64], a 3-D stack's in-dim too): Newton-
 * Schulz passes the sides to BLAS / cuBLAS as int ((int)n), where they wrap negative; register
 * and commit took it. Refused at register naming the parameter, the matrix and the way out (algo
 * = adamw, which takes it); a side of 2^31 - 1 and a [1, n] row (AdamW under auto) still register.
 * No step runs here: 16 GiB per fp32 copy is beyond a test machine. */
TEST(muon_matrices_with_a_side_past_int_are_refused_at_register)
{
    static float w[64], g[64];
    const int64_t big = (1ll << 31) + 64;
    const struct {
        int ndim;
        int64_t d0, d1, d2;
        shardopt_algo_t algo;
        shardopt_status_t want;
    } cases[] = {
        {2, 2, big, 0, SHARDOPT_ALGO_AUTO, SHARDOPT_ERR_INVALID_ARGUMENT},
        {2, big, 1, 0, SHARDOPT_ALGO_MUON, SHARDOPT_ERR_INVALID_ARGUMENT},
        {3, 2, 2, big, SHARDOPT_ALGO_AUTO, SHARDOPT_ERR_INVALID_ARGUMENT},
        {2, 1, big, 0, SHARDOPT_ALGO_AUTO, SHARDOPT_OK}, /* a row: auto gives it to AdamW */
        {2, 1, big, 0, SHARDOPT_ALGO_ADAMW, SHARDOPT_OK},
        {2, 1, INT32_MAX, 0, SHARDOPT_ALGO_MUON, SHARDOPT_OK},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
        cfg.apply_env = 0;
        shardopt_runtime_t rt = fixture_runtime(&cfg);
        shardopt_param_desc_t d =
            fixture_desc("x", cases[i].ndim, cases[i].d0, cases[i].d1, cases[i].d2, w, g);
        d.algo = cases[i].algo;
        if (cases[i].ndim == 3)
            d.placement = SHARDOPT_PLACEMENT_EXPERT;
        shardopt_param_t p = NULL;
        EXPECT_EQ_INT(shardopt_register(rt, &d, &p), cases[i].want);
        if (cases[i].want != SHARDOPT_OK) {
            EXPECT_TRUE(p == NULL);
            EXPECT_STR_CONTAINS(shardopt_last_error(), "register 'x'");
            EXPECT_STR_CONTAINS(shardopt_last_error(), "2147483712");
            EXPECT_STR_CONTAINS(shardopt_last_error(), "at most 2^31 - 1");
            EXPECT_STR_CONTAINS(shardopt_last_error(), "algo = adamw");
        }
        EXPECT_EQ_INT(shardopt_finalize(rt), SHARDOPT_OK);
    }
}

/* A config struct of an older header (size that of version 1, as shardopt_config_init(cfg, size)
 * or an old binary leaves it) given a key past its end: config_set, a JSON file and
 * config_from_env parsed the value into the whole config, copied back only the caller's bytes
 * and returned OK: ns_team_cap = 4 was dropped without a word. Refused naming the key and the
 * sizes, the caller's struct unchanged; a key inside it is still set. */
TEST(keys_past_the_end_of_an_older_config_are_refused_not_dropped)
{
    const size_t v1 = offsetof(shardopt_config_t, num_threads) + sizeof(int);
    static shardopt_config_t cfg, keep;
    ASSERT_EQ_INT(shardopt_config_init(&cfg, v1), SHARDOPT_OK);
    memcpy(&keep, &cfg, sizeof cfg);
    EXPECT_EQ_INT(shardopt_config_set(&cfg, "ns_team_cap", "4"), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "config_set: key 'ns_team_cap' lies past the end");
    char size_text[32];
    snprintf(size_text, sizeof size_text, "size %zu;", v1);
    EXPECT_STR_CONTAINS(shardopt_last_error(), size_text);
    EXPECT_TRUE(memcmp(&cfg, &keep, sizeof cfg) == 0);
    char dir[] = "/tmp/shardopt_short_cfg_XXXXXX", path[64];
    ASSERT_TRUE(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/c.json", dir);
    FILE *f = fopen(path, "w");
    ASSERT_TRUE(f != NULL);
    fputs("{\"momentum\": 0.5, \"weight_decay_1d\": true}", f);
    fclose(f);
    EXPECT_EQ_INT(shardopt_config_load_json(path, &cfg), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "key 'weight_decay_1d' lies past the end");
    EXPECT_STR_CONTAINS(shardopt_last_error(), path);
    EXPECT_TRUE(memcmp(&cfg, &keep, sizeof cfg) == 0);
    unlink(path);
    rmdir(dir);
    setenv("SHARDOPT_NS_TEAM_FRAC", "0.25", 1);
    EXPECT_EQ_INT(shardopt_config_from_env(&cfg), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "SHARDOPT_NS_TEAM_FRAC is set");
    EXPECT_TRUE(memcmp(&cfg, &keep, sizeof cfg) == 0);
    unsetenv("SHARDOPT_NS_TEAM_FRAC");
    /* inside the old struct: set as before */
    EXPECT_EQ_INT(shardopt_config_set(&cfg, "momentum", "0.5"), SHARDOPT_OK);
    EXPECT_TRUE(cfg.momentum == 0.5 && cfg.size == v1);
}

/* Custom Newton-Schulz tables whose iteration sends the singular values past what the next
 * step's fp32 products hold: (1000, 1000, 1000) five times, (-1000, 0, 0) three times, (0, 0,
 * 1000) twice each passed the per-coefficient range [-1000, 1000] and stepped every weight to
 * NaN with OK returned. Refused at validate naming the step and the bound; tables that stay
 * inside it (the same (-1000, 0, 0) twice: 1e6) step to finite weights. */
TEST(custom_tables_whose_iteration_overflows_fp32_are_refused)
{
    static float w[64 * 64], g[64 * 64];
    static const struct {
        const char *triple;
        int steps, refused_at;
    } cases[] = {{"1000,1000,1000", 5, 2}, {"-1000,0,0", 3, 3}, {"0,0,1000", 2, 2},
                 {"-1000,0,0", 2, 0},      {"2,0,0", 5, 0},     {"3.4445,-4.775,2.0315", 5, 0}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
        cfg.apply_env = 0;
        char tab[256] = "", want[64];
        for (int k = 0; k < cases[c].steps; k++)
            snprintf(tab + strlen(tab), sizeof tab - strlen(tab), "%s%s", k ? ";" : "",
                     cases[c].triple);
        ASSERT_EQ_INT(shardopt_config_set(&cfg, "ns_coeffs", "custom"), SHARDOPT_OK);
        ASSERT_EQ_INT(shardopt_config_set(&cfg, "ns_custom_coeffs", tab), SHARDOPT_OK);
        if (cases[c].refused_at > 0) {
            EXPECT_EQ_INT(shardopt_config_validate(&cfg), SHARDOPT_ERR_INVALID_ARGUMENT);
            snprintf(want, sizeof want, "ns_custom_coeffs: after step %d", cases[c].refused_at);
            EXPECT_STR_CONTAINS(shardopt_last_error(), want);
            EXPECT_STR_CONTAINS(shardopt_last_error(), "at most 1e+06");
            shardopt_runtime_t rt = NULL;
            EXPECT_EQ_INT(shardopt_init(MPI_COMM_SELF, &cfg, &rt), SHARDOPT_ERR_INVALID_ARGUMENT);
            EXPECT_TRUE(rt == NULL);
            continue;
        }
        EXPECT_EQ_INT(shardopt_config_validate(&cfg), SHARDOPT_OK);
        for (int i = 0; i < 64 * 64; i++) {
            w[i] = 0.01f;
            g[i] = 0.001f * (float)(i % 17) - 0.008f;
        }
        shardopt_runtime_t rt = fixture_runtime(&cfg);
        shardopt_param_desc_t d = fixture_desc("m", 2, 64, 64, 0, w, g);
        shardopt_param_t p;
        ASSERT_EQ_INT(shardopt_register(rt, &d, &p), SHARDOPT_OK);
        ASSERT_EQ_INT(shardopt_commit(rt), SHARDOPT_OK);
        shardopt_step_args_t args = SHARDOPT_STEP_ARGS_INIT;
        args.lr = 0.01;
        EXPECT_EQ_INT(shardopt_step(rt, &args), SHARDOPT_OK);
        int finite = 1;
        for (int i = 0; i < 64 * 64; i++)
            finite &= isfinite(w[i]) != 0;
        EXPECT_TRUE(finite);
        EXPECT_EQ_INT(shardopt_finalize(rt), SHARDOPT_OK);
    }
}

/* Two runtimes of one process over the same memory (two optimizers over one model; a runtime
 * whose parameter was pointed into another's): each step checked only its own buffers, so both
 * stepped that memory, once each per step, and returned OK. A runtime's first step is taken (a
 * new optimizer made over the model of an old one left alive, which no longer steps); from its
 * second, a runtime refuses to step memory another runtime stepped since its own last step,
 * naming both parameters, with nothing written; finalizing the other lets it go on. Disjoint
 * memory steps in turn as before. */
TEST(two_runtimes_stepping_the_same_memory_are_refused)
{
    static float w[64], g[64], v[64], gv[64], keep[64];
    for (int i = 0; i < 64; i++) {
        w[i] = v[i] = 0.01f * (float)(i % 13) - 0.05f;
        g[i] = gv[i] = 0.02f * (float)(i % 7) - 0.06f;
    }
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_runtime_t a = fixture_runtime(&cfg), b = fixture_runtime(&cfg);
    shardopt_param_desc_t da = fixture_desc("a.w", 2, 8, 8, 0, w, g);
    shardopt_param_desc_t db = fixture_desc("b.v", 2, 8, 8, 0, v, gv);
    shardopt_param_t pa, pb;
    ASSERT_EQ_INT(shardopt_register(a, &da, &pa), SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_register(b, &db, &pb), SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_commit(a), SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_commit(b), SHARDOPT_OK);
    shardopt_step_args_t args = SHARDOPT_STEP_ARGS_INIT;
    args.lr = 0.01;
    for (int k = 0; k < 2; k++) { /* disjoint memory: each steps in turn */
        EXPECT_EQ_INT(shardopt_step(a, &args), SHARDOPT_OK);
        EXPECT_EQ_INT(shardopt_step(b, &args), SHARDOPT_OK);
    }
    /* a's data moved into a larger buffer, b's parameter pointed 8 elements into it: b steps
     * it (a stepped before b's last step, not since) */
    static float big[72];
    memcpy(big, w, sizeof w);
    ASSERT_EQ_INT(shardopt_param_set_pointers(pa, big, g), SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_param_set_pointers(pb, big + 8, gv), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_step(b, &args), SHARDOPT_OK);
    /* a's next step: b stepped [big + 8, +256 bytes) since a's last step, over a's data */
    memcpy(keep, big, sizeof keep);
    EXPECT_EQ_INT(shardopt_step(a, &args), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "the data of parameter 'a.w'");
    EXPECT_STR_CONTAINS(shardopt_last_error(), "the data of parameter 'b.v'");
    EXPECT_STR_CONTAINS(shardopt_last_error(), "of another runtime of this process");
    EXPECT_STR_CONTAINS(shardopt_last_error(), "nothing was updated");
    EXPECT_TRUE(memcmp(big, keep, sizeof keep) == 0);
    /* and b's, now that a's data moved onto it since b's last step? a has not stepped since:
     * b goes on (the one in use); a stays refused while b keeps stepping */
    EXPECT_EQ_INT(shardopt_step(b, &args), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_step(a, &args), SHARDOPT_ERR_INVALID_ARGUMENT);
    /* b finalized: a goes on */
    EXPECT_EQ_INT(shardopt_finalize(b), SHARDOPT_OK);
    memcpy(keep, big, sizeof keep);
    EXPECT_EQ_INT(shardopt_step(a, &args), SHARDOPT_OK);
    EXPECT_TRUE(memcmp(big, keep, sizeof keep) != 0);
    /* a new runtime over a's memory: its first step is taken (a replacing optimizer), and a, the
     * old one, is refused at its next step */
    shardopt_runtime_t c = fixture_runtime(&cfg);
    shardopt_param_desc_t dc = fixture_desc("c.w", 2, 8, 8, 0, big, g);
    shardopt_param_t pc;
    ASSERT_EQ_INT(shardopt_register(c, &dc, &pc), SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_commit(c), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_step(c, &args), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_step(c, &args), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_step(a, &args), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "'c.w'");
    EXPECT_EQ_INT(shardopt_finalize(a), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_finalize(c), SHARDOPT_OK);
}

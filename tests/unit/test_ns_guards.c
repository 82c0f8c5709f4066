/* Newton-Schulz configurations that stepped weights far from the fp64 iteration, or to NaN,
 * while the step returned OK, each found by test_xcheck: an ns_norm_scale below 1 with
 * Frobenius scaling (now refused), and bf16 Gram Newton-Schulz with jordan's table on small wide
 * matrices (its restarts, kernels/ns_coeffs.h); and the Gram result guard's fallback as the step
 * sees it. One process, one runtime per case. */
#include <math.h>

#include "fixture.h"
#include "kernels/ns_coeffs.h"
#include "ns_fp64.h"
#include "ns_singular.h"
#include "stderr_capture.h"

/* Found by test_xcheck (seed 118011 under SHARDOPT_XCHECK_SET="check_state_every=1"): with
 * Frobenius scaling, ns_norm_scale below 1 starts a rank-1 update's one singular value at 1/s,
 * beyond the [0, 1] every table is made for; polar_express's first step took 1.25 to 15.8, the next
 * ones overflowed, a 12 x 1 matrix stepped to NaN and the step returned OK. Such an s is refused
 * with frobenius (config.c); with aol, whose row scaling bounds |X|_2 by 1, it stays accepted, and
 * a rank-1 update comes out finite either way (s = 1 with frobenius, 0.5 with aol), its one
 * singular value where the table takes 1 (0.70 to 1.03). */
TEST(norm_scale_below_one_needs_aol_and_a_rank_one_update_stays_bounded)
{
    static const shardopt_ns_coeffs_t tables[4] = {SHARDOPT_NS_QUINTIC, SHARDOPT_NS_JORDAN,
                                                   SHARDOPT_NS_POLAR_EXPRESS, SHARDOPT_NS_AOL};
    for (int t = 0; t < 4; t++)
        for (int aol = 0; aol < 2; aol++) {
            shardopt_config_t cfg = fixture_bare_muon_config();
            cfg.ns_coeffs = tables[t];
            cfg.ns_steps = tables[t] == SHARDOPT_NS_AOL ? 4 : 5;
            cfg.ns_norm_scale = 0.5;
            cfg.ns_precondition =
                aol ? SHARDOPT_NS_PRECONDITION_AOL : SHARDOPT_NS_PRECONDITION_FROBENIUS;
            if (!aol) {
                EXPECT_EQ_INT(shardopt_config_validate(&cfg), SHARDOPT_ERR_INVALID_ARGUMENT);
                EXPECT_STR_CONTAINS(shardopt_last_error(),
                                    "ns_norm_scale = 0.5 with ns_precondition = frobenius");
                cfg.ns_norm_scale = 1; /* the lowest s that Frobenius scaling keeps in [0, 1] */
            }
            shardopt_runtime_t rt = fixture_runtime(&cfg);
            float w[12] = {0}, g[12];
            for (int i = 0; i < 12; i++)
                g[i] = (float)(i - 5.5) / 12.0f;
            shardopt_param_desc_t d = fixture_desc("w", 2, 12, 1, 1, w, g);
            d.algo = SHARDOPT_ALGO_MUON;
            shardopt_param_t h;
            ASSERT_EQ_INT(shardopt_register(rt, &d, &h), SHARDOPT_OK);
            ASSERT_EQ_INT(shardopt_commit(rt), SHARDOPT_OK);
            shardopt_step_args_t a = SHARDOPT_STEP_ARGS_INIT;
            a.lr = 1; /* W = -O */
            ASSERT_EQ_INT(shardopt_step(rt, &a), SHARDOPT_OK);
            double norm = 0;
            for (int i = 0; i < 12; i++)
                norm += (double)w[i] * w[i];
            norm = sqrt(norm);                         /* a rank-1 O's one singular value */
            EXPECT_TRUE(norm >= 0.69 && norm <= 1.04); /* a NaN fails too */
            shardopt_finalize(rt);
        }
}

/* |O| / |O_fp64| of one bf16 Gram Newton-Schulz step (jordan's table, 5 steps) on an m x n
 * matrix whose last row is its first plus delta times noise (one small singular value); 0 where
 * this CPU has no bf16 Newton-Schulz. */
static double jordan_gram_bf16_ratio(int64_t m, int64_t n, uint64_t seed, double delta)
{
    shardopt_config_t cfg = fixture_bare_muon_config();
    cfg.ns_coeffs = SHARDOPT_NS_JORDAN;
    cfg.ns_steps = 5;
    cfg.ns_algorithm = SHARDOPT_NS_ALGORITHM_GRAM;
    cfg.ns_compute = SHARDOPT_NS_COMPUTE_BF16;
    shardopt_runtime_t rt = fixture_runtime(&cfg);
    const size_t mn = (size_t)(m * n);
    float *w = calloc(mn, sizeof(float)), *g = malloc(sizeof(float) * mn);
    double *u = malloc(sizeof(double) * mn), *o = malloc(sizeof(double) * mn), ratio = 0;
    for (size_t i = 0; i < mn; i++) {
        uint64_t h = (seed * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)i * 0xBF58476D1CE4E5B9ull);
        h = (h ^ (h >> 31)) * 0x94D049BB133111EBull;
        g[i] = (float)((double)((h ^ (h >> 29)) >> 11) / 9007199254740992.0 - 0.5);
        if (i >= (size_t)((m - 1) * n))
            g[i] = g[i - (size_t)((m - 1) * n)] + (float)delta * g[i];
        u[i] = g[i];
    }
    shardopt_param_desc_t d = fixture_desc("w", 2, m, n, 1, w, g);
    shardopt_param_t h;
    shardopt_step_args_t a = SHARDOPT_STEP_ARGS_INIT;
    a.lr = 1; /* W = -O */
    shardopt_status_t st = shardopt_register(rt, &d, &h);
    if (st == SHARDOPT_OK)
        st = shardopt_commit(rt);
    if (st == SHARDOPT_OK)
        st = shardopt_step(rt, &a);
    if (st == SHARDOPT_OK) {
        float t[5][3];
        for (int k = 0; k < 5; k++) {
            t[k][0] = 3.4445f;
            t[k][1] = -4.7750f;
            t[k][2] = 2.0315f;
        }
        ns_fp64(u, m, n, m > n, (const float(*)[3])t, 5, 1.0, cfg.ns_eps, o);
        double got = 0, want = 0;
        for (size_t i = 0; i < mn; i++) {
            got += (double)w[i] * w[i];
            want += o[i] * o[i];
        }
        ratio = sqrt(got / want);
    } else if (st != SHARDOPT_ERR_UNSUPPORTED) {
        ratio = NAN;
    }
    shardopt_finalize(rt);
    free(w);
    free(g);
    free(u);
    free(o);
    return ratio;
}

/* Found by test_xcheck (seed 14154, the aol table there) and a probe of the tables on small wide
 * matrices: jordan's 5 steps under bf16 Gram Newton-Schulz restarted only after step 3, a first
 * segment of exposure 11.9 (kernels/ns_coeffs.h), and on 2 x 5 to 8 x 33 matrices with one small
 * singular value reached |O| 6.5e6 times the fp64 result (R's rounding turns its small
 * eigenvalues negative, and three steps of 3.4445^2 grow them). With the bound at 11 it restarts
 * after steps 2 and 4: within 1.06x, as the standard bf16 path. */
TEST(gram_bf16_jordan_stays_bounded_on_small_wide_matrices)
{
    static const int64_t shapes[3][2] = {{2, 5}, {4, 16}, {8, 33}};
    double worst = 0;
    for (int s = 0; s < 3; s++)
        for (int dl = 0; dl < 2; dl++)
            for (uint64_t seed = 1; seed <= 8; seed++) {
                const double r =
                    jordan_gram_bf16_ratio(shapes[s][0], shapes[s][1], seed, dl ? 0.01 : 0.1);
                worst = isnan(r) || r > worst ? r : worst;
            }
    printf("  jordan x5, bf16 Gram: worst |O| / |O_fp64| %.3g (0: no bf16 here)\n", worst);
    EXPECT_TRUE(worst <= 1.3); /* a NaN fails too */
}

/* W after two steps of lr 1 (W = -2 O, momentum 0) on a 96 x 256 rank-4 gradient, fp32, quintic's
 * table at 12 steps, with `algo`; the log in *log (the caller frees), the stats' fallbacks in
 * *fallbacks. */
static float *two_steps(shardopt_ns_algorithm_t algo, char **log, uint64_t *fallbacks)
{
    enum { M = 96, N = 256 };
    shardopt_config_t cfg = fixture_bare_muon_config();
    cfg.ns_steps = 12;
    cfg.ns_algorithm = algo;
    float *w = calloc(M * N, sizeof(float)), *g = malloc(sizeof(float) * M * N);
    double sv[M];
    for (int i = 0; i < M; i++)
        sv[i] = i < 4 ? 1.0 / (i + 1) : 0.0;
    matrix_with_singular_values(g, M, N, sv, 7);
    const char *path = "test_ns_guards_gram_guard.log";
    const int saved = stderr_to(path);
    shardopt_runtime_t rt = fixture_runtime(&cfg);
    shardopt_param_desc_t d = fixture_desc("w", 2, M, N, 1, w, g);
    d.algo = SHARDOPT_ALGO_MUON;
    shardopt_param_t h;
    shardopt_step_args_t a = SHARDOPT_STEP_ARGS_INIT;
    a.lr = 1;
    EXPECT_EQ_INT(shardopt_register(rt, &d, &h), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_commit(rt), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_step(rt, &a), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_step(rt, &a), SHARDOPT_OK);
    shardopt_stats_t st = SHARDOPT_STATS_INIT;
    EXPECT_EQ_INT(shardopt_get_stats(rt, &st), SHARDOPT_OK);
    *fallbacks = st.ns_gram_fallbacks;
    shardopt_finalize(rt);
    stderr_back(saved);
    *log = text_of(path);
    remove(path);
    free(g);
    return w;
}

/* Gram made to diverge (run without restarts: ns_coeffs_gram_restarts_force) on a low-rank
 * momentum: the kernel's guard recomputes it with the standard algorithm, so the weights are
 * the standard run's, bit for bit, and the rank that ran it says so once for the parameter,
 * with its name, shape and count, however many steps it recurs; stats.ns_gram_fallbacks counts
 * every one. */
TEST(gram_guard_fallback_gives_the_standard_step_and_warns_once)
{
    char *log_std, *log_gram;
    uint64_t fb_std = 9, fb_gram = 0;
    float *w_std = two_steps(SHARDOPT_NS_ALGORITHM_STANDARD, &log_std, &fb_std);
    ns_coeffs_gram_restarts_force(1, 0u);
    float *w_gram = two_steps(SHARDOPT_NS_ALGORITHM_GRAM, &log_gram, &fb_gram);
    ns_coeffs_gram_restarts_force(0, 0u);
    EXPECT_EQ_INT((int)fb_std, 0);
    EXPECT_EQ_INT((int)fb_gram, 2); /* one per step, counted though said once */
    EXPECT_TRUE(memcmp(w_gram, w_std, sizeof(float) * 96 * 256) == 0);
    EXPECT_TRUE(isfinite(w_gram[0]) && w_gram[0] != 0.0f);
    const char *want = "Gram Newton-Schulz of 'w' [96 x 256] gave 1 result(s)";
    const char *at = strstr(log_gram, want);
    EXPECT_TRUE(at != NULL);
    EXPECT_TRUE(at == NULL || strstr(at + 1, "Gram Newton-Schulz of 'w'") == NULL);
    EXPECT_TRUE(strstr(log_std, "Gram Newton-Schulz") == NULL);
    free(w_std);
    free(w_gram);
    free(log_std);
    free(log_gram);
}

/* Found by test_xcheck (seed 960140 of a 3-rank world, a bf16 team) and then on one owner: bf16
 * standard Newton-Schulz with polar_express x 7 and aol on 2 x 7 matrices whose smaller singular
 * value sits near the first polynomial's maximum (1.99 at 0.38). bf16's rounding of that step
 * left it past 2, where the second polynomial is steep, and the next steps took it to Inf: one of
 * these 400 matrices (rows r1 and r2 = r r1' + t r1, r in [0.3, 0.5]) stepped to NaN, the step
 * OK. The kernel now recomputes a result past the guard's bound in fp32 and the runtime warns
 * once; where this CPU has no bf16 Newton-Schulz the case has nothing to check. */
TEST(bf16_standard_result_past_the_bound_is_recomputed_in_fp32)
{
    enum { N = 400, COLS = 7 };
    shardopt_config_t cfg = fixture_bare_muon_config();
    cfg.ns_coeffs = SHARDOPT_NS_POLAR_EXPRESS;
    cfg.ns_steps = 7;
    cfg.ns_precondition = SHARDOPT_NS_PRECONDITION_AOL;
    cfg.ns_norm_scale = 1.3;
    cfg.ns_compute = SHARDOPT_NS_COMPUTE_BF16;
    shardopt_runtime_t rt = fixture_runtime(&cfg);
    static float w[N][2 * COLS], g[N][2 * COLS];
    static char name[N][16];
    shardopt_param_t h[N];
    uint64_t st = 12345;
#define U01()                                                                                      \
    ((st = st * 6364136223846793005ull + 1442695040888963407ull),                                  \
     (double)(st >> 11) / 9007199254740992.0)
    for (int i = 0; i < N; i++) {
        const double r = 0.3 + 0.2 * U01();
        for (int j = 0; j < COLS; j++) { /* a Gaussian by Box-Muller */
            const double a = U01() + 1e-12, b = U01();
            g[i][j] = (float)(sqrt(-2 * log(a)) * cos(6.283185307 * b));
        }
        for (int j = 0; j < COLS; j++) {
            const double a = U01() + 1e-12, b = U01();
            const double gs = sqrt(-2 * log(a)) * cos(6.283185307 * b);
            g[i][COLS + j] = (float)(r * gs + (U01() - 0.5) * 2 * g[i][j]);
        }
#undef U01
        snprintf(name[i], sizeof name[i], "m%d", i);
        shardopt_param_desc_t d = fixture_desc(name[i], 2, 2, COLS, 1, w[i], g[i]);
        ASSERT_EQ_INT(shardopt_register(rt, &d, &h[i]), SHARDOPT_OK);
    }
    shardopt_status_t s = shardopt_commit(rt);
    if (s == SHARDOPT_ERR_UNSUPPORTED) {
        printf("  no bf16 Newton-Schulz here: %s\n", shardopt_last_error());
        shardopt_finalize(rt);
        return;
    }
    ASSERT_EQ_INT(s, SHARDOPT_OK);
    shardopt_step_args_t a = SHARDOPT_STEP_ARGS_INIT;
    a.lr = 1; /* W = -O */
    ASSERT_EQ_INT(shardopt_step(rt, &a), SHARDOPT_OK);
    double worst = 0;
    for (int i = 0; i < N; i++) {
        double q = 0;
        for (int j = 0; j < 2 * COLS; j++)
            q += (double)w[i][j] * w[i][j];
        worst = isfinite(q) && isfinite(worst) ? fmax(worst, q) : INFINITY;
    }
    printf("  largest |O|_F^2 of %d matrices: %.3g\n", N, worst);
    EXPECT_TRUE(worst <= 8.0); /* 2 rows, each singular value near 1: about 2; Inf fails */
    shardopt_finalize(rt);
}

/* The Gram result guard (kernels/cpu/ns_common.h, ns_gram_guard_ok): after Gram Newton-Schulz of
 * each matrix, a result that is not finite or whose squared Frobenius norm passes twice m times
 * the square of the bound on what the table can output is recomputed by the standard algorithm
 * from the input. Gram is made to diverge on purpose by running it without restarts
 * (ns_coeffs_gram_restarts_force): on low-rank and spread spectra R's rounding makes negative
 * eigenvalues that the steps grow. The fp32 (OpenBLAS) and bf16 (oneDNN) paths, Frobenius and
 * AOL scaling, a batch whose experts are judged one by one, and the published schedules, which
 * the guard must leave alone. */
#include <string.h>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/ns_bf16.h"
#include "kernels/cpu/ns_common.h"
#include "kernels/ns_coeffs.h"
#include "kernels/ops.h"
#include "ns_singular.h"
#include "ns_test_util.h"
#include "test.h"

enum spectrum { SPREAD, LOW_RANK, WELL };

/* batch m x n matrices (stored tall, n x m, when tall), each with its spectrum: log-uniform over
 * [1e-4, 1], rank 4, or in [0.5, 1] */
static float *input(int64_t batch, int64_t m, int64_t n, int tall, const int *kinds)
{
    float *x = malloc(sizeof(float) * (size_t)(batch * m * n)), *w = malloc(sizeof(float) * m * n);
    double *sv = malloc(sizeof(double) * (size_t)m);
    for (int64_t k = 0; k < batch; k++) {
        for (int64_t i = 0; i < m; i++)
            sv[i] = kinds[k] == SPREAD     ? pow(1e-4, (double)i / (double)(m - 1))
                    : kinds[k] == LOW_RANK ? (i < 4 ? 1.0 / (double)(i + 1) : 0.0)
                                           : 1.0 - 0.5 * (double)i / (double)m;
        matrix_with_singular_values(w, (int)m, (int)n, sv, 7 + (uint64_t)k);
        float *o = x + k * m * n;
        for (int64_t r = 0; r < m; r++)
            for (int64_t c = 0; c < n; c++)
                o[tall ? c * m + r : r * n + c] = w[r * n + c];
    }
    free(w);
    free(sv);
    return x;
}

/* Newton-Schulz of the batch (working shape m x n; stored n x m when tall) with compute, algo and
 * precondition; the guard's count in *fb. 0, or the kernel's code; 77 when bf16 has no matmul. */
static int run(int compute, int algo, int precond, int64_t batch, int64_t m, int64_t n, int tall,
               const struct coeffs *t, const float *in, float *out, int64_t *fb)
{
    struct ns_bf16 *b = NULL;
    char err[256];
    if (compute == KDT_BF16) {
        if (!ns_bf16_available(err, sizeof err))
            return 77;
        if (ns_bf16_create(&b) != SHARDOPT_OK ||
            ns_bf16_prepare(b, m, n, NS_VARIANT_PLAIN, 0, algo, (const float(*)[3])t->c,
                            t->steps) != SHARDOPT_OK)
            return -9;
    }
    struct ns_args a = ns_args_of(batch, tall ? n : m, tall ? m : n, t, in, KDT_F32, out, KDT_F32);
    a.compute = compute;
    a.algorithm = algo;
    a.precondition = precond;
    a.guard_fallbacks = fb;
    struct ns_workspace ws = {.floats = ns_workspace_floats(m, n), .bf16 = b};
    ws.buf = cpu_alloc(ws.floats * sizeof(float));
    const int rc = ns_blas_newton_schulz(&(struct kernel_ctx){.threads = 0}, &a, &ws);
    cpu_free(ws.buf);
    ns_bf16_destroy(b);
    return rc;
}

/* Forced to run without restarts, Gram diverges on a low-rank 96 x 256 input (fp32: quintic's
 * table at 12 steps; bf16: polar_express's 8 steps; both NaN, where standard gives |O|_F^2 / m
 * 0.04 and 0.50 against the guard's 2.6 and 2.0); the guard catches it and the result is the
 * standard algorithm's, bit for bit, with Frobenius and AOL scaling, wide and tall. With the rule's
 * restarts the same input passes the guard. */
TEST(gram_guard_recomputes_a_diverged_result_with_standard)
{
    const int64_t m = 96, n = 256, mn = m * n;
    const int kinds[1] = {LOW_RANK};
    float *o_std = malloc(sizeof(float) * mn), *o_g = malloc(sizeof(float) * mn);
    for (int dt = KDT_F32; dt <= KDT_BF16; dt++)
        for (int pre = NS_PRECOND_FROBENIUS; pre <= NS_PRECOND_AOL; pre++)
            for (int tall = 0; tall < 2; tall++) {
                const struct coeffs t = dt == KDT_F32 ? coeffs_of(NS_TABLE_QUINTIC, 12)
                                                      : coeffs_of(NS_TABLE_POLAR_EXPRESS, 8);
                float *in = input(1, m, n, tall, kinds);
                int64_t fb = 0, fb_rule = 0;
                const int rc = run(dt, NS_ALGO_STANDARD, pre, 1, m, n, tall, &t, in, o_std, NULL);
                if (rc == 77) {
                    free(in);
                    continue; /* no bf16 matmul on this CPU: the fp32 half still ran */
                }
                EXPECT_EQ_INT(rc, 0);
                ns_coeffs_gram_restarts_force(1, 0u);
                EXPECT_EQ_INT(run(dt, NS_ALGO_GRAM, pre, 1, m, n, tall, &t, in, o_g, &fb), 0);
                ns_coeffs_gram_restarts_force(0, 0u);
                EXPECT_EQ_INT((int)fb, 1);
                EXPECT_TRUE(memcmp(o_g, o_std, sizeof(float) * mn) == 0);
                EXPECT_EQ_INT(run(dt, NS_ALGO_GRAM, pre, 1, m, n, tall, &t, in, o_g, &fb_rule), 0);
                EXPECT_EQ_INT((int)fb_rule, 0);
                free(in);
            }
    free(o_std);
    free(o_g);
}

/* Each expert of a batch is judged on its own: of [well-conditioned, low-rank, well-conditioned]
 * run without restarts in fp32, only the low-rank one is recomputed; the others keep Gram's
 * result, the bits a batch of one gives. */
TEST(gram_guard_judges_each_expert_of_a_batch)
{
    const int64_t m = 96, n = 256, mn = m * n;
    const int kinds[3] = {WELL, LOW_RANK, WELL};
    const struct coeffs t = coeffs_of(NS_TABLE_QUINTIC, 12);
    float *in = input(3, m, n, 0, kinds);
    float *o = malloc(sizeof(float) * 3 * mn), *one = malloc(sizeof(float) * mn);
    int64_t fb = 0, fb1 = 0;
    ns_coeffs_gram_restarts_force(1, 0u);
    EXPECT_EQ_INT(run(KDT_F32, NS_ALGO_GRAM, NS_PRECOND_FROBENIUS, 3, m, n, 0, &t, in, o, &fb), 0);
    EXPECT_EQ_INT((int)fb, 1);
    for (int k = 0; k < 3; k += 2) {
        EXPECT_EQ_INT(run(KDT_F32, NS_ALGO_GRAM, NS_PRECOND_FROBENIUS, 1, m, n, 0, &t, in + k * mn,
                          one, &fb1),
                      0);
        EXPECT_TRUE(memcmp(o + k * mn, one, sizeof(float) * mn) == 0);
    }
    ns_coeffs_gram_restarts_force(0, 0u);
    EXPECT_EQ_INT((int)fb1, 0);
    EXPECT_EQ_INT(
        run(KDT_F32, NS_ALGO_STANDARD, NS_PRECOND_FROBENIUS, 1, m, n, 0, &t, in + mn, one, NULL),
        0);
    EXPECT_TRUE(memcmp(o + mn, one, sizeof(float) * mn) == 0);
    free(in);
    free(o);
    free(one);
}

/* The published schedules with the rule's restarts never trip the guard: every table, spread,
 * low-rank and well-conditioned spectra, fp32 and bf16, Frobenius and AOL, on shapes auto sends to
 * Gram (n >= 2m, m > 64). Measured: |O|_F^2 / m at most 1.09 here, against 2.0 to 2.6. */
TEST(gram_guard_leaves_the_published_schedules_alone)
{
    const int tables[][2] = {{NS_TABLE_QUINTIC, 5},       {NS_TABLE_QUINTIC, 8},
                             {NS_TABLE_JORDAN, 5},        {NS_TABLE_POLAR_EXPRESS, 5},
                             {NS_TABLE_POLAR_EXPRESS, 8}, {NS_TABLE_AOL, 4}};
    const int64_t shapes[][2] = {{65, 130}, {96, 256}};
    for (size_t si = 0; si < 2; si++) {
        const int64_t m = shapes[si][0], n = shapes[si][1];
        float *o = malloc(sizeof(float) * m * n);
        for (int kind = SPREAD; kind <= WELL; kind++) {
            float *in = input(1, m, n, 0, &kind);
            for (size_t ti = 0; ti < sizeof tables / sizeof tables[0]; ti++)
                for (int dt = KDT_F32; dt <= KDT_BF16; dt++)
                    for (int pre = NS_PRECOND_FROBENIUS; pre <= NS_PRECOND_AOL; pre++) {
                        const struct coeffs t = coeffs_of(tables[ti][0], tables[ti][1]);
                        int64_t fb = 0;
                        const int rc = run(dt, NS_ALGO_GRAM, pre, 1, m, n, 0, &t, in, o, &fb);
                        if (rc == 77)
                            continue;
                        EXPECT_EQ_INT(rc, 0);
                        if (fb != 0)
                            printf("  tripped: %lld x %lld spectrum %d table %d x%d dt %d pre %d\n",
                                   (long long)m, (long long)n, kind, tables[ti][0], tables[ti][1],
                                   dt, pre);
                        EXPECT_EQ_INT((int)fb, 0);
                    }
            free(in);
        }
        free(o);
    }
}

/* The bound on the output's singular values, each step's image of the last: quintic's 5 steps
 * from 1 give its fp32 band's top (1.1450); from 1 / norm_scale more; a table that overflows
 * gives infinity, which leaves the guard only the finiteness check. */
TEST(ns_output_bound_follows_the_table)
{
    const struct coeffs q = coeffs_of(NS_TABLE_QUINTIC, 5),
                        pe = coeffs_of(NS_TABLE_POLAR_EXPRESS, 8);
    EXPECT_NEAR(ns_coeffs_output_bound((const float(*)[3])q.c, 5, 1.0), 1.1450, 5e-4);
    EXPECT_NEAR(ns_coeffs_output_bound((const float(*)[3])pe.c, 8, 1.0), 1.0, 1e-3);
    EXPECT_TRUE(ns_coeffs_output_bound((const float(*)[3])q.c, 5, 2.0) >
                ns_coeffs_output_bound((const float(*)[3])q.c, 5, 1.0));
    struct coeffs steep = {.steps = 8, .norm_scale = 1.0f};
    for (int k = 0; k < 8; k++) {
        steep.c[k][0] = 15.0f;
        steep.c[k][1] = 20.0f;
        steep.c[k][2] = 6.0f;
    }
    EXPECT_TRUE(isinf(ns_coeffs_output_bound((const float(*)[3])steep.c, 8, 1.0)));
}

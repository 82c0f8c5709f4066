/* Gram Newton-Schulz on rank-4 inputs past m = 64, where issue 23's 1e-5 (Gram against standard,
 * test_ns_gram's ns_gram_matches_standard_fp32) is below what fp32 reproduces: there OpenBLAS's
 * kernels for different CPUs already give standard results farther apart than that. The output's
 * components in the input's null space are rounding noise that each quintic step multiplies by up
 * to 3.44, so their size is set by the products' summation order, not by the algorithm.
 * bench/ns_floor measures it over BLAS cores, threads, variants and shapes (docs/performance.md,
 * issue 23's Gram accuracy): on rank-4 inputs with m = 96 to 512, standard's results on OpenBLAS's
 * Haswell, SkylakeX and Sandybridge kernels are 1.3-2.5e-5 apart, and the double-accumulating
 * reference kernel, 6.6-6.9e-6 from fp64, is 3.0-6.7e-5 from them. One process can compare the
 * reference kernel and the two BLAS variants: Gram is held to that spread here, not to 1e-5. */
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/ns_coeffs.h"
#include "kernels/ops.h"
#include "ns_singular.h"
#include "ns_test_util.h"
#include "test.h"

/* rows x cols (wide) of rank 4, singular values 1, 1/2, 1/3, 1/4 as test_ns_gram's LOW_RANK */
static float *rank4_input(int rows, int cols, uint64_t seed)
{
    double *sv = calloc((size_t)rows, sizeof(double));
    float *x = malloc(sizeof(float) * (size_t)rows * (size_t)cols);
    for (int i = 0; i < 4; i++)
        sv[i] = 1.0 / (double)(i + 1);
    matrix_with_singular_values(x, rows, cols, sv, seed);
    free(sv);
    return x;
}

/* kernel 0: the reference (double accumulation), 1: BLAS plain, 2: BLAS symmetric */
static void run(int kernel, int algorithm, int rows, int cols, const struct coeffs *t,
                const float *in, float *out)
{
    struct ns_args a = ns_args_of(1, rows, cols, t, in, KDT_F32, out, KDT_F32);
    a.variant = kernel == 2 ? NS_VARIANT_SYMMETRIC : NS_VARIANT_PLAIN;
    a.compute = KDT_F32;
    a.algorithm = algorithm;
    const struct kernel_ctx ctx = {.threads = 1, .stream = NULL};
    struct ns_workspace ws = {.floats = ns_workspace_floats(rows, cols)};
    ws.buf = cpu_alloc(ws.floats * sizeof(float));
    ASSERT_TRUE(ws.buf != NULL);
    ASSERT_EQ_INT(kernel == 0 ? ns_ref_newton_schulz(&ctx, &a, &ws)
                              : ns_blas_newton_schulz(&ctx, &a, &ws),
                  0);
    cpu_free(ws.buf);
}

static double rel(const float *a, const float *b, size_t count)
{
    double *d = malloc(sizeof(double) * count);
    for (size_t i = 0; i < count; i++)
        d[i] = b[i];
    const double e = ns_rel_frobenius(a, KDT_F32, d, count);
    free(d);
    return e;
}

/* On rank-4 inputs with m = 96 to 256, wide and tall: the largest difference between the
 * reference kernel's, BLAS plain's and BLAS symmetric's standard results is above 1e-5 (the
 * premise), and Gram on each kernel is within GRAM_FLOOR_FACTOR of it from that kernel's standard
 * result. Measured here: 0.51-0.53x (also with OPENBLAS_CORETYPE=Haswell, Sandybridge or
 * Nehalem; bench/ns_floor: 0.51-0.58x up to 512 x 2048). With quintic's former fp32 schedule, one
 * restart before step 2 (ns_coeffs_gram_restarts_force), 1.26-1.29x, and without restarts
 * 2.5-2.8x: 0.75 fails both, where 1.5x would pass the former. */
#define GRAM_FLOOR_FACTOR 0.75
TEST(ns_gram_rank4_within_the_fp32_floor_of_standard)
{
    static const int shapes[][2] = {{96, 384}, {128, 512}, {256, 1024}, {400, 160}};
    const struct coeffs t = coeffs_of(NS_TABLE_QUINTIC, 5);
    double worst = 0.0;

    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const int rows = shapes[i][0], cols = shapes[i][1];
        const size_t count = (size_t)rows * (size_t)cols;
        float *in = rows <= cols ? rank4_input(rows, cols, 50 + i) : NULL;
        if (in == NULL) { /* tall: the transpose of a wide one */
            float *w = rank4_input(cols, rows, 50 + i);
            in = malloc(sizeof(float) * count);
            for (int r = 0; r < rows; r++)
                for (int c = 0; c < cols; c++)
                    in[(size_t)r * (size_t)cols + (size_t)c] =
                        w[(size_t)c * (size_t)rows + (size_t)r];
            free(w);
        }
        float *std[3], *gram[3];
        for (int k = 0; k < 3; k++) {
            std[k] = malloc(sizeof(float) * count);
            gram[k] = malloc(sizeof(float) * count);
            run(k, NS_ALGO_STANDARD, rows, cols, &t, in, std[k]);
            run(k, NS_ALGO_GRAM, rows, cols, &t, in, gram[k]);
        }
        double floor = 0.0;
        for (int a = 0; a < 3; a++)
            for (int b = a + 1; b < 3; b++) {
                const double d = rel(std[a], std[b], count);
                floor = d > floor ? d : floor;
            }
        EXPECT_TRUE(floor > 1e-5);
        for (int k = 0; k < 3; k++) {
            const double e = rel(gram[k], std[k], count);
            fprintf(stderr, "  %dx%d %s: gram vs standard %.3g, standard's spread %.3g (%.2fx)\n",
                    rows, cols,
                    k == 0   ? "ref"
                    : k == 1 ? "plain"
                             : "symmetric",
                    e, floor, e / floor);
            EXPECT_TRUE(e <= GRAM_FLOOR_FACTOR * floor);
            worst = e / floor > worst ? e / floor : worst;
            free(std[k]);
            free(gram[k]);
        }
        free(in);
    }
    fprintf(stderr, "  worst: %.2fx the spread of standard\n", worst);
}

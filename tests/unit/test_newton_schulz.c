/* Newton-Schulz: the reference kernel against an fp64 iteration written here from docs/design.md
 * (Update rules), the OpenBLAS variants against the reference, the orthogonalizing property of the
 * tables, and the coefficient tables against the values listed in issue 2. */
#include "kernels/blas_threads.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/ns_coeffs.h"
#include "kernels/ns_shape.h"
#include "kernels/ns_variant.h"
#include "kernels/ops.h"
#include "ns_fp64.h"
#include "ns_singular.h"
#include "ns_test_util.h"
#include "test.h"

typedef int (*ns_fn_t)(const struct kernel_ctx *, const struct ns_args *,
                       const struct ns_workspace *);

struct ns_shape {
    int64_t batch, rows, cols;
};

/* One set of coefficients, as the kernels receive them. */
static const float ns_eps = 1e-8f;

static size_t shape_count(const struct ns_shape *s)
{
    return (size_t)(s->batch * s->rows * s->cols);
}

static struct coeffs table_use(int table, int steps)
{
    struct coeffs t = {.steps = steps};
    t.norm_scale = (float)ns_coeffs_default_norm_scale(table);
    if (ns_coeffs_fill(table, steps, NULL, t.c) != 0)
        t.steps = 0; /* the caller's kernel call then fails the test */
    return t;
}

/* ---- the fp64 oracle (tests/ns_fp64.h) ---- */

static void ns64(const double *u, const struct ns_shape *s, const struct coeffs *t, double *o)
{
    const size_t one = (size_t)(s->rows * s->cols);
    for (int64_t k = 0; k < s->batch; k++)
        ns_fp64(u + k * one, s->rows, s->cols, s->rows > s->cols, (const float(*)[3])t->c, t->steps,
                t->norm_scale, ns_eps, o + k * one);
}

/* ---- data and kernel calls ---- */

static int ns_call(ns_fn_t fn, const struct ns_shape *s, int variant, const void *in, int in_dt,
                   void *out, int out_dt, const struct coeffs *t)
{
    struct ns_args a = ns_args_of(s->batch, s->rows, s->cols, t, in, in_dt, out, out_dt);
    a.eps = ns_eps;
    a.variant = variant;
    a.compute = KDT_F32;
    const struct kernel_ctx ctx = {.threads = 1, .stream = NULL};
    struct ns_workspace ws = {.floats = ns_workspace_floats(s->rows, s->cols)};
    int rc;

    if (t->steps == 0)
        return -2;
    ws.buf = cpu_alloc(ws.floats * sizeof(float));
    rc = ws.buf == NULL ? -3 : fn(&ctx, &a, &ws);
    cpu_free(ws.buf);
    return rc;
}

/* Largest |out - ref| and largest |ref|; a NaN anywhere makes the difference NaN. */
static double max_abs_diff(const void *out, int out_dt, const double *ref, size_t count,
                           double *ref_max)
{
    double d = 0.0, r = 0.0;
    for (size_t i = 0; i < count; i++) {
        const double e = fabs((double)kload(out, out_dt, i) - ref[i]);
        if (isnan(e))
            return NAN;
        d = e > d ? e : d;
        r = fabs(ref[i]) > r ? fabs(ref[i]) : r;
    }
    *ref_max = r;
    return d;
}

static void shape_report(const char *what, const struct ns_shape *s, double err, double tol)
{
    if (!(err <= tol))
        fprintf(stderr, "  %s %" PRId64 "x%" PRId64 "x%" PRId64 ": max |diff| %.3g > %.3g\n", what,
                s->batch, s->rows, s->cols, err, tol);
}

/* Shapes of the reference checks: a scalar, a row, a column, square, wide, tall (worked on
 * transposed) and batches of 3 in both orientations. */
static const struct ns_shape small_shapes[] = {
    {1, 1, 1}, {1, 1, 7}, {1, 7, 1}, {1, 5, 5}, {1, 9, 13}, {1, 13, 9}, {3, 4, 6}, {3, 6, 4},
};
#define N_SMALL (sizeof(small_shapes) / sizeof(small_shapes[0]))

/* Reference kernel vs the fp64 oracle for one dtype pair. Rounding to fp32 between iterations
 * leaves at most 3e-7 of the largest entry over these shapes (measured); 5e-6 keeps a wide margin
 * and still catches a wrong coefficient or product. A bf16 output adds its rounding, 2^-9. */
static void check_ref_vs_fp64(int in_dt, int out_dt, const struct coeffs *t,
                              const struct ns_shape *shapes, size_t nshapes)
{
    for (size_t i = 0; i < nshapes; i++) {
        const struct ns_shape *s = &shapes[i];
        const size_t count = shape_count(s);
        double *u = malloc(count * sizeof(double)), *ref = malloc(count * sizeof(double));
        void *in = ns_input(count, in_dt, 100 + i, u);
        void *out = malloc(count * kdtype_size(out_dt));
        double ref_max = 0.0;

        EXPECT_EQ_INT(ns_call(ns_ref_newton_schulz, s, NS_VARIANT_PLAIN, in, in_dt, out, out_dt, t),
                      0);
        ns64(u, s, t, ref);
        const double err = max_abs_diff(out, out_dt, ref, count, &ref_max);
        const double tol = (out_dt == KDT_BF16 ? 0x1p-8 : 0.0) * ref_max + 5e-6 * ref_max;
        shape_report("ref vs fp64", s, err, tol);
        EXPECT_NEAR(err, 0.0, tol);
        free(u);
        free(ref);
        free(in);
        free(out);
    }
}

TEST(ns_ref_matches_fp64_fp32_io)
{
    const struct coeffs t = table_use(NS_TABLE_QUINTIC, 5);
    check_ref_vs_fp64(KDT_F32, KDT_F32, &t, small_shapes, N_SMALL);
}

TEST(ns_ref_matches_fp64_bf16_io)
{
    const struct coeffs t = table_use(NS_TABLE_QUINTIC, 5);
    check_ref_vs_fp64(KDT_BF16, KDT_BF16, &t, small_shapes, N_SMALL);
    check_ref_vs_fp64(KDT_BF16, KDT_F32, &t, small_shapes, N_SMALL);
    check_ref_vs_fp64(KDT_F32, KDT_BF16, &t, small_shapes, N_SMALL);
}

TEST(ns_ref_matches_fp64_every_table)
{
    const struct ns_shape shapes[] = {{1, 9, 13}, {2, 13, 9}};
    const double custom[2][3] = {{2.0, -1.5, 0.5}, {1.5, -0.5, 0.0}};
    struct coeffs t = table_use(NS_TABLE_JORDAN, 5);

    check_ref_vs_fp64(KDT_F32, KDT_F32, &t, shapes, 2);
    t = table_use(NS_TABLE_POLAR_EXPRESS, 8);
    check_ref_vs_fp64(KDT_F32, KDT_F32, &t, shapes, 2);
    t = (struct coeffs){.steps = 2, .norm_scale = 1.0f};
    ASSERT_EQ_INT(ns_coeffs_fill(NS_TABLE_CUSTOM, 2, custom, t.c), 0);
    check_ref_vs_fp64(KDT_F32, KDT_F32, &t, shapes, 2);
}

/* Shapes of the BLAS checks: odd sizes that fit no blocking, a tall one (transpose = 1), and
 * batches in both orientations. */
static const struct ns_shape blas_shapes[] = {
    {1, 1, 1},    {1, 1, 7},   {1, 7, 1},     {1, 5, 5},   {1, 37, 129},
    {1, 129, 37}, {1, 64, 64}, {1, 100, 300}, {3, 33, 70}, {2, 70, 33},
};
#define N_BLAS    (sizeof(blas_shapes) / sizeof(blas_shapes[0]))
#define BLAS_RTOL 2e-5

/* BLAS variant vs the reference kernel, fp32 in and out. The BLAS products accumulate in fp32
 * (the reference in double): up to 1.5e-6 of the largest entry over these shapes (measured);
 * 2e-5 leaves room for that and for nothing like a wrong product. */
static void check_blas_vs_ref(int variant, const struct coeffs *t)
{
    for (size_t i = 0; i < N_BLAS; i++) {
        const struct ns_shape *s = &blas_shapes[i];
        const size_t count = shape_count(s);
        double *u = malloc(count * sizeof(double)), *ref = malloc(count * sizeof(double));
        float *in = ns_input(count, KDT_F32, 200 + i, u);
        float *o_ref = malloc(count * sizeof(float)), *o_blas = malloc(count * sizeof(float));
        double ref_max = 0.0;

        EXPECT_EQ_INT(
            ns_call(ns_ref_newton_schulz, s, NS_VARIANT_PLAIN, in, KDT_F32, o_ref, KDT_F32, t), 0);
        EXPECT_EQ_INT(ns_call(ns_blas_newton_schulz, s, variant, in, KDT_F32, o_blas, KDT_F32, t),
                      0);
        for (size_t j = 0; j < count; j++)
            ref[j] = o_ref[j];
        const double err = max_abs_diff(o_blas, KDT_F32, ref, count, &ref_max);
        shape_report(variant == NS_VARIANT_PLAIN ? "plain vs ref" : "symmetric vs ref", s, err,
                     BLAS_RTOL * ref_max);
        EXPECT_NEAR(err, 0.0, BLAS_RTOL * ref_max);
        free(u);
        free(ref);
        free(in);
        free(o_ref);
        free(o_blas);
    }
}

TEST(ns_blas_plain_matches_ref)
{
    const struct coeffs q = table_use(NS_TABLE_QUINTIC, 5);
    const struct coeffs p = table_use(NS_TABLE_POLAR_EXPRESS, 8);
    check_blas_vs_ref(NS_VARIANT_PLAIN, &q);
    check_blas_vs_ref(NS_VARIANT_PLAIN, &p);
}

TEST(ns_blas_symmetric_matches_ref)
{
    const struct coeffs q = table_use(NS_TABLE_QUINTIC, 5);
    const struct coeffs p = table_use(NS_TABLE_POLAR_EXPRESS, 8);
    check_blas_vs_ref(NS_VARIANT_SYMMETRIC, &q);
    check_blas_vs_ref(NS_VARIANT_SYMMETRIC, &p);
}

/* Large enough that OpenBLAS blocks and threads the products (sizes off every block edge). */
TEST(ns_blas_variants_agree_on_large_shape)
{
    const struct ns_shape s = {1, 300, 520};
    const struct coeffs t = table_use(NS_TABLE_QUINTIC, 5);
    const size_t count = shape_count(&s);
    double *u = malloc(count * sizeof(double)), *plain64 = malloc(count * sizeof(double));
    float *in = ns_input(count, KDT_F32, 7, u);
    float *o_plain = malloc(count * sizeof(float)), *o_sym = malloc(count * sizeof(float));
    double ref_max = 0.0;

    EXPECT_EQ_INT(
        ns_call(ns_blas_newton_schulz, &s, NS_VARIANT_PLAIN, in, KDT_F32, o_plain, KDT_F32, &t), 0);
    EXPECT_EQ_INT(
        ns_call(ns_blas_newton_schulz, &s, NS_VARIANT_SYMMETRIC, in, KDT_F32, o_sym, KDT_F32, &t),
        0);
    for (size_t j = 0; j < count; j++)
        plain64[j] = o_plain[j];
    const double err = max_abs_diff(o_sym, KDT_F32, plain64, count, &ref_max);
    EXPECT_TRUE(ref_max > 0.01);
    EXPECT_NEAR(err, 0.0, BLAS_RTOL * ref_max);
    free(u);
    free(plain64);
    free(in);
    free(o_plain);
    free(o_sym);
}

/* Same bits on every run for a given thread count: what lets a rerun or another rank reproduce a
 * step exactly. Run at 1 and at 2 OpenBLAS threads, restoring the setting after. */
TEST(ns_blas_deterministic)
{
    const struct ns_shape s = {2, 300, 170};
    const struct coeffs t = table_use(NS_TABLE_QUINTIC, 5);
    const size_t count = shape_count(&s);
    const int saved = blas_threads_get();
    double *u = malloc(count * sizeof(double));
    float *in = ns_input(count, KDT_F32, 9, u);
    float *o1 = malloc(count * sizeof(float)), *o2 = malloc(count * sizeof(float));

    for (int threads = 1; threads <= 2; threads++) {
        blas_threads_set(threads);
        for (int variant = NS_VARIANT_PLAIN; variant <= NS_VARIANT_SYMMETRIC; variant++) {
            memset(o2, 0xff, count * sizeof(float));
            EXPECT_EQ_INT(ns_call(ns_blas_newton_schulz, &s, variant, in, KDT_F32, o1, KDT_F32, &t),
                          0);
            EXPECT_EQ_INT(ns_call(ns_blas_newton_schulz, &s, variant, in, KDT_F32, o2, KDT_F32, &t),
                          0);
            EXPECT_TRUE(memcmp(o1, o2, count * sizeof(float)) == 0);
        }
    }
    blas_threads_set(saved);
    free(u);
    free(in);
    free(o1);
    free(o2);
}

TEST(ns_kernels_reject_what_they_cannot_run)
{
    const struct coeffs t = table_use(NS_TABLE_QUINTIC, 5);
    const struct ns_shape s = {1, 6, 10};
    const struct kernel_ctx ctx = {.threads = 1, .stream = NULL};
    double u[60];
    float *in = ns_input(60, KDT_F32, 3, u), out[60];
    float ws_buf[512];
    struct ns_args a = {.batch = 1,
                        .rows = 10,
                        .cols = 6,
                        .transpose = 0, /* tall without transpose: m > n */
                        .in = in,
                        .in_dtype = KDT_F32,
                        .out = out,
                        .out_dtype = KDT_F32,
                        .coeffs = (const float(*)[3])t.c,
                        .steps = t.steps,
                        .norm_scale = 1.0f,
                        .eps = ns_eps,
                        .variant = NS_VARIANT_PLAIN};
    struct ns_workspace ws = {.buf = ws_buf, .floats = 512};

    EXPECT_EQ_INT(ns_blas_newton_schulz(&ctx, &a, &ws), -1);
    EXPECT_EQ_INT(ns_ref_newton_schulz(&ctx, &a, &ws), -1);
    a.transpose = 1;
    ws.floats = ns_workspace_floats(10, 6) - 1;
    EXPECT_EQ_INT(ns_blas_newton_schulz(&ctx, &a, &ws), -1);
    EXPECT_EQ_INT(ns_ref_newton_schulz(&ctx, &a, &ws), -1);
    ws.floats = 512;
    a.variant = 2;
    EXPECT_EQ_INT(ns_blas_newton_schulz(&ctx, &a, &ws), -1);
    a.variant = -1;
    EXPECT_EQ_INT(ns_blas_newton_schulz(&ctx, &a, &ws), -1);
    a.variant = NS_VARIANT_SYMMETRIC;
    EXPECT_EQ_INT(ns_blas_newton_schulz(&ctx, &a, &ws), 0);
    EXPECT_EQ_INT(
        ns_call(ns_blas_newton_schulz, &s, NS_VARIANT_SYMMETRIC, in, KDT_F32, out, KDT_F32, &t), 0);
    free(in);
}

TEST(ns_zero_matrix_gives_zeros)
{
    const struct ns_shape shapes[] = {{1, 6, 10}, {1, 10, 6}, {2, 5, 5}};
    const struct coeffs t = table_use(NS_TABLE_QUINTIC, 5);
    const ns_fn_t fns[] = {ns_ref_newton_schulz, ns_blas_newton_schulz, ns_blas_newton_schulz};
    const int variants[] = {NS_VARIANT_PLAIN, NS_VARIANT_PLAIN, NS_VARIANT_SYMMETRIC};

    for (size_t i = 0; i < 3; i++)
        for (int f = 0; f < 3; f++)
            for (int out_dt = KDT_F32; out_dt <= KDT_BF16; out_dt++) {
                const size_t count = shape_count(&shapes[i]);
                uint16_t *in = calloc(count, sizeof(uint16_t)); /* bf16 zeros */
                float *out = malloc(count * sizeof(float));
                int bad = 0;

                memset(out, 0x7f, count * sizeof(float)); /* NaN-free, nonzero garbage */
                EXPECT_EQ_INT(
                    ns_call(fns[f], &shapes[i], variants[f], in, KDT_BF16, out, out_dt, &t), 0);
                for (size_t j = 0; j < count; j++) {
                    const float v = kload(out, out_dt, j);
                    bad += isnan(v) || v != 0.0f;
                }
                EXPECT_EQ_INT(bad, 0);
                free(in);
                free(out);
            }
}

/* ---- orthogonalizing property: singular values of O from the eigenvalues of O*O^T ---- */

TEST(ns_jacobi_finds_known_singular_values)
{
    /* rows scaled by 0.5, 2 and 3 of an orthonormal 3 x 4 matrix: singular values 0.5, 2, 3 */
    const float x[12] = {0.5f,        0,           0, 0, 0,           0,
                         2.0f * 0.6f, 2.0f * 0.8f, 0, 0, 3.0f * 0.8f, -3.0f * 0.6f};
    double smin, smax;
    singular_range(x, 3, 4, 1.0, &smin, &smax);
    EXPECT_NEAR(smin, 0.5, 1e-6);
    EXPECT_NEAR(smax, 3.0, 1e-6);
}

/* The random 256 x 512 input of the property tests: uniform [-1, 1), seed 42. */
static float *property_input(void)
{
    double *u = malloc(sizeof(double) * 256 * 512);
    float *in = ns_input(256 * 512, KDT_F32, 42, u);
    free(u);
    return in;
}

static void check_singular_band(int table, int steps, double lo, double hi, int strict)
{
    const struct ns_shape s = {1, 256, 512};
    const struct coeffs t = table_use(table, steps);
    float *in = property_input(), *out = malloc(sizeof(float) * 256 * 512);

    for (int variant = NS_VARIANT_PLAIN; variant <= NS_VARIANT_SYMMETRIC; variant++) {
        double smin, smax;
        EXPECT_EQ_INT(ns_call(ns_blas_newton_schulz, &s, variant, in, KDT_F32, out, KDT_F32, &t),
                      0);
        singular_range(out, 256, 512, 1.0, &smin, &smax);
        if (strict) {
            EXPECT_TRUE(smin > lo);
            EXPECT_TRUE(smax < hi);
        } else {
            EXPECT_TRUE(smin >= lo);
            EXPECT_TRUE(smax <= hi);
        }
        if (test_failures)
            fprintf(stderr, "  variant %d: singular values in [%.4f, %.4f]\n", variant, smin, smax);
    }
    free(in);
    free(out);
}

TEST(ns_polar_express_8_steps_singular_values_near_1)
{
    check_singular_band(NS_TABLE_POLAR_EXPRESS, 8, 0.95, 1.05, 0);
}

/* Jordan's coefficients trade accuracy for speed: after 5 steps the singular values land in a
 * band around 1 only if the smallest normalised one started large enough to be lifted (slope
 * 3.4445 at 0). This input's smallest singular value over its Frobenius norm is about 0.018
 * (checked below), which 5 steps take well past the band's lower edge. */
TEST(ns_jordan_5_steps_singular_values_in_band)
{
    float *in = property_input();
    double fro2 = 0.0, smin, smax;

    for (int i = 0; i < 256 * 512; i++)
        fro2 += (double)in[i] * in[i];
    singular_range(in, 256, 512, 1.0 / sqrt(fro2), &smin, &smax);
    EXPECT_TRUE(smin > 0.01 && smin < 0.03);
    free(in);
    check_singular_band(NS_TABLE_JORDAN, 5, 0.5, 1.5, 1);
}

/* ---- coefficient tables: exactly the values of issue 2 ---- */

static void expect_triples(float got[][3], const double want[][3], int count)
{
    for (int i = 0; i < count; i++)
        for (int j = 0; j < 3; j++)
            EXPECT_EQ_U32(f32_bits(got[i][j]), f32_bits((float)want[i][j]));
}

static const double want_quintic[5][3] = {
    {4.0848, -6.8946, 2.9270}, {3.9505, -6.3029, 2.6377}, {3.7418, -5.5913, 2.3037},
    {2.8769, -3.1427, 1.2046}, {2.8366, -3.0525, 1.2012},
};

static const double want_polar[8][3] = {
    {8.2051604140, -22.9019349871, 16.4607249102}, {4.0663951599, -2.8611540868, 0.5183995227},
    {3.9095949044, -2.8233517350, 0.5250369769},   {3.2855640172, -2.4153019596, 0.4852940655},
    {2.2778732871, -1.6198217653, 0.3984807870},   {1.8725756513, -1.2307042575, 0.3585161621},
    {1.8564371098, -1.2132392819, 0.3567997894},   {1.875, -1.25, 0.375},
};

TEST(ns_coeffs_quintic_exact_and_repeats_last)
{
    float c[NS_TABLE_MAX_STEPS][3];

    ASSERT_EQ_INT(ns_coeffs_fill(NS_TABLE_QUINTIC, 5, NULL, c), 0);
    expect_triples(c, want_quintic, 5);
    ASSERT_EQ_INT(ns_coeffs_fill(NS_TABLE_QUINTIC, NS_TABLE_MAX_STEPS, NULL, c), 0);
    expect_triples(c, want_quintic, 5);
    for (int i = 5; i < NS_TABLE_MAX_STEPS; i++)
        expect_triples(c + i, want_quintic + 4, 1);
    ASSERT_EQ_INT(ns_coeffs_fill(NS_TABLE_QUINTIC, 2, NULL, c), 0);
    expect_triples(c, want_quintic, 2);
    EXPECT_EQ_INT(ns_coeffs_fill(NS_TABLE_QUINTIC, 0, NULL, c), -1);
    EXPECT_EQ_INT(ns_coeffs_fill(NS_TABLE_QUINTIC, NS_TABLE_MAX_STEPS + 1, NULL, c), -1);
    EXPECT_NEAR(ns_coeffs_default_norm_scale(NS_TABLE_QUINTIC), 1.0, 0.0);
}

TEST(ns_coeffs_jordan_every_step)
{
    const double want[1][3] = {{3.4445, -4.7750, 2.0315}};
    float c[NS_TABLE_MAX_STEPS][3];

    ASSERT_EQ_INT(ns_coeffs_fill(NS_TABLE_JORDAN, 7, NULL, c), 0);
    for (int i = 0; i < 7; i++)
        expect_triples(c + i, want, 1);
    EXPECT_EQ_INT(ns_coeffs_fill(NS_TABLE_JORDAN, 0, NULL, c), -1);
    EXPECT_NEAR(ns_coeffs_default_norm_scale(NS_TABLE_JORDAN), 1.0, 0.0);
}

TEST(ns_coeffs_polar_express_exact_range_and_scale)
{
    float c[NS_TABLE_MAX_STEPS][3];
    int lo, hi;

    ASSERT_EQ_INT(ns_coeffs_fill(NS_TABLE_POLAR_EXPRESS, 8, NULL, c), 0);
    expect_triples(c, want_polar, 8);
    ASSERT_EQ_INT(ns_coeffs_fill(NS_TABLE_POLAR_EXPRESS, 5, NULL, c), 0);
    expect_triples(c, want_polar, 5);
    EXPECT_EQ_INT(ns_coeffs_fill(NS_TABLE_POLAR_EXPRESS, 4, NULL, c), -1);
    EXPECT_EQ_INT(ns_coeffs_fill(NS_TABLE_POLAR_EXPRESS, 9, NULL, c), -1);
    ns_coeffs_step_range(NS_TABLE_POLAR_EXPRESS, &lo, &hi);
    EXPECT_EQ_INT(lo, 5);
    EXPECT_EQ_INT(hi, 8);
    ns_coeffs_step_range(NS_TABLE_QUINTIC, &lo, &hi);
    EXPECT_EQ_INT(lo, 1);
    EXPECT_EQ_INT(hi, NS_TABLE_MAX_STEPS);
    EXPECT_NEAR(ns_coeffs_default_norm_scale(NS_TABLE_POLAR_EXPRESS), 1.01, 0.0);
}

TEST(ns_coeffs_custom_takes_callers_triples)
{
    const double mine[3][3] = {{1.5, -0.5, 0.0}, {2.0, -1.25, 0.25}, {3.0, 0.125, -7.5}};
    float c[NS_TABLE_MAX_STEPS][3];

    ASSERT_EQ_INT(ns_coeffs_fill(NS_TABLE_CUSTOM, 3, mine, c), 0);
    expect_triples(c, mine, 3);
    EXPECT_EQ_INT(ns_coeffs_fill(NS_TABLE_CUSTOM, 3, NULL, c), -1);
    EXPECT_EQ_INT(ns_coeffs_fill(NS_TABLE_CUSTOM, 0, mine, c), -1);
    EXPECT_EQ_INT(ns_coeffs_fill(NS_TABLE_CUSTOM, NS_TABLE_MAX_STEPS + 1, mine, c), -1);
    EXPECT_NEAR(ns_coeffs_default_norm_scale(NS_TABLE_CUSTOM), 1.0, 0.0);
    EXPECT_EQ_INT(ns_coeffs_fill(5, 5, NULL, c), -1);
    EXPECT_EQ_INT(ns_coeffs_fill(-1, 5, NULL, c), -1);
}

TEST(ns_flops_count_the_working_shape)
{
    /* m = 3 <= n = 5: 4*9*5 + 2*27 either way round */
    EXPECT_NEAR(ns_flops_per_iter(3, 5), 234.0, 0.0);
    EXPECT_NEAR(ns_flops_per_iter(5, 3), 234.0, 0.0);
    EXPECT_NEAR(ns_flops_per_iter(1408, 4096), 4.0 * 1408 * 1408 * 4096 + 2.0 * 1408 * 1408 * 1408,
                0.0);
}

/* ---- the committed crossover table (kernels/cpu/ns_variant_table.c) ---- */

TEST(ns_variant_table_follows_the_working_shape)
{
    const int64_t sides[] = {1, 7, 64, 383, 384, 1024, 1408, 4096};
    const int n = (int)(sizeof(sides) / sizeof(sides[0]));

    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            const int v = ns_variant_for_shape(sides[i], sides[j]);
            const int64_t m = sides[i] < sides[j] ? sides[i] : sides[j];
            EXPECT_EQ_INT(v, ns_variant_for_shape(sides[j], sides[i]));
            /* the measured crossover: symmetric from a shorter side of 384 on, whatever n/m */
            EXPECT_EQ_INT(v, m >= 384 ? NS_VARIANT_SYMMETRIC : NS_VARIANT_PLAIN);
        }
}

TEST(ns_variant_table_picks_what_blas_runs)
{
    const struct ns_shape shapes[] = {{1, 16, 40}, {1, 384, 400}};
    const struct coeffs t = table_use(NS_TABLE_QUINTIC, 1);

    for (int i = 0; i < 2; i++) {
        const struct ns_shape *s = &shapes[i];
        const size_t count = shape_count(s);
        double *u = malloc(count * sizeof(double)), *ref = malloc(count * sizeof(double));
        float *in = ns_input(count, KDT_F32, 5, u), *out = malloc(count * sizeof(float));
        float *o_ref = malloc(count * sizeof(float));
        const int variant = ns_variant_for_shape(s->rows, s->cols);
        /* one shape of each variant, and what runs agrees with the portable reference */
        EXPECT_EQ_INT(variant, i == 0 ? NS_VARIANT_PLAIN : NS_VARIANT_SYMMETRIC);
        EXPECT_EQ_INT(ns_call(ns_blas_newton_schulz, s, variant, in, KDT_F32, out, KDT_F32, &t), 0);
        EXPECT_EQ_INT(
            ns_call(ns_ref_newton_schulz, s, NS_VARIANT_PLAIN, in, KDT_F32, o_ref, KDT_F32, &t), 0);
        double ref_max = 0.0;
        for (size_t j = 0; j < count; j++)
            ref[j] = o_ref[j];
        const double err = max_abs_diff(out, KDT_F32, ref, count, &ref_max);
        EXPECT_TRUE(ref_max > 0.01);
        EXPECT_NEAR(err, 0.0, BLAS_RTOL * ref_max);
        free(ref);
        free(o_ref);
        free(u);
        free(in);
        free(out);
    }
}

/* The sharded update (a team member's block) on blocks wider and narrower than m: narrower ones
 * take the form without A A (kernels/ns_shape.h, ns_shard_narrow), which must be the same
 * polynomial: the reference and BLAS kernels against a X + b A X + c A (A X) in double, for each
 * quintic step's coefficients, within fp32 rounding; and the FLOP count of each form. */
TEST(ns_shard_update_forms_match_the_polynomial)
{
    const struct coeffs t = table_use(NS_TABLE_QUINTIC, 5);
    const int64_t m = 48, widths[] = {1, 12, 47, 48, 96};
    for (size_t w = 0; w < sizeof widths / sizeof widths[0]; w++) {
        const int64_t n = widths[w];
        float *x = malloc(sizeof(float) * (size_t)(2 * m * n + 2 * m * m)), *y = x + m * n;
        float *g = y + m * n, *B = g + m * m;
        double *AX = malloc(sizeof(double) * (size_t)(2 * m * n)), *AAX = AX + m * n;
        uint64_t seed = 99 + (uint64_t)n;
        for (int64_t i = 0; i < m * n; i++)
            x[i] = (float)test_rand(&seed) * 0.1f;
        ns_shard_gram_ref(NULL, x, m, n, g);
        for (int r = 0; r < 2; r++) /* AX, then A(AX), in double from the same fp32 A and X */
            for (int64_t i = 0; i < m * n; i++) {
                double v = 0;
                for (int64_t q = 0; q < m; q++)
                    v += (double)g[i / n * m + q] * (r ? AX[q * n + i % n] : x[q * n + i % n]);
                (r ? AAX : AX)[i] = v;
            }
        for (int s = 0; s < t.steps; s++)
            for (int k = 0; k < 2; k++) {
                const float *c = t.c[s];
                double num = 0, den = 0;
                (k == 0 ? ns_shard_update_ref : ns_shard_update_blas)(NULL, g, c, x, m, n, B, y);
                for (int64_t i = 0; i < m * n; i++) {
                    const double want = c[0] * (double)x[i] + c[1] * AX[i] + c[2] * AAX[i];
                    num += (y[i] - want) * (y[i] - want);
                    den += want * want;
                }
                EXPECT_TRUE(sqrt(num / den) < 1e-5);
            }
        EXPECT_EQ_INT(ns_shard_narrow((double)m, (double)n), n < m);
        EXPECT_NEAR(ns_shard_iter_flops((double)m, (double)n, 1),
                    n < m ? 6.0 * m * m * n : 4.0 * m * m * n + 2.0 * m * m * m, 0.0);
        /* narrow form not allowed (a bf16 team, kernels/cpu/ns_bf16.c): A^2 at every width */
        EXPECT_NEAR(ns_shard_iter_flops((double)m, (double)n, 0), 4.0 * m * m * n + 2.0 * m * m * m,
                    0.0);
        free(x);
        free(AX);
    }
}

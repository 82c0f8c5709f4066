/* The CUDA backend's Newton-Schulz driver (kernels/cuda/ns_driver.h) run with host stand-ins
 * for cuBLAS and the CUDA kernels (ns_driver_host.cu): every shape class (square, wide, tall
 * through the transpose, odd sizes, a single row), batches, in-place, both dtypes in and out,
 * against the fp64 oracle within the bf16 tolerance of the GPU tests (relative Frobenius
 * <= 1.5e-2); batches split over a small workspace give the same bits; the workspace and
 * orientation contracts are enforced. What this cannot check is cuBLAS itself and the CUDA
 * kernels: tests/gpu/test_cuda_kernels.c does, where a GPU is present. */
#include "kernels/ns_coeffs.h"
#include "kernels/ops.h"
#include "ns_fp64.h"
#include "ns_test_util.h"
#include "test.h"

int ns_driver_host_run(const struct ns_args *a, void *ws, size_t ws_bytes, int *gemms,
                       int *mirrors);
size_t ns_driver_host_ws_bytes(int64_t rows, int64_t cols, int64_t batch);

/* The larger error, NaN winning: a NaN result must fail the check, not vanish in a max. */
static double worse(double a, double b) { return a != a || b != b ? NAN : a > b ? a : b; }

/* Whether every bf16 m x m matrix of the batch equals its transpose bit for bit. */
static int all_symmetric(const uint16_t *a, int64_t m, int64_t batch)
{
    for (int64_t z = 0; z < batch; z++)
        for (int64_t r = 0; r < m; r++)
            for (int64_t c = r + 1; c < m; c++)
                if (a[z * m * m + r * m + c] != a[z * m * m + c * m + r])
                    return 0;
    return 1;
}

/* One case: the driver against ns_fp64 matrix by matrix; returns the worst error. block > 0:
 * the symmetric variant with that many rows per block. The workspace starts as bf16 NaNs, so a
 * product that reads what no earlier step wrote fails the comparison. */
static double check_case_v(int64_t batch, int64_t rows, int64_t cols, int transpose, int in_dt,
                           int out_dt, int table, int steps, int64_t block)
{
    const struct coeffs t = coeffs_of(table, steps);
    const size_t one = (size_t)(rows * cols), count = (size_t)batch * one;
    double *u = malloc(sizeof(double) * count), *ref = malloc(sizeof(double) * one);
    void *in = ns_input(count, in_dt, (uint64_t)(rows * 131 + cols * 7 + batch), u);
    void *out = malloc(count * kdtype_size(out_dt));
    const size_t wsb = ns_driver_host_ws_bytes(rows, cols, batch);
    void *ws = malloc(wsb);
    struct ns_args a = ns_args_of(batch, rows, cols, &t, in, in_dt, out, out_dt);
    const int64_t m = rows < cols ? rows : cols, n = rows < cols ? cols : rows;
    const int64_t blocks = block > 0 ? (m + block - 1) / block : 1;
    int gemms = 0, mirrors = 0;
    double worst = 0;

    a.transpose = transpose;
    if (block > 0) {
        a.variant = NS_VARIANT_SYMMETRIC;
        a.block = (int)block;
    }
    memset(ws, 0xff, wsb);
    EXPECT_EQ_INT(ns_driver_host_run(&a, ws, wsb, &gemms, &mirrors), 0);
    /* the whole batch in one pass: 3 batched products a step, or one per block column for
     * X X^T and for A A; the two mirrors only when there is more than one block column */
    EXPECT_EQ_INT(gemms, (int)(steps * (blocks > 1 ? 2 * blocks + 1 : 3)));
    EXPECT_EQ_INT(mirrors, blocks > 1 ? 2 * steps : 0);
    if (blocks > 1) { /* the last step's A and B, mirrored: exactly symmetric */
        const uint16_t *A = (const uint16_t *)ws + 2 * batch * m * n;
        EXPECT_TRUE(all_symmetric(A, m, batch));
        EXPECT_TRUE(all_symmetric(A + batch * m * m, m, batch));
    }
    for (int64_t k = 0; k < batch; k++) {
        ns_fp64(u + k * one, rows, cols, transpose, (const float(*)[3])t.c, t.steps, t.norm_scale,
                1e-8, ref);
        const double e =
            ns_rel_frobenius((const char *)out + k * one * kdtype_size(out_dt), out_dt, ref, one);
        worst = worse(worst, e);
    }
    if (!(worst <= 1.5e-2))
        fprintf(stderr, "  batch %lld, %lld x %lld: relative Frobenius error %.3e\n",
                (long long)batch, (long long)rows, (long long)cols, worst);
    EXPECT_TRUE(worst <= 1.5e-2);
    free(u);
    free(ref);
    free(in);
    free(out);
    free(ws);
    return worst;
}

static double check_case_t(int64_t batch, int64_t rows, int64_t cols, int transpose, int in_dt,
                           int out_dt, int table, int steps)
{
    return check_case_v(batch, rows, cols, transpose, in_dt, out_dt, table, steps, 0);
}

static double check_case(int64_t batch, int64_t rows, int64_t cols, int in_dt, int out_dt,
                         int table, int steps)
{
    return check_case_t(batch, rows, cols, rows > cols, in_dt, out_dt, table, steps);
}

TEST(ns_driver_matches_fp64_every_shape_class)
{
    double worst = 0, e;
    /* square, wide, tall (transposed), odd, one row; quintic (the default, the table the
     * tolerance is stated for) and polar_express */
    e = check_case(1, 32, 32, KDT_F32, KDT_F32, NS_TABLE_QUINTIC, 5);
    worst = worse(worst, e);
    e = check_case(3, 24, 40, KDT_BF16, KDT_BF16, NS_TABLE_QUINTIC, 5);
    worst = worse(worst, e);
    e = check_case(2, 40, 24, KDT_BF16, KDT_F32, NS_TABLE_QUINTIC, 5);
    worst = worse(worst, e);
    e = check_case(2, 7, 13, KDT_F32, KDT_BF16, NS_TABLE_QUINTIC, 5);
    worst = worse(worst, e);
    e = check_case(1, 1, 33, KDT_F32, KDT_F32, NS_TABLE_QUINTIC, 5);
    worst = worse(worst, e);
    e = check_case(1, 50, 3, KDT_BF16, KDT_BF16, NS_TABLE_POLAR_EXPRESS, 8);
    worst = worse(worst, e);
    /* a square matrix registered transposed works on its transpose (sharding/layout.c) */
    e = check_case_t(2, 24, 24, 1, KDT_F32, KDT_F32, NS_TABLE_QUINTIC, 5);
    worst = worse(worst, e);
    printf("  worst relative Frobenius error vs fp64: %.3e\n", worst);
}

/* The symmetric variant (block lower triangles of A and B, mirrored): within the same bound of
 * fp64 for even and uneven block columns, a block of one row, wide and tall shapes, batches;
 * a block as large as m runs the plain products. */
TEST(ns_driver_symmetric_variant_matches_fp64)
{
    double worst = 0, e;
    e = check_case_v(1, 32, 32, 0, KDT_F32, KDT_F32, NS_TABLE_QUINTIC, 5, 8);
    worst = worse(worst, e);
    e = check_case_v(3, 24, 40, 0, KDT_BF16, KDT_BF16, NS_TABLE_QUINTIC, 5, 10); /* 10, 10, 4 */
    worst = worse(worst, e);
    e = check_case_v(2, 40, 24, 1, KDT_BF16, KDT_F32, NS_TABLE_QUINTIC, 5, 7);
    worst = worse(worst, e);
    e = check_case_v(1, 13, 29, 0, KDT_F32, KDT_F32, NS_TABLE_POLAR_EXPRESS, 8, 1);
    worst = worse(worst, e);
    e = check_case_v(2, 24, 24, 1, KDT_F32, KDT_F32, NS_TABLE_QUINTIC, 5, 12);
    worst = worse(worst, e);
    e = check_case_v(1, 16, 48, 0, KDT_F32, KDT_F32, NS_TABLE_QUINTIC, 5, 16); /* one block */
    worst = worse(worst, e);
    printf("  worst relative Frobenius error vs fp64: %.3e\n", worst);
}

/* A workspace for one matrix runs a batch of 3 in three passes with the same bits; in == out
 * works; a workspace too small for one matrix, or a transpose flag that disagrees with the
 * shape, is refused. */
TEST(ns_driver_chunks_in_place_and_refusals)
{
    const struct coeffs t = coeffs_of(NS_TABLE_QUINTIC, 5);
    const int64_t batch = 3, rows = 20, cols = 36;
    const size_t count = (size_t)(batch * rows * cols);
    double *u = malloc(sizeof(double) * count);
    float *in = ns_input(count, KDT_F32, 11, u);
    float *full = malloc(count * sizeof(float)), *split = malloc(count * sizeof(float));
    float *inplace = malloc(count * sizeof(float));
    const size_t big = ns_driver_host_ws_bytes(rows, cols, batch);
    const size_t small = ns_driver_host_ws_bytes(rows, cols, 1);
    void *ws = malloc(big);
    int gemms = 0;

    struct ns_args a = ns_args_of(batch, rows, cols, &t, in, KDT_F32, full, KDT_F32);
    EXPECT_EQ_INT(ns_driver_host_run(&a, ws, big, &gemms, NULL), 0);
    EXPECT_EQ_INT(gemms, 3 * 5);
    a.out = split;
    EXPECT_EQ_INT(ns_driver_host_run(&a, ws, small, &gemms, NULL), 0);
    EXPECT_EQ_INT(gemms, 3 * 3 * 5); /* three passes of one matrix */
    EXPECT_EQ_INT(memcmp(full, split, count * sizeof(float)), 0);
    memcpy(inplace, in, count * sizeof(float));
    a.in = inplace;
    a.out = inplace;
    EXPECT_EQ_INT(ns_driver_host_run(&a, ws, big, NULL, NULL), 0);
    EXPECT_EQ_INT(memcmp(full, inplace, count * sizeof(float)), 0);

    a.in = in;
    a.out = split;
    EXPECT_EQ_INT(ns_driver_host_run(&a, ws, small - 1, NULL, NULL), -1);
    a.transpose = 1; /* 20 x 36 is wide: working on its transpose would be the wrong side */
    EXPECT_EQ_INT(ns_driver_host_run(&a, ws, big, NULL, NULL), -1);
    a.transpose = 0;
    a.variant = 7; /* no such variant */
    EXPECT_EQ_INT(ns_driver_host_run(&a, ws, big, NULL, NULL), -1);
    free(u);
    free(in);
    free(full);
    free(split);
    free(inplace);
    free(ws);
}

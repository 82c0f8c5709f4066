/* Newton-Schulz on OpenBLAS. The a*X + B*X combination is one GEMM: (B + a*I) * X.
 *
 * The symmetric variant forms only the upper triangles of A = X*X^T and of A*A (= A*A^T, A being
 * symmetric) with ssyrk, mirrors them, and keeps sgemm for the one non-symmetric product: about
 * 3m^2n + m^3 FLOPs per iteration instead of 4m^2n + 2m^3.
 *
 * Why ssyrk and not our own blocking (sgemm on the row panels i <= j of the upper triangle, then
 * mirror): measured on this machine (AMD EPYC Zen 4, 2 cores, OpenBLAS 0.3.21 Cooperlake
 * kernels, 2 threads, median of 5), the upper triangle of X*X^T took
 *   m x n        sgemm (full)   ssyrk     panels nb=128 / 256 / 512
 *   1024x1024     10.4 ms       6.0 ms    7.4 / 7.4 / 8.2 ms
 *   2048x2048     82.7 ms      45.6 ms   55.3 / 51.9 / 54.3 ms
 *   1408x4096     76.6 ms      44.2 ms   52.8 / 50.2 / 53.6 ms
 * and A*A at m = 2048: ssyrk 45.2 ms, panels 49.9 ms at best, sgemm 82.2 ms. For B*X, ssymm and
 * sgemm were within 3% of each other either way (82.1 vs 84.1 ms at 2048^2); sgemm on the
 * mirrored B is kept, so both variants finish with the same kernel.
 *
 * Both variants give the same bits on every run for a given OpenBLAS thread count: OpenBLAS
 * divides sgemm and ssyrk work over blocks of the output, never over the reduction dimension
 * (test_newton_schulz checks it at 1 and 2 threads). */
#include <cblas.h>
#include <string.h>

#include "cpu_kernels.h"
#include "ns_bf16.h"
#include "ns_common.h"

/* A = X X^T, then Y = (a I + b A + c A A) X: the same two calls a sharded matrix makes around
 * its Gram all-reduce. */
static void ns_iter_plain(const struct kernel_ctx *ctx, int64_t m, int64_t n, const float c[3],
                          const float *x, float *y, float *A, float *B)
{
    ns_shard_gram_blas(ctx, x, m, n, A);
    ns_shard_update_blas(ctx, A, c, x, m, n, B, y);
}

static void sym_gram(const struct kernel_ctx *ctx, const float *x, int64_t m, int64_t n, float *A)
{
    (void)ctx; /* OpenBLAS's threads are process-wide */
    cblas_ssyrk(CblasRowMajor, CblasUpper, CblasNoTrans, (int)m, (int)n, 1.0f, x, (int)n, 0.0f, A,
                (int)m);
    ns_mirror_upper(A, m, sizeof(float)); /* ssyrk reads its input as a general matrix */
}

/* B = c0 I + c1 A + c2 A A from a symmetric A: A A = A A^T, the upper half by ssyrk */
static void sym_poly(const struct kernel_ctx *ctx, const float *A, const float c[3], int64_t m,
                     float *B)
{
    (void)ctx;
    memcpy(B, A, sizeof(float) * (size_t)(m * m));
    cblas_ssyrk(CblasRowMajor, CblasUpper, CblasNoTrans, (int)m, (int)m, c[2], A, (int)m, c[1], B,
                (int)m);
    ns_mirror_upper(B, m, sizeof(float));
    for (int64_t i = 0; i < m; i++)
        B[i * m + i] += c[0];
}

static void plain_apply(const struct kernel_ctx *ctx, const float *B, const float *x, int64_t m,
                        int64_t n, float *y)
{
    (void)ctx;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)n, (int)m, 1.0f, B, (int)m,
                x, (int)n, 0.0f, y, (int)n);
}

static void sym_update(const struct kernel_ctx *ctx, const float *A, const float c[3],
                       const float *x, int64_t m, int64_t n, float *B, float *y)
{
    sym_poly(ctx, A, c, m, B);
    plain_apply(ctx, B, x, m, n, y);
}

static void ns_iter_symmetric(const struct kernel_ctx *ctx, int64_t m, int64_t n, const float c[3],
                              const float *x, float *y, float *A, float *B)
{
    sym_gram(ctx, x, m, n, A);
    sym_update(ctx, A, c, x, m, n, B, y);
}

static void plain_poly(const struct kernel_ctx *ctx, const float *A, const float c[3], int64_t m,
                       float *B)
{
    (void)ctx;
    memcpy(B, A, sizeof(float) * (size_t)(m * m));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)m, (int)m, c[2], A, (int)m,
                A, (int)m, c[1], B, (int)m);
    for (int64_t i = 0; i < m; i++)
        B[i * m + i] += c[0];
}

static void plain_symmul(const struct kernel_ctx *ctx, const float *P, const float *Q, int64_t m,
                         float *C)
{
    (void)ctx;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)m, (int)m, 1.0f, P, (int)m,
                Q, (int)m, 0.0f, C, (int)m);
}

/* C = P Q, known symmetric: the block rows of its upper triangle, C[i0:i1, i0:m] =
 * P[i0:i1, :] Q[:, i0:m], then mirrored; m^3 (1 + block/m) FLOPs against 2m^3. */
static void sym_symmul(const struct kernel_ctx *ctx, const float *P, const float *Q, int64_t m,
                       float *C)
{
    (void)ctx;
    for (int64_t i0 = 0; i0 < m; i0 += NS_SYMMUL_BLOCK) {
        const int64_t rows = m - i0 < NS_SYMMUL_BLOCK ? m - i0 : NS_SYMMUL_BLOCK;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, (int)(m - i0), (int)m,
                    1.0f, P + i0 * m, (int)m, Q + i0, (int)m, 0.0f, C + i0 * m + i0, (int)m);
    }
    ns_mirror_upper(C, m, sizeof(float));
}

static const struct ns_products blas_plain_products = {
    .gram = ns_shard_gram_blas,
    .update = ns_shard_update_blas,
    .poly = plain_poly,
    .symmul = plain_symmul,
    .mul = plain_symmul,
    .apply = plain_apply,
};

static const struct ns_products blas_symmetric_products = {
    .gram = sym_gram,
    .update = sym_update,
    .poly = sym_poly,
    .symmul = sym_symmul,
    .mul = plain_symmul,
    .apply = plain_apply,
};

int ns_blas_newton_schulz(const struct kernel_ctx *ctx, const struct ns_args *a,
                          const struct ns_workspace *ws)
{
    if (a->compute == KDT_BF16)
        return ns_bf16_run(ctx, a, ws, ns_blas_newton_schulz);
    if (a->variant != NS_VARIANT_PLAIN && a->variant != NS_VARIANT_SYMMETRIC)
        return -1;
    if (a->algorithm != NS_ALGO_STANDARD || a->precondition != NS_PRECOND_FROBENIUS)
        return ns_run_products(ctx, a, ws,
                               a->variant == NS_VARIANT_PLAIN ? &blas_plain_products
                                                              : &blas_symmetric_products);
    return ns_run_batch(ctx, a, ws,
                        a->variant == NS_VARIANT_PLAIN ? ns_iter_plain : ns_iter_symmetric);
}

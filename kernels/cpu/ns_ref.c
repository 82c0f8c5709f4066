/* Reference Newton-Schulz: the literal iteration with double accumulation, fp32 between steps.
 * O(m^2 n) loops with no blocking: for tests and small shapes, not for speed. */
#include "cpu_kernels.h"
#include "ns_bf16.h"
#include "ns_common.h"

/* the literal iteration, shared with the sharded reference */
static void ref_iter(const struct kernel_ctx *ctx, int64_t m, int64_t n, const float c[3],
                     const float *x, float *y, float *A, float *B)
{
    ns_shard_gram_ref(ctx, x, m, n, A);
    ns_shard_update_ref(ctx, A, c, x, m, n, B, y);
}

/* (P Q)[i][j] of two m x m matrices, summed in double */
static double ref_dot(const float *P, const float *Q, int64_t m, int64_t i, int64_t j)
{
    double s = 0.0;
    for (int64_t t = 0; t < m; t++)
        s += (double)P[i * m + t] * Q[t * m + j];
    return s;
}

/* Z = c0 I + c1 R + c2 R R, in double */
static void ref_poly(const struct kernel_ctx *ctx, const float *R, const float c[3], int64_t m,
                     float *Z)
{
    (void)ctx;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < m; j++)
            Z[i * m + j] = (float)((i == j ? (double)c[0] : 0.0) + (double)c[1] * R[i * m + j] +
                                   (double)c[2] * ref_dot(R, R, m, i, j));
}

static void ref_symmul(const struct kernel_ctx *ctx, const float *P, const float *Q, int64_t m,
                       float *C)
{
    (void)ctx;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < m; j++)
            C[i * m + j] = (float)ref_dot(P, Q, m, i, j);
}

static void ref_qx(const struct kernel_ctx *ctx, const float *Q, const float *x, int64_t m,
                   int64_t n, float *y)
{
    (void)ctx;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double s = 0.0;
            for (int64_t t = 0; t < m; t++)
                s += (double)Q[i * m + t] * x[t * n + j];
            y[i * n + j] = (float)s;
        }
}

static const struct ns_products ref_products = {
    .gram = ns_shard_gram_ref,
    .update = ns_shard_update_ref,
    .poly = ref_poly,
    .symmul = ref_symmul,
    .mul = ref_symmul,
    .apply = ref_qx,
};

int ns_ref_newton_schulz(const struct kernel_ctx *ctx, const struct ns_args *a,
                         const struct ns_workspace *ws)
{
    if (a->compute == KDT_BF16)
        return ns_bf16_run(ctx, a, ws, ns_ref_newton_schulz); /* bf16 products: oneDNN's */
    if (a->algorithm != NS_ALGO_STANDARD || a->precondition != NS_PRECOND_FROBENIUS)
        return ns_run_products(ctx, a, ws, &ref_products);
    return ns_run_batch(ctx, a, ws, ref_iter);
}

/* Sharded Newton-Schulz on the CPU: the local columns X_j (m x n) of a matrix spread over
 * ranks. Per iteration the runtime all-reduces the Gram matrices X_j X_j^T between
 * ns_shard_gram and ns_shard_update. Reference versions accumulate in double; BLAS versions use
 * sgemm. Both take n = 0 (a rank holding no columns still joins the all-reduce with zeros), and
 * both update a block narrower than m without A A (kernels/ns_shape.h, ns_shard_narrow). */
#include <cblas.h>
#include <string.h>

#include "../ns_shape.h"
#include "cpu_kernels.h"
#include "ns_common.h"

void ns_shard_load(const struct kernel_ctx *ctx, const struct ns_args *a, double inv, float *x)
{
    (void)ctx;
    ns_load_with_inv(a, 0, inv, x);
}

void ns_shard_store(const struct kernel_ctx *ctx, const struct ns_args *a, const float *x)
{
    (void)ctx;
    ns_store_output(a, 0, x);
}

void ns_shard_gram_ref(const struct kernel_ctx *ctx, const float *x, int64_t m, int64_t n, float *g)
{
    (void)ctx;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < m; j++) {
            double s = 0;
            for (int64_t t = 0; t < n; t++)
                s += (double)x[i * n + t] * x[j * n + t];
            g[i * m + j] = (float)s;
        }
}

/* out = beta c + alpha (p q), p m x k, q and c k x n (c m x n), accumulated in double: each
 * product of the update, whichever form */
static void axpb_ref(const float *p, const float *q, int64_t m, int64_t k, int64_t n, double alpha,
                     double beta, const float *c, float *out)
{
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double s = 0;
            for (int64_t t = 0; t < k; t++)
                s += (double)p[i * k + t] * q[t * n + j];
            out[i * n + j] = (float)(beta * c[i * n + j] + alpha * s);
        }
}

void ns_shard_update_ref(const struct kernel_ctx *ctx, const float *g, const float c[3],
                         const float *x, int64_t m, int64_t n, float *B, float *y)
{
    (void)ctx;
    if (ns_shard_narrow((double)m, (double)n)) {
        /* a block narrower than m: V = bX + c(AX) in B (m x n), then Y = aX + AV */
        axpb_ref(g, x, m, m, n, c[2], c[1], x, B);
        axpb_ref(g, B, m, m, n, 1.0, c[0], x, y);
        return;
    }
    axpb_ref(g, g, m, m, m, c[2], c[1], g, B); /* B = bA + cAA */
    axpb_ref(B, x, m, m, n, 1.0, c[0], x, y);  /* Y = aX + BX */
}

void ns_shard_gram_blas(const struct kernel_ctx *ctx, const float *x, int64_t m, int64_t n,
                        float *g)
{
    (void)ctx;
    if (n == 0) {
        memset(g, 0, sizeof(float) * (size_t)(m * m));
        return;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)m, (int)n, 1.0f, x, (int)n, x,
                (int)n, 0.0f, g, (int)m);
}

void ns_shard_update_blas(const struct kernel_ctx *ctx, const float *g, const float c[3],
                          const float *x, int64_t m, int64_t n, float *B, float *y)
{
    (void)ctx;
    if (n == 0)
        return;
    if (ns_shard_narrow((double)m, (double)n)) {
        /* V = c2 A X + c1 X in B (m x n), then Y = A V + c0 X: 4m^2n, no A A */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)n, (int)m, c[2], g,
                    (int)m, x, (int)n, 0.0f, B, (int)n);
        for (int64_t i = 0; i < m * n; i++)
            B[i] += c[1] * x[i];
        memcpy(y, x, sizeof(float) * (size_t)(m * n));
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)n, (int)m, 1.0f, g,
                    (int)m, B, (int)n, c[0], y, (int)n);
        return;
    }
    /* B = c1 A + c2 A A + c0 I, then Y = B X: the same fusion as the gathered variant */
    memcpy(B, g, sizeof(float) * (size_t)(m * m));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)m, (int)m, c[2], g, (int)m,
                g, (int)m, c[1], B, (int)m);
    for (int64_t i = 0; i < m; i++)
        B[i * m + i] += c[0];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)n, (int)m, 1.0f, B, (int)m,
                x, (int)n, 0.0f, y, (int)n);
}

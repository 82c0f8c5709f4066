/* Sharded Newton-Schulz on the device (kernels/ops.h's ns_shard_* entries): a team member's
 * block or a sharded piece X_j (m x n, the working orientation) in fp32, for
 * runtime/step/ns_sharded.c, which all-reduces the Gram matrices between these calls. The products
 * are cuBLAS sgemm where the CPU BLAS versions (kernels/cpu/ns_sharded_kernels.c) call cblas_sgemm,
 * in the same forms (a block narrower than m updated without A A, kernels/ns_shape.h), so that the
 * FLOPs the runtime counts are the ones performed. Row-major m x n is column-major n x m: each call
 * is the CPU's transposed. cuBLAS sums in its own order, so the results are fp32-close to the
 * CPU's, not its bits. Compiled and linked; not yet run on a GPU. A cuBLAS call that fails records
 * the error (status_set) and leaves NaN in its result, which the step's output then carries rather
 * than a stale block. */
#include "cuda_internal.h"

extern "C" {
#include "../ns_shape.h"
#include "base/status.h"
}

/* b[i] <- b[i] + c * x[i], two roundings as the CPU's loop (-fmad=false: no fused product) */
__global__ void k_shard_axpy(float *b, const float *x, float c, size_t count)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (size_t)gridDim.x * blockDim.x)
        b[i] = b[i] + c * x[i];
}

/* b[i][i] <- b[i][i] + c */
__global__ void k_shard_diag(float *b, int64_t m, float c)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < m;
         i += (int64_t)gridDim.x * blockDim.x)
        b[i * m + i] = b[i * m + i] + c;
}

static void cuda_ns_shard_load(const struct kernel_ctx *ctx, const struct ns_args *a, double inv,
                               float *x)
{
    cuda_ns_tile(cuda_stream(ctx), a->in, a->in_dtype, x, KDT_F32, a->rows, a->cols, a->transpose,
                 inv);
}

static void cuda_ns_shard_store(const struct kernel_ctx *ctx, const struct ns_args *a,
                                const float *x)
{
    /* x is the working orientation: cols x rows where the piece is transposed */
    cuda_ns_tile(cuda_stream(ctx), x, KDT_F32, a->out, a->out_dtype,
                 a->transpose ? a->cols : a->rows, a->transpose ? a->rows : a->cols, a->transpose,
                 1.0);
}

/* c (rows x cols floats) <- NaN after a failed cuBLAS call, the error recorded */
static void blas_failed(const struct kernel_ctx *ctx, cublasStatus_t st, const char *what, float *c,
                        size_t count)
{
    status_set(SHARDOPT_ERR_DEVICE, "CUDA backend: sharded Newton-Schulz %s: %s", what,
               cublasGetStatusString(st));
    cudaMemsetAsync(c, 0xff, sizeof(float) * count, cuda_stream(ctx));
}

/* column-major C (M x N) <- alpha op(A) op(B) + beta C, on ctx's stream */
static cublasStatus_t sgemm(const struct kernel_ctx *ctx, cublasOperation_t ta, int M, int N, int K,
                            float alpha, const float *A, int lda, const float *B, int ldb,
                            float beta, float *C, int ldc)
{
    struct cuda_backend *be = cuda_be(ctx);
    cublasStatus_t st = cublasSetStream(be->blas, cuda_stream(ctx));
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    return cublasSgemm(be->blas, ta, CUBLAS_OP_N, M, N, K, &alpha, A, lda, B, ldb, &beta, C, ldc);
}

/* G = X X^T: column-major, X is n x m (ld n), so G = (X)^T-as-stored times X-as-stored */
static void cuda_ns_shard_gram(const struct kernel_ctx *ctx, const float *x, int64_t m, int64_t n,
                               float *g)
{
    const size_t mm = (size_t)(m * m);
    if (n == 0) { /* a member without columns joins the sum with zeros */
        cudaMemsetAsync(g, 0, sizeof(float) * mm, cuda_stream(ctx));
        return;
    }
    const cublasStatus_t st = sgemm(ctx, CUBLAS_OP_T, (int)m, (int)m, (int)n, 1.0f, x, (int)n, x,
                                    (int)n, 0.0f, g, (int)m);
    if (st != CUBLAS_STATUS_SUCCESS)
        blas_failed(ctx, st, "Gram matrix", g, mm);
}

/* The CPU BLAS update (ns_shard_update_blas) transposed: a row-major product P Q (P m x k, Q
 * k x n) is column-major Q^T P^T, i.e. sgemm(n, m, k, Q, P). */
static void cuda_ns_shard_update(const struct kernel_ctx *ctx, const float *g, const float c[3],
                                 const float *x, int64_t m, int64_t n, float *B, float *y)
{
    const cudaStream_t s = cuda_stream(ctx);
    const int M = (int)m, N = (int)n;
    const size_t mn = (size_t)(m * n), mm = (size_t)(m * m);
    cublasStatus_t st;

    if (n == 0)
        return;
    if (ns_shard_narrow((double)m, (double)n)) {
        /* V = c2 A X + c1 X in B (m x n), then Y = A V + c0 X: 4m^2n, no A A */
        st = sgemm(ctx, CUBLAS_OP_N, N, M, M, c[2], x, N, g, M, 0.0f, B, N);
        if (st != CUBLAS_STATUS_SUCCESS)
            return blas_failed(ctx, st, "update", y, mn);
        k_shard_axpy<<<cuda_blocks(mn, 256), 256, 0, s>>>(B, x, c[1], mn);
        cudaMemcpyAsync(y, x, sizeof(float) * mn, cudaMemcpyDeviceToDevice, s);
        st = sgemm(ctx, CUBLAS_OP_N, N, M, M, 1.0f, B, N, g, M, c[0], y, N);
        if (st != CUBLAS_STATUS_SUCCESS)
            blas_failed(ctx, st, "update", y, mn);
        return;
    }
    /* B = c1 A + c2 A A + c0 I, then Y = B X: the same fusion as the CPU's */
    cudaMemcpyAsync(B, g, sizeof(float) * mm, cudaMemcpyDeviceToDevice, s);
    st = sgemm(ctx, CUBLAS_OP_N, M, M, M, c[2], g, M, g, M, c[1], B, M);
    if (st != CUBLAS_STATUS_SUCCESS)
        return blas_failed(ctx, st, "update", y, mn);
    k_shard_diag<<<cuda_blocks((size_t)m, 256), 256, 0, s>>>(B, m, c[0]);
    st = sgemm(ctx, CUBLAS_OP_N, N, M, M, 1.0f, x, N, B, M, 0.0f, y, N);
    if (st != CUBLAS_STATUS_SUCCESS)
        blas_failed(ctx, st, "update", y, mn);
}

void cuda_ns_shard_fill(struct kernel_ops *o)
{
    o->ns_shard_load = cuda_ns_shard_load;
    o->ns_shard_gram = cuda_ns_shard_gram;
    o->ns_shard_update = cuda_ns_shard_update;
    o->ns_shard_store = cuda_ns_shard_store;
}

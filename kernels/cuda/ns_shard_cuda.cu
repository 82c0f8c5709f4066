/* Sharded Newton-Schulz on the device (kernels/ops.h's ns_shard_* entries): a team member's
 * block or a sharded piece X_j (m x n, the working orientation) in fp32 (a team's also in bf16:
 * the ns_shard_bf16_* entries below), for
 * runtime/step/ns_sharded.c, which all-reduces the Gram matrices between these calls. The products
 * are cuBLAS sgemm where the CPU BLAS versions (kernels/cpu/ns_sharded_kernels.c) call cblas_sgemm,
 * in the same forms (a block narrower than m updated without A A, kernels/ns_shape.h), so that the
 * FLOPs the runtime counts are the ones performed. Row-major m x n is column-major n x m: each call
 * is the CPU's transposed. cuBLAS sums in its own order, so the results are fp32-close to the
 * CPU's, not its bits. Compiled and linked; not yet run on a GPU. A cuBLAS call that fails records
 * the error (status_set) and leaves NaN in its result, which the step's output then carries rather
 * than a stale block. */
#include <stdint.h>

#include "cuda_internal.h"

extern "C" {
#include "../dtype.h"
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

/* ---- bf16 teams (ns_compute = bf16; kernels/ops.h's ns_shard_bf16_* entries) ----
 * The CPU bf16 team's products (kernels/cpu/ns_bf16.c, ns_bf16_shard_prepare) as cublasGemmEx
 * with CUDA_R_16BF storage and CUBLAS_COMPUTE_32F: alpha (A B) + beta C accumulated in fp32 and
 * rounded once to bf16, as oneDNN's output scale and sum post-op are. A = X X^T; B = c A A + b B
 * over a copy of A; Y = 1 (B X) + a Y over a copy of X: every block whatever its width (no narrow
 * form), as the CPU's. cuBLAS sums in its own order: the CPU's roundings, not its bits.
 * Compiled and linked; not yet run on a GPU. */

/* y[i] <- bf16(x[i]) to nearest even, or (widen) y[i] <- fp32(x[i]): the host's functions */
__global__ void k_shard_round_bf16(const float *x, uint16_t *y, size_t count)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] = bf16_from_f32(x[i]);
}

__global__ void k_shard_widen_bf16(const uint16_t *x, float *y, size_t count)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] = f32_from_bf16(x[i]);
}

/* column-major C (M x N, bf16) <- alpha op(A) B + beta C, fp32 accumulation, on ctx's stream */
static cublasStatus_t gemm_bf16(const struct kernel_ctx *ctx, cublasOperation_t ta, int M, int N,
                                int K, float alpha, const uint16_t *A, int lda, const uint16_t *B,
                                int ldb, float beta, uint16_t *C, int ldc)
{
    struct cuda_backend *be = cuda_be(ctx);
    cublasStatus_t st = cublasSetStream(be->blas, cuda_stream(ctx));
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    return cublasGemmEx(be->blas, ta, CUBLAS_OP_N, M, N, K, &alpha, A, CUDA_R_16BF, lda, B,
                        CUDA_R_16BF, ldb, &beta, C, CUDA_R_16BF, ldc, CUBLAS_COMPUTE_32F,
                        CUBLAS_GEMM_DEFAULT);
}

static int bf16_failed(cublasStatus_t st, const char *what)
{
    status_set(SHARDOPT_ERR_DEVICE, "CUDA backend: bf16 team %s: %s", what,
               cublasGetStatusString(st));
    return -1;
}

/* cuBLAS needs no plan made ahead: what the CPU prepares at commit is checked here instead */
static int cuda_ns_shard_bf16_prepare(const struct kernel_ctx *ctx, int64_t m, int64_t n,
                                      const float (*coeffs)[3], int steps)
{
    (void)coeffs;
    if (cuda_be(ctx) == NULL || m < 1 || n < 1 || m > INT32_MAX || n > INT32_MAX || steps < 1) {
        status_set(SHARDOPT_ERR_DEVICE, "CUDA backend: a bf16 team block of %lld x %lld, %d steps",
                   (long long)m, (long long)n, steps);
        return -1;
    }
    return 0;
}

/* A = X X^T: X row-major m x n is column-major n x m (ld n), as cuda_ns_shard_gram */
static int cuda_ns_shard_bf16_gram(const struct kernel_ctx *ctx, const uint16_t *x, int64_t m,
                                   int64_t n, uint16_t *A)
{
    const cublasStatus_t st = gemm_bf16(ctx, CUBLAS_OP_T, (int)m, (int)m, (int)n, 1.0f, x, (int)n,
                                        x, (int)n, 0.0f, A, (int)m);
    return st == CUBLAS_STATUS_SUCCESS ? 0 : bf16_failed(st, "Gram matrix");
}

static int cuda_ns_shard_bf16_update(const struct kernel_ctx *ctx, const float (*coeffs)[3],
                                     int steps, int s, const uint16_t *A, const uint16_t *x,
                                     int64_t m, int64_t n, uint16_t *B, uint16_t *y)
{
    const cudaStream_t cs = cuda_stream(ctx);
    const int M = (int)m, N = (int)n;
    const float *c = coeffs[s];
    (void)steps;
    /* B = c A A + b B, B a copy of A (A symmetric: the column-major product is the row-major) */
    if (cudaMemcpyAsync(B, A, sizeof(uint16_t) * (size_t)(m * m), cudaMemcpyDeviceToDevice, cs) !=
        cudaSuccess)
        return bf16_failed(CUBLAS_STATUS_EXECUTION_FAILED, "copy of A");
    cublasStatus_t st = gemm_bf16(ctx, CUBLAS_OP_N, M, M, M, c[2], A, M, A, M, c[1], B, M);
    if (st != CUBLAS_STATUS_SUCCESS)
        return bf16_failed(st, "update (A A)");
    /* Y = B X + a Y, Y a copy of X: row-major B X is column-major X^T B^T, i.e. gemm(n, m, m, X,
     * B) */
    if (cudaMemcpyAsync(y, x, sizeof(uint16_t) * (size_t)(m * n), cudaMemcpyDeviceToDevice, cs) !=
        cudaSuccess)
        return bf16_failed(CUBLAS_STATUS_EXECUTION_FAILED, "copy of X");
    st = gemm_bf16(ctx, CUBLAS_OP_N, N, M, M, 1.0f, x, N, B, M, c[0], y, N);
    return st == CUBLAS_STATUS_SUCCESS ? 0 : bf16_failed(st, "update (B X)");
}

static void cuda_ns_shard_bf16_round(const struct kernel_ctx *ctx, const float *x, uint16_t *y,
                                     size_t n)
{
    k_shard_round_bf16<<<cuda_blocks(n, 256), 256, 0, cuda_stream(ctx)>>>(x, y, n);
}

static void cuda_ns_shard_bf16_widen(const struct kernel_ctx *ctx, const uint16_t *x, float *y,
                                     size_t n)
{
    k_shard_widen_bf16<<<cuda_blocks(n, 256), 256, 0, cuda_stream(ctx)>>>(x, y, n);
}

void cuda_ns_shard_fill(struct kernel_ops *o)
{
    o->ns_shard_load = cuda_ns_shard_load;
    o->ns_shard_gram = cuda_ns_shard_gram;
    o->ns_shard_update = cuda_ns_shard_update;
    o->ns_shard_store = cuda_ns_shard_store;
    o->ns_shard_bf16_prepare = cuda_ns_shard_bf16_prepare;
    o->ns_shard_bf16_gram = cuda_ns_shard_bf16_gram;
    o->ns_shard_bf16_update = cuda_ns_shard_bf16_update;
    o->ns_shard_bf16_round = cuda_ns_shard_bf16_round;
    o->ns_shard_bf16_widen = cuda_ns_shard_bf16_widen;
}

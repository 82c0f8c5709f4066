/* Newton-Schulz on the device: ns_driver.h's sequence with cuBLAS bf16 products (fp32
 * accumulation, strided-batched over the experts of a stack) and two kernels around it: the
 * Frobenius norms of the batch, then the normalised, transposed-where-needed bf16 copy of U
 * (the norm is folded into that copy); and at the end the copy of X back into the stored
 * orientation and dtype. */
#include "cuda_internal.h"
#include "ns_driver.h"

extern "C" {
#include "../elem_rules.h"
}

#define NS_NORM_BLOCKS 64 /* partial sums per matrix, added in a fixed order */
#define NS_TILE        32

__global__ void k_ns_sumsq(const void *in, int dt, size_t count, double *part)
{
    __shared__ double sh[256];
    const size_t base = (size_t)blockIdx.y * count;
    double acc = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (size_t)gridDim.x * blockDim.x) {
        const double v = kload(in, dt, base + i);
        acc += v * v;
    }
    block_reduce(sh, acc, &part[(size_t)blockIdx.y * NS_NORM_BLOCKS + blockIdx.x]);
}

/* out[z] <- in[z] * scale, in[z] rows x cols row-major, out[z] the same or its transpose, with a
 * shared-memory tile so that both sides are read and written along rows. scale is
 * 1 / (|in[z]|_F * norm_scale + eps) when part is given (the load), else 1 (the store). */
__global__ void k_ns_tile(const void *in, int in_dt, void *out, int out_dt, int64_t rows,
                          int64_t cols, int transpose, const double *part, float norm_scale,
                          float eps)
{
    __shared__ float tile[NS_TILE][NS_TILE + 1];
    __shared__ double scale;
    const size_t count = (size_t)(rows * cols), base = (size_t)blockIdx.z * count;
    const int64_t r0 = (int64_t)blockIdx.y * NS_TILE, c0 = (int64_t)blockIdx.x * NS_TILE;

    if (threadIdx.x == 0 && threadIdx.y == 0) {
        double s = 1.0;
        if (part != NULL) {
            double ss = 0;
            for (int b = 0; b < NS_NORM_BLOCKS; b++)
                ss += part[(size_t)blockIdx.z * NS_NORM_BLOCKS + b];
            s = 1.0 / (sqrt(ss) * (double)norm_scale + (double)eps);
        }
        scale = s;
    }
    __syncthreads();
    for (int ty = threadIdx.y; ty < NS_TILE; ty += blockDim.y) {
        const int64_t r = r0 + ty, c = c0 + threadIdx.x;
        if (r < rows && c < cols)
            tile[ty][threadIdx.x] =
                (float)((double)kload(in, in_dt, base + (size_t)(r * cols + c)) * scale);
    }
    __syncthreads();
    for (int ty = threadIdx.y; ty < NS_TILE; ty += blockDim.y) {
        if (transpose) {
            /* out is cols x rows: its row c0 + ty holds column c0 + ty of the tile */
            const int64_t c = c0 + ty, r = r0 + threadIdx.x;
            if (r < rows && c < cols)
                kstore_value(out, out_dt, base + (size_t)(c * rows + r), tile[threadIdx.x][ty]);
        } else {
            const int64_t r = r0 + ty, c = c0 + threadIdx.x;
            if (r < rows && c < cols)
                kstore_value(out, out_dt, base + (size_t)(r * cols + c), tile[ty][threadIdx.x]);
        }
    }
}

namespace
{

/* D = alpha op(A) op(B) + beta C with C and D apart (cuBLASLt): bf16 in and out, fp32
 * accumulation and scale, strided batches. The descriptors are a few host calls per product;
 * the heuristic picks the algorithm for the workspace we have. */
static int lt_gemm(cublasLtHandle_t lt, void *ws, cudaStream_t s, int ta, int tb, int M, int N,
                   int K, float alpha, const void *A, int lda, long long sA, const void *B, int ldb,
                   long long sB, float beta, const void *C, void *D, int ldc, long long sC,
                   int batch)
{
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t h;
    const cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                            opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    const int32_t nb = batch;
    const int64_t strides[3] = {sA, sB, sC};
    const size_t wsb = CUDA_LT_WORKSPACE;
    int found = 0;
    cublasStatus_t st = cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb);
    if (st == CUBLAS_STATUS_SUCCESS) /* the stored (untransposed) shapes, column-major */
        st = cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, ta ? K : M, ta ? M : K, lda);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, tb ? N : K, tb ? K : N, ldb);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, M, N, ldc);
    cublasLtMatrixLayout_t lays[3] = {la, lb, lc};
    for (int i = 0; i < 3 && st == CUBLAS_STATUS_SUCCESS; i++) {
        st = cublasLtMatrixLayoutSetAttribute(lays[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &nb,
                                              sizeof nb);
        if (st == CUBLAS_STATUS_SUCCESS)
            st = cublasLtMatrixLayoutSetAttribute(
                lays[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &strides[i], sizeof(int64_t));
    }
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceCreate(&pref);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &wsb, sizeof wsb);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 1, &h, &found);
    if (st == CUBLAS_STATUS_SUCCESS && found > 0)
        st = cublasLtMatmul(lt, op, &alpha, A, la, B, lb, &beta, C, lc, D, lc, &h.algo, ws, wsb, s);
    if (pref != NULL)
        cublasLtMatmulPreferenceDestroy(pref);
    for (int i = 0; i < 3; i++)
        if (lays[i] != NULL)
            cublasLtMatrixLayoutDestroy(lays[i]);
    if (op != NULL)
        cublasLtMatmulDescDestroy(op);
    return st == CUBLAS_STATUS_SUCCESS && found > 0 ? 0 : -1;
}

struct CudaDev {
    cublasHandle_t h;
    cublasLtHandle_t lt;
    void *lt_ws;
    cudaStream_t s;

    size_t scratch_bytes(int64_t count) const
    {
        return (size_t)count * NS_NORM_BLOCKS * sizeof(double);
    }

    int gemm(int ta, int tb, int M, int N, int K, float alpha, const uint16_t *A, int lda,
             long long sA, const uint16_t *B, int ldb, long long sB, float beta,
             const uint16_t *Cin, uint16_t *C, int ldc, long long sC, int batch)
    {
        if (beta != 0.0f && Cin != C) {
            if (lt_gemm(lt, lt_ws, s, ta, tb, M, N, K, alpha, A, lda, sA, B, ldb, sB, beta, Cin, C,
                        ldc, sC, batch) == 0)
                return 0;
            /* no cuBLASLt algorithm for it: C into D, then the in-place product */
            if (copy(C, Cin, ((size_t)(batch - 1) * (size_t)sC + (size_t)ldc * N) * 2) != 0)
                return -1;
        }
        return cublasGemmStridedBatchedEx(
                   h, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, M, N, K,
                   &alpha, A, CUDA_R_16BF, lda, sA, B, CUDA_R_16BF, ldb, sB, &beta, C, CUDA_R_16BF,
                   ldc, sC, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS
                   ? 0
                   : -1;
    }

    int copy(void *dst, const void *src, size_t bytes)
    {
        return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s) == cudaSuccess ? 0
                                                                                            : -1;
    }

    int load(const struct ns_args *a, int64_t k0, int64_t count, int64_t, int64_t, uint16_t *x,
             void *scratch)
    {
        const size_t per = (size_t)(a->rows * a->cols);
        const void *in = (const char *)a->in + (size_t)k0 * per * kdtype_size(a->in_dtype);
        double *part = (double *)scratch;
        k_ns_sumsq<<<dim3(NS_NORM_BLOCKS, (unsigned)count), 256, 0, s>>>(in, a->in_dtype, per,
                                                                         part);
        const dim3 grid((unsigned)((a->cols + NS_TILE - 1) / NS_TILE),
                        (unsigned)((a->rows + NS_TILE - 1) / NS_TILE), (unsigned)count);
        k_ns_tile<<<grid, dim3(NS_TILE, 8), 0, s>>>(in, a->in_dtype, x, KDT_BF16, a->rows, a->cols,
                                                    a->transpose, part, a->norm_scale, a->eps);
        return cudaGetLastError() == cudaSuccess ? 0 : -1;
    }

    int store(const struct ns_args *a, int64_t k0, int64_t count, int64_t m, int64_t n,
              const uint16_t *x)
    {
        const size_t per = (size_t)(a->rows * a->cols);
        void *out = (char *)a->out + (size_t)k0 * per * kdtype_size(a->out_dtype);
        /* x is m x n (the working orientation); transposed back when the load transposed */
        const dim3 grid((unsigned)((n + NS_TILE - 1) / NS_TILE),
                        (unsigned)((m + NS_TILE - 1) / NS_TILE), (unsigned)count);
        k_ns_tile<<<grid, dim3(NS_TILE, 8), 0, s>>>(x, KDT_BF16, out, a->out_dtype, m, n,
                                                    a->transpose, NULL, 1.0f, 0.0f);
        return cudaGetLastError() == cudaSuccess ? 0 : -1;
    }
};

} // namespace

size_t cuda_ns_workspace_bytes(int64_t rows, int64_t cols, int64_t batch)
{
    if (batch < 1)
        batch = 1;
    return ns_dev_scratch_at((size_t)batch * ns_dev_bytes_per_matrix(rows, cols)) +
           (size_t)batch * NS_NORM_BLOCKS * sizeof(double);
}

int cuda_newton_schulz(const struct kernel_ctx *ctx, const struct ns_args *a,
                       const struct ns_workspace *ws)
{
    struct cuda_backend *be = cuda_be(ctx);
    if (be == NULL || a->steps < 0)
        return -1;
    CudaDev d = {be->blas, be->lt, be->lt_ws, cuda_stream(ctx)};
    if (cublasSetStream(be->blas, d.s) != CUBLAS_STATUS_SUCCESS)
        return -1;
    return ns_dev_run(d, a, ws->buf, ws->floats * sizeof(float));
}

/* Newton-Schulz on the device: ns_driver.h's sequence with cuBLASLt bf16 products (fp32
 * accumulation, strided-batched over the experts of a stack; plans cached per shape in the
 * backend, lt_plan_cache.h) and kernels around it: the Frobenius norms of the batch, then the
 * normalised, transposed-where-needed bf16 copy of U (the norm is folded into that copy); the
 * symmetric variant's mirror; Gram's diagonal add; AOL's row scales; and at the end the copy of
 * X back into the stored orientation and dtype. */
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
 * 1 / (|in[z]|_F * norm_scale + eps) when part is given (the load), else `fixed` (1 for the store;
 * the sharded load's host-made 1 / (|U|_F s + eps), cuda_ns_tile). rowscale
 * (AOL's reload; NULL otherwise): the fp32 value so scaled is then multiplied by rowscale[z][w],
 * w its row in the working orientation (a stored column where transposed), and rounded again,
 * as the CPU scales its fp32 staging (kernels/cpu/ns_common.c, ns_aol_scale). */
__global__ void k_ns_tile(const void *in, int in_dt, void *out, int out_dt, int64_t rows,
                          int64_t cols, int transpose, const double *part, double fixed,
                          float norm_scale, float eps, const double *rowscale)
{
    __shared__ float tile[NS_TILE][NS_TILE + 1];
    __shared__ double scale;
    const size_t count = (size_t)(rows * cols), base = (size_t)blockIdx.z * count;
    const int64_t r0 = (int64_t)blockIdx.y * NS_TILE, c0 = (int64_t)blockIdx.x * NS_TILE;

    if (threadIdx.x == 0 && threadIdx.y == 0) {
        double s = fixed;
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
        if (r < rows && c < cols) {
            float v = (float)((double)kload(in, in_dt, base + (size_t)(r * cols + c)) * scale);
            if (rowscale != NULL)
                v = (float)((double)v *
                            rowscale[(size_t)blockIdx.z * (size_t)(transpose ? cols : rows) +
                                     (size_t)(transpose ? c : r)]);
            tile[ty][threadIdx.x] = v;
        }
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

void cuda_ns_tile(cudaStream_t s, const void *in, int in_dt, void *out, int out_dt, int64_t rows,
                  int64_t cols, int transpose, double scale)
{
    if (rows <= 0 || cols <= 0)
        return;
    const dim3 grid((unsigned)((cols + NS_TILE - 1) / NS_TILE),
                    (unsigned)((rows + NS_TILE - 1) / NS_TILE));
    k_ns_tile<<<grid, dim3(NS_TILE, 8), 0, s>>>(in, in_dt, out, out_dt, rows, cols, transpose, NULL,
                                                scale, 1.0f, 0.0f, NULL);
}

/* AOL's d[z][i] = (sum_j |A[z][i][j]| + eps)^(-1/2), one block per row i of matrix z, the sum
 * in double in a fixed tree order (the CPU sums in index order: the same to rounding). */
__global__ void k_ns_aol_rows(const uint16_t *A, int64_t m, double eps, double *d)
{
    __shared__ double sh[256];
    const uint16_t *row = A + ((size_t)blockIdx.y * (size_t)m + blockIdx.x) * (size_t)m;
    double acc = 0;
    for (int64_t j = threadIdx.x; j < m; j += blockDim.x)
        acc += fabs((double)f32_from_bf16(row[j]));
    double *out = &d[(size_t)blockIdx.y * (size_t)m + blockIdx.x];
    block_reduce(sh, acc, out);
    if (threadIdx.x == 0)
        *out = 1.0 / sqrt(*out + eps);
}

/* A[z][i][j] <- bf16(A[z][i][j] d[z][i] d[z][j]) over count m x m matrices */
__global__ void k_ns_aol_scale(uint16_t *A, int64_t m, size_t total, const double *d)
{
    const size_t mm = (size_t)(m * m);
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (size_t)gridDim.x * blockDim.x) {
        const size_t z = e / mm, i = e % mm / (size_t)m, j = e % (size_t)m;
        A[e] = bf16_from_f32(
            (float)((double)f32_from_bf16(A[e]) * (d[z * (size_t)m + i] * d[z * (size_t)m + j])));
    }
}

/* Z[z][i][i] <- bf16(Z[z][i][i] + c), one matrix per blockIdx.y */
__global__ void k_ns_diag_add(uint16_t *Z, int64_t m, float c, long long stride)
{
    uint16_t *z = Z + (size_t)blockIdx.y * (size_t)stride;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < m;
         i += (int64_t)gridDim.x * blockDim.x)
        z[i * m + i] = bf16_from_f32(f32_from_bf16(z[i * m + i]) + c);
}

namespace
{

/* The plan for key: the matmul descriptor, the three layouts (D shares C's) and the
 * heuristic's algorithm for our workspace and the operands' alignments. p->ok = 0 when any
 * call fails or no algorithm fits. */
static void lt_plan_build(cublasLtHandle_t lt, const struct lt_key *k, struct lt_plan *p)
{
    const cublasOperation_t opa = k->ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                            opb = k->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    const int32_t nb = (int32_t)k->batch;
    const int64_t strides[3] = {k->sa, k->sb, k->sc};
    const uint32_t align[4] = {(uint32_t)k->align_a, (uint32_t)k->align_b, (uint32_t)k->align_c,
                               (uint32_t)k->align_d};
    const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    const size_t wsb = CUDA_LT_WORKSPACE;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t h;
    int found = 0;

    memset(p, 0, sizeof *p);
    cublasStatus_t st = cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb);
    if (st == CUBLAS_STATUS_SUCCESS) /* the stored (untransposed) shapes, column-major */
        st = cublasLtMatrixLayoutCreate(&p->la, CUDA_R_16BF, k->ta ? k->k : k->m,
                                        k->ta ? k->m : k->k, k->lda);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_16BF, k->tb ? k->n : k->k,
                                        k->tb ? k->k : k->n, k->ldb);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatrixLayoutCreate(&p->lc, CUDA_R_16BF, k->m, k->n, k->ldc);
    cublasLtMatrixLayout_t lays[3] = {p->la, p->lb, p->lc};
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
    for (int i = 0; i < 4 && st == CUBLAS_STATUS_SUCCESS; i++)
        st = cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &align[i], sizeof align[i]);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulAlgoGetHeuristic(lt, p->op, p->la, p->lb, p->lc, p->lc, pref, 1, &h,
                                            &found);
    if (pref != NULL)
        cublasLtMatmulPreferenceDestroy(pref);
    if (st == CUBLAS_STATUS_SUCCESS && found > 0) {
        p->algo = h.algo;
        p->ok = 1;
    }
}

static void lt_plan_free(struct lt_plan *p)
{
    if (p->la != NULL)
        cublasLtMatrixLayoutDestroy(p->la);
    if (p->lb != NULL)
        cublasLtMatrixLayoutDestroy(p->lb);
    if (p->lc != NULL)
        cublasLtMatrixLayoutDestroy(p->lc);
    if (p->op != NULL)
        cublasLtMatmulDescDestroy(p->op);
    memset(p, 0, sizeof *p);
}

/* D = alpha op(A) op(B) + beta C, C and D apart or the same, through the backend's cached
 * cuBLASLt plan for the shape: bf16 in and out, fp32 accumulation and scale, strided batches.
 * -1 when cuBLASLt has no algorithm for it (the caller falls back to cuBLAS). */
static int lt_gemm(struct cuda_backend *be, cudaStream_t s, int ta, int tb, int M, int N, int K,
                   float alpha, const void *A, int lda, long long sA, const void *B, int ldb,
                   long long sB, float beta, const void *C, void *D, int ldc, long long sC,
                   int batch)
{
    int fresh = 0, evicted = 0;
    const struct lt_key key =
        lt_key_make(ta, tb, M, N, K, lda, ldb, ldc, sA, sB, sC, batch, A, B, C, D);
    const int i = lt_slot_find(&be->lt_slots, &key, &fresh, &evicted);
    struct lt_plan *p = &be->lt_plans[i];
    if (fresh) {
        if (evicted)
            lt_plan_free(p);
        lt_plan_build(be->lt, &key, p);
    }
    if (!p->ok)
        return -1;
    return cublasLtMatmul(be->lt, p->op, &alpha, A, p->la, B, p->lb, &beta, C, p->lc, D, p->lc,
                          &p->algo, be->lt_ws, CUDA_LT_WORKSPACE, s) == CUBLAS_STATUS_SUCCESS
               ? 0
               : -1;
}

/* Ac[r + c m] <- Ac[c + r m] for r < (c / block) * block, m x m column-major bf16, one matrix
 * per blockIdx.z: the strict upper part above the diagonal blocks from the block lower triangle
 * the symmetric products wrote (ns_driver.h). A tile is read along its source rows and written
 * along its destination columns through shared memory; the sources are never destinations. */
__global__ void k_ns_mirror(uint16_t *a, int64_t m, int64_t block, long long stride)
{
    __shared__ uint16_t tile[NS_TILE][NS_TILE + 1];
    uint16_t *A = a + (size_t)blockIdx.z * (size_t)stride;
    const int64_t r0 = (int64_t)blockIdx.y * NS_TILE, c0 = (int64_t)blockIdx.x * NS_TILE;
    const int64_t c_last = c0 + NS_TILE - 1 < m - 1 ? c0 + NS_TILE - 1 : m - 1;

    if (r0 >= c_last / block * block)
        return; /* nothing in this tile lies above a diagonal block */
    for (int ty = threadIdx.y; ty < NS_TILE; ty += blockDim.y) {
        const int64_t r = r0 + ty, c = c0 + threadIdx.x;
        if (r < m && c < m)
            tile[ty][threadIdx.x] = A[(size_t)(c + r * m)];
    }
    __syncthreads();
    for (int ty = threadIdx.y; ty < NS_TILE; ty += blockDim.y) {
        const int64_t c = c0 + ty, r = r0 + threadIdx.x;
        if (r < m && c < m && r < c / block * block)
            A[(size_t)(r + c * m)] = tile[threadIdx.x][ty];
    }
}

struct CudaDev {
    struct cuda_backend *be;
    cudaStream_t s;

    /* the norms' partial sums, then AOL's row scales */
    size_t scratch_bytes(int64_t count, int64_t m) const
    {
        return (size_t)count * (NS_NORM_BLOCKS + (size_t)m) * sizeof(double);
    }

    int gemm(int ta, int tb, int M, int N, int K, float alpha, const uint16_t *A, int lda,
             long long sA, const uint16_t *B, int ldb, long long sB, float beta,
             const uint16_t *Cin, uint16_t *C, int ldc, long long sC, int batch)
    {
        if (lt_gemm(be, s, ta, tb, M, N, K, alpha, A, lda, sA, B, ldb, sB, beta,
                    beta != 0.0f ? Cin : C, C, ldc, sC, batch) == 0)
            return 0;
        /* no cuBLASLt algorithm for it: C into D, matrix by matrix (C may be a block of a
         * larger matrix), then the in-place product */
        if (beta != 0.0f && Cin != C)
            for (int z = 0; z < batch; z++)
                if (cudaMemcpy2DAsync(C + (size_t)z * (size_t)sC, (size_t)ldc * 2,
                                      Cin + (size_t)z * (size_t)sC, (size_t)ldc * 2, (size_t)M * 2,
                                      (size_t)N, cudaMemcpyDeviceToDevice, s) != cudaSuccess)
                    return -1;
        if (cublasSetStream(be->blas, s) != CUBLAS_STATUS_SUCCESS)
            return -1;
        return cublasGemmStridedBatchedEx(be->blas, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                          tb ? CUBLAS_OP_T : CUBLAS_OP_N, M, N, K, &alpha, A,
                                          CUDA_R_16BF, lda, sA, B, CUDA_R_16BF, ldb, sB, &beta, C,
                                          CUDA_R_16BF, ldc, sC, batch, CUBLAS_COMPUTE_32F,
                                          CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS
                   ? 0
                   : -1;
    }

    int mirror(uint16_t *A, int64_t m, int64_t block, long long stride, int batch)
    {
        const dim3 grid((unsigned)((m + NS_TILE - 1) / NS_TILE),
                        (unsigned)((m + NS_TILE - 1) / NS_TILE), (unsigned)batch);
        k_ns_mirror<<<grid, dim3(NS_TILE, 8), 0, s>>>(A, m, block, stride);
        return cudaGetLastError() == cudaSuccess ? 0 : -1;
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
                                                    a->transpose, part, 1.0, a->norm_scale, a->eps,
                                                    NULL);
        return cudaGetLastError() == cudaSuccess ? 0 : -1;
    }

    int diag_add(uint16_t *Z, int64_t m, float c, long long stride, int batch)
    {
        k_ns_diag_add<<<dim3(cuda_blocks((size_t)m, 256), (unsigned)batch), 256, 0, s>>>(Z, m, c,
                                                                                         stride);
        return cudaGetLastError() == cudaSuccess ? 0 : -1;
    }

    /* d from A's rows, A scaled, X loaded again from U with the load's norms (still in the
     * scratch) and d */
    int aol(const struct ns_args *a, int64_t k0, int64_t count, int64_t m, int64_t, uint16_t *x,
            uint16_t *A, void *scratch)
    {
        const size_t per = (size_t)(a->rows * a->cols);
        const void *in = (const char *)a->in + (size_t)k0 * per * kdtype_size(a->in_dtype);
        const double *part = (const double *)scratch;
        double *d = (double *)scratch + (size_t)count * NS_NORM_BLOCKS;
        const size_t total = (size_t)(count * m * m);
        k_ns_aol_rows<<<dim3((unsigned)m, (unsigned)count), 256, 0, s>>>(A, m, (double)a->eps, d);
        k_ns_aol_scale<<<cuda_blocks(total, 256), 256, 0, s>>>(A, m, total, d);
        const dim3 grid((unsigned)((a->cols + NS_TILE - 1) / NS_TILE),
                        (unsigned)((a->rows + NS_TILE - 1) / NS_TILE), (unsigned)count);
        k_ns_tile<<<grid, dim3(NS_TILE, 8), 0, s>>>(in, a->in_dtype, x, KDT_BF16, a->rows, a->cols,
                                                    a->transpose, part, 1.0, a->norm_scale, a->eps,
                                                    d);
        return cudaGetLastError() == cudaSuccess ? 0 : -1;
    }

    /* per matrix the load's kernel's 64 partial sums, into the scratch (room for 64 per matrix
     * of the pass, batch <= 64 of them here), read back and added in their fixed order */
    int sumsq(const uint16_t *x, int64_t count, long long stride, int batch, void *scratch,
              double *out)
    {
        double part[64 * NS_NORM_BLOCKS];
        if (batch > 64 || stride != count)
            return -1;
        k_ns_sumsq<<<dim3(NS_NORM_BLOCKS, (unsigned)batch), 256, 0, s>>>(x, KDT_BF16, (size_t)count,
                                                                         (double *)scratch);
        if (cudaGetLastError() != cudaSuccess ||
            cudaMemcpyAsync(part, scratch, sizeof(double) * NS_NORM_BLOCKS * (size_t)batch,
                            cudaMemcpyDeviceToHost, s) != cudaSuccess ||
            cudaStreamSynchronize(s) != cudaSuccess)
            return -1;
        for (int z = 0; z < batch; z++) {
            double t = 0.0;
            for (int b = 0; b < NS_NORM_BLOCKS; b++)
                t += part[z * NS_NORM_BLOCKS + b];
            out[z] = t;
        }
        return 0;
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
                                                    a->transpose, NULL, 1.0, 1.0f, 0.0f, NULL);
        return cudaGetLastError() == cudaSuccess ? 0 : -1;
    }
};

} // namespace

void cuda_lt_plans_destroy(struct cuda_backend *b)
{
    for (int i = 0; i < LT_PLAN_SLOTS; i++)
        lt_plan_free(&b->lt_plans[i]);
    memset(&b->lt_slots, 0, sizeof b->lt_slots);
}

size_t cuda_ns_workspace_bytes(int64_t rows, int64_t cols, int64_t batch)
{
    if (batch < 1)
        batch = 1;
    const int64_t m = rows < cols ? rows : cols;
    return ns_dev_matrices_bytes(rows, cols, batch) +
           (size_t)batch * (NS_NORM_BLOCKS + (size_t)m) * sizeof(double);
}

int cuda_newton_schulz(const struct kernel_ctx *ctx, const struct ns_args *a,
                       const struct ns_workspace *ws)
{
    struct cuda_backend *be = cuda_be(ctx);
    if (be == NULL || a->steps < 0)
        return -1;
    CudaDev d = {be, cuda_stream(ctx)};
    return ns_dev_run(d, a, ws->buf, ws->floats * sizeof(float));
}

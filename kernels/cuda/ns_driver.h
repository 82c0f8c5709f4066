/* Newton-Schulz on the device, in bf16 with fp32 accumulation, over a batch of equal matrices:
 * the sequence of products and the bookkeeping of leading dimensions, written once over a
 * device interface `Dev`. The CUDA backend instantiates it with cuBLAS (ns_cuda.cu); the unit
 * test instantiates it with plain host loops, so that the products' shapes and strides are
 * checked against the fp64 reference on machines without a GPU.
 *
 * Storage: matrices are row-major; the BLAS is column-major, where a row-major m x n buffer
 * reads as its n x m transpose. With Xc, Ac, Bc the column-major views of the X, A, B buffers:
 *   A = X X^T   <=>  Ac = Xc^T Xc          gemm(T, N, m, m, n)
 *   B = bA + cAA <=> Bc = b Ac + c Ac Ac    gemm(N, N, m, m, m), beta = b, C = A, D = B
 *   Y = aX + BX  <=> Yc = a Xc + Xc Bc      gemm(N, N, n, m, m), beta = a, C = X, D = Y
 * No product relies on A or B being exactly symmetric, which rounded bf16 results are not.
 *
 * The symmetric variant (a->variant = NS_VARIANT_SYMMETRIC, a->block rows per block) computes
 * only the block lower triangle of Ac and Bc, one product per block column [r0, r1):
 *   Ac[r0:m, r0:r1] = Xc[:, r0:m]^T Xc[:, r0:r1]                    gemm(T, N, m - r0, r1 - r0, n)
 *   Bc[r0:m, r0:r1] = b Ac[r0:m, r0:r1] + c Ac[r0:m, :] Ac[:, r0:r1] gemm(N, N, m - r0, r1 - r0, m)
 * and mirrors each into the strict upper part above the diagonal blocks before it is read whole
 * (A by the next product, B by Y = aX + BX). With k block columns the two products cost
 * (1 + 1/k) / 2 of the full ones; the mirrored halves make A and B exactly symmetric.
 *
 * Dev provides, on bf16 buffers (uint16_t) and stream-ordered:
 *   int gemm(int ta, int tb, M, N, K, alpha, A, lda, sA, B, ldb, sB, beta, C, D, ldc, sC,
 *            batch)   D = alpha op(A) op(B) + beta C; C and D share ldc and sC, C may be D, and
 *            is not read when beta is 0 (cuBLASLt takes C apart from D, so no copy of X into Y
 *            or of A into B is needed: those copies were a tenth of a 1408 x 4096 run)
 *   int load(const ns_args *a, int64_t k0, int64_t count, int64_t m, int64_t n, uint16_t *x,
 *            void *scratch)   X[k] <- U[k0+k] / (|U|_F * norm_scale + eps), working orientation
 *   int store(const ns_args *a, int64_t k0, int64_t count, int64_t m, int64_t n,
 *             const uint16_t *x)   O[k0+k] <- X[k] in the stored orientation, out_dtype
 *   size_t scratch_bytes(int64_t count)   for load
 *   int mirror(uint16_t *A, int64_t m, int64_t block, long long stride, int batch)
 *            Ac[r + c m] <- Ac[c + r m] for every r < (c / block) * block, in each of the batch
 *            (symmetric variant only)
 * Every call returns 0 or -1. */
#ifndef KERNELS_CUDA_NS_DRIVER_H
#define KERNELS_CUDA_NS_DRIVER_H

#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "../ns_shape.h"
#include "../ops.h"
}

/* Bytes of device workspace for one matrix of the batch (before the regions' padding). */
static inline size_t ns_dev_bytes_per_matrix(int64_t rows, int64_t cols)
{
    /* bf16: 2 bytes an element */
    return 2 * ns_xyab_elems(rows < cols ? rows : cols, rows < cols ? cols : rows);
}

static inline size_t ns_dev_pad(size_t bytes) { return (bytes + 255) & ~(size_t)255; }

/* The X, Y, A, B regions for count matrices, each starting on a 256-byte boundary of the
 * workspace: X and Y trade places every iteration, and a product's cached plan is keyed on its
 * operands' alignments (lt_plan_cache.h), so both must have the same ones. */
static inline size_t ns_dev_region_xy(int64_t rows, int64_t cols, int64_t count)
{
    return ns_dev_pad((size_t)count * (size_t)rows * (size_t)cols * 2);
}
static inline size_t ns_dev_region_ab(int64_t rows, int64_t cols, int64_t count)
{
    const size_t m = (size_t)(rows < cols ? rows : cols);
    return ns_dev_pad((size_t)count * m * m * 2);
}

/* Bytes of the four regions for count matrices; the load's scratch (per-matrix norms) follows
 * them. */
static inline size_t ns_dev_matrices_bytes(int64_t rows, int64_t cols, int64_t count)
{
    return 2 * ns_dev_region_xy(rows, cols, count) + 2 * ns_dev_region_ab(rows, cols, count);
}

template <class Dev> int ns_dev_run(Dev &d, const struct ns_args *a, void *ws, size_t ws_bytes)
{
    const int64_t m = a->rows < a->cols ? a->rows : a->cols;
    const int64_t n = a->rows < a->cols ? a->cols : a->rows;
    const size_t per = ns_dev_bytes_per_matrix(a->rows, a->cols);
    const long long mn = (long long)(m * n), mm = (long long)(m * m);

    if (a->batch == 0 || m == 0)
        return 0;
    /* the wide orientation; a square matrix either way (a transposed registration works on
     * its true orientation, sharding/layout.c) */
    if (a->rows != a->cols && (a->transpose != 0) != (a->rows > a->cols))
        return -1;
    /* as many matrices per pass as the workspace holds */
    int64_t chunk = (int64_t)(ws_bytes / per);
    while (chunk > 0 &&
           ns_dev_matrices_bytes(a->rows, a->cols, chunk) + d.scratch_bytes(chunk) > ws_bytes)
        chunk--;
    if (chunk == 0)
        return -1;
    if (chunk > 65535)
        chunk = 65535; /* the batch is a grid dimension of the device kernels */
    /* block columns of the symmetric variant; one (the full products) for the plain one */
    const int64_t block =
        a->variant == NS_VARIANT_SYMMETRIC && a->block > 0 && a->block < m ? a->block : m;
    if (a->variant != NS_VARIANT_PLAIN && a->variant != NS_VARIANT_SYMMETRIC)
        return -1;
    for (int64_t k0 = 0; k0 < a->batch; k0 += chunk) {
        const int64_t bc = a->batch - k0 < chunk ? a->batch - k0 : chunk;
        const int batch = (int)bc;
        const size_t rxy = ns_dev_region_xy(a->rows, a->cols, bc),
                     rab = ns_dev_region_ab(a->rows, a->cols, bc);
        uint16_t *x = (uint16_t *)ws;
        uint16_t *y = (uint16_t *)((char *)ws + rxy);
        uint16_t *A = (uint16_t *)((char *)ws + 2 * rxy);
        uint16_t *B = (uint16_t *)((char *)ws + 2 * rxy + rab);
        void *scratch = (char *)ws + ns_dev_matrices_bytes(a->rows, a->cols, bc);

        if (d.load(a, k0, bc, m, n, x, scratch) != 0)
            return -1;
        for (int it = 0; it < a->steps; it++) {
            const float ca = a->coeffs[it][0], cb = a->coeffs[it][1], cc = a->coeffs[it][2];
            if (block == m) {
                if (d.gemm(1, 0, (int)m, (int)m, (int)n, 1.0f, x, (int)n, mn, x, (int)n, mn, 0.0f,
                           A, A, (int)m, mm, batch) != 0 ||
                    d.gemm(0, 0, (int)m, (int)m, (int)m, cc, A, (int)m, mm, A, (int)m, mm, cb, A, B,
                           (int)m, mm, batch) != 0)
                    return -1;
            } else {
                for (int64_t r0 = 0; r0 < m; r0 += block) {
                    const int M = (int)(m - r0), N = (int)(r0 + block < m ? block : m - r0);
                    if (d.gemm(1, 0, M, N, (int)n, 1.0f, x + r0 * n, (int)n, mn, x + r0 * n, (int)n,
                               mn, 0.0f, A + r0 * m + r0, A + r0 * m + r0, (int)m, mm, batch) != 0)
                        return -1;
                }
                if (d.mirror(A, m, block, mm, batch) != 0)
                    return -1;
                for (int64_t r0 = 0; r0 < m; r0 += block) {
                    const int M = (int)(m - r0), N = (int)(r0 + block < m ? block : m - r0);
                    if (d.gemm(0, 0, M, N, (int)m, cc, A + r0, (int)m, mm, A + r0 * m, (int)m, mm,
                               cb, A + r0 * m + r0, B + r0 * m + r0, (int)m, mm, batch) != 0)
                        return -1;
                }
                if (d.mirror(B, m, block, mm, batch) != 0)
                    return -1;
            }
            if (d.gemm(0, 0, (int)n, (int)m, (int)m, 1.0f, x, (int)n, mn, B, (int)m, mm, ca, x, y,
                       (int)n, mn, batch) != 0)
                return -1;
            uint16_t *t = x;
            x = y;
            y = t;
        }
        if (d.store(a, k0, bc, m, n, x) != 0)
            return -1;
    }
    return 0;
}

#endif

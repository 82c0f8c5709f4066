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
 * and for any m x m product D = P Q, Dc = Qc Pc: Q's buffer is the BLAS's first operand.
 * No product relies on A or B being exactly symmetric, which rounded bf16 results are not.
 *
 * The symmetric variant (a->variant = NS_VARIANT_SYMMETRIC, a->block rows per block) computes
 * only the block lower triangle of Ac and Bc, one product per block column [r0, r1):
 *   Ac[r0:m, r0:r1] = Xc[:, r0:m]^T Xc[:, r0:r1]                    gemm(T, N, m - r0, r1 - r0, n)
 *   Bc[r0:m, r0:r1] = b Ac[r0:m, r0:r1] + c Ac[r0:m, :] Ac[:, r0:r1] gemm(N, N, m - r0, r1 - r0, m)
 * and mirrors each into the strict upper part above the diagonal blocks before it is read whole
 * (A by the next product, B by Y = aX + BX). With k block columns the two products cost
 * (1 + 1/k) / 2 of the full ones; the mirrored halves make A and B exactly symmetric. That block
 * lower triangle of Dc is the block upper triangle of the row-major D, the half the CPU's
 * symmetric products compute (kernels/cpu/ns_bf16_run.c).
 *
 * a->algorithm = NS_ALGO_GRAM runs Gram Newton-Schulz (ns_dev_gram below) and a->precondition =
 * NS_PRECOND_AOL scales X's rows after the load (Dev::aol), both as the CPU's bf16 path does:
 * every m x m matrix in bf16 with fp32 accumulation, the same restarts, the same products halved.
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
 *   size_t scratch_bytes(int64_t count, int64_t m)   for load and aol
 *   int mirror(uint16_t *A, int64_t m, int64_t block, long long stride, int batch)
 *            Ac[r + c m] <- Ac[c + r m] for every r < (c / block) * block, in each of the batch
 *            (symmetric variant only)
 *   int diag_add(uint16_t *Z, int64_t m, float c, long long stride, int batch)
 *            Z[i][i] <- bf16(Z[i][i] + c) in each of the batch (Gram only)
 *   int aol(const ns_args *a, int64_t k0, int64_t count, int64_t m, int64_t n, uint16_t *x,
 *           uint16_t *A, void *scratch)   with A[k] = X[k] X[k]^T whole (stride m * m) and the
 *            load's scratch: d_i = (sum_j |A_ij| + eps)^(-1/2) summed in double, X_i <- bf16 of
 *            d_i times the fp32 value the load rounded (from U again, not from bf16 X: the CPU
 *            scales its fp32 staging), A_ij <- bf16(A_ij d_i d_j) (ns_precondition = aol only)
 *   int sumsq(const uint16_t *x, int64_t count, long long stride, int batch, void *scratch,
 *             double *out)   out[z] (host memory) <- sum of squares of the count elements at
 *            x + z stride, in double, in a fixed order, batch <= 64; waits for the stream (Gram
 *            only: the result guard)
 * Every call returns 0 or -1. */
#ifndef KERNELS_CUDA_NS_DRIVER_H
#define KERNELS_CUDA_NS_DRIVER_H

#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "../ns_coeffs.h"
#include "../ns_shape.h"
#include "../ops.h"
}

/* Bytes of device workspace for one matrix of the batch (before the regions' padding): X, Y,
 * A, B, and Gram's Z where it does not fit behind R in Y (ns_dev_z_in_y). */
static inline size_t ns_dev_bytes_per_matrix(int64_t rows, int64_t cols)
{
    /* bf16: 2 bytes an element; Gram's Z needs its own m x m region where n < 2m */
    const int64_t m = rows < cols ? rows : cols, n = rows < cols ? cols : rows;
    return 2 * (ns_xyab_elems(m, n) + (n < 2 * m ? (size_t)m * (size_t)m : 0));
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

/* Gram Newton-Schulz keeps four m x m matrices (R, Z, Q, T) beside X. R lives at the start of
 * the Y region, which the Gram steps do not use (Y is written only by Q X, at a restart and at
 * the end, when R is no longer needed); Q and T in A and B. Z goes behind R in Y when both fit
 * there (n >= 2m, about: every GLM-4.5-Air matrix), else in a fifth region after B, so that the
 * standard algorithm's workspace grows only for shapes with n < 2m (by m^2 bf16 per matrix). */
static inline int ns_dev_z_in_y(int64_t rows, int64_t cols, int64_t count)
{
    return 2 * ns_dev_region_ab(rows, cols, count) <= ns_dev_region_xy(rows, cols, count);
}

/* Bytes of the regions for count matrices; the scratch (Dev::scratch_bytes) follows them. */
static inline size_t ns_dev_matrices_bytes(int64_t rows, int64_t cols, int64_t count)
{
    return 2 * ns_dev_region_xy(rows, cols, count) +
           (ns_dev_z_in_y(rows, cols, count) ? 2 : 3) * ns_dev_region_ab(rows, cols, count);
}

/* One pass: batch working matrices m x n, their m x m products whole (block = m) or in block
 * columns of `block` (the symmetric variant). */
struct ns_dev_geom {
    int64_t m, n, block;
    long long mn, mm;
    int batch;
};

/* A = X X^T: whole, or its block lower triangle mirrored. */
template <class Dev>
int ns_dev_xxt(Dev &d, const struct ns_dev_geom &g, const uint16_t *x, uint16_t *A)
{
    const int m = (int)g.m, n = (int)g.n;
    if (g.block == g.m)
        return d.gemm(1, 0, m, m, n, 1.0f, x, n, g.mn, x, n, g.mn, 0.0f, A, A, m, g.mm, g.batch);
    for (int64_t r0 = 0; r0 < g.m; r0 += g.block) {
        const int M = (int)(g.m - r0), N = (int)(r0 + g.block < g.m ? g.block : g.m - r0);
        if (d.gemm(1, 0, M, N, n, 1.0f, x + r0 * g.n, n, g.mn, x + r0 * g.n, n, g.mn, 0.0f,
                   A + r0 * g.m + r0, A + r0 * g.m + r0, m, g.mm, g.batch) != 0)
            return -1;
    }
    return d.mirror(A, g.m, g.block, g.mm, g.batch);
}

/* D = alpha P Q + beta C of m x m matrices whose product is symmetric in exact arithmetic (A A,
 * R R, (Z R) Z): whole, or its block lower triangle mirrored. C is read whole where beta != 0. */
template <class Dev>
int ns_dev_symm(Dev &d, const struct ns_dev_geom &g, float alpha, const uint16_t *P,
                const uint16_t *Q, float beta, const uint16_t *C, uint16_t *D)
{
    const int m = (int)g.m;
    if (g.block == g.m)
        return d.gemm(0, 0, m, m, m, alpha, Q, m, g.mm, P, m, g.mm, beta, C, D, m, g.mm, g.batch);
    for (int64_t r0 = 0; r0 < g.m; r0 += g.block) {
        const int M = (int)(g.m - r0), N = (int)(r0 + g.block < g.m ? g.block : g.m - r0);
        if (d.gemm(0, 0, M, N, m, alpha, Q + r0, m, g.mm, P + r0 * g.m, m, g.mm, beta,
                   C + r0 * g.m + r0, D + r0 * g.m + r0, m, g.mm, g.batch) != 0)
            return -1;
    }
    return d.mirror(D, g.m, g.block, g.mm, g.batch);
}

/* D = P Q of m x m matrices, whole (Z Q and Z R: kernels/cpu/ns_gram.c says why not halved). */
template <class Dev>
int ns_dev_mul(Dev &d, const struct ns_dev_geom &g, const uint16_t *P, const uint16_t *Q,
               uint16_t *D)
{
    const int m = (int)g.m;
    return d.gemm(0, 0, m, m, m, 1.0f, Q, m, g.mm, P, m, g.mm, 0.0f, D, D, m, g.mm, g.batch);
}

/* Y = beta X + B X (B m x m, X and Y m x n). */
template <class Dev>
int ns_dev_apply(Dev &d, const struct ns_dev_geom &g, const uint16_t *B, float beta,
                 const uint16_t *x, uint16_t *y)
{
    const int m = (int)g.m, n = (int)g.n;
    return d.gemm(0, 0, n, m, m, 1.0f, x, n, g.mn, B, m, g.mm, beta, x, y, n, g.mn, g.batch);
}

/* Z = c0 I + c1 R + c2 R R: c2 R R + c1 R as one product (the standard step's B), then c0 on the
 * diagonal, rounded once more (kernels/cpu/ns_bf16_run.c's poly_bf16). */
template <class Dev>
int ns_dev_poly(Dev &d, const struct ns_dev_geom &g, const float c[3], const uint16_t *R,
                uint16_t *Z)
{
    if (ns_dev_symm(d, g, c[2], R, R, c[1], R, Z) != 0)
        return -1;
    return d.diag_add(Z, g.m, c[0], g.mm, g.batch);
}

/* Gram Newton-Schulz over one pass, product for product as kernels/cpu/ns_gram.c (run_gram) and
 * its bf16 twin: R = X X^T (unless AOL formed it: have_R), per step Z = p(R), Q = Z Q (Q = Z
 * for a segment's first step), R = (Z R) Z where another step of the segment follows; at the
 * restarts (ns_coeffs_gram_restarts) and at the end X <- Q X. R is at *y, Z at z (NULL: behind R
 * in *y, z_off bytes in), Q and T in A and B (ns_dev_z_in_y says why). *x ends as the result. */
template <class Dev>
int ns_dev_gram(Dev &d, const struct ns_dev_geom &g, const struct ns_args *a, int have_R,
                uint16_t **x, uint16_t **y, uint16_t *A, uint16_t *B, uint16_t *z, size_t z_off)
{
    const int steps = a->steps;
    const uint32_t restarts = ns_coeffs_gram_restarts(a->coeffs, steps, g.m, g.n);
    uint16_t *Q = A, *T = B, *t;
    int have_Q = 0;

    if (steps <= 0)
        return 0;
    if (!have_R && ns_dev_xxt(d, g, *x, *y) != 0)
        return -1;
    for (int it = 0; it < steps; it++) {
        if (restarts >> it & 1u) { /* X <- Q X, G from it, Q = I */
            if (ns_dev_apply(d, g, Q, 0.0f, *x, *y) != 0)
                return -1;
            t = *x;
            *x = *y;
            *y = t;
            if (ns_dev_xxt(d, g, *x, *y) != 0)
                return -1;
            have_Q = 0;
        }
        uint16_t *R = *y, *Z = z != NULL ? z : (uint16_t *)((char *)*y + z_off);
        const uint16_t *zk; /* Z of this step */
        if (!have_Q) {      /* Q = Z: formed where Q goes */
            if (ns_dev_poly(d, g, a->coeffs[it], R, Q) != 0)
                return -1;
            zk = Q;
            have_Q = 1;
        } else { /* Q = Z Q */
            if (ns_dev_poly(d, g, a->coeffs[it], R, Z) != 0 || ns_dev_mul(d, g, Z, Q, T) != 0)
                return -1;
            t = Q;
            Q = T;
            T = t;
            zk = Z;
        }
        if (it + 1 < steps && !(restarts >> (it + 1) & 1u)) /* R = (Z R) Z */
            if (ns_dev_mul(d, g, zk, R, T) != 0 || ns_dev_symm(d, g, 1.0f, T, zk, 0.0f, R, R) != 0)
                return -1;
    }
    if (ns_dev_apply(d, g, Q, 0.0f, *x, *y) != 0)
        return -1;
    t = *x;
    *x = *y;
    *y = t;
    return 0;
}

/* One matrix of the pass, k (0-based in it), again by the standard algorithm, into its slot of
 * x: the Gram result guard's fallback. The input is still in a->in (the pass is stored only after
 * the check). y, A and B are free after the Gram steps; loaded where the steps' last swap leaves
 * the result in the slot. */
template <class Dev>
int ns_dev_redo_standard(Dev &d, const struct ns_dev_geom &g, const struct ns_args *a, int64_t k0,
                         int64_t k, uint16_t *x, uint16_t *y, uint16_t *A, uint16_t *B,
                         void *scratch)
{
    const struct ns_dev_geom g1 = {g.m, g.n, g.block, g.mn, g.mm, 1};
    uint16_t *slot = x + k * g.mn;
    uint16_t *p = a->steps % 2 ? y : slot, *q = a->steps % 2 ? slot : y;
    int have_A = 0;
    if (d.load(a, k0 + k, 1, g.m, g.n, p, scratch) != 0)
        return -1;
    if (a->precondition == NS_PRECOND_AOL) {
        if (ns_dev_xxt(d, g1, p, A) != 0 || d.aol(a, k0 + k, 1, g.m, g.n, p, A, scratch) != 0)
            return -1;
        have_A = 1;
    }
    for (int it = 0; it < a->steps; it++) {
        const float *c = a->coeffs[it];
        if (!(it == 0 && have_A) && ns_dev_xxt(d, g1, p, A) != 0)
            return -1;
        if (ns_dev_symm(d, g1, c[2], A, A, c[1], A, B) != 0 ||
            ns_dev_apply(d, g1, B, c[0], p, q) != 0)
            return -1;
        uint16_t *t = p;
        p = q;
        q = t;
    }
    return 0;
}

/* The Gram result guard over a pass (kernels/ns_coeffs.h, ns_coeffs_output_norm_ok, as the CPU
 * paths check): each matrix's squared norm, read back in groups of 64, and a matrix that fails
 * recomputed by the standard algorithm (ns_dev_redo_standard). */
template <class Dev>
int ns_dev_guard(Dev &d, const struct ns_dev_geom &g, const struct ns_args *a, int64_t k0,
                 uint16_t *x, uint16_t *y, uint16_t *A, uint16_t *B, void *scratch)
{
    double ss[64];
    for (int64_t j0 = 0; j0 < g.batch; j0 += 64) {
        const int cnt = (int)(g.batch - j0 < 64 ? g.batch - j0 : 64);
        if (d.sumsq(x + j0 * g.mn, g.mn, g.mn, cnt, scratch, ss) != 0)
            return -1;
        for (int j = 0; j < cnt; j++) {
            if (ns_coeffs_output_norm_ok(a->coeffs, a->steps, a->norm_scale, g.m, ss[j]))
                continue;
            if (ns_dev_redo_standard(d, g, a, k0, j0 + j, x, y, A, B, scratch) != 0)
                return -1;
            if (a->guard_fallbacks != NULL)
                (*a->guard_fallbacks)++;
        }
    }
    return 0;
}

template <class Dev> int ns_dev_run(Dev &d, const struct ns_args *a, void *ws, size_t ws_bytes)
{
    const int64_t m = a->rows < a->cols ? a->rows : a->cols;
    const int64_t n = a->rows < a->cols ? a->cols : a->rows;
    const size_t per = ns_dev_bytes_per_matrix(a->rows, a->cols);

    if (a->batch == 0 || m == 0)
        return 0;
    /* the wide orientation; a square matrix either way (a transposed registration works on
     * its true orientation, sharding/layout.c) */
    if (a->rows != a->cols && (a->transpose != 0) != (a->rows > a->cols))
        return -1;
    if ((a->algorithm != NS_ALGO_STANDARD && a->algorithm != NS_ALGO_GRAM) ||
        (a->precondition != NS_PRECOND_FROBENIUS && a->precondition != NS_PRECOND_AOL))
        return -1;
    /* as many matrices per pass as the workspace holds */
    int64_t chunk = (int64_t)(ws_bytes / per);
    while (chunk > 0 &&
           ns_dev_matrices_bytes(a->rows, a->cols, chunk) + d.scratch_bytes(chunk, m) > ws_bytes)
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
        const struct ns_dev_geom g = {m, n, block, (long long)(m * n), (long long)(m * m), (int)bc};
        const size_t rxy = ns_dev_region_xy(a->rows, a->cols, bc),
                     rab = ns_dev_region_ab(a->rows, a->cols, bc);
        uint16_t *x = (uint16_t *)ws;
        uint16_t *y = (uint16_t *)((char *)ws + rxy);
        uint16_t *A = (uint16_t *)((char *)ws + 2 * rxy);
        uint16_t *B = (uint16_t *)((char *)ws + 2 * rxy + rab);
        uint16_t *z = ns_dev_z_in_y(a->rows, a->cols, bc)
                          ? NULL
                          : (uint16_t *)((char *)ws + 2 * rxy + 2 * rab);
        void *scratch = (char *)ws + ns_dev_matrices_bytes(a->rows, a->cols, bc);
        const int gram = a->algorithm == NS_ALGO_GRAM;
        int have_A = 0;

        if (d.load(a, k0, bc, m, n, x, scratch) != 0)
            return -1;
        if (a->precondition == NS_PRECOND_AOL) { /* its X X^T is the first step's (Gram: R) */
            uint16_t *G = gram ? y : A;
            if (ns_dev_xxt(d, g, x, G) != 0 || d.aol(a, k0, bc, m, n, x, G, scratch) != 0)
                return -1;
            have_A = 1;
        }
        if (gram) {
            if (ns_dev_gram(d, g, a, have_A, &x, &y, A, B, z, rab) != 0 ||
                ns_dev_guard(d, g, a, k0, x, y, A, B, scratch) != 0)
                return -1;
        } else {
            for (int it = 0; it < a->steps; it++) {
                const float *c = a->coeffs[it];
                if (!(it == 0 && have_A) && ns_dev_xxt(d, g, x, A) != 0)
                    return -1;
                if (ns_dev_symm(d, g, c[2], A, A, c[1], A, B) != 0 ||
                    ns_dev_apply(d, g, B, c[0], x, y) != 0)
                    return -1;
                uint16_t *t = x;
                x = y;
                y = t;
            }
        }
        if (d.store(a, k0, bc, m, n, x) != 0)
            return -1;
    }
    return 0;
}

#endif

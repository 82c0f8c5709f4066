/* The parts of Newton-Schulz every CPU variant shares, so that they differ only in the products. */
#ifndef KERNELS_CPU_NS_COMMON_H
#define KERNELS_CPU_NS_COMMON_H

#include "../ops.h"

/* Rows per block row of the fp32 symmetric variant's (Z R) Z on the Gram path (ns_blas.c's
 * sym_symmul: panels of the upper triangle as sgemm calls of this many rows; 256: within a few
 * percent of ssyrk on the X X^T measurements there). ns_sym_blocks_for counts it. */
#define NS_SYMMUL_BLOCK 256

/* Working shape: m x n with m <= n (the stored matrix, or its transpose). */
static inline void ns_work_shape(const struct ns_args *a, int64_t *m, int64_t *n)
{
    *m = a->transpose ? a->cols : a->rows;
    *n = a->transpose ? a->rows : a->cols;
}

/* X <- U_k / (|U_k|_F * norm_scale + eps), in the working orientation. The norm is a double
 * sum in storage order over a fixed set of lanes, so it depends on neither threads nor variants. */
void ns_load_normalized(const struct ns_args *a, int64_t k, float *x);

/* One Newton-Schulz iteration on the working matrix: Y from X, with A and B (m x m) scratch. */
typedef void (*ns_iter_fn)(const struct kernel_ctx *ctx, int64_t m, int64_t n, const float c[3],
                           const float *x, float *y, float *A, float *B);

/* The whole kernel around an iteration: checks, then per matrix of the batch load normalized,
 * `steps` iterations, store. Returns 0, or -1 for a tall working shape or a short workspace. */
int ns_run_batch(const struct kernel_ctx *ctx, const struct ns_args *a,
                 const struct ns_workspace *ws, ns_iter_fn iter);

/* X <- U_k * inv in the working orientation (inv from a norm summed elsewhere, e.g. over the
 * pieces of a sharded matrix). */
void ns_load_with_inv(const struct ns_args *a, int64_t k, double inv, float *x);

/* Lower triangle of the m x m row-major matrix S (elements of es = 2 or 4 bytes: bf16 or fp32)
 * <- transpose of its upper one. A symmetric product writes only the upper half. */
void ns_mirror_upper(void *S, int64_t m, size_t es);

/* O_k <- X rounded to nearest in out_dtype, back in the stored orientation. */
void ns_store_output(const struct ns_args *a, int64_t k, const float *x);

/* AOL scaling of the m x m Gram matrix A = X X^T of a loaded X: d_i = (sum_j |A_ij| + eps)^(-1/2)
 * (sums in double, in a fixed order), X_i <- d_i X_i and A_ij <- d_i A_ij d_j, so that A stays
 * the Gram matrix of the scaled X and the first step need not form it again. d: m doubles of
 * scratch. */
void ns_aol_scale(int64_t m, int64_t n, double eps, float *x, float *A, double *d);

/* The Gram result guard: 1 when x (the working m x n result, fp32 or bf16 by dt) passes
 * ns_coeffs_output_norm_ok: finite, and its squared Frobenius norm at most NS_COEFFS_GUARD_SLACK
 * m S^2, S the bound on the singular values a->coeffs can output (ns_coeffs_output_bound). One
 * pass over x, summed in a fixed order (cpu_sumsq), so the same bits give the same answer on
 * every rank and layout. Gram's known failure (docs/design.md, "Gram Newton-Schulz": a negative
 * eigenvalue of R that rounding made and the steps grow) sends the result to Inf, NaN or far past
 * S; a result off by less than the slack passes. */
int ns_gram_guard_ok(const void *x, int dt, int64_t m, int64_t n, const struct ns_args *a);

/* The products a CPU Newton-Schulz is made of, for the driver below (fp32 working matrices,
 * m x m ones symmetric and stored whole). */
struct ns_products {
    /* A = X X^T */
    void (*gram)(const struct kernel_ctx *ctx, const float *x, int64_t m, int64_t n, float *A);
    /* Y = (c0 I + c1 A + c2 A A) X, with scratch B: one standard step from its A */
    void (*update)(const struct kernel_ctx *ctx, const float *A, const float c[3], const float *x,
                   int64_t m, int64_t n, float *B, float *y);
    /* Z = c0 I + c1 R + c2 R R */
    void (*poly)(const struct kernel_ctx *ctx, const float *R, const float c[3], int64_t m,
                 float *Z);
    /* C = P Q for commuting symmetric P, Q whose product is formed as symmetric (its upper half
     * where the variant halves products) */
    void (*symmul)(const struct kernel_ctx *ctx, const float *P, const float *Q, int64_t m,
                   float *C);
    /* C = P Q, whole */
    void (*mul)(const struct kernel_ctx *ctx, const float *P, const float *Q, int64_t m, float *C);
    /* Y = Q X */
    void (*apply)(const struct kernel_ctx *ctx, const float *Q, const float *x, int64_t m,
                  int64_t n, float *y);
};

/* Newton-Schulz of every matrix of the batch by a->algorithm and a->precondition on these
 * products (the standard algorithm with Frobenius scaling needs only gram and update). 0, or -1
 * for a tall working shape or a short workspace. */
int ns_run_products(const struct kernel_ctx *ctx, const struct ns_args *a,
                    const struct ns_workspace *ws, const struct ns_products *p);

#endif

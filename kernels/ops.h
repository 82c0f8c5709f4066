/* One table of compute entry points per backend (BLIS-style context), filled at init; the
 * backend's memory, copies, streams and events are its device table (kernels/device.h).
 *
 * Every table computes the update rules of docs/design.md (Update rules). The reference table is
 * plain C written for clarity and is the oracle the tests compare the others with. Kernels know
 * nothing of MPI, files or the runtime: every scalar they need (bias corrections, lr*wd products)
 * arrives precomputed in the argument structs. */
#ifndef KERNELS_OPS_H
#define KERNELS_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "ctx.h"
#include "dtype.h"
#include "hd.h"
#include "rng.h"

/* Global flat index of local element i: base + (i / run) * stride + i % run. A shard along dim d
 * of a row-major tensor is a set of equal runs; a whole tensor is one run. Stochastic rounding
 * keys on the global index so that the layout cannot change the random bits. */
struct elem_index_map {
    uint64_t base;
    uint64_t run;
    uint64_t stride;
};

KHD static inline uint64_t elem_index_global(const struct elem_index_map *m, uint64_t i)
{
    return m->base + (i / m->run) * m->stride + i % m->run;
}

/* Muon momentum and pack, in exactly this fp32 sequence (every variant matches it bit for bit):
 *   g = grad*grad_scale, 0 if that is not finite;  M <- round_mom(fma(mu, M, g));
 *   U <- nesterov ? fma(mu, M, g) : M
 * where the second M is the stored (rounded) one and U is rounded to nearest in out_dtype. */
struct momentum_args {
    size_t n;
    const void *grad;
    int grad_dtype;
    float grad_scale;
    void *mom;
    int mom_dtype;
    int mom_rounding;
    void *out;
    int out_dtype;
    float mu;
    int nesterov;
    struct rng_stream rng; /* kind momentum; used with stochastic mom_rounding */
    struct elem_index_map idx;
};

/* Fused AdamW on one shard (moments stored fp32 or bf16, computed in fp32 and rounded once),
 * in exactly this fp32 sequence (fma = one rounding):
 *   g = grad*grad_scale, 0 if that is not finite (as for momentum)
 *   m <- fma(b1, m, (1-b1)*g);  v <- fma(b2, v, (1-b2)*(g*g))
 *   W <- fma(-step_size, m / fma(sqrt(v), bc2_rsqrt, eps), W*decay)
 * with step_size = lr/(1-b1^t), bc2_rsqrt = 1/sqrt(1-b2^t), decay = 1 - lr*wd, all computed
 * on the host in double. */
struct adamw_args {
    size_t n;
    void *param;
    int param_dtype;
    int param_rounding;
    const void *grad;
    int grad_dtype;
    float grad_scale;
    void *exp_avg;    /* first moment, m_dtype */
    void *exp_avg_sq; /* second moment, v_dtype */
    int m_dtype, v_dtype;
    int state_rounding;             /* into bf16 moments */
    struct rng_stream rng_m, rng_v; /* kinds exp_avg / exp_avg_sq; with stochastic state_rounding */
    float beta1, beta2;
    float one_minus_beta1, one_minus_beta2; /* from double, not 1.0f - beta1 */
    float eps;
    float step_size, bc2_rsqrt, decay;
    struct rng_stream rng; /* kind param; used with stochastic param_rounding */
    struct elem_index_map idx;
};

/* Apply: W <- round_param(fma(-alpha, O, W*decay)), computed in fp32 from the stored W. */
struct apply_args {
    size_t n;
    void *param;
    int param_dtype;
    int param_rounding;
    const void *update;
    int update_dtype;
    float alpha; /* lr_eff * lr scale of the matrix */
    float decay; /* 1 - lr_eff * wd_eff */
    struct rng_stream rng;
    struct elem_index_map idx;
};

enum ns_variant {
    NS_VARIANT_PLAIN = 0,     /* three GEMMs per iteration */
    NS_VARIANT_SYMMETRIC = 1, /* X*X^T and A*A as symmetric products, upper half mirrored */
};

/* How the iterations are arranged (docs/design.md, "Gram Newton-Schulz"): shardopt_ns_algorithm_t's
 * values (auto is resolved above the kernels).
 *   standard: per step A = X X^T, B = b A + c A A, X = a X + B X
 *   gram:     X_k = Q_k X: the steps run on m x m matrices, X is touched at the restarts and at the
 *             end (ns_coeffs_gram_restarts) */
enum ns_algorithm {
    NS_ALGO_STANDARD = SHARDOPT_NS_ALGORITHM_STANDARD,
    NS_ALGO_GRAM = SHARDOPT_NS_ALGORITHM_GRAM,
};

/* How X is scaled before the first step: shardopt_ns_precondition_t's values.
 *   frobenius: X = U / (|U|_F s + eps)
 *   aol:       then rows by d_i = (sum_j |(X X^T)_ij| + eps)^(-1/2): |X|_2 <= 1 */
enum ns_precondition {
    NS_PRECOND_FROBENIUS = SHARDOPT_NS_PRECONDITION_FROBENIUS,
    NS_PRECOND_AOL = SHARDOPT_NS_PRECONDITION_AOL,
};

/* Newton-Schulz over a batch of equal matrices, each stored row-major rows x cols (in and out
 * may be the same buffer: each matrix is read whole before its result is written):
 *   X <- U / (|U|_F * norm_scale + eps);   work on X^T when `transpose`
 *   per iteration i: A = X X^T;  B = b_i A + c_i A A;  X = a_i X + B X
 * O (in the stored orientation) is rounded to nearest in out_dtype. */
struct ns_args {
    int64_t batch, rows, cols;
    int transpose;
    const void *in;
    int in_dtype;
    void *out;
    int out_dtype;
    const float (*coeffs)[3]; /* steps triples */
    int steps;
    float norm_scale;
    float eps;
    int variant;
    int compute;      /* KDT_F32, or KDT_BF16: oneDNN bf16 products (kernels/cpu/ns_bf16.h) */
    int block;        /* bf16 symmetric variant: rows per block row */
    int algorithm;    /* enum ns_algorithm (0: standard) */
    int precondition; /* enum ns_precondition (0: frobenius) */
    /* Gram: matrices whose result failed the guard (ns_gram_guard_ok) and were recomputed by the
     * standard algorithm are added here; NULL: not counted */
    int64_t *guard_fallbacks;
};

/* The map for local elements [off, off + n) of a map's range: off must start a run, or the range
 * must lie inside one run (true for every matrix piece of a layout). */
KHD static inline struct elem_index_map elem_index_map_at(const struct elem_index_map *m,
                                                          uint64_t off)
{
    struct elem_index_map r = *m;
    if (off % m->run == 0) {
        r.base = m->base + (off / m->run) * m->stride;
    } else {
        r.base = elem_index_global(m, off);
        r.run = m->run - off % m->run;
    }
    return r;
}

/* Scratch for one matrix at a time, sized by ns_workspace_floats() for the largest shape. */
struct ns_bf16;
struct ns_workspace {
    float *buf;
    size_t floats;
    struct ns_bf16 *bf16; /* compute = bf16: the prepared oneDNN primitives */
};

/* Floats of workspace newton_schulz needs for a rows x cols matrix. */
size_t ns_workspace_floats(int64_t rows, int64_t cols);

/* FLOPs of one Newton-Schulz iteration, 4m^2n + 2m^3 with m <= n (what benchmarks count). */
double ns_flops_per_iter(int64_t rows, int64_t cols);

/* FLOPs one matrix's Newton-Schulz really performs (2 per multiply-add), m <= n the working
 * shape, with these coefficients (Gram's restarts depend on them: ns_coeffs_gram_restarts):
 * `symmetric` counts a product whose result is symmetric (X X^T, A A, and on the Gram path every
 * m x m product) at its upper half. Standard: steps (4m^2n + 2m^3), or symmetric steps
 * (3m^2n + m^3). Gram: G (2m^2n, sym m^2n) per segment between restarts, per step R R
 * (2m^3 | m^3), Q = Z Q except a segment's first (2m^3, always whole), R <- (Z R) Z except before
 * a restart and after the last step (Z R whole 2m^3, then 2m^3 | m^3), X <- Q X per segment
 * (2m^2n); kernels/cpu/ns_gram.c says which products are halved and why. */
double ns_flops_total(int64_t rows, int64_t cols, const float (*coeffs)[3], int steps,
                      int algorithm, int symmetric);

/* The same with the restarts of Gram in `compute` (ns_coeffs_gram_restarts_for: fp32's differ
 * for quintic's 5 steps); ns_flops_total is this with bf16's, the planner's and the device's. */
double ns_flops_total_for(int64_t rows, int64_t cols, const float (*coeffs)[3], int steps,
                          int algorithm, int symmetric, int compute);

/* Rows per block row in which a kernel forms each kind of product whose result is symmetric, so
 * that it computes only the entries of the upper block rows (docs/design.md, "Counting
 * Newton-Schulz FLOPs"): gram X X^T, poly A A (R R on the Gram path), symmul (Z R) Z. A block of
 * m or more: the whole product; 1: exactly the upper triangle with its diagonal (ssyrk). */
struct ns_sym_blocks {
    int64_t gram, poly, symmul;
};

/* The blocks of the CPU kernels for a rows x cols matrix run with `variant` (and the bf16
 * variant's `block`) under `compute` (KDT_F32 or KDT_BF16): the plain variant forms every product
 * whole; the fp32 symmetric one X X^T and A A with ssyrk (1) and (Z R) Z in block rows of
 * NS_SYMMUL_BLOCK; the bf16 symmetric one all three in block rows of `block`. */
void ns_sym_blocks_for(int64_t rows, int64_t cols, int variant, int block, int compute,
                       struct ns_sym_blocks *b);

/* FLOPs one matrix's Newton-Schulz performs (2 per multiply-add of its products, the work the
 * kernel is asked for: a symmetric product costs 2K per entry of its upper block rows, K its
 * inner dimension), `steps` steps of `algorithm`, Gram restarting where `restarts` says
 * (ns_coeffs_gram_restarts' mask; ignored for standard), symmetric products formed in the blocks
 * b (NULL: all whole). AOL adds none: its X X^T is the first step's. What the runtime counts in
 * ns_flops_last; sharding/plan.c's plan_ns_flops_blocked is the planner's copy (test_ns_gram
 * checks that they agree). */
double ns_flops_performed(int64_t rows, int64_t cols, int steps, int algorithm, uint32_t restarts,
                          const struct ns_sym_blocks *b);

struct kernel_ops {
    const char *name;
    void (*momentum)(const struct kernel_ctx *ctx, const struct momentum_args *a);
    void (*adamw)(const struct kernel_ctx *ctx, const struct adamw_args *a);
    void (*apply)(const struct kernel_ctx *ctx, const struct apply_args *a);
    /* count independent calls of the op above at once: a device backend launches one kernel for
     * all of them (a bucket's pieces); NULL where one call at a time costs nothing (the CPU). */
    void (*momentum_many)(const struct kernel_ctx *ctx, const struct momentum_args *a, int count);
    void (*adamw_many)(const struct kernel_ctx *ctx, const struct adamw_args *a, int count);
    void (*apply_many)(const struct kernel_ctx *ctx, const struct apply_args *a, int count);
    /* Returns 0, or -1 when the variant is not available in this table. */
    int (*newton_schulz)(const struct kernel_ctx *ctx, const struct ns_args *a,
                         const struct ns_workspace *ws);
    /* Sharded Newton-Schulz: a matrix whose working columns are spread over ranks. The runtime
     * sums the pieces' squared norms and their Gram matrices over the ranks between these calls.
     * shard_load: X <- U * inv, working orientation (a describes one piece: batch 1, rows x
     * cols as stored, transpose as for the whole matrix). shard_gram: G = X X^T (m x m).
     * shard_update: Y = (c0 I + c1 G + c2 G G) X, with scratch B (m x m); for n < m as
     * Y = c0 X + G (c1 X + c2 G X) (kernels/ns_shape.h's ns_shard_narrow: no G G). shard_store: O
     * <- X in the piece's stored orientation, rounded to out_dtype. n may be 0. */
    void (*ns_shard_load)(const struct kernel_ctx *ctx, const struct ns_args *a, double inv,
                          float *x);
    void (*ns_shard_gram)(const struct kernel_ctx *ctx, const float *x, int64_t m, int64_t n,
                          float *gram);
    void (*ns_shard_update)(const struct kernel_ctx *ctx, const float *gram, const float c[3],
                            const float *x, int64_t m, int64_t n, float *scratch, float *y);
    void (*ns_shard_store)(const struct kernel_ctx *ctx, const struct ns_args *a, const float *x);
    /* Newton-Schulz teams in bf16 on a device (ns_compute = bf16, runtime/step/ns_sharded.c):
     * the CPU bf16 team's arithmetic (kernels/cpu/ns_bf16.h, ns_bf16_shard_*) on device memory.
     * NULL on a table without it, whose teams iterate in fp32, and on the CPU tables, whose bf16
     * teams run oneDNN's plans from the runtime's workspace directly. X_j, A, B and Y are bf16
     * (uint16_t), every product accumulated in fp32 and rounded once to bf16:
     * shard_bf16_prepare, at commit, for a block's shape and the coefficient table (0, or -1 with
     * the error recorded by status_set); shard_bf16_gram: A = X X^T (m x m); shard_bf16_update:
     * B = c A A + b A (b, c of step s), then Y = B X + a X, for every n >= 1 (no narrow form:
     * kernels/cpu/ns_bf16.c says why); 0, or -1 (recorded). shard_bf16_round: y = bf16(x), to
     * nearest even; shard_bf16_widen: y = fp32(x) (exact); n elements each. */
    int (*ns_shard_bf16_prepare)(const struct kernel_ctx *ctx, int64_t m, int64_t n,
                                 const float (*coeffs)[3], int steps);
    int (*ns_shard_bf16_gram)(const struct kernel_ctx *ctx, const uint16_t *x, int64_t m, int64_t n,
                              uint16_t *A);
    int (*ns_shard_bf16_update)(const struct kernel_ctx *ctx, const float (*coeffs)[3], int steps,
                                int s, const uint16_t *A, const uint16_t *x, int64_t m, int64_t n,
                                uint16_t *B, uint16_t *y);
    void (*ns_shard_bf16_round)(const struct kernel_ctx *ctx, const float *x, uint16_t *y,
                                size_t n);
    void (*ns_shard_bf16_widen)(const struct kernel_ctx *ctx, const uint16_t *x, float *y,
                                size_t n);
    /* Sum of squares of n elements of dtype dt, in double. NaN or Inf in x gives a non-finite
     * result. Deterministic: the same bits for the same input, whatever the thread count. */
    double (*sumsq)(const struct kernel_ctx *ctx, const void *x, int dt, size_t n);
    /* out[i] = sumsq(x[i], dt[i], n[i]) for count tensors, with one wait on a device backend
     * (instead of one per tensor); NULL: call sumsq per tensor. */
    void (*sumsq_many)(const struct kernel_ctx *ctx, const void *const *x, const int *dt,
                       const size_t *n, int count, double *out);
    /* Bytes of Newton-Schulz workspace that hold `batch` rows x cols matrices at once (the CPU
     * works one matrix at a time and ignores batch). */
    size_t (*ns_workspace_bytes)(int64_t rows, int64_t cols, int64_t batch);
};

const struct kernel_ops *kernel_ops_cpu_ref(void);      /* the oracle: plain C */
const struct kernel_ops *kernel_ops_cpu_portable(void); /* portable C + BLAS Newton-Schulz */
const struct kernel_ops *kernel_ops_cpu_avx512(void);   /* NULL when the CPU lacks AVX-512 */
const struct kernel_ops *kernel_ops_cpu_avx2(void);     /* NULL when the CPU lacks AVX2 or FMA */
const struct kernel_ops *kernel_ops_cpu_best(void);     /* avx512, else avx2, else portable */
const struct kernel_ops *kernel_ops_cuda(void);         /* NULL when built without CUDA */

#endif

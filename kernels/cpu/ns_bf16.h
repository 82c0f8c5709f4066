/* Newton-Schulz in bf16 on oneDNN's matmul (ns_compute = bf16): X held in bf16 between
 * products, every product accumulated in fp32 and rounded once to bf16 where the next product
 * consumes it. Per iteration, with A, B and Y in bf16:
 *   A = X X^T;   B = c A A + b A   (one matmul: output scale c, sum post-op b over a copy of A);
 *   Y = B X + a X                  (one matmul: sum post-op a over a copy of X)
 * The symmetric variant computes only the upper block rows of X X^T and of A A (block rows of
 * `block` rows, one matmul each) and mirrors them.
 *
 * oneDNN primitives are created per working shape, variant and coefficient set by
 * ns_bf16_prepare (at commit) and only executed by ns_bf16_run (in the step), which refuses a
 * shape it was not prepared for rather than create one. */
#ifndef KERNELS_CPU_NS_BF16_H
#define KERNELS_CPU_NS_BF16_H

#include <stddef.h>
#include <stdint.h>

#include "../ops.h"
#include "shardopt_status.h"

struct ns_bf16;

/* The oneDNN engine and stream, no shapes yet, in *out. SHARDOPT_ERR_OUT_OF_MEMORY (its state)
 * or SHARDOPT_ERR_INTERNAL (oneDNN's engine), the message recorded by status_set (the caller
 * adds the call and the rank), *out NULL. */
shardopt_status_t ns_bf16_create(struct ns_bf16 **out);
void ns_bf16_destroy(struct ns_bf16 *b);

/* Primitives for a stored rows x cols matrix (worked on as m x n, m <= n), variant
 * NS_VARIANT_PLAIN or NS_VARIANT_SYMMETRIC with `block` rows per block row (ignored for plain),
 * algorithm NS_ALGO_STANDARD or NS_ALGO_GRAM (its m x m products are bf16 too, in the same
 * block rows), and these coefficients (a plan per combination; AOL needs none of its own).
 * Preparing one twice is a no-op. SHARDOPT_OK; SHARDOPT_ERR_UNSUPPORTED when oneDNN has no bf16
 * matmul for this CPU (without AVX-512, say); SHARDOPT_ERR_OUT_OF_MEMORY (naming the bytes where
 * they are ours); SHARDOPT_ERR_INTERNAL (an argument the runtime should never pass, or oneDNN's
 * other failures). The message is recorded by status_set. */
shardopt_status_t ns_bf16_prepare(struct ns_bf16 *b, int64_t rows, int64_t cols, int variant,
                                  int block, int algorithm, const float (*coeffs)[3], int steps);

/* The table's fp32 Newton-Schulz (ns_blas_newton_schulz, ns_ref_newton_schulz), which a bf16
 * result of the standard algorithm that fails the result guard is recomputed with. */
typedef int (*ns_fp32_fn)(const struct kernel_ctx *ctx, const struct ns_args *a,
                          const struct ns_workspace *ws);

/* Newton-Schulz of a (compute bf16) with ws->bf16 prepared for its shape; workspace as for fp32
 * (ns_workspace_floats). A standard result (or Gram's standard recomputation) outside what
 * Newton-Schulz can give (ns_gram_guard_ok) is recomputed by fp32, counted in
 * a->guard_fallbacks (test_ns_guards: polar_express x 7 with aol on a 2 x 7 matrix went to Inf
 * in bf16). Returns 0, or -1 when the shape, variant or coefficients were not prepared, or the
 * workspace is short. */
int ns_bf16_run(const struct kernel_ctx *ctx, const struct ns_args *a,
                const struct ns_workspace *ws, ns_fp32_fn fp32);

/* Newton-Schulz teams (runtime/step/ns_sharded.c) in bf16: a member's block X_j, m x n in the
 * working orientation (n >= 1, also under m), in bf16 with every product whole and accumulated
 * in fp32. Per iteration ns_bf16_shard_gram forms the block's Gram matrix X_j X_j^T (bf16), the
 * runtime sums it over the team, and ns_bf16_shard_update forms Y = a X + (b A + c A A) X (A A
 * and B in bf16 as on the gathered path), for blocks narrower than m too (unlike the fp32
 * kernels: ns_bf16.c says why). The primitives are made by ns_bf16_shard_prepare (at commit) for
 * the shape and coefficients, and found by ns_bf16_shard_find (NULL: none). */
struct ns_bf16_shard;
shardopt_status_t ns_bf16_shard_prepare(struct ns_bf16 *b, int64_t m, int64_t n,
                                        const float (*coeffs)[3], int steps);
const struct ns_bf16_shard *ns_bf16_shard_find(const struct ns_bf16 *b, int64_t m, int64_t n,
                                               const float (*coeffs)[3], int steps);
/* A = X X^T (m x m); 0, or -1 when oneDNN failed. */
int ns_bf16_shard_gram(struct ns_bf16 *b, const struct ns_bf16_shard *p, const uint16_t *x,
                       uint16_t *A);
/* Y = a X + (b A + c A A) X with step s's coefficients, A the team's summed Gram matrix; B
 * (m x m) scratch. 0, or -1. */
int ns_bf16_shard_update(struct ns_bf16 *b, const struct ns_bf16_shard *p, int s, const uint16_t *A,
                         const uint16_t *x, uint16_t *B, uint16_t *y);
/* AOL on bf16 X (m x n) and its Gram matrix A (the whole matrix's, summed): d_i = (sum_j |A_ij| +
 * eps)^(-1/2) in double, X = bf16(d_i xf) from the fp32 values X was rounded from, A_ij =
 * bf16(d_i A_ij d_j) (what the gathered bf16 path does). d: m doubles. */
void ns_bf16_aol(int64_t m, int64_t n, double eps, const float *xf, uint16_t *X, uint16_t *A,
                 double *d);

/* 1 when bf16 Newton-Schulz can be prepared on this CPU (a 16 x 16 plan); else 0 with the reason
 * in why. Where oneDNN has no bf16 matmul (it needs AVX-512: an AVX2-only CPU, valgrind's virtual
 * CPU) the products run as the fp32 sgemm fallback (ns_bf16_plan.h), so this is 1 there too. */
int ns_bf16_available(char *why, size_t len);

/* 1 when oneDNN itself has a bf16 matmul on this CPU (no product of a 16 x 16 plan falls back);
 * else 0 with the reason in why. ns_bench's bf16 limit is oneDNN's matmul rate. */
int ns_bf16_onednn(char *why, size_t len);

/* Products prepared as the fp32 sgemm fallback so far. */
int ns_bf16_fallback_count(const struct ns_bf16 *b);

/* Tests only: on (1), every product prepared from now on takes the fallback, as on a CPU where
 * oneDNN has no bf16 matmul; 0 restores oneDNN. Process-wide, not thread-safe. */
void ns_bf16_fallback_force(int on);

/* Number of primitives made so far (tests check that a step makes none). */
int ns_bf16_primitive_count(const struct ns_bf16 *b);

/* The oneDNN implementation of the first prepared product (e.g. "brg:avx512_core_bf16"). */
const char *ns_bf16_impl(const struct ns_bf16 *b);

/* 1 when the CPU multiplies bf16 natively (AVX512_BF16 or AMX-BF16). */
int ns_bf16_native(void);

#endif

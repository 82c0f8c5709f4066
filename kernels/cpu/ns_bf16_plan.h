/* The bf16 Newton-Schulz plans as ns_bf16_prepare makes them (ns_bf16.c) and ns_bf16_run runs
 * them (ns_bf16_run.c). Private to those two files. */
#ifndef KERNELS_CPU_NS_BF16_PLAN_H
#define KERNELS_CPU_NS_BF16_PLAN_H

#include <oneapi/dnnl/dnnl.h>
#include <stdint.h>

#include "../ns_coeffs.h"

#define BF16_MAX_ROWS 64 /* block rows of a symmetric plan */

/* One matmul and the memory objects of its arguments (data handles set at each call). fb: oneDNN
 * has no implementation on this CPU (its bf16 matmul needs AVX-512; an AVX2-only CPU has none), so
 * ns_bf16_run.c runs it as an fp32 sgemm on the bf16 values, from this geometry (mm_make's). */
struct mm {
    dnnl_primitive_t p;
    dnnl_memory_t src, wei, dst;
    int fb, wei_t;
    int64_t M, K, N, lda, ldb, ldc;
    float oscale, sum;
};

struct plan {
    int64_t m, n;
    int variant, block, nrow;
    int algorithm;
    int steps;
    float coeffs[NS_TABLE_MAX_STEPS][3];
    int uniq[NS_TABLE_MAX_STEPS]; /* step -> the first step with the same triple */
    struct mm gram[BF16_MAX_ROWS];
    struct mm aa[BF16_MAX_ROWS][NS_TABLE_MAX_STEPS]; /* by first step of a triple */
    struct mm bx[NS_TABLE_MAX_STEPS];
    /* Gram algorithm: C = P Q of m x m matrices (block rows as for A A), Y = Q X */
    struct mm pq[BF16_MAX_ROWS];
    struct mm full; /* C = P Q whole (Z Q and Z R) */
    struct mm qx;
};

/* A Newton-Schulz team member's block (runtime/step/ns_sharded.c): X_j, m x n with any n (a
 * block may be narrower than m), every product whole. The Gram matrix is summed over the team
 * between gram and the update. */
struct ns_bf16_shard {
    int64_t m, n;
    int steps;
    float coeffs[NS_TABLE_MAX_STEPS][3];
    int uniq[NS_TABLE_MAX_STEPS];
    struct mm gram;                   /* A = X X^T */
    struct mm aa[NS_TABLE_MAX_STEPS]; /* B = c A A + b B (B a copy of A), every block's width
                                         (ns_bf16.c, ns_bf16_shard_prepare, says why) */
    struct mm bx[NS_TABLE_MAX_STEPS]; /* Y = B X + a Y (Y a copy of X) */
};

struct ns_bf16 {
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    struct plan **plans;
    int nplans, cap;
    struct ns_bf16_shard **shards;
    int nshards, shard_cap;
    int primitives;
    void *scratch; /* user scratchpad: the largest any primitive asks for */
    size_t scratch_bytes;
    dnnl_memory_t scratch_mem;
    char impl[64];
    float *fb_buf;    /* the fallback's fp32 operands and product: the largest M K + K N + M N */
    size_t fb_floats; /* of any fallback product, allocated with the scratchpad */
    size_t fb_have;   /* floats at fb_buf */
    int fallbacks;    /* products made as the fallback */
};

/* The plan prepared for this working shape (m x n), variant, block, algorithm and coefficients;
 * NULL when there is none (ns_bf16_run then refuses rather than make one). */
struct plan *ns_bf16_plan_find(const struct ns_bf16 *b, int64_t m, int64_t n, int variant,
                               int block, int algorithm, const float (*coeffs)[3], int steps);

#endif

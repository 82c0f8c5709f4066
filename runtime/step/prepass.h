/* The step's pre-pass (docs/design.md, The step: 2): per-tensor sums of squares in one small
 * all-reduce, the global gradient norm, non-finite gradients detected on every rank alike before
 * anything is written, and the clipping scale. */
#ifndef RUNTIME_PREPASS_H
#define RUNTIME_PREPASS_H

#include "runtime/runtime.h"

struct prepass_result {
    double norm;      /* global gradient norm, every element counted once */
    float grad_scale; /* folded into the kernels: 1, or max_norm / (norm + 1e-6) when clipping */
    int nonfinite;    /* tensors with NaN/Inf gradients somewhere, or too large (below) */
    int too_large;    /* of which finite, but over PREPASS_GRAD_NORM_MAX in norm once clipped */
};

/* A tensor's gradient norm (after clipping) above this is treated as a non-finite gradient: an
 * element near it would overflow the fp32/bf16 optimizer state (AdamW squares it: |g| > 1.8e19;
 * Muon's momentum sums g / (1 - mu)), and the step would return OK with the weights NaN. Below
 * it no element exceeds 1e18, whose square and every momentum sum fp32 holds. */
#define PREPASS_GRAD_NORM_MAX 1e18

/* rt->sumsq[i] <- the sum of squares, in double, of the rt->pre_n[i] elements of dtype
 * rt->pre_dt[i] at rt->pre_x[i], for every parameter: with one wait on a device backend, or on the
 * host (`host`) for host memory beside a device backend's kernels (an offload host store). */
void prepass_sumsq(shardopt_runtime_t rt, int host);

/* Collective. Fills rt->counters.nonfinite_last with the offending names. */
shardopt_status_t prepass_run(shardopt_runtime_t rt, double max_grad_norm,
                              struct prepass_result *r);

#endif

/* The step's pre-pass (docs/design.md, The step: 2): per-tensor sums of squares in one small
 * all-reduce, the global gradient norm, non-finite gradients detected on every rank alike before
 * anything is written, and the clipping scale. */
#ifndef RUNTIME_PREPASS_H
#define RUNTIME_PREPASS_H

#include "runtime/runtime.h"

struct prepass_result {
    double norm;      /* global gradient norm, every element counted once */
    float grad_scale; /* folded into the kernels: 1, or max_norm / (norm + 1e-6) when clipping */
    int nonfinite;    /* tensors with NaN/Inf gradients somewhere */
};

/* rt->sumsq[i] <- the sum of squares, in double, of the rt->pre_n[i] elements of dtype
 * rt->pre_dt[i] at rt->pre_x[i], for every parameter: with one wait on a device backend, or on the
 * host (`host`) for host memory beside a device backend's kernels (an offload host store). */
void prepass_sumsq(shardopt_runtime_t rt, int host);

/* Collective. Fills rt->counters.nonfinite_last with the offending names. */
shardopt_status_t prepass_run(shardopt_runtime_t rt, double max_grad_norm,
                              struct prepass_result *r);

#endif

/* The runtime's internal state: what init, register, commit and step share. */
#ifndef RUNTIME_RUNTIME_H
#define RUNTIME_RUNTIME_H

#include "groups.h"
#include "kernels/ns_coeffs.h"
#include "kernels/ops.h"
#include "offload/state_store.h"
#include "sharding/layout.h"
#include "shardopt.h"

struct shardopt_param {
    struct shardopt_runtime *rt;
    char *name;
    uint64_t name_hash; /* keys stochastic rounding: stable across runs and layouts */
    int index;          /* registration order */
    struct layout layout;
    shardopt_dtype_t param_dtype, grad_dtype;
    int transposed;
    shardopt_placement_t placement;
    void *data;
    const void *grad;
    shardopt_algo_t algo; /* resolved: MUON or ADAMW */
    double lr_mult, wd_mult;

    /* Muon */
    struct matrix_view mv;
    int ns_variant;
    double lr_scale; /* per-matrix multiplier of lr from the true shape */
    size_t off_momentum;

    /* AdamW */
    size_t off_exp_avg, off_exp_avg_sq;

    uint64_t step; /* steps this parameter has taken (AdamW bias correction, rounding key) */
};

/* What the step measures; stats.c derives the rest of shardopt_stats_t from the params. */
struct step_counters {
    uint64_t steps;
    double ns_flops_last;
    double seconds_last, seconds_total;
    double seconds_adamw_last, seconds_momentum_last, seconds_ns_last, seconds_apply_last;
};

struct shardopt_runtime {
    shardopt_config_t cfg;
    struct groups groups; /* our own communicators: our traffic never matches the trainer's */
    const struct kernel_ops *ops;
    struct kernel_ctx kctx;
    float ns_coeffs[NS_TABLE_MAX_STEPS][3];
    float ns_norm_scale;

    struct shardopt_param **params;
    int nparams, params_cap;
    int committed;

    struct state_store store;
    void *u_buf, *o_buf; /* Newton-Schulz input and output, comm dtype, largest Muon param */
    struct ns_workspace ns_ws;
    size_t bytes_workspace;

    struct step_counters counters;
};

#endif

/* Every rank of a step must pass the same scalar arguments and hold the same step counts: one
 * rank with another lr (a scheduler stepped twice there) or another momentum would update its
 * shards differently and the replicas would drift apart without a word. The check rides on the
 * step's status agreement (a 64-bit digest and its complement in the same all-reduce); only when
 * the digests differ does a slow path find the argument, the ranks and their values. */
#ifndef RUNTIME_STEP_ARGS_AGREE_H
#define RUNTIME_STEP_ARGS_AGREE_H

#include "runtime/runtime.h"

/* The step's scalars as they take effect (a negative adamw_lr resolved to lr, and so on), so
 * that two spellings of one step (adamw_lr -1 and adamw_lr = lr) agree. */
enum args_agree_slot {
    ARGS_AGREE_LR,
    ARGS_AGREE_ADAMW_LR,
    ARGS_AGREE_MUON_WD,
    ARGS_AGREE_ADAMW_WD,
    ARGS_AGREE_MOMENTUM,
    ARGS_AGREE_ADAMW_BETA1,
    ARGS_AGREE_ADAMW_BETA2,
    ARGS_AGREE_ADAMW_EPS,
    ARGS_AGREE_MAX_GRAD_NORM,
    ARGS_AGREE_SKIP_MISSING,
    ARGS_AGREE_STEPS, /* the runtime's step counter (stats.steps) */
    ARGS_AGREE_N
};

/* The digest of vals and of every parameter's step count (local, O(parameters)). */
uint64_t args_agree_digest(shardopt_runtime_t rt, const double vals[ARGS_AGREE_N]);

/* Collective, after the digests differed: SHARDOPT_ERR_MISMATCH on every rank, the same text,
 * naming the first argument (or parameter step count) that differs, the ranks holding its
 * smallest and largest value and both values. Allocates nothing. */
shardopt_status_t args_agree_find(shardopt_runtime_t rt, const double vals[ARGS_AGREE_N]);

/* Local: args' version is one this library knows and its size holds that version's fields (a
 * shorter struct had the fields past its size read as the config's); ERR_INVALID_ARGUMENT naming
 * both otherwise. */
shardopt_status_t args_agree_struct_check(const shardopt_step_args_t *args);

#endif

/* check_state_every: before a step's update, every parameter shard and the optimizer state it
 * owns must be finite; otherwise the step fails on every rank with SHARDOPT_ERR_NONFINITE naming
 * the tensors, the kind of array and the lowest rank that holds such a value, and nothing is
 * written. A corrupted weight (a trainer bug, a bad load, a bit flip) is found where it is,
 * before Newton-Schulz spreads a NaN in one momentum element over a whole matrix. */
#ifndef RUNTIME_STATE_CHECK_H
#define RUNTIME_STATE_CHECK_H

#include "runtime/runtime.h"

/* Collective over the runtime's groups. Uses the pre-pass's per-parameter buffers (the pre-pass
 * runs after it and overwrites them), so it allocates nothing. */
shardopt_status_t state_check(shardopt_runtime_t rt);

#endif

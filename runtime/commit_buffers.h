/* commit's allocations (runtime/commit_buffers.c): called by shardopt_commit after the plans
 * are made, in this order; each returns the same status on every rank. commit_release
 * (runtime.h) frees what they made. */
#ifndef RUNTIME_COMMIT_BUFFERS_H
#define RUNTIME_COMMIT_BUFFERS_H

#include "runtime/runtime.h"

/* Exchange buffers (and their pinned mirrors on a device backend), Newton-Schulz workspace,
 * the sharded-NS buffers. */
shardopt_status_t commit_buffers_alloc(shardopt_runtime_t rt);

/* ns_compute = bf16: every oneDNN primitive the step will run, made now. */
shardopt_status_t commit_ns_bf16_plans(shardopt_runtime_t rt);

/* param_stats = 1: room for every local shard as it was before the update. */
shardopt_status_t commit_param_stats_alloc(shardopt_runtime_t rt);

#endif

/* Sharded Newton-Schulz (ns_strategy sharded/auto): every holder keeps its columns of the working
 * matrix; the squared norm and, per iteration, the m x m Gram matrix are all-reduced over the
 * group. Output agrees with gather mode to fp32 rounding (the sums run in another order). */
#ifndef RUNTIME_NS_SHARDED_H
#define RUNTIME_NS_SHARDED_H

#include "runtime/step/muon_exec.h"

/* Collective over the dense and expert shard groups: every member takes part in every matrix,
 * with or without columns of it. */
shardopt_status_t ns_sharded_run(shardopt_runtime_t rt, const struct muon_scalars *s);

#endif

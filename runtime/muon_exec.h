/* Runs one group's exchange plan for the Muon tensors: per bucket, momentum and pack into the
 * send buffer, exchange #1, unpack into whole matrices, Newton-Schulz on the matrices this rank
 * owns, pack, exchange #2, apply on the local shards. */
#ifndef RUNTIME_MUON_EXEC_H
#define RUNTIME_MUON_EXEC_H

#include "runtime.h"

struct muon_scalars {
    double lr, wd;    /* before per-parameter multipliers */
    float grad_scale; /* clipping, from the pre-pass */
};

/* Collective over the group's communicator. */
shardopt_status_t muon_group_run(shardopt_runtime_t rt, enum group_kind kind,
                                 const struct muon_scalars *s);

#endif

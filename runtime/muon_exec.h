/* Runs the exchange plans of the Muon tensors as one pipeline over the buckets of all groups
 * (replicated tensors, dense shard group, expert shard group): while bucket k is in
 * Newton-Schulz, bucket k+1 is in exchange #1 and bucket k-1 in exchange #2. Per bucket:
 * momentum and pack into buffer A, exchange #1 (A -> B), unpack into whole matrices,
 * Newton-Schulz on the matrices this rank owns, pack, exchange #2 (B -> A), apply. */
#ifndef RUNTIME_MUON_EXEC_H
#define RUNTIME_MUON_EXEC_H

#include "runtime.h"

struct muon_scalars {
    double lr, wd;    /* before per-parameter multipliers */
    float grad_scale; /* clipping, from the pre-pass */
};

/* Collective over the groups' communicators. */
shardopt_status_t muon_run(shardopt_runtime_t rt, const struct muon_scalars *s);

#endif

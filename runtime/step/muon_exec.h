/* Runs the exchange plans of the Muon tensors as one pipeline over the buckets of all groups
 * (replicated tensors, dense shard group, expert shard group): while bucket k is in
 * Newton-Schulz, bucket k+1 is in exchange #1 and bucket k-1 in exchange #2. Per bucket:
 * momentum and pack into buffer A, exchange #1 (A -> B), unpack into whole matrices,
 * Newton-Schulz on the matrices this rank owns, pack, exchange #2 (B -> A), apply. */
#ifndef RUNTIME_MUON_EXEC_H
#define RUNTIME_MUON_EXEC_H

#include "runtime/runtime.h"

struct muon_scalars {
    double lr, wd;    /* before per-parameter multipliers */
    float grad_scale; /* clipping, from the pre-pass */
};

/* Momentum and pack of local elements [off, off + n) of a Muon tensor into out (comm dtype). */
void muon_momentum_range(shardopt_runtime_t rt, struct shardopt_param *p, size_t off, size_t n,
                         void *out, float grad_scale);

/* Apply O (comm dtype) to local elements [off, off + n): W <- W (1 - lr wd) - lr scale O. */
void muon_apply_range(shardopt_runtime_t rt, const struct shardopt_param *p, size_t off, size_t n,
                      const void *update, const struct muon_scalars *s);

/* Collective over the groups' communicators. */
shardopt_status_t muon_run(shardopt_runtime_t rt, const struct muon_scalars *s);

#endif

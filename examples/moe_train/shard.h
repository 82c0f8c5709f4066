/* What a trainer does around shardopt_step, FSDP-style: each rank computes gradients of the full
 * parameters on its own tokens, the gradients are reduce-scattered into the runtime's layout
 * (the slice each rank holds, docs/layouts.md), the step updates the slices, and an all-gather
 * rebuilds the full parameters on every rank. */
#ifndef SHARDOPT_EXAMPLE_MOE_SHARD_H
#define SHARDOPT_EXAMPLE_MOE_SHARD_H

#include <mpi.h>

#include "model.h"
#include "shardopt.h"

struct moe_shards {
    MPI_Comm dense, replicate; /* this replica's dp_shard x cp ranks; ranks holding my slices */
    int dense_size, dense_rank, dp_replicate;
    /* per dense rank r and tensor i: the flat element range [lo, lo + len) of the full tensor
     * that r holds (replicated tensors: none, they are all-reduced whole) */
    int64_t (*lo)[MOE_NPARAMS], (*len)[MOE_NPARAMS];
    int *counts, *displs; /* per dense rank: elements of all its slices, and their offsets */
    float *w[MOE_NPARAMS], *g[MOE_NPARAMS]; /* my slices (replicated: the whole tensor) */
    float *pack, *mine;                     /* [sum of counts], [my count] */
    shardopt_param_t h[MOE_NPARAMS];
};

/* Registers every tensor of m with rt (which must be initialised, not committed) as the slice
 * this rank holds, and builds the communicators. Collective over the runtime's ranks. */
shardopt_status_t moe_shards_register(shardopt_runtime_t rt, const struct moe_model *m,
                                      struct moe_shards *s);

/* Full gradients (m's, this rank's tokens) -> my slices' gradients, summed over all ranks. */
void moe_shards_reduce_scatter(struct moe_shards *s, const struct moe_model *m);

/* My updated slices -> m's full parameters on every rank. */
void moe_shards_all_gather(struct moe_shards *s, struct moe_model *m);

void moe_shards_free(struct moe_shards *s);

#endif

/* Collective checks at commit: every rank registered the same parameters with the same fields,
 * and the shards of each parameter tile its extent over its group. The shard tables are kept:
 * the planner needs every member's part. A parameter whose every member registered the
 * torch.chunk piece of its index is agreed so in one all-reduce of a flag per parameter and
 * computed from the layout from then on; only the others are gathered (sharding/shard_table.h). */
#ifndef RUNTIME_COMMIT_CHECK_H
#define RUNTIME_COMMIT_CHECK_H

#include "runtime/runtime.h"
#include "sharding/shard_table.h"

/* Returns SHARDOPT_OK on every rank, or the same error on every rank: SHARDOPT_ERR_MISMATCH
 * with a message naming the parameter, the field and the ranks, or SHARDOPT_ERR_OUT_OF_MEMORY
 * with the bytes a rank could not allocate. On success `dense` and `xs`
 * describe the slices of the dense and the expert shard group, with each member's global rank
 * (ranks); on failure they hold nothing. */
shardopt_status_t commit_check(shardopt_runtime_t rt, struct shard_table *dense,
                               struct shard_table *xs);

/* rc, this rank's code from an MPI call that commit makes on every rank, agreed over the groups:
 * SHARDOPT_OK where every rank's call succeeded, else SHARDOPT_ERR_COMM on every rank, each rank
 * whose call failed saying "commit: rank R: <what> failed (MPI error rc)", what formatted from
 * fmt. One place for the message and the agreement, so that no such failure leaves a rank
 * going on to collectives the others skip. Collective. */
shardopt_status_t commit_mpi_agree(shardopt_runtime_t rt, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif

/* Collective checks at commit: every rank registered the same parameters with the same fields,
 * and the shards of each parameter tile its extent over its group. The gathered slices are kept:
 * the planner needs every member's part. */
#ifndef RUNTIME_COMMIT_CHECK_H
#define RUNTIME_COMMIT_CHECK_H

#include "runtime/runtime.h"
#include "sharding/plan.h"

struct shard_table {
    int members;
    /* [members][nparams]: each member's part of each parameter along its shard dim; the rest of
     * its box is the parameter's window, the same on every member (sharding/layout.c), so 16 B
     * per member and parameter are gathered instead of a whole box's 48 (issue 22) */
    struct plan_slice *slices;
    int *ranks;    /* [members]: global rank of each member, for messages */
    double *xload; /* [members] or NULL: each member's NS load in the other group */
};

/* Returns SHARDOPT_OK on every rank, or the same error on every rank: SHARDOPT_ERR_MISMATCH
 * with a message naming the parameter, the field and the ranks, or SHARDOPT_ERR_OUT_OF_MEMORY
 * with the bytes a rank could not allocate. On success `dense` and `xs`
 * hold the slices gathered over the dense and the expert shard group. */
shardopt_status_t commit_check(shardopt_runtime_t rt, struct shard_table *dense,
                               struct shard_table *xs);

void commit_shard_table_free(struct shard_table *t);

#endif

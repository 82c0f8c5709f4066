/* Collective checks at commit: every rank registered the same parameters with the same fields,
 * and the shards of each parameter tile its extent over its group. The gathered boxes are kept:
 * the planner needs every member's part. */
#ifndef RUNTIME_COMMIT_CHECK_H
#define RUNTIME_COMMIT_CHECK_H

#include "runtime/runtime.h"
#include "sharding/plan.h"

struct shard_table {
    int members;
    struct plan_box *boxes; /* [members][nparams] */
    int *ranks;             /* [members]: global rank of each member, for messages */
    double *xload;          /* [members] or NULL: each member's NS load in the other group */
};

/* Returns SHARDOPT_OK on every rank, or the same error on every rank: SHARDOPT_ERR_MISMATCH
 * with a message naming the parameter, the field and the ranks, or SHARDOPT_ERR_OUT_OF_MEMORY
 * with the bytes a rank could not allocate. On success `dense` and `xs`
 * hold the boxes gathered over the dense and the expert shard group. */
shardopt_status_t commit_check(shardopt_runtime_t rt, struct shard_table *dense,
                               struct shard_table *xs);

void commit_shard_table_free(struct shard_table *t);

#endif

/* The union plan at commit (runtime/commit_union.c): LPT over the union of the dense group's and
 * every expert shard group's Muon matrices, kept instead of the joint plan where it finishes
 * first in the cost model. */
#ifndef RUNTIME_COMMIT_UNION_H
#define RUNTIME_COMMIT_UNION_H

#include "runtime/runtime.h"
#include "sharding/plan.h"
#include "sharding/shard_table.h"

/* commit.c's: the plan of one group kind into gx (its exchange for the owners the planner
 * chooses, or joint->fixed_owner's), joint NULL or the joint settings. Collective over the
 * runtime's groups (failures agreed); on failure gx->plan holds nothing to free. */
shardopt_status_t commit_group_plan(shardopt_runtime_t rt, enum group_kind kind,
                                    const struct shard_table *t, const struct plan_cfg *joint,
                                    struct group_exec *gx);

/* commit.c's: this member's `mine` all-gathered over comm (of `members`) into *out (allocated;
 * NULL on failure), a rank out of memory or a failed all-gather agreed over the groups. `loads`
 * and `group` name them in the messages ("expert loads of the dense group"). Collective. */
shardopt_status_t commit_loads_gather(shardopt_runtime_t rt, double mine, MPI_Comm comm,
                                      int members, double **out, const char *loads,
                                      const char *group);

/* The planner's cost of one exchange element sent one way (commit.c's moves_elem_cost). */
double commit_elem_cost(shardopt_runtime_t rt);

/* Once the joint plan stands (every pass of it, before the teams' communicators): the matrices
 * it gives one owner placed again by LPT over the union of both groups, on top of the team blocks
 * it keeps (no teams, the default: LPT over the union of every matrix), computed alike on every
 * rank of the dense group from the matrix costs each expert shard group gathers to it; both groups
 * planned for those owners; their plans replace the joint ones where the union's model finish,
 * the later of the busiest dense member's Newton-Schulz load (the teams' all-reduces included)
 * and commit_elem_cost x (the busiest dense-exchange sender's elements + the busiest
 * expert-exchange sender's), is earlier than the joint plan's. So the plan commit keeps never
 * finishes later in that model than that LPT over the union. rt->union_off (tests) skips it.
 * Collective. */
shardopt_status_t commit_union_plan(shardopt_runtime_t rt, const struct shard_table *dense,
                                    const struct shard_table *xs);

#endif

/* Newton-Schulz teams at commit (runtime/commit_teams.c): the node size the planner places
 * teams in, and one communicator per distinct team. */
#ifndef RUNTIME_COMMIT_TEAMS_H
#define RUNTIME_COMMIT_TEAMS_H

#include "runtime/runtime.h"

/* The fewest members of comm (the dense or an expert shard group) that share a node with one
 * another (MPI_COMM_TYPE_SHARED), the same on every rank of every replica: plan_cfg.node_members.
 * Collective over comm and the replicate group; an MPI code. */
int commit_teams_node_members(shardopt_runtime_t rt, MPI_Comm comm, int *out);

/* gx->plan's team sets and this rank's communicators for them (MPI_Comm_create_group over
 * gx->comm, in one order on every member), and, where the group (kind) exchanges over NCCL, an NCCL
 * communicator per set bootstrapped over the set's MPI one (nccl_group_create). group names it in
 * messages. Collective over the runtime's groups (failures agreed); on failure nothing is left to
 * free. */
shardopt_status_t commit_teams_create(shardopt_runtime_t rt, struct group_exec *gx,
                                      enum group_kind kind, const char *group);

/* Free what commit_teams_create made (called by commit_release too). */
void commit_teams_free(struct group_exec *gx);

#endif

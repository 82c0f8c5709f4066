/* Sharded Newton-Schulz (ns_strategy sharded/auto): every holder keeps its columns of the working
 * matrix; the squared norm and, per iteration, the m x m Gram matrix are all-reduced over the
 * group. Output agrees with gather mode to fp32 rounding (the sums run in another order). */
#ifndef RUNTIME_NS_SHARDED_H
#define RUNTIME_NS_SHARDED_H

#include "runtime/step/muon_exec.h"

/* Collective over the dense and expert shard groups: every member takes part in every matrix,
 * with or without columns of it. `status`: muon_run's (not OK: no matrix runs). A matrix that
 * fails on a member fails on its whole group (the all-reduces carry the flag) and is not applied;
 * the later matrices still run, and wherever a Muon parameter is registered the status (muon_run's,
 * or a team's, matrix's or gathered owner's failure, rt->ns_failed) is agreed over the world. */
shardopt_status_t ns_sharded_run(shardopt_runtime_t rt, const struct muon_scalars *s,
                                 shardopt_status_t status);

/* A Newton-Schulz team's block (issue 22): the team's members hold blocks of one matrix's long
 * side, this rank's U at u (comm dtype, rows x cols as stored; on_rows: the blocks are ranges of
 * stored rows, so the working matrix is the transpose), and run the same iterations over the
 * team's communicator; O replaces U at u. Collective over comm. nccl: the team's NCCL
 * communicator (commit_teams.c; NULL: none), which carries the Gram all-reduces of blocks
 * iterating on a device. Failed: a zero update at u. With rt->team_poisoned (this rank's team
 * NCCL all-reduce failed earlier in the step) it only joins the norm all-reduce with the failure
 * flag, where every member returns ERR_INTERNAL. */
shardopt_status_t ns_sharded_block(shardopt_runtime_t rt, const struct shardopt_param *p,
                                   MPI_Comm comm, struct nccl_group *nccl, void *u, int64_t rows,
                                   int64_t cols, int on_rows);

/* ns_compute = bf16 teams: rt->ns_bf16_sum, the MPI_Op that sums bf16 Gram matrices (made once;
 * SHARDOPT_ERR_COMM naming the call when MPI refuses), and its release (commit_release). */
shardopt_status_t ns_sharded_bf16_op(shardopt_runtime_t rt);
void ns_sharded_bf16_op_free(shardopt_runtime_t rt);

#endif

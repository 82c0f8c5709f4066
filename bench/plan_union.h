/* shardopt-plan's baseline for the joint plan (plan_union.c): LPT over the union of both groups'
 * Muon matrices, against which --json measures the default plan's busiest Newton-Schulz load. */
#ifndef BENCH_PLAN_UNION_H
#define BENCH_PLAN_UNION_H

#include "bench/plan_model.h"
#include "bench/preset.h"

/* LPT over the union for the layout r describes (r->dense ranks, r->ep expert shard groups, rank d
 * in group d % ep): every Muon matrix of p, a dense one eligible on every rank, an expert one of EP
 * rank e on the ranks of group e, one owner each (no teams, no moves, no holder kept), all sorted
 * together by the planner's cost (sharding/plan.c: 4m^2n + 2m^3, or Gram's FLOPs per iteration),
 * heaviest first, ties in the union's order (the dense group's matrices, then EP rank 0's
 * experts, EP rank 1's, ..., as runtime/commit_union.c lists them), each to the eligible rank with
 * the least load so far (ties the lowest rank): sharding/plan_union.h's plan_union_owners, the U
 * commit considers. *max and *mean: the busiest rank's and the mean load, in the planner's cost
 * units (NS FLOPs per iteration, products whole). Returns 0, -1 when out of memory. */
int plan_union_lpt(const struct opts *o, const struct preset *p, const struct prediction *r,
                   double *max, double *mean);

/* --json's union fields for layout r, each after ", ": "union_lpt_ns_max" and "union_lpt_ns_mean"
 * (the busiest rank's and the mean NS FLOPs per step, products whole: ns_flops_max and _mean's
 * measure for --ns-compute device), "union_lpt_max_mean", "union_lpt_t_ns" (the busiest rank's
 * t_ns at the machine's NS rate) and "t_ns_over_union_lpt" (r's t_ns over it); nothing under
 * --ns-strategy sharded or auto (the union has no sharded matrices). Exits 2 when out of
 * memory. */
void plan_union_json(const struct opts *o, const struct preset *p, const struct machine *mc,
                     const struct prediction *r);

#endif

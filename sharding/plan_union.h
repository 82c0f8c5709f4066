/* LPT over the union of the dense group's and every expert shard group's Muon matrices: the
 * baseline the joint plan is held to (runtime/commit_union.c keeps whichever of the two finishes
 * first in the cost model; shardopt-plan does the same and its --json measures both). Pure
 * arithmetic, no MPI. */
#ifndef SHARDING_PLAN_UNION_H
#define SHARDING_PLAN_UNION_H

#include <stdint.h>

/* n matrices in the union's order (the dense group's in its matrix order, then EP rank 0's expert
 * matrices in their group's matrix order, EP rank 1's, ...), cost[m] in the planner's units
 * (group_plan.cost; < 0: not placed here, owner[m] = -1: a matrix the joint plan gave a team),
 * group[m] -1 for a dense matrix (every member of the dense group may own it) or e for EP rank
 * e's (the members d with member_group[d] == e: its expert shard group; NULL member_group:
 * d % ngroups, the mesh's order). Heaviest first (ties in the union's order), each to the
 * eligible member with the least load so far (ties the lowest member), every member starting
 * from base[d] (NULL: 0; the team blocks it keeps): owner[m], the dense member, and
 * load[members], base plus the costs placed. Returns 0; -1 when out of memory, or a group out of
 * [0, ngroups) or with no member (owner and load then unspecified). */
int plan_union_owners(const double *cost, const int *group, int64_t n, int members,
                      const int *member_group, int ngroups, const double *base, int *owner,
                      double *load);

struct group_plan;

/* The union's costs of one group plan's matrices (the joint plan of the dense group, or of one
 * expert shard group), into cost[0, g->nmatrices) in its matrix order: each one's
 * group_plan.cost, or -1 where the plan gave it a Newton-Schulz team (it keeps that team: not
 * placed). The rule every list of the union takes its costs by: commit's
 * (runtime/commit_union.c) and shardopt-plan's and plan-world-sim's (bench/), which must list
 * what commit lists. */
void plan_union_costs(const struct group_plan *g, double *cost);

#endif

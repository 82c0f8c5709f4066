/* The union plan at commit (commit_union.h). The joint plan places each expert shard group's
 * matrices first and the dense group's on top of each member's expert load; where the many small
 * expert matrices spread evenly before the big dense ones arrive, that is up to 1.65x busier than
 * LPT over the union of both groups (experts along rows, docs/scaling.md), within Graham's bound
 * only. Every rank of the dense group can compute the union: the dense matrices' costs are its
 * own plan's, each expert shard group's are gathered from one member of it. The matrices the
 * joint plan gives one owner are placed again by it, around the Newton-Schulz teams the joint
 * plan formed (which stay as they are: the team knobs' placements, and a matrix too heavy for one
 * rank, are the joint plan's to make); both groups are planned for those owners and kept where
 * the cost model says they finish first, so the kept plan is at least as good as that LPT over the
 * union in the model, and the joint plan (moves, holders keeping whole matrices) stays where it is
 * better. Owners change who computes, never what: one owner per matrix gives the same bits
 * wherever it is. */
#include "runtime/commit_union.h"

#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/mem.h"
#include "kernels/dtype.h"
#include "runtime/comm/comm_wait.h"
#include "runtime/commit_check.h"
#include "sharding/plan_union.h"

/* What commit_union_plan gathers and builds; freed by scratch_free. */
struct scratch {
    int *info;    /* [3 x members]: each dense member's EP rank, expert shard rank, matrices */
    int *counts;  /* [2 x members]: the all-gather's counts, then its displacements */
    int *first;   /* [groups + 1]: each expert group's first matrix in the union's order */
    double *cost; /* [n]: the union's matrices, dense first, then EP rank 0's, 1's, ... */
    int *group;   /* [n] */
    int *owner;   /* [n]: the union's owner, a dense member */
    int *xowner;  /* [this group's expert matrices]: the owner's expert shard rank */
    double *load; /* [members] */
    double *base; /* [members] or NULL (no teams): each member's team blocks in both groups */
    struct group_exec dense, expert; /* the union's plans */
};

static void scratch_free(struct scratch *s)
{
    free(s->info);
    free(s->counts);
    free(s->first);
    free(s->cost);
    free(s->group);
    free(s->owner);
    free(s->xowner);
    free(s->load);
    free(s->base);
    plan_free(&s->dense.plan);
    plan_free(&s->expert.plan);
}

/* The expert shard groups as the dense group's members report them: groups 0 .. *ngroups - 1 by
 * EP rank, each with its ranks 0 .. size - 1 once and one count of matrices, first[] the union's
 * offsets. 0, or -1 where they are not so (a trainer's groups the mesh does not describe): then
 * the joint plan stands. Alike on every rank: the same gathered numbers. */
static int groups_read(struct scratch *s, int members, int nd, int *ngroups, int64_t *n)
{
    int ng = 0;
    for (int d = 0; d < members; d++) {
        if (s->info[3 * d] < 0 || s->info[3 * d] >= members)
            return -1;
        ng = s->info[3 * d] + 1 > ng ? s->info[3 * d] + 1 : ng;
    }
    if (members % ng != 0)
        return -1;
    s->first = mem_calloc((size_t)ng + 1, sizeof(int));
    int *seen = mem_calloc((size_t)members, sizeof(int)); /* [e * size + xs rank] */
    if (s->first == NULL || seen == NULL) {
        free(seen);
        return -2;
    }
    const int size = members / ng;
    int64_t total = nd;
    int rc = 0;
    for (int d = 0; rc == 0 && d < members; d++) {
        const int e = s->info[3 * d], j = s->info[3 * d + 1], nx = s->info[3 * d + 2];
        rc = j < 0 || j >= size || seen[e * size + j]++ != 0 || nx < 0 ? -1 : 0;
        if (rc == 0 && j == 0)
            s->first[e + 1] = nx;
    }
    for (int d = 0; rc == 0 && d < members; d++) /* every member of a group counts alike */
        rc = s->info[3 * d + 2] != s->first[s->info[3 * d] + 1] ? -1 : 0;
    for (int e = 0; rc == 0 && e < ng; e++) {
        const int64_t at = total;
        total += s->first[e + 1];
        s->first[e] = (int)at;
        rc = total > 0x7fffffff ? -1 : 0; /* the all-gather's displacements are ints */
    }
    free(seen);
    if (rc == 0)
        s->first[ng] = (int)total;
    *ngroups = ng;
    *n = total;
    return rc;
}

/* This member's Newton-Schulz load (the teams' all-reduces included) and the exchange elements
 * it sends in the dense group and in its expert shard group under the plans d and x, all-reduced
 * (MAX) over the dense group into out[0..2]: the busiest member's work, the busiest dense and the
 * busiest expert sender's elements. The plan's exchange is out[1] + out[2], the two groups'
 * busiest senders summed, as shardopt-plan's step counts it (t_comm = busiest dense + busiest
 * expert bytes over one link rate): with each member's own sum instead, the rule kept a union
 * plan whose step that model predicts later (Qwen3-30B-A3B along rows, 1,024 GPUs, ep 1: 3.095
 * to 3.221 ms). Collective: an MPI code. */
static int busiest(shardopt_runtime_t rt, const struct group_plan *d, const struct group_plan *x,
                   double out[3])
{
    const double es = (double)kdtype_size(rt->cfg.comm_dtype);
    out[0] = d->load[d->me] + d->team_comm[d->me] + x->load[x->me] + x->team_comm[x->me];
    out[1] = (double)d->bytes_sent / es;
    out[2] = (double)x->bytes_sent / es;
    return comm_allreduce(&rt->groups, rt->groups.dense, MPI_IN_PLACE, out, 3, MPI_DOUBLE, MPI_MAX,
                          "all-reduce of the joint and union plans' busiest members");
}

static double max2(double a, double b) { return a > b ? a : b; }

/* s->base: each dense member's team blocks, its expert shard group's (all-gathered over the
 * dense group) and the dense plan's (alike everywhere). Collective. */
static shardopt_status_t team_loads(shardopt_runtime_t rt, struct scratch *s,
                                    const struct group_plan *jd, const struct group_plan *jx)
{
    const shardopt_status_t status = commit_loads_gather(
        rt, jx->team_load[jx->me], rt->groups.dense, jd->members, &s->base, "expert team", "dense");
    for (int d = 0; status == SHARDOPT_OK && d < jd->members; d++)
        s->base[d] += jd->team_load[d];
    return status;
}

shardopt_status_t commit_union_plan(shardopt_runtime_t rt, const struct shard_table *dense,
                                    const struct shard_table *xs)
{
    if (rt->union_off)
        return SHARDOPT_OK;
    const struct groups *g = &rt->groups;
    const int members = dense->members, me = g->me.rank;
    struct group_plan *jd = &rt->gx[GROUP_DENSE].plan, *jx = &rt->gx[GROUP_EXPERT].plan;
    const int nd = jd->nmatrices, nx = jx->nmatrices;
    struct scratch s = {0};
    int mine[3] = {0, 0, nx}, ngroups = 0, rc;
    int64_t n = 0;
    shardopt_status_t status = SHARDOPT_OK;

    MPI_Comm_rank(g->ep, &mine[0]);
    MPI_Comm_rank(g->xs, &mine[1]);
    s.info = mem_malloc(sizeof(int) * 3 * (size_t)members);
    s.counts = mem_malloc(sizeof(int) * 2 * (size_t)members);
    if (s.info == NULL || s.counts == NULL)
        status =
            log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                     "commit: rank %d: out of memory allocating %zu bytes for the union plan's "
                     "expert shard groups",
                     me, sizeof(int) * 5 * (size_t)members);
    status = groups_agree(g, status, "commit");
    if (status == SHARDOPT_OK) {
        rc = comm_allgather(g, g->dense, mine, 3, MPI_INT, s.info,
                            "all-gather of the expert shard groups for the union plan");
        status =
            commit_mpi_agree(rt, rc, "all-gather of the expert shard groups for the union plan");
    }
    if (status != SHARDOPT_OK) {
        scratch_free(&s);
        return status;
    }
    rc = groups_read(&s, members, nd, &ngroups, &n);
    const size_t nn = (size_t)(n > 0 ? n : 1);
    if (rc == 0) {
        s.cost = mem_malloc(sizeof(double) * nn);
        s.group = mem_malloc(sizeof(int) * nn);
        s.owner = mem_malloc(sizeof(int) * nn);
        s.xowner = mem_malloc(sizeof(int) * (size_t)(nx > 0 ? nx : 1));
        s.load = mem_malloc(sizeof(double) * (size_t)members);
    }
    if (rc == -2 || (rc == 0 && (s.cost == NULL || s.group == NULL || s.owner == NULL ||
                                 s.xowner == NULL || s.load == NULL)))
        status = log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                          "commit: rank %d: out of memory allocating %zu bytes for the union plan "
                          "of %lld matrices",
                          me, (2 * sizeof(double) + 2 * sizeof(int)) * nn, (long long)n);
    /* agreed before the groups' verdict is read: a rank out of memory never reached it */
    status = groups_agree(g, status, "commit");
    if (status != SHARDOPT_OK || rc == -1) { /* -1 alike everywhere: the joint plan stands */
        if (status == SHARDOPT_OK && me == 0)
            log_info("commit: the expert shard groups are not the mesh's (EP ranks and expert "
                     "shard ranks of the dense group): the joint plan is kept without comparing it "
                     "with LPT over the union");
        scratch_free(&s);
        return status;
    }
    /* the costs: the dense group's (alike on every member), then each expert shard group's from
     * its rank 0, in place at the group's offset */
    plan_union_costs(jd, s.cost); /* a matrix the joint plan gave a team keeps it: not placed */
    for (int m = 0; m < nd; m++)
        s.group[m] = -1;
    for (int e = 0; e < ngroups; e++)
        for (int m = s.first[e]; m < s.first[e + 1]; m++)
            s.group[m] = e;
    int *counts = s.counts, *displs = s.counts + members;
    for (int d = 0; d < members; d++) {
        const int lead = s.info[3 * d + 1] == 0;
        counts[d] = lead ? s.info[3 * d + 2] : 0;
        displs[d] = lead ? s.first[s.info[3 * d]] : 0;
    }
    if (mine[1] == 0)
        plan_union_costs(jx, s.cost + s.first[mine[0]]);
    rc = comm_allgatherv(g, g->dense, s.cost, counts, displs, MPI_DOUBLE,
                         "all-gather of the expert matrices' costs for the union plan");
    status =
        commit_mpi_agree(rt, rc, "all-gather of the expert matrices' costs for the union plan");
    if (status != SHARDOPT_OK) {
        scratch_free(&s);
        return status;
    }
    if (rt->team_cap > 1) { /* the team blocks each member keeps, in both groups */
        status = team_loads(rt, &s, jd, jx);
        if (status != SHARDOPT_OK) {
            scratch_free(&s);
            return status;
        }
    }
    for (int d = 0; d < members; d++) /* each member's expert shard group */
        counts[d] = s.info[3 * d];
    if (plan_union_owners(s.cost, s.group, n, members, counts, ngroups, s.base, s.owner, s.load) !=
        0)
        status =
            log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                     "commit: rank %d: out of memory allocating about %zu bytes to plan LPT "
                     "over the union of %lld matrices",
                     me, sizeof(int64_t) * nn + 4 * sizeof(double) * (size_t)members, (long long)n);
    status = groups_agree(g, status, "commit");
    double wu = 0, j[3] = {0, 0, 0}, u[3] = {0, 0, 0};
    for (int d = 0; d < members; d++)
        wu = max2(wu, s.load[d]);
    if (status == SHARDOPT_OK) {
        rc = busiest(rt, jd, jx, j);
        status = commit_mpi_agree(rt, rc, "all-reduce of the joint plan's busiest member");
    }
    const double ec = commit_elem_cost(rt), cj = j[1] + j[2], fj = max2(j[0], ec * cj);
    /* the union's Newton-Schulz alone no earlier: it cannot finish first (alike everywhere) */
    if (status != SHARDOPT_OK || (!rt->union_force && !(wu < fj * (1.0 - 1e-12)))) {
        if (status == SHARDOPT_OK && me == 0)
            log_info("commit: Newton-Schulz owners: the joint plan kept (its busiest member "
                     "finishes at %.6g, LPT over the union's Newton-Schulz alone at %.6g)",
                     fj, wu);
        scratch_free(&s);
        return status;
    }
    const struct plan_cfg ud = {.fixed_owner = s.owner, .fixed_teams = jd};
    status = commit_group_plan(rt, GROUP_DENSE, dense, &ud, &s.dense);
    for (int m = 0; m < nx; m++) { /* the owner's rank in this expert shard group */
        const int o = s.owner[s.first[mine[0]] + m];
        s.xowner[m] = o < 0 ? -1 : s.info[3 * o + 1];
    }
    const struct plan_cfg ux = {.fixed_owner = s.xowner, .fixed_teams = jx};
    if (status == SHARDOPT_OK)
        status = commit_group_plan(rt, GROUP_EXPERT, xs, &ux, &s.expert);
    if (status == SHARDOPT_OK) {
        rc = busiest(rt, &s.dense.plan, &s.expert.plan, u);
        status = commit_mpi_agree(rt, rc, "all-reduce of the union plan's busiest member");
    }
    if (status != SHARDOPT_OK) {
        scratch_free(&s);
        return status;
    }
    const double cu = u[1] + u[2], fu = max2(wu, ec * cu);
    const int keep = rt->union_force || fu < fj * (1.0 - 1e-12);
    if (me == 0)
        log_info("commit: Newton-Schulz owners: %s kept (model finish %.6g against %.6g; busiest "
                 "Newton-Schulz %.6g against %.6g, busiest dense + expert exchange %.6g against "
                 "%.6g elements)",
                 keep ? "LPT over the union of both groups" : "the joint plan", keep ? fu : fj,
                 keep ? fj : fu, keep ? wu : j[0], keep ? j[0] : wu, keep ? cu : cj,
                 keep ? cj : cu);
    if (keep) { /* the joint plans go, the union's take their place */
        struct group_plan t = *jd;
        *jd = s.dense.plan;
        s.dense.plan = t;
        t = *jx;
        *jx = s.expert.plan;
        s.expert.plan = t;
        rt->union_kept = 1;
    }
    scratch_free(&s);
    return SHARDOPT_OK;
}

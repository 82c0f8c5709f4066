/* shardopt-plan's union plan (plan_model.h, plan_model_union): after the joint passes, LPT over the
 * union of the dense group's and every expert shard group's matrices that the joint plan gives one
 * owner (sharding/plan_union.h; its teams stay), its plans built with the owners it gives, kept
 * where it finishes first in the cost model; the same
 * list, rule and element cost as runtime/commit_union.c, so that the prediction's bytes and
 * FLOPs stay the run's (tests/mpi/plan_vs_runtime.sh). Kept apart from plan_model.c, which calls
 * it. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bench/plan_model.h"
#include "sharding/plan.h"
#include "sharding/plan_union.h"

/* The arrays of a group_out over n members, zeroed; exits 2 when out of memory */
static void out_alloc(struct group_out *g, size_t n)
{
    double **const a[] = {&g->flops, &g->bytes, &g->owned,  &g->tbytes,
                          &g->tcomm, &g->real,  &g->sharded};
    memset(g, 0, sizeof *g);
    g->kmax = 1;
    for (size_t i = 0; i < sizeof a / sizeof *a; i++)
        if ((*a[i] = calloc(n ? n : 1, sizeof(double))) == NULL)
            plan_model_die("out of memory");
}

static void out_free(struct group_out *g)
{
    double *const a[] = {g->flops, g->bytes, g->owned, g->tbytes, g->tcomm, g->real, g->sharded};
    for (size_t i = 0; i < sizeof a / sizeof *a; i++)
        free(a[i]);
}

/* dst's arrays (n members) := src's */
static void out_copy(struct group_out *dst, const struct group_out *src, size_t n)
{
    double *const d[] = {dst->flops, dst->bytes, dst->owned,  dst->tbytes,
                         dst->tcomm, dst->real,  dst->sharded};
    double *const s[] = {src->flops, src->bytes, src->owned,  src->tbytes,
                         src->tcomm, src->real,  src->sharded};
    for (size_t i = 0; i < sizeof d / sizeof *d; i++)
        memcpy(d[i], s[i], n * sizeof(double));
}

/* The exchange elements the busiest sender of g sends per step: each member's bytes_sent, an
 * integer the double sums here round to, over the comm dtype's bytes, as commit divides the
 * plan's uint64_t count before its all-reduce (MAX) */
static double busiest_elems(const struct group_out *g, int members)
{
    double m = 0;
    for (int d = 0; d < members; d++) {
        const double e = (double)(uint64_t)llround(g->bytes[d]) / COMM_ES;
        m = e > m ? e : m;
    }
    return m;
}

int plan_model_union(const struct opts *o, const struct preset *p, const char *const *skip,
                     struct prediction *r, double elem_cost, const struct plan_cfg *dcfg,
                     const struct plan_cfg *xcfg, const struct group_plan *jd,
                     const struct group_plan *const *jx, struct group_out *dj, struct group_out *xj)
{
    const int dense = r->dense, ep = r->ep, xs = r->xs, nd = jd->nmatrices;
    const int nx = jx[0]->nmatrices; /* every EP rank's group plans its shapes */
    const int64_t n = (int64_t)nd + (int64_t)ep * nx;
    double *cost = malloc(sizeof(double) * (size_t)(n ? n : 1));
    double *load = calloc((size_t)dense, sizeof(double));
    double *base = dcfg->team_cap > 1 ? calloc((size_t)dense, sizeof(double)) : NULL;
    int *group = malloc(sizeof(int) * (size_t)(n ? n : 1));
    int *owner = malloc(sizeof(int) * (size_t)(n ? n : 1));
    int *fixed = malloc(sizeof(int) * (size_t)(nx ? nx : 1));
    if (cost == NULL || load == NULL || group == NULL || owner == NULL || fixed == NULL ||
        (dcfg->team_cap > 1 && base == NULL))
        plan_model_die("out of memory");
    /* the union's list: the dense group's matrices in its matrix order, then EP rank 0's expert
     * matrices, EP rank 1's, ...; a matrix the joint plan gave a team keeps it (cost < 0: not
     * placed), its blocks each member's starting load with teams on (commit_union.c) */
    plan_union_costs(jd, cost);
    for (int m = 0; m < nd; m++)
        group[m] = -1;
    for (int e = 0; e < ep; e++) {
        plan_union_costs(jx[e], cost + nd + (int64_t)e * nx);
        for (int m = 0; m < nx; m++)
            group[nd + (int64_t)e * nx + m] = e;
    }
    for (int d = 0; base != NULL && d < dense; d++) {
        const struct group_plan *x = jx[d % ep];
        base[d] = x->team_load != NULL ? x->team_load[d / ep] : 0.0;
        base[d] += jd->team_load != NULL ? jd->team_load[d] : 0.0;
    }
    if (plan_union_owners(cost, group, n, dense, NULL, ep, base, owner, load) != 0)
        plan_model_die("out of memory");
    /* U's plans: the dense group's with its owners, each expert group's with its members' (the
     * xs index d / ep of the dense member d the union gave), the joint plan's teams kept, as
     * commit builds them */
    struct group_out du, xu, g;
    out_alloc(&du, (size_t)dense);
    out_alloc(&xu, (size_t)dense);
    out_alloc(&g, (size_t)xs);
    struct plan_cfg cfg = *dcfg;
    cfg.fixed_owner = owner;
    cfg.fixed_teams = jd;
    if (nd > 0)
        plan_model_group_cost(p, skip, 0, dense, ep, o->xdim, o, &cfg, &du);
    int nteams = du.nteams, xteams = 0, kmax = du.kmax, by_size[6];
    for (int i = 0; i < 6; i++)
        by_size[i] = du.by_size[i];
    for (int e = 0; e < ep && nx > 0; e++) {
        for (int m = 0; m < nx; m++) {
            const int u = owner[nd + (int64_t)e * nx + m];
            fixed[m] = u < 0 ? -1 : u / ep;
        }
        cfg = *xcfg;
        cfg.fixed_owner = fixed;
        cfg.fixed_teams = jx[e];
        struct group_out ge = g; /* g's arrays, its counts fresh */
        double *const a[] = {g.flops, g.bytes, g.owned, g.tbytes, g.tcomm, g.real, g.sharded};
        for (size_t i = 0; i < sizeof a / sizeof *a; i++)
            memset(a[i], 0, (size_t)xs * sizeof(double));
        plan_model_group_cost(p, skip, 1, xs, ep, o->xdim, o, &cfg, &ge);
        xteams += ge.nteams;
        kmax = ge.kmax > kmax ? ge.kmax : kmax;
        for (int i = 0; i < 6; i++)
            by_size[i] += ge.by_size[i];
        for (int j = 0; j < xs; j++) {
            const int d = j * ep + e;
            xu.flops[d] = g.flops[j], xu.bytes[d] = g.bytes[j], xu.owned[d] = g.owned[j];
            xu.tbytes[d] = g.tbytes[j], xu.tcomm[d] = g.tcomm[j], xu.real[d] = g.real[j];
            xu.sharded[d] = g.sharded[j];
        }
    }
    /* each plan's finish (commit_union.c's): the busiest member's work (the planner's load and
     * team all-reduces, both groups; U's: the union's loads, team blocks included) or, at
     * elem_cost, the busiest dense sender's exchange elements plus the busiest expert sender's,
     * the shape of the step's t_comm (plan_model.c), so that the kept plan's step is never the
     * later one at the machine's rates */
    double wj = 0, wu = 0;
    for (int d = 0; d < dense; d++) {
        const double w = dj->flops[d] + dj->tcomm[d] + xj->flops[d] + xj->tcomm[d];
        wj = w > wj ? w : wj;
        wu = load[d] > wu ? load[d] : wu;
    }
    const double cj = busiest_elems(dj, dense) + busiest_elems(xj, dense);
    const double cu = busiest_elems(&du, dense) + busiest_elems(&xu, dense);
    r->joint_finish = wj > elem_cost * cj ? wj : elem_cost * cj;
    r->union_finish = wu > elem_cost * cu ? wu : elem_cost * cu;
    r->union_plan = r->union_finish < r->joint_finish * (1 - 1e-12);
    if (r->union_plan) { /* U's work and counts: the joint plan's teams, nothing moved */
        out_copy(dj, &du, (size_t)dense);
        out_copy(xj, &xu, (size_t)dense);
        r->nteams = nteams + xteams;
        r->xteams = xteams;
        r->team_max = kmax;
        r->nmoved = 0;
        memcpy(r->team_sizes, by_size, sizeof r->team_sizes);
    }
    out_free(&du);
    out_free(&xu);
    out_free(&g);
    free(cost);
    free(load);
    free(base);
    free(group);
    free(owner);
    free(fixed);
    return r->union_plan;
}

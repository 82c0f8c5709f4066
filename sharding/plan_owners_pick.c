/* Teams of an expert shard group (plan_cfg.team_guard, issue 22): the team size chosen for the
 * group as a whole. team_size (plan_owners.c) gives a matrix a team when its per-member cost is
 * under team_frac x the mean load and below one owner's, matrix by matrix, the cheapest size up
 * to the cap; where a group holds about one matrix per member (the presets' experts sharded along
 * rows at 16,384 GPUs with ep 1 to 4) every matrix then goes to a team, each member carries a
 * redundant m x m Gram matrix and all-reduce per team it is in, and the moves pass, which leaves
 * teams as placed, has nothing left to move: the latest member finishes later than with one owner
 * per matrix (GLM-4.5-Air, ep 1, 16,384 GPUs: t_ns 3.78 ms against 2.86 ms, shardopt-plan). So
 * the group is planned with teams of at most 1, 2, 4, ... up to the cap, and the plan whose
 * latest member's work, all-reduces included, is earliest kept (a larger cap only where earlier
 * by more than rounding). With team_guard_cost its exchange counts too, as the dense group's
 * team sizes count it (plan_owners.c, lpt_by_finish): a member's finish is max(work, base_comm +
 * team_guard_cost x the elements it sends), and a larger cap is kept only when its latest finish
 * is earlier and neither its latest work nor its latest exchange is later, so the step the model
 * predicts cannot get longer; a team whose members gather blocks of what they hold sends fewer
 * bytes than one owner per matrix (Qwen3-30B-A3B, experts by rows, ep 1 to 4, 16,384 GPUs,
 * docs/scaling.md). Pure, as the rest of the planner. */
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"
#include "plan_mat.h"

/* Elements each member holds of the group's matrices, summed into held[members], a parameter at
 * a time (each member's box once per parameter, not its piece of every matrix). Whole numbers,
 * exact in a double, so the order of the sums does not matter. */
static void held_elems(const struct mat *mats, int n, int members, double *held)
{
    memset(held, 0, sizeof(double) * (size_t)members);
    for (int a = 0, b; a < n; a = b) {
        const struct plan_param *p = mats[a].p;
        const int rd = p->ndim - 2;
        for (b = a; b < n && mats[b].p == p; b++)
            ;
        for (int i = 0; i < members; i++) {
            struct plan_box tmp;
            const struct plan_box *x = plan_member_box(p, i, &tmp);
            int64_t lo = a, hi = b; /* its matrices: all, or its experts */
            if (p->ndim == 3) {
                lo = a + (x->lo[0] > mats[a].k ? x->lo[0] - mats[a].k : 0);
                hi = x->lo[0] + x->len[0] - mats[a].k + a;
                hi = hi < b ? hi : b;
            }
            if (hi > lo)
                held[i] += (double)(x->len[rd] * x->len[rd + 1]) * (double)(hi - lo);
        }
    }
}

/* The latest exchange of P's placement (team lists of stride `stride`): base_comm +
 * team_guard_cost x the most elements a member sends in the two exchanges, every holder its
 * pieces and each owner its matrix or block less twice its piece of it (plan_charge, counted in
 * elements); scratch: [2 x members]. */
static double latest_comm(const struct plan_cfg *cfg, const struct mat *mats, int n,
                          const struct group_plan *P, int stride, const double *held,
                          double *scratch)
{
    const int members = cfg->members;
    struct plan_cfg ec = *cfg;
    ec.refine_cost = 1.0; /* plan_charge's transfers in elements */
    struct plan_carry c = {.work = scratch, .comm = scratch + members};
    memset(c.work, 0, sizeof(double) * (size_t)members); /* plan_charge adds to it; unread */
    memcpy(c.comm, held, sizeof(double) * (size_t)members);
    for (int m = 0; m < n; m++)
        plan_charge(&ec, &mats[m], P->team[m],
                    P->team[m] > 1 ? &P->team_of[(size_t)m * (size_t)stride] : &P->owner[m], &c);
    double most = 0;
    for (int i = 0; i < members; i++)
        most = c.comm[i] > most ? c.comm[i] : most;
    return cfg->base_comm + cfg->team_guard_cost * most;
}

static double latest_work(const struct group_plan *P, int members)
{
    double w = 0;
    for (int i = 0; i < members; i++)
        w = P->work[i] > w ? P->work[i] : w;
    return w;
}

/* P's placement (made with team lists of stride `stride`) into k (plan_scratch_alloc's arrays,
 * team_of with the full cap's stride), or back (to_p) */
static void keep(struct group_plan *P, struct group_plan *k, int n, int members, int stride,
                 int to_p)
{
    const size_t ni = sizeof(int) * (size_t)n, dm = sizeof(double) * (size_t)members;
    const int cap = P->team_cap;
    if (to_p) {
        memcpy(P->owner, k->owner, ni);
        memcpy(P->team, k->team, ni);
        for (int m = 0; cap > 1 && m < n; m++)
            memcpy(&P->team_of[(size_t)m * (size_t)cap], &k->team_of[(size_t)m * (size_t)cap],
                   sizeof(int) * (size_t)k->team[m]);
        memcpy(P->load, k->load, dm);
        memcpy(P->work, k->work, dm);
        memcpy(P->team_comm, k->team_comm, dm);
        P->nteams = k->nteams;
        P->nmoved = k->nmoved;
        P->refined = k->refined;
        return;
    }
    memcpy(k->owner, P->owner, ni);
    memcpy(k->team, P->team, ni);
    for (int m = 0; m < n; m++)
        if (P->team[m] > 1)
            memcpy(&k->team_of[(size_t)m * (size_t)cap], &P->team_of[(size_t)m * (size_t)stride],
                   sizeof(int) * (size_t)P->team[m]);
    memcpy(k->load, P->load, dm);
    memcpy(k->work, P->work, dm);
    memcpy(k->team_comm, P->team_comm, dm);
    k->nteams = P->nteams;
    k->nmoved = P->nmoved;
    k->refined = P->refined;
}

int plan_owners_pick(const struct plan_cfg *cfg, const struct mat *mats, int n,
                     struct group_plan *P)
{
    const int members = cfg->members, cap = P->team_cap;
    /* the largest team any matrix can have (team_size): none, one plan (ep >= a node's ranks) */
    int lim = cap < cfg->node_members ? cap : cfg->node_members;
    lim = lim < members ? lim : members;
    if (cfg->fixed_owner != NULL) { /* the union plan's owners (plan_cfg.fixed_owner) */
        double *comm = mem_calloc((size_t)members, sizeof(double)); /* plan_charge's, unread */
        if (comm == NULL)
            return -1;
        struct plan_carry c = {
            .load = P->load, .team_comm = P->team_comm, .work = P->work, .comm = comm};
        const struct group_plan *F = cfg->fixed_teams;
        for (int i = 0; i < members; i++)
            P->work[i] = cfg->base_load != NULL ? cfg->base_load[i] : 0.0;
        P->nteams = 0;
        for (int m = 0; m < n; m++) {
            const int o = cfg->fixed_owner[m];
            if (o >= 0) {
                P->owner[m] = o;
                P->team[m] = 1;
                plan_charge(cfg, &mats[m], 1, &o, &c);
                continue;
            }
            const int k = F->team[m], *t = &F->team_of[(size_t)m * (size_t)F->team_cap];
            P->owner[m] = t[0];
            P->team[m] = k;
            memcpy(&P->team_of[(size_t)m * (size_t)cap], t, sizeof(int) * (size_t)k);
            plan_charge(cfg, &mats[m], k, t, &c);
            P->nteams++;
        }
        free(comm);
        return 0;
    }
    if (!cfg->team_guard || lim < 2)
        return plan_owners_assign(cfg, mats, n, P);
    const size_t dm = sizeof(double) * (size_t)members;
    const int by_comm = cfg->team_guard_cost > 0;
    struct group_plan k = {0};
    double *held = by_comm ? mem_malloc(3 * dm) : NULL;
    if ((by_comm && held == NULL) || plan_scratch_alloc(&k, n, members, cap) != 0) {
        free(held);
        return -1;
    }
    if (by_comm)
        held_elems(mats, n, members, held);
    double best = 0, best_w = 0, best_x = 0;
    int rc = 0;
    for (int c = 1; rc == 0 && c <= lim; c *= 2) {
        memset(P->load, 0, dm);
        memset(P->work, 0, dm);
        memset(P->team_comm, 0, dm);
        P->nteams = P->nmoved = P->refined = 0;
        P->team_cap = c; /* team_size's cap and the team lists' stride for this plan */
        rc = plan_owners_assign(cfg, mats, n, P);
        if (rc != 0)
            break;
        const double w = latest_work(P, members);
        const double x = by_comm ? latest_comm(cfg, mats, n, P, c, held, held + members) : 0;
        const double f = w > x ? w : x;
        /* earlier by more than rounding; counting the exchange, neither part later either */
        if (c == 1 || (by_comm ? f < best * (1.0 - 1e-12) && w <= best_w && x <= best_x
                               : w < best * (1.0 - 1e-12))) {
            P->team_cap = cap;
            keep(P, &k, n, members, c, 0);
            best = by_comm ? f : w;
            best_w = w;
            best_x = x;
        }
    }
    P->team_cap = cap;
    if (rc == 0)
        keep(P, &k, n, members, cap, 1);
    plan_scratch_free(&k);
    free(held);
    return rc;
}

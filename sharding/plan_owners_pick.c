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
 * by more than rounding). Pure, as the rest of the planner. */
#include <string.h>

#include "plan_mat.h"

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
    if (!cfg->team_guard || lim < 2)
        return plan_owners_assign(cfg, mats, n, P);
    const size_t dm = sizeof(double) * (size_t)members;
    struct group_plan k = {0};
    if (plan_scratch_alloc(&k, n, members, cap) != 0)
        return -1;
    double best = 0;
    int rc = 0;
    for (int c = 1; rc == 0 && c <= lim; c *= 2) {
        memset(P->load, 0, dm);
        memset(P->work, 0, dm);
        memset(P->team_comm, 0, dm);
        P->nteams = P->nmoved = P->refined = 0;
        P->team_cap = c; /* team_size's cap and the team lists' stride for this plan */
        rc = plan_owners_assign(cfg, mats, n, P);
        const double w = latest_work(P, members);
        if (rc == 0 && (c == 1 || w < best * (1.0 - 1e-12))) {
            P->team_cap = cap;
            keep(P, &k, n, members, c, 0);
            best = w;
        }
    }
    P->team_cap = cap;
    if (rc == 0)
        keep(P, &k, n, members, cap, 1);
    plan_scratch_free(&k);
    return rc;
}

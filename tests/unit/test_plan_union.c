/* LPT over the union of both groups (sharding/plan_union.c) against the plain O(n x members) LPT
 * it stands for: the segment tree over members laid out group by group must give the same owner
 * to every matrix, ties included (heaviest first, equal costs in the union's order, the least
 * loaded eligible member, equal loads the lowest member), for the mesh's order (d % ngroups) and
 * for any assignment of members to groups, with members starting loaded (the team blocks the
 * union keeps) and matrices left out (cost < 0: a team's). */
#include <stdint.h>
#include <stdlib.h>

#include "sharding/plan.h"
#include "sharding/plan_union.h"
#include "test.h"

enum { MAXN = 200, MAXD = 40 };

static const double *naive_cost;

static int naive_desc(const void *a, const void *b)
{
    const int i = *(const int *)a, j = *(const int *)b;
    if (naive_cost[i] != naive_cost[j])
        return naive_cost[i] > naive_cost[j] ? -1 : 1;
    return i - j;
}

static void naive(const double *cost, const int *group, int n, int members, const int *mg,
                  int ngroups, const double *base, int *owner, double *load)
{
    int order[MAXN];
    for (int m = 0; m < n; m++)
        order[m] = m;
    naive_cost = cost;
    qsort(order, (size_t)n, sizeof(int), naive_desc);
    for (int d = 0; d < members; d++)
        load[d] = base != NULL ? base[d] : 0;
    for (int f = 0; f < n; f++) {
        const int m = order[f];
        int best = -1;
        if (cost[m] < 0) {
            owner[m] = -1;
            continue;
        }
        for (int d = 0; d < members; d++) {
            const int e = mg != NULL ? mg[d] : d % ngroups;
            if (group[m] >= 0 && e != group[m])
                continue;
            if (best < 0 || load[d] < load[best])
                best = d;
        }
        owner[m] = best;
        load[best] += cost[m];
    }
}

TEST(the_tree_gives_every_matrix_the_plain_lpts_owner)
{
    uint32_t x = 2024;
    for (int round = 0; round < 300; round++) {
        x = x * 1664525u + 1013904223u;
        const int ngroups = 1 + (int)(x >> 29);                   /* 1 .. 8 */
        const int members = ngroups * (1 + (int)((x >> 12) % 5)); /* up to 40 */
        const int n = 1 + (int)((x >> 3) % MAXN);
        const int shuffled = round % 2; /* members in groups other than d % ngroups */
        int mg[MAXD], group[MAXN], o1[MAXN], o2[MAXN];
        double cost[MAXN], l1[MAXD], l2[MAXD], base[MAXD];
        const int with_base = round % 3 == 0; /* team blocks kept: each member starts loaded */
        for (int d = 0; d < members; d++) {
            x = x * 1664525u + 1013904223u;
            base[d] = (double)(x >> 30);
        }
        for (int d = 0; d < members; d++)
            mg[d] = d % ngroups;
        for (int d = members - 1; shuffled && d > 0; d--) {
            x = x * 1664525u + 1013904223u;
            const int j = (int)((x >> 8) % (uint32_t)(d + 1)), t = mg[d];
            mg[d] = mg[j];
            mg[j] = t;
        }
        for (int m = 0; m < n; m++) {
            x = x * 1664525u + 1013904223u;
            cost[m] = (double)(1 + (x >> 29)); /* 8 values: many ties */
            if ((x & 15) == 0)
                cost[m] = -1; /* a team matrix: not placed */
            group[m] = (int)((x >> 5) % (uint32_t)(ngroups + 1)) - 1;
        }
        EXPECT_EQ_INT(plan_union_owners(cost, group, n, members, shuffled ? mg : NULL, ngroups,
                                        with_base ? base : NULL, o1, l1),
                      0);
        naive(cost, group, n, members, mg, ngroups, with_base ? base : NULL, o2, l2);
        for (int m = 0; m < n; m++)
            EXPECT_EQ_INT(o1[m], o2[m]);
        for (int d = 0; d < members; d++)
            EXPECT_TRUE(l1[d] == l2[d]);
    }
}

/* The joint plan's failure case, by hand: 4 members in 2 expert groups ({0, 2}, {1, 3}), each
 * group 3 expert matrices of cost 2, two dense ones of cost 5. Experts first (each group: 4 on
 * one member, 2 on the other) and the dense ones on top of that finish at 7; the union places the
 * dense ones first and finishes at 6. */
TEST(the_union_places_the_heavy_dense_matrices_first)
{
    const double cost[] = {5, 5, 2, 2, 2, 2, 2, 2};
    const int group[] = {-1, -1, 0, 0, 0, 1, 1, 1};
    int owner[8];
    double load[4];
    EXPECT_EQ_INT(plan_union_owners(cost, group, 8, 4, NULL, 2, NULL, owner, load), 0);
    EXPECT_EQ_INT(owner[0], 0);
    EXPECT_EQ_INT(owner[1], 1);
    const double want[] = {5, 5, 6, 6};
    for (int d = 0; d < 4; d++)
        EXPECT_TRUE(load[d] == want[d]);
}

TEST(a_group_out_of_range_or_without_members_is_refused)
{
    const double cost[] = {1, 1};
    const int bad[] = {-1, 2}, ok[] = {-1, 1}, mg[] = {0, 0, 0, 1};
    const int empty[] = {0, 0, 0, 0};
    int owner[2];
    double load[4];
    EXPECT_EQ_INT(plan_union_owners(cost, bad, 2, 4, NULL, 2, NULL, owner, load), -1);
    EXPECT_EQ_INT(plan_union_owners(cost, ok, 2, 4, empty, 2, NULL, owner, load), -1);
    EXPECT_EQ_INT(plan_union_owners(cost, ok, 2, 4, mg, 2, NULL, owner, load), 0);
    EXPECT_EQ_INT(owner[1], 3);
    EXPECT_EQ_INT(plan_union_owners(cost, ok, 2, 0, NULL, 2, NULL, owner, load), -1);
}

/* plan_cfg.fixed_owner, the union plan's owners: a plan given every owner of a plan with teams,
 * its team matrices kept (fixed_owner -1, fixed_teams), is that plan, member by member: the same
 * owners, teams and members, loads, all-reduce costs, team loads and bytes. And group_plan.
 * team_load is the team blocks' load and all-reduces alone: 0 on a member in no team. */
TEST(a_plan_for_given_owners_and_teams_is_the_plan_they_came_from)
{
    enum { MEMBERS = 8 };
    static struct plan_box bx[3][MEMBERS];
    struct plan_param ps[3];
    const int64_t shapes[3][2] = {{64, 512}, {16, 64}, {32, 64}};
    for (int p = 0; p < 3; p++) {
        ps[p] = (struct plan_param){.param = p, .ndim = 2, .k_lo = 0, .k_count = 1, .boxes = bx[p]};
        ps[p].shape[0] = shapes[p][0];
        ps[p].shape[1] = shapes[p][1];
        ps[p].shape[2] = 1;
        for (int i = 0; i < MEMBERS; i++) { /* rows in 8 even slices */
            const int64_t r = shapes[p][0] / MEMBERS;
            bx[p][i] = (struct plan_box){.lo = {r * i, 0, 0}, .len = {r, shapes[p][1], 1}};
        }
    }
    for (int me = 0; me < MEMBERS; me++) {
        struct plan_cfg cfg = {.members = MEMBERS,
                               .me = me,
                               .bucket_bytes = 1 << 20,
                               .esize = 2,
                               .team_cap = 4,
                               .node_members = 4};
        plan_cfg_team_dtype(&cfg, 0, 100, 25);
        struct group_plan P, Q;
        ASSERT_EQ_INT(plan_build(&cfg, ps, 3, &P), SHARDOPT_OK);
        ASSERT_TRUE(P.nteams == 1 && P.team[0] == 4); /* 64 x 512: over the mean alone */
        int fixed[3];
        for (int m = 0; m < 3; m++)
            fixed[m] = P.team[m] > 1 ? -1 : P.owner[m];
        struct plan_cfg fc = cfg;
        fc.fixed_owner = fixed;
        fc.fixed_teams = &P;
        ASSERT_EQ_INT(plan_build(&fc, ps, 3, &Q), SHARDOPT_OK);
        EXPECT_EQ_INT(Q.nteams, 1);
        for (int m = 0; m < 3; m++) {
            EXPECT_EQ_INT(Q.owner[m], P.owner[m]);
            EXPECT_EQ_INT(Q.team[m], P.team[m]);
        }
        for (int u = 0; u < 4; u++)
            EXPECT_EQ_INT(Q.team_of[u], P.team_of[u]);
        int in_team = 0;
        for (int i = 0; i < MEMBERS; i++) {
            EXPECT_TRUE(Q.load[i] == P.load[i] && Q.team_comm[i] == P.team_comm[i]);
            EXPECT_TRUE(Q.team_load[i] == P.team_load[i]);
            int t = 0;
            for (int u = 0; u < 4; u++)
                t |= P.team_of[u] == i;
            in_team += t;
            EXPECT_TRUE(t ? P.team_load[i] > 0 : P.team_load[i] == 0);
        }
        EXPECT_EQ_INT(in_team, 4);
        EXPECT_TRUE(Q.bytes_sent == P.bytes_sent && Q.bytes_recv == P.bytes_recv);
        plan_free(&P);
        plan_free(&Q);
    }
}

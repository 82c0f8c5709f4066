/* Newton-Schulz teams (issue 22, docs/design.md "Newton-Schulz teams"): what commit adds for
 * them once the dense and expert shard groups' plans have placed them. The planner names each team
 * matrix's members (group_plan.team_of); the step all-reduces its norm and its Gram matrices over
 * exactly those members, so each distinct member set gets a communicator here (and, where the
 * exchanges run over NCCL, an NCCL one for the Gram matrices), made once and freed at release. */
#include "runtime/commit_teams.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/mem.h"
#include "runtime/comm/comm_wait.h"
#include "runtime/commit_check.h"

int commit_teams_node_members(shardopt_runtime_t rt, MPI_Comm comm, int *out)
{
    MPI_Comm node = MPI_COMM_NULL;
    int n = 1, rc = comm_split_node(&rt->groups, comm, 0, &node, "node group of the teams");
    if (rc == MPI_SUCCESS) {
        MPI_Comm_size(node, &n);
        MPI_Comm_free(&node);
    }
    /* the same number on every rank: the smallest node's share of a group, over the replicas
     * too, whose dense groups must plan alike (replicas compute the same bits) */
    if (rc == MPI_SUCCESS)
        rc = comm_allreduce(&rt->groups, comm, MPI_IN_PLACE, &n, 1, MPI_INT, MPI_MIN,
                            "all-reduce of the node sizes");
    if (rc == MPI_SUCCESS)
        rc = comm_allreduce(&rt->groups, rt->groups.rep, MPI_IN_PLACE, &n, 1, MPI_INT, MPI_MIN,
                            "all-reduce of the node sizes over the replicas");
    *out = n;
    return rc;
}

/* With the group's exchanges over NCCL (rt->nccl[kind]: comm_backend = nccl, buffers on a device)
 * each set's own NCCL communicator, so that its Gram all-reduces stay on the device
 * (ns_sharded.c). Bootstrapped over the set's MPI communicator by its members alone
 * (nccl_group_create: ncclGetUniqueId on the set's first member, the id broadcast,
 * ncclCommInitRankConfig) in set order, for the reason the MPI ones are, on the groups' one
 * stream (comm_nccl.h: one order of NCCL kernels on every rank). ncclCommSplit of the dense
 * group's communicator would make each set in a collective of the whole dense group. A member
 * whose set failed goes on to its later sets (their members are waiting there); the outcome is
 * agreed over every rank. The same condition on every rank: the groups' sizes and comm_backend
 * are (not nsets: one expert shard group may have sets where another has none). */
static shardopt_status_t teams_nccl_create(shardopt_runtime_t rt, struct group_exec *gx,
                                           enum group_kind kind, const char *group)
{
    struct nccl_group *share = rt->nccl[kind];
    if (share == NULL)
        return SHARDOPT_OK;
    gx->set_nccl = mem_calloc((size_t)gx->nsets + 1, sizeof *gx->set_nccl);
    shardopt_status_t status =
        gx->set_nccl != NULL
            ? SHARDOPT_OK
            : log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                       "commit: rank %d: out of memory allocating %zu bytes for the %s group's "
                       "team NCCL communicators",
                       rt->groups.me.rank, sizeof *gx->set_nccl * (size_t)gx->nsets, group);
    status = groups_agree(&rt->groups, status, "commit");
    if (status != SHARDOPT_OK)
        return status;
    const char *was = comm_phase_now();
    comm_phase("commit: the Newton-Schulz teams' NCCL communicators", -1);
    for (int s = 0; s < gx->nsets; s++) {
        if (gx->set_comm[s] == MPI_COMM_NULL)
            continue;
        char name[32];
        snprintf(name, sizeof name, "%s team %d", group, s);
        const shardopt_status_t st =
            nccl_group_create(&rt->groups, gx->set_comm[s], rt->kctx.stream, rt->cfg.comm_timeout_s,
                              name, share, &gx->set_nccl[s]);
        if (st != SHARDOPT_OK && status == SHARDOPT_OK)
            status = st;
    }
    comm_phase(was, -1);
    return groups_agree(&rt->groups, status, "commit");
}

/* The members of team matrix m, as the plan lists them (ascending, lead first). */
static const int *members_of(const struct group_plan *P, int m)
{
    return &P->team_of[(size_t)m * (size_t)P->team_cap];
}

shardopt_status_t commit_teams_create(shardopt_runtime_t rt, struct group_exec *gx,
                                      enum group_kind kind, const char *group)
{
    const struct group_plan *P = &gx->plan;
    const int n = P->nmatrices;
    shardopt_status_t status = SHARDOPT_OK;
    int *first = NULL; /* [nsets]: the first matrix of each distinct member set */

    gx->nsets = 0;
    gx->set_of = NULL;
    gx->set_comm = NULL;
    gx->set_nccl = NULL;
    /* The expert shard groups plan apart (expert_moves weighs each group's experts against its
     * own members' dense load), so one group may form a team where another forms none, and what
     * follows agrees over every rank: every rank goes on when any rank has a team (one without
     * makes no set). Before, ranks without returned here while the others waited in the
     * agreement below, a hang (test_xcheck's draw_v8, seed 300068: 4 ranks, ep 2, expert_moves,
     * teams of 8). The dense group plans alike on every rank. */
    int any = P->nteams > 0;
    if (kind == GROUP_EXPERT && rt->cfg.ns_team_cap > 1) {
        int differs = 0;
        status = groups_agree_digest(&rt->groups, SHARDOPT_OK, "commit", (uint64_t)any, &differs);
        if (status != SHARDOPT_OK)
            return status;
        any |= differs;
    }
    if (!any)
        return SHARDOPT_OK;
    /* n + 1: a rank of a group without Muon matrices allocates too */
    gx->set_of = mem_malloc(sizeof(int) * ((size_t)n + 1));
    first = mem_malloc(sizeof(int) * ((size_t)n + 1));
    gx->set_comm = mem_malloc(sizeof(MPI_Comm) * ((size_t)n + 1));
    if (gx->set_of == NULL || first == NULL || gx->set_comm == NULL)
        status = log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                          "commit: rank %d: out of memory allocating %zu bytes for the %s group's "
                          "Newton-Schulz teams",
                          rt->groups.me.rank,
                          (2 * sizeof(int) + sizeof(MPI_Comm)) * ((size_t)n + 1), group);
    status = groups_agree(&rt->groups, status, "commit");
    if (status != SHARDOPT_OK) {
        free(first);
        commit_teams_free(gx);
        return status;
    }
    /* distinct sets in matrix order, the same list on every member */
    for (int m = 0; m < n; m++) {
        gx->set_of[m] = -1;
        if (P->team[m] < 2)
            continue;
        for (int s = 0; s < gx->nsets && gx->set_of[m] < 0; s++)
            if (P->team[first[s]] == P->team[m] && memcmp(members_of(P, first[s]), members_of(P, m),
                                                          sizeof(int) * (size_t)P->team[m]) == 0)
                gx->set_of[m] = s;
        if (gx->set_of[m] < 0) {
            first[gx->nsets] = m;
            gx->set_comm[gx->nsets] = MPI_COMM_NULL;
            gx->set_of[m] = gx->nsets++;
        }
    }
    /* each member makes its sets' communicators in that one order, so that the first set not
     * yet made has every member ready for it (no two sets wait on each other); each set its
     * own tag, as members of two overlapping sets may be one set apart */
    MPI_Group whole = MPI_GROUP_NULL;
    int rc = MPI_Comm_group(gx->comm, &whole), tag_ub = 32767, *attr, flag = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &attr, &flag);
    if (flag && *attr > 0)
        tag_ub = *attr;
    for (int s = 0; rc == MPI_SUCCESS && s < gx->nsets; s++) {
        const int *t = members_of(P, first[s]), k = P->team[first[s]];
        int in = 0;
        for (int j = 0; j < k; j++)
            in |= t[j] == P->me;
        if (!in)
            continue;
        MPI_Group g;
        rc = MPI_Group_incl(whole, k, t, &g);
        if (rc == MPI_SUCCESS) {
            rc = MPI_Comm_create_group(gx->comm, g, (int)(s % ((int64_t)tag_ub + 1)),
                                       &gx->set_comm[s]);
            MPI_Group_free(&g);
        }
    }
    if (whole != MPI_GROUP_NULL)
        MPI_Group_free(&whole);
    free(first);
    status =
        commit_mpi_agree(rt, rc, "making the %s group's Newton-Schulz team communicators", group);
    if (status == SHARDOPT_OK)
        status = teams_nccl_create(rt, gx, kind, group);
    if (status != SHARDOPT_OK)
        commit_teams_free(gx);
    return status;
}

void commit_teams_free(struct group_exec *gx)
{
    /* before the MPI communicators they were bootstrapped over; before the groups' stream's
     * owner (commit_release runs before init's groups are destroyed) */
    for (int s = 0; gx->set_nccl != NULL && s < gx->nsets; s++)
        nccl_group_destroy(gx->set_nccl[s]);
    free(gx->set_nccl);
    gx->set_nccl = NULL;
    for (int s = 0; gx->set_comm != NULL && s < gx->nsets; s++)
        if (gx->set_comm[s] != MPI_COMM_NULL)
            MPI_Comm_free(&gx->set_comm[s]);
    free(gx->set_of);
    free(gx->set_comm);
    gx->set_of = NULL;
    gx->set_comm = NULL;
    gx->nsets = 0;
}

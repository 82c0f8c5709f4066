/* The planner's first half: who orthogonalizes each matrix of a group. LPT over the members
 * (on top of base_load, the other group's work), whole matrices kept by their holder unless a
 * move pays (move_cost), planned Newton-Schulz teams inside a node (sized and placed by
 * sharding/plan_teams.c). sharding/plan.c lays out the exchange for the owners chosen here. */
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"
#include "plan_mat.h"

/* qsort has no context argument in C11: the matrices reach the comparator through this, one
 * per thread, so that two runtimes committing in two threads at once each sort their own */
static _Thread_local const struct mat *sort_mats;

/* Longest processing time first; equal costs in matrix order, so every member sorts alike. */
static int by_cost_desc(const void *a, const void *b)
{
    int i = *(const int *)a, j = *(const int *)b;
    double ci = sort_mats[i].cost, cj = sort_mats[j].cost;
    if (ci != cj)
        return ci > cj ? -1 : 1;
    return i - j;
}

/* The member holding all of matrix m, or -1. */
static int whole_holder(const struct mat *m, int members)
{
    for (int i = 0; i < members; i++)
        if (plan_piece_count(m, i) == m->rows * m->cols)
            return i;
    return -1;
}

/* whole_holder of every matrix into holder[n], a parameter at a time: member i, ascending,
 * claims the matrices of its box it holds whole that no lower member claimed; members x
 * parameters boxes instead of members x matrices pieces (16,384 GPUs and 17,664 expert matrices:
 * most of the planning time with teams, the group planned once per team cap). */
static void whole_holders(const struct mat *mats, int n, int members, int *holder)
{
    for (int a = 0, b; a < n; a = b) {
        const struct plan_param *p = mats[a].p;
        const int64_t W = mats[a].rows * mats[a].cols, rd = p->ndim - 2;
        for (b = a; b < n && mats[b].p == p; b++)
            holder[b] = W == 0 && members > 0 ? 0 : -1; /* member 0's piece of nothing is all */
        int left = W == 0 ? 0 : b - a;
        for (int i = 0; left > 0 && i < members; i++) {
            struct plan_box tmp;
            const struct plan_box *x = plan_member_box(p, i, &tmp);
            if (x->len[rd] * x->len[rd + 1] != W)
                continue;
            int64_t lo = a, hi = b; /* the matrices of its box: all, or its experts */
            if (p->ndim == 3) {
                lo = a + (x->lo[0] > mats[a].k ? x->lo[0] - mats[a].k : 0);
                hi = x->lo[0] + x->len[0] - mats[a].k + a;
                hi = hi < b ? hi : b;
            }
            for (int64_t m = lo; m < hi; m++)
                if (holder[m] < 0) {
                    holder[m] = i;
                    left--;
                }
        }
    }
}

static double max2(double a, double b) { return a > b ? a : b; }

/* Elements member i sends of matrix m in the two exchanges when o owns it: the owner sends back
 * all it does not hold (#2), any other member its piece (#1); what it receives mirrors that. */
static double sent_elems(const struct mat *m, int i, int o)
{
    const int64_t h = plan_piece_count(m, i);
    return (double)(i == o ? m->rows * m->cols - h : h);
}

/* After the LPT: a matrix leaves its owner for the member that would finish first with it (NS
 * work, or the exchange elements it then sends at move_cost each; ties the lowest), when that
 * makes the later of the two finish sooner; heaviest matrices first, ties in matrix order. The
 * transfers are every member's exchange of every matrix: a matrix sharded over several holders
 * moving from owner o to n changes only o's (its piece out and back instead of the rest) and n's
 * (the rest instead of its piece); the other holders send the same piece to either. A matrix
 * held whole moves its holder's bytes out and back. An owner sheds matrices only while it is the
 * later of the two, so a balanced group moves nothing, and no member's finish, max(work, comm),
 * ends later than the latest before the pass. Teams stay as placed. */
static void moves_assign(const struct plan_cfg *cfg, const struct mat *mats, int n,
                         struct group_plan *P, int *order, double *comm)
{
    const int members = cfg->members;
    const double mc = cfg->move_cost;
    double *work = P->work;
    int nsingle = 0;
    for (int i = 0; i < members; i++)
        comm[i] = cfg->base_comm;
    for (int m = 0; m < n; m++) {
        if (P->team[m] != 1)
            continue;
        order[nsingle++] = m;
        for (int i = 0; i < members; i++)
            comm[i] += mc * sent_elems(&mats[m], i, P->owner[m]);
    }
    sort_mats = mats;
    qsort(order, (size_t)nsingle, sizeof(int), by_cost_desc);
    for (int f = 0; f < nsingle; f++) {
        const int m = order[f], h = P->owner[m];
        const int64_t W = mats[m].rows * mats[m].cols, hh = plan_piece_count(&mats[m], h);
        const double c = mats[m].cost;
        const double sh = mc * (double)(2 * hh - W); /* the owner's change in sent elements */
        const double fh = max2(work[h], comm[h]), fh_after = max2(work[h] - c, comm[h] + sh);
        int best = -1; /* the member that would finish first with it */
        double best_f = 0, best_s = 0;
        for (int i = 0; i < members; i++) {
            if (i == h)
                continue;
            const double si = mc * (double)(W - 2 * plan_piece_count(&mats[m], i));
            const double fi = max2(work[i] + c, comm[i] + si);
            if (best < 0 || fi < best_f) {
                best = i;
                best_f = fi;
                best_s = si;
            }
        }
        if (best >= 0 && !(max2(fh_after, best_f) < max2(fh, max2(work[best], comm[best]))))
            best = -1;
        if (best < 0)
            continue;
        comm[h] += sh;
        comm[best] += best_s;
        work[h] -= c;
        work[best] += c;
        P->load[h] -= c;
        P->load[best] += c;
        P->owner[m] = best;
        P->nmoved++;
    }
}

/* The second placement (plan_cfg.refine_load): matrices held whole stay with their holder; the
 * rest, heaviest first (ties in matrix order), each go to one owner or a team of 2, 4, ... up to
 * team_limit, the smallest whose finish stays within the latest finish so far, else the one
 * finishing first (ties the smaller). The LPT's owners balance FLOPs only, on the other group's
 * load before its moves; here the exchange counts too, so a matrix whose one owner would send
 * the most bytes of the group can go to a small team instead (Qwen3-30B-A3B, whole experts, 256
 * GPUs: its 96 q/o projections in teams of 2 and 4 on the ranks the experts moved to,
 * docs/scaling.md). It replaces P's placement when its latest finish is earlier than P's, both
 * counted on refine_load. Returns 0, -1 when out of memory. */
static int refine(const struct plan_cfg *cfg, const struct mat *mats, int n, struct group_plan *P,
                  int *order)
{
    const int members = cfg->members, cap = P->team_cap;
    const size_t nn = (size_t)(n ? n : 1), tn = cap > 1 ? nn * (size_t)cap : 1;
    int *owner = mem_malloc(sizeof(int) * (2 * nn + tn));
    double *dbl = mem_calloc(6 * (size_t)members, sizeof(double));
    if (owner == NULL || dbl == NULL) {
        free(owner);
        free(dbl);
        return -1;
    }
    int *team = owner + nn, *team_of = owner + 2 * nn;
    struct plan_carry A = {.work = dbl, .comm = dbl + members}; /* P's placement */
    struct plan_carry B = {.load = dbl + 2 * members,           /* the second one */
                           .team_comm = dbl + 3 * members,
                           .work = dbl + 4 * members,
                           .comm = dbl + 5 * members};
    for (int i = 0; i < members; i++) {
        A.work[i] = B.work[i] = cfg->refine_load[i];
        A.comm[i] = B.comm[i] = cfg->refine_comm;
    }
    int nfree = 0;
    for (int m = 0; m < n; m++) {
        const struct mat *x = &mats[m];
        for (int i = 0; i < members; i++) { /* every holder sends its piece... */
            const double h = cfg->refine_cost * (double)plan_piece_count(x, i);
            A.comm[i] += h;
            B.comm[i] += h;
        }
        /* ...but its owners (charge) */
        plan_charge(cfg, x, P->team[m],
                    P->team[m] > 1 ? &P->team_of[(size_t)m * (size_t)cap] : &P->owner[m], &A);
        team[m] = 1;
        owner[m] = whole_holder(x, members);
        if (owner[m] >= 0)
            plan_charge(cfg, x, 1, &owner[m], &B);
        else
            order[nfree++] = m;
    }
    sort_mats = mats;
    qsort(order, (size_t)nfree, sizeof(int), by_cost_desc);
    double T = plan_latest(&B, members, NULL, NULL);
    for (int f = 0; f < nfree; f++) {
        const int m = order[f];
        int t[PLAN_TEAM_MAX], best[PLAN_TEAM_MAX], best_k = 1;
        double best_f = plan_owner_fit(cfg, &B, &mats[m], best);
        const int lim = cap > 1 ? plan_team_limit(cfg, cap, &mats[m]) : 1;
        for (int k = 2; best_f > T && k <= lim; k *= 2) {
            const double fk = plan_team_fit(cfg, &B, &mats[m], k, t);
            if (fk >= 0 && (fk < best_f || fk <= T)) {
                best_f = fk;
                best_k = k;
                memcpy(best, t, sizeof(int) * (size_t)k);
            }
        }
        team[m] = best_k;
        owner[m] = best[0];
        if (best_k > 1)
            memcpy(&team_of[(size_t)m * (size_t)cap], best, sizeof(int) * (size_t)best_k);
        plan_charge(cfg, &mats[m], best_k, best, &B);
        T = max2(T, best_f);
    }
    double wa, ca, wb, cb;
    const double fa = plan_latest(&A, members, &wa, &ca), fb = plan_latest(&B, members, &wb, &cb);
    /* earlier by more than rounding (the same plan summed in another order never replaces),
     * and neither the latest Newton-Schulz nor the latest exchange later: a step bound by the
     * exchange is not bought with longer Newton-Schulz, which the model's link rate may
     * overstate */
    if (fb < fa * (1.0 - 1e-12) && wb <= wa && cb <= ca) {
        memcpy(P->owner, owner, sizeof(int) * nn);
        memcpy(P->team, team, sizeof(int) * nn);
        if (cap > 1)
            memcpy(P->team_of, team_of, sizeof(int) * tn);
        P->nteams = 0;
        for (int m = 0; m < n; m++)
            P->nteams += team[m] > 1;
        for (int i = 0; i < members; i++) {
            P->load[i] = B.load[i];
            P->team_comm[i] = B.team_comm[i];
            P->work[i] = B.work[i];
        }
        P->refined = 1;
    }
    free(owner);
    free(dbl);
    return 0;
}

/* The LPT over the free matrices order[0..nfree), heaviest first, into P, charging c (P's load,
 * team_comm and work, and each member's transfers at refine_cost: plan_charge). A matrix heavier
 * than team_frac x the mean load goes to a team of plan_team_size's k. by_finish 0: k as it is,
 * its members by plan_team_place (Newton-Schulz alone); 1: the team of k, 2k, ... up to
 * plan_team_limit counting its members' transfers too (plan_team_fit), the smallest whose finish
 * stays within the latest finish so far, else the one finishing first (ties the smaller), as the
 * second placement sizes them: a bigger team has smaller blocks to gather and send back (issue
 * 22: Qwen3-30B-A3B, experts by rows, 1,024 GPUs, bf16 teams of 4 instead of 8 sent more). The
 * rest onto the least-loaded member, ties toward the member holding most of it, then the lowest. */
static void lpt(const struct plan_cfg *cfg, const struct mat *mats, const int *order, int nfree,
                double mean, int by_finish, struct group_plan *P, struct plan_carry *c,
                double *sorted)
{
    const double *work = c->work;
    double T = by_finish ? plan_latest(c, cfg->members, NULL, NULL) : 0;
    const int G = cfg->node_members;
    /* each node's work ascending, for plan_team_place; kept as the charges change it */
    if (by_finish || P->team_cap < 2 || G < 1)
        sorted = NULL;
    for (int j = 0; sorted != NULL && j * G < cfg->members; j++)
        plan_node_sort(cfg, work, j, sorted);
    for (int f = 0; f < nfree; f++) {
        const int m = order[f]; /* held by none: matrices held whole are placed already */
        int k = plan_team_size(cfg, P->team_cap, &mats[m], mean), best = 0;
        if (k > 1) {
            int *t = &P->team_of[(size_t)m * (size_t)P->team_cap], tj[PLAN_TEAM_MAX];
            if (by_finish) {
                double best_f = plan_team_fit(cfg, c, &mats[m], k, t);
                const int lim = plan_team_limit(cfg, P->team_cap, &mats[m]);
                for (int j = 2 * k; best_f > T && j <= lim; j *= 2) {
                    const double fj = plan_team_fit(cfg, c, &mats[m], j, tj);
                    if (fj >= 0 && (fj < best_f || fj <= T)) {
                        best_f = fj;
                        k = j;
                        memcpy(t, tj, sizeof(int) * (size_t)j);
                    }
                }
                T = max2(T, best_f);
            } else {
                plan_team_place(cfg, work, sorted,
                                plan_team_member_cost(cfg, mats[m].rows, mats[m].cols, k), k, t);
            }
            /* member u performs its own block's FLOPs (what the runtime counts), but each
             * iteration's all-reduce waits for the widest block: its time is that one's */
            plan_charge(cfg, &mats[m], k, t, c);
            if (sorted != NULL) /* a team lies inside one node */
                plan_node_sort(cfg, work, t[0] / G, sorted);
            P->owner[m] = t[0];
            P->team[m] = k;
            P->nteams++;
            continue;
        }
        /* a member's piece counted only where the work ties (-1: best's not yet) */
        int64_t best_held = -1;
        for (int i = 1; i < cfg->members; i++) {
            if (work[i] < work[best]) {
                best = i;
                best_held = -1;
            } else if (work[i] == work[best]) {
                const int64_t held = plan_piece_count(&mats[m], i);
                if (best_held < 0)
                    best_held = plan_piece_count(&mats[m], best);
                if (held > best_held) {
                    best = i;
                    best_held = held;
                }
            }
        }
        P->owner[m] = best;
        plan_charge(cfg, &mats[m], 1, &best, c);
        if (sorted != NULL)
            plan_node_sort(cfg, work, best / G, sorted);
        T = max2(T, max2(work[best], c->comm[best]));
    }
}

/* The team sizes counting the exchange (refine_cost > 0, teams, LPT on top of base_load): the
 * LPT run again into a copy Q of P as it stands before it (qc: Q's transfers so far), with
 * by_finish; P's own LPT (pc) is replaced by it only when its latest finish, max(work,
 * transfers), is earlier and neither its latest Newton-Schulz nor its latest exchange is later, as
 * refine keeps its plan: so it never lengthens the step the model predicts. Returns 0, -1 when
 * out of memory. */
static int lpt_by_finish(const struct plan_cfg *cfg, const struct mat *mats, int n,
                         const int *order, int nfree, double mean, struct group_plan *P,
                         struct plan_carry *pc, double *qcomm, double *sorted)
{
    const int members = cfg->members, cap = P->team_cap;
    const size_t nn = (size_t)(n ? n : 1), mm = (size_t)members;
    struct group_plan Q = *P;
    if (plan_scratch_alloc(&Q, n, members, cap) != 0)
        return -1;
    memcpy(Q.owner, P->owner, sizeof(int) * nn);
    memcpy(Q.team, P->team, sizeof(int) * nn);
    memcpy(Q.load, P->load, sizeof(double) * mm);
    memcpy(Q.team_comm, P->team_comm, sizeof(double) * mm);
    memcpy(Q.work, P->work, sizeof(double) * mm);
    struct plan_carry qc = {
        .load = Q.load, .team_comm = Q.team_comm, .work = Q.work, .comm = qcomm};
    lpt(cfg, mats, order, nfree, mean, 0, P, pc, sorted);
    if (P->nteams > 0) {
        lpt(cfg, mats, order, nfree, mean, 1, &Q, &qc, NULL);
        double wa, ca, wb, cb;
        const double fa = plan_latest(pc, members, &wa, &ca),
                     fb = plan_latest(&qc, members, &wb, &cb);
        if (fb < fa * (1.0 - 1e-12) && wb <= wa && cb <= ca) {
            memcpy(P->owner, Q.owner, sizeof(int) * nn);
            memcpy(P->team, Q.team, sizeof(int) * nn);
            memcpy(P->team_of, Q.team_of, sizeof(int) * nn * (size_t)cap);
            memcpy(P->load, Q.load, sizeof(double) * mm);
            memcpy(P->team_comm, Q.team_comm, sizeof(double) * mm);
            memcpy(P->work, Q.work, sizeof(double) * mm);
            P->nteams = Q.nteams;
        }
    }
    plan_scratch_free(&Q);
    return 0;
}

/* Owners: a member holding the whole matrix keeps it (no traffic); the rest by LPT onto the
 * least-loaded member (base_load counted), ties toward the member holding most of the matrix,
 * then the lowest; teams for matrices too heavy for one member. With move_cost, the LPT ignores
 * base_load, so the owners start as the group's plan on its own (what the runtime runs without
 * expert_moves), and the moves pass then changes one only where the transfers it adds pay: an
 * LPT around base_load would send sharded matrices to light members whatever they cost to reach
 * (issue 22, the rows-sharded experts). */
int plan_owners_assign(const struct plan_cfg *cfg, const struct mat *mats, int n,
                       struct group_plan *P)
{
    const int members = cfg->members;
    int *order = mem_malloc(sizeof(int) * 2 * (size_t)(n ? n : 1)), *holder = order + (n ? n : 1);
    /* comm, the by_finish copy's comm, each node's work ascending (lpt) */
    double *comm = mem_calloc(3 * (size_t)members, sizeof(double));
    double *work = P->work;
    int nfree = 0, rc = 0;

    if (order == NULL || comm == NULL) {
        free(order);
        free(comm);
        return -1;
    }
    const double *base = cfg->base_load;
    const int base_later = base != NULL && cfg->move_cost > 0;
    /* the team sizes count the exchange: every member's transfers start from refine_comm and
     * its pieces of every matrix, which its owners' charge corrects (plan_charge) */
    const int by_finish = cfg->refine_cost > 0 && P->team_cap > 1 && cfg->move_cost <= 0;
    double total = 0;
    for (int i = 0; i < members; i++) {
        work[i] = base != NULL && !base_later ? base[i] : 0.0;
        total += work[i];
        comm[i] = by_finish ? cfg->refine_comm : 0.0;
    }
    struct plan_carry pc = {.load = P->load, .team_comm = P->team_comm, .work = work, .comm = comm};
    whole_holders(mats, n, members, holder);
    for (int m = 0; m < n; m++) {
        total += mats[m].cost;
        for (int i = 0; by_finish && i < members; i++)
            comm[i] += cfg->refine_cost * (double)plan_piece_count(&mats[m], i);
        P->team[m] = 1;
        P->owner[m] = holder[m];
        if (P->owner[m] >= 0)
            plan_charge(cfg, &mats[m], 1, &P->owner[m], &pc);
        else
            order[nfree++] = m;
    }
    const double mean = total / members;
    sort_mats = mats;
    qsort(order, (size_t)nfree, sizeof(int), by_cost_desc);
    if (by_finish) {
        memcpy(comm + members, comm, sizeof(double) * (size_t)members);
        rc = lpt_by_finish(cfg, mats, n, order, nfree, mean, P, &pc, comm + members,
                           comm + 2 * members);
    } else {
        lpt(cfg, mats, order, nfree, mean, 0, P, &pc, comm + 2 * members);
    }
    if (base_later)
        for (int i = 0; i < members; i++)
            work[i] += base[i];
    if (cfg->move_cost > 0)
        moves_assign(cfg, mats, n, P, order, comm);
    if (rc == 0 && cfg->refine_load != NULL && cfg->refine_cost > 0 && cfg->move_cost <= 0)
        rc = refine(cfg, mats, n, P, order);
    free(order);
    free(comm);
    return rc;
}

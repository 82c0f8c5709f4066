/* The planner's first half: who orthogonalizes each matrix of a group. LPT over the members
 * (on top of base_load, the other group's work), whole matrices kept by their holder unless a
 * move pays (move_cost), planned Newton-Schulz teams inside a node; and their cost helpers.
 * sharding/plan.c lays out the exchange for the owners chosen here. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"
#include "plan_mat.h"

static const struct mat *sort_mats;

/* Longest processing time first; equal costs in matrix order, so every member sorts alike. */
static int by_cost_desc(const void *a, const void *b)
{
    int i = *(const int *)a, j = *(const int *)b;
    double ci = sort_mats[i].cost, cj = sort_mats[j].cost;
    if (ci != cj)
        return ci > cj ? -1 : 1;
    return i - j;
}

double plan_ns_team_block_cost(int64_t rows, int64_t cols, int k, int j, int narrow_ok)
{
    int64_t lo = 0, hi = 0;
    /* the width only: a square matrix's two orientations cut alike */
    plan_team_block(rows, cols, 0, k > 1 ? k : 1, j, &lo, &hi);
    return plan_ns_block_cost((double)(rows < cols ? rows : cols), (double)(hi - lo), narrow_ok);
}

double plan_ns_team_cost(int64_t rows, int64_t cols, int k, int narrow_ok)
{
    /* block 0 is the widest: ceil(L / k), the later ones that or shorter */
    return plan_ns_team_block_cost(rows, cols, k, 0, narrow_ok);
}

double plan_team_allreduce_elems(int64_t rows, int64_t cols, int k)
{
    double m = (double)(rows < cols ? rows : cols);
    return k > 1 ? 2.0 * (k - 1) / k * m * m : 0.0;
}

double plan_team_elem_bytes(int team_bf16) { return team_bf16 ? 2.0 : 4.0; }

void plan_cfg_team_dtype(struct plan_cfg *cfg, int team_bf16, double ns_rate, double link_rate)
{
    cfg->team_bf16 = team_bf16 != 0;
    cfg->allreduce_cost = plan_team_elem_bytes(team_bf16) * ns_rate / link_rate;
}

double plan_team_member_cost(const struct plan_cfg *cfg, int64_t rows, int64_t cols, int k)
{
    return plan_ns_team_cost(rows, cols, k, !cfg->team_bf16) +
           cfg->allreduce_cost * plan_team_allreduce_elems(rows, cols, k);
}

/* The member holding all of matrix m, or -1. */
static int whole_holder(const struct mat *m, int members)
{
    for (int i = 0; i < members; i++)
        if (plan_piece_count(m, i) == m->rows * m->cols)
            return i;
    return -1;
}

static double max2(double a, double b) { return a > b ? a : b; }

/* The team size for a free matrix of cost c: 1, or the smallest power of two up to the cap (and
 * the node) whose per-member cost, all-reduce included, is under team_frac x the mean load, when
 * that is cheaper than one owner; none under it: the cheapest. */
static int team_size(const struct plan_cfg *cfg, int team_cap, const struct mat *m, double mean)
{
    const int cap0 = team_cap < cfg->node_members ? team_cap : cfg->node_members;
    const int cap = cap0 < cfg->members ? cap0 : cfg->members;
    const double frac = cfg->team_frac > 0 ? cfg->team_frac : 0.5;
    if (cap < 2 || m->cost <= frac * mean)
        return 1;
    /* the team all-reduces the m x m Gram matrix in one MPI call, whose count is an int: a short
     * side of 46341 or more stays with one owner (which the bucket limit then refuses by name)
     * rather than overflowing the count */
    const int64_t side = m->rows < m->cols ? m->rows : m->cols;
    if (side > 0 && side > (int64_t)INT_MAX / side)
        return 1;
    int best = 1;
    double best_c = m->cost;
    for (int k = 2; k <= cap; k *= 2) {
        const double c = plan_team_member_cost(cfg, m->rows, m->cols, k);
        if (c < best_c) {
            best = k;
            best_c = c;
        }
        if (c <= frac * mean && best == k)
            break;
    }
    return best;
}

/* Team of k for matrix m: in each node the k members with the least work (ties the lower index);
 * the node whose team would finish first (ties the lower node). Writes the members, lead first
 * (the lowest index of the team). */
static void team_place(const struct plan_cfg *cfg, const double *work, double per, int k, int *out)
{
    const int G = cfg->node_members, nodes = (cfg->members + G - 1) / G;
    double best_f = 0;
    int tmp[PLAN_TEAM_MAX], found = 0;
    for (int j = 0; j < nodes; j++) {
        const int lo = j * G, hi = lo + G < cfg->members ? lo + G : cfg->members;
        if (hi - lo < k)
            continue;
        int cnt = 0;
        double f = 0;
        for (int t = 0; t < k; t++) { /* selection: the next least-loaded not yet taken */
            int pick = -1;
            for (int i = lo; i < hi; i++) {
                int taken = 0;
                for (int u = 0; u < cnt; u++)
                    taken |= tmp[u] == i;
                if (!taken && (pick < 0 || work[i] < work[pick]))
                    pick = i;
            }
            tmp[cnt++] = pick;
            f = max2(f, work[pick] + per);
        }
        if (!found || f < best_f) {
            found = 1;
            best_f = f;
            for (int t = 0; t < k; t++)
                out[t] = tmp[t];
        }
    }
    for (int a = 1; a < k; a++) /* ascending: the lead is the lowest index */
        for (int b = a; b > 0 && out[b] < out[b - 1]; b--) {
            int x = out[b];
            out[b] = out[b - 1];
            out[b - 1] = x;
        }
}

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

/* Elements of member i's piece of matrix m inside block j of a team of k. */
static int64_t block_overlap(const struct mat *m, int k, int j, int i)
{
    int64_t r0, r1, c0, c1, off, lo, hi;
    if (plan_piece_of(m, i, &r0, &r1, &c0, &c1, &off) == 0)
        return 0;
    if (plan_team_block(m->rows, m->cols, m->p->ns_transpose, k, j, &lo, &hi)) {
        r0 = r0 > lo ? r0 : lo;
        r1 = r1 < hi ? r1 : hi;
    } else {
        c0 = c0 > lo ? c0 : lo;
        c1 = c1 < hi ? c1 : hi;
    }
    return r1 > r0 && c1 > c0 ? (r1 - r0) * (c1 - c0) : 0;
}

/* Elements of block j of a team of k over matrix m. */
static int64_t block_elems(const struct mat *m, int k, int j)
{
    int64_t lo, hi;
    const int on_rows = plan_team_block(m->rows, m->cols, m->p->ns_transpose, k, j, &lo, &hi);
    return (hi - lo) * (on_rows ? m->cols : m->rows);
}

/* The largest team a matrix may have: team_cap, within a node and the group; 1 where its Gram
 * matrix is beyond one MPI count (team_size). */
static int team_limit(const struct plan_cfg *cfg, int team_cap, const struct mat *m)
{
    const int cap0 = team_cap < cfg->node_members ? team_cap : cfg->node_members;
    const int cap = cap0 < cfg->members ? cap0 : cfg->members;
    const int64_t side = m->rows < m->cols ? m->rows : m->cols;
    return side > 0 && side > (int64_t)INT_MAX / side ? 1 : cap;
}

/* What each member carries under one placement of the group's matrices (refine). */
struct carry {
    double *load, *team_comm; /* as group_plan's; or NULL: not kept */
    double *work;             /* refine_load + owned work, all-reduces included */
    double *comm;             /* refine_comm + refine_cost x the exchange elements sent */
};

/* Matrix m owned by t[0] alone (k = 1) or by the team t[0..k), member u taking block u: add
 * what its owners then do to c. Every holder's piece is counted already as sent (refine), so an
 * owner's transfers change by its matrix (or block) less twice its piece of it. */
static void charge(const struct plan_cfg *cfg, const struct mat *m, int k, const int *t,
                   struct carry *c)
{
    const double rc = cfg->refine_cost;
    if (k == 1) {
        const int64_t W = m->rows * m->cols, h = plan_piece_count(m, t[0]);
        if (c->load != NULL)
            c->load[t[0]] += m->cost;
        c->work[t[0]] += m->cost;
        c->comm[t[0]] += rc * (double)(W - 2 * h);
        return;
    }
    const double ar = cfg->allreduce_cost * plan_team_allreduce_elems(m->rows, m->cols, k);
    const double per = plan_team_member_cost(cfg, m->rows, m->cols, k);
    for (int u = 0; u < k; u++) {
        if (c->load != NULL) {
            c->load[t[u]] += plan_ns_team_block_cost(m->rows, m->cols, k, u, !cfg->team_bf16);
            c->team_comm[t[u]] += ar;
        }
        c->work[t[u]] += per;
        c->comm[t[u]] += rc * (double)(block_elems(m, k, u) - 2 * block_overlap(m, k, u, t[u]));
    }
}

/* The latest finish of a placement, max over members of max(work, comm); *work and *comm: the
 * latest of each. */
static double latest(const struct carry *c, int members, double *work, double *comm)
{
    double w = 0, x = 0;
    for (int i = 0; i < members; i++) {
        w = max2(w, c->work[i]);
        x = max2(x, c->comm[i]);
    }
    if (work != NULL) {
        *work = w;
        *comm = x;
    }
    return max2(w, x);
}

/* The team of k for matrix m that finishes first, counting its members' transfers: in each node
 * the k members whose finish with the widest block would be earliest (ties the lower index), the
 * node whose team then finishes first, every member's own block and overlap counted (ties the
 * lower node). Writes the members, ascending, to out; returns that finish (-1: no node has k
 * members). */
static double team_fit(const struct plan_cfg *cfg, const struct carry *c, const struct mat *m,
                       int k, int *out)
{
    const int G = cfg->node_members, nodes = (cfg->members + G - 1) / G;
    const double rc = cfg->refine_cost;
    const double per = plan_team_member_cost(cfg, m->rows, m->cols, k);
    const double b0 = rc * (double)block_elems(m, k, 0);
    double best_f = -1;
    int tmp[PLAN_TEAM_MAX];
    for (int j = 0; j < nodes; j++) {
        const int lo = j * G, hi = lo + G < cfg->members ? lo + G : cfg->members;
        if (hi - lo < k)
            continue;
        int cnt = 0;
        for (int t = 0; t < k; t++) {
            int pick = -1;
            double pf = 0;
            for (int i = lo; i < hi; i++) {
                int taken = 0;
                for (int u = 0; u < cnt; u++)
                    taken |= tmp[u] == i;
                const double f = max2(c->work[i] + per, c->comm[i] + b0);
                if (!taken && (pick < 0 || f < pf)) {
                    pick = i;
                    pf = f;
                }
            }
            tmp[cnt++] = pick;
        }
        for (int a = 1; a < k; a++) /* ascending: member u takes block u */
            for (int b = a; b > 0 && tmp[b] < tmp[b - 1]; b--) {
                const int x = tmp[b];
                tmp[b] = tmp[b - 1];
                tmp[b - 1] = x;
            }
        double f = 0;
        for (int u = 0; u < k; u++)
            f = max2(f, max2(c->work[tmp[u]] + per,
                             c->comm[tmp[u]] + rc * (double)(block_elems(m, k, u) -
                                                             2 * block_overlap(m, k, u, tmp[u]))));
        if (best_f < 0 || f < best_f) {
            best_f = f;
            memcpy(out, tmp, sizeof(int) * (size_t)k);
        }
    }
    return best_f;
}

/* The one owner of matrix m that finishes first (ties the member holding most of it, then the
 * lowest); returns that finish. */
static double owner_fit(const struct plan_cfg *cfg, const struct carry *c, const struct mat *m,
                        int *out)
{
    const int64_t W = m->rows * m->cols;
    double best_f = 0;
    int64_t best_h = 0;
    for (int i = 0; i < cfg->members; i++) {
        const int64_t h = plan_piece_count(m, i);
        const double f =
            max2(c->work[i] + m->cost, c->comm[i] + cfg->refine_cost * (double)(W - 2 * h));
        if (i == 0 || f < best_f || (f == best_f && h > best_h)) {
            *out = i;
            best_f = f;
            best_h = h;
        }
    }
    return best_f;
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
    struct carry A = {.work = dbl, .comm = dbl + members}; /* P's placement */
    struct carry B = {.load = dbl + 2 * members,           /* the second one */
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
        charge(cfg, x, P->team[m],
               P->team[m] > 1 ? &P->team_of[(size_t)m * (size_t)cap] : &P->owner[m], &A);
        team[m] = 1;
        owner[m] = whole_holder(x, members);
        if (owner[m] >= 0)
            charge(cfg, x, 1, &owner[m], &B);
        else
            order[nfree++] = m;
    }
    sort_mats = mats;
    qsort(order, (size_t)nfree, sizeof(int), by_cost_desc);
    double T = latest(&B, members, NULL, NULL);
    for (int f = 0; f < nfree; f++) {
        const int m = order[f];
        int t[PLAN_TEAM_MAX], best[PLAN_TEAM_MAX], best_k = 1;
        double best_f = owner_fit(cfg, &B, &mats[m], best);
        const int lim = cap > 1 ? team_limit(cfg, cap, &mats[m]) : 1;
        for (int k = 2; best_f > T && k <= lim; k *= 2) {
            const double fk = team_fit(cfg, &B, &mats[m], k, t);
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
        charge(cfg, &mats[m], best_k, best, &B);
        T = max2(T, best_f);
    }
    double wa, ca, wb, cb;
    const double fa = latest(&A, members, &wa, &ca), fb = latest(&B, members, &wb, &cb);
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
    int *order = mem_malloc(sizeof(int) * (size_t)(n ? n : 1));
    double *comm = mem_calloc((size_t)members, sizeof(double));
    double *work = P->work;
    int nfree = 0;

    if (order == NULL || comm == NULL) {
        free(order);
        free(comm);
        return -1;
    }
    const double *base = cfg->base_load;
    const int base_later = base != NULL && cfg->move_cost > 0;
    double total = 0;
    for (int i = 0; i < members; i++) {
        work[i] = base != NULL && !base_later ? base[i] : 0.0;
        total += work[i];
    }
    for (int m = 0; m < n; m++) {
        total += mats[m].cost;
        P->team[m] = 1;
        P->owner[m] = whole_holder(&mats[m], members);
        if (P->owner[m] >= 0) {
            P->load[P->owner[m]] += mats[m].cost;
            work[P->owner[m]] += mats[m].cost;
        } else {
            order[nfree++] = m;
        }
    }
    const double mean = total / members;
    sort_mats = mats; /* qsort has no context argument in C11 */
    qsort(order, (size_t)nfree, sizeof(int), by_cost_desc);
    for (int f = 0; f < nfree; f++) {
        const int m = order[f]; /* held by none: matrices held whole are placed already */
        const int k = team_size(cfg, P->team_cap, &mats[m], mean);
        if (k > 1) {
            int *t = &P->team_of[(size_t)m * (size_t)P->team_cap];
            const double ar =
                cfg->allreduce_cost * plan_team_allreduce_elems(mats[m].rows, mats[m].cols, k);
            const double per = plan_team_member_cost(cfg, mats[m].rows, mats[m].cols, k);
            team_place(cfg, work, per, k, t);
            /* member u performs its own block's FLOPs (what the runtime counts), but each
             * iteration's all-reduce waits for the widest block: its time is that one's */
            for (int u = 0; u < k; u++) {
                P->load[t[u]] +=
                    plan_ns_team_block_cost(mats[m].rows, mats[m].cols, k, u, !cfg->team_bf16);
                P->team_comm[t[u]] += ar;
                work[t[u]] += per;
            }
            P->owner[m] = t[0];
            P->team[m] = k;
            P->nteams++;
            continue;
        }
        int best = 0;
        int64_t best_held = plan_piece_count(&mats[m], 0);
        for (int i = 1; i < members; i++) {
            int64_t held = plan_piece_count(&mats[m], i);
            if (work[i] < work[best] || (work[i] == work[best] && held > best_held)) {
                best = i;
                best_held = held;
            }
        }
        P->owner[m] = best;
        P->load[best] += mats[m].cost;
        work[best] += mats[m].cost;
    }
    if (base_later)
        for (int i = 0; i < members; i++)
            work[i] += base[i];
    if (cfg->move_cost > 0)
        moves_assign(cfg, mats, n, P, order, comm);
    int rc = 0;
    if (cfg->refine_load != NULL && cfg->refine_cost > 0 && cfg->move_cost <= 0)
        rc = refine(cfg, mats, n, P, order);
    free(order);
    free(comm);
    return rc;
}

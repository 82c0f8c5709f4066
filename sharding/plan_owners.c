/* The planner's first half: who orthogonalizes each matrix of a group. LPT over the members
 * (on top of base_load, the other group's work), whole matrices kept by their holder unless a
 * move pays (move_cost), planned Newton-Schulz teams inside a node; and their cost helpers.
 * sharding/plan.c lays out the exchange for the owners chosen here. */
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

double plan_ns_team_cost(int64_t rows, int64_t cols, int k)
{
    double m = (double)(rows < cols ? rows : cols), n = (double)(rows < cols ? cols : rows);
    return 4.0 * m * m * n / (k > 1 ? k : 1) + 2.0 * m * m * m;
}

double plan_team_allreduce_elems(int64_t rows, int64_t cols, int k)
{
    double m = (double)(rows < cols ? rows : cols);
    return k > 1 ? 2.0 * (k - 1) / k * m * m : 0.0;
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
    int best = 1;
    double best_c = m->cost;
    for (int k = 2; k <= cap; k *= 2) {
        const double c = plan_ns_team_cost(m->rows, m->cols, k) +
                         cfg->allreduce_cost * plan_team_allreduce_elems(m->rows, m->cols, k);
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

/* After the LPT: a matrix held whole leaves its holder for the member that would finish first
 * with it (NS work, or the moves' transfers at move_cost per element; ties the lowest), when
 * that makes the later of the two finish sooner; heaviest matrices first, ties in matrix order.
 * A holder sheds matrices only while it is the later of the two, so a balanced group moves
 * nothing. */
static void moves_assign(const struct plan_cfg *cfg, const struct mat *mats, int n,
                         struct group_plan *P, const int *holder, int *order, double *comm)
{
    const int members = cfg->members;
    double *work = P->work;
    int nheld = 0;
    for (int m = 0; m < n; m++)
        if (holder[m] >= 0)
            order[nheld++] = m;
    sort_mats = mats;
    qsort(order, (size_t)nheld, sizeof(int), by_cost_desc);
    for (int f = 0; f < nheld; f++) {
        const int m = order[f], h = holder[m];
        const double c = mats[m].cost, s = cfg->move_cost * (double)(mats[m].rows * mats[m].cols);
        const double fh = max2(work[h], comm[h]), fh_after = max2(work[h] - c, comm[h] + s);
        int best = -1; /* the member that would finish first with it */
        double best_f = 0;
        for (int i = 0; i < members; i++) {
            const double fi = max2(work[i] + c, comm[i] + s);
            if (i != h && (best < 0 || fi < best_f)) {
                best = i;
                best_f = fi;
            }
        }
        if (best >= 0 && !(max2(fh_after, best_f) < max2(fh, max2(work[best], comm[best]))))
            best = -1;
        if (best < 0)
            continue;
        comm[h] += s;
        comm[best] += s;
        work[h] -= c;
        work[best] += c;
        P->load[h] -= c;
        P->load[best] += c;
        P->owner[m] = best;
        P->nmoved++;
    }
}

/* Owners: a member holding the whole matrix keeps it (no traffic) unless move_cost lets it go;
 * the rest by LPT onto the least-loaded member (base_load counted), ties toward the member
 * holding most of the matrix, then the lowest; teams for matrices too heavy for one member. */
int plan_owners_assign(const struct plan_cfg *cfg, const struct mat *mats, int n,
                       struct group_plan *P)
{
    const int members = cfg->members;
    int *order = mem_malloc(sizeof(int) * (size_t)(n ? n : 1));
    int *holder = mem_malloc(sizeof(int) * (size_t)(n ? n : 1));
    double *comm = mem_calloc((size_t)members, sizeof(double));
    double *work = P->work;
    int nfree = 0;

    if (order == NULL || holder == NULL || comm == NULL) {
        free(order);
        free(holder);
        free(comm);
        return -1;
    }
    double total = 0;
    for (int i = 0; i < members; i++) {
        work[i] = cfg->base_load != NULL ? cfg->base_load[i] : 0.0;
        total += work[i];
    }
    for (int m = 0; m < n; m++) {
        total += mats[m].cost;
        P->team[m] = 1;
        holder[m] = whole_holder(&mats[m], members);
        P->owner[m] = holder[m];
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
            const double c = plan_ns_team_cost(mats[m].rows, mats[m].cols, k);
            const double ar =
                cfg->allreduce_cost * plan_team_allreduce_elems(mats[m].rows, mats[m].cols, k);
            const double per = c + ar;
            team_place(cfg, work, per, k, t);
            for (int u = 0; u < k; u++) {
                P->load[t[u]] += c;
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
    if (cfg->move_cost > 0)
        moves_assign(cfg, mats, n, P, holder, order, comm);
    free(order);
    free(holder);
    free(comm);
    return 0;
}

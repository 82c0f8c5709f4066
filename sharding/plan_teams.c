/* Newton-Schulz teams inside the planner: their cost (plan.h's plan_ns_team_* and
 * plan_team_* functions), the first placement's team size and members (plan_owners.c's LPT), and
 * what a member carries under a placement, its work and its transfers, with the team or owner that
 * finishes first (the second placement, plan_owners.c's refine). */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"
#include "plan_mat.h"

static double max2(double a, double b) { return a > b ? a : b; }

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

/* The team size for a free matrix of cost c: 1, or the smallest power of two up to the cap (and
 * the node) whose per-member cost, all-reduce included, is under team_frac x the mean load, when
 * that is cheaper than one owner; none under it: the cheapest. */
int plan_team_size(const struct plan_cfg *cfg, int team_cap, const struct mat *m, double mean)
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

/* The k members of node [lo, hi) with the least work, in selection order (ties the lower index).
 */
static void node_pick(const double *work, int lo, int hi, int k, int *tmp)
{
    for (int cnt = 0; cnt < k; cnt++) { /* selection: the next least-loaded not yet taken */
        int pick = -1;
        for (int i = lo; i < hi; i++) {
            int taken = 0;
            for (int u = 0; u < cnt; u++)
                taken |= tmp[u] == i;
            if (!taken && (pick < 0 || work[i] < work[pick]))
                pick = i;
        }
        tmp[cnt] = pick;
    }
}

void plan_node_sort(const struct plan_cfg *cfg, const double *work, int node, double *sorted)
{
    const int G = cfg->node_members, lo = node * G;
    const int hi = lo + G < cfg->members ? lo + G : cfg->members;
    for (int i = lo; i < hi; i++) { /* insertion: a node holds a few members */
        const double w = work[i];
        int b = i;
        for (; b > lo && sorted[b - 1] > w; b--)
            sorted[b] = sorted[b - 1];
        sorted[b] = w;
    }
}

/* Team of k for matrix m: in each node the k members with the least work (ties the lower index);
 * the node whose team would finish first (ties the lower node). Writes the members, lead first
 * (the lowest index of the team). A node's team finishes at its k-th least work + per (x + per
 * never decreases with x, so the max over the team is that), which `sorted` gives each node
 * without the selection; the selection then runs in the chosen node only (16,384 GPUs: the
 * selection in all 2,048 nodes for every team took most of the planning time). */
void plan_team_place(const struct plan_cfg *cfg, const double *work, const double *sorted,
                     double per, int k, int *out)
{
    const int G = cfg->node_members, nodes = (cfg->members + G - 1) / G;
    double best_f = 0;
    int tmp[PLAN_TEAM_MAX], found = -1;
    for (int j = 0; j < nodes; j++) {
        const int lo = j * G, hi = lo + G < cfg->members ? lo + G : cfg->members;
        if (hi - lo < k)
            continue;
        double f;
        if (sorted != NULL) {
            f = sorted[lo + k - 1] + per;
        } else {
            node_pick(work, lo, hi, k, tmp);
            f = 0;
            for (int t = 0; t < k; t++)
                f = max2(f, work[tmp[t]] + per);
        }
        if (found < 0 || f < best_f) {
            found = j;
            best_f = f;
        }
    }
    if (found < 0) /* no node has k members (plan_team_size keeps k within one) */
        return;
    const int lo = found * G, hi = lo + G < cfg->members ? lo + G : cfg->members;
    node_pick(work, lo, hi, k, out);
    for (int a = 1; a < k; a++) /* ascending: the lead is the lowest index */
        for (int b = a; b > 0 && out[b] < out[b - 1]; b--) {
            int x = out[b];
            out[b] = out[b - 1];
            out[b - 1] = x;
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
int plan_team_limit(const struct plan_cfg *cfg, int team_cap, const struct mat *m)
{
    const int cap0 = team_cap < cfg->node_members ? team_cap : cfg->node_members;
    const int cap = cap0 < cfg->members ? cap0 : cfg->members;
    const int64_t side = m->rows < m->cols ? m->rows : m->cols;
    return side > 0 && side > (int64_t)INT_MAX / side ? 1 : cap;
}

void plan_team_member_load(const struct plan_cfg *cfg, const struct mat *m, int k, int u,
                           double *flops, double *ar)
{
    *flops = plan_ns_team_block_cost(m->rows, m->cols, k, u, !cfg->team_bf16);
    *ar = cfg->allreduce_cost * plan_team_allreduce_elems(m->rows, m->cols, k);
}

/* Matrix m owned by t[0] alone (k = 1) or by the team t[0..k), member u taking block u: add
 * what its owners then do to c. Every holder's piece is counted already as sent (refine), so an
 * owner's transfers change by its matrix (or block) less twice its piece of it. */
void plan_charge(const struct plan_cfg *cfg, const struct mat *m, int k, const int *t,
                 struct plan_carry *c)
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
    const double per = plan_team_member_cost(cfg, m->rows, m->cols, k);
    for (int u = 0; u < k; u++) {
        if (c->load != NULL) {
            double flops, ar;
            plan_team_member_load(cfg, m, k, u, &flops, &ar);
            c->load[t[u]] += flops;
            c->team_comm[t[u]] += ar;
        }
        c->work[t[u]] += per;
        c->comm[t[u]] += rc * (double)(block_elems(m, k, u) - 2 * block_overlap(m, k, u, t[u]));
    }
}

/* The latest finish of a placement, max over members of max(work, comm); *work and *comm: the
 * latest of each. */
double plan_latest(const struct plan_carry *c, int members, double *work, double *comm)
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
double plan_team_fit(const struct plan_cfg *cfg, const struct plan_carry *c, const struct mat *m,
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
double plan_owner_fit(const struct plan_cfg *cfg, const struct plan_carry *c, const struct mat *m,
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

int plan_scratch_alloc(struct group_plan *S, int n, int members, int cap)
{
    const size_t nn = (size_t)(n ? n : 1), mm = (size_t)members;
    S->owner = mem_malloc(sizeof(int) * nn * (size_t)(2 + cap));
    S->load = mem_malloc(sizeof(double) * mm * 3);
    if (S->owner == NULL || S->load == NULL) {
        plan_scratch_free(S);
        return -1;
    }
    S->team = S->owner + nn;
    S->team_of = S->owner + 2 * nn;
    S->work = S->load + mm;
    S->team_comm = S->load + 2 * mm;
    return 0;
}

void plan_scratch_free(struct group_plan *S)
{
    free(S->owner);
    free(S->load);
    S->owner = S->team = S->team_of = NULL;
    S->load = S->work = S->team_comm = NULL;
}

/* LPT over the union of both groups' matrices (plan_union.h). A min segment tree over the dense
 * members laid out group by group, so that an expert shard group is one range of leaves and each
 * pick is O(log members): 16,384 members and 17,664 expert matrices plan in milliseconds. */
#include "plan_union.h"

#include <stdlib.h>

#include "base/mem.h"
#include "plan.h"

struct tree {
    int size;
    int *best;    /* [2 * size]: the position of the least leaf under each node, -1 none */
    double *load; /* [size] by position */
    int *member;  /* [size]: the member at each position */
};

static int better(const struct tree *t, int a, int b)
{
    if (a < 0 || b < 0)
        return a < 0 ? b : a;
    if (t->load[a] != t->load[b])
        return t->load[a] < t->load[b] ? a : b;
    return t->member[a] < t->member[b] ? a : b;
}

/* The least leaf in positions [lo, hi) */
static int tree_min(const struct tree *t, int lo, int hi)
{
    int r = -1;
    for (lo += t->size, hi += t->size; lo < hi; lo /= 2, hi /= 2) {
        if (lo & 1)
            r = better(t, r, t->best[lo++]);
        if (hi & 1)
            r = better(t, r, t->best[--hi]);
    }
    return r;
}

/* qsort has no context argument in C11: the costs reach the comparator through this, one per
 * thread, so that two runtimes committing in two threads at once each sort their own */
static _Thread_local const double *sort_cost;

/* heaviest first, ties in the union's order: the same on every rank */
static int by_cost_desc(const void *a, const void *b)
{
    const int64_t i = *(const int64_t *)a, j = *(const int64_t *)b;
    if (sort_cost[i] != sort_cost[j])
        return sort_cost[i] > sort_cost[j] ? -1 : 1;
    return i < j ? -1 : i > j;
}

int plan_union_owners(const double *cost, const int *group, int64_t n, int members,
                      const int *member_group, int ngroups, const double *base, int *owner,
                      double *load)
{
    if (members < 1 || ngroups < 1)
        return -1;
    struct tree t = {.size = 1};
    while (t.size < members)
        t.size *= 2;
    int64_t *order = mem_malloc(sizeof(int64_t) * (size_t)(n > 0 ? n : 1));
    int *first = mem_calloc((size_t)ngroups + 1, sizeof(int)); /* each group's first position */
    t.best = mem_malloc(sizeof(int) * 2 * (size_t)t.size);
    t.load = mem_calloc((size_t)t.size, sizeof(double));
    t.member = mem_malloc(sizeof(int) * (size_t)t.size);
    int rc = order == NULL || first == NULL || t.best == NULL || t.load == NULL || !t.member;
    for (int d = 0; !rc && d < members; d++) { /* counting sort of the members by group */
        const int e = member_group != NULL ? member_group[d] : d % ngroups;
        rc = e < 0 || e >= ngroups;
        if (!rc)
            first[e + 1]++;
    }
    for (int e = 0; !rc && e < ngroups; e++) {
        rc = first[e + 1] == 0;
        first[e + 1] += first[e];
    }
    for (int64_t m = 0; !rc && m < n; m++)
        rc = group[m] >= ngroups;
    if (rc) {
        free(order);
        free(first);
        free(t.best);
        free(t.load);
        free(t.member);
        return -1;
    }
    for (int d = 0; d < members; d++) { /* ascending within each group */
        const int e = member_group != NULL ? member_group[d] : d % ngroups;
        t.load[first[e]] = base != NULL ? base[d] : 0.0;
        t.member[first[e]++] = d;
    }
    for (int e = ngroups; e > 0; e--) /* back to each group's first position */
        first[e] = first[e - 1];
    first[0] = 0;
    for (int64_t m = 0; m < n; m++)
        order[m] = m;
    sort_cost = cost;
    qsort(order, (size_t)n, sizeof *order, by_cost_desc);
    for (int i = 0; i < 2 * t.size; i++)
        t.best[i] = i >= t.size && i - t.size < members ? i - t.size : -1;
    for (int i = t.size - 1; i >= 1; i--)
        t.best[i] = better(&t, t.best[2 * i], t.best[2 * i + 1]);
    for (int64_t f = 0; f < n; f++) {
        const int64_t m = order[f];
        const int e = group[m];
        if (cost[m] < 0) { /* heaviest first: the team matrices sort last */
            owner[m] = -1;
            continue;
        }
        const int pos = e < 0 ? tree_min(&t, 0, members) : tree_min(&t, first[e], first[e + 1]);
        owner[m] = t.member[pos];
        t.load[pos] += cost[m];
        for (int i = (pos + t.size) / 2; i >= 1; i /= 2)
            t.best[i] = better(&t, t.best[2 * i], t.best[2 * i + 1]);
    }
    for (int pos = 0; pos < members; pos++)
        load[t.member[pos]] = t.load[pos];
    free(order);
    free(first);
    free(t.best);
    free(t.load);
    free(t.member);
    return 0;
}

void plan_union_costs(const struct group_plan *g, double *cost)
{
    for (int m = 0; m < g->nmatrices; m++)
        cost[m] = g->team[m] > 1 ? -1.0 : g->cost[m];
}

/* LPT over the union of both groups' Muon matrices (plan_union.h): the baseline issue 22 names for
 * the joint plan, which plans each expert shard group first and then the dense group on top of
 * each rank's expert load (bench/plan_model.c, as runtime/commit.c does). Only the tool computes
 * it, to measure the joint plan against it (docs/scaling.md, joint planning). */
#include "bench/plan_union.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/dtype.h"
#include "kernels/ns_coeffs.h"
#include "kernels/ns_variant.h"
#include "kernels/ops.h"
#include "runtime/classify.h"
#include "sharding/ns_strategy.h"
#include "sharding/plan.h"
#include "shardopt.h"

/* One matrix of the union: its cost and the ranks it may go to (group < 0: every rank). */
struct umat {
    double cost;
    int group;
    int64_t index; /* matrix order: tensor, EP rank, expert */
};

static int by_cost_desc(const void *a, const void *b)
{
    const struct umat *x = a, *y = b;
    if (x->cost != y->cost)
        return x->cost > y->cost ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

/* The planner's cost of one rows x cols matrix (sharding/plan.c's plan_build), with Gram where
 * --ns-algorithm gram, or auto and the committed rule picks it, its restarts as commit takes them
 * for --ns-compute's dtype (bench/plan_model.c's gram_restarts and auto_gram) */
static double mat_cost(const struct opts *o, int64_t rows, int64_t cols)
{
    float coeffs[NS_TABLE_MAX_STEPS][3];
    const int dtype = o->ns_compute < 0 ? KDT_BF16 : o->ns_compute;
    int gram = o->ns_algo == 1;
    if (o->ns_algo != 0 && ns_coeffs_fill(o->ns_table, o->ns_steps, NULL, coeffs) != 0)
        gram = 0;
    else if (o->ns_algo == 2)
        gram = ns_algorithm_for_shape(rows, cols, dtype, (const float(*)[3])coeffs, o->ns_steps) ==
               NS_ALGO_GRAM;
    if (!gram)
        return plan_ns_cost(rows, cols);
    const uint32_t restarts =
        ns_coeffs_gram_restarts_for((const float(*)[3])coeffs, o->ns_steps, rows, cols, dtype);
    return plan_ns_flops(rows, cols, o->ns_steps, 1, restarts) / o->ns_steps;
}

/* A min segment tree over the ranks in group order (position e * xs + j holds rank j * ep + e),
 * so that a group is one range: its leaves' (load, rank), least load first, ties the lower rank */
struct tree {
    int size;
    int *best;    /* [2 * size]: the position of the least leaf under each node, -1 none */
    double *load; /* [size] by position */
    int *rank;    /* [size] by position */
};

static int better(const struct tree *t, int a, int b)
{
    if (a < 0 || b < 0)
        return a < 0 ? b : a;
    if (t->load[a] != t->load[b])
        return t->load[a] < t->load[b] ? a : b;
    return t->rank[a] < t->rank[b] ? a : b;
}

static void tree_update(struct tree *t, int pos)
{
    for (int i = (pos + t->size) / 2; i >= 1; i /= 2)
        t->best[i] = better(t, t->best[2 * i], t->best[2 * i + 1]);
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

int plan_union_lpt(const struct opts *o, const struct preset *p, const struct prediction *r,
                   double *max, double *mean)
{
    const int dense = r->dense, ep = r->ep, xs = r->xs;
    int64_t n = 0;
    for (int i = 0; i < p->n; i++) { /* the matrices: each EP rank's share of every stack */
        const struct preset_tensor *t = &p->t[i];
        if (classify_auto_is_muon(t->name, t->ndim, t->shape, SHARDOPT_DEFAULT_ADAMW_PATTERNS))
            n += (t->ndim == 3 ? t->shape[0] / ep : 1) * (t->expert ? ep : 1);
    }
    struct umat *u = malloc(sizeof *u * (size_t)(n ? n : 1));
    struct tree t = {.size = 1};
    while (t.size < dense)
        t.size *= 2;
    t.best = malloc(sizeof(int) * 2 * (size_t)t.size);
    t.load = calloc((size_t)t.size, sizeof(double));
    t.rank = malloc(sizeof(int) * (size_t)t.size);
    if (u == NULL || t.best == NULL || t.load == NULL || t.rank == NULL) {
        free(u);
        free(t.best);
        free(t.load);
        free(t.rank);
        return -1;
    }
    n = 0;
    for (int i = 0; i < p->n; i++) {
        const struct preset_tensor *s = &p->t[i];
        if (!classify_auto_is_muon(s->name, s->ndim, s->shape, SHARDOPT_DEFAULT_ADAMW_PATTERNS))
            continue;
        const int64_t k_count = s->ndim == 3 ? s->shape[0] / ep : 1; /* as plan_model.c's */
        const double c = mat_cost(o, s->shape[s->ndim - 2], s->shape[s->ndim - 1]);
        for (int e = 0; e < (s->expert ? ep : 1); e++)
            for (int64_t k = 0; k < k_count; k++, n++)
                u[n] = (struct umat){.cost = c, .group = s->expert ? e : -1, .index = n};
    }
    qsort(u, (size_t)n, sizeof *u, by_cost_desc);
    for (int i = 0; i < 2 * t.size; i++)
        t.best[i] = i >= t.size && i - t.size < dense ? i - t.size : -1;
    for (int pos = 0; pos < dense; pos++)
        t.rank[pos] = (pos % xs) * ep + pos / xs;
    for (int i = t.size - 1; i >= 1; i--)
        t.best[i] = better(&t, t.best[2 * i], t.best[2 * i + 1]);
    double sum = 0;
    for (int64_t m = 0; m < n; m++) {
        const int pos = u[m].group < 0 ? tree_min(&t, 0, dense)
                                       : tree_min(&t, u[m].group * xs, (u[m].group + 1) * xs);
        t.load[pos] += u[m].cost;
        sum += u[m].cost;
        tree_update(&t, pos);
    }
    *max = 0;
    for (int pos = 0; pos < dense; pos++)
        *max = t.load[pos] > *max ? t.load[pos] : *max;
    *mean = sum / dense;
    free(u);
    free(t.best);
    free(t.load);
    free(t.rank);
    return 0;
}

void plan_union_json(const struct opts *o, const struct preset *p, const struct machine *mc,
                     const struct prediction *r)
{
    double max, mean;
    if (o->ns_strategy != NS_MODE_GATHER)
        return;
    if (plan_union_lpt(o, p, r, &max, &mean) != 0)
        plan_model_die("out of memory");
    /* at the machine's NS rate, ranks taking turns on the cores as plan_model.c's t_ns does */
    double t = max * o->ns_steps / (mc->gemm_tflops * 1e12 * mc->ns_fraction);
    if (mc->slots > 0 && r->world > mc->slots)
        t *= (double)r->world / mc->slots;
    printf(", \"union_lpt_ns_max\": %.17g, \"union_lpt_ns_mean\": %.17g, \"union_lpt_max_mean\": "
           "%.6f, \"union_lpt_t_ns\": %.6e, \"t_ns_over_union_lpt\": %.6f",
           max * o->ns_steps, mean * o->ns_steps, mean > 0 ? max / mean : 1.0, t,
           t > 0 ? r->t_ns / t : 1.0);
}

/* LPT over the union of both groups' Muon matrices (plan_union.h): the baseline issue 22 names for
 * the joint plan, which plans each expert shard group first and then the dense group on top of
 * each rank's expert load (bench/plan_model.c, as runtime/commit.c does). sharding/plan_union.c's
 * LPT on the list commit builds (runtime/commit_union.c), so that it is the U commit considers and
 * keeps where U finishes first (bench/plan_model_union.c); reported whatever was kept
 * (docs/scaling.md, joint planning). */
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
#include "sharding/plan_union.h"
#include "shardopt.h"

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

int plan_union_lpt(const struct opts *o, const struct preset *p, const struct prediction *r,
                   double *max, double *mean)
{
    const int dense = r->dense, ep = r->ep;
    int64_t n = 0;
    for (int i = 0; i < p->n; i++) { /* the matrices: each EP rank's share of every stack */
        const struct preset_tensor *t = &p->t[i];
        if (classify_auto_is_muon(t->name, t->ndim, t->shape, SHARDOPT_DEFAULT_ADAMW_PATTERNS))
            n += (t->ndim == 3 ? t->shape[0] / ep : 1) * (t->expert ? ep : 1);
    }
    double *cost = malloc(sizeof(double) * (size_t)(n ? n : 1));
    double *load = calloc((size_t)dense, sizeof(double));
    int *group = malloc(sizeof(int) * (size_t)(n ? n : 1));
    int *owner = malloc(sizeof(int) * (size_t)(n ? n : 1));
    int rc = cost == NULL || load == NULL || group == NULL || owner == NULL ? -1 : 0;
    /* the union's order, commit's (runtime/commit_union.c): the dense group's matrices in its
     * plan's matrix order (tensors in order), then EP rank 0's expert matrices in theirs, EP rank
     * 1's, ...; rank d in group d % ep (plan_union_owners' NULL member_group) */
    n = 0;
    for (int e = -1; rc == 0 && e < ep; e++)
        for (int i = 0; i < p->n; i++) {
            const struct preset_tensor *s = &p->t[i];
            if ((e < 0) == s->expert ||
                !classify_auto_is_muon(s->name, s->ndim, s->shape, SHARDOPT_DEFAULT_ADAMW_PATTERNS))
                continue;
            const int64_t k_count = s->ndim == 3 ? s->shape[0] / ep : 1; /* as plan_model.c's */
            const double c = mat_cost(o, s->shape[s->ndim - 2], s->shape[s->ndim - 1]);
            for (int64_t k = 0; k < k_count; k++, n++)
                cost[n] = c, group[n] = e;
        }
    if (rc == 0)
        rc = plan_union_owners(cost, group, n, dense, NULL, ep, NULL, owner, load);
    double sum = 0;
    *max = 0;
    for (int64_t m = 0; rc == 0 && m < n; m++)
        sum += cost[m];
    for (int d = 0; rc == 0 && d < dense; d++)
        *max = load[d] > *max ? load[d] : *max;
    *mean = sum / dense;
    free(cost);
    free(load);
    free(group);
    free(owner);
    return rc;
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

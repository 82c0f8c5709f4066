/* shardopt-plan's --teams as commit sets each group's plan_cfg (teams' dtype and rates, cap, node,
 * the expert groups' guard): kept apart from the step's model (plan_model.c), which calls them. */
#include "bench/plan_model.h"
#include "kernels/dtype.h"
#include "sharding/plan.h"

void plan_model_team_cfg(const struct opts *o, const struct machine *mc, struct plan_cfg *cfg)
{
    /* Teams iterate in bf16 as runtime/commit.c's teams_setup resolves team_compute: bf16
     * with --ns-compute bf16 (the CPU's bf16 teams) and device (ns_compute resolves to bf16 on the
     * CUDA backend, whose table has the bf16 team entries, runtime/step/ns_sharded.c: a bf16 Gram
     * all-reduce, A^2 formed on every block); fp32 with --ns-compute fp32. Before issue 22's device
     * teams the tool priced device teams as fp32 ones. */
    /* Gram elements at commit's rates (--cost-rates), or at the node's link rate */
    const int c = o->cost_gflops > 0;
    plan_cfg_team_dtype(cfg, o->ns_compute != KDT_F32,
                        c ? o->cost_gflops : mc->gemm_tflops * 1e12 * mc->ns_fraction,
                        c ? o->cost_gbps : mc->intra_gbps * 1e9);
}

/* --teams on a group of `members` ranks, `node` a node, as commit sets each group's plan_cfg
 * (guard: team_guard, 1 for an expert shard group) */
void plan_model_teams_cfg(const struct opts *o, const struct machine *mc, int members, int node,
                          int guard, struct plan_cfg *cfg)
{
    cfg->team_guard = guard;
    cfg->team_cap = o->teams > 0 ? o->teams : mc->gpus_per_node; /* node: one node's ranks */
    cfg->node_members = members < node ? members : node;
    cfg->team_frac = o->team_frac;
    plan_model_team_cfg(o, mc, cfg);
}

/* The fewest members of EP rank 0's expert shard group (dense ranks 0, ep, 2ep, ...) sharing a
 * node, as commit finds them (commit_teams_node_members): G / ep, or 1 where ep >= G. */
int plan_model_expert_node_members(const struct machine *mc, int dense, int ep)
{
    const int G = mc->gpus_per_node;
    int fewest = dense;
    for (int lo = 0; lo < dense; lo += G) {
        int n = 0;
        for (int d = lo; d < lo + G && d < dense; d++)
            n += d % ep == 0;
        fewest = n > 0 && n < fewest ? n : fewest;
    }
    return fewest;
}

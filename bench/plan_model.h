/* shardopt-plan's model of a step (plan_model.c): a machine file's rates (plan_machine.c), the
 * options the model reads, and what one layout does per rank. The tool around it: shardopt_plan.c.
 */
#ifndef BENCH_PLAN_MODEL_H
#define BENCH_PLAN_MODEL_H

#include <stddef.h>

#include "bench/preset.h"

#define NS_STEPS 5
#define COMM_ES  2 /* bf16 Newton-Schulz input and output (comm_dtype default) */

struct machine {
    char name[64];
    double gemm_tflops, ns_fraction, hbm_gbps, intra_gbps, inter_gbps, host_link_gbps,
        host_mem_gbps;
    int gpus_per_node;
    int slots; /* > 0: ranks that run at full rate at once (calibrated CPU: cores / threads) */
};

struct opts {
    const char *preset, *machine, *sweep, *calibrate;
    int threads;
    struct preset_scale scale;
    int world, nodes, gpn, rep, shard, cp, ep, xdim, json;
    int mom_es, adam_es;
    const char *offload;
    int ns_algo;     /* 0 standard, 1 gram, 2 auto (kernels/ns_variant.h's table, bf16) */
    int ns_steps;    /* 5, or 4 with --ns-precondition aol (the aol table) */
    int ns_table;    /* the coefficient table: quintic, or aol with --ns-precondition aol */
    int ns_compute;  /* --ns-compute: -1 device (every product whole), KDT_F32 or KDT_BF16 (the
                        CPU kernels, their symmetric variants per kernels/ns_variant.h) */
    int ns_strategy; /* --ns-strategy: sharding/ns_strategy.h's NS_MODE_* (CPU kernels only) */
    int joint;       /* the dense owners balanced on top of the expert loads (commit does) */
    int moves;       /* planner only: whole experts may move to light members */
    int teams;       /* planner only: largest Newton-Schulz team (1: none, as commit plans) */
    double team_frac;
    double cost_gflops, cost_gbps; /* --cost-rates: the runtime's cost_gemm_gflops and
                                      cost_net_gbps for --moves instead of the machine's */
};

/* What one layout does, per rank. */
struct prediction {
    int world, rep, shard, cp, ep, dense, xs;
    double flops_max, flops_mean; /* NS FLOPs per step the kernels perform (ns_flops_performed) */
    double dense_imbalance, expert_imbalance; /* owned NS FLOPs max/mean in each group */
    double dense_bytes, expert_bytes;         /* sent per step by the busiest rank, each group */
    double state_bytes;                       /* max over ranks */
    double mom_bytes, adam_bytes;             /* that rank's state by kind */
    double h2d_bytes;                         /* per step, = d2h */
    double t_ns, t_comm, t_elem, step;        /* seconds */
    double t_perfect;  /* every matrix's NS once, spread evenly over the ranks */
    double team_bytes; /* sent per step in team all-reduces by the busiest rank */
    int dense_internode, nteams, team_max, nmoved;
    int xteams;        /* of nteams, the expert shard groups' (every group's, summed) */
    int team_sizes[6]; /* matrices with a team of 2, 4, ..., 64 (both groups) */
};

/* Print "shardopt-plan: msg" and exit 2. */
void plan_model_die(const char *msg);

/* The machine file at path into *m; a file that does not read, or a rate missing or not > 0,
 * ends the tool (exit 2) naming it. */
void plan_model_machine_load(const char *path, struct machine *m);

/* The dense group's team cost as the tool plans it (plan_cfg's team_bf16 and allreduce_cost): the
 * dtype the runtime's teams iterate in for --ns-compute (bf16 for device and bf16, fp32 for
 * fp32), its Gram element at --cost-rates or at the machine's NS rate over the node's link rate,
 * set by sharding/plan.h's plan_cfg_team_dtype as runtime/commit.c sets its own. */
struct plan_cfg;
void plan_model_team_cfg(const struct opts *o, const struct machine *mc, struct plan_cfg *cfg);

/* --teams on a group of `members` ranks, `node` a node, as commit sets each group's plan_cfg
 * (guard: team_guard, 1 for an expert shard group); bench/plan_model_teams.c */
void plan_model_teams_cfg(const struct opts *o, const struct machine *mc, int members, int node,
                          int guard, struct plan_cfg *cfg);

/* The fewest members of EP rank 0's expert shard group sharing a node, as commit finds them */
int plan_model_expert_node_members(const struct machine *mc, int dense, int ep);

/* What the layout of `world` ranks the options describe does, per rank, into *r: 0, or -1 with
 * err (errlen bytes) saying why the layout is refused. */
int plan_model_predict(const struct opts *o, const struct preset *p, const struct machine *mc,
                       int world, struct prediction *r, char *err, size_t errlen);

#endif

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
    double joint_step; /* the joint plan's step (= step unless the union plan is kept) */
    double t_perfect;  /* every matrix's NS once, spread evenly over the ranks */
    double team_bytes; /* sent per step in team all-reduces by the busiest rank */
    int dense_internode, nteams, team_max, nmoved;
    int xteams;        /* of nteams, the expert shard groups' (every group's, summed) */
    int team_sizes[6]; /* matrices with a team of 2, 4, ..., 64 (both groups) */
    /* The union plan (plan_model_union.c), as commit decides it: 1 kept, 0 the joint plan kept,
     * -1 not considered (--no-joint); each plan's model finish in the planner's cost units (NS
     * FLOPs per iteration, products whole), the later of the busiest member's work and
     * elem_cost x (the busiest dense sender's exchange elements + the busiest expert sender's) */
    int union_plan;
    double joint_finish, union_finish;
};

/* What one group's plan gives each member (arrays indexed by member, added to). */
struct group_out {
    double *flops;   /* owned NS FLOPs per iteration (a team member: its share) */
    double *bytes;   /* sent per step in the group's exchanges */
    double *owned;   /* bytes of the matrices it orthogonalizes (a team member: its block) */
    double *tbytes;  /* sent per step in its teams' and sharded matrices' Gram all-reduces (fp32) */
    double *tcomm;   /* or NULL: the plan's team_comm (the all-reduces in its cost units) */
    double *real;    /* NS FLOPs per step its kernels perform (performed_flops) */
    double *sharded; /* of those, the sharded strategy's (every product whole), per step */
    double whole;    /* NS FLOPs per iteration of the group's matrices, each orthogonalized once */
    int nteams, nmoved, kmax;
    int by_size[7];          /* teams of 2^(i+1) members, i < 6 (PLAN_TEAM_MAX = 64) */
    struct group_plan *plan; /* or NULL: receives the group's plan (as member 0 builds it; the
                                caller plan_frees it; all zero when the group plans no matrix) */
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
struct group_plan;
void plan_model_team_cfg(const struct opts *o, const struct machine *mc, struct plan_cfg *cfg);

/* --teams on a group of `members` ranks, `node` a node, as commit sets each group's plan_cfg
 * (guard: team_guard, 1 for an expert shard group); bench/plan_model_teams.c */
void plan_model_teams_cfg(const struct opts *o, const struct machine *mc, int members, int node,
                          int guard, struct plan_cfg *cfg);

/* The fewest members of EP rank 0's expert shard group sharing a node, as commit finds them */
int plan_model_expert_node_members(const struct machine *mc, int dense, int ep);

/* Plan one group (dense tensors, or an EP rank's experts in EP rank 0's coordinates: every
 * group has its shapes) of `members` with the joint settings in `extra` (base loads, moves,
 * teams, fixed owners; sharding/plan.h) and add what each member does to `out`. skip[i] non-NULL:
 * tensor i is AdamW's. */
void plan_model_group_cost(const struct preset *p, const char *const *skip, int expert, int members,
                           int ep, int xdim, const struct opts *o, const struct plan_cfg *extra,
                           struct group_out *out);

/* The union plan after the joint passes, as runtime/commit_union.c decides it: U = LPT over the
 * union (sharding/plan_union.h) of the matrices the joint plan gives one owner (the dense plan
 * jd's, then EP rank 0's experts (jx[0]), 1's, ..., at the plans' costs), around the teams the
 * joint plan formed (kept, their blocks each member's starting load: group_plan.team_load, with
 * teams on), its plans built with plan_cfg.fixed_owner and fixed_teams (the dense group's on
 * dcfg, each expert group's on xcfg), kept iff its finish is earlier than the joint plan's by
 * more than 1e-12 relative (a plan's finish: the later of its busiest member's work and elem_cost
 * x the busiest dense and the busiest expert sender's exchange elements summed, the step's t_comm).
 * dj and xj: per dense member d, the joint plan's dense and expert work (flops = the plan's load,
 * tcomm its team_comm, bytes as sent; the expert ones of group d % ep, member d / ep), replaced
 * by U's when kept, r's team counts then U's and nothing moved. Sets r->union_plan,
 * joint_finish and union_finish; returns r->union_plan. Ends the tool (exit 2) when out of
 * memory. */
int plan_model_union(const struct opts *o, const struct preset *p, const char *const *skip,
                     struct prediction *r, double elem_cost, const struct plan_cfg *dcfg,
                     const struct plan_cfg *xcfg, const struct group_plan *jd,
                     const struct group_plan *const *jx, struct group_out *dj,
                     struct group_out *xj);

/* What the layout of `world` ranks the options describe does, per rank, into *r: 0, or -1 with
 * err (errlen bytes) saying why the layout is refused. */
int plan_model_predict(const struct opts *o, const struct preset *p, const struct machine *mc,
                       int world, struct prediction *r, char *err, size_t errlen);

#endif

/* commit: check the registration on every rank, plan the exchanges, lay out state and buffers.
 * Everything the step needs is allocated here, so the step itself allocates nothing. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/mem.h"
#include "base/status.h"
#include "kernels/cpu/ns_bf16.h"
#include "kernels/lr_scale.h"
#include "kernels/ns_coeffs.h"
#include "kernels/ns_variant.h"
#include "kernels/ops.h"
#include "runtime/classify.h"
#include "runtime/comm/comm_wait.h"
#include "runtime/commit_buffers.h"
#include "runtime/commit_check.h"
#include "runtime/commit_teams.h"
#include "runtime/commit_union.h"
#include "runtime/config/config_cost.h"
#include "runtime/runtime.h"
#include "runtime/step/ns_sharded_sum.h"
#include "runtime/step/offload_exec.h"
#include "runtime/step/replica_check.h"
#include "sharding/ns_strategy.h"

/* Reserve this parameter's state slices; fill the Muon geometry. */
static void param_plan(shardopt_runtime_t rt, struct shardopt_param *p)
{
    const size_t n = (size_t)p->layout.local_numel;

    layout_index_runs(&p->layout, &p->index_map.base, &p->index_map.run, &p->index_map.stride);
    if (p->algo == SHARDOPT_ALGO_ADAMW) {
        p->off_exp_avg = state_store_reserve(&rt->store, n * kdtype_size(rt->cfg.adam_state_dtype));
        p->off_exp_avg_sq = state_store_reserve(&rt->store, n * kdtype_size(rt->cfg.adam_v_dtype));
        return;
    }
    p->off_momentum = state_store_reserve(&rt->store, n * kdtype_size(rt->cfg.momentum_dtype));
    layout_matrix_view(&p->layout, p->transposed, &p->mv);
    if (rt_ns_on_device(rt))
        /* the device has a symmetric variant too (ns_driver.h), not yet measured on a GPU: the
         * plain one until ns_bench --backend cuda says where the other is faster */
        p->ns_variant = NS_VARIANT_PLAIN;
    else if (rt->ns_compute == KDT_BF16)
        p->ns_variant = ns_bf16_variant_for_shape(p->mv.rows, p->mv.cols, &p->ns_block);
    else if (rt->ns_ops == kernel_ops_cpu_ref())
        /* the reference forms every fp32 product whole (kernels/cpu/ns_ref.c): say so, as the
         * FLOPs the step counts follow the variant */
        p->ns_variant = NS_VARIANT_PLAIN;
    else
        p->ns_variant = ns_variant_for_shape(p->mv.rows, p->mv.cols);
    /* the device runs gram when asked (kernels/cuda/ns_driver.h); auto keeps standard there
     * until a GPU has measured where Gram pays, as for the symmetric variant above */
    p->ns_algorithm =
        rt->cfg.ns_algorithm == SHARDOPT_NS_ALGORITHM_GRAM ? NS_ALGO_GRAM
        : rt->cfg.ns_algorithm == SHARDOPT_NS_ALGORITHM_STANDARD || rt_ns_on_device(rt)
            ? NS_ALGO_STANDARD
            : ns_algorithm_for_shape(p->mv.rows, p->mv.cols, rt->ns_compute,
                                     (const float(*)[3])rt->ns_coeffs, rt->cfg.ns_steps);
    p->lr_scale = lr_scale_factor(rt->cfg.lr_scale, p->mv.true_rows, p->mv.true_cols);
}

/* Where p's Gram Newton-Schulz restarts (0 for standard), as the step's kernel and its count
 * (muon_exec.c) take it: from the table, the shape and the resolved ns_compute (bf16 on the CUDA
 * backend, whose driver restarts as bf16 does; fp32's schedule differs for quintic's 5 steps).
 * Every cost the planner sees is counted on it (sharding/plan.h, ns_restarts). */
static uint32_t gram_restarts(const struct shardopt_runtime *rt, const struct shardopt_param *p)
{
    return p->ns_algorithm == NS_ALGO_GRAM
               ? ns_coeffs_gram_restarts_for((const float(*)[3])rt->ns_coeffs, rt->cfg.ns_steps,
                                             p->mv.rows, p->mv.cols, rt->ns_compute)
               : 0u;
}

static double moves_elem_cost(shardopt_runtime_t rt);

/* The planner's view of the Muon tensors of one group kind. joint: NULL, or the joint planning
 * settings it takes from the other group (plan_cfg's base_load, move_cost and base_comm,
 * refine_load, refine_cost and refine_comm; docs/scaling.md). */
shardopt_status_t commit_group_plan(shardopt_runtime_t rt, enum group_kind kind,
                                    const struct shard_table *t, const struct plan_cfg *joint,
                                    struct group_exec *gx)
{
    const struct plan_cfg none = {0};
    if (joint == NULL)
        joint = &none;
    const shardopt_placement_t want = kind == GROUP_LOCAL   ? SHARDOPT_PLACEMENT_REPLICATED
                                      : kind == GROUP_DENSE ? SHARDOPT_PLACEMENT_DENSE
                                                            : SHARDOPT_PLACEMENT_EXPERT;
    const int members = kind == GROUP_LOCAL ? 1 : t->members;
    const char *name = kind == GROUP_DENSE ? "dense" : kind == GROUP_EXPERT ? "expert" : "local";
    const size_t np_cap = (size_t)(rt->nparams ? rt->nparams : 1);
    struct plan_param *pp = mem_malloc(sizeof(*pp) * np_cap);
    /* this rank's box of each parameter: the template of every member's (their boxes differ
     * from it along the shard dim only, where the planner reads each member's slice from the
     * shard table in place or computes it: sharding/shard_table.h) */
    struct plan_box *boxes = mem_malloc(sizeof(*boxes) * np_cap);
    /* the local group's one member holds the whole extent: the torch.chunk piece 0 of 1 */
    const struct shard_table local = {.members = 1, .nparams = rt->nparams};
    struct plan_cfg cfg = {.members = members,
                           .me = 0,
                           .bucket_bytes = rt->cfg.bucket_bytes,
                           .esize = kdtype_size(rt->cfg.comm_dtype),
                           .replicas = rt->cfg.replica_split ? rt->groups.mesh.dp_replicate : 1,
                           .ns_steps = rt->cfg.ns_steps,
                           .base_load = joint->base_load,
                           .move_cost = joint->move_cost,
                           .base_comm = joint->base_comm,
                           .refine_load = joint->refine_load,
                           .refine_cost = joint->refine_cost,
                           .refine_comm = joint->refine_comm,
                           .fixed_owner = joint->fixed_owner,
                           .fixed_teams = joint->fixed_teams,
                           .team_cap = 1 /* one owner per matrix, but below */};
    char err[256];
    int np = 0;
    shardopt_status_t status = SHARDOPT_OK, built = SHARDOPT_OK;

    if (kind != GROUP_LOCAL)
        MPI_Comm_rank(kind == GROUP_DENSE ? rt->groups.dense : rt->groups.xs, &cfg.me);
    if (kind != GROUP_LOCAL && rt->team_cap > 1) { /* Newton-Schulz teams (commit_teams.c) */
        cfg.team_cap = rt->team_cap;
        /* an expert shard group's members are ep dense ranks apart: fewer share a node */
        cfg.node_members = kind == GROUP_DENSE ? rt->team_node_members : rt->xs_team_node_members;
        /* teams there only where the group gains (tests may turn it off: runtime.h) */
        cfg.team_guard = kind == GROUP_EXPERT && !rt->xs_team_guard_off;
        /* ...its step, exchange counted (at the moves' element cost; shardopt-plan the same) */
        cfg.team_guard_cost = kind == GROUP_EXPERT ? moves_elem_cost(rt) : 0;
        cfg.team_frac = rt->cfg.ns_team_frac;
        /* a Gram element all-reduced (in the teams' dtype: ns_sharded.c) at cost_net_gbps, in
         * NS FLOPs at cost_gemm_gflops; bf16 teams form A^2 on every block (ns_sharded.c counts
         * them so). shardopt-plan prices its teams with the same call. */
        plan_cfg_team_dtype(&cfg, rt->team_compute == KDT_BF16, rt->cost_gflops, rt->cost_gbps);
    }
    if (pp == NULL || boxes == NULL) {
        built = SHARDOPT_ERR_OUT_OF_MEMORY;
        snprintf(err, sizeof err, "out of memory allocating %zu bytes for the planner's input",
                 (sizeof(*pp) + sizeof(*boxes)) * np_cap);
    }
    for (int i = 0; built == SHARDOPT_OK && i < rt->nparams; i++) {
        const struct shardopt_param *p = rt->params[i];
        if (p->algo != SHARDOPT_ALGO_MUON || p->placement != want || p->ns_sharded)
            continue;
        pp[np] = (struct plan_param){.param = i,
                                     .ns_gram = p->ns_algorithm == NS_ALGO_GRAM,
                                     .ns_restarts = gram_restarts(rt, p),
                                     .ns_transpose = p->mv.ns_transpose};
        shard_table_plan_param(kind == GROUP_LOCAL ? &local : t, i, &p->layout, &boxes[np],
                               &pp[np]);
        np++;
    }
    if (built == SHARDOPT_OK) {
        built = plan_build(&cfg, pp, np, &gx->plan);
        if (built != SHARDOPT_OK) /* plan.c's message, logged below with the rank and group */
            snprintf(err, sizeof err, "%s", shardopt_last_error());
    }
    free(pp);
    free(boxes);
    /* out of memory, or a bucket over an MPI count on this member only: agree before anyone
     * goes on to the next group's collectives */
    if (built != SHARDOPT_OK)
        status = log_fail(built, "commit: rank %d: planning the %s group: %s", rt->groups.me.rank,
                          name, err);
    status = groups_agree(&rt->groups, status, "commit");
    if (status != SHARDOPT_OK) {
        if (built == SHARDOPT_OK)
            plan_free(&gx->plan);
        return status;
    }
    gx->comm = kind == GROUP_LOCAL   ? MPI_COMM_NULL
               : kind == GROUP_DENSE ? rt->groups.dense
                                     : rt->groups.xs;
    return SHARDOPT_OK;
}

/* Each group's transport (runtime/comm/transport.h), once: NCCL where init made the group a
 * communicator, else MPI through the pinned mirrors when the buffers are device memory, else
 * MPI on the buffers. */
static void transports_pick(shardopt_runtime_t rt)
{
    const struct groups *g = &rt->groups;
    const struct {
        MPI_Comm comm;
        struct nccl_group *nccl;
        const char *name;
    } group[XPORTS] = {[GROUP_LOCAL] = {MPI_COMM_NULL, NULL, "local"},
                       [GROUP_DENSE] = {g->dense, rt->nccl[GROUP_DENSE], "dense"},
                       [GROUP_EXPERT] = {g->xs, rt->nccl[GROUP_EXPERT], "expert shard"},
                       [XPORT_REPLICATE] = {g->rep, rt->nccl_rep, "replicate"}};
    for (int i = 0; i < XPORTS; i++)
        transport_pick(&rt->xport[i], g, group[i].comm, group[i].name, group[i].nccl,
                       rt_on_device(rt), rt->dev, &rt->kctx, rt->cfg.comm_dtype);
}

shardopt_status_t commit_loads_gather(shardopt_runtime_t rt, double mine, MPI_Comm comm,
                                      int members, double **out, const char *loads,
                                      const char *group)
{
    const size_t bytes = sizeof(double) * (size_t)members;
    shardopt_status_t status = SHARDOPT_OK;
    char what[64];

    *out = mem_malloc(bytes);
    if (*out == NULL)
        status = log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                          "commit: rank %d: out of memory allocating %zu bytes for the %s loads of "
                          "the %s group",
                          rt->groups.me.rank, bytes, loads, group);
    status = groups_agree(&rt->groups, status, "commit");
    if (status == SHARDOPT_OK) {
        snprintf(what, sizeof what, "all-gather of %s loads", loads);
        const int rc = comm_allgather(&rt->groups, comm, &mine, 1, MPI_DOUBLE, *out, what);
        status = commit_mpi_agree(rt, rc, "%s", what);
    }
    if (status != SHARDOPT_OK) {
        /* this rank's array, where another rank ran out: dense_refine's is its caller's own */
        free(*out);
        *out = NULL;
    }
    return status;
}

/* Each member's Newton-Schulz load in the other group (`from`, this rank's plan there),
 * all-gathered over `comm` (of `members`) into *out, so that every member of this group plans on
 * top of the same doubles. `loads` and `group` name them in the messages ("expert loads of the
 * dense group"). Collective. */
static shardopt_status_t other_loads_gather(shardopt_runtime_t rt, const struct group_plan *from,
                                            MPI_Comm comm, int members, double **out,
                                            const char *loads, const char *group)
{
    /* a team member's all-reduces count too: they hold up its Newton-Schulz */
    const double mine = from->load != NULL ? from->load[from->me] + from->team_comm[from->me] : 0.0;
    return commit_loads_gather(rt, mine, comm, members, out, loads, group);
}

/* Joint planning (docs/scaling.md): each dense member's expert load, so that the dense owners
 * fill in around the expert work (a member of an expert shard group with more members than its
 * EP rank has experts may own none). Collective. */
static shardopt_status_t expert_loads(shardopt_runtime_t rt, struct shard_table *dense)
{
    return other_loads_gather(rt, &rt->gx[GROUP_EXPERT].plan, rt->groups.dense, dense->members,
                              &dense->xload, "expert", "dense");
}

/* The planner's cost of one exchange element sent one way (plan_cfg.move_cost): comm-dtype bytes
 * at cost_net_gbps, in NS FLOPs per iteration at cost_gemm_gflops. */
double commit_elem_cost(shardopt_runtime_t rt) { return moves_elem_cost(rt); }

static double moves_elem_cost(shardopt_runtime_t rt)
{
    const double steps = rt->cfg.ns_steps > 0 ? rt->cfg.ns_steps : 5;
    return (double)kdtype_size(rt->cfg.comm_dtype) * rt->cost_gflops / (rt->cost_gbps * steps);
}

/* The most bytes any member of the dense group sends in `from`'s exchanges (this rank's plan of
 * a group; all-reduced over the dense group, which holds a member of every expert shard group),
 * as *cost in the planner's units (moves_elem_cost per element). Collective. */
static shardopt_status_t busiest_sent(shardopt_runtime_t rt, const struct group_plan *from,
                                      const char *group, double *cost)
{
    uint64_t most = from->bytes_sent;
    const int rc = comm_allreduce(&rt->groups, rt->groups.dense, MPI_IN_PLACE, &most, 1,
                                  MPI_UINT64_T, MPI_MAX, "all-reduce of the bytes sent");
    const shardopt_status_t status = commit_mpi_agree(
        rt, rc, "all-reduce of the %s group's bytes sent for the joint plan", group);
    *cost = moves_elem_cost(rt) * ((double)most / (double)kdtype_size(rt->cfg.comm_dtype));
    return status;
}

/* The dense group's plan on top of each member's expert load (joint planning). With teams, their
 * sizes count the exchange too, every member's transfers starting from the busiest expert
 * member's bytes (plan_cfg.refine_cost with no refine_load; shardopt-plan plans the same).
 * Collective. */
static shardopt_status_t dense_plan(shardopt_runtime_t rt, struct shard_table *dense)
{
    struct plan_cfg joint = {.base_load = dense->xload};
    shardopt_status_t status = SHARDOPT_OK;
    if (rt->team_cap > 1) { /* alike on every rank: the config and the node size are agreed */
        joint.refine_cost = moves_elem_cost(rt);
        status = busiest_sent(rt, &rt->gx[GROUP_EXPERT].plan, "expert", &joint.refine_comm);
    }
    if (status == SHARDOPT_OK)
        status = commit_group_plan(rt, GROUP_DENSE, dense, &joint, &rt->gx[GROUP_DENSE]);
    return status;
}

/* expert_moves: the expert group planned again, on top of each member's dense load, with matrices
 * free to change owner when the cost model says so. An element moved one way costs comm-dtype
 * bytes at cost_net_gbps, counted in the planner's units (NS FLOPs per iteration at
 * cost_gemm_gflops); every member's transfers start from the busiest dense member's exchange
 * bytes, which the step waits for as well (shardopt-plan's t_comm adds the two maxima).
 * Collective. */
static shardopt_status_t expert_replan(shardopt_runtime_t rt, struct shard_table *xs)
{
    shardopt_status_t status = other_loads_gather(rt, &rt->gx[GROUP_DENSE].plan, rt->groups.xs,
                                                  xs->members, &xs->xload, "dense", "expert shard");
    if (status != SHARDOPT_OK)
        return status;
    struct plan_cfg joint = {.base_load = xs->xload, .move_cost = moves_elem_cost(rt)};
    /* the same on every replica: their dense plans are alike */
    status = busiest_sent(rt, &rt->gx[GROUP_DENSE].plan, "dense", &joint.base_comm);
    if (status != SHARDOPT_OK)
        return status;
    plan_free(&rt->gx[GROUP_EXPERT].plan);
    return commit_group_plan(rt, GROUP_EXPERT, xs, &joint, &rt->gx[GROUP_EXPERT]);
}

/* expert_moves, once the experts have moved: the dense group placed again on each member's
 * expert load after the moves, its exchange counted on top of the busiest expert member's
 * (plan_cfg.refine_load): the planner keeps the first dense plan unless the second finishes
 * earlier (sharding/plan_owners.c; shardopt-plan plans the same). Collective. */
static shardopt_status_t dense_refine(shardopt_runtime_t rt, struct shard_table *dense)
{
    double *after = NULL;
    shardopt_status_t status = other_loads_gather(rt, &rt->gx[GROUP_EXPERT].plan, rt->groups.dense,
                                                  dense->members, &after, "moved expert", "dense");
    if (status != SHARDOPT_OK)
        return status;
    struct plan_cfg joint = {
        .base_load = dense->xload, .refine_load = after, .refine_cost = moves_elem_cost(rt)};
    status = busiest_sent(rt, &rt->gx[GROUP_EXPERT].plan, "expert", &joint.refine_comm);
    if (status == SHARDOPT_OK) {
        plan_free(&rt->gx[GROUP_DENSE].plan);
        status = commit_group_plan(rt, GROUP_DENSE, dense, &joint, &rt->gx[GROUP_DENSE]);
    }
    free(after);
    return status;
}

/* Which Muon tensors of a group stay sharded for Newton-Schulz (ns_strategy), and this rank's
 * piece geometry for them. Every member must decide alike (the plan and the step assume it), so
 * running out of memory here fails commit rather than falling back to gathering on this rank
 * alone. Local: the caller agrees. */
static shardopt_status_t sharded_choose(shardopt_runtime_t rt, enum group_kind kind,
                                        const struct shard_table *t)
{
    const shardopt_placement_t want =
        kind == GROUP_DENSE ? SHARDOPT_PLACEMENT_DENSE : SHARDOPT_PLACEMENT_EXPERT;
    double total = 0;

    for (int i = 0; i < rt->nparams; i++) {
        const struct shardopt_param *p = rt->params[i];
        if (p->algo == SHARDOPT_ALGO_MUON && p->placement == want)
            total += (p->ns_algorithm == NS_ALGO_GRAM
                          ? plan_ns_flops(p->mv.rows, p->mv.cols, rt->cfg.ns_steps, 1,
                                          gram_restarts(rt, p)) /
                                rt->cfg.ns_steps
                          : plan_ns_cost(p->mv.rows, p->mv.cols)) *
                     (double)(p->layout.ndim == 3 ? p->layout.win_len : 1);
    }
    for (int i = 0; i < rt->nparams; i++) {
        struct shardopt_param *p = rt->params[i];
        if (p->algo != SHARDOPT_ALGO_MUON || p->placement != want)
            continue;
        struct plan_box *boxes = mem_malloc(sizeof(*boxes) * (size_t)t->members);
        if (boxes == NULL)
            return log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                            "commit: rank %d: out of memory allocating %zu bytes for the shards of "
                            "'%s' (choosing its Newton-Schulz strategy)",
                            rt->groups.me.rank, sizeof(*boxes) * (size_t)t->members, p->name);
        for (int m = 0; m < t->members;
             m++) { /* mine, but along the shard dim (sharding/layout.c) */
            const struct plan_slice s = shard_table_slice(t, i, &p->layout, m);
            memcpy(boxes[m].lo, p->layout.lo, sizeof boxes[m].lo);
            memcpy(boxes[m].len, p->layout.len, sizeof boxes[m].len);
            boxes[m].lo[p->layout.shard_dim] = s.lo;
            boxes[m].len[p->layout.shard_dim] = s.len;
        }
        struct ns_strategy_in in = {.ndim = p->layout.ndim,
                                    .ns_transpose = p->mv.ns_transpose,
                                    .shard_dim = p->layout.shard_dim,
                                    .boxes = boxes,
                                    .members = t->members,
                                    .steps = rt->cfg.ns_steps,
                                    .esize = kdtype_size(rt->cfg.comm_dtype),
                                    .group_mean_cost = total / t->members,
                                    .gflops = rt->cost_gflops,
                                    .gbps = rt->cost_gbps,
                                    .gram = p->ns_algorithm == NS_ALGO_GRAM};
        memcpy(in.shape, p->layout.shape, sizeof in.shape);
        /* gathered, the FLOPs its kernel would perform, as the step counts them (muon_exec.c) */
        struct ns_sym_blocks sb;
        ns_sym_blocks_for(p->mv.rows, p->mv.cols, p->ns_variant, p->ns_block, rt->ns_compute, &sb);
        const struct plan_ns_blocks blocks = {sb.gram, sb.poly, sb.symmul};
        in.blocks = &blocks;
        in.restarts = gram_restarts(rt, p);
        p->ns_sharded = ns_strategy_choose(&in, (int)rt->cfg.ns_strategy);
        free(boxes);
        if (!p->ns_sharded)
            continue;
        /* my piece of each matrix: all of its rows, some of its working columns */
        const int rd = p->layout.ndim - 2;
        p->sh_rows = p->layout.len[rd];
        p->sh_cols = p->layout.len[rd + 1];
        p->sh_m = p->mv.ns_transpose ? p->sh_cols : p->sh_rows;
        p->sh_n = p->mv.ns_transpose ? p->sh_rows : p->sh_cols;
    }
    return SHARDOPT_OK;
}

/* The team cap the dense plan gets (rt->team_cap), and the node size it places teams in.
 * Teams run the sharded kernels (runtime/step/ns_sharded.c) wherever Newton-Schulz runs, on every
 * replica, in ns_compute's dtype: on a device (backend = cuda, offload = cpu) through the device
 * table's ns_shard_* entries, bf16 ones (ns_shard_bf16_*) where ns_compute is bf16, their Gram
 * all-reduce through host memory or over NCCL. Device teams stay fp32 (a warning says so) where
 * the table has no bf16 team entries. replica_split, or a Newton-Schulz table without the sharded
 * entries, keeps one owner per matrix (a warning says which). Collective over the dense group. */
static shardopt_status_t teams_setup(shardopt_runtime_t rt)
{
    const char *why = rt->cfg.replica_split && rt->groups.mesh.dp_replicate > 1 ? "replica_split"
                      : rt->ns_ops->ns_shard_gram == NULL
                          ? "Newton-Schulz kernels that have no sharded entries"
                          : NULL;
    rt->team_cap = 1;
    rt->team_node_members = 1;
    rt->xs_team_node_members = 1;
    rt->team_compute = KDT_F32;
    if (rt->cfg.ns_team_cap < 2)
        return SHARDOPT_OK;
    if (why != NULL) {
        if (rt->groups.me.rank == 0)
            log_warn("commit: ns_team_cap = %d ignored with %s: one owner per matrix",
                     rt->cfg.ns_team_cap, why);
        return SHARDOPT_OK;
    }
    rt->team_cap = rt->cfg.ns_team_cap;
    if (commit_teams_node_members(rt, rt->groups.dense, &rt->team_node_members) != MPI_SUCCESS ||
        commit_teams_node_members(rt, rt->groups.xs, &rt->xs_team_node_members) != MPI_SUCCESS)
        return log_fail(SHARDOPT_ERR_COMM,
                        "commit: rank %d: finding the groups' node sizes for ns_team_cap failed",
                        rt->groups.me.rank);
    /* the expert shard groups team over NCCL too: a member whose team's NCCL all-reduce fails
     * goes on through the step and fails each later team it is in at that team's first
     * all-reduce (muon_exec.c, ns_sharded_block), so no member of a later team is left waiting
     * for it. Before, commit kept one owner per expert matrix with the exchanges over NCCL (a
     * warning): test_device_sim_nccl_np8's stuck dense team left its expert-team peers in their
     * MPI norm all-reduce until comm_timeout_s ended the job (MPI_Abort) */
    /* teams iterate in ns_compute's dtype, which every rank resolves alike (the owners' plan,
     * whose costs follow the variant tables of that dtype, depends on it as well), and so does
     * what decides the fallback below: the table (backend and offload are the same everywhere) */
    const char *fp32_why =
        rt_ns_on_device(rt) && rt->ns_compute == KDT_BF16 && rt->ns_ops->ns_shard_bf16_gram == NULL
            ? "its table has no bf16 team entries"
            : NULL;
    rt->team_compute = fp32_why != NULL ? KDT_F32 : rt->ns_compute;
    if (fp32_why != NULL && rt->groups.me.rank == 0)
        log_warn("commit: ns_team_cap = %d with Newton-Schulz on the device: teams iterate in "
                 "fp32 (%s); matrices with one owner stay bf16",
                 rt->cfg.ns_team_cap, fp32_why);
    return SHARDOPT_OK;
}

/* A trainer's adamw_patterns entry that matches no parameter is most likely a misspelt name,
 * and sends what it meant to Muon without a word: say so once (rank 0; every rank registered
 * the same names). The default list is left alone: it names what many models lack. */
static void patterns_warn_unmatched(shardopt_runtime_t rt)
{
    char list[512];
    if (rt->groups.me.rank != 0 ||
        strcmp(rt->cfg.adamw_patterns, SHARDOPT_DEFAULT_ADAMW_PATTERNS) == 0)
        return;
    const char **names = mem_malloc(sizeof(char *) * (size_t)(rt->nparams ? rt->nparams : 1));
    if (names == NULL)
        return; /* a warning is not worth failing commit for */
    for (int i = 0; i < rt->nparams; i++)
        names[i] = rt->params[i]->name;
    const int n = classify_unmatched(rt->cfg.adamw_patterns, names, rt->nparams, list, sizeof list);
    if (n > 0)
        log_warn("commit: adamw_patterns entr%s %s match%s no registered parameter (an entry "
                 "matches names containing it, or, written =name, equal to it)",
                 n == 1 ? "y" : "ies", list, n == 1 ? "es" : "");
    free(names);
}

static shardopt_status_t commit_run(shardopt_runtime_t rt)
{
    shardopt_status_t status;
    struct shard_table dense = {0}, xs = {0};

    if (rt == NULL)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "commit: NULL runtime");
    comm_phase("commit", -1);
    /* a refusal of this rank alone joins the opening agreement: the others would wait in it */
    status = rt_open_call(rt, "commit",
                          rt->committed
                              ? log_fail(SHARDOPT_ERR_STATE, "commit: runtime already committed")
                              : SHARDOPT_OK); /* its allocations go to init's device */
    if (status != SHARDOPT_OK)
        return status;
    rt->cost_gflops = config_cost_rate(rt->cfg.cost_gemm_gflops, rt_ns_on_device(rt),
                                       COST_CPU_GFLOPS, COST_DEVICE_GFLOPS);
    rt->cost_gbps = config_cost_rate(rt->cfg.cost_net_gbps, rt_ns_on_device(rt), COST_CPU_GBPS,
                                     COST_DEVICE_GBPS);
    log_info("commit: cost model at %g GFLOP/s and %g GB/s per rank (%s)", rt->cost_gflops,
             rt->cost_gbps,
             rt->cfg.cost_gemm_gflops > 0 && rt->cfg.cost_net_gbps > 0 ? "the config's"
             : rt_ns_on_device(rt) ? "Newton-Schulz on a device: a GPU's defaults where unset"
                                   : "Newton-Schulz on the CPU: its defaults where unset");
    status = commit_check(rt, &dense, &xs);
    if (status != SHARDOPT_OK)
        return status;
    patterns_warn_unmatched(rt);
    for (int i = 0; i < rt->nparams; i++)
        param_plan(rt, rt->params[i]);
    status = sharded_choose(rt, GROUP_DENSE, &dense);
    if (status == SHARDOPT_OK)
        status = sharded_choose(rt, GROUP_EXPERT, &xs);
    status = groups_agree(&rt->groups, status, "commit");
    if (status == SHARDOPT_OK) /* collective: only once every rank has come this far */
        status = teams_setup(rt);
    status = groups_agree(&rt->groups, status, "commit");
    if (status == SHARDOPT_OK)
        status = commit_group_plan(rt, GROUP_LOCAL, NULL, NULL, &rt->gx[GROUP_LOCAL]);
    if (status == SHARDOPT_OK)
        status = commit_group_plan(rt, GROUP_EXPERT, &xs, NULL, &rt->gx[GROUP_EXPERT]);
    if (status == SHARDOPT_OK)
        status = expert_loads(rt, &dense);
    if (status == SHARDOPT_OK)
        status = dense_plan(rt, &dense);
    if (status == SHARDOPT_OK && rt->cfg.expert_moves)
        status = expert_replan(rt, &xs);
    if (status == SHARDOPT_OK && rt->cfg.expert_moves)
        status = dense_refine(rt, &dense);
    if (status == SHARDOPT_OK)
        status = commit_union_plan(rt, &dense, &xs);
    if (status == SHARDOPT_OK)
        status = commit_teams_create(rt, &rt->gx[GROUP_DENSE], GROUP_DENSE, "dense");
    /* after the dense group's on every rank: one order of the blocking creations everywhere */
    if (status == SHARDOPT_OK)
        status = commit_teams_create(rt, &rt->gx[GROUP_EXPERT], GROUP_EXPERT, "expert shard");
    transports_pick(rt);
    rt->ns_timeout_s = ns_sharded_deadline(rt);
    /* the member -> runtime rank tables outlive the shard tables: param stats name owners */
    rt->group_ranks[GROUP_DENSE] = dense.ranks;
    rt->group_ranks[GROUP_EXPERT] = xs.ranks;
    dense.ranks = xs.ranks = NULL;
    shard_table_free(&dense);
    shard_table_free(&xs);
    offload_prepare(rt);
    if (status == SHARDOPT_OK)
        status = commit_buffers_alloc(rt);
    if (status == SHARDOPT_OK)
        status = commit_ns_bf16_plans(rt);
    if (status == SHARDOPT_OK)
        status = commit_param_stats_alloc(rt);
    if (status != SHARDOPT_OK) {
        commit_release(rt);
        return status;
    }
    rt->committed = 1;
    log_info("commit: %d params, state %zu bytes, workspace %zu bytes; NS matrices owned: %d "
             "local, %d dense, %d expert",
             rt->nparams, rt->store.bytes, rt->bytes_workspace, rt->gx[GROUP_LOCAL].plan.nowned,
             rt->gx[GROUP_DENSE].plan.nowned, rt->gx[GROUP_EXPERT].plan.nowned);
    return SHARDOPT_OK;
}

shardopt_status_t shardopt_commit(shardopt_runtime_t rt)
{
    const shardopt_status_t claimed = rt_claim(rt, "commit");
    if (claimed != SHARDOPT_OK)
        return claimed;
    const shardopt_status_t status = commit_run(rt);
    rt_release(rt);
    return status;
}

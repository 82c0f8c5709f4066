/* commit: check the registration on every rank, plan the exchanges, lay out state and buffers.
 * Everything the step needs is allocated here, so the step itself allocates nothing. */
#include <stdlib.h>
#include <string.h>

#include "comm_wait.h"
#include "commit_check.h"
#include "kernels/cpu/ns_bf16.h"
#include "kernels/lr_scale.h"
#include "kernels/ns_variant.h"
#include "log.h"
#include "offload_exec.h"
#include "replica_check.h"
#include "runtime.h"
#include "sharding/ns_strategy.h"
#include "status.h"

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
        p->ns_variant = NS_VARIANT_PLAIN; /* the CUDA Newton-Schulz has the plain one only */
    else if (rt->ns_compute == KDT_BF16)
        p->ns_variant = ns_bf16_variant_for_shape(p->mv.rows, p->mv.cols, &p->ns_block);
    else
        p->ns_variant = ns_variant_for_shape(p->mv.rows, p->mv.cols);
    p->lr_scale = lr_scale_factor(rt->cfg.lr_scale, p->mv.true_rows, p->mv.true_cols);
}

/* The planner's view of the Muon tensors of one group kind. */
static shardopt_status_t group_plan_build(shardopt_runtime_t rt, enum group_kind kind,
                                          const struct shard_table *t, struct group_exec *gx)
{
    const shardopt_placement_t want = kind == GROUP_LOCAL   ? SHARDOPT_PLACEMENT_REPLICATED
                                      : kind == GROUP_DENSE ? SHARDOPT_PLACEMENT_DENSE
                                                            : SHARDOPT_PLACEMENT_EXPERT;
    const int members = kind == GROUP_LOCAL ? 1 : t->members;
    struct plan_param *pp = malloc(sizeof(*pp) * (size_t)(rt->nparams ? rt->nparams : 1));
    struct plan_box *boxes =
        malloc(sizeof(*boxes) * (size_t)members * (size_t)(rt->nparams ? rt->nparams : 1));
    struct plan_cfg cfg = {.members = members,
                           .me = 0,
                           .bucket_bytes = rt->cfg.bucket_bytes,
                           .esize = kdtype_size(rt->cfg.comm_dtype)};
    char err[256];
    int np = 0, rc;

    if (kind != GROUP_LOCAL)
        MPI_Comm_rank(kind == GROUP_DENSE ? rt->groups.dense : rt->groups.xs, &cfg.me);
    if (pp == NULL || boxes == NULL) {
        free(pp);
        free(boxes);
        return log_fail(SHARDOPT_ERR_OUT_OF_MEMORY, "commit: planning memory");
    }
    for (int i = 0; i < rt->nparams; i++) {
        const struct shardopt_param *p = rt->params[i];
        if (p->algo != SHARDOPT_ALGO_MUON || p->placement != want || p->ns_sharded)
            continue;
        struct plan_box *b = &boxes[(size_t)np * (size_t)members];
        for (int m = 0; m < members; m++) {
            if (kind == GROUP_LOCAL) {
                memcpy(b[m].lo, p->layout.lo, sizeof b[m].lo);
                memcpy(b[m].len, p->layout.len, sizeof b[m].len);
            } else {
                b[m] = t->boxes[(size_t)m * (size_t)rt->nparams + (size_t)i];
            }
        }
        pp[np] = (struct plan_param){.param = i, .ndim = p->layout.ndim, .boxes = b};
        memcpy(pp[np].shape, p->layout.shape, sizeof pp[np].shape);
        /* an expert group orthogonalizes its EP rank's experts; a dense stack all of them */
        pp[np].k_lo = p->layout.ndim == 3 ? p->layout.win_lo : 0;
        pp[np].k_count = p->layout.ndim == 3 ? p->layout.win_len : 1;
        np++;
    }
    rc = plan_build(&cfg, pp, np, &gx->plan, err, sizeof err);
    free(pp);
    free(boxes);
    /* the inputs are the same on every member, so plan_build fails alike everywhere but for
     * memory; agree before anyone goes on */
    int ok = rc == 0;
    groups_allreduce(&rt->groups, &ok, 1, MPI_INT, MPI_MIN);
    if (!ok) {
        if (rc == 0)
            plan_free(&gx->plan);
        return log_fail(SHARDOPT_ERR_OUT_OF_MEMORY, "commit: planning the %s group: %s",
                        kind == GROUP_DENSE    ? "dense"
                        : kind == GROUP_EXPERT ? "expert"
                                               : "local",
                        rc == 0 ? "failed on another rank" : err);
    }
    gx->comm = kind == GROUP_LOCAL   ? MPI_COMM_NULL
               : kind == GROUP_DENSE ? rt->groups.dense
                                     : rt->groups.xs;
    return SHARDOPT_OK;
}

/* Which Muon tensors of a group stay sharded for Newton-Schulz (ns_strategy), and this rank's
 * piece geometry for them. */
static void sharded_choose(shardopt_runtime_t rt, enum group_kind kind, const struct shard_table *t)
{
    const shardopt_placement_t want =
        kind == GROUP_DENSE ? SHARDOPT_PLACEMENT_DENSE : SHARDOPT_PLACEMENT_EXPERT;
    double total = 0;

    if (rt_ns_on_device(rt))
        return; /* sharded Newton-Schulz is CPU-only: auto gathers every matrix */
    for (int i = 0; i < rt->nparams; i++) {
        const struct shardopt_param *p = rt->params[i];
        if (p->algo == SHARDOPT_ALGO_MUON && p->placement == want)
            total += plan_ns_cost(p->mv.rows, p->mv.cols) *
                     (double)(p->layout.ndim == 3 ? p->layout.win_len : 1);
    }
    for (int i = 0; i < rt->nparams; i++) {
        struct shardopt_param *p = rt->params[i];
        if (p->algo != SHARDOPT_ALGO_MUON || p->placement != want)
            continue;
        struct plan_box *boxes = malloc(sizeof(*boxes) * (size_t)t->members);
        if (boxes == NULL)
            continue; /* stays gathered: always correct */
        for (int m = 0; m < t->members; m++)
            boxes[m] = t->boxes[(size_t)m * (size_t)rt->nparams + (size_t)i];
        struct ns_strategy_in in = {.ndim = p->layout.ndim,
                                    .ns_transpose = p->mv.ns_transpose,
                                    .shard_dim = p->layout.shard_dim,
                                    .boxes = boxes,
                                    .members = t->members,
                                    .steps = rt->cfg.ns_steps,
                                    .esize = kdtype_size(rt->cfg.comm_dtype),
                                    .group_mean_cost = total / t->members,
                                    .gflops = rt->cfg.cost_gemm_gflops,
                                    .gbps = rt->cfg.cost_net_gbps};
        memcpy(in.shape, p->layout.shape, sizeof in.shape);
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
}

/* Most Newton-Schulz workspace a device backend gets for batching a run of experts. */
#define NS_WS_DEVICE_CAP ((size_t)1 << 30)

static void *buffer_alloc(shardopt_runtime_t rt, size_t bytes)
{
    void *p = rt->ops->alloc(bytes);
    if (p != NULL)
        rt->bytes_workspace += bytes;
    return p;
}

void commit_release(shardopt_runtime_t rt)
{
    for (int k = 0; k < GROUP_KINDS; k++)
        plan_free(&rt->gx[k].plan);
    rt->ns_ops->free(rt->ns_ws.buf);
    for (int i = 0; i < PIPELINE_DEPTH; i++) {
        rt->ops->free(rt->bufs[i].ns);
        rt->ops->free(rt->bufs[i].b);
        rt->ops->free(rt->bufs[i].a);
        if (rt->ops->host_free != NULL) {
            rt->ops->host_free(rt->bufs[i].ha);
            rt->ops->host_free(rt->bufs[i].hb);
            rt->ops->host_free(rt->bufs[i].hns);
        }
        free(rt->bufs[i].req);
        free(rt->bufs[i].peer);
    }
    memset(rt->bufs, 0, sizeof rt->bufs);
    rt->ops->free(rt->sh_u);
    rt->ops->free(rt->sh_x);
    rt->sh_u = NULL;
    rt->sh_x = NULL;
    free(rt->sumsq);
    free((void *)rt->pre_x);
    free(rt->pre_dt);
    free(rt->pre_n);
    rt->pre_x = NULL;
    rt->pre_dt = NULL;
    rt->pre_n = NULL;
    free(rt->rep_counts);
    rt->rep_counts = rt->rep_displs = rt->rep_sc = rt->rep_sd = NULL;
    free(rt->nonfinite);
    rt->nonfinite = NULL;
    free(rt->pre_fin);
    rt->pre_fin = NULL;
    free(rt->drift);
    free(rt->drift_host);
    rt->drift = NULL;
    rt->drift_host = NULL;
    rt->ns_ws.buf = NULL;
    rt->sumsq = NULL;
    rt->bytes_workspace = 0;
    offload_release(rt);
    ns_bf16_destroy(rt->ns_ws.bf16);
    rt->ns_ws.bf16 = NULL;
    state_store_free(&rt->store);
    state_store_init(&rt->store, rt->ops);
}

static shardopt_status_t buffers_alloc(shardopt_runtime_t rt)
{
    const size_t es = kdtype_size(rt->cfg.comm_dtype);
    size_t a = 0, b = 0, ns = 0, ws = 0;

    size_t sh_u = 0, sh_x = 0, sh_g = 0;
    for (int i = 0; i < rt->nparams; i++) {
        const struct shardopt_param *q = rt->params[i];
        if (!q->ns_sharded)
            continue;
        size_t u = (size_t)(q->sh_rows * q->sh_cols), g = (size_t)(q->sh_m * q->sh_m);
        sh_u = u > sh_u ? u : sh_u;
        sh_x = u > sh_x ? u : sh_x;
        sh_g = g > sh_g ? g : sh_g;
    }
    for (int k = 0; k < GROUP_KINDS; k++) {
        const struct group_plan *p = &rt->gx[k].plan;
        a = p->max_a > a ? p->max_a : a;
        b = p->max_b > b ? p->max_b : b;
        ns = p->max_ns > ns ? p->max_ns : ns;
        int64_t run = 0;
        for (int w = 0; w < p->nowned; w++) {
            /* a run of consecutive experts of one stack is one batched call (a device backend
             * holds it whole, up to NS_WS_DEVICE_CAP; past that the call goes in chunks) */
            const struct plan_owned *o = &p->owned[w];
            run = w > 0 && o->param == p->owned[w - 1].param && o->k == p->owned[w - 1].k + 1
                      ? run + 1
                      : 1;
            size_t f = rt->ns_ops->ns_workspace_bytes(o->rows, o->cols, run);
            const size_t one = rt->ns_ops->ns_workspace_bytes(o->rows, o->cols, 1);
            f = f > NS_WS_DEVICE_CAP && one < NS_WS_DEVICE_CAP ? NS_WS_DEVICE_CAP : f;
            f = f / sizeof(float) + 1;
            ws = f > ws ? f : ws;
        }
    }
    int ok = 1, members = 1;
    for (int k = 0; k < GROUP_KINDS; k++)
        members = rt->gx[k].plan.members > members ? rt->gx[k].plan.members : members;
    for (int i = 0; i < PIPELINE_DEPTH; i++) {
        struct bucket_buffers *bb = &rt->bufs[i];
        bb->a = buffer_alloc(rt, a * es);
        bb->b = buffer_alloc(rt, b * es);
        bb->ns = buffer_alloc(rt, ns * es);
        bb->req = malloc(sizeof(MPI_Request) * 2 * (size_t)members);
        bb->peer = malloc(sizeof(int) * 2 * (size_t)members);
        ok = ok && bb->a && bb->b && bb->ns && bb->req && bb->peer;
        if (rt_on_device(rt)) {
            bb->ha = rt->ops->host_alloc(a * es);
            bb->hb = rt->ops->host_alloc(b * es);
            bb->hns = rt->ops->host_alloc(ns * es);
            ok = ok && bb->ha && bb->hb && bb->hns;
            if (ok)
                rt->bytes_workspace += (a + b + ns) * es; /* pinned host memory */
        }
    }
    rt->ns_ws.buf = rt->ns_ops->alloc(ws * sizeof(float)); /* where Newton-Schulz runs */
    rt->bytes_workspace += rt->ns_ws.buf != NULL ? ws * sizeof(float) : 0;
    rt->ns_ws.floats = ws;
    rt->sumsq = malloc(sizeof(double) * (size_t)(rt->nparams ? rt->nparams : 1));
    rt->pre_x = malloc(sizeof(void *) * (size_t)(rt->nparams ? rt->nparams : 1));
    rt->pre_dt = malloc(sizeof(int) * (size_t)(rt->nparams ? rt->nparams : 1));
    rt->pre_n = malloc(sizeof(size_t) * (size_t)(rt->nparams ? rt->nparams : 1));
    ok = ok && rt->pre_x && rt->pre_dt && rt->pre_n;
    rt->nonfinite = malloc(sizeof(int) * (size_t)(rt->nparams ? rt->nparams : 1));
    rt->pre_fin = malloc(sizeof(double) * 2 * (size_t)(rt->nparams ? rt->nparams : 1));
    ok = ok && rt->pre_fin != NULL;
    if (rt->cfg.replica_check_every > 0) { /* the step allocates nothing: its buffers now */
        rt->drift = malloc(sizeof(uint32_t) * 4 * (size_t)(rt->nparams ? rt->nparams : 1));
        rt->drift_host = rt_on_device(rt) ? malloc(REPLICA_CHECK_CHUNK) : NULL;
        ok = ok && rt->drift != NULL && (!rt_on_device(rt) || rt->drift_host != NULL);
    }
    const size_t R = (size_t)rt->groups.mesh.dp_replicate;
    rt->rep_counts = malloc(sizeof(int) * 4 * R);
    rt->rep_displs = rt->rep_counts != NULL ? rt->rep_counts + R : NULL;
    rt->rep_sc = rt->rep_counts != NULL ? rt->rep_counts + 2 * R : NULL;
    rt->rep_sd = rt->rep_counts != NULL ? rt->rep_counts + 3 * R : NULL;
    ok = ok && rt->rep_counts != NULL;
    /* sharded Newton-Schulz: U/O of one piece, X and Y, the Gram matrix and B */
    rt->sh_u = buffer_alloc(rt, sh_u * es + 1);
    rt->sh_x = buffer_alloc(rt, (2 * sh_x + 2 * sh_g) * sizeof(float) + 1);
    ok = ok && rt->sh_u && rt->sh_x;
    ok = ok && rt->ns_ws.buf && rt->sumsq && rt->nonfinite;
    /* the state: a host store with offload, which may refuse (host_store_limit) */
    char err[256] = "";
    int state_ok = state_store_alloc(&rt->store, err, sizeof err) == 0;
    size_t staging = state_ok ? offload_alloc(rt, ns, sh_u) : 0;
    ok = ok && staging != (size_t)-1;
    if (ok && state_ok)
        rt->bytes_workspace += staging;
    int all[2] = {ok, state_ok};
    groups_allreduce(&rt->groups, all, 2, MPI_INT, MPI_MIN);
    if (!state_ok)
        return log_fail(SHARDOPT_ERR_OUT_OF_MEMORY, "commit: rank %d: optimizer state: %s",
                        rt->groups.me.rank, err);
    if (!all[1])
        return log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                        "commit: allocating the optimizer state failed on another rank");
    if (!all[0])
        return log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                        "commit: %s: state %zu bytes, exchange buffers %zu + %zu bytes, NS slots "
                        "%zu, workspace "
                        "%zu bytes",
                        ok ? "allocation failed on another rank" : "allocation failed",
                        rt->store.bytes, PIPELINE_DEPTH * a * es, PIPELINE_DEPTH * b * es,
                        PIPELINE_DEPTH * ns * es, ws * sizeof(float));
    return SHARDOPT_OK;
}

/* ns_compute = bf16: every oneDNN primitive the step will run, made now (one plan per shape of
 * a matrix this rank orthogonalizes), so that the step makes none. Collective. */
static shardopt_status_t ns_bf16_plans(shardopt_runtime_t rt)
{
    char err[256] = "";
    int ok = 1, unimplemented = 0;

    if (rt->ns_compute != KDT_BF16 || rt_ns_on_device(rt))
        return SHARDOPT_OK;
    rt->ns_ws.bf16 = ns_bf16_create(err, sizeof err);
    ok = rt->ns_ws.bf16 != NULL;
    for (int g = 0; ok && g < GROUP_KINDS; g++) {
        const struct group_plan *P = &rt->gx[g].plan;
        for (int w = 0; ok && w < P->nowned; w++) {
            const struct shardopt_param *p = rt->params[P->owned[w].param];
            const int rc = ns_bf16_prepare(
                rt->ns_ws.bf16, P->owned[w].rows, P->owned[w].cols, p->ns_variant, p->ns_block,
                (const float(*)[3])rt->ns_coeffs, rt->cfg.ns_steps, err, sizeof err);
            ok = rc == 0;
            unimplemented |= rc == -2;
            if (!ok)
                snprintf(err + strlen(err), sizeof err - strlen(err), " (parameter '%s')", p->name);
        }
    }
    /* 0 ok, 1 this CPU has no bf16 matmul (unsupported, not a bug), 2 anything else */
    int code = ok ? 0 : unimplemented ? 1 : 2, all = code;
    groups_allreduce(&rt->groups, &all, 1, MPI_INT, MPI_MAX);
    const shardopt_status_t st = all == 1 ? SHARDOPT_ERR_UNSUPPORTED : SHARDOPT_ERR_INTERNAL;
    const char *advice = all == 1 ? ": this CPU has no oneDNN bf16 matmul; use ns_compute = fp32 "
                                    "or auto"
                                  : "";
    if (code != 0)
        return log_fail(st, "commit: rank %d: %s%s", rt->groups.me.rank, err, advice);
    if (all != 0)
        return log_fail(st, "commit: preparing bf16 Newton-Schulz failed on another rank%s",
                        advice);
    if (rt->groups.me.rank == 0)
        log_info("commit: bf16 Newton-Schulz: %d oneDNN primitives (%s)",
                 ns_bf16_primitive_count(rt->ns_ws.bf16), ns_bf16_impl(rt->ns_ws.bf16));
    return SHARDOPT_OK;
}

shardopt_status_t shardopt_commit(shardopt_runtime_t rt)
{
    shardopt_status_t status;
    struct shard_table dense = {0}, xs = {0};

    if (rt == NULL)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "commit: NULL runtime");
    if (rt->committed)
        return log_fail(SHARDOPT_ERR_STATE, "commit: runtime already committed");

    comm_phase("commit", -1);
    status = commit_check(rt, &dense, &xs);
    if (status != SHARDOPT_OK)
        return status;
    for (int i = 0; i < rt->nparams; i++)
        param_plan(rt, rt->params[i]);
    sharded_choose(rt, GROUP_DENSE, &dense);
    sharded_choose(rt, GROUP_EXPERT, &xs);
    status = group_plan_build(rt, GROUP_LOCAL, NULL, &rt->gx[GROUP_LOCAL]);
    if (status == SHARDOPT_OK)
        status = group_plan_build(rt, GROUP_DENSE, &dense, &rt->gx[GROUP_DENSE]);
    if (status == SHARDOPT_OK)
        status = group_plan_build(rt, GROUP_EXPERT, &xs, &rt->gx[GROUP_EXPERT]);
    shard_table_free(&dense);
    shard_table_free(&xs);
    offload_prepare(rt);
    if (status == SHARDOPT_OK)
        status = buffers_alloc(rt);
    if (status == SHARDOPT_OK)
        status = ns_bf16_plans(rt);
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

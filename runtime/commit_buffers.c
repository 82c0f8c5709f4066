/* commit's second half: once the plans are made, everything the step will use is allocated here
 * (exchange buffers and their pinned mirrors, the Newton-Schulz workspace, the sharded-NS
 * buffers, oneDNN's bf16 primitives, param_stats' snapshots), so that the step allocates
 * nothing; and commit_release, which frees all of it. */
#include "runtime/commit_buffers.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/mem.h"
#include "base/status.h"
#include "kernels/cpu/ns_bf16.h"
#include "runtime/comm/comm_wait.h"
#include "runtime/commit_teams.h"
#include "runtime/runtime.h"
#include "runtime/step/alias_check.h"
#include "runtime/step/ns_sharded.h"
#include "runtime/step/offload_exec.h"
#include "runtime/step/replica_check.h"

/* Most Newton-Schulz workspace a device backend gets for batching a run of experts. */
#define NS_WS_DEVICE_CAP ((size_t)1 << 30)

/* Exchange buffers an abandoned step's requests may still write (exchange_abandoned), kept for
 * the life of the process and reachable from here: never freed, and not lost either, so a leak
 * checker (LeakSanitizer in CI) does not report what is kept on purpose. Several runtimes may
 * finalize at once: a lock-free push. */
struct kept_buffer {
    void *p;
    struct kept_buffer *next;
};
static _Atomic(struct kept_buffer *) commit_kept;

static void keep_buffer(void *p)
{
    struct kept_buffer *k = p != NULL ? mem_malloc(sizeof *k) : NULL;
    if (k == NULL)
        return; /* nothing to keep, or no room to note it: the buffer stays unfreed either way */
    k->p = p;
    k->next = atomic_load(&commit_kept);
    while (!atomic_compare_exchange_weak(&commit_kept, &k->next, k))
        ;
}

/* The first allocation of commit that failed: what it was for, and its size. */
struct oom_note {
    const char *what;
    size_t bytes;
};

static void *noted(struct oom_note *n, void *p, size_t bytes, const char *what)
{
    if (p == NULL && n->what == NULL) {
        n->what = what;
        n->bytes = bytes;
    }
    return p;
}

static void *buffer_alloc(shardopt_runtime_t rt, size_t bytes)
{
    void *p = rt->dev->alloc(bytes);
    if (p != NULL)
        rt->bytes_workspace += bytes;
    return p;
}

/* Frees sh_host (Newton-Schulz on a device: the host side of sharded Newton-Schulz's all-reduces
 * and of AOL), then with bytes > 0 allocates it anew and returns it (NULL: out of memory). Pinned
 * where Newton-Schulz's device table has pinned host memory, as MPI reads it right after the
 * copy, else plain host memory: one place makes that choice, so its release always matches. */
static float *sh_host_set(shardopt_runtime_t rt, size_t bytes)
{
    const int pinned = device_has(rt->ns_dev, DEVICE_CAP_HOST_PINNED);
    if (pinned)
        rt->ns_dev->host_free(rt->sh_host);
    else
        free(rt->sh_host);
    rt->sh_host = NULL;
    if (bytes > 0)
        rt->sh_host = pinned ? rt->ns_dev->host_alloc(bytes) : mem_malloc(bytes);
    return rt->sh_host;
}

void commit_release(shardopt_runtime_t rt)
{
    for (int k = 0; k < GROUP_KINDS; k++) {
        free(rt->group_ranks[k]);
        rt->group_ranks[k] = NULL;
    }
    free(rt->pstat_snap);
    free(rt->pstat_sum);
    rt->pstat_snap = NULL;
    rt->pstat_sum = NULL;
    for (int k = 0; k < GROUP_KINDS; k++) {
        commit_teams_free(&rt->gx[k]);
        plan_free(&rt->gx[k].plan);
    }
    rt->ns_dev->free(rt->ns_ws.buf);
    for (int i = 0; i < PIPELINE_DEPTH; i++) {
        rt->dev->free(rt->bufs[i].ns);
        /* after a step abandoned its exchanges MPI may still write these: left to it (kept, once,
         * on a runtime that cannot step again) */
        if (!rt->exchange_abandoned) {
            rt->dev->free(rt->bufs[i].b);
            rt->dev->free(rt->bufs[i].a);
        } else {
            keep_buffer(rt->bufs[i].b);
            keep_buffer(rt->bufs[i].a);
        }
        if (device_has(rt->dev, DEVICE_CAP_HOST_PINNED)) {
            if (!rt->exchange_abandoned) {
                rt->dev->host_free(rt->bufs[i].ha);
                rt->dev->host_free(rt->bufs[i].hb);
            } else {
                keep_buffer(rt->bufs[i].ha);
                keep_buffer(rt->bufs[i].hb);
            }
            rt->dev->host_free(rt->bufs[i].hns);
        }
        free(rt->bufs[i].req);
        free(rt->bufs[i].peer);
    }
    memset(rt->bufs, 0, sizeof rt->bufs);
    rt->dev->free(rt->sh_u);
    rt->ns_dev->free(rt->sh_x);
    sh_host_set(rt, 0);
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
    rt->rep_counts = rt->rep_displs = NULL;
    alias_check_peers_leave(rt);
    free(rt->alias);
    rt->alias = NULL;
    rt->peer_spans = NULL;
    free(rt->nonfinite);
    rt->nonfinite = NULL;
    rt->gradflags = NULL;
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
    ns_sharded_bf16_op_free(rt);
    state_store_free(&rt->store);
    state_store_init(&rt->store, rt->dev);
}

/* a + b, or SIZE_MAX past it: a sum of registered sizes that wraps would look small */
static size_t sat_add(size_t a, size_t b) { return a > SIZE_MAX - b ? SIZE_MAX : a + b; }

static size_t sat_mul(size_t a, size_t b)
{
    size_t r;
    return __builtin_mul_overflow(a, b, &r) ? SIZE_MAX : r;
}

/* This rank's optimizer state bytes of parameter p (what state_store_reserve reserved). */
static size_t param_state_bytes(const struct shardopt_runtime *rt, const struct shardopt_param *p)
{
    const size_t n = (size_t)p->layout.local_numel;
    return p->algo == SHARDOPT_ALGO_ADAMW
               ? sat_add(sat_mul(n, kdtype_size(rt->cfg.adam_state_dtype)),
                         sat_mul(n, kdtype_size(rt->cfg.adam_v_dtype)))
               : sat_mul(n, kdtype_size(rt->cfg.momentum_dtype));
}

/* Before anything is allocated: the host memory commit is about to take (the state where it is
 * host memory, the exchange buffers or their pinned mirrors, the Newton-Schulz workspace and
 * param_stats' copy where they are host memory), summed over this node's ranks of the runtime,
 * against what the machine has left (base/meminfo.h). Linux hands out more than it has and kills
 * the process when the zeroing touches it, so a registration too large for the machine is
 * refused here, with the bytes and the largest parameters, instead. Collective (the node sum);
 * the caller agrees on the status. `buffers` and `ns_ws` are the bytes commit_buffers_alloc
 * computed for the exchange and workspace buffers. */
static shardopt_status_t host_memory_check(shardopt_runtime_t rt, size_t buffers, size_t ns_ws,
                                           size_t sharded)
{
    const int host_state = rt->store.host || !device_has(rt->dev, DEVICE_CAP_DEVICE_MEMORY);
    const int host_ns = !device_has(rt->ns_dev, DEVICE_CAP_DEVICE_MEMORY);
    size_t state = host_state ? rt->store.bytes : 0, copies = 0;
    if (rt->cfg.param_stats && !rt_on_device(rt))
        for (int i = 0; i < rt->nparams; i++)
            copies = sat_add(copies, sat_mul((size_t)rt->params[i]->layout.local_numel,
                                             kdtype_size(rt->params[i]->param_dtype)));
    /* the exchange buffers are host memory on the CPU, pinned host mirrors on a device; with
     * offload = optimizer on the CPU the three staging slots too (offload_alloc: a bucket's
     * worth, at most the whole state; bounded by the state when bucket_bytes is 0) */
    size_t work = sat_add(sat_add(buffers, host_ns ? ns_ws : 0), host_ns ? sharded : 0);
    if (host_ns && rt->cfg.offload == SHARDOPT_OFFLOAD_OPTIMIZER) {
        const size_t b = (size_t)rt->cfg.bucket_bytes;
        work = sat_add(work, sat_mul(3, b > 0 && b < rt->store.bytes ? b : rt->store.bytes));
    }
    const size_t need = sat_add(sat_add(state, work), copies);
    struct node_memory m;
    char with[96] = "";
    const shardopt_status_t st =
        comm_node_memory(&rt->groups, need, SHARDOPT_OK, "commit", "commit's memory check", &m);
    if (st != SHARDOPT_OK || !m.over)
        return st;
    if (m.ranks > 1)
        snprintf(with, sizeof with, ", %llu bytes with this node's %d ranks of the runtime",
                 (unsigned long long)m.node, m.ranks);
    /* the three parameters with the most state here: what to shard, offload or shrink */
    int top[3] = {-1, -1, -1};
    for (int i = 0; i < rt->nparams; i++) {
        const size_t b = param_state_bytes(rt, rt->params[i]);
        for (int j = 0; j < 3; j++)
            if (top[j] < 0 || b > param_state_bytes(rt, rt->params[top[j]])) {
                memmove(&top[j + 1], &top[j], sizeof(int) * (size_t)(2 - j));
                top[j] = i;
                break;
            }
    }
    char largest[400] = "";
    size_t used = 0;
    for (int j = 0; j < 3 && top[j] >= 0 && used < sizeof largest; j++) {
        const struct shardopt_param *p = rt->params[top[j]];
        const int n =
            snprintf(largest + used, sizeof largest - used, "%s'%.48s%s' %zu bytes", j ? ", " : "",
                     p->name, strlen(p->name) > 48 ? "..." : "", param_state_bytes(rt, p));
        used += n > 0 ? (size_t)n : 0;
    }
    return log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                    "commit: rank %d: needs %zu bytes of host memory (optimizer state %zu "
                    "bytes, exchange and Newton-Schulz buffers %zu, param_stats copies %zu)%s, "
                    "but %llu bytes are available (%s); most state here: %s; nothing was "
                    "allocated (shard over more ranks or nodes, keep the state in bf16, or "
                    "offload)",
                    rt->groups.me.rank, need, state, work, copies, with,
                    (unsigned long long)m.avail, m.src, largest);
}

shardopt_status_t commit_buffers_alloc(shardopt_runtime_t rt)
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
    /* a team's block: X and Y, its Gram matrix and B; with aol, B holds the m doubles of the
     * row scales first (ns_sharded_iter.c), 8-byte aligned */
    const int aol = rt->cfg.ns_precondition == SHARDOPT_NS_PRECONDITION_AOL;
    for (int k = 0; k < GROUP_KINDS; k++) {
        const struct group_plan *p = &rt->gx[k].plan;
        for (int w = 0; w < p->nowned; w++) {
            const struct plan_owned *o = &p->owned[w];
            if (o->team < 2)
                continue;
            const int64_t m = o->team_rows ? o->cols : o->rows;
            const size_t u = (size_t)(o->rows * o->cols),
                         g = (size_t)(m * m + (aol ? 2 * m + 2 : 0));
            sh_x = u > sh_x ? u : sh_x;
            sh_g = g > sh_g ? g : sh_g;
        }
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
            if (o->team > 1)
                continue; /* sharded Newton-Schulz: in sh_x */
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
    /* requests: one per block of the busiest bucket's lists (a receive and a send per peer at
     * most), not per member of the group */
    size_t blocks = 1;
    for (int k = 0; k < GROUP_KINDS; k++)
        for (int j = 0; j < rt->gx[k].plan.nbuckets; j++) {
            const struct plan_bucket *pb = &rt->gx[k].plan.buckets[j];
            blocks = (size_t)(pb->a.n + pb->b.n) > blocks ? (size_t)(pb->a.n + pb->b.n) : blocks;
        }
    const size_t np = (size_t)(rt->nparams ? rt->nparams : 1);
    const shardopt_status_t fits = host_memory_check(
        rt, sat_mul(PIPELINE_DEPTH, sat_mul(sat_add(sat_add(a, b), ns), es)),
        sat_mul(ws, sizeof(float)),
        sat_add(sat_mul(sh_u, es), sat_mul(sat_add(sat_mul(2, sh_x), sat_mul(2, sh_g)), 4)));
    if (fits != SHARDOPT_OK)
        return groups_agree(&rt->groups, fits, "commit");
    struct oom_note oom = {NULL, 0};
    for (int i = 0; i < PIPELINE_DEPTH; i++) {
        struct bucket_buffers *bb = &rt->bufs[i];
        bb->a = noted(&oom, buffer_alloc(rt, a * es), a * es, "an exchange #1 buffer");
        bb->b = noted(&oom, buffer_alloc(rt, b * es), b * es, "an exchange #2 buffer");
        bb->ns = noted(&oom, buffer_alloc(rt, ns * es), ns * es, "a Newton-Schulz slot buffer");
        const size_t req = sizeof(MPI_Request) * blocks;
        bb->req = noted(&oom, mem_malloc(req), req, "the exchange requests");
        const size_t peers = sizeof(int) * blocks;
        bb->peer = noted(&oom, mem_malloc(peers), peers, "the exchange peers");
        if (rt_on_device(rt)) {
            bb->ha = noted(&oom, rt->dev->host_alloc(a * es), a * es, "a pinned exchange mirror");
            bb->hb = noted(&oom, rt->dev->host_alloc(b * es), b * es, "a pinned exchange mirror");
            bb->hns = noted(&oom, rt->dev->host_alloc(ns * es), ns * es, "a pinned NS mirror");
            if (bb->ha && bb->hb && bb->hns)
                rt->bytes_workspace += (a + b + ns) * es; /* pinned host memory */
        }
    }
    /* where Newton-Schulz runs */
    rt->ns_ws.buf = noted(&oom, rt->ns_dev->alloc(ws * sizeof(float)), ws * sizeof(float),
                          "the Newton-Schulz workspace");
    rt->bytes_workspace += rt->ns_ws.buf != NULL ? ws * sizeof(float) : 0;
    rt->ns_ws.floats = ws;
    rt->sumsq =
        noted(&oom, mem_malloc(sizeof(double) * np), sizeof(double) * np, "the pre-pass sums");
    rt->pre_x =
        noted(&oom, mem_malloc(sizeof(void *) * np), sizeof(void *) * np, "the pre-pass pointers");
    rt->pre_dt = noted(&oom, mem_malloc(sizeof(int) * np), sizeof(int) * np, "the pre-pass dtypes");
    rt->pre_n =
        noted(&oom, mem_malloc(sizeof(size_t) * np), sizeof(size_t) * np, "the pre-pass counts");
    /* and behind them skip_missing_grads' two flags per parameter */
    rt->nonfinite =
        noted(&oom, mem_malloc(sizeof(int) * 3 * np), sizeof(int) * 3 * np, "the non-finite flags");
    rt->gradflags = rt->nonfinite != NULL ? rt->nonfinite + np : NULL;
    rt->pre_fin = noted(&oom, mem_malloc(sizeof(double) * 2 * np), sizeof(double) * 2 * np,
                        "the finite sums");
    if (rt->cfg.replica_check_every > 0) { /* the step allocates nothing: its buffers now */
        rt->drift = noted(&oom, mem_malloc(sizeof(uint32_t) * 4 * np), sizeof(uint32_t) * 4 * np,
                          "the replica checksums");
        if (rt_on_device(rt))
            rt->drift_host = noted(&oom, mem_malloc(REPLICA_CHECK_CHUNK), REPLICA_CHECK_CHUNK,
                                   "the replica check's host buffer");
    }
    const size_t R = (size_t)rt->groups.mesh.dp_replicate;
    rt->rep_counts =
        noted(&oom, mem_malloc(sizeof(int) * 2 * R), sizeof(int) * 2 * R, "the replica counts");
    rt->rep_displs = rt->rep_counts != NULL ? rt->rep_counts + R : NULL;
    /* 2 * np spans of scratch, then np of the data spans last stepped (alias_check_peers) */
    rt->alias = noted(&oom, mem_malloc(sizeof(*rt->alias) * 3 * np), sizeof(*rt->alias) * 3 * np,
                      "the buffer spans' check");
    rt->peer_spans = rt->alias != NULL ? rt->alias + 2 * np : NULL;
    rt->npeer_spans = 0;
    rt->peer_dirty = 1;
    /* sharded Newton-Schulz: U/O of one piece, X and Y, the Gram matrix and B */
    rt->sh_u = noted(&oom, buffer_alloc(rt, sh_u * es + 1), sh_u * es + 1,
                     "the sharded Newton-Schulz piece");
    /* X, Y, the Gram matrix and B where Newton-Schulz runs (the device with offload = cpu); at
     * least the two doubles of the sharded strategy's norm over NCCL (ns_sharded_sum.c) */
    const size_t shf = 2 * sh_x + 2 * sh_g,
                 shx = (shf > 0 && shf < 4 ? 4 : shf) * sizeof(float) + 1;
    rt->sh_x = noted(&oom, rt->ns_dev->alloc(shx), shx, "the sharded Newton-Schulz work");
    rt->bytes_workspace += rt->sh_x != NULL ? shx : 0;
    if (rt_ns_on_device(rt) && sh_g > 0) {
        /* the host side of its all-reduces and of AOL: a Gram matrix, AOL's m doubles, a block
         * (ns_sharded_sum.c, ns_sharded_aol_device); bf16 teams' AOL holds the block twice, fp32
         * and bf16 */
        const size_t bf16_x = rt->team_compute == KDT_BF16 ? sh_x / 2 + 2 : 0;
        const size_t hf = sh_x + sh_g + 2 + bf16_x, hb = (hf > 4 ? hf : 4) * sizeof(float);
        noted(&oom, sh_host_set(rt, hb), hb, "the sharded Newton-Schulz host staging");
        rt->bytes_workspace += rt->sh_host != NULL ? hb : 0;
    }
    /* the state: a host store with offload, which may refuse (host_store_limit) */
    const shardopt_status_t state_status = state_store_alloc(&rt->store);
    if (state_status == SHARDOPT_OK) {
        size_t failed = 0;
        const size_t staging = offload_alloc(rt, ns, sh_u, &failed);
        if (staging == (size_t)-1)
            noted(&oom, NULL, failed, "the offload staging buffers");
        else if (oom.what == NULL)
            rt->bytes_workspace += staging;
    }
    shardopt_status_t status = SHARDOPT_OK;
    if (state_status != SHARDOPT_OK) /* its message is the thread's last error still */
        status =
            log_fail_context(state_status, "commit: rank %d: optimizer state", rt->groups.me.rank);
    else if (oom.what != NULL)
        status = log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                          "commit: rank %d: out of memory allocating %zu bytes for %s (in all: "
                          "state %zu bytes, exchange buffers %zu + %zu bytes, NS slots %zu, "
                          "workspace %zu bytes)",
                          rt->groups.me.rank, oom.bytes, oom.what, rt->store.bytes,
                          PIPELINE_DEPTH * a * es, PIPELINE_DEPTH * b * es,
                          PIPELINE_DEPTH * ns * es, ws * sizeof(float));
    return groups_agree(&rt->groups, status, "commit");
}

/* bf16 teams on a device (commit.c, teams_setup): the device table's plans for this rank's
 * team blocks, and the bf16 Gram sum of their host all-reduces. Collective. */
static shardopt_status_t device_team_plans(shardopt_runtime_t rt)
{
    shardopt_status_t status = SHARDOPT_OK;
    for (int g = 0; status == SHARDOPT_OK && g < GROUP_KINDS; g++) {
        const struct group_plan *P = &rt->gx[g].plan;
        for (int w = 0; status == SHARDOPT_OK && w < P->nowned; w++) {
            const struct plan_owned *o = &P->owned[w];
            if (o->team < 2)
                continue; /* one owner: the device's own bf16 Newton-Schulz */
            const int64_t m = o->team_rows ? o->cols : o->rows,
                          n = o->team_rows ? o->rows : o->cols;
            status = ns_sharded_bf16_op(rt);
            if (status == SHARDOPT_OK && m > 0 && n > 0 &&
                rt->ns_ops->ns_shard_bf16_prepare(&rt->kctx, m, n, (const float(*)[3])rt->ns_coeffs,
                                                  rt->cfg.ns_steps) != 0)
                status = log_fail_context(
                    SHARDOPT_ERR_DEVICE, "commit: rank %d: bf16 team block %lld x %lld of '%s'",
                    rt->groups.me.rank, (long long)m, (long long)n, rt->params[o->param]->name);
        }
    }
    return groups_agree(&rt->groups, status, "commit");
}

/* ns_compute = bf16: every oneDNN primitive the step will run, made now (one plan per shape of
 * a matrix this rank orthogonalizes), so that the step makes none; on a device, the bf16 teams'
 * plans only (the device runs its own). Collective. */
shardopt_status_t commit_ns_bf16_plans(shardopt_runtime_t rt)
{
    const char *param = NULL; /* the parameter whose plan failed */

    if (rt->ns_compute != KDT_BF16)
        return SHARDOPT_OK;
    if (rt_ns_on_device(rt))
        return rt->team_compute == KDT_BF16 ? device_team_plans(rt) : SHARDOPT_OK;
    shardopt_status_t status = ns_bf16_create(&rt->ns_ws.bf16);
    for (int g = 0; status == SHARDOPT_OK && g < GROUP_KINDS; g++) {
        const struct group_plan *P = &rt->gx[g].plan;
        for (int w = 0; status == SHARDOPT_OK && w < P->nowned; w++) {
            const struct plan_owned *o = &P->owned[w];
            const struct shardopt_param *p = rt->params[o->param];
            if (o->team > 1) { /* my block of a team's matrix: m x n with the blocks along n */
                const int64_t m = o->team_rows ? o->cols : o->rows,
                              n = o->team_rows ? o->rows : o->cols;
                status = ns_sharded_bf16_op(rt);
                if (status == SHARDOPT_OK && m > 0 && n > 0)
                    status = ns_bf16_shard_prepare(
                        rt->ns_ws.bf16, m, n, (const float(*)[3])rt->ns_coeffs, rt->cfg.ns_steps);
                param = status != SHARDOPT_OK ? p->name : NULL;
                continue;
            }
            status = ns_bf16_prepare(rt->ns_ws.bf16, P->owned[w].rows, P->owned[w].cols,
                                     p->ns_variant, p->ns_block, p->ns_algorithm,
                                     (const float(*)[3])rt->ns_coeffs, rt->cfg.ns_steps);
            param = status != SHARDOPT_OK ? p->name : NULL;
        }
    }
    /* unsupported: this CPU has no bf16 matmul (not a bug); out of memory; internal: a bug */
    if (status != SHARDOPT_OK) {
        char detail[512];
        snprintf(detail, sizeof detail, "%s", shardopt_last_error()); /* not formatted in place */
        status = log_fail(status, "commit: rank %d: %s%s%s%s%s", rt->groups.me.rank, detail,
                          param != NULL ? " (parameter '" : "", param != NULL ? param : "",
                          param != NULL ? "')" : "",
                          status == SHARDOPT_ERR_UNSUPPORTED
                              ? ": this CPU has no oneDNN bf16 matmul; use ns_compute = fp32 "
                                "or auto"
                              : "");
    }
    status = groups_agree(&rt->groups, status, "commit");
    if (status == SHARDOPT_OK && rt->groups.me.rank == 0)
        log_info("commit: bf16 Newton-Schulz: %d oneDNN primitives (%s)",
                 ns_bf16_primitive_count(rt->ns_ws.bf16), ns_bf16_impl(rt->ns_ws.bf16));
    return status;
}

/* param_stats = 1: room for every local shard as it was before the update, and the per-parameter
 * sums, so that the step allocates nothing. Parameters in device memory keep no copy (their
 * update RMS reads NaN). Agreed: one rank short of memory fails commit on every rank. */
shardopt_status_t commit_param_stats_alloc(shardopt_runtime_t rt)
{
    shardopt_status_t status = SHARDOPT_OK;
    size_t bytes = 0;
    const char *past = NULL; /* the parameter whose copy passes SIZE_MAX bytes */
    for (int i = 0; i < rt->nparams; i++) {
        struct shardopt_param *p = rt->params[i];
        p->grad_norm_last = p->update_rms_last = NAN;
        /* each copy at its own 64-byte boundary: after a bf16 tensor of odd length an fp32
         * copy started 2 bytes off its alignment, and the step's reads of it were misaligned
         * (UBSan, test_xcheck's mixed dtypes with param_stats) */
        const size_t n = (size_t)p->layout.local_numel * kdtype_size(p->param_dtype);
        p->off_snapshot = 0;
        if (past != NULL)
            continue;
        if (!mem_align_up(bytes, 64, &bytes) || n > SIZE_MAX - bytes) {
            past = p->name;
            continue;
        }
        p->off_snapshot = bytes;
        bytes += n;
    }
    if (rt->cfg.param_stats && !rt_on_device(rt) && past != NULL)
        status = log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                          "commit: rank %d: param_stats' copy of the parameters passes SIZE_MAX "
                          "bytes at parameter '%s'",
                          rt->groups.me.rank, past);
    else if (rt->cfg.param_stats && !rt_on_device(rt)) {
        rt->pstat_snap = mem_malloc(bytes ? bytes : 1);
        rt->pstat_sum = mem_malloc(sizeof(double) * (size_t)(rt->nparams ? rt->nparams : 1));
        if (rt->pstat_snap == NULL || rt->pstat_sum == NULL)
            status = log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                              "commit: rank %d: out of memory allocating %zu bytes for "
                              "param_stats' copy of the parameters",
                              rt->groups.me.rank, bytes);
    }
    return groups_agree(&rt->groups, status, "commit");
}

/* The optimizer step (docs/design.md, The step): validate everywhere, the gradient pre-pass, AdamW
 * tensors, then the Muon tensors group by group. Everything is validated, on every rank, before
 * anything is written, and nothing is allocated. */
#include <math.h>
#include <string.h>

#include "base/log.h"
#include "base/status.h"
#include "kernels/clock.h"
#include "runtime/comm/comm_wait.h"
#include "runtime/config/config_keys.h"
#include "runtime/runtime.h"
#include "runtime/step/alias_check.h"
#include "runtime/step/args_agree.h"
#include "runtime/step/muon_exec.h"
#include "runtime/step/ns_sharded.h"
#include "runtime/step/offload_exec.h"
#include "runtime/step/prepass.h"
#include "runtime/step/replica_check.h"
#include "runtime/step/state_check.h"

/* The largest lr, adamw_lr and weight_decay a step takes: the config's bound on weight decay */
#define STEP_ARG_MAX 1e6

/* Per-call scalars, resolved once from the args and the config. */
struct step_scalars {
    double lr, adamw_lr;
    double muon_wd, adamw_wd;
    double max_grad_norm;
    int skip_missing;         /* skip_missing_grads */
    double momentum;          /* Muon's mu: args.momentum, or the config's */
    double beta1, beta2, eps; /* AdamW's: args.adamw_*, or the config's */
};

/* A double field of args added in version v (momentum in 3, the AdamW ones in 4), or -1 (the
 * config's) where the caller's struct predates it. */
#define STEP_ARG_SINCE(args, v, f)                                                                 \
    ((args)->version >= (v) && (args)->size >= offsetof(shardopt_step_args_t, f) + sizeof(double)  \
         ? (args)->f                                                                               \
         : -1.0)

/* args.adamw_beta1 / beta2 / eps: < 0 the config's, else the config's own range for the key
 * ([0, 1) for the betas, [CONFIG_EPS_MIN, 1] for eps); -inf and NaN are a computation gone wrong,
 * not "the config's". */
static shardopt_status_t step_adamw_hparams(const shardopt_runtime_t rt,
                                            const shardopt_step_args_t *args,
                                            struct step_scalars *sc)
{
    const double b1 = STEP_ARG_SINCE(args, 4, adamw_beta1),
                 b2 = STEP_ARG_SINCE(args, 4, adamw_beta2),
                 eps = STEP_ARG_SINCE(args, 4, adamw_eps);
    const char *const names[2] = {"adamw_beta1", "adamw_beta2"};
    const double betas[2] = {b1, b2};
    for (int k = 0; k < 2; k++)
        if (!(betas[k] < 1 && isfinite(betas[k])))
            return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                            "step: %s = %g: accepted a finite value < 0 (the config's) or a value "
                            "in [0, 1); nothing was updated",
                            names[k], betas[k]);
    if (!(eps <= 1 && (eps < 0 || eps >= CONFIG_EPS_MIN) && isfinite(eps)))
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "step: adamw_eps = %g: accepted a finite value < 0 (the config's) or a "
                        "value in (0, 1] of at least %.10g (FLT_MIN: the kernels' fp32 makes a "
                        "smaller eps 0, a zero gradient 0/0); nothing was updated",
                        eps, CONFIG_EPS_MIN);
    sc->beta1 = b1 < 0 ? rt->cfg.adamw_beta1 : b1;
    sc->beta2 = b2 < 0 ? rt->cfg.adamw_beta2 : b2;
    sc->eps = eps < 0 ? rt->cfg.adamw_eps : eps;
    return SHARDOPT_OK;
}

/* Device backends: each parameter's data and grad where the step uses them (the device with
 * offload none or optimizer, the host with offload = cpu), checked when a pointer changes. A
 * host pointer in a device kernel, or a device pointer in a host one, would crash or corrupt
 * memory; another GPU's memory means this rank's runtime was started on the wrong device. */
static shardopt_status_t step_pointers(shardopt_runtime_t rt)
{
    const int on_device = rt_on_device(rt), rank = rt->groups.me.rank;
    if (!device_has(rt->ns_dev, DEVICE_CAP_POINTER_KIND))
        return SHARDOPT_OK;
    for (int i = 0; i < rt->nparams; i++) {
        struct shardopt_param *p = rt->params[i];
        if (p->layout.local_numel == 0 ||
            (p->data == p->checked_data && p->grad == p->checked_grad))
            continue;
        const void *const ptr[2] = {p->data, p->grad};
        for (int k = 0; k < 2; k++) {
            int dev[2];
            if (ptr[k] == NULL) /* a gradient skip_missing_grads let through */
                continue;
            const int kind = rt->ns_dev->pointer_kind(&rt->kctx, ptr[k], dev);
            const char *what = k ? "grad" : "data";
            if (on_device && kind == KERNEL_PTR_HOST)
                return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                                "step: rank %d: parameter '%s': %s is host memory, but backend = "
                                "cuda with offload = %s updates parameters on the device: register "
                                "device memory (or use offload = cpu); nothing was updated",
                                rank, p->name, what,
                                rt->cfg.offload == SHARDOPT_OFFLOAD_NONE ? "none" : "optimizer");
            if (!on_device && (kind == KERNEL_PTR_DEVICE || kind == KERNEL_PTR_OTHER))
                return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                                "step: rank %d: parameter '%s': %s is memory of CUDA device %d, "
                                "but offload = cpu updates parameters on the host: register host "
                                "memory; nothing was updated",
                                rank, p->name, what, dev[0]);
            if (kind == KERNEL_PTR_OTHER)
                return log_fail(
                    SHARDOPT_ERR_INVALID_ARGUMENT,
                    "step: rank %d: parameter '%s': %s is memory of CUDA device %d, but "
                    "this rank's runtime runs on device %d (make the tensor's device "
                    "current before shardopt_init, or set device = local_rank); "
                    "nothing was updated",
                    rank, p->name, what, dev[0], dev[1]);
        }
        p->checked_data = p->data;
        p->checked_grad = p->grad;
    }
    return SHARDOPT_OK;
}

/* Local checks; the caller makes every rank agree on the outcome. */
static shardopt_status_t step_validate(shardopt_runtime_t rt, const shardopt_step_args_t *args,
                                       struct step_scalars *sc)
{
    if (!rt->committed)
        return log_fail(SHARDOPT_ERR_STATE, "step: runtime not committed (call shardopt_commit)");
    const shardopt_status_t live = rt_mpi_live("step");
    if (live != SHARDOPT_OK)
        return live;
    const shardopt_status_t fits = args_agree_struct_check(args);
    if (fits != SHARDOPT_OK)
        return fits;
    const double max_norm =
        args->size >= offsetof(shardopt_step_args_t, max_grad_norm) + sizeof(double)
            ? args->max_grad_norm
            : 0.0;
    const int skip_missing =
        args->size >= offsetof(shardopt_step_args_t, skip_missing_grads) + sizeof(int)
            ? args->skip_missing_grads
            : 0;
    if (skip_missing != 0 && skip_missing != 1)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "step: skip_missing_grads = %d: accepted 0 (a NULL grad fails the step) "
                        "or 1 (a parameter without a gradient on every rank is skipped)",
                        skip_missing);
    if (args->lr == SHARDOPT_LR_UNSET)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "step: lr is not set: SHARDOPT_STEP_ARGS_INIT leaves it unset so that a "
                        "forgotten learning rate does not make steps that change nothing; set "
                        "args.lr each step (0 is accepted when set)");
    /* the upper bounds are the config's for weight decay and the descriptor's for lr_mult: a
     * finite lr of 1e308 made a successful step that left every weight -inf */
    if (!(args->lr >= 0 && args->lr <= STEP_ARG_MAX))
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "step: lr = %g: accepted [0, %g]", args->lr,
                        STEP_ARG_MAX);
    /* a negative value means "the default"; -inf is a computation gone wrong, not that */
    if (!(args->adamw_lr <= STEP_ARG_MAX && isfinite(args->adamw_lr)))
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "step: adamw_lr = %g: accepted a finite value < 0 (use lr) or [0, %g]",
                        args->adamw_lr, STEP_ARG_MAX);
    if (!(args->weight_decay <= STEP_ARG_MAX && isfinite(args->weight_decay)))
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "step: weight_decay = %g: accepted a finite value < 0 (use the config's) "
                        "or [0, %g]",
                        args->weight_decay, STEP_ARG_MAX);
    const double momentum = STEP_ARG_SINCE(args, 3, momentum);
    if (!(momentum < 1 && isfinite(momentum))) /* -inf: gone wrong, not "the config's" */
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "step: momentum = %g: accepted a finite value < 0 (the config's) or a "
                        "value in [0, 1)",
                        momentum);
    if (!(isfinite(max_norm)))
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "step: max_grad_norm = %g: accepted <= 0 (no clipping) or a finite value",
                        max_norm);
    const shardopt_status_t hp = step_adamw_hparams(rt, args, sc);
    if (hp != SHARDOPT_OK)
        return hp;
    for (int i = 0; i < rt->nparams; i++) {
        const struct shardopt_param *p = rt->params[i];
        if (p->layout.local_numel > 0 && (p->data == NULL || (p->grad == NULL && !skip_missing)))
            return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                            "step: parameter '%s' has a NULL %s pointer (set it with "
                            "shardopt_param_set_pointers, or skip parameters without a gradient "
                            "with args.skip_missing_grads = 1); nothing was updated",
                            p->name, p->data == NULL ? "data" : "grad");
    }
    shardopt_status_t st = step_pointers(rt);
    if (st == SHARDOPT_OK)
        st = alias_check(rt);
    if (st != SHARDOPT_OK)
        return st;
    sc->lr = args->lr;
    sc->adamw_lr = args->adamw_lr < 0 ? args->lr : args->adamw_lr;
    sc->muon_wd = args->weight_decay < 0 ? rt->cfg.weight_decay : args->weight_decay;
    sc->adamw_wd = args->weight_decay < 0 ? rt->cfg.adamw_weight_decay : args->weight_decay;
    sc->max_grad_norm = max_norm;
    sc->skip_missing = skip_missing;
    sc->momentum = momentum < 0 ? rt->cfg.momentum : momentum;
    return SHARDOPT_OK;
}

struct adamw_call {
    const struct step_scalars *sc;
    float grad_scale;
};

/* The AdamW kernel of one range, its state at m and v (the store, or a staging slot). */
static void adamw_kernel(shardopt_runtime_t rt, const struct state_range *r, void *m, void *v,
                         const void *arg)
{
    const struct adamw_call *call = arg;
    const struct step_scalars *sc = call->sc;
    const struct shardopt_param *p = r->p;
    const shardopt_config_t *c = &rt->cfg;
    const double t = (double)(p->step + 1);
    /* 1-D tensors (norms, biases) take no decay unless weight_decay_1d: a norm weight at 1.0
     * would shrink toward 0 with no gradient at all */
    const double wd1 = p->layout.ndim == 1 && !c->weight_decay_1d ? 0.0 : 1.0;
    const double lr = sc->adamw_lr * p->lr_mult, wd = sc->adamw_wd * p->wd_mult * wd1;
    struct adamw_args a = {
        .n = r->n,
        .param = (char *)p->data + r->off * kdtype_size(p->param_dtype),
        .param_dtype = p->param_dtype,
        .param_rounding = c->param_rounding,
        .grad = (const char *)p->grad + r->off * kdtype_size(p->grad_dtype),
        .grad_dtype = p->grad_dtype,
        .grad_scale = call->grad_scale,
        .exp_avg = m,
        .exp_avg_sq = v,
        .m_dtype = c->adam_state_dtype,
        .v_dtype = c->adam_v_dtype,
        .state_rounding = c->momentum_rounding,
        .rng_m = rng_stream_make(c->seed, p->name_hash, RNG_KIND_EXP_AVG, p->step + 1),
        .rng_v = rng_stream_make(c->seed, p->name_hash, RNG_KIND_EXP_AVG_SQ, p->step + 1),
        .beta1 = (float)sc->beta1,
        .beta2 = (float)sc->beta2,
        .one_minus_beta1 = (float)(1.0 - sc->beta1),
        .one_minus_beta2 = (float)(1.0 - sc->beta2),
        .eps = (float)sc->eps,
        /* this step's betas in the bias correction too, as torch.optim.AdamW's 1 - beta^t */
        .step_size = (float)(lr / (1.0 - pow(sc->beta1, t))),
        .bc2_rsqrt = (float)(1.0 / sqrt(1.0 - pow(sc->beta2, t))),
        .decay = (float)(1.0 - lr * wd),
        .rng = rng_stream_make(c->seed, p->name_hash, RNG_KIND_PARAM, p->step + 1),
        .idx = elem_index_map_at(&p->index_map, r->off),
    };
    ew_adamw(rt, &a);
}

/* Range i: the i-th AdamW tensor, whole (empty for the others). */
static int adamw_tensor(void *arg, int i, struct state_range *r)
{
    shardopt_runtime_t rt = arg;
    if (i >= rt->nparams)
        return 0;
    struct shardopt_param *p = rt->params[i];
    *r = (struct state_range){.p = p, .off = 0, .n = 0, .out = NULL};
    if (p->algo == SHARDOPT_ALGO_ADAMW && !p->skip)
        r->n = (size_t)p->layout.local_numel;
    return 1;
}

static void counters_reset(struct step_counters *k)
{
    k->ns_flops_last = 0;
    memset(k->bytes_sent, 0, sizeof k->bytes_sent);
    k->bytes_ns_allreduce = 0;
    memset(k->bytes_recv, 0, sizeof k->bytes_recv);
    k->seconds_prepass_last = k->seconds_adamw_last = k->seconds_momentum_last = 0;
    k->seconds_exchange1_last = k->seconds_ns_last = k->seconds_exchange2_last = 0;
    k->seconds_apply_last = k->seconds_ns_sharded_last = 0;
    k->last_skipped = 0;
    k->nonfinite_elements_last = 0;
}

/* A non-finite gradient somewhere: skip (nothing changes anywhere) or fail, on every rank. */
static shardopt_status_t step_nonfinite(shardopt_runtime_t rt, int tensors, int too_large)
{
    struct step_counters *k = &rt->counters;
    char what[192] = "NaN/Inf gradients";
    if (too_large == tensors)
        snprintf(what, sizeof what,
                 "gradients too large for the optimizer state (a norm over %g after clipping: "
                 "the fp32 state would overflow; clip with max_grad_norm)",
                 PREPASS_GRAD_NORM_MAX);
    else if (too_large > 0)
        snprintf(what, sizeof what,
                 "NaN/Inf gradients, or gradients too large for the optimizer state (%d of them: "
                 "a norm over %g after clipping),",
                 too_large, PREPASS_GRAD_NORM_MAX);
    if (rt->cfg.nonfinite == SHARDOPT_NONFINITE_ERROR)
        return log_fail(SHARDOPT_ERR_NONFINITE, "step: %s in %d tensor(s): %s; nothing was updated",
                        what, tensors, k->nonfinite_last);
    k->skipped++;
    k->last_skipped = 1;
    if (rt->groups.me.rank == 0)
        log_warn("step: skipped (step %llu): %s in %d tensor(s): %s",
                 (unsigned long long)k->steps + 1, what, tensors, k->nonfinite_last);
    return SHARDOPT_OK;
}

/* Device backends: the step reads gradients after the trainer's stream has written them, and
 * the trainer's stream reads parameters after the step wrote them (or, without a stream, the
 * step returns when its work is done). This rank's status; the caller agrees. */
static shardopt_status_t step_stream(shardopt_runtime_t rt, const shardopt_step_args_t *args,
                                     int end)
{
    const shardopt_status_t status =
        (end ? rt->dev->stream_end : rt->dev->stream_begin)(&rt->kctx, args->stream);
    if (status != SHARDOPT_OK)
        return log_fail_context(status, "step: rank %d", rt->groups.me.rank);
    return SHARDOPT_OK;
}

/* Some group's exchanges complete on a device stream after the step's calls return (NCCL): the
 * step's end drains them, and a peer learns of a failed one only there. */
static int step_deferred(const struct shardopt_runtime *rt)
{
    int any = 0;
    for (int i = 0; i < XPORTS; i++)
        any |= rt->xport[i].ops->deferred;
    return any;
}

/* The step's last agreement. With a deferred transport, a rank may get here at once (its drain
 * found nothing to wait for, or its exchange failed) while a peer is still in a drain that can
 * take comm_timeout_s: the agreement waits that long again before it ends the job. */
static shardopt_status_t step_end_agree(const struct shardopt_runtime *rt, shardopt_status_t mine)
{
    struct groups patient = rt->groups; /* the same communicators, a longer deadline */
    if (step_deferred(rt))
        patient.timeout_s *= 2; /* 0 (never) stays 0 */
    return groups_agree(&patient, mine, "step");
}

/* The step's exchanges have completed, or (comm_timeout_s) the error with the group named; with
 * NCCL the host waits here, never inside the step. This rank's status. */
static shardopt_status_t step_drain(shardopt_runtime_t rt)
{
    shardopt_status_t status = SHARDOPT_OK;
    for (int i = 0; i < XPORTS && status == SHARDOPT_OK; i++)
        status = rt->xport[i].ops->drain(&rt->xport[i]);
    return status;
}

/* After a failed step: exchanges that no peer will match may be left on a communicator, so
 * every one is aborted (docs/api.md: finalize), and finalize never waits on one. */
static void step_abort(shardopt_runtime_t rt)
{
    for (int i = 0; i < XPORTS; i++)
        rt->xport[i].ops->abort(&rt->xport[i]);
    rt_teams_nccl_aborted(rt, 1); /* and the Newton-Schulz teams' */
}

/* Whether a failed step aborted the communicators: the next step must refuse before it writes
 * anything (its first exchange would refuse only after the AdamW tensors and the first bucket's
 * momentum were updated). */
static int step_aborted(shardopt_runtime_t rt)
{
    int any = 0;
    for (int i = 0; i < XPORTS; i++)
        any |= rt->xport[i].ops->aborted(&rt->xport[i]);
    return any | rt_teams_nccl_aborted(rt, 0);
}

/* shardopt_param_get_stats: each gradient's norm is the pre-pass's (free); with param_stats the
 * shards are copied before the update, to measure the change after it. */
static void param_stats_before(shardopt_runtime_t rt)
{
    for (int i = 0; i < rt->nparams; i++) {
        struct shardopt_param *p = rt->params[i];
        p->grad_norm_last = p->skip ? NAN : sqrt(rt->sumsq[i]);
        p->update_rms_last = NAN;
        if (rt->pstat_snap != NULL && p->layout.local_numel > 0)
            memcpy((char *)rt->pstat_snap + p->off_snapshot, p->data,
                   (size_t)p->layout.local_numel * kdtype_size(p->param_dtype));
    }
}

static void param_stats_after(shardopt_runtime_t rt)
{
    const struct groups *g = &rt->groups;
    if (rt->pstat_snap == NULL)
        return;
    for (int i = 0; i < rt->nparams; i++) {
        const struct shardopt_param *p = rt->params[i];
        const void *old = (const char *)rt->pstat_snap + p->off_snapshot;
        double sum = 0.0;
        /* a replicated tensor once per replica: dense rank 0's copy */
        if (p->placement != SHARDOPT_PLACEMENT_REPLICATED || g->me.d == 0)
            for (int64_t j = 0; j < p->layout.local_numel; j++) {
                const double d = (double)kload(p->data, p->param_dtype, j) -
                                 (double)kload(old, p->param_dtype, j);
                sum += d * d;
            }
        rt->pstat_sum[i] = sum;
    }
    /* replicas hold the same shards: the dense group's sum is the tensor's */
    comm_allreduce(g, g->dense, MPI_IN_PLACE, rt->pstat_sum, rt->nparams, MPI_DOUBLE, MPI_SUM,
                   "param_stats update sums");
    for (int i = 0; i < rt->nparams; i++)
        rt->params[i]->update_rms_last =
            sqrt(rt->pstat_sum[i] / (double)rt->params[i]->layout.global_numel);
}

/* The scalars every rank must agree on (args_agree.h), as they take effect. Not compared:
 * args.stream, the trainer's own CUDA stream on each rank (a pointer of that process), and
 * args.size / version, which only say how much of the struct a rank's header has (what it
 * holds is compared). There is no per-rank gradient scale among the arguments: the clipping
 * scale comes from the global norm, the same on every rank. */
static void step_agreed_values(shardopt_runtime_t rt, const struct step_scalars *sc,
                               double vals[ARGS_AGREE_N])
{
    vals[ARGS_AGREE_LR] = sc->lr;
    vals[ARGS_AGREE_ADAMW_LR] = sc->adamw_lr;
    vals[ARGS_AGREE_MUON_WD] = sc->muon_wd;
    vals[ARGS_AGREE_ADAMW_WD] = sc->adamw_wd;
    vals[ARGS_AGREE_MOMENTUM] = sc->momentum;
    vals[ARGS_AGREE_ADAMW_BETA1] = sc->beta1;
    vals[ARGS_AGREE_ADAMW_BETA2] = sc->beta2;
    vals[ARGS_AGREE_ADAMW_EPS] = sc->eps;
    vals[ARGS_AGREE_MAX_GRAD_NORM] = sc->max_grad_norm > 0 ? sc->max_grad_norm : 0.0;
    vals[ARGS_AGREE_SKIP_MISSING] = sc->skip_missing;
    vals[ARGS_AGREE_STEPS] = (double)rt->counters.steps;
}

/* skip_missing_grads, once every rank has validated its arguments (collective): which
 * parameters have a NULL gradient on every rank that holds elements of them (p->skip), from one
 * all-reduce (max) of a rank without and a rank with a gradient each. Every rank sees the same
 * flags, so each reaches the same verdict: a parameter without a gradient on some ranks only
 * fails the step everywhere, before anything is written. */
static shardopt_status_t step_missing_grads(shardopt_runtime_t rt, int on)
{
    const int n = rt->nparams, rank = rt->groups.me.rank;
    int *lack = rt->gradflags, *have = rt->gradflags + n;
    for (int i = 0; i < n; i++)
        rt->params[i]->skip = 0;
    if (!on || n == 0)
        return SHARDOPT_OK;
    for (int i = 0; i < n; i++) {
        const struct shardopt_param *p = rt->params[i];
        const int held = p->layout.local_numel > 0;
        lack[i] = held && p->grad == NULL ? rank + 1 : 0;
        have[i] = held && p->grad != NULL ? rank + 1 : 0;
    }
    comm_phase("step: agreeing on missing gradients (skip_missing_grads)", -1);
    if (groups_allreduce(&rt->groups, rt->gradflags, 2 * n, MPI_INT, MPI_MAX) != MPI_SUCCESS)
        return log_fail(SHARDOPT_ERR_COMM,
                        "step: the all-reduce of missing gradients (skip_missing_grads) failed");
    for (int i = 0; i < n; i++)
        if (lack[i] && have[i])
            return log_fail(SHARDOPT_ERR_MISMATCH,
                            "step: parameter '%s' has no gradient (NULL grad) on rank %d but has "
                            "one on rank %d: skip_missing_grads skips a parameter only when "
                            "every rank holding elements of it passes NULL; nothing was updated",
                            rt->params[i]->name, lack[i] - 1, have[i] - 1);
    for (int i = 0; i < n; i++)
        rt->params[i]->skip = lack[i] != 0;
    return SHARDOPT_OK;
}

static shardopt_status_t step_run(shardopt_runtime_t rt, const shardopt_step_args_t *args)
{
    shardopt_status_t status;
    struct step_scalars sc = {0};
    struct prepass_result pre;
    struct step_counters *k;
    struct tl_clock clk;
    double t0 = monotonic_seconds();

    if (rt == NULL) /* local: nothing to agree over */
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "step: NULL runtime");
    comm_phase("step: checking the arguments (every rank must call the step)", -1);
    status = args == NULL ? log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "step: NULL args")
                          : step_validate(rt, args, &sc);
    if (status == SHARDOPT_OK) /* the step's work goes to init's device from any thread */
        status = rt_device_enter(rt, "step");
    if (status == SHARDOPT_OK && rt->committed && step_aborted(rt))
        status = log_fail(SHARDOPT_ERR_NCCL,
                          "step: rank %d: the NCCL communicators were aborted after an earlier "
                          "step failed; nothing was updated: finalize, init again and load the "
                          "last checkpoint",
                          rt->groups.me.rank);
    if (status == SHARDOPT_OK && rt->committed && (rt->exchange_abandoned || rt->ns_torn))
        status = log_fail(SHARDOPT_ERR_STATE,
                          "step: rank %d: an earlier step failed %s; nothing was updated: "
                          "finalize, init again and load the last checkpoint",
                          rt->groups.me.rank,
                          rt->exchange_abandoned ? "with exchanges in flight, which a peer's "
                                                   "message may still complete"
                                                 : "in its Muon phase (Newton-Schulz, or a "
                                                   "device copy of its exchanges) after writing "
                                                   "part of its update (the replicas may differ)");
    /* the step is collective: a check failing on one rank (not committed and NULL args too)
     * fails it on all, instead of leaving them here until comm_timeout_s; the same all-reduce
     * compares a digest of the arguments, and only when they differ is the slow path taken */
    double vals[ARGS_AGREE_N];
    int differ = 0;
    step_agreed_values(rt, &sc, vals);
    status = groups_agree_digest(&rt->groups, status, "step", args_agree_digest(rt, vals), &differ);
    if (status == SHARDOPT_OK && differ)
        status = args_agree_find(rt, vals);
    if (status != SHARDOPT_OK)
        return status;
    /* every rank validated the same arguments: skip_missing_grads is on everywhere or nowhere */
    status = step_missing_grads(rt, sc.skip_missing);
    if (status != SHARDOPT_OK)
        return status;
    k = &rt->counters;
    stats_phases_settle(rt);
    counters_reset(k);
    staging_counts_reset(&rt->stage);
    timeline_begin(&rt->timeline);
    /* device backends; every rank agrees on a failure */
    if (device_has(rt->dev, DEVICE_CAP_STREAMS)) {
        status = groups_agree(&rt->groups, step_stream(rt, args, 0), "step");
        if (status != SHARDOPT_OK)
            return status;
    }
    /* after the trainer's stream: its work is not the step's */
    timeline_start(&rt->timeline, &clk, 0);

    if (rt->cfg.check_state_every > 0 && k->steps % (uint64_t)rt->cfg.check_state_every == 0) {
        /* after the trainer's stream, before anything is written; the same outcome on every rank */
        comm_phase("step: state check", -1);
        status = state_check(rt);
        if (status != SHARDOPT_OK)
            return status;
    }
    status = prepass_run(rt, sc.max_grad_norm, &pre);
    if (status != SHARDOPT_OK)
        return status;
    k->grad_norm_last = pre.norm;
    timeline_lap(&rt->timeline, &clk, &k->seconds_prepass_last);
    if (pre.nonfinite) {
        for (int i = 0; i < rt->nparams; i++)
            rt->params[i]->grad_norm_last = rt->params[i]->update_rms_last = NAN;
        return step_nonfinite(rt, pre.nonfinite, pre.too_large);
    }
    param_stats_before(rt);

    const struct adamw_call call = {.sc = &sc, .grad_scale = pre.grad_scale};
    offload_state_run(rt, SHARDOPT_ALGO_ADAMW, adamw_tensor, rt, adamw_kernel, &call);
    ew_flush(rt); /* every AdamW tensor in one launch on a device backend */
    timeline_lap(&rt->timeline, &clk, &k->seconds_adamw_last);

    const struct muon_scalars ms = {.lr = sc.lr, .wd = sc.muon_wd, .grad_scale = pre.grad_scale};
    rt->step_momentum = sc.momentum;
    status = ns_sharded_run(rt, &ms, muon_run(rt, &ms)); /* agreed when either is collective */
    /* offload = optimizer: the buckets' last copy-outs ran on beside the work after them; the
     * compute stream (and so the step's end, or a failed step's next call) waits for them here,
     * once */
    staging_join(&rt->stage);
    /* Over MPI the other ranks are inside an MPI wait that ends the job (comm_wait). Over NCCL
     * (a deferred transport) they never wait inside the step: they learn of a failed exchange
     * only when their drain times out, so a rank whose exchange failed meets them at the
     * agreement below instead of returning alone (which left them to MPI_Abort there) */
    if (status != SHARDOPT_OK && !(step_deferred(rt) && device_has(rt->dev, DEVICE_CAP_STREAMS)))
        return status;
    /* exchanges, then the stream: one agreement for both */
    if (device_has(rt->dev, DEVICE_CAP_STREAMS)) {
        if (status == SHARDOPT_OK)
            status = step_drain(rt);
        if (status == SHARDOPT_OK)
            status = step_stream(rt, args, 1);
        status = step_end_agree(rt, status);
        if (status != SHARDOPT_OK) {
            step_abort(rt);
            return status;
        }
    }
    param_stats_after(rt);
    for (int i = 0; i < rt->nparams; i++)
        rt->params[i]->step += !rt->params[i]->skip;
    k->steps++;
    alias_check_peers_stepped(rt); /* its data spans as stepped, for the others' checks */
    /* after the update, which stands either way: a failure here says the replicas differ */
    if (rt->cfg.replica_check_every > 0 && k->steps % (uint64_t)rt->cfg.replica_check_every == 0) {
        comm_phase("step: replica check", -1);
        status = replica_check(rt);
    }
    k->seconds_last = monotonic_seconds() - t0;
    k->seconds_total += k->seconds_last;
    return status;
}

shardopt_status_t shardopt_step(shardopt_runtime_t rt, const shardopt_step_args_t *args)
{
    const shardopt_status_t claimed = rt_claim(rt, "step");
    if (claimed != SHARDOPT_OK)
        return claimed;
    const shardopt_status_t status = step_run(rt, args);
    if (rt != NULL) /* copies after the step (a save) are not the step's */
        timeline_end(&rt->timeline);
    rt_release(rt);
    return status;
}

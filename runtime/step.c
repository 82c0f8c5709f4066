/* The optimizer step on one process: AdamW tensors, then for each Muon parameter momentum and
 * pack, Newton-Schulz, apply (DESIGN.md §1). Everything is validated before anything is
 * written, and nothing is allocated. */
#include <math.h>
#include <time.h>

#include "runtime.h"
#include "status.h"

/* Per-call scalars, resolved once from the args and the config. */
struct step_scalars {
    double lr, adamw_lr;
    double muon_wd, adamw_wd;
};

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static struct elem_index_map param_index_map(const struct shardopt_param *p)
{
    struct elem_index_map m;
    layout_index_runs(&p->layout, &m.base, &m.run, &m.stride);
    return m;
}

static shardopt_status_t step_validate(shardopt_runtime_t rt, const shardopt_step_args_t *args,
                                       struct step_scalars *sc)
{
    if (rt == NULL || args == NULL)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "step: NULL %s",
                        rt == NULL ? "runtime" : "args");
    if (!rt->committed)
        return log_fail(SHARDOPT_ERR_STATE, "step: runtime not committed (call shardopt_commit)");
    if (rt->groups.mesh.world > 1)
        return log_fail(SHARDOPT_ERR_UNSUPPORTED,
                        "step: %d ranks: the distributed step is not implemented yet",
                        rt->groups.mesh.world);
    if (args->version < 1 || args->version > SHARDOPT_STEP_ARGS_VERSION ||
        args->size < offsetof(shardopt_step_args_t, stream) + sizeof(void *))
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "step: args version %u / size %zu: initialise with SHARDOPT_STEP_ARGS_INIT",
                        args->version, args->size);
    if (!(args->lr >= 0 && isfinite(args->lr)))
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "step: lr = %g: accepted a finite value >= 0", args->lr);
    if (!(args->adamw_lr < 0 || isfinite(args->adamw_lr)))
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "step: adamw_lr = %g: accepted < 0 (use lr) or a finite value",
                        args->adamw_lr);
    if (!(args->weight_decay < 0 || isfinite(args->weight_decay)))
        return log_fail(
            SHARDOPT_ERR_INVALID_ARGUMENT,
            "step: weight_decay = %g: accepted < 0 (use the config's) or a finite value",
            args->weight_decay);
    for (int i = 0; i < rt->nparams; i++) {
        const struct shardopt_param *p = rt->params[i];
        if (p->layout.local_numel > 0 && (p->grad == NULL || p->data == NULL))
            return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                            "step: parameter '%s' has a NULL %s pointer (set it with "
                            "shardopt_param_set_pointers); nothing was updated",
                            p->name, p->grad == NULL ? "grad" : "data");
    }
    sc->lr = args->lr;
    sc->adamw_lr = args->adamw_lr < 0 ? args->lr : args->adamw_lr;
    sc->muon_wd = args->weight_decay < 0 ? rt->cfg.weight_decay : args->weight_decay;
    sc->adamw_wd = args->weight_decay < 0 ? rt->cfg.adamw_weight_decay : args->weight_decay;
    return SHARDOPT_OK;
}

static void step_adamw(shardopt_runtime_t rt, struct shardopt_param *p,
                       const struct step_scalars *sc)
{
    const shardopt_config_t *c = &rt->cfg;
    const double t = (double)(p->step + 1);
    const double lr = sc->adamw_lr * p->lr_mult, wd = sc->adamw_wd * p->wd_mult;
    struct adamw_args a = {
        .n = (size_t)p->layout.local_numel,
        .param = p->data,
        .param_dtype = p->param_dtype,
        .param_rounding = c->param_rounding,
        .grad = p->grad,
        .grad_dtype = p->grad_dtype,
        .grad_scale = 1.0f,
        .exp_avg = state_store_ptr(&rt->store, p->off_exp_avg),
        .exp_avg_sq = state_store_ptr(&rt->store, p->off_exp_avg_sq),
        .beta1 = (float)c->adamw_beta1,
        .beta2 = (float)c->adamw_beta2,
        .one_minus_beta1 = (float)(1.0 - c->adamw_beta1),
        .one_minus_beta2 = (float)(1.0 - c->adamw_beta2),
        .eps = (float)c->adamw_eps,
        .step_size = (float)(lr / (1.0 - pow(c->adamw_beta1, t))),
        .bc2_rsqrt = (float)(1.0 / sqrt(1.0 - pow(c->adamw_beta2, t))),
        .decay = (float)(1.0 - lr * wd),
        .rng = rng_stream_make(c->seed, p->name_hash, RNG_KIND_PARAM, p->step + 1),
        .idx = param_index_map(p),
    };
    rt->ops->adamw(&rt->kctx, &a);
}

static shardopt_status_t step_muon(shardopt_runtime_t rt, struct shardopt_param *p,
                                   const struct step_scalars *sc)
{
    const shardopt_config_t *c = &rt->cfg;
    const size_t n = (size_t)p->layout.local_numel;
    const double lr = sc->lr * p->lr_mult, wd = sc->muon_wd * p->wd_mult;
    const struct elem_index_map idx = param_index_map(p);
    struct step_counters *k = &rt->counters;
    double t0 = now_seconds(), t1, t2;

    struct momentum_args m = {
        .n = n,
        .grad = p->grad,
        .grad_dtype = p->grad_dtype,
        .grad_scale = 1.0f,
        .mom = state_store_ptr(&rt->store, p->off_momentum),
        .mom_dtype = c->momentum_dtype,
        .mom_rounding = c->momentum_rounding,
        .out = rt->u_buf,
        .out_dtype = c->comm_dtype,
        .mu = (float)c->momentum,
        .nesterov = c->nesterov,
        .rng = rng_stream_make(c->seed, p->name_hash, RNG_KIND_MOMENTUM, p->step + 1),
        .idx = idx,
    };
    rt->ops->momentum(&rt->kctx, &m);
    t1 = now_seconds();

    struct ns_args ns = {
        .batch = p->mv.batch,
        .rows = p->mv.rows,
        .cols = p->mv.cols,
        .transpose = p->mv.ns_transpose,
        .in = rt->u_buf,
        .in_dtype = c->comm_dtype,
        .out = rt->o_buf,
        .out_dtype = c->comm_dtype,
        .coeffs = (const float(*)[3])rt->ns_coeffs,
        .steps = c->ns_steps,
        .norm_scale = rt->ns_norm_scale,
        .eps = (float)c->ns_eps,
        .variant = p->ns_variant,
    };
    if (rt->ops->newton_schulz(&rt->kctx, &ns, &rt->ns_ws) != 0)
        return log_fail(SHARDOPT_ERR_INTERNAL,
                        "step '%s': Newton-Schulz refused [%lld x %lld] variant %d in kernels %s",
                        p->name, (long long)p->mv.rows, (long long)p->mv.cols, p->ns_variant,
                        rt->ops->name);
    t2 = now_seconds();
    k->ns_flops_last += ns_flops_per_iter(p->mv.rows, p->mv.cols) * c->ns_steps * p->mv.batch;

    struct apply_args a = {
        .n = n,
        .param = p->data,
        .param_dtype = p->param_dtype,
        .param_rounding = c->param_rounding,
        .update = rt->o_buf,
        .update_dtype = c->comm_dtype,
        .alpha = (float)(lr * p->lr_scale),
        .decay = (float)(1.0 - lr * wd),
        .rng = rng_stream_make(c->seed, p->name_hash, RNG_KIND_PARAM, p->step + 1),
        .idx = idx,
    };
    rt->ops->apply(&rt->kctx, &a);
    k->seconds_momentum_last += t1 - t0;
    k->seconds_ns_last += t2 - t1;
    k->seconds_apply_last += now_seconds() - t2;
    return SHARDOPT_OK;
}

shardopt_status_t shardopt_step(shardopt_runtime_t rt, const shardopt_step_args_t *args)
{
    shardopt_status_t status;
    struct step_scalars sc = {0};
    struct step_counters *k;
    double t0 = now_seconds(), t1;

    status = step_validate(rt, args, &sc);
    if (status != SHARDOPT_OK)
        return status;
    k = &rt->counters;
    k->ns_flops_last = 0;
    k->seconds_momentum_last = k->seconds_ns_last = k->seconds_apply_last = 0;

    for (int i = 0; i < rt->nparams; i++)
        if (rt->params[i]->algo == SHARDOPT_ALGO_ADAMW && rt->params[i]->layout.local_numel > 0)
            step_adamw(rt, rt->params[i], &sc);
    t1 = now_seconds();
    k->seconds_adamw_last = t1 - t0;

    for (int i = 0; i < rt->nparams; i++)
        if (rt->params[i]->algo == SHARDOPT_ALGO_MUON && rt->params[i]->layout.local_numel > 0) {
            status = step_muon(rt, rt->params[i], &sc);
            if (status != SHARDOPT_OK)
                return status;
        }

    for (int i = 0; i < rt->nparams; i++)
        rt->params[i]->step++;
    k->steps++;
    k->seconds_last = now_seconds() - t0;
    k->seconds_total += k->seconds_last;
    return SHARDOPT_OK;
}

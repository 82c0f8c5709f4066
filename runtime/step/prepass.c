#include "runtime/step/prepass.h"

#include <math.h>
#include <string.h>

#include "base/fault.h"
#include "base/log.h"
#include "base/status.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/elem_rules.h"
#include "runtime/comm/comm_wait.h"

/* nonfinite = zero: for the flagged tensors (the same set on every rank), the sum of squares of
 * their finite elements and the count of the others, summed over the dense group, replace the
 * NaN/Inf sums; the norm then counts what the kernels will use (they treat those elements as 0).
 * Host memory only: init refuses this policy on a device backend. */
static shardopt_status_t zero_nonfinite(shardopt_runtime_t rt, int bad, double *zeroed_p)
{
    const struct groups *g = &rt->groups;
    double *fin = rt->pre_fin, *cnt = rt->pre_fin + bad;
    int j = 0;
    for (int i = 0; i < rt->nparams; i++) {
        if (!rt->nonfinite[i])
            continue;
        const struct shardopt_param *p = rt->params[i];
        double s = 0, c = 0;
        /* a replicated tensor counts once, on dense rank 0 (each rank zeroes its own copy) */
        if (p->placement != SHARDOPT_PLACEMENT_REPLICATED || g->me.d == 0)
            for (int64_t e = 0; e < p->layout.local_numel; e++) {
                const double v = kload(p->grad, p->grad_dtype, (size_t)e);
                if (isfinite(v))
                    s += v * v;
                else
                    c += 1;
            }
        fin[j] = s;
        cnt[j++] = c;
    }
    if (comm_allreduce(g, g->dense, MPI_IN_PLACE, fin, 2 * bad, MPI_DOUBLE, MPI_SUM,
                       "finite sums all-reduce") != MPI_SUCCESS)
        return log_fail(SHARDOPT_ERR_COMM, "step: pre-pass all-reduce (nonfinite = zero) failed");
    double zeroed = 0;
    j = 0;
    for (int i = 0; i < rt->nparams; i++)
        if (rt->nonfinite[i]) {
            rt->sumsq[i] = fin[j];
            zeroed += cnt[j++];
        }
    *zeroed_p = zeroed;
    return SHARDOPT_OK;
}

void prepass_sumsq(shardopt_runtime_t rt, int host)
{
    if (rt->ops->sumsq_many != NULL && !host) { /* a device: one wait for all */
        if (rt->nparams > 0)
            rt->ops->sumsq_many(&rt->kctx, rt->pre_x, rt->pre_dt, rt->pre_n, rt->nparams,
                                rt->sumsq);
        return;
    }
    for (int i = 0; i < rt->nparams; i++) {
        const void *x = rt->pre_x[i];
        const int dt = rt->pre_dt[i];
        const size_t n = rt->pre_n[i];
        rt->sumsq[i] = n == 0 ? 0.0
                       : host ? cpu_sumsq(NULL, x, dt, n)
                              : rt->ops->sumsq(&rt->kctx, x, dt, n);
    }
}

/* The clipping scale of a gradient norm: max_grad_norm / (norm + 1e-6) where clipping applies,
 * else 1 (the step rounds it to fp32 for the kernels). */
static double clip_scale(double norm, double max_grad_norm)
{
    return max_grad_norm > 0 && norm > max_grad_norm ? max_grad_norm / (norm + 1e-6) : 1.0;
}

/* A tensor's gradient (its sum of squares) too large for the state once clipped by scale. */
static int too_large_after(double sumsq, double scale)
{
    return sqrt(sumsq) * scale > PREPASS_GRAD_NORM_MAX;
}

shardopt_status_t prepass_run(shardopt_runtime_t rt, double max_grad_norm, struct prepass_result *r)
{
    const struct groups *g = &rt->groups;
    double total = 0;

    for (int i = 0; i < rt->nparams; i++) {
        const struct shardopt_param *p = rt->params[i];
        /* every rank sums its own gradients, a replicated tensor's too: each rank applies its
         * copy's, so a NaN in any copy must stop the step (below, it counts once in the norm) */
        /* a parameter skip_missing_grads skips has no gradient: it adds 0 to the norm and
         * cannot be non-finite (its data stands in for the NULL pointer; nothing is read) */
        rt->pre_x[i] = p->skip ? p->data : p->grad;
        rt->pre_dt[i] = p->grad_dtype;
        rt->pre_n[i] = p->skip ? 0 : (size_t)p->layout.local_numel;
    }
    prepass_sumsq(rt, 0);
    /* a replicated tensor is whole on every rank: its sum counts once per replica (dense rank
     * 0's), the other ranks add 0, or their NaN/Inf */
    for (int i = 0; i < rt->nparams; i++)
        if (rt->params[i]->placement == SHARDOPT_PLACEMENT_REPLICATED && g->me.d != 0 &&
            isfinite(rt->sumsq[i]))
            rt->sumsq[i] = 0.0;
    /* every element of a replica lives on exactly one rank of its dense shard group (expert
     * stacks included: EP x expert shard = the dense group), so one all-reduce there counts each
     * once; replicas hold the same values and are not added */
    comm_phase("step: gradient pre-pass", -1);
    if (fault_hit("step.prepass")) /* a stand-in for an MPI failure; or a hang (tests) */
        return log_fail(SHARDOPT_ERR_COMM, "step: pre-pass all-reduce failed (injected)");
    if (comm_allreduce(g, g->dense, MPI_IN_PLACE, rt->sumsq, rt->nparams, MPI_DOUBLE, MPI_SUM,
                       "sums of squares all-reduce") != MPI_SUCCESS)
        return log_fail(SHARDOPT_ERR_COMM, "step: pre-pass all-reduce failed");

    /* replicas must agree on what to do, and name the same tensors, even if their gradients
     * differ */
    int bad = 0, too_large = 0;
    double finite_total = 0;
    for (int i = 0; i < rt->nparams; i++) {
        rt->nonfinite[i] = !isfinite(rt->sumsq[i]);
        finite_total += rt->nonfinite[i] ? 0.0 : rt->sumsq[i];
    }
    /* finite gradients the state cannot hold (flag 2), judged after clipping. The scale is the
     * one the step uses, or (nonfinite = zero with NaN/Inf elements, whose finite parts add to
     * the norm) a larger one: the judgement may only err towards refusing */
    const double finite_norm = sqrt(finite_total);
    const double scale = clip_scale(finite_norm, max_grad_norm);
    for (int i = 0; i < rt->nparams; i++)
        if (!rt->nonfinite[i] && too_large_after(rt->sumsq[i], scale))
            rt->nonfinite[i] = 2;
    /* a failed all-reduce leaves the flags undefined: a replica acting on its own would skip or
     * step apart from the others (its return value was ignored); the fault site stands in for an
     * MPI failure, on every rank it is armed on */
    if (g->mesh.dp_replicate > 1 &&
        (fault_hit("step.prepass.rep") ||
         comm_allreduce(g, g->rep, MPI_IN_PLACE, rt->nonfinite, rt->nparams, MPI_INT, MPI_MAX,
                        "non-finite flags all-reduce") != MPI_SUCCESS))
        return log_fail(SHARDOPT_ERR_COMM,
                        "step: pre-pass all-reduce of the non-finite flags over the replicate "
                        "group failed; nothing was updated");
    for (int i = 0; i < rt->nparams; i++) {
        bad += rt->nonfinite[i] != 0;
        too_large += rt->nonfinite[i] == 2;
    }
    r->nonfinite = bad;
    r->too_large = too_large;
    rt->counters.nonfinite_last[0] = '\0';
    if (bad) {
        size_t o = 0;
        char *names = rt->counters.nonfinite_last;
        const size_t len = sizeof rt->counters.nonfinite_last;
        for (int i = 0; i < rt->nparams && o + 1 < len; i++)
            if (rt->nonfinite[i]) {
                int w = snprintf(names + o, len - o, "%s%s", o ? ", " : "", rt->params[i]->name);
                o = w > 0 && (size_t)w < len - o ? o + (size_t)w : len - 1;
            }
        /* nonfinite = zero treats NaN/Inf elements as 0; a finite gradient too large to step
         * has no such element: the step is skipped (or fails) as under skip (or error) */
        if (rt->cfg.nonfinite != SHARDOPT_NONFINITE_ZERO || too_large > 0) {
            r->norm = NAN;
            r->grad_scale = 1.0f;
            return SHARDOPT_OK;
        }
        double zeroed = 0;
        shardopt_status_t st = zero_nonfinite(rt, bad, &zeroed);
        if (st != SHARDOPT_OK)
            return st;
        /* the finite part of a tensor holding NaN/Inf may itself be too large for the state:
         * the check above saw only a non-finite sum (test_xcheck's 1e30 gradients with one -Inf
         * element stepped under zero and overflowed exp_avg_sq to Inf); judged again on the sums
         * the step uses, with its clipping scale, and agreed over the replicas as the flags are */
        double zt = 0;
        for (int i = 0; i < rt->nparams; i++)
            zt += rt->sumsq[i];
        const double zs = clip_scale(sqrt(zt), max_grad_norm);
        int big = 0;
        for (int i = 0; i < rt->nparams; i++)
            big += rt->nonfinite[i] && too_large_after(rt->sumsq[i], zs);
        if (g->mesh.dp_replicate > 1 &&
            comm_allreduce(g, g->rep, MPI_IN_PLACE, &big, 1, MPI_INT, MPI_MAX,
                           "too-large count all-reduce") != MPI_SUCCESS)
            return log_fail(SHARDOPT_ERR_COMM,
                            "step: pre-pass all-reduce of the too-large count over the replicate "
                            "group failed; nothing was updated");
        /* counted and logged only once the step is known to go ahead: a step skipped here for
         * a too-large tensor applied nothing, and "treated as 0" with the count in the stats
         * claimed a zeroing that never reached the weights (the skip is logged by the step) */
        if (big > 0) {
            r->too_large = big;
            r->norm = NAN;
            r->grad_scale = 1.0f;
            return SHARDOPT_OK;
        }
        rt->counters.nonfinite_elements_last = (uint64_t)zeroed;
        if (g->me.rank == 0)
            log_warn("step %llu: %llu NaN/Inf gradient element(s) treated as 0 (nonfinite = "
                     "zero) in: %s",
                     (unsigned long long)rt->counters.steps + 1, (unsigned long long)zeroed,
                     rt->counters.nonfinite_last);
        r->nonfinite = 0; /* the kernels treat those elements as 0: the step goes ahead */
    }
    for (int i = 0; i < rt->nparams; i++)
        total += rt->sumsq[i];
    r->norm = sqrt(total);
    /* the scale is rounded to fp32 for the kernels, which also hides the last-bit differences a
     * different summation order (another layout) gives the norm */
    r->grad_scale = (float)clip_scale(r->norm, max_grad_norm);
    return SHARDOPT_OK;
}

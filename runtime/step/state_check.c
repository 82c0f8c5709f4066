#include "runtime/step/state_check.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>

#include "base/status.h"
#include "runtime/comm/comm_wait.h"
#include "runtime/step/prepass.h"

/* Array a of parameter p: 0 the parameter shard, 1 momentum (Muon) or exp_avg (AdamW),
 * 2 exp_avg_sq (AdamW; none for Muon). NULL and 0 elements when the parameter has no such
 * array. */
static const void *array_of(shardopt_runtime_t rt, const struct shardopt_param *p, int a, int *dt,
                            size_t *n)
{
    const shardopt_config_t *c = &rt->cfg;
    *n = (size_t)p->layout.local_numel;
    if (a == 0) {
        *dt = p->param_dtype;
        return p->data;
    }
    if (p->algo == SHARDOPT_ALGO_MUON) {
        *dt = c->momentum_dtype;
        *n = a == 1 ? *n : 0;
        return a == 1 ? state_store_ptr(&rt->store, p->off_momentum) : NULL;
    }
    *dt = a == 1 ? c->adam_state_dtype : c->adam_v_dtype;
    return state_store_ptr(&rt->store, a == 1 ? p->off_exp_avg : p->off_exp_avg_sq);
}

static const char *array_name(const struct shardopt_param *p, int a)
{
    if (a == 0)
        return "parameter";
    return p->algo == SHARDOPT_ALGO_MUON ? "momentum" : a == 1 ? "exp_avg" : "exp_avg_sq";
}

/* Sums of squares in double of array a of every parameter into rt->sumsq: finite exactly when
 * every element is (fp32's largest square, 1.2e77, summed 2^53 times stays finite). */
static void array_sums(shardopt_runtime_t rt, int a)
{
    for (int i = 0; i < rt->nparams; i++) {
        int dt = 0;
        size_t n = 0;
        const void *x = array_of(rt, rt->params[i], a, &dt, &n);
        rt->pre_x[i] = x != NULL ? x : rt->params[i]->grad; /* not read when n = 0 */
        rt->pre_dt[i] = dt;
        rt->pre_n[i] = x != NULL ? n : 0;
    }
    /* parameters are where the kernels read them; a host store (offload) is read on the host */
    prepass_sumsq(rt, a > 0 && rt->store.host);
}

shardopt_status_t state_check(shardopt_runtime_t rt)
{
    const struct groups *g = &rt->groups;
    int *bad = rt->nonfinite, any = 0;
    for (int i = 0; i < rt->nparams; i++)
        bad[i] = 0;
    for (int a = 0; a < 3; a++) {
        array_sums(rt, a);
        for (int i = 0; i < rt->nparams; i++)
            if (!isfinite(rt->sumsq[i]))
                bad[i] |= 1 << a;
    }
    for (int i = 0; i < rt->nparams; i++)
        any |= bad[i];
    /* which arrays, on any rank; and the lowest rank with one */
    int first = any ? g->me.rank : INT_MAX;
    if (groups_allreduce(g, bad, rt->nparams, MPI_INT, MPI_BOR) != MPI_SUCCESS ||
        groups_allreduce(g, &first, 1, MPI_INT, MPI_MIN) != MPI_SUCCESS)
        return log_fail(SHARDOPT_ERR_COMM, "step: state check all-reduce failed");
    if (first == INT_MAX)
        return SHARDOPT_OK;

    char *names = rt->counters.nonfinite_last;
    const size_t len = sizeof rt->counters.nonfinite_last;
    size_t o = 0;
    int tensors = 0;
    names[0] = '\0';
    for (int i = 0; i < rt->nparams; i++) {
        if (!bad[i])
            continue;
        tensors++;
        for (int a = 0; a < 3 && o + 1 < len; a++)
            if (bad[i] & (1 << a)) {
                int w = snprintf(names + o, len - o, "%s%s (%s)", o ? ", " : "",
                                 rt->params[i]->name, array_name(rt->params[i], a));
                o = w > 0 && (size_t)w < len - o ? o + (size_t)w : len - 1;
            }
    }
    return log_fail(SHARDOPT_ERR_NONFINITE,
                    "step %llu: NaN/Inf before the update in %d tensor(s), first on rank %d: %s; "
                    "nothing was updated (check_state_every)",
                    (unsigned long long)rt->counters.steps + 1, tensors, first, names);
}

/* Buffers of the step that share memory (alias_check.h). */
#include "runtime/step/alias_check.h"

#include <stdlib.h>

#include "base/log.h"
#include "base/status.h"

static int by_lo(const void *a, const void *b)
{
    const struct alias_span *x = a, *y = b;
    return (x->lo > y->lo) - (x->lo < y->lo);
}

static shardopt_status_t refuse(shardopt_runtime_t rt, const struct alias_span *a,
                                const struct alias_span *b)
{
    /* name the parameter registered first first: the message does not depend on addresses */
    if (a->param > b->param || (a->param == b->param && a->grad > b->grad)) {
        const struct alias_span *t = a;
        a = b;
        b = t;
    }
    const char *what = a->grad || b->grad ? "the step would write a buffer it reads"
                                          : "the step would update that memory twice";
    return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                    "step: rank %d: the %s of parameter '%s' [%p, +%zu bytes) and the %s of "
                    "parameter '%s' [%p, +%zu bytes) share memory: %s (register a tied weight "
                    "once; give each parameter its own data and gradient buffers); nothing was "
                    "updated",
                    rt->groups.me.rank, a->grad ? "grad" : "data", rt->params[a->param]->name,
                    (void *)a->lo, (size_t)(a->hi - a->lo), b->grad ? "grad" : "data",
                    rt->params[b->param]->name, (void *)b->lo, (size_t)(b->hi - b->lo), what);
}

shardopt_status_t alias_check(shardopt_runtime_t rt)
{
    int changed = 0, n = 0;
    for (int i = 0; i < rt->nparams && !changed; i++)
        changed = rt->params[i]->data != rt->params[i]->alias_data ||
                  rt->params[i]->grad != rt->params[i]->alias_grad;
    if (!changed || rt->alias == NULL)
        return SHARDOPT_OK;
    for (int i = 0; i < rt->nparams; i++) {
        const struct shardopt_param *p = rt->params[i];
        const size_t count = (size_t)p->layout.local_numel;
        if (count == 0)
            continue;
        if (p->data != NULL)
            rt->alias[n++] = (struct alias_span){
                (uintptr_t)p->data, (uintptr_t)p->data + count * kdtype_size(p->param_dtype), i, 0};
        if (p->grad != NULL)
            rt->alias[n++] = (struct alias_span){
                (uintptr_t)p->grad, (uintptr_t)p->grad + count * kdtype_size(p->grad_dtype), i, 1};
    }
    qsort(rt->alias, (size_t)n, sizeof *rt->alias, by_lo);
    /* A sweep in address order against the span that reaches furthest so far: a data span that
     * overlaps anything overlaps that one, or is it and overlaps the next span; two gradients
     * overlapping is allowed (both are only read) */
    int far = -1;
    for (int j = 0; j < n; j++) {
        const struct alias_span *s = &rt->alias[j];
        if (far >= 0 && s->lo < rt->alias[far].hi && !(s->grad && rt->alias[far].grad))
            return refuse(rt, &rt->alias[far], s);
        if (far < 0 || s->hi > rt->alias[far].hi)
            far = j;
    }
    for (int i = 0; i < rt->nparams; i++) {
        rt->params[i]->alias_data = rt->params[i]->data;
        rt->params[i]->alias_grad = rt->params[i]->grad;
    }
    return SHARDOPT_OK;
}

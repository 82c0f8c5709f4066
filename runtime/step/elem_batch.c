#include "runtime/step/elem_batch.h"

#include "runtime/runtime.h"

void ew_flush(struct shardopt_runtime *rt)
{
    struct ew_pending *e = rt->ew;
    if (e == NULL || e->count == 0)
        return;
    if (e->kind == 1)
        rt->ops->momentum_many(&rt->kctx, e->u.m, e->count);
    else if (e->kind == 2)
        rt->ops->adamw_many(&rt->kctx, e->u.a, e->count);
    else
        rt->ops->apply_many(&rt->kctx, e->u.p, e->count);
    e->count = 0;
    e->kind = 0;
}

/* The slot for the next call of `kind`, or NULL: run it now. */
static struct ew_pending *ew_slot(struct shardopt_runtime *rt, int kind, int have_many)
{
    struct ew_pending *e = rt->ew;
    if (e == NULL || !have_many || rt->cfg.offload == SHARDOPT_OFFLOAD_OPTIMIZER)
        return NULL;
    if (e->kind != kind || e->count == EW_PENDING_MAX)
        ew_flush(rt);
    e->kind = kind;
    return e;
}

void ew_momentum(struct shardopt_runtime *rt, const struct momentum_args *a)
{
    struct ew_pending *e = ew_slot(rt, 1, rt->ops->momentum_many != NULL);
    if (e == NULL)
        rt->ops->momentum(&rt->kctx, a);
    else
        e->u.m[e->count++] = *a;
}

void ew_adamw(struct shardopt_runtime *rt, const struct adamw_args *a)
{
    struct ew_pending *e = ew_slot(rt, 2, rt->ops->adamw_many != NULL);
    if (e == NULL)
        rt->ops->adamw(&rt->kctx, a);
    else
        e->u.a[e->count++] = *a;
}

void ew_apply(struct shardopt_runtime *rt, const struct apply_args *a)
{
    struct ew_pending *e = ew_slot(rt, 3, rt->ops->apply_many != NULL);
    if (e == NULL)
        rt->ops->apply(&rt->kctx, a);
    else
        e->u.p[e->count++] = *a;
}

#include "muon_exec.h"

#include <time.h>

#include "status.h"

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *at(void *base, size_t elems, size_t es) { return (char *)base + elems * es; }

static const void *cat(const void *base, size_t elems, size_t es)
{
    return (const char *)base + elems * es;
}

static void pieces_momentum(shardopt_runtime_t rt, const struct group_plan *P,
                            const struct plan_bucket *b, float grad_scale)
{
    const shardopt_config_t *c = &rt->cfg;
    const size_t es = kdtype_size(c->comm_dtype), ms = kdtype_size(c->momentum_dtype);

    for (int q = b->piece_lo; q < b->piece_hi; q++) {
        const struct plan_piece *pc = &P->pieces[q];
        const struct shardopt_param *p = rt->params[pc->param];
        const size_t off = (size_t)pc->local_off;
        struct momentum_args m = {
            .n = (size_t)pc->count,
            .grad = cat(p->grad, off, kdtype_size(p->grad_dtype)),
            .grad_dtype = p->grad_dtype,
            .grad_scale = grad_scale,
            .mom = at(state_store_ptr(&rt->store, p->off_momentum), off, ms),
            .mom_dtype = c->momentum_dtype,
            .mom_rounding = c->momentum_rounding,
            .out = at(pc->direct ? rt->ns_buf : rt->a_buf, pc->buf, es),
            .out_dtype = c->comm_dtype,
            .mu = (float)c->momentum,
            .nesterov = c->nesterov,
            .rng = rng_stream_make(c->seed, p->name_hash, RNG_KIND_MOMENTUM, p->step + 1),
            .idx = elem_index_map_at(&p->index_map, off),
        };
        rt->ops->momentum(&rt->kctx, &m);
    }
}

/* Exchange #1 (A -> B) or #2 (B -> A). Bytes are counted here, where they go to MPI. */
static shardopt_status_t exchange(shardopt_runtime_t rt, enum group_kind kind,
                                  const struct plan_bucket *b, int second)
{
    const struct group_exec *gx = &rt->gx[kind];
    const int me = gx->plan.me;
    const size_t es = kdtype_size(rt->cfg.comm_dtype);
    MPI_Datatype t = rt->cfg.comm_dtype == SHARDOPT_DTYPE_BF16 ? MPI_UINT16_T : MPI_FLOAT;
    const int *sc = second ? b->b_counts : b->a_counts, *sd = second ? b->b_displs : b->a_displs;
    const int *rc = second ? b->a_counts : b->b_counts, *rd = second ? b->a_displs : b->b_displs;
    void *sbuf = second ? rt->b_buf : rt->a_buf, *rbuf = second ? rt->a_buf : rt->b_buf;

    if (gx->comm == MPI_COMM_NULL)
        return SHARDOPT_OK; /* every matrix is direct */
    for (int i = 0; i < gx->plan.members; i++)
        if (i != me) {
            rt->counters.bytes_sent[kind] += (uint64_t)sc[i] * es;
            rt->counters.bytes_recv[kind] += (uint64_t)rc[i] * es;
        }
    if (MPI_Alltoallv(sbuf, sc, sd, t, rbuf, rc, rd, t, gx->comm) != MPI_SUCCESS)
        return log_fail(SHARDOPT_ERR_COMM, "step: exchange #%d of the %s group failed",
                        second ? 2 : 1, kind == GROUP_DENSE ? "dense" : "expert shard");
    return SHARDOPT_OK;
}

/* Between B's pieces and the whole matrices in the NS slots. */
static void pieces_move(shardopt_runtime_t rt, const struct group_plan *P,
                        const struct plan_bucket *b, int to_slots)
{
    const size_t es = kdtype_size(rt->cfg.comm_dtype);

    for (int w = b->owned_lo; w < b->owned_hi; w++) {
        const struct plan_owned *ow = &P->owned[w];
        for (int in = ow->in_lo; in < ow->in_hi; in++) {
            const struct plan_incoming *pi = &P->incoming[in];
            void *slot = at(rt->ns_buf, ow->slot + (size_t)(pi->r0 * ow->cols + pi->c0), es);
            void *piece = at(rt->b_buf, pi->buf, es);
            const size_t width = (size_t)(pi->c1 - pi->c0) * es, pitch = (size_t)ow->cols * es;
            if (to_slots)
                rt->ops->copy2d(&rt->kctx, slot, pitch, piece, width, width,
                                (size_t)(pi->r1 - pi->r0));
            else
                rt->ops->copy2d(&rt->kctx, piece, width, slot, pitch, width,
                                (size_t)(pi->r1 - pi->r0));
        }
    }
}

/* Newton-Schulz on my matrices, batching runs of consecutive experts of one stack. */
static shardopt_status_t owned_orthogonalize(shardopt_runtime_t rt, const struct group_plan *P,
                                             const struct plan_bucket *b)
{
    const shardopt_config_t *c = &rt->cfg;
    const size_t es = kdtype_size(c->comm_dtype);

    for (int w = b->owned_lo; w < b->owned_hi;) {
        const struct plan_owned *ow = &P->owned[w];
        const struct shardopt_param *p = rt->params[ow->param];
        int n = 1;
        while (w + n < b->owned_hi && P->owned[w + n].param == ow->param &&
               P->owned[w + n].k == ow->k + n)
            n++;
        struct ns_args ns = {
            .batch = n,
            .rows = ow->rows,
            .cols = ow->cols,
            .transpose = p->mv.ns_transpose,
            .in = at(rt->ns_buf, ow->slot, es),
            .in_dtype = c->comm_dtype,
            .out = at(rt->ns_buf, ow->slot, es),
            .out_dtype = c->comm_dtype,
            .coeffs = (const float(*)[3])rt->ns_coeffs,
            .steps = c->ns_steps,
            .norm_scale = rt->ns_norm_scale,
            .eps = (float)c->ns_eps,
            .variant = p->ns_variant,
        };
        if (rt->ops->newton_schulz(&rt->kctx, &ns, &rt->ns_ws) != 0)
            return log_fail(SHARDOPT_ERR_INTERNAL,
                            "step '%s': Newton-Schulz refused [%lld x %lld] variant %d in kernels "
                            "%s",
                            p->name, (long long)ow->rows, (long long)ow->cols, p->ns_variant,
                            rt->ops->name);
        rt->counters.ns_flops_last += ns_flops_per_iter(ow->rows, ow->cols) * c->ns_steps * n;
        w += n;
    }
    return SHARDOPT_OK;
}

static void pieces_apply(shardopt_runtime_t rt, const struct group_plan *P,
                         const struct plan_bucket *b, const struct muon_scalars *s)
{
    const shardopt_config_t *c = &rt->cfg;
    const size_t es = kdtype_size(c->comm_dtype);

    for (int q = b->piece_lo; q < b->piece_hi; q++) {
        const struct plan_piece *pc = &P->pieces[q];
        const struct shardopt_param *p = rt->params[pc->param];
        const double lr = s->lr * p->lr_mult, wd = s->wd * p->wd_mult;
        const size_t off = (size_t)pc->local_off;
        struct apply_args a = {
            .n = (size_t)pc->count,
            .param = at(p->data, off, kdtype_size(p->param_dtype)),
            .param_dtype = p->param_dtype,
            .param_rounding = c->param_rounding,
            .update = at(pc->direct ? rt->ns_buf : rt->a_buf, pc->buf, es),
            .update_dtype = c->comm_dtype,
            .alpha = (float)(lr * p->lr_scale),
            .decay = (float)(1.0 - lr * wd),
            .rng = rng_stream_make(c->seed, p->name_hash, RNG_KIND_PARAM, p->step + 1),
            .idx = elem_index_map_at(&p->index_map, off),
        };
        rt->ops->apply(&rt->kctx, &a);
    }
}

shardopt_status_t muon_group_run(shardopt_runtime_t rt, enum group_kind kind,
                                 const struct muon_scalars *s)
{
    const struct group_plan *P = &rt->gx[kind].plan;
    struct step_counters *k = &rt->counters;
    shardopt_status_t status;

    for (int bi = 0; bi < P->nbuckets; bi++) {
        const struct plan_bucket *b = &P->buckets[bi];
        double t0 = now_seconds(), t1, t2, t3, t4;
        pieces_momentum(rt, P, b, s->grad_scale);
        t1 = now_seconds();
        status = exchange(rt, kind, b, 0);
        if (status != SHARDOPT_OK)
            return status;
        pieces_move(rt, P, b, 1);
        t2 = now_seconds();
        status = owned_orthogonalize(rt, P, b);
        if (status != SHARDOPT_OK)
            return status;
        t3 = now_seconds();
        pieces_move(rt, P, b, 0);
        status = exchange(rt, kind, b, 1);
        if (status != SHARDOPT_OK)
            return status;
        t4 = now_seconds();
        pieces_apply(rt, P, b, s);
        k->seconds_momentum_last += t1 - t0;
        k->seconds_exchange1_last += t2 - t1;
        k->seconds_ns_last += t3 - t2;
        k->seconds_exchange2_last += t4 - t3;
        k->seconds_apply_last += now_seconds() - t4;
    }
    return SHARDOPT_OK;
}

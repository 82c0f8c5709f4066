#include "runtime/step/muon_exec.h"

#include <string.h>

#include "base/fault.h"
#include "base/log.h"
#include "base/status.h"
#include "kernels/clock.h"
#include "kernels/ns_coeffs.h"
#include "runtime/step/ns_sharded.h"
#include "runtime/step/offload_exec.h"

/* One bucket of one group, and the buffer set it uses while in flight. */
struct stage {
    enum group_kind kind;
    const struct plan_bucket *b;
    struct bucket_buffers *buf;
    int seq;            /* position in the pipeline */
    struct comm_xfer x; /* its exchange (one at a time: #2 starts after #1 is waited for) */
};

/* A bucket's index in its group's plan, for messages. */
static int stage_bucket(shardopt_runtime_t rt, const struct stage *st)
{
    return (int)(st->b - rt->gx[st->kind].plan.buckets);
}

static void *at(void *base, size_t elems, size_t es) { return (char *)base + elems * es; }

static const void *cat(const void *base, size_t elems, size_t es)
{
    return (const char *)base + elems * es;
}

/* The momentum kernel of one range, its momentum at mom (the store, or a staging slot). */
static void momentum_kernel(shardopt_runtime_t rt, const struct state_range *r, void *mom,
                            void *unused, const void *arg)
{
    const shardopt_config_t *c = &rt->cfg;
    const struct shardopt_param *p = r->p;
    (void)unused;
    struct momentum_args m = {
        .n = r->n,
        .grad = cat(p->grad, r->off, kdtype_size(p->grad_dtype)),
        .grad_dtype = p->grad_dtype,
        .grad_scale = *(const float *)arg,
        .mom = mom,
        .mom_dtype = c->momentum_dtype,
        .mom_rounding = c->momentum_rounding,
        .out = r->out,
        .out_dtype = c->comm_dtype,
        .mu = (float)rt->step_momentum,
        .nesterov = c->nesterov,
        .rng = rng_stream_make(c->seed, p->name_hash, RNG_KIND_MOMENTUM, p->step + 1),
        .idx = elem_index_map_at(&p->index_map, r->off),
    };
    ew_momentum(rt, &m);
}

static int one_range(void *arg, int i, struct state_range *r)
{
    if (i > 0)
        return 0;
    *r = *(const struct state_range *)arg;
    return 1;
}

void muon_momentum_range(shardopt_runtime_t rt, struct shardopt_param *p, size_t off, size_t n,
                         void *out, float grad_scale)
{
    struct state_range r = {.p = p, .off = off, .n = n, .out = out};
    offload_state_run(rt, SHARDOPT_ALGO_MUON, one_range, &r, momentum_kernel, &grad_scale);
    ew_flush(rt);
}

void muon_apply_range(shardopt_runtime_t rt, const struct shardopt_param *p, size_t off, size_t n,
                      const void *update, const struct muon_scalars *s)
{
    const shardopt_config_t *c = &rt->cfg;
    const double lr = s->lr * p->lr_mult, wd = s->wd * p->wd_mult;
    struct apply_args a = {
        .n = n,
        .param = at(p->data, off, kdtype_size(p->param_dtype)),
        .param_dtype = p->param_dtype,
        .param_rounding = c->param_rounding,
        .update = update,
        .update_dtype = c->comm_dtype,
        .alpha = (float)(lr * p->lr_scale),
        .decay = (float)(1.0 - lr * wd),
        .rng = rng_stream_make(c->seed, p->name_hash, RNG_KIND_PARAM, p->step + 1),
        .idx = elem_index_map_at(&p->index_map, off),
    };
    ew_apply(rt, &a); /* the caller flushes */
}

struct bucket_pieces {
    shardopt_runtime_t rt;
    const struct stage *st;
};

/* Piece i of a bucket as a state range: its U goes to A, or straight to the NS slot (direct). */
static int bucket_piece(void *arg, int i, struct state_range *r)
{
    const struct bucket_pieces *bp = arg;
    const struct stage *st = bp->st;
    const int q = st->b->piece_lo + i;
    if (q >= st->b->piece_hi)
        return 0;
    const struct plan_piece *pc = &bp->rt->gx[st->kind].plan.pieces[q];
    r->p = bp->rt->params[pc->param];
    r->off = (size_t)pc->local_off;
    /* a matrix skip_missing_grads skips keeps its momentum: its U slot travels the plan's
     * exchanges as it is (stale), is not orthogonalized and is applied nowhere */
    r->n = r->p->skip ? 0 : (size_t)pc->count;
    r->out =
        at(pc->direct ? st->buf->ns : st->buf->a, pc->buf, kdtype_size(bp->rt->cfg.comm_dtype));
    return 1;
}

static void stage_momentum(shardopt_runtime_t rt, const struct stage *st, float grad_scale)
{
    struct bucket_pieces bp = {.rt = rt, .st = st};
    offload_state_run(rt, SHARDOPT_ALGO_MUON, bucket_piece, &bp, momentum_kernel, &grad_scale);
    ew_flush(rt); /* one launch for the bucket, before its exchange is queued */
}

/* The index of member i's block in list l, or -1 (a binary search: the list is in member
 * order). */
static int block_of(const struct plan_blocks *l, int i)
{
    int lo = 0, hi = l->n;
    while (lo < hi) {
        const int mid = lo + (hi - lo) / 2;
        if (l->peer[mid] < i)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < l->n && l->peer[lo] == i ? lo : -1;
}

/* Start exchange #1 (A -> B) or #2 (B -> A) over the group's transport: a block to and from
 * every member with a non-empty one; this rank's own block is a copy on the stream (device to
 * device on a device backend). */
static shardopt_status_t xfer_start(shardopt_runtime_t rt, struct stage *st, int second)
{
    const struct group_exec *gx = &rt->gx[st->kind];
    const struct plan_bucket *b = st->b;
    const int me = gx->plan.me;
    const size_t es = kdtype_size(rt->cfg.comm_dtype);
    const struct plan_blocks *snd = second ? &b->b : &b->a, *rcv = second ? &b->a : &b->b;
    char *sbuf = second ? st->buf->b : st->buf->a, *rbuf = second ? st->buf->a : st->buf->b;

    st->x = (struct comm_xfer){
        .seq = st->seq,
        .set = st->seq % PIPELINE_DEPTH,
        .second = second,
        .bucket = stage_bucket(rt, st),
        .me = me,
        .members = gx->plan.members,
        .ns = snd->n,
        .sp = snd->peer,
        .sc = snd->count,
        .sd = snd->displ,
        .nr = rcv->n,
        .rp = rcv->peer,
        .rc = rcv->count,
        .rd = rcv->displ,
        .sbuf = sbuf,
        .rbuf = rbuf,
        .hsbuf = second ? st->buf->hb : st->buf->ha,
        .hrbuf = second ? st->buf->ha : st->buf->hb,
        .req = st->buf->req,
        .peer = st->buf->peer,
        .sent = &rt->counters.bytes_sent[st->kind],
        .recv = &rt->counters.bytes_recv[st->kind],
        .nreq = 0,
        .torn = SHARDOPT_OK,
    };
    if (gx->comm == MPI_COMM_NULL)
        return SHARDOPT_OK;         /* replicated tensors: every matrix is direct */
    if (fault_hit("step.exchange")) /* a stand-in for an MPI failure; or a hang (tests) */
        return log_fail(SHARDOPT_ERR_COMM, "step: rank %d: starting exchange #%d failed (injected)",
                        rt->groups.me.rank, second ? 2 : 1);
    /* my own block, if any: on both lists alike (what I send myself in A I receive in B) */
    const int js = block_of(snd, me), jr = block_of(rcv, me);
    if (js >= 0 && jr >= 0 && snd->count[js] > 0)
        rt->dev->copy(&rt->kctx, rbuf + (size_t)rcv->displ[jr] * es,
                      sbuf + (size_t)snd->displ[js] * es, (size_t)snd->count[js] * es);
    const shardopt_status_t status = rt->xport[st->kind].ops->start(&rt->xport[st->kind], &st->x);
    rt_ns_failed_note(rt, st->x.torn); /* the exchange went ahead */
    return status;
}

static shardopt_status_t xfer_wait(shardopt_runtime_t rt, struct stage *st)
{
    return rt->xport[st->kind].ops->wait(&rt->xport[st->kind], &st->x);
}

/* The exchanges in flight advance while this rank computes (Open MPI moves non-blocking
 * messages only inside MPI calls; NCCL's on their own stream). */
static void xfer_progress(shardopt_runtime_t rt, struct stage *a, struct stage *b)
{
    if (a != NULL)
        rt->xport[a->kind].ops->progress(&rt->xport[a->kind], &a->x);
    if (b != NULL)
        rt->xport[b->kind].ops->progress(&rt->xport[b->kind], &b->x);
}

/* Between B's pieces and the whole matrices in the NS slots. */
static void stage_move(shardopt_runtime_t rt, const struct stage *st, int to_slots)
{
    const struct group_plan *P = &rt->gx[st->kind].plan;
    const size_t es = kdtype_size(rt->cfg.comm_dtype);

    for (int w = st->b->owned_lo; w < st->b->owned_hi; w++) {
        const struct plan_owned *ow = &P->owned[w];
        for (int in = ow->in_lo; in < ow->in_hi; in++) {
            const struct plan_incoming *pi = &P->incoming[in];
            void *slot = at(st->buf->ns, ow->slot + (size_t)(pi->r0 * ow->cols + pi->c0), es);
            void *piece = at(st->buf->b, pi->buf, es);
            const size_t width = (size_t)(pi->c1 - pi->c0) * es, pitch = (size_t)ow->cols * es;
            if (to_slots)
                rt->dev->copy2d(&rt->kctx, slot, pitch, piece, width, width,
                                (size_t)(pi->r1 - pi->r0));
            else
                rt->dev->copy2d(&rt->kctx, piece, width, slot, pitch, width,
                                (size_t)(pi->r1 - pi->r0));
        }
    }
}

/* Gram results the kernel's guard refused (ns_gram_guard_ok) and recomputed by the standard
 * algorithm, or bf16 standard ones recomputed in fp32 (kernels/cpu/ns_bf16.h): counted, their
 * standard FLOPs added to what this rank performed, and said once per parameter on the rank that
 * ran them (Newton-Schulz runs on the owners, not on rank 0) */
static void gram_fallback_report(shardopt_runtime_t rt, struct shardopt_param *p, int64_t fallbacks,
                                 const struct ns_sym_blocks *sb)
{
    rt->counters.ns_gram_fallbacks += (uint64_t)fallbacks;
    rt->counters.ns_flops_last +=
        ns_flops_performed(p->mv.rows, p->mv.cols, rt->cfg.ns_steps, NS_ALGO_STANDARD, 0u, sb) *
        (double)fallbacks;
    if (p->ns_guard_warned)
        return;
    p->ns_guard_warned = 1;
    if (p->ns_algorithm != NS_ALGO_GRAM) /* bf16 standard results (kernels/cpu/ns_bf16.h) */
        log_warn("step %llu: rank %d: bf16 Newton-Schulz of '%s' [%lld x %lld] gave %lld "
                 "result(s) non-finite or past the bound a Newton-Schulz output can reach; "
                 "recomputed in fp32 (said once per parameter)",
                 (unsigned long long)rt->counters.steps + 1, rt->groups.me.rank, p->name,
                 (long long)p->mv.rows, (long long)p->mv.cols, (long long)fallbacks);
    if (p->ns_algorithm != NS_ALGO_GRAM)
        return;
    log_warn("step %llu: rank %d: Gram Newton-Schulz of '%s' [%lld x %lld] gave %lld result(s) "
             "non-finite or past the bound a Newton-Schulz output can reach; recomputed with the "
             "standard algorithm (said once per parameter; ns_algorithm = standard avoids it)",
             (unsigned long long)rt->counters.steps + 1, rt->groups.me.rank, p->name,
             (long long)p->mv.rows, (long long)p->mv.cols, (long long)fallbacks);
}

/* Newton-Schulz on my matrices [lo, hi), batching runs of consecutive experts of one stack.
 * The slots from element base_slot on are at base (the bucket's NS buffer, or its device copy). */
static shardopt_status_t stage_orthogonalize(shardopt_runtime_t rt, const struct stage *st, int lo,
                                             int hi, void *base, size_t base_slot,
                                             struct stage *in_flight1, struct stage *in_flight2)
{
    const shardopt_config_t *c = &rt->cfg;
    const struct group_plan *P = &rt->gx[st->kind].plan;
    const size_t es = kdtype_size(c->comm_dtype);

    for (int w = lo; w < hi;) {
        const struct plan_owned *ow = &P->owned[w];
        const struct shardopt_param *p = rt->params[ow->param];
        int n = 1;
        while (w + n < hi && P->owned[w + n].param == ow->param && P->owned[w + n].k == ow->k + n &&
               ow->team == 1 && P->owned[w + n].team == 1)
            n++;
        if (p->skip) { /* skip_missing_grads: its result would be discarded (on every member) */
            w += n;
            continue;
        }
        if (ow->team > 1) { /* my block of a team's matrix, with the team (commit_teams.c) */
            const struct group_exec *gx = &rt->gx[st->kind];
            const int set = gx->set_of[ow->mat];
            shardopt_status_t status = ns_sharded_block(
                rt, p, gx->set_comm[set], gx->set_nccl != NULL ? gx->set_nccl[set] : NULL,
                at(base, ow->slot - base_slot, es), ow->rows, ow->cols, ow->team_rows);
            /* an MPI call failed: nothing more to agree over, the pipeline stops here */
            if (status == SHARDOPT_ERR_COMM)
                return status;
            /* an NCCL all-reduce of its team failed or timed out (the team's communicator
             * aborted): the pipeline goes on, its exchanges with it, and every later team block
             * of the step joins only its norm all-reduce, with the failure flag
             * (ns_sharded_block), so that no member of a later team, dense or expert, waits for
             * this rank in an all-reduce it never joins. Before, the pipeline stopped here and
             * the expert teams' members after it waited in their MPI norm all-reduce until
             * comm_timeout_s ended the job (commit refused expert teams over NCCL for it). The
             * flag costs nothing per step: it rides in the norm all-reduce every team block
             * makes anyway, where an agreement before each team's collectives would add an
             * all-reduce per team block */
            if (status == SHARDOPT_ERR_NCCL)
                rt->team_poisoned = 1;
            /* a failed team matrix (ns_sharded.c): every exchange still completes, and
             * ns_sharded_run's agreement fails the step on every rank */
            rt_ns_failed_note(rt, status);
            xfer_progress(rt, in_flight1, in_flight2);
            w++;
            continue;
        }
        int64_t fallbacks = 0;
        struct ns_args ns = {
            .batch = n,
            .rows = ow->rows,
            .cols = ow->cols,
            .transpose = p->mv.ns_transpose,
            .in = at(base, ow->slot - base_slot, es),
            .in_dtype = c->comm_dtype,
            .out = at(base, ow->slot - base_slot, es),
            .out_dtype = c->comm_dtype,
            .coeffs = (const float(*)[3])rt->ns_coeffs,
            .steps = c->ns_steps,
            .norm_scale = rt->ns_norm_scale,
            .eps = (float)c->ns_eps,
            .variant = p->ns_variant,
            .compute = rt->ns_compute,
            .block = p->ns_block,
            .algorithm = p->ns_algorithm,
            .precondition = (int)c->ns_precondition,
            .guard_fallbacks = &fallbacks,
        };
        /* the fault site step.ns.gather stands in for a kernel refusing on this rank alone */
        if (fault_hit("step.ns.gather") ||
            rt->ns_ops->newton_schulz(&rt->kctx, &ns, &rt->ns_ws) != 0) {
            const shardopt_status_t failed =
                log_fail(SHARDOPT_ERR_INTERNAL,
                         "step '%s': rank %d: Newton-Schulz refused [%lld x %lld] variant %d in "
                         "kernels %s",
                         p->name, rt->groups.me.rank, (long long)ow->rows, (long long)ow->cols,
                         p->ns_variant, rt->ns_ops->name);
            /* as a failed team matrix: returning here left the holders of these matrices in
             * exchange #2 until comm_timeout_s ended the job. The exchanges complete with a zero
             * update for them, and ns_sharded_run's agreement fails the step on every rank */
            rt->ns_dev->fill(&rt->kctx, ns.out, 0, (size_t)(n * ow->rows * ow->cols) * es);
            rt_ns_failed_note(rt, failed);
            xfer_progress(rt, in_flight1, in_flight2);
            w += n;
            continue;
        }
        /* what the kernel performed: its symmetric products at the entries it formed */
        struct ns_sym_blocks sb;
        ns_sym_blocks_for(ow->rows, ow->cols, p->ns_variant, p->ns_block, rt->ns_compute, &sb);
        const uint32_t restarts =
            p->ns_algorithm == NS_ALGO_GRAM
                ? ns_coeffs_gram_restarts_for((const float(*)[3])rt->ns_coeffs, c->ns_steps,
                                              ow->rows, ow->cols, rt->ns_compute)
                : 0u;
        rt->counters.ns_flops_last +=
            ns_flops_performed(ow->rows, ow->cols, c->ns_steps, p->ns_algorithm, restarts, &sb) * n;
        if (fallbacks > 0)
            gram_fallback_report(rt, rt->params[ow->param], fallbacks, &sb);
        xfer_progress(rt, in_flight1, in_flight2);
        w += n;
    }
    return SHARDOPT_OK;
}

static void stage_apply(shardopt_runtime_t rt, const struct stage *st, const struct muon_scalars *s)
{
    const struct group_plan *P = &rt->gx[st->kind].plan;
    const size_t es = kdtype_size(rt->cfg.comm_dtype);

    for (int q = st->b->piece_lo; q < st->b->piece_hi; q++) {
        const struct plan_piece *pc = &P->pieces[q];
        if (rt->params[pc->param]->skip)
            continue;
        muon_apply_range(rt, rt->params[pc->param], (size_t)pc->local_off, (size_t)pc->count,
                         at(pc->direct ? st->buf->ns : st->buf->a, pc->buf, es), s);
    }
    ew_flush(rt);
}

/* Newton-Schulz of a bucket: all of its matrices, or with replica_split this replica's share,
 * then every replica's share gathered into every replica's slots. */
static shardopt_status_t stage_ns(shardopt_runtime_t rt, const struct stage *st,
                                  struct stage *in_flight1, struct stage *in_flight2)
{
    const struct groups *g = &rt->groups;
    const struct group_plan *P = &rt->gx[st->kind].plan;
    const int R = g->mesh.dp_replicate;
    const size_t es = kdtype_size(rt->cfg.comm_dtype);
    const int split = rt->cfg.replica_split && R > 1;
    int lo = st->b->owned_lo, hi = st->b->owned_hi;
    size_t slot_lo = 0, slot_hi = st->b->ns_elems;

    if (split)
        plan_replica_range(P, st->b, R, g->me.rep, &lo, &hi, &slot_lo, &slot_hi);
    /* offload = cpu: my slots cross to the device and back; otherwise base is the buffer */
    char *host = at(st->buf->ns, slot_lo, es);
    void *base = offload_ns_in(rt, rt->dev_ns, host, (slot_hi - slot_lo) * es);
    shardopt_status_t status =
        stage_orthogonalize(rt, st, lo, hi, base, slot_lo, in_flight1, in_flight2);
    if (status != SHARDOPT_OK)
        return status;
    const shardopt_status_t out = offload_ns_out(rt, host, base, (slot_hi - slot_lo) * es);
    rt_ns_failed_note(rt, out); /* the exchanges go ahead */
    if (!split)
        return SHARDOPT_OK;
    for (int r = 0; r < R; r++) {
        size_t a, b;
        int l, h;
        plan_replica_range(P, st->b, R, r, &l, &h, &a, &b);
        rt->rep_displs[r] = (int)a;
        rt->rep_counts[r] = (int)(b - a);
    }
    shardopt_status_t torn = SHARDOPT_OK;
    const struct comm_share share = {
        .seq = st->seq,
        .bucket = stage_bucket(rt, st),
        .me = g->me.rep,
        .members = R,
        .buf = st->buf->ns,
        .hbuf = st->buf->hns,
        .total = st->b->ns_elems,
        .counts = rt->rep_counts,
        .displs = rt->rep_displs,
        .torn = &torn,
    };
    status = rt->xport[XPORT_REPLICATE].ops->allgatherv(&rt->xport[XPORT_REPLICATE], &share);
    rt_ns_failed_note(rt, torn); /* the all-gather went ahead */
    return status;
}

/* The pipeline's sequence: every bucket of every group, in group order. */
static int stage_get(shardopt_runtime_t rt, int seq, struct stage *st)
{
    int i = seq;
    for (int k = 0; k < GROUP_KINDS; k++) {
        const struct group_plan *P = &rt->gx[k].plan;
        if (i < P->nbuckets) {
            st->kind = (enum group_kind)k;
            st->b = &P->buckets[i];
            st->buf = &rt->bufs[seq % PIPELINE_DEPTH];
            st->seq = seq;
            st->x.nreq = 0;
            return 1;
        }
        i -= P->nbuckets;
    }
    return 0;
}

/* A failed step's exchanges still in flight over MPI: each request is freed unwaited (a peer may
 * never post its side: waiting could hang) and the runtime remembers it, so that finalize keeps
 * the buffers MPI may still write and later steps refuse (runtime.h, exchange_abandoned). Before,
 * finalize freed them under a pending receive that a peer's message then completed: a write into
 * freed memory (test_xcheck's devsim combos, every rank's Newton-Schulz refused: a refusal now
 * lets the exchanges complete, stage_orthogonalize). */
static void muon_abandon(shardopt_runtime_t rt, struct stage *ring, int used)
{
    for (int j = 0; j < used; j++) {
        struct stage *st = &ring[j];
        if (rt->xport[st->kind].ops->deferred) /* NCCL: step_abort aborts the communicator */
            continue;
        for (int r = 0; r < st->x.nreq; r++)
            if (st->x.req[r] != MPI_REQUEST_NULL)
                MPI_Request_free(&st->x.req[r]);
        st->x.nreq = 0;
        /* even with nothing posted here: a peer's message may be on its way */
        rt->exchange_abandoned = 1;
    }
}

shardopt_status_t muon_run(shardopt_runtime_t rt, const struct muon_scalars *s)
{
    struct step_counters *k = &rt->counters;
    struct stage ring[PIPELINE_DEPTH];
    shardopt_status_t status = SHARDOPT_OK;
    struct timeline *tl = &rt->timeline;
    struct tl_clock clk; /* one chain of laps: every moment of the pipeline lands in a phase */
    int n = 0;

    memset(ring, 0, sizeof ring); /* muon_abandon reads every stage of a short pipeline */
    rt->ns_failed = SHARDOPT_OK;
    rt->team_poisoned = 0;
    for (int g = 0; g < GROUP_KINDS; g++)
        n += rt->gx[g].plan.nbuckets;
    if (n == 0)
        return SHARDOPT_OK;

    /* prologue: bucket 0 into exchange #1 (its start counted with the momentum, as in the loop) */
    timeline_start(tl, &clk, 0);
    stage_get(rt, 0, &ring[0]);
    stage_momentum(rt, &ring[0], s->grad_scale);
    status = xfer_start(rt, &ring[0], 0);

    for (int i = 0; i < n && status == SHARDOPT_OK; i++) {
        struct stage *cur = &ring[i % PIPELINE_DEPTH];
        struct stage *next = i + 1 < n ? &ring[(i + 1) % PIPELINE_DEPTH] : NULL;
        struct stage *prev = i > 0 ? &ring[(i - 1) % PIPELINE_DEPTH] : NULL;

        /* bucket i+1 computes its momentum and starts travelling */
        if (next != NULL) {
            stage_get(rt, i + 1, next);
            stage_momentum(rt, next, s->grad_scale);
            status = xfer_start(rt, next, 0);
            if (status != SHARDOPT_OK)
                break;
        }
        timeline_lap(tl, &clk, &k->seconds_momentum_last);

        /* bucket i: arrives, is orthogonalized, starts back */
        status = xfer_wait(rt, cur);
        if (status != SHARDOPT_OK)
            break;
        stage_move(rt, cur, 1);
        timeline_lap(tl, &clk, &k->seconds_exchange1_last);
        status = stage_ns(rt, cur, next, prev);
        if (status != SHARDOPT_OK)
            break;
        timeline_lap(tl, &clk, &k->seconds_ns_last);
        stage_move(rt, cur, 0);
        status = xfer_start(rt, cur, 1);
        if (status != SHARDOPT_OK)
            break;

        /* bucket i-1: its results are back */
        if (prev != NULL) {
            status = xfer_wait(rt, prev);
            if (status != SHARDOPT_OK)
                break;
        }
        timeline_lap(tl, &clk, &k->seconds_exchange2_last);
        if (prev != NULL)
            stage_apply(rt, prev, s);
        timeline_lap(tl, &clk, &k->seconds_apply_last);
    }
    if (status == SHARDOPT_OK) {
        struct stage *last = &ring[(n - 1) % PIPELINE_DEPTH];
        status = xfer_wait(rt, last);
        timeline_lap(tl, &clk, &k->seconds_exchange2_last);
        if (status == SHARDOPT_OK)
            stage_apply(rt, last, s);
        timeline_lap(tl, &clk, &k->seconds_apply_last);
    }
    if (status != SHARDOPT_OK) /* the stages that were taken: the first n, at most the ring */
        muon_abandon(rt, ring, n < PIPELINE_DEPTH ? n : PIPELINE_DEPTH);
    return status;
}

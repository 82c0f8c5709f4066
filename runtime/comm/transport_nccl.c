/* NCCL on the group's stream (transport.h, comm_nccl.h): an exchange is posted after the compute
 * stream's work so far and the compute stream waits on its event, so the host never blocks
 * inside the step; the step's end drains the group with comm_timeout_s, and a failed step aborts
 * it. Built in every build: without CUDA, comm_nccl_none.c stands behind it and commit never
 * chooses it (no group has an NCCL communicator). */
#include "base/status.h"
#include "runtime/comm/transport.h"

/* An exchange's slot: its buffer set and direction, so that the three buckets in flight never
 * share one. */
static int xfer_slot(const struct comm_xfer *x) { return x->set * 2 + x->second; }

static shardopt_status_t nccl_start(const struct comm_transport *t, struct comm_xfer *x)
{
    for (int j = 0; j < x->nr; j++)
        if (x->rp[j] != x->me)
            *x->recv += (uint64_t)x->rc[j] * t->es;
    for (int j = 0; j < x->ns; j++)
        if (x->sp[j] != x->me)
            *x->sent += (uint64_t)x->sc[j] * t->es;
    x->nreq = 1;
    return nccl_group_exchange(t->nccl, xfer_slot(x), x->sbuf, x->ns, x->sp, x->sc, x->sd, x->rbuf,
                               x->nr, x->rp, x->rc, x->rd, t->es);
}

/* The compute stream waits; the host goes on. */
static shardopt_status_t nccl_wait(const struct comm_transport *t, struct comm_xfer *x)
{
    const int had = x->nreq;
    x->nreq = 0;
    return had ? nccl_group_wait(t->nccl, xfer_slot(x)) : SHARDOPT_OK;
}

/* Exchanges advance on their own stream. */
static void nccl_progress(const struct comm_transport *t, struct comm_xfer *x) { (void)t, (void)x; }

static shardopt_status_t nccl_allgatherv(const struct comm_transport *t, const struct comm_share *s)
{
    shardopt_status_t status =
        nccl_group_allgatherv(t->nccl, s->seq, s->buf, s->counts, s->displs, t->es);
    return status == SHARDOPT_OK ? nccl_group_wait(t->nccl, s->seq) : status;
}

static shardopt_status_t nccl_drain(const struct comm_transport *t)
{
    return nccl_group_drain(t->nccl);
}

static void nccl_abort(const struct comm_transport *t) { nccl_group_abort(t->nccl); }

static int nccl_aborted(const struct comm_transport *t) { return nccl_group_aborted(t->nccl); }

const struct comm_transport_ops transport_nccl_ops = {
    .name = "nccl",
    .deferred = 1,
    .start = nccl_start,
    .wait = nccl_wait,
    .progress = nccl_progress,
    .allgatherv = nccl_allgatherv,
    .drain = nccl_drain,
    .abort = nccl_abort,
    .aborted = nccl_aborted,
};

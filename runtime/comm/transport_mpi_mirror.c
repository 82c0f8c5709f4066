/* MPI through pinned host mirrors (transport.h): the buffers are device memory the host never
 * touches, so MPI reads and writes their mirrors. Before any message is posted the device
 * stream is drained, so that the sends' blocks have arrived in the mirror and earlier copies out
 * of the receive mirror are done before MPI overwrites it; received blocks go up on the stream,
 * which orders them before the kernels that read them. */
#include <string.h>

#include "base/fault.h"
#include "base/log.h"
#include "base/status.h"
#include "runtime/comm/transport_mpi.h"

static shardopt_status_t mirror_start(const struct comm_transport *t, struct comm_xfer *x)
{
    const size_t es = t->es;
    char *host = x->hsbuf;
    const char *dev = x->sbuf;
    for (int j = 0; j < x->ns; j++)
        if (x->sp[j] != x->me && x->sc[j] > 0)
            t->dev->copy(t->kctx, host + (size_t)x->sd[j] * es, dev + (size_t)x->sd[j] * es,
                         (size_t)x->sc[j] * es);
    /* A failed copy is this member's alone: returning before posting left every peer waiting
     * for its blocks until comm_timeout_s ended the job. Its blocks go as zeros instead (a zero
     * matrix orthogonalizes to zero: a zero update), and the failure is agreed at the Muon
     * phase's end (x->torn). */
    if (fault_hit("copy") || t->dev->sync(t->kctx) != 0) {
        x->torn = log_fail(SHARDOPT_ERR_DEVICE,
                           "step: rank %d: copying exchange blocks to the host failed (%s); they "
                           "were sent as zeros",
                           t->groups->me.rank, t->dev->name);
        for (int j = 0; j < x->ns; j++)
            if (x->sp[j] != x->me && x->sc[j] > 0)
                memset(host + (size_t)x->sd[j] * es, 0, (size_t)x->sc[j] * es);
    }
    return transport_mpi_post(t, x, x->hsbuf, x->hrbuf);
}

static shardopt_status_t mirror_wait(const struct comm_transport *t, struct comm_xfer *x)
{
    const int had = x->nreq;
    const size_t es = t->es;
    shardopt_status_t status = transport_mpi_complete(t, x);
    if (status != SHARDOPT_OK || had == 0)
        return status;
    char *dev = x->rbuf;
    const char *host = x->hrbuf;
    for (int j = 0; j < x->nr; j++)
        if (x->rp[j] != x->me && x->rc[j] > 0)
            t->dev->copy(t->kctx, dev + (size_t)x->rd[j] * es, host + (size_t)x->rd[j] * es,
                         (size_t)x->rc[j] * es);
    return SHARDOPT_OK;
}

/* Mine out to the mirror, everyone's gathered there, the whole of it back in. */
static shardopt_status_t mirror_allgatherv(const struct comm_transport *t,
                                           const struct comm_share *s)
{
    const size_t es = t->es, mine = (size_t)s->displs[s->me] * es;
    t->dev->copy(t->kctx, (char *)s->hbuf + mine, (const char *)s->buf + mine,
                 (size_t)s->counts[s->me] * es);
    if (fault_hit("copy") || t->dev->sync(t->kctx) != 0) { /* as in mirror_start */
        *s->torn = log_fail(SHARDOPT_ERR_DEVICE,
                            "step: rank %d: copying Newton-Schulz results to the host failed; "
                            "they were shared as zeros",
                            t->groups->me.rank);
        memset((char *)s->hbuf + mine, 0, (size_t)s->counts[s->me] * es);
    }
    shardopt_status_t status = transport_mpi_gather(t, s, s->hbuf);
    if (status == SHARDOPT_OK)
        t->dev->copy(t->kctx, s->buf, s->hbuf, s->total * es);
    return status;
}

const struct comm_transport_ops transport_mpi_mirror_ops = {
    .name = "mpi via pinned host mirrors",
    .deferred = 0,
    .start = mirror_start,
    .wait = mirror_wait,
    .progress = transport_mpi_progress,
    .allgatherv = mirror_allgatherv,
    .drain = transport_mpi_drain,
    .abort = transport_mpi_abort,
    .aborted = transport_mpi_aborted,
};

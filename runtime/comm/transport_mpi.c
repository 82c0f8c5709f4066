/* MPI on the step's buffers (transport.h): host memory, handed to MPI as it is. Non-blocking
 * point-to-point messages for the non-empty blocks, waited for under comm_timeout_s. */
#include "runtime/comm/transport_mpi.h"

#include "base/log.h"
#include "base/status.h"
#include "runtime/comm/comm_wait.h"

shardopt_status_t transport_mpi_post(const struct comm_transport *t, struct comm_xfer *x,
                                     char *sbuf, char *rbuf)
{
    const int tag = 2 * (x->seq % 8192) + x->second;
    const size_t es = t->es;
    int rcode = MPI_SUCCESS;

    for (int j = 0; j < x->nr; j++) {
        const int i = x->rp[j];
        if (i != x->me && x->rc[j] > 0) {
            x->peer[x->nreq] = i;
            rcode |= MPI_Irecv(rbuf + (size_t)x->rd[j] * es, x->rc[j], t->type, i, tag, t->comm,
                               &x->req[x->nreq++]);
            *x->recv += (uint64_t)x->rc[j] * es;
        }
    }
    for (int j = 0; j < x->ns; j++) {
        const int i = x->sp[j];
        if (i != x->me && x->sc[j] > 0) {
            x->peer[x->nreq] = i;
            rcode |= MPI_Isend(sbuf + (size_t)x->sd[j] * es, x->sc[j], t->type, i, tag, t->comm,
                               &x->req[x->nreq++]);
            *x->sent += (uint64_t)x->sc[j] * es;
        }
    }
    if (rcode != MPI_SUCCESS)
        return log_fail(SHARDOPT_ERR_COMM, "step: starting exchange #%d of the %s group failed",
                        x->second ? 2 : 1, t->name);
    return SHARDOPT_OK;
}

shardopt_status_t transport_mpi_complete(const struct comm_transport *t, struct comm_xfer *x)
{
    comm_phase(x->second ? "step: exchange #2 (Newton-Schulz results back)"
                         : "step: exchange #1 (momentum to the owners)",
               x->bucket);
    if (x->nreq > 0 && comm_wait(t->groups, t->comm, x->nreq, x->req, x->peer,
                                 "sends and receives") != MPI_SUCCESS)
        return log_fail(SHARDOPT_ERR_COMM, "step: exchange #%d of the %s group failed",
                        x->second ? 2 : 1, t->name);
    x->nreq = 0;
    return SHARDOPT_OK;
}

shardopt_status_t transport_mpi_gather(const struct comm_transport *t, const struct comm_share *s,
                                       void *buf)
{
    comm_phase("step: sharing Newton-Schulz results (replica_split)", s->bucket);
    if (comm_allgatherv(t->groups, t->comm, buf, s->counts, s->displs, t->type, "all-gather") !=
        MPI_SUCCESS)
        return log_fail(SHARDOPT_ERR_COMM, "step: sharing Newton-Schulz results over the "
                                           "replicate group failed");
    return SHARDOPT_OK;
}

void transport_mpi_progress(const struct comm_transport *t, struct comm_xfer *x)
{
    int done;
    (void)t;
    if (x->nreq > 0)
        MPI_Testall(x->nreq, x->req, &done, MPI_STATUSES_IGNORE);
}

shardopt_status_t transport_mpi_drain(const struct comm_transport *t)
{
    (void)t;
    return SHARDOPT_OK;
}

void transport_mpi_abort(const struct comm_transport *t) { (void)t; }

int transport_mpi_aborted(const struct comm_transport *t)
{
    (void)t;
    return 0;
}

static shardopt_status_t mpi_start(const struct comm_transport *t, struct comm_xfer *x)
{
    return transport_mpi_post(t, x, x->sbuf, x->rbuf);
}

static shardopt_status_t mpi_allgatherv(const struct comm_transport *t, const struct comm_share *s)
{
    return transport_mpi_gather(t, s, s->buf);
}

const struct comm_transport_ops transport_mpi_ops = {
    .name = "mpi",
    .deferred = 0,
    .start = mpi_start,
    .wait = transport_mpi_complete,
    .progress = transport_mpi_progress,
    .allgatherv = mpi_allgatherv,
    .drain = transport_mpi_drain,
    .abort = transport_mpi_abort,
    .aborted = transport_mpi_aborted,
};

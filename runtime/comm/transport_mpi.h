/* The MPI half of the two MPI transports: transport_mpi.c runs it on the step's buffers,
 * transport_mpi_mirror.c on their pinned host mirrors. */
#ifndef RUNTIME_COMM_TRANSPORT_MPI_H
#define RUNTIME_COMM_TRANSPORT_MPI_H

#include "runtime/comm/transport.h"

/* Post x's receives into rbuf and its sends from sbuf (x's displacements apply to both): one
 * per member with a non-empty block, counted in x's byte counters as it is posted. */
shardopt_status_t transport_mpi_post(const struct comm_transport *t, struct comm_xfer *x,
                                     char *sbuf, char *rbuf);

/* Wait for x's requests under comm_timeout_s (comm_wait.h), the phase named for its message. */
shardopt_status_t transport_mpi_complete(const struct comm_transport *t, struct comm_xfer *x);

/* The in-place all-gather of s's shares in buf (s->buf or its mirror). */
shardopt_status_t transport_mpi_gather(const struct comm_transport *t, const struct comm_share *s,
                                       void *buf);

/* Test x's requests, so that Open MPI moves them (it does only inside MPI calls). */
void transport_mpi_progress(const struct comm_transport *t, struct comm_xfer *x);

/* Nothing of an MPI exchange outlives its wait: no drain, nothing to abort. */
shardopt_status_t transport_mpi_drain(const struct comm_transport *t);
void transport_mpi_abort(const struct comm_transport *t);
int transport_mpi_aborted(const struct comm_transport *t);

#endif

/* How the step's exchanges travel (docs/design.md, The step): one table of operations, one file
 * per transport, as NCCL keeps one file per transport behind ncclTransport. Each group that the
 * pipeline exchanges over gets its transport once, at commit, from what init decided (whether
 * the group has an NCCL communicator, whether the buffers are device memory); the pipeline
 * (runtime/step/muon_exec.c) and the step's end (step.c) call through the table only.
 *
 *   transport_nccl.c        NCCL on the group's stream (comm_backend = nccl): the host posts and
 *                           goes on; the compute stream waits on the exchange's event, and the
 *                           step's end drains the group with comm_timeout_s
 *   transport_mpi_mirror.c  MPI through pinned host mirrors of device buffers (comm_backend = mpi
 *                           on a device, or a group NCCL does not serve): the device stream is
 *                           drained before MPI reads or writes a mirror, received blocks go up
 *                           stream-ordered
 *   transport_mpi.c         MPI on the buffers themselves (host memory: the CPU tables, and
 *                           offload = cpu) */
#ifndef RUNTIME_COMM_TRANSPORT_H
#define RUNTIME_COMM_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/device.h"
#include "runtime/comm/comm_nccl.h"
#include "runtime/comm/groups.h"
#include "shardopt.h"

/* One exchange of one bucket over a group of `members` (this rank is member `me`), as lists of
 * the members it sends to and receives from (the plan's, sharding/plan.h: only members with a
 * block, in member order): to member sp[j] sc[j] elements from sbuf + sd[j] (j < ns), from
 * member rp[j] rc[j] elements into rbuf + rd[j] (j < nr). This member's own block, when listed,
 * is the caller's (a copy on its stream, whatever the transport). */
struct comm_xfer {
    int seq;    /* the bucket's position in the pipeline: keeps concurrent exchanges' tags apart */
    int set;    /* its buffer set: with the direction, the NCCL slot whose event marks the end */
    int second; /* 0: exchange #1 (A -> B), 1: exchange #2 (B -> A) */
    int bucket; /* its index in the group's plan, for messages */
    int me, members;
    int ns, nr;
    const int *sp, *sc, *sd; /* [ns] */
    const int *rp, *rc, *rd; /* [nr] */
    void *sbuf, *rbuf;       /* the step's buffers: device memory on a device backend */
    void *hsbuf, *hrbuf;     /* their pinned host mirrors (device backends; NULL otherwise) */
    MPI_Request *req;        /* room for ns + nr requests, and the member each one waits on */
    int *peer;
    uint64_t *sent, *recv; /* the group's byte counters: blocks to and from other members */
    int nreq; /* in flight: set by start (requests, or 1 for an NCCL exchange), 0 after wait */
    /* Set by start (logged) when this member's own blocks failed to reach what is sent (the
     * pinned mirrors' copy down): they went as zeros, so that every peer still completes the
     * exchange; the step records it for the Muon phase's agreement (ns_sharded_run). */
    shardopt_status_t torn;
};

/* replica_split's all-gather of one bucket's Newton-Schulz results over the replicate group, in
 * place: this member's share is counts[me] elements at buf + displs[me], member i's lands at
 * buf + displs[i]. */
struct comm_share {
    int seq;    /* the bucket's position in the pipeline (the NCCL slot) */
    int bucket; /* for messages */
    int me, members;
    void *buf;    /* the bucket's NS slots: device memory on a device backend */
    void *hbuf;   /* its pinned host mirror (device backends; NULL otherwise) */
    size_t total; /* elements of buf the shares cover, from its start */
    const int *counts, *displs;
    shardopt_status_t *torn; /* as comm_xfer's: this member's share went as zeros */
};

struct comm_transport;

struct comm_transport_ops {
    const char *name;
    /* Exchanges complete on a device stream after the step's calls have returned: the step's
     * end drains them, and a peer learns of a failed one only there (step.c). */
    int deferred;
    /* Post x (x->nreq says what is in flight). SHARDOPT_ERR_COMM / _NCCL / _DEVICE, logged. */
    shardopt_status_t (*start)(const struct comm_transport *t, struct comm_xfer *x);
    /* x's received blocks are where the step's next work on the compute stream reads them (the
     * host may go on before they are, NCCL). Also for an x with nothing in flight. */
    shardopt_status_t (*wait)(const struct comm_transport *t, struct comm_xfer *x);
    /* Let x advance while this rank computes (MPI moves messages only inside MPI calls). */
    void (*progress)(const struct comm_transport *t, struct comm_xfer *x);
    /* The all-gather of s, complete (for the compute stream) on return. */
    shardopt_status_t (*allgatherv)(const struct comm_transport *t, const struct comm_share *s);
    /* At the step's end: everything posted has completed, or the error (comm_timeout_s). */
    shardopt_status_t (*drain)(const struct comm_transport *t);
    /* After a failed step: nothing a peer will never match is left for finalize to wait on. */
    void (*abort)(const struct comm_transport *t);
    int (*aborted)(const struct comm_transport *t); /* abort ran: the group cannot be used */
};

/* One group's transport: the table and what its operations work on. */
struct comm_transport {
    const struct comm_transport_ops *ops;
    const struct groups *groups;  /* the deadline, and this rank's number in messages */
    MPI_Comm comm;                /* the group's (MPI_COMM_NULL: nothing travels) */
    const char *name;             /* the group's, in messages ("dense") */
    struct nccl_group *nccl;      /* transport_nccl's communicator (borrowed) */
    const struct device_ops *dev; /* the copies between buffers and mirrors, on kctx's stream */
    struct kernel_ctx *kctx;
    size_t es;         /* bytes of a comm dtype element */
    MPI_Datatype type; /* MPI's view of one */
};

extern const struct comm_transport_ops transport_nccl_ops, transport_mpi_mirror_ops,
    transport_mpi_ops;

/* Choose t's transport (commit, once per group): NCCL when nccl is the group's communicator, else
 * MPI through the pinned mirrors when on_device (dev keeps buffers in device memory), else MPI on
 * the buffers. */
void transport_pick(struct comm_transport *t, const struct groups *g, MPI_Comm comm,
                    const char *name, struct nccl_group *nccl, int on_device,
                    const struct device_ops *dev, struct kernel_ctx *kctx,
                    shardopt_dtype_t comm_dtype);

#endif

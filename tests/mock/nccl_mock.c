/* The mock NCCL and CUDA stream calls of nccl.h / cuda_runtime.h here, over MPI on the host.
 *
 * A communicator is an MPI communicator of its members only, as NCCL's: the unique id names the
 * MPI_COMM_WORLD rank that made it (NCCL's names its root's address), every member tells that
 * rank its world rank (point to point, a tag from the id), the root sends the list back and the
 * members make the communicator with MPI_Comm_create_group. Ranks outside it take no part (a
 * Newton-Schulz team's communicator is made by its members alone).
 * Sends, receives and all-reduces between ncclGroupStart and ncclGroupEnd are posted at
 * ncclGroupEnd as MPI_Isend and MPI_Irecv of bytes, or MPI_Iallreduce, and queued on their stream;
 * an event recorded on a stream covers what was queued on it so far and is complete when those
 * requests are (cudaEventQuery tests them). As with NCCL's non-blocking communicators, calls may
 * return ncclInProgress and ncclCommGetAsyncError says when the communicator is settled, or failed.
 * ncclCommAbort cancels what is pending. cudaStreamWaitEvent waits on the host (cuda_runtime.h here
 * says why). */
#include "nccl_mock.h"

#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_runtime.h"
#include "nccl.h"

#define MOCK_TAG 4242

struct mock_req {
    MPI_Request req;
    struct mock_comm *comm;
    int recv; /* a receive: ncclCommAbort cancels it */
    int coll; /* an all-reduce: MPI can neither cancel nor free one in flight (left to MPI) */
};

struct mock_stream {
    struct mock_req *q;
    int n, cap;
};

struct mock_event {
    struct mock_stream *s; /* NULL: never recorded (complete) */
    int upto;              /* the stream's requests [0, upto) */
};

struct mock_comm {
    MPI_Comm mpi;
    int rank, size;
    ncclResult_t async;
    int dead; /* aborted: NCCL would have freed it; kept to count what still reaches it */
};

enum mock_kind { MOCK_SEND, MOCK_RECV, MOCK_ALLREDUCE };

struct mock_op {
    struct mock_comm *comm;
    struct mock_stream *s;
    const void *sbuf; /* MOCK_ALLREDUCE: its send buffer (== buf: in place) */
    void *buf;
    size_t bytes; /* MOCK_ALLREDUCE: elements */
    int peer;
    enum mock_kind kind;
    ncclDataType_t type; /* MOCK_ALLREDUCE: ncclFloat32, ncclFloat64 or ncclBfloat16 */
};

static enum nccl_mock_fault fault;
static double give_up_s; /* nccl_mock_waits_give_up */
static long posted, allreduces, allreduces_bf16, allreduces_f64;
static double allreduce_elems;
static int aborted;
static int depth;
static struct mock_op *ops;
static int nops, capops;
static unsigned id_counter;
static struct mock_stream *streams[64]; /* every live stream, for ncclCommAbort */
static int nstreams;
static MPI_Comm grave[64]; /* aborted communicators' MPI communicators */
static int ngrave;

static cudaError_t last_error;
static struct mock_comm *dead[64];
static int ndead;
static long not_ready, after_abort;

static long fault_skip; /* nccl_mock_inject_after */

void nccl_mock_inject(enum nccl_mock_fault f)
{
    fault = f;
    fault_skip = 0;
}

void nccl_mock_inject_after(enum nccl_mock_fault f, long skip)
{
    fault = f;
    fault_skip = skip;
}
long nccl_mock_not_ready(void) { return not_ready; }
void nccl_mock_fail_launch(void) { last_error = cudaErrorInvalidValue; }
long nccl_mock_after_abort(void) { return after_abort; }

cudaError_t cudaPeekAtLastError(void) { return last_error; }

cudaError_t cudaGetLastError(void)
{
    const cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}
void nccl_mock_waits_give_up(double seconds) { give_up_s = seconds; }
long nccl_mock_posted(void) { return posted; }
long nccl_mock_allreduces(void) { return allreduces; }
double nccl_mock_allreduce_elems(void) { return allreduce_elems; }
int nccl_mock_aborted(void) { return aborted; }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
    (void)flags;
    *s = nstreams < 64 ? calloc(1, sizeof **s) : NULL;
    if (*s == NULL)
        return cudaErrorInvalidValue;
    streams[nstreams++] = *s;
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    if (s != NULL) {
        for (int k = 0; k < nstreams; k++)
            if (streams[k] == s)
                streams[k] = streams[--nstreams];
        for (int i = 0; i < s->n; i++)
            if (s->q[i].req != MPI_REQUEST_NULL && !s->q[i].coll)
                MPI_Request_free(&s->q[i].req);
        free(s->q);
        free(s);
    }
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags)
{
    (void)flags;
    *e = calloc(1, sizeof **e);
    return *e != NULL ? cudaSuccess : cudaErrorInvalidValue;
}

cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    free(e);
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    if (e == NULL)
        return cudaErrorInvalidValue;
    e->s = s; /* NULL: the caller's compute stream, where nothing is queued */
    e->upto = s != NULL ? s->n : 0;
    return cudaSuccess;
}

/* 1 when the requests queued before the event are complete (no last error: the mock's own use) */
static int event_done(cudaEvent_t e)
{
    for (int i = 0; e->s != NULL && i < e->upto; i++) {
        int done = 1;
        if (e->s->q[i].req != MPI_REQUEST_NULL)
            MPI_Test(&e->s->q[i].req, &done, MPI_STATUS_IGNORE);
        if (!done)
            return 0;
    }
    return 1;
}

cudaError_t cudaEventQuery(cudaEvent_t e)
{
    if (e == NULL)
        return cudaErrorInvalidValue;
    if (event_done(e))
        return cudaSuccess;
    not_ready++;
    last_error = cudaErrorNotReady;
    return cudaErrorNotReady;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags)
{
    (void)s, (void)flags;
    if (e == NULL)
        return cudaErrorInvalidValue;
    const double t0 = MPI_Wtime();
    while (!event_done(e))
        if (give_up_s > 0 && MPI_Wtime() - t0 > give_up_s)
            break;
    return cudaSuccess;
}

const char *cudaGetErrorString(cudaError_t e)
{
    return e == cudaSuccess ? "no error" : e == cudaErrorNotReady ? "not ready" : "invalid value";
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    int r;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    memset(id, 0, sizeof *id);
    /* unique over the job: the creating world rank and its own count */
    snprintf(id->internal, sizeof id->internal, "%d:%u", r, ++id_counter);
    return ncclSuccess;
}

/* The members' MPI communicator, made by the members alone (the file's comment). 0, or -1. */
static int bootstrap(ncclUniqueId id, int nranks, int rank, MPI_Comm *out)
{
    int root = -1, wrank = 0;
    unsigned seq = 0;
    if (sscanf(id.internal, "%d:%u", &root, &seq) != 2 || root < 0)
        return -1;
    /* a tag per id of one root: two communicators of one root may bootstrap at once */
    const int tag = 1000 + (int)(seq % 30000u);
    MPI_Comm_rank(MPI_COMM_WORLD, &wrank);
    int *world = calloc((size_t)nranks, sizeof(int));
    if (world == NULL)
        return -1;
    if (rank == 0) {
        world[0] = wrank;
        for (int i = 1; i < nranks; i++) {
            int got[2];
            MPI_Recv(got, 2, MPI_INT, MPI_ANY_SOURCE, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            world[got[0]] = got[1]; /* ranks in [1, nranks): comm_nccl.c's own group ranks */
        }
        for (int i = 1; i < nranks; i++)
            MPI_Send(world, nranks, MPI_INT, world[i], tag, MPI_COMM_WORLD);
    } else {
        const int mine[2] = {rank, wrank};
        MPI_Send(mine, 2, MPI_INT, root, tag, MPI_COMM_WORLD);
        MPI_Recv(world, nranks, MPI_INT, root, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
    MPI_Group all = MPI_GROUP_NULL, g = MPI_GROUP_NULL;
    int rc = MPI_Comm_group(MPI_COMM_WORLD, &all);
    if (rc == MPI_SUCCESS)
        rc = MPI_Group_incl(all, nranks, world, &g);
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_create_group(MPI_COMM_WORLD, g, tag, out);
    if (g != MPI_GROUP_NULL)
        MPI_Group_free(&g);
    if (all != MPI_GROUP_NULL)
        MPI_Group_free(&all);
    free(world);
    return rc == MPI_SUCCESS ? 0 : -1;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *config)
{
    struct mock_comm *c = calloc(1, sizeof *c);
    if (c == NULL)
        return ncclSystemError;
    if (bootstrap(id, nranks, rank, &c->mpi) != 0) {
        free(c);
        return ncclInvalidUsage;
    }
    MPI_Comm_rank(c->mpi, &c->rank);
    MPI_Comm_size(c->mpi, &c->size);
    if (c->rank != rank || c->size != nranks) {
        MPI_Comm_free(&c->mpi);
        free(c);
        return ncclInvalidUsage;
    }
    c->async = ncclSuccess;
    if (fault == NCCL_MOCK_FAIL_INIT) {
        fault = NCCL_MOCK_NONE;
        c->async = ncclSystemError;
    }
    *comm = c;
    /* non-blocking communicators report their initialisation through ncclCommGetAsyncError */
    return config != NULL && !config->blocking ? ncclInProgress : c->async;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async)
{
    if (comm == NULL)
        return ncclInvalidArgument;
    if (comm->dead) {
        after_abort++;
        return ncclInvalidArgument;
    }
    *async = comm->async;
    return ncclSuccess;
}

/* Receives of c still pending on any stream are cancelled: nothing writes into a buffer once
 * its communicator was aborted (sends may complete later; their data is the caller's). */
static void cancel_pending(struct mock_comm *c)
{
    for (int k = 0; k < nstreams; k++)
        for (int i = 0; i < streams[k]->n; i++) {
            struct mock_req *q = &streams[k]->q[i];
            if (q->comm == c && q->recv && q->req != MPI_REQUEST_NULL) {
                MPI_Cancel(&q->req);
                MPI_Wait(&q->req, MPI_STATUS_IGNORE);
            }
        }
}

ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    if (comm == NULL)
        return ncclInvalidArgument;
    cancel_pending(comm);
    aborted++;
    /* as NCCL's abort, the communicator is gone; its MPI communicator is kept, because freeing
     * it is collective and the peers may be stuck */
    if (ngrave < 64)
        grave[ngrave++] = comm->mpi;
    comm->dead = 1; /* not freed: a later call on it is counted, not a crash */
    if (ndead < 64)
        dead[ndead++] = comm; /* still reachable, so no leak report */
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    if (comm == NULL)
        return ncclInvalidArgument;
    if (comm->dead) {
        after_abort++;
        return ncclInvalidArgument;
    }
    MPI_Comm_free(&comm->mpi);
    free(comm);
    return ncclSuccess;
}

ncclResult_t ncclGroupStart(void)
{
    depth++;
    return ncclSuccess;
}

static ncclResult_t queue_op(const void *sbuf, void *buf, size_t bytes, int peer, ncclComm_t comm,
                             cudaStream_t s, enum mock_kind kind, ncclDataType_t type)
{
    if (comm != NULL && comm->dead)
        after_abort++;
    if (comm == NULL || comm->dead || peer < 0 || peer >= comm->size || s == NULL)
        return ncclInvalidArgument;
    if (nops == capops) {
        capops = capops ? 2 * capops : 16;
        ops = realloc(ops, sizeof *ops * (size_t)capops);
    }
    ops[nops++] = (struct mock_op){.comm = comm,
                                   .s = s,
                                   .sbuf = sbuf,
                                   .buf = buf,
                                   .bytes = bytes,
                                   .peer = peer,
                                   .kind = kind,
                                   .type = type};
    return depth > 0 ? ncclSuccess : ncclGroupEnd();
}

ncclResult_t ncclSend(const void *buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream)
{
    return type == ncclUint8
               ? queue_op(buf, (void *)buf, count, peer, comm, stream, MOCK_SEND, type)
               : ncclInvalidArgument;
}

ncclResult_t ncclRecv(void *buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream)
{
    return type == ncclUint8 ? queue_op(buf, buf, count, peer, comm, stream, MOCK_RECV, type)
                             : ncclInvalidArgument;
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    if ((type != ncclFloat32 && type != ncclFloat64 && type != ncclBfloat16) || op != ncclSum ||
        count > (size_t)0x7fffffff)
        return ncclInvalidArgument;
    return queue_op(sendbuff, recvbuff, count, 0, comm, stream, MOCK_ALLREDUCE, type);
}

/* ncclBfloat16's sum: each pair added in fp32 and rounded once to bf16 (nearest even) */
static float bf16_value(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint16_t bf16_round(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN stays NaN */
        return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static void bf16_sum(void *in, void *inout, int *len, MPI_Datatype *type)
{
    const uint16_t *a = in;
    uint16_t *b = inout;
    (void)type;
    for (int i = 0; i < *len; i++)
        b[i] = bf16_round(bf16_value(a[i]) + bf16_value(b[i]));
}

static MPI_Op bf16_op = MPI_OP_NULL; /* made at the first bf16 all-reduce; MPI frees it at exit */

long nccl_mock_allreduces_bf16(void) { return allreduces_bf16; }
long nccl_mock_allreduces_f64(void) { return allreduces_f64; }

ncclResult_t ncclGroupEnd(void)
{
    if (depth > 0 && --depth > 0)
        return ncclSuccess;
    enum nccl_mock_fault f = fault;
    for (int i = 0; f == NCCL_MOCK_STUCK_ALLREDUCE && i < nops; i++)
        if (ops[i].kind == MOCK_ALLREDUCE)
            f = fault_skip > 0 ? NCCL_MOCK_NONE : NCCL_MOCK_STUCK;
    if (fault == NCCL_MOCK_STUCK_ALLREDUCE && f == NCCL_MOCK_NONE)
        fault_skip--; /* an all-reduce let through */
    if (f == NCCL_MOCK_FAIL_GROUP || f == NCCL_MOCK_STUCK) {
        fault = NCCL_MOCK_NONE;
        if (f == NCCL_MOCK_STUCK)
            for (int i = 0; i < nops; i++)
                ops[i].comm->async = ncclInProgress;
        nops = 0;
        return f == NCCL_MOCK_STUCK ? ncclInProgress : ncclSystemError;
    }
    for (int i = 0; i < nops; i++) {
        struct mock_op *o = &ops[i];
        struct mock_stream *s = o->s;
        if (s->n == s->cap) {
            s->cap = s->cap ? 2 * s->cap : 16;
            s->q = realloc(s->q, sizeof *s->q * (size_t)s->cap);
        }
        struct mock_req *q = &s->q[s->n++];
        q->comm = o->comm;
        q->recv = o->kind == MOCK_RECV;
        q->coll = o->kind == MOCK_ALLREDUCE;
        if (o->kind == MOCK_RECV) {
            MPI_Irecv(o->buf, (int)o->bytes, MPI_BYTE, o->peer, MOCK_TAG, o->comm->mpi, &q->req);
        } else if (o->kind == MOCK_SEND) {
            MPI_Isend(o->buf, (int)o->bytes, MPI_BYTE, o->peer, MOCK_TAG, o->comm->mpi, &q->req);
        } else { /* the sum every member reads, in MPI's order of the members */
            const int bf16 = o->type == ncclBfloat16;
            if (bf16 && bf16_op == MPI_OP_NULL)
                MPI_Op_create(bf16_sum, 1, &bf16_op);
            MPI_Iallreduce(o->sbuf == o->buf ? MPI_IN_PLACE : o->sbuf, o->buf, (int)o->bytes,
                           bf16                     ? MPI_UINT16_T
                           : o->type == ncclFloat64 ? MPI_DOUBLE
                                                    : MPI_FLOAT,
                           bf16 ? bf16_op : MPI_SUM, o->comm->mpi, &q->req);
            allreduces++;
            allreduces_bf16 += bf16;
            allreduces_f64 += o->type == ncclFloat64;
            allreduce_elems += (double)o->bytes;
        }
        posted++;
    }
    nops = 0;
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclSystemError: return "unhandled system error (mock)";
    case ncclInvalidArgument: return "invalid argument (mock)";
    case ncclInvalidUsage: return "invalid usage (mock)";
    case ncclInProgress: return "operation in progress";
    default: return "mock NCCL error";
    }
}

/* NCCL exchanges for the CUDA backend (comm_nccl.h). */
#include "runtime/comm/comm_nccl.h"

#include <cuda_runtime.h>
#include <limits.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>

#include "base/fault.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/status.h"
#include "kernels/clock.h"
#include "runtime/comm/comm_wait.h"

struct nccl_group {
    ncclComm_t comm;
    int rank, size;
    char name[32];
    double timeout_s;
    cudaStream_t compute, stream;
    int own_stream;               /* 0: borrowed from the group it shares with */
    cudaEvent_t ready;            /* on compute: the exchange's inputs are written */
    cudaEvent_t done[NCCL_SLOTS]; /* on stream: an exchange finished */
    cudaEvent_t drained;          /* on stream: everything posted so far */
    int aborted;
};

void nccl_group_abort(struct nccl_group *g)
{
    if (g != NULL && g->comm != NULL && !g->aborted) {
        ncclCommAbort(g->comm);
        g->aborted = 1;
    }
}

int nccl_group_aborted(const struct nccl_group *g) { return g != NULL && g->aborted; }

/* ncclCommAbort freed the communicator: nothing may reach it again */
static shardopt_status_t group_gone(const struct nccl_group *g)
{
    return log_fail(SHARDOPT_ERR_NCCL, "NCCL %s group: communicator was aborted earlier", g->name);
}

/* Abort the communicator (it cannot be used again) and report. */
static shardopt_status_t group_fail(struct nccl_group *g, const char *what, ncclResult_t r)
{
    nccl_group_abort(g);
    return log_fail(SHARDOPT_ERR_NCCL, "NCCL %s group (rank %d of %d): %s: %s%s", g->name, g->rank,
                    g->size, what, r == ncclInProgress ? "timed out" : ncclGetErrorString(r),
                    r == ncclInProgress ? " (comm_timeout_s); communicator aborted"
                                        : "; communicator aborted");
}

/* Non-blocking communicator: wait until the last call's work is enqueued, with the timeout. */
static shardopt_status_t group_settle(struct nccl_group *g, const char *what)
{
    const double t0 = monotonic_seconds();
    ncclResult_t r = ncclInProgress;
    for (;;) {
        if (ncclCommGetAsyncError(g->comm, &r) != ncclSuccess || r != ncclInProgress)
            break;
        if (g->timeout_s > 0 && monotonic_seconds() - t0 > g->timeout_s)
            return group_fail(g, what, ncclInProgress);
    }
    return r == ncclSuccess ? SHARDOPT_OK : group_fail(g, what, r);
}

shardopt_status_t nccl_group_create(const struct groups *gr, MPI_Comm comm, void *compute_stream,
                                    double timeout_s, const char *name,
                                    const struct nccl_group *share, struct nccl_group **out)
{
    struct nccl_group *g = mem_calloc(1, sizeof *g);
    struct {
        int ok;
        ncclUniqueId id;
    } boot;
    ncclResult_t r = ncclSuccess;
    cudaError_t e = cudaSuccess;
    char what[96];

    *out = NULL;
    /* every member goes on to the collectives below, or none. A member that had room returns OK
     * with *out NULL: the failing one reports, and the caller's groups_agree fails them all */
    int have = g != NULL;
    snprintf(what, sizeof what, "NCCL %s group: all-reduce of its members' room", name);
    comm_allreduce(gr, comm, MPI_IN_PLACE, &have, 1, MPI_INT, MPI_MIN, what);
    if (g == NULL)
        return log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                        "NCCL %s group: out of memory allocating %zu bytes for its state", name,
                        sizeof *g);
    if (!have) {
        free(g);
        return SHARDOPT_OK;
    }
    MPI_Comm_rank(comm, &g->rank);
    MPI_Comm_size(comm, &g->size);
    snprintf(g->name, sizeof g->name, "%s", name);
    g->timeout_s = timeout_s;
    g->compute = (cudaStream_t)compute_stream;
    /* the unique id travels over the group's MPI communicator under the deadline: every member
     * gets rank 0's, with whether ncclGetUniqueId succeeded there (a plain fault at nccl.id stands
     * for its failure; hang@nccl.id stops a member here) */
    memset(&boot, 0, sizeof boot);
    const int faulted = fault_hit("nccl.id");
    if (g->rank == 0)
        r = faulted ? ncclSystemError : ncclGetUniqueId(&boot.id);
    boot.ok = r == ncclSuccess;
    snprintf(what, sizeof what, "NCCL %s group: broadcast of its unique id", name);
    comm_bcast(gr, comm, &boot, (int)sizeof boot, MPI_BYTE, 0, what);
    if (!boot.ok) {
        free(g);
        return log_fail(SHARDOPT_ERR_NCCL, "NCCL %s group: ncclGetUniqueId failed on its rank 0",
                        name);
    }
    if (share != NULL) {
        g->stream = share->stream;
    } else {
        e = cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking);
        g->own_stream = e == cudaSuccess;
    }
    for (int i = 0; e == cudaSuccess && i < NCCL_SLOTS; i++)
        e = cudaEventCreateWithFlags(&g->done[i], cudaEventDisableTiming);
    if (e == cudaSuccess)
        e = cudaEventCreateWithFlags(&g->ready, cudaEventDisableTiming);
    if (e == cudaSuccess)
        e = cudaEventCreateWithFlags(&g->drained, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        nccl_group_destroy(g);
        return log_fail(SHARDOPT_ERR_DEVICE, "NCCL %s group: stream/events: %s", name,
                        cudaGetErrorString(e));
    }
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0; /* every wait polls, so a stuck peer becomes a timeout, not a hang */
    r = ncclCommInitRankConfig(&g->comm, g->size, boot.id, g->rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        shardopt_status_t st = log_fail(SHARDOPT_ERR_NCCL,
                                        "NCCL %s group (rank %d of %d): "
                                        "ncclCommInitRankConfig: %s",
                                        name, g->rank, g->size, ncclGetErrorString(r));
        g->comm = NULL;
        nccl_group_destroy(g);
        return st;
    }
    shardopt_status_t st = group_settle(g, "ncclCommInitRankConfig");
    if (st != SHARDOPT_OK) {
        nccl_group_destroy(g);
        return st;
    }
    *out = g;
    return SHARDOPT_OK;
}

void nccl_group_destroy(struct nccl_group *g)
{
    if (g == NULL)
        return;
    if (g->comm != NULL && !g->aborted)
        ncclCommDestroy(g->comm);
    for (int i = 0; i < NCCL_SLOTS; i++)
        if (g->done[i] != NULL)
            cudaEventDestroy(g->done[i]);
    if (g->ready != NULL)
        cudaEventDestroy(g->ready);
    if (g->drained != NULL)
        cudaEventDestroy(g->drained);
    if (g->stream != NULL && g->own_stream)
        cudaStreamDestroy(g->stream);
    free(g);
}

static int peer_at(const int *peers, int j) { return peers != NULL ? peers[j] : j; }

/* The groups' stream waits for the compute stream's work so far: an NCCL call posted next reads
 * what the step's kernels wrote. */
static shardopt_status_t after_compute(struct nccl_group *g)
{
    cudaError_t e;
    if ((e = cudaEventRecord(g->ready, g->compute)) != cudaSuccess ||
        (e = cudaStreamWaitEvent(g->stream, g->ready, 0)) != cudaSuccess)
        return log_fail(SHARDOPT_ERR_DEVICE, "NCCL %s group: ordering after compute: %s", g->name,
                        cudaGetErrorString(e));
    return SHARDOPT_OK;
}

/* Post one exchange over lists of peers in member order (NULL: every member, j = member j):
 * receive rc[j] at rbuf + rd[j] from peer j, send sc[j] from sbuf + sd[j] to peer j, or, with
 * one_block, the same block sc[0] at sd[0] to every listed peer (an all-gather). Per member the
 * receive is posted before the send, members in order, whatever the lists hold. */
static shardopt_status_t group_post(struct nccl_group *g, int slot, const void *sbuf, int ns,
                                    const int *sp, const int *sc, const int *sd, int one_block,
                                    void *rbuf, int nr, const int *rp, const int *rc, const int *rd,
                                    size_t es)
{
    cudaError_t e;
    ncclResult_t r = ncclSuccess;

    if (g->aborted)
        return group_gone(g);
    if (after_compute(g) != SHARDOPT_OK)
        return SHARDOPT_ERR_DEVICE;
    /* bytes, not elements: one datatype for bf16 and fp32 blocks */
    r = ncclGroupStart();
    for (int js = 0, jr = 0; r == ncclSuccess && (js < ns || jr < nr);) {
        const int pr = jr < nr ? peer_at(rp, jr) : INT_MAX;
        const int ps = js < ns ? peer_at(sp, js) : INT_MAX;
        const int i = pr < ps ? pr : ps;
        if (pr == i) {
            if (i != g->rank && rc[jr] > 0)
                r = ncclRecv((char *)rbuf + (size_t)rd[jr] * es, (size_t)rc[jr] * es, ncclUint8, i,
                             g->comm, g->stream);
            jr++;
        }
        if (ps == i) {
            const int k = one_block ? 0 : js;
            if (r == ncclSuccess && i != g->rank && sc[k] > 0)
                r = ncclSend((const char *)sbuf + (size_t)sd[k] * es, (size_t)sc[k] * es, ncclUint8,
                             i, g->comm, g->stream);
            js++;
        }
    }
    ncclResult_t r2 = ncclGroupEnd();
    if (r == ncclSuccess)
        r = r2;
    if (r != ncclSuccess && r != ncclInProgress)
        return group_fail(g, "posting an exchange", r);
    shardopt_status_t st = group_settle(g, "posting an exchange");
    if (st != SHARDOPT_OK)
        return st;
    if ((e = cudaEventRecord(g->done[slot % NCCL_SLOTS], g->stream)) != cudaSuccess)
        return log_fail(SHARDOPT_ERR_DEVICE, "NCCL %s group: cudaEventRecord: %s", g->name,
                        cudaGetErrorString(e));
    return SHARDOPT_OK;
}

shardopt_status_t nccl_group_exchange(struct nccl_group *g, int slot, const void *sbuf, int ns,
                                      const int *sp, const int *sc, const int *sd, void *rbuf,
                                      int nr, const int *rp, const int *rc, const int *rd,
                                      size_t es)
{
    return group_post(g, slot, sbuf, ns, sp, sc, sd, 0, rbuf, nr, rp, rc, rd, es);
}

shardopt_status_t nccl_group_allgatherv(struct nccl_group *g, int slot, void *buf,
                                        const int *counts, const int *displs, size_t es)
{
    return group_post(g, slot, buf, g->size, NULL, &counts[g->rank], &displs[g->rank], 1, buf,
                      g->size, NULL, counts, displs, es);
}

static shardopt_status_t allreduce(struct nccl_group *g, void *buf, size_t count,
                                   ncclDataType_t type)
{
    cudaError_t e;
    if (g->aborted)
        return group_gone(g);
    /* on the groups' one stream, behind the exchanges posted before it (nccl_group_create: one
     * order of NCCL kernels on every rank) */
    if (after_compute(g) != SHARDOPT_OK)
        return SHARDOPT_ERR_DEVICE;
    const ncclResult_t r = ncclAllReduce(buf, buf, count, type, ncclSum, g->comm, g->stream);
    if (r != ncclSuccess && r != ncclInProgress)
        return group_fail(g, "posting an all-reduce", r);
    shardopt_status_t st = group_settle(g, "posting an all-reduce");
    if (st != SHARDOPT_OK)
        return st;
    if ((e = cudaEventRecord(g->done[0], g->stream)) != cudaSuccess ||
        (e = cudaStreamWaitEvent(g->compute, g->done[0], 0)) != cudaSuccess)
        return log_fail(SHARDOPT_ERR_DEVICE, "NCCL %s group: ordering the all-reduce's readers: %s",
                        g->name, cudaGetErrorString(e));
    return SHARDOPT_OK;
}

shardopt_status_t nccl_group_allreduce_f32(struct nccl_group *g, float *buf, size_t count)
{
    return allreduce(g, buf, count, ncclFloat32);
}

shardopt_status_t nccl_group_allreduce_bf16(struct nccl_group *g, uint16_t *buf, size_t count)
{
    return allreduce(g, buf, count, ncclBfloat16);
}

shardopt_status_t nccl_group_allreduce_f64(struct nccl_group *g, double *buf, size_t count)
{
    return allreduce(g, buf, count, ncclFloat64);
}

shardopt_status_t nccl_group_wait(struct nccl_group *g, int slot)
{
    if (g->aborted)
        return group_gone(g);
    cudaError_t e = cudaStreamWaitEvent(g->compute, g->done[slot % NCCL_SLOTS], 0);
    if (e != cudaSuccess)
        return log_fail(SHARDOPT_ERR_DEVICE, "NCCL %s group: cudaStreamWaitEvent: %s", g->name,
                        cudaGetErrorString(e));
    return SHARDOPT_OK;
}

shardopt_status_t nccl_group_drain(struct nccl_group *g)
{
    if (g->aborted) /* a step after a failed one, posting nothing, must not reach g->comm */
        return group_gone(g);
    /* a launch of the step that failed is known only by the thread's last error, which the
     * polling below overwrites with "not ready": report it now */
    cudaError_t e = cudaPeekAtLastError();
    if (e != cudaSuccess)
        return log_fail(SHARDOPT_ERR_DEVICE, "NCCL %s group: a launch of the step failed: %s",
                        g->name, cudaGetErrorString(e));
    const double t0 = monotonic_seconds();
    e = cudaEventRecord(g->drained, g->stream);
    if (e != cudaSuccess)
        return log_fail(SHARDOPT_ERR_DEVICE, "NCCL %s group: cudaEventRecord: %s", g->name,
                        cudaGetErrorString(e));
    for (;;) {
        e = cudaEventQuery(g->drained);
        if (e == cudaSuccess)
            return SHARDOPT_OK;
        if (e != cudaErrorNotReady)
            return log_fail(SHARDOPT_ERR_DEVICE, "NCCL %s group: %s", g->name,
                            cudaGetErrorString(e));
        /* "not ready" is also left as the thread's last error, where the step's end
         * (kernel_ops.stream_end) would read it as a failed launch; nothing else can be there
         * (checked above, and nothing is launched meanwhile) */
        (void)cudaGetLastError();
        ncclResult_t r = ncclSuccess;
        if (ncclCommGetAsyncError(g->comm, &r) == ncclSuccess && r != ncclSuccess &&
            r != ncclInProgress)
            return group_fail(g, "an exchange", r);
        if (g->timeout_s > 0 && monotonic_seconds() - t0 > g->timeout_s)
            return group_fail(g, "waiting for the step's exchanges", ncclInProgress);
    }
}

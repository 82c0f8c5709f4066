#include "runtime/comm/comm_wait.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/fault.h"
#include "base/log.h"
#include "base/meminfo.h"
#include "base/status.h"
#include "kernels/clock.h"

static _Thread_local const char *wait_phase;
static _Thread_local int wait_bucket = -1;

void comm_phase(const char *phase, int bucket)
{
    wait_phase = phase;
    wait_bucket = bucket;
}

const char *comm_phase_now(void) { return wait_phase; }

static const char *group_name(const struct groups *g, MPI_Comm comm)
{
    if (comm == g->world)
        return "communicator init was given";
    if (comm == g->dense)
        return g->unsplit ? "communicator init was given (not yet split into groups)"
                          : "dense group";
    if (comm == g->rep)
        return "replicate group";
    if (comm == g->ep)
        return "expert-parallel group";
    if (comm == g->xs)
        return "expert shard group";
    return "runtime's group";
}

/* A member of comm as the runtime numbers ranks in messages (replica * dense + dense rank):
 * every group is init's communicator, inside the dense group or the replicate group. -1 when
 * none of these. */
static int runtime_rank(const struct groups *g, MPI_Comm comm, int member)
{
    if (comm == g->world) /* the runtime numbers its ranks as init's communicator does */
        return member;
    if (comm == g->rep)
        return member * g->mesh.dense + g->me.d;
    if (g->dense == MPI_COMM_NULL)
        return -1;
    MPI_Group from, to;
    int d = MPI_UNDEFINED;
    if (MPI_Comm_group(comm, &from) != MPI_SUCCESS)
        return -1;
    if (MPI_Comm_group(g->dense, &to) == MPI_SUCCESS) {
        MPI_Group_translate_ranks(from, 1, &member, to, &d);
        MPI_Group_free(&to);
    }
    MPI_Group_free(&from);
    return d == MPI_UNDEFINED ? -1 : g->me.rep * g->mesh.dense + d;
}

/* Append " r" for a peer, up to a bound: a 1,000-rank group is not listed in full. */
static void peer_add(char *buf, size_t len, size_t *o, int *listed, int r)
{
    if (*o + 1 >= len)
        return;
    int w = *listed < 16    ? snprintf(buf + *o, len - *o, "%s%d", *listed ? ", " : "", r)
            : *listed == 16 ? snprintf(buf + *o, len - *o, ", ...")
                            : 0;
    *o = w > 0 && (size_t)w < len - *o ? *o + (size_t)w : len - 1;
    (*listed)++;
}

static _Noreturn void wait_timeout(const struct groups *g, MPI_Comm comm, int n, MPI_Request *reqs,
                                   const int *peers, const char *what, double waited)
{
    char who[256] = "";
    size_t o = 0;
    int listed = 0, size = 0, me = 0;
    MPI_Comm_size(comm, &size);
    MPI_Comm_rank(comm, &me);
    if (peers != NULL) { /* the exchanges not yet complete, each peer once */
        for (int i = 0; i < n; i++) {
            int flag = 1, seen = 0;
            MPI_Request_get_status(reqs[i], &flag, MPI_STATUS_IGNORE);
            for (int j = 0; j < i && !seen; j++)
                seen = peers[j] == peers[i];
            if (!flag && !seen)
                peer_add(who, sizeof who, &o, &listed, runtime_rank(g, comm, peers[i]));
        }
    } else { /* a collective: MPI does not say who is missing, so every other member */
        for (int i = 0; i < size; i++)
            if (i != me)
                peer_add(who, sizeof who, &o, &listed, runtime_rank(g, comm, i));
    }
    char bucket[32] = "";
    if (wait_bucket >= 0)
        snprintf(bucket, sizeof bucket, ", bucket %d", wait_bucket);
    log_fail(SHARDOPT_ERR_COMM,
             "rank %d: no progress for %.0f s (comm_timeout_s = %g) in %s%s, %s over the %s: "
             "waiting on rank(s) %s%s; calling MPI_Abort (the job ends: Open MPI cannot "
             "recover a communicator)",
             g->me.rank, waited, g->timeout_s, wait_phase ? wait_phase : "(no phase)", bucket, what,
             group_name(g, comm), who, peers != NULL ? "" : " (a collective: one or more of them)");
    fflush(NULL);
    MPI_Abort(MPI_COMM_WORLD, COMM_WAIT_ABORT_CODE);
    abort(); /* MPI_Abort returned: not allowed to go on */
}

int comm_wait(const struct groups *g, MPI_Comm comm, int n, MPI_Request *reqs, const int *peers,
              const char *what)
{
    if (n <= 0)
        return MPI_SUCCESS;
    if (!(g->timeout_s > 0))
        return MPI_Waitall(n, reqs, MPI_STATUSES_IGNORE);
    const double t0 = monotonic_seconds();
    for (unsigned spin = 1;; spin++) {
        int done = 0, rc = MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS || done)
            return rc;
        /* the clock is read, and the core offered to others (oversubscribed ranks), only every
         * 64 polls: a message that is about to land costs no extra latency */
        if (spin % 64 == 0) {
            const double waited = monotonic_seconds() - t0;
            if (waited > g->timeout_s)
                wait_timeout(g, comm, n, reqs, peers, what, waited);
            sched_yield();
        }
    }
}

int comm_allreduce(const struct groups *g, MPI_Comm comm, const void *in, void *buf, int count,
                   MPI_Datatype type, MPI_Op op, const char *what)
{
    MPI_Request r;
    int rc = MPI_Iallreduce(in, buf, count, type, op, comm, &r);
    return rc == MPI_SUCCESS ? comm_wait(g, comm, 1, &r, NULL, what) : rc;
}

int comm_bcast(const struct groups *g, MPI_Comm comm, void *buf, int count, MPI_Datatype type,
               int root, const char *what)
{
    MPI_Request r;
    int rc = MPI_Ibcast(buf, count, type, root, comm, &r);
    return rc == MPI_SUCCESS ? comm_wait(g, comm, 1, &r, NULL, what) : rc;
}

int comm_allgather(const struct groups *g, MPI_Comm comm, const void *in, int count,
                   MPI_Datatype type, void *out, const char *what)
{
    MPI_Request r;
    int rc = MPI_Iallgather(in, count, type, out, count, type, comm, &r);
    return rc == MPI_SUCCESS ? comm_wait(g, comm, 1, &r, NULL, what) : rc;
}

int comm_gather(const struct groups *g, MPI_Comm comm, const void *in, int count, MPI_Datatype type,
                void *out, int root, const char *what)
{
    MPI_Request r;
    int rc = MPI_Igather(in, count, type, out, count, type, root, comm, &r);
    return rc == MPI_SUCCESS ? comm_wait(g, comm, 1, &r, NULL, what) : rc;
}

int comm_gatherv(const struct groups *g, MPI_Comm comm, const void *in, int count,
                 MPI_Datatype type, void *out, const int *counts, const int *displs, int root,
                 const char *what)
{
    MPI_Request r;
    int rc = MPI_Igatherv(in, count, type, out, counts, displs, type, root, comm, &r);
    return rc == MPI_SUCCESS ? comm_wait(g, comm, 1, &r, NULL, what) : rc;
}

int comm_allgatherv(const struct groups *g, MPI_Comm comm, void *buf, const int *counts,
                    const int *displs, MPI_Datatype type, const char *what)
{
    MPI_Request r;
    int rc = MPI_Iallgatherv(MPI_IN_PLACE, 0, type, buf, counts, displs, type, comm, &r);
    return rc == MPI_SUCCESS ? comm_wait(g, comm, 1, &r, NULL, what) : rc;
}

/* A member that stops before a split is found here, under the deadline. */
static int split_arrival(const struct groups *g, MPI_Comm comm, const char *call, const char *made)
{
    char what[160];
    MPI_Request r;
    if (fault_hit("init.split"))
        return MPI_ERR_OTHER;
    snprintf(what, sizeof what, "barrier before %s making the %s", call, made);
    int rc = MPI_Ibarrier(comm, &r);
    return rc == MPI_SUCCESS ? comm_wait(g, comm, 1, &r, NULL, what) : rc;
}

int comm_split(const struct groups *g, MPI_Comm comm, int color, int key, MPI_Comm *out,
               const char *made)
{
    int rc = split_arrival(g, comm, "MPI_Comm_split", made);
    return rc == MPI_SUCCESS ? MPI_Comm_split(comm, color, key, out) : rc;
}

int comm_split_node(const struct groups *g, MPI_Comm comm, int key, MPI_Comm *out, const char *made)
{
    int rc = split_arrival(g, comm, "MPI_Comm_split_type", made);
    return rc == MPI_SUCCESS
               ? MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, key, MPI_INFO_NULL, out)
               : rc;
}

int comm_dup(const struct groups *g, MPI_Comm comm, MPI_Comm *out, const char *made)
{
    char what[160];
    MPI_Request r;
    if (fault_hit("init.dup"))
        return MPI_ERR_OTHER;
    snprintf(what, sizeof what, "MPI_Comm_idup making the %s", made);
    int rc = MPI_Comm_idup(comm, out, &r);
    return rc == MPI_SUCCESS ? comm_wait(g, comm, 1, &r, NULL, what) : rc;
}

uint64_t comm_node_sum(const struct groups *g, uint64_t mine, int *members, const char *what)
{
    const MPI_Comm over[2] = {g->dense, g->rep};
    char made[80], op[160];
    uint64_t sum = mine;
    int count = 1;
    snprintf(made, sizeof made, "node group of %s", what);
    snprintf(op, sizeof op, "all-reduce of %s per node", what);
    for (int i = 0; i < 2; i++) {
        MPI_Comm node = MPI_COMM_NULL;
        int size = 1;
        if (comm_split_node(g, over[i], 0, &node, made) != MPI_SUCCESS)
            break;
        MPI_Comm_size(node, &size);
        /* clamped so that the sum cannot wrap: a saturated need stays past any machine */
        uint64_t v[2] = {sum < UINT64_MAX / (uint64_t)size ? sum : UINT64_MAX / (uint64_t)size,
                         (uint64_t)count};
        const int rc = comm_allreduce(g, node, MPI_IN_PLACE, v, 2, MPI_UINT64_T, MPI_SUM, op);
        MPI_Comm_free(&node);
        if (rc != MPI_SUCCESS)
            break;
        sum = v[0];
        count = (int)v[1];
    }
    *members = count;
    return sum;
}

shardopt_status_t comm_node_memory(const struct groups *g, uint64_t need, shardopt_status_t mine,
                                   const char *who, const char *what, struct node_memory *m)
{
    m->ranks = 1;
    m->avail = 0;
    m->over = 0;
    m->src[0] = '\0';
    m->node = comm_node_sum(g, mine == SHARDOPT_OK ? need : 0, &m->ranks, what);
    if (mine != SHARDOPT_OK)
        return mine;
    const enum meminfo_kind k = meminfo_host_available(&m->avail, m->src, sizeof m->src);
    if (k == MEMINFO_BAD_HOOK)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "%s: rank %d: %s", who, g->me.rank, m->src);
    m->over = k == MEMINFO_KNOWN && m->node > m->avail;
    return SHARDOPT_OK;
}

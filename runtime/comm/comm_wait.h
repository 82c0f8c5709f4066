/* Waiting on MPI with a deadline. Open MPI 4 cannot recover a communicator once a peer stops
 * taking part, so a wait that passes comm_timeout_s does the one clean thing left: it logs what
 * this rank was doing (phase, bucket, the group and the peers it still waits on) and calls
 * MPI_Abort, which ends the whole job with that message instead of a silent hang. Every blocking
 * MPI collective and exchange of init, commit, step, save and load goes through here. */
#ifndef RUNTIME_COMM_WAIT_H
#define RUNTIME_COMM_WAIT_H

#include <mpi.h>
#include <stdint.h>

#include "base/status.h"
#include "runtime/comm/groups.h"

/* The exit code MPI_Abort is given, as timeout(1)'s. */
#define COMM_WAIT_ABORT_CODE 124

/* What this thread is doing, for the timeout's message: a phase ("step 12: exchange #1") and a
 * bucket (-1: none). The strings must outlive the waits (literals, or the caller's buffer). */
void comm_phase(const char *phase, int bucket);

/* The phase comm_phase last set on this thread (NULL: none), to put it back after a sub-phase. */
const char *comm_phase_now(void);

/* Wait for n requests on comm, or abort after g->timeout_s (0: wait forever). peers[i] is the
 * rank in comm that request i waits on; NULL for a collective (every other member is named).
 * what names the operation ("pre-pass all-reduce"). Returns the MPI code of the wait. */
int comm_wait(const struct groups *g, MPI_Comm comm, int n, MPI_Request *reqs, const int *peers,
              const char *what);

/* Blocking collectives on comm with the same deadline (MPI_IN_PLACE where the blocking call
 * allows it is passed through). MPI codes, like the calls they stand for. */
int comm_allreduce(const struct groups *g, MPI_Comm comm, const void *in, void *buf, int count,
                   MPI_Datatype type, MPI_Op op, const char *what);
int comm_bcast(const struct groups *g, MPI_Comm comm, void *buf, int count, MPI_Datatype type,
               int root, const char *what);
int comm_allgather(const struct groups *g, MPI_Comm comm, const void *in, int count,
                   MPI_Datatype type, void *out, const char *what);
int comm_gather(const struct groups *g, MPI_Comm comm, const void *in, int count, MPI_Datatype type,
                void *out, int root, const char *what);
int comm_allgatherv(const struct groups *g, MPI_Comm comm, void *buf, const int *counts,
                    const int *displs, MPI_Datatype type, const char *what); /* in place */
int comm_gatherv(const struct groups *g, MPI_Comm comm, const void *in, int count,
                 MPI_Datatype type, void *out, const int *counts, const int *displs, int root,
                 const char *what);

/* Making communicators, for init. MPI has no non-blocking split: every member of comm first meets
 * the others in a barrier under the deadline, so a member that stops before the split is named and
 * the job aborted there; the split then runs among members that have all arrived (a member that
 * stops inside MPI's own exchange of the split is the one case left uncovered). A dup is
 * MPI_Comm_idup, waited for under the deadline itself. made names what is made ("EP group"), for
 * the timeout's message. Each split is the fault site init.split, each dup init.dup
 * (base/fault.h): a plain fault there returns MPI_ERR_OTHER without taking part. MPI codes. */
int comm_split(const struct groups *g, MPI_Comm comm, int color, int key, MPI_Comm *out,
               const char *made);
int comm_split_node(const struct groups *g, MPI_Comm comm, int key, MPI_Comm *out,
                    const char *made); /* MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) */
int comm_dup(const struct groups *g, MPI_Comm comm, MPI_Comm *out, const char *made);

/* The sum of `mine` over the runtime's ranks on this node (host memory needed: commit, load): over
 * this replica's ranks on the node (the dense group split by node), then over the replicas with
 * ranks there (the replicate group split by node). Exact where a replica with ranks on a node
 * has the rank of each dense index there too (replicas in node blocks, or one per node);
 * otherwise those replicas' other ranks on the node are not counted. Collective over the
 * runtime; *members gets how many ranks were summed. An MPI failure: mine alone. what names
 * it in the deadline's messages ("commit's memory check"). */
uint64_t comm_node_sum(const struct groups *g, uint64_t mine, int *members, const char *what);

/* What comm_node_memory found: this node's need against the host memory available. */
struct node_memory {
    uint64_t node;  /* need summed over the node's ranks of the runtime (comm_node_sum) */
    int ranks;      /* how many were summed */
    uint64_t avail; /* bytes available (base/meminfo.h) */
    char src[160];  /* where that figure came from */
    int over;       /* node > avail: the caller refuses, in its own words */
};

/* need (this rank's host bytes) summed over the node (comm_node_sum) and compared with what the
 * machine has left: the check commit and load make before they allocate (Linux overcommits and
 * kills the process when the memory is touched). Collective over the runtime: a rank whose part
 * already failed (mine not OK) joins with 0 and gets mine back. ERR_INVALID_ARGUMENT, logged
 * "<who>: rank R: ...", where SHARDOPT_MEM_AVAILABLE is no byte count; else OK, with m->over set
 * where the node needs more than is available (no figure known: never over). what names the
 * check in the deadline's messages ("commit's memory check"). */
shardopt_status_t comm_node_memory(const struct groups *g, uint64_t need, shardopt_status_t mine,
                                   const char *who, const char *what, struct node_memory *m);

#endif

/* The CUDA backend's NCCL exchanges (comm_backend = nccl): one communicator per runtime group,
 * bootstrapped over its MPI communicator, with its own stream. Exchanges are posted after the
 * compute stream's work so far and finish on the group's stream; the compute stream waits on
 * them by event, so the host never blocks inside a step until nccl_group_drain at its end. The
 * communicators are non-blocking: every wait polls with comm_timeout_s, and a failure or a
 * timeout aborts the communicator and returns SHARDOPT_ERR_NCCL (a hang becomes an error).
 * Without CUDA (comm_nccl_none.c) every entry returns SHARDOPT_ERR_UNSUPPORTED. */
#ifndef RUNTIME_COMM_NCCL_H
#define RUNTIME_COMM_NCCL_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/comm/groups.h"
#include "shardopt.h"

/* Exchange slots per group: one per (pipeline buffer set, direction). */
#define NCCL_SLOTS 8

struct nccl_group;

/* Collective over comm, one of gr's groups: the MPI collectives that bootstrap the communicator
 * (who has room, the unique id's broadcast) wait under gr's deadline (comm_wait.h: a member that
 * never arrives ends the job with the phase and the peers named). compute_stream: the runtime's
 * CUDA stream. timeout_s: NCCL's own waits, for the group's life (0 = none; the runtime gives
 * comm_timeout_s to both). share: a group whose communication stream this one uses too (NULL:
 * its own; destroy the sharers first). One stream for all groups keeps every rank's NCCL kernels
 * in one order, whatever the GPU's scheduler would do with independent streams. When another
 * member ran out of memory for its state this returns OK with *out NULL: call groups_agree
 * afterwards. */
shardopt_status_t nccl_group_create(const struct groups *gr, MPI_Comm comm, void *compute_stream,
                                    double timeout_s, const char *name,
                                    const struct nccl_group *share, struct nccl_group **out);
void nccl_group_destroy(struct nccl_group *g);

/* Abort the communicator (once; later calls on g return SHARDOPT_ERR_NCCL): after a failed
 * step, so that no operation a peer will never match is left for finalize to wait on. */
void nccl_group_abort(struct nccl_group *g);

/* All-to-all-v of `es`-byte elements over lists of peers (each in increasing member order):
 * to member sp[j] sc[j] elements from sbuf + sd[j] (j < ns), from member rp[j] rc[j] into
 * rbuf + rd[j] (j < nr); this member's own block, if listed, is skipped (the caller copies it).
 * Starts after the compute stream's queued work; completion is marked by slot's event. */
shardopt_status_t nccl_group_exchange(struct nccl_group *g, int slot, const void *sbuf, int ns,
                                      const int *sp, const int *sc, const int *sd, void *rbuf,
                                      int nr, const int *rp, const int *rc, const int *rd,
                                      size_t es);

/* All-gather-v in place: this member's block (counts[rank] elements at buf + displs[rank], its
 * rank in the group) to every other member, member i's into buf + displs[i]; the same posting,
 * ordering and slot event as nccl_group_exchange. */
shardopt_status_t nccl_group_allgatherv(struct nccl_group *g, int slot, void *buf,
                                        const int *counts, const int *displs, size_t es);

/* Sum of `count` floats in place over the group (ncclAllReduce, ncclSum, fp32): a Newton-Schulz
 * team's Gram matrix, or a sharded-strategy matrix's, in device memory. Posted on the group's
 * stream after the compute stream's queued work, and the compute stream waits for it (no host
 * wait); the first slot's event marks it, so a group that also runs exchanges (the dense and
 * expert shard groups' communicators: the sharded strategy runs after the step's pipeline) posts
 * these only once the compute stream waits for every exchange it posted (cudaStreamWaitEvent
 * takes the event's record at the call: a later record does not move an earlier wait). */
shardopt_status_t nccl_group_allreduce_f32(struct nccl_group *g, float *buf, size_t count);
/* The same of `count` bf16 values (ncclBfloat16, ncclSum): a bf16 team's Gram matrix. NCCL's
 * ring and tree add a pair per hop, rounded to bf16, as the CPU teams' MPI sum does, in NCCL's
 * order of the members (NVLS may accumulate in fp32 and round once): the CPU's bits with two
 * members, within bf16 rounding of them with more (docs/design.md, Newton-Schulz teams). */
shardopt_status_t nccl_group_allreduce_bf16(struct nccl_group *g, uint16_t *buf, size_t count);
/* The same of `count` doubles (ncclFloat64): the sharded strategy's norm all-reduce, its squared
 * norm and failure flag, which the host reads after nccl_group_drain. */
shardopt_status_t nccl_group_allreduce_f64(struct nccl_group *g, double *buf, size_t count);

/* The compute stream waits for the exchange of `slot` (no host wait). */
shardopt_status_t nccl_group_wait(struct nccl_group *g, int slot);

/* The host waits until everything posted on the group has completed, at most the timeout. */
shardopt_status_t nccl_group_drain(struct nccl_group *g);

/* Whether g was aborted (a failed or timed-out operation, or a failed step): it cannot be used
 * again. */
int nccl_group_aborted(const struct nccl_group *g);

#endif

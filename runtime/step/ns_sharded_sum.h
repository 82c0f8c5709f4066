/* Sharded Newton-Schulz's parts (runtime/step/ns_sharded.c runs them): the group's all-reduces
 * and what moves around them (ns_sharded_sum.c), and the iterations over them in fp32 and bf16
 * (ns_sharded_iter.c). The Gram all-reduce and AOL's host staging are one set for both element
 * types: `esize` (sizeof(float) or sizeof(uint16_t)) picks the MPI type and op, the NCCL type,
 * the failure flag's value and the host function. */
#ifndef RUNTIME_NS_SHARDED_SUM_H
#define RUNTIME_NS_SHARDED_SUM_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/comm/comm_nccl.h"
#include "runtime/step/muon_exec.h"

/* The deadline of the Muon phase's MPI all-reduces (the teams' norm, Gram sum and result guard,
 * the sharded strategy's over MPI, ns_sharded_run's agreement): twice comm_timeout_s where the
 * phase has NCCL all-reduces (team communicators, or sharded matrices over a group's NCCL
 * communicator), whose member may come from a drain that waited out comm_timeout_s (a stuck
 * peer) while the others wait for it; else comm_timeout_s. Fixed by commit's plan: commit keeps
 * it in rt->ns_timeout_s, once, instead of a walk over the parameters per all-reduce. */
double ns_sharded_deadline(const struct shardopt_runtime *rt);

/* rt->groups with that deadline (rt->ns_timeout_s). */
struct groups ns_sharded_patient(const struct shardopt_runtime *rt);

/* A member's failure, told by the flag of the group's all-reduce: logged, ERR_INTERNAL. mine:
 * this rank failed (else another member). */
shardopt_status_t ns_sharded_group_failed(const char *name, int mine);

/* 1 / (|U|_F s + eps) of the whole matrix into *inv: ss, this member's squared norm, summed over
 * the group (every member, with columns or not, joins) with the failure flag (*failed: this
 * member failed): over nccl when not NULL (the sharded strategy; a member whose copy of the sum
 * back failed sets *failed and goes on, as the Gram all-reduces tell it), else over comm by MPI. */
shardopt_status_t ns_sharded_norm(shardopt_runtime_t rt, const char *name, MPI_Comm comm,
                                  struct nccl_group *nccl, double ss, int *failed, double *inv);

/* The Gram matrix A (m x m elements of esize bytes where Newton-Schulz runs; formed: this
 * member's, else it joins with zeros; failed: this member failed, told by the flag one element
 * past the sum) summed over the group: over nccl on the device when not NULL, else over comm by
 * MPI, in place on the CPU tables (sum = A) or through the host staging `sum` on a device, the sum
 * copied back up to A stream-ordered. Over MPI a failure anywhere returns here on every member
 * (ns_sharded_group_failed); over NCCL the flag stays on the device (ns_sharded_flag). */
shardopt_status_t ns_sharded_gram_sum(shardopt_runtime_t rt, const char *name, MPI_Comm comm,
                                      struct nccl_group *nccl, int formed, int failed, void *A,
                                      void *sum, int64_t m, size_t esize);

/* The end of a matrix's iterations over NCCL: the polled wait for the group's all-reduces, then
 * the copy of the last sum's flag (queued by the iterations to rt->sh_host), read. */
shardopt_status_t ns_sharded_flag(shardopt_runtime_t rt, const char *name, struct nccl_group *nccl,
                                  int failed, size_t esize);

/* AOL's row scales with Newton-Schulz on a device, on the host as the CPU runs them: the summed
 * Gram matrix in `sum` (rt->sh_host; down: it is on the device at A, over NCCL), the block's fp32
 * X (xf, m x n) down behind AOL's m doubles, then ns_aol_scale (fp32: X scaled in place, x = xf)
 * or ns_bf16_aol (the scaled bf16 X into x), and X and the scaled Gram matrix back up to x and
 * A. A failed copy is this member's alone (logged): the caller carries it into the group's next
 * all-reduce. */
shardopt_status_t ns_sharded_aol_device(shardopt_runtime_t rt, const char *name, void *A, void *sum,
                                        int down, const float *xf, void *x, int64_t m, int64_t n,
                                        size_t esize);

/* A device copy of `bytes` to the host, then the wait: 0, or -1 when the device's work failed. */
int ns_sharded_to_host(shardopt_runtime_t rt, void *host, const void *dev, size_t bytes);
shardopt_status_t ns_sharded_copy_failed(shardopt_runtime_t rt, const char *name, const char *what);

/* What one piece's iterations add to the counters (bytes and FLOPs). */
void ns_sharded_count(shardopt_runtime_t rt, MPI_Comm comm, int64_t m, int64_t n, size_t esize,
                      int narrow_ok);

/* The iterations of one piece over comm (ns_sharded_iter.c): fp32, and bf16 (a team's block with
 * ns_compute = bf16). nccl: the Gram all-reduces over it (NULL: MPI); norm_nccl: the norm's too
 * (the sharded strategy's, after the step's pipeline; a team's norm goes over MPI, as its host
 * read over NCCL would wait for the pipeline's exchanges in flight on the groups' one stream). */
shardopt_status_t ns_sharded_iterate(shardopt_runtime_t rt, const char *name, MPI_Comm comm,
                                     struct nccl_group *nccl, int norm_nccl,
                                     const struct ns_args *piece, size_t count, int64_t m,
                                     int64_t n, double ss);
shardopt_status_t ns_sharded_iterate_bf16(shardopt_runtime_t rt, const char *name, MPI_Comm comm,
                                          struct nccl_group *nccl, const struct ns_args *piece,
                                          size_t count, int64_t m, int64_t n, double ss,
                                          int *diverged);

#endif

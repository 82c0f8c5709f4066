/* The step's side of offload (docs/design.md, Offload): the elementwise kernels read and write
 * optimizer state either where it lives (offload = none or cpu) or in a staging slot it was
 * streamed into (offload = optimizer); with offload = cpu the Newton-Schulz input crosses to the
 * device and its output back. Callers describe the work as ranges of tensors; this file decides the
 * path. */
#ifndef RUNTIME_OFFLOAD_EXEC_H
#define RUNTIME_OFFLOAD_EXEC_H

#include "runtime/runtime.h"

/* Local elements [off, off + n) of tensor p; out: where a Muon range packs U (comm dtype). */
struct state_range {
    struct shardopt_param *p;
    size_t off, n;
    void *out;
};

/* Range i of a piece of work into *r; returns 0 past the last one (n == 0 ranges are skipped). */
typedef int (*state_range_fn)(void *arg, int i, struct state_range *r);

/* The kernel of one range, given its state: s0 the momentum or exp_avg at element r->off, s1
 * the exp_avg_sq (AdamW) or NULL. */
typedef void (*state_kernel_fn)(shardopt_runtime_t rt, const struct state_range *r, void *s0,
                                void *s1, const void *arg);

/* Run kernel over every range get() yields, for Muon (momentum) or AdamW (exp_avg, exp_avg_sq)
 * tensors; with offload = optimizer the ranges are cut to fit the staging slots (at run
 * boundaries of the element-index map) and streamed. */
void offload_state_run(shardopt_runtime_t rt, shardopt_algo_t algo, state_range_fn get,
                       void *get_arg, state_kernel_fn kernel, const void *kernel_arg);

/* offload = cpu: the device copy of bytes of host Newton-Schulz input, in dev (returned); the
 * host buffer itself otherwise. offload_ns_out copies the result back when they differ, and
 * returns 0, or SHARDOPT_ERR_DEVICE (logged) when the device's work or that copy failed: host
 * is then zeroed (a zero update), and the caller records the failure for the Muon phase's
 * agreement instead of leaving its peers' next collective (fault site copy). */
void *offload_ns_in(shardopt_runtime_t rt, void *dev, const void *host, size_t bytes);
shardopt_status_t offload_ns_out(shardopt_runtime_t rt, void *host, const void *dev, size_t bytes);

/* Commit: before the state store is allocated, point it at a host store (offload != none). */
void offload_prepare(shardopt_runtime_t rt);

/* Commit: staging slots (optimizer) and device Newton-Schulz buffers (cpu), after planning.
 * ns_elems, sh_elems: the largest bucket's NS slots and sharded piece, comm dtype elements.
 * Returns the bytes allocated, or (size_t)-1 when an allocation failed, with its size in
 * *failed. */
size_t offload_alloc(shardopt_runtime_t rt, size_t ns_elems, size_t sh_elems, size_t *failed);
void offload_release(shardopt_runtime_t rt);

#endif

/* Where optimizer state lives: one arena, 64-byte aligned slices, zeroed at commit. With
 * offload = none the arena comes from the backend's allocator (device memory on CUDA, host on the
 * CPU); with offload = optimizer or cpu it is a host store (host_store.h): NUMA-local, bounded by
 * host_store_limit. The kernels never know which: they see pointers. */
#ifndef OFFLOAD_STATE_STORE_H
#define OFFLOAD_STATE_STORE_H

#include <hwloc.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/ops.h"

struct state_store {
    const struct kernel_ops *ops;
    size_t bytes; /* reserved so far; the arena's size once allocated */
    unsigned char *base;
    /* host store (offload): where and how much */
    int host;
    hwloc_topology_t topo;
    hwloc_const_nodeset_t nodes;
    uint64_t limit;
};

void state_store_init(struct state_store *s, const struct kernel_ops *ops);

/* Keep the arena in a host store on `nodes` of topo (either may be NULL), at most limit bytes. */
void state_store_use_host(struct state_store *s, hwloc_topology_t topo, hwloc_const_nodeset_t nodes,
                          uint64_t limit);

/* Reserve a slice of `bytes` before allocation; returns its offset in the arena. */
size_t state_store_reserve(struct state_store *s, size_t bytes);

/* Allocate and zero the arena. Returns 0, or -1 with the reason in err. */
int state_store_alloc(struct state_store *s, char *err, size_t errlen);

void *state_store_ptr(const struct state_store *s, size_t offset);

void state_store_free(struct state_store *s);

/* A second buffer of the arena's size in the same kind of memory (a load fills a complete new
 * copy of the state in it, then installs it with state_store_swap); NULL with err on failure. */
void *state_store_buffer_alloc(const struct state_store *s, char *err, size_t errlen);
void state_store_buffer_free(const struct state_store *s, void *p);

/* Whether the arena is device memory the host must not touch (a device backend, no offload). */
int state_store_on_device(const struct state_store *s);

/* The arena (or a buffer like it) as host memory: itself, or, in device memory, a copy in
 * *copy (the caller frees it with free()). NULL with err when the copy fails. */
const unsigned char *state_store_host_view(const struct state_store *s,
                                           const struct kernel_ctx *ctx, const void *buf,
                                           void **copy, char *err, size_t errlen);

/* dst (a buffer of the arena's kind) <- the host bytes src, whole arena. 0, or -1 with err. */
int state_store_upload(const struct state_store *s, const struct kernel_ctx *ctx, void *dst,
                       const void *src, char *err, size_t errlen);

/* Exchange the arena with *other, a buffer from state_store_buffer_alloc. */
void state_store_swap(struct state_store *s, void **other);

#endif

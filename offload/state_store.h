/* Where optimizer state lives: one arena, 64-byte aligned slices, zeroed at commit. With
 * offload = none the arena comes from the device table's allocator (device memory on CUDA, host on
 * the CPU); with offload = optimizer or cpu it is a host store (host_store.h): NUMA-local, bounded
 * by host_store_limit. The kernels never know which: they see pointers. */
#ifndef OFFLOAD_STATE_STORE_H
#define OFFLOAD_STATE_STORE_H

#include <hwloc.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/device.h"

struct state_store {
    const struct device_ops *dev;
    size_t bytes; /* reserved so far; the arena's size once allocated */
    unsigned char *base;
    /* host store (offload): where and how much */
    int host;
    hwloc_topology_t topo;
    hwloc_const_nodeset_t nodes;
    uint64_t limit;
};

void state_store_init(struct state_store *s, const struct device_ops *dev);

/* Keep the arena in a host store on `nodes` of topo (either may be NULL), at most limit bytes. */
void state_store_use_host(struct state_store *s, hwloc_topology_t topo, hwloc_const_nodeset_t nodes,
                          uint64_t limit);

/* Reserve a slice of `bytes` before allocation; returns its offset in the arena. */
size_t state_store_reserve(struct state_store *s, size_t bytes);

/* Allocate and zero the arena. SHARDOPT_OK, or state_store_buffer_alloc's failure. */
shardopt_status_t state_store_alloc(struct state_store *s);

void *state_store_ptr(const struct state_store *s, size_t offset);

void state_store_free(struct state_store *s);

/* A second buffer of the arena's size in the same kind of memory (a load fills a complete new
 * copy of the state in it, then installs it with state_store_swap), in *out. Every failure is
 * SHARDOPT_ERR_OUT_OF_MEMORY (pinning a host store too: the locked-memory limit), with its
 * message recorded by status_set (offload/ knows neither the call nor the rank: the caller
 * adds them, base/status.h's log_fail_context) and *out NULL. */
shardopt_status_t state_store_buffer_alloc(const struct state_store *s, void **out);
void state_store_buffer_free(const struct state_store *s, void *p);

/* Whether the arena is device memory the host must not touch (DEVICE_CAP_DEVICE_MEMORY, no
 * offload). */
int state_store_on_device(const struct state_store *s);

/* The arena (or a buffer like it) as host memory in *view: itself, or, in device memory, a copy
 * in *copy (the caller frees it with free()). SHARDOPT_ERR_OUT_OF_MEMORY (the host copy) or
 * SHARDOPT_ERR_DEVICE (the device's copies failed), recorded by status_set, *view NULL. */
shardopt_status_t state_store_host_view(const struct state_store *s, const struct kernel_ctx *ctx,
                                        const void *buf, const unsigned char **view, void **copy);

/* dst (a buffer of the arena's kind) <- the host bytes src, whole arena. SHARDOPT_OK, or
 * SHARDOPT_ERR_DEVICE recorded by status_set. */
shardopt_status_t state_store_upload(const struct state_store *s, const struct kernel_ctx *ctx,
                                     void *dst, const void *src);

/* Exchange the arena with *other, a buffer from state_store_buffer_alloc. */
void state_store_swap(struct state_store *s, void **other);

#endif

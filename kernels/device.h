/* The device services of a backend: memory, copies, streams, events, timing marks and the
 * device itself, one table per backend beside its compute table (kernels/ops.h), filled at init.
 *
 * What a table can do is said once, in caps (enum device_cap): a caller asks device_has(), never
 * whether a slot is NULL, and every slot of a capability the table claims is filled (the slots
 * under no capability always are; device_ops_check says which slot contradicts the caps). On the
 * CPU the "device" is host memory and every copy is a memcpy; offload/ streams state through this
 * table alone, without the compute one. (The shape follows UCX's memory-domain ops, whose
 * capability flags say what a domain supports.) */
#ifndef KERNELS_DEVICE_H
#define KERNELS_DEVICE_H

#include <stddef.h>

#include "ctx.h"
#include "shardopt_status.h"

/* Lanes of copy_on/lane_wait: the compute stream and two copy streams; events per tag. */
#define KERNEL_LANES     3
#define KERNEL_LANE_TAGS 4
/* Timing marks a step may queue (mark/mark_seconds, kernels/timeline.h). */
#define KERNEL_MAX_MARKS 65536

/* Where a pointer points (device_ops.pointer_kind). */
enum kernel_ptr_kind {
    KERNEL_PTR_UNKNOWN = -1, /* the backend cannot tell: not checked */
    KERNEL_PTR_HOST = 0,     /* host memory, pageable or pinned */
    KERNEL_PTR_DEVICE = 1,   /* memory of ctx's device */
    KERNEL_PTR_MANAGED = 2,  /* managed: host and device both reach it */
    KERNEL_PTR_OTHER = 3,    /* memory of another device */
};

/* What a device table can do; each names the slots it fills. */
enum device_cap {
    /* alloc gives memory the host must not touch (it moves through copy and host mirrors);
     * without it, alloc's memory is host memory */
    DEVICE_CAP_DEVICE_MEMORY = 1u << 0,
    DEVICE_CAP_HOST_PINNED = 1u << 1,   /* host_alloc, host_free: page-locked host memory */
    DEVICE_CAP_HOST_REGISTER = 1u << 2, /* host_register, host_unregister */
    DEVICE_CAP_COPY_LANES = 1u << 3,    /* copy_on, lane_record, lane_wait */
    DEVICE_CAP_STREAMS = 1u << 4,       /* stream_begin, stream_end */
    DEVICE_CAP_MARKS = 1u << 5,         /* mark, mark_seconds, mark_done */
    /* backend_create, backend_destroy, device_count, device_pci_bus_id */
    DEVICE_CAP_BACKEND = 1u << 6,
    DEVICE_CAP_POINTER_KIND = 1u << 7,  /* pointer_kind */
    DEVICE_CAP_THREAD_DEVICE = 1u << 8, /* device_enter: the current device is per thread */
};

struct device_ops {
    const char *name;
    unsigned caps; /* enum device_cap flags */

    /* Always filled. */
    /* Host <-> device (or device <-> device) copies and fills, queued on ctx's stream. */
    void (*copy)(const struct kernel_ctx *ctx, void *dst, const void *src, size_t bytes);
    /* dst rows of `width` bytes at `dpitch` <- src rows at `spitch`: packing and unpacking
     * matrix pieces around the exchanges. */
    void (*copy2d)(const struct kernel_ctx *ctx, void *dst, size_t dpitch, const void *src,
                   size_t spitch, size_t width, size_t rows);
    void (*fill)(const struct kernel_ctx *ctx, void *dst, int byte, size_t bytes);
    /* Memory for state and buffers (offload/ allocates through these). */
    void *(*alloc)(size_t bytes);
    void (*free)(void *p);
    /* Wait for the work queued on ctx's stream (device backends queue; the CPU runs at once).
     * 0, or -1 when queued work failed. */
    int (*sync)(const struct kernel_ctx *ctx);

    /* DEVICE_CAP_COPY_LANES: a copy queued on lane 1 (in) or 2 (out) beside lane 0, the compute
     * stream. lane_record marks event (lane, tag) after the work queued on lane so far;
     * lane_wait makes lane `waiter` wait for event (signaler, tag) as last recorded (nothing
     * when it never was). Recording and waiting are apart so that a wait covers exactly the
     * work queued up to the record, not what the signaler was given since (staging's run(k)
     * waits for in(k), not for in(k+1) queued after it). tag < KERNEL_LANE_TAGS: one event per
     * staging slot and one for the step's join. */
    void (*copy_on)(const struct kernel_ctx *ctx, int lane, void *dst, const void *src,
                    size_t bytes);
    void (*lane_record)(const struct kernel_ctx *ctx, int lane, int tag);
    void (*lane_wait)(const struct kernel_ctx *ctx, int waiter, int signaler, int tag);

    /* DEVICE_CAP_BACKEND: per-runtime backend state for kernel_ctx.backend, and its own stream
     * for kernel_ctx.stream (when stream is not NULL). device < 0: the current one. The
     * failure's status (SHARDOPT_ERR_OUT_OF_MEMORY for the host state, SHARDOPT_ERR_DEVICE for
     * the device) with its message recorded (status_set: the caller adds where and logs). */
    shardopt_status_t (*backend_create)(int device, void **stream, void **backend);
    void (*backend_destroy)(void *backend);
    int (*device_count)(void);
    /* The PCI bus id of a device (< 0: the current one), for its NUMA-local cores. 0, or -1. */
    int (*device_pci_bus_id)(int device, char *buf, size_t len);

    /* DEVICE_CAP_HOST_PINNED: page-locked host memory, the host side of staged exchanges and
     * copies. */
    void *(*host_alloc)(size_t bytes);
    void (*host_free)(void *p);
    /* DEVICE_CAP_HOST_REGISTER: pin (and unpin) host memory allocated elsewhere (the NUMA-bound
     * host store), so that copies to and from it run asynchronously on the copy engines. 0, or
     * -1. */
    int (*host_register)(void *p, size_t bytes);
    void (*host_unregister)(void *p);

    /* DEVICE_CAP_STREAMS: ordering with a caller's stream (NULL: none): begin makes ctx's
     * stream wait for the work queued on it so far; end makes it wait for ctx's, or, without
     * one, waits on the host. SHARDOPT_ERR_DEVICE with the failed call recorded (status_set). */
    shardopt_status_t (*stream_begin)(const struct kernel_ctx *ctx, void *caller_stream);
    shardopt_status_t (*stream_end)(const struct kernel_ctx *ctx, void *caller_stream);

    /* DEVICE_CAP_MARKS: timing marks (kernels/timeline.h): mark queues mark id (0 <= id <
     * KERNEL_MAX_MARKS) on lane, 0 or -1; mark_seconds waits for marks a and b and returns the
     * seconds from a to b, or NaN when they cannot be read; mark_done never waits: 1 when mark
     * id has happened, 0 while the lane has not reached it, -1 when it cannot tell. */
    int (*mark)(const struct kernel_ctx *ctx, int lane, int id);
    double (*mark_seconds)(const struct kernel_ctx *ctx, int a, int b);
    int (*mark_done)(const struct kernel_ctx *ctx, int id);

    /* DEVICE_CAP_POINTER_KIND: a kernel_ptr_kind for p; dev[0]: the device of
     * KERNEL_PTR_DEVICE/OTHER memory, dev[1]: ctx's device. */
    int (*pointer_kind)(const struct kernel_ctx *ctx, const void *p, int dev[2]);

    /* DEVICE_CAP_THREAD_DEVICE: make ctx's device (the one backend_create chose) the calling
     * thread's current device, asking first and setting only when it differs. Device state is
     * per thread: a trainer that steps or saves from another thread than init's (a data
     * loader, a checkpoint thread) would otherwise allocate on and launch against that
     * thread's device. 0, or -1. */
    int (*device_enter)(const struct kernel_ctx *ctx);
};

/* Whether d claims every capability in caps. */
static inline int device_has(const struct device_ops *d, unsigned caps)
{
    return d != NULL && (d->caps & caps) == caps;
}

/* NULL when d fills exactly what its caps promise (the slots under no capability, and every
 * claimed capability's), else the name of the first slot that contradicts them: a table that
 * claims a capability must fill its slots, and one that fills a capability's slots must claim
 * it (or a caller testing the caps would never use them). */
const char *device_ops_check(const struct device_ops *d);

const struct device_ops *device_ops_cpu(void);  /* host memory, memcpy copies */
const struct device_ops *device_ops_cuda(void); /* NULL when built without CUDA */

#endif

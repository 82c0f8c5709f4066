/* The staging area of offload = optimizer: three slots in device memory through which state
 * streams chunk by chunk. While the kernels of chunk k run on slot k % 3, chunk k+1 is copied in
 * and chunk k-1 out: with a device backend's copy lanes (copy_on/lane_record/lane_wait) on their
 * own streams, ordered by events per slot, each recorded right after its stage was queued
 * (in(k+1) after out(k-2), run(k) after in(k) and nothing later, out(k) after run(k)); the
 * compute stream waits for the copy-out lane once per step (staging_join), so that streaming
 * runs on across buckets; on the CPU backend the same calls in the same order, synchronously. Every
 * copy goes through the device table's copy op and is counted here, by kind. With poisoning on, a
 * slot is filled with 0xFF bytes (NaN in fp32 and bf16) when released, so a kernel that reads state
 * that was not copied in fails loudly. */
#ifndef OFFLOAD_STAGING_H
#define OFFLOAD_STAGING_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/device.h"
#include "kernels/timeline.h"

#define STAGING_SLOTS 3
#define STAGING_ALIGN 64

enum staging_kind {
    STAGE_MOMENTUM = 0,
    STAGE_EXP_AVG = 1,
    STAGE_EXP_AVG_SQ = 2,
    STAGE_NS_U = 3, /* offload = cpu: Newton-Schulz input to the device */
    STAGE_NS_O = 4, /* and its output back */
    STAGE_KINDS = 5,
};

struct staging {
    const struct device_ops *dev;
    const struct kernel_ctx *ctx;
    unsigned char *slot[STAGING_SLOTS];
    size_t slot_bytes;
    size_t used[STAGING_SLOTS]; /* bytes held by each slot now */
    size_t peak;                /* most bytes held at once since the last reset */
    int poison;
    uint64_t in[STAGE_KINDS], out[STAGE_KINDS]; /* bytes host -> device and back */
    /* Copy time the compute stream waited for: on the CPU the time inside the copy op; with
     * copy lanes and a device timeline (tl), the compute stream's waits on the copy lanes */
    double seconds_copy;
    double seconds_copy_busy; /* device timeline: the copies' own time on the copy lanes */
    struct timeline *tl;      /* the runtime's, set after init; NULL: host clocks */
    int pending_out;          /* copy lanes: copy-outs queued since the last staging_join */
    int next_slot;            /* where the next staging_stream starts */
};

/* Allocate the slots (slot_bytes each, from the device allocator; none when 0, for the counted
 * copies of staging_copy alone). SHARDOPT_OK, or SHARDOPT_ERR_OUT_OF_MEMORY recorded by
 * status_set. */
shardopt_status_t staging_init(struct staging *s, const struct device_ops *dev,
                               const struct kernel_ctx *ctx, size_t slot_bytes, int poison);
void staging_free(struct staging *s);

/* One chunk of state: up to two host segments (momentum; or exp_avg and exp_avg_sq) that one
 * kernel call reads and writes, plus what the caller needs to make that call. */
struct stream_chunk {
    void *host[2];
    size_t bytes[2];
    int kind[2];
    int nseg;
    void *tag;     /* caller's: which tensor */
    size_t off, n; /* caller's: which elements */
    void *out;     /* caller's: where the result goes */
};

/* The largest element count whose two segments (es0 and es1 bytes per element; es1 may be 0)
 * fit one slot, 64-byte aligned. */
size_t staging_chunk_elems(const struct staging *s, size_t es0, size_t es1);

/* Fills *c with the next chunk (each fitting one slot); returns 0 when there is none. */
typedef int (*stream_next_fn)(void *arg, struct stream_chunk *c);
/* Runs the kernel of chunk c on its device copies dev[0..nseg). */
typedef void (*stream_run_fn)(void *arg, const struct stream_chunk *c, void *const dev[2]);

/* Stream every chunk next() yields through the slots:
 *   in(0); for each k: in(k+1), out(k-1) and release, run(k); then out(last), not waited for
 *   (staging_join). */
void staging_stream(struct staging *s, stream_next_fn next, stream_run_fn run, void *arg);

/* The compute stream waits for every copy-out queued so far (the host store written back):
 * once per step, before its end, and before anything that reads the host store. staging_stream
 * leaves its last copy-outs running so that the next bucket's work overlaps them. */
void staging_join(struct staging *s);

/* A host <-> device copy outside the slots (offload = cpu's Newton-Schulz buffers), counted. */
void staging_copy(struct staging *s, void *dst, const void *src, size_t bytes, int kind, int in);

/* Zero the byte counters, the peak and the copy time (at the start of a step). */
void staging_counts_reset(struct staging *s);

#endif

/* Registering a preset's tensors with a runtime the way an FSDP-style trainer shards them:
 * dense tensors chunked along dim 0 over the dense shard group, expert stacks split over EP and
 * chunked along expert_dim over the expert shard group. Random weights and gradients. */
#ifndef BENCH_PRESET_SHARDS_H
#define BENCH_PRESET_SHARDS_H

#include "bench/preset.h"
#include "shardopt.h"

struct kernel_ops;

struct preset_shards {
    float **w, **g; /* [n] local buffers: host memory, or device memory of `dev` */
    const struct kernel_ops *dev;
    int n;
    int64_t local; /* elements this rank holds */
};

/* Register every tensor of p and commit. dev: the kernel table whose memory holds the
 * parameters and gradients (a device backend's), or NULL for host memory. Returns the first
 * failing status. */
shardopt_status_t preset_shards_register(shardopt_runtime_t rt, const struct preset *p,
                                         int expert_dim, uint64_t seed,
                                         const struct kernel_ops *dev, struct preset_shards *out);

void preset_shards_free(struct preset_shards *s);

#endif

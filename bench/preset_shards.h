/* Registering a preset's tensors with a runtime the way an FSDP-style trainer shards them:
 * dense tensors chunked along dim 0 over the dense shard group, expert stacks split over EP and
 * chunked along expert_dim over the expert shard group. Random weights and gradients. */
#ifndef BENCH_PRESET_SHARDS_H
#define BENCH_PRESET_SHARDS_H

#include "bench/preset.h"
#include "shardopt.h"

struct device_ops;

/* Where member `member` of a group of `members` holds tensor t, as an FSDP-style trainer shards
 * it: a dense tensor in torch.chunk pieces along dim 0 over the dense shard group; an expert
 * stack as its EP rank's E/ep experts, chunked along expert_dim over the expert shard group.
 * The box is in the EP-local stack's coordinates (dims past ndim are 1 long); dim, offset and
 * length are what a parameter descriptor takes. One definition for the benchmarks that register
 * shards and for shardopt-plan, which predicts what they do. */
struct preset_shard {
    int64_t lo[3], len[3];
    int dim;
    int64_t offset, length, numel;
};

void preset_shard_of(const struct preset_tensor *t, int ep, int members, int member, int expert_dim,
                     struct preset_shard *s);

struct preset_shards {
    float **w, **g; /* [n] local buffers: host memory, or device memory of `dev` */
    const struct device_ops *dev;
    int n;
    int64_t local; /* elements this rank holds */
};

/* Register every tensor of p and commit. dev: the kernel table whose memory holds the
 * parameters and gradients (a device backend's), or NULL for host memory. Returns the first
 * failing status. */
shardopt_status_t preset_shards_register(shardopt_runtime_t rt, const struct preset *p,
                                         int expert_dim, uint64_t seed,
                                         const struct device_ops *dev, struct preset_shards *out);

void preset_shards_free(struct preset_shards *s);

#endif

/* A small MoE-shaped model for the distributed tests: its tensors, each rank's shard of them
 * (written from docs/design.md, Process groups and What a rank holds, independently of the
 * library's layout code), and deterministic values and gradients as functions of the global element
 * index, so any layout sees the same numbers. */
#ifndef SHARDOPT_TEST_MODEL_H
#define SHARDOPT_TEST_MODEL_H

#include "shardopt.h"
#include "test.h"

struct tparam {
    const char *name;
    int ndim;
    int64_t shape[3];
    shardopt_placement_t placement;
    int shard_dim; /* for expert stacks: -1 = the layout's expert shard dim */
    int transposed;
    shardopt_dtype_t dtype; /* param and grad */
};

#define MODEL_NPARAMS 19

static const struct tparam model_params[MODEL_NPARAMS] = {
    {"model.embed_tokens.weight",
     2,
     {64, 16, 1},
     SHARDOPT_PLACEMENT_DENSE,
     0,
     0,
     SHARDOPT_DTYPE_FP32},
    {"layers.0.input_norm.weight",
     1,
     {16, 1, 1},
     SHARDOPT_PLACEMENT_REPLICATED,
     0,
     0,
     SHARDOPT_DTYPE_FP32},
    {"layers.0.attn.q_proj.weight",
     2,
     {24, 16, 1},
     SHARDOPT_PLACEMENT_DENSE,
     0,
     0,
     SHARDOPT_DTYPE_FP32},
    {"layers.0.attn.q_proj.bias",
     1,
     {24, 1, 1},
     SHARDOPT_PLACEMENT_DENSE,
     0,
     0,
     SHARDOPT_DTYPE_FP32},
    {"layers.0.attn.k_proj.weight",
     2,
     {8, 16, 1},
     SHARDOPT_PLACEMENT_DENSE,
     0,
     0,
     SHARDOPT_DTYPE_FP32},
    {"layers.0.attn.v_proj.weight",
     2,
     {8, 16, 1},
     SHARDOPT_PLACEMENT_DENSE,
     1,
     0,
     SHARDOPT_DTYPE_BF16},
    {"layers.0.attn.o_proj.weight",
     2,
     {16, 24, 1},
     SHARDOPT_PLACEMENT_DENSE,
     1,
     0,
     SHARDOPT_DTYPE_FP32},
    {"layers.0.mlp.gate_proj.weight",
     2,
     {37, 16, 1},
     SHARDOPT_PLACEMENT_DENSE,
     0,
     0,
     SHARDOPT_DTYPE_FP32},
    {"layers.0.mlp.up_proj.weight",
     2,
     {37, 16, 1},
     SHARDOPT_PLACEMENT_DENSE,
     0,
     0,
     SHARDOPT_DTYPE_BF16},
    {"layers.0.mlp.down_proj.weight",
     2,
     {16, 37, 1},
     SHARDOPT_PLACEMENT_DENSE,
     1,
     0,
     SHARDOPT_DTYPE_FP32},
    {"layers.1.mlp.router.weight",
     2,
     {8, 16, 1},
     SHARDOPT_PLACEMENT_DENSE,
     0,
     0,
     SHARDOPT_DTYPE_FP32},
    {"layers.1.mlp.experts.gate_proj",
     3,
     {8, 12, 16},
     SHARDOPT_PLACEMENT_EXPERT,
     -1,
     0,
     SHARDOPT_DTYPE_FP32},
    {"layers.1.mlp.experts.up_proj",
     3,
     {8, 12, 16},
     SHARDOPT_PLACEMENT_EXPERT,
     -1,
     0,
     SHARDOPT_DTYPE_BF16},
    {"layers.1.mlp.experts.down_proj",
     3,
     {8, 12, 16},
     SHARDOPT_PLACEMENT_EXPERT,
     -1,
     1,
     SHARDOPT_DTYPE_FP32},
    {"layers.1.mlp.shared_expert.gate_proj.weight",
     2,
     {12, 16, 1},
     SHARDOPT_PLACEMENT_DENSE,
     0,
     0,
     SHARDOPT_DTYPE_FP32},
    {"layers.1.mlp.shared_expert.down_proj.weight",
     2,
     {16, 12, 1},
     SHARDOPT_PLACEMENT_DENSE,
     0,
     0,
     SHARDOPT_DTYPE_FP32},
    {"layers.1.tiny.weight", 2, {2, 16, 1}, SHARDOPT_PLACEMENT_DENSE, 0, 0, SHARDOPT_DTYPE_FP32},
    {"layers.1.replicated_proj.weight",
     2,
     {6, 10, 1},
     SHARDOPT_PLACEMENT_REPLICATED,
     0,
     0,
     SHARDOPT_DTYPE_FP32},
    {"lm_head.weight", 2, {64, 16, 1}, SHARDOPT_PLACEMENT_DENSE, 0, 0, SHARDOPT_DTYPE_FP32},
};

/* Where a rank sits, as the library reports it. */
struct tcoords {
    int dense_rank, dense_size, ep_rank, ep_size, xs_rank, xs_size;
};

struct tbox {
    int64_t lo[3], len[3];
    int shard_dim;
    int64_t offset, length; /* what goes into the descriptor */
    int64_t numel;
};

/* torch.chunk: ceil-sized chunks, the last ones short or empty. */
static inline void model_chunk(int64_t n, int parts, int i, int64_t *lo, int64_t *len)
{
    int64_t c = (n + parts - 1) / parts;
    *lo = c * i < n ? c * i : n;
    *len = *lo + c < n ? c : n - *lo;
}

static inline void model_box(const struct tparam *t, const struct tcoords *c, int expert_dim,
                             struct tbox *b)
{
    for (int d = 0; d < 3; d++) {
        b->lo[d] = 0;
        b->len[d] = t->shape[d];
    }
    b->shard_dim = t->shard_dim < 0 ? expert_dim : t->shard_dim;
    if (t->placement == SHARDOPT_PLACEMENT_REPLICATED) {
        b->offset = 0;
        b->length = t->shape[b->shard_dim];
    } else if (t->placement == SHARDOPT_PLACEMENT_EXPERT) {
        const int64_t per = t->shape[0] / c->ep_size;
        b->lo[0] = c->ep_rank * per;
        b->len[0] = per;
        const int64_t extent = b->shard_dim == 0 ? per : t->shape[b->shard_dim];
        model_chunk(extent, c->xs_size, c->xs_rank, &b->offset, &b->length);
        b->lo[b->shard_dim] += b->offset;
        b->len[b->shard_dim] = b->length;
    } else {
        model_chunk(t->shape[b->shard_dim], c->dense_size, c->dense_rank, &b->offset, &b->length);
        b->lo[b->shard_dim] = b->offset;
        b->len[b->shard_dim] = b->length;
    }
    b->numel = b->len[0] * b->len[1] * b->len[2];
}

static inline uint64_t model_mix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* Initial value (step 0) or gradient of step s (>= 1) of global element gi of tensor p. */
static inline float model_value(int p, int step, int64_t gi)
{
    uint64_t h = model_mix(((uint64_t)p << 48) ^ ((uint64_t)step << 40) ^ (uint64_t)gi);
    double u = (double)(h >> 11) / 9007199254740992.0 - 0.5;
    return (float)(step == 0 ? 0.4 * u : u);
}

/* Global flat index of the i-th local element of box b. */
static inline int64_t model_global(const struct tparam *t, const struct tbox *b, int64_t i)
{
    int64_t c2 = i % b->len[2], c1 = (i / b->len[2]) % b->len[1], c0 = i / (b->len[2] * b->len[1]);
    return ((b->lo[0] + c0) * t->shape[1] + b->lo[1] + c1) * t->shape[2] + b->lo[2] + c2;
}

static inline void model_store(void *buf, shardopt_dtype_t dt, int64_t i, float v)
{
    if (dt == SHARDOPT_DTYPE_BF16) {
        uint32_t u;
        memcpy(&u, &v, 4);
        u += 0x7fffu + ((u >> 16) & 1u); /* values here are finite: plain RNE */
        ((uint16_t *)buf)[i] = (uint16_t)(u >> 16);
    } else {
        ((float *)buf)[i] = v;
    }
}

static inline size_t model_esize(shardopt_dtype_t dt) { return dt == SHARDOPT_DTYPE_BF16 ? 2 : 4; }

#endif

#include "preset_shards.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/device.h"

/* torch.chunk: ceil-sized chunks, the last ones short or empty */
static void chunk(int64_t n, int parts, int i, int64_t *lo, int64_t *len)
{
    int64_t c = (n + parts - 1) / parts;
    *lo = c * i < n ? c * i : n;
    *len = *lo + c < n ? c : n - *lo;
}

void preset_shard_of(const struct preset_tensor *t, int ep, int members, int member, int expert_dim,
                     struct preset_shard *s)
{
    for (int d = 0; d < 3; d++) {
        s->lo[d] = 0;
        s->len[d] = d < t->ndim ? t->shape[d] : 1;
    }
    s->dim = t->expert ? expert_dim : 0;
    if (t->expert)
        s->len[0] = t->shape[0] / ep;
    chunk(s->len[s->dim], members, member, &s->lo[s->dim], &s->len[s->dim]);
    s->offset = s->lo[s->dim];
    s->length = s->len[s->dim];
    s->numel = s->len[0] * s->len[1] * s->len[2];
}

/* The host values to a device buffer (dev), which replaces them. */
static float *to_device(const struct device_ops *dev, float *host, int64_t numel)
{
    const struct kernel_ctx ctx = {.threads = 0};
    float *d = dev->alloc(sizeof(float) * (size_t)(numel + 1));
    if (d != NULL) {
        dev->copy(&ctx, d, host, sizeof(float) * (size_t)numel);
        if (dev->sync(&ctx) != 0) {
            dev->free(d);
            d = NULL;
        }
    }
    free(host);
    return d;
}

shardopt_status_t preset_shards_register(shardopt_runtime_t rt, const struct preset *p,
                                         int expert_dim, uint64_t seed,
                                         const struct device_ops *dev, struct preset_shards *out)
{
    shardopt_stats_t s = SHARDOPT_STATS_INIT;
    shardopt_status_t st;

    memset(out, 0, sizeof *out);
    out->w = calloc((size_t)p->n + 1, sizeof(float *));
    out->g = calloc((size_t)p->n + 1, sizeof(float *));
    if (out->w == NULL || out->g == NULL)
        return SHARDOPT_ERR_OUT_OF_MEMORY;
    out->n = p->n;
    out->dev = dev;
    shardopt_get_stats(rt, &s);
    for (int i = 0; i < p->n; i++) {
        const struct preset_tensor *t = &p->t[i];
        shardopt_param_desc_t d = SHARDOPT_PARAM_DESC_INIT;
        shardopt_param_t h;
        struct preset_shard sh;
        preset_shard_of(t, s.ep_size, t->expert ? s.expert_shard_size : s.dense_size,
                        t->expert ? s.expert_shard_rank : s.dense_rank, expert_dim, &sh);
        const int64_t numel = sh.numel;
        d.name = t->name;
        d.ndim = t->ndim;
        memcpy(d.shape, t->shape, sizeof d.shape);
        d.placement = t->expert ? SHARDOPT_PLACEMENT_EXPERT : SHARDOPT_PLACEMENT_DENSE;
        d.shard_dim = sh.dim;
        d.shard_offset = sh.offset;
        d.shard_length = sh.length;
        out->w[i] = malloc(sizeof(float) * (size_t)(numel + 1));
        out->g[i] = malloc(sizeof(float) * (size_t)(numel + 1));
        if (out->w[i] == NULL || out->g[i] == NULL)
            return SHARDOPT_ERR_OUT_OF_MEMORY;
        for (int64_t k = 0; k < numel; k++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            out->w[i][k] = (float)((double)(seed >> 11) / 9007199254740992.0 - 0.5) * 0.05f;
            out->g[i][k] = (float)((double)(seed >> 20 & 0xfffff) / 1048576.0 - 0.5);
        }
        out->local += numel;
        if (dev != NULL) {
            out->w[i] = to_device(dev, out->w[i], numel);
            out->g[i] = to_device(dev, out->g[i], numel);
            if (out->w[i] == NULL || out->g[i] == NULL)
                return SHARDOPT_ERR_OUT_OF_MEMORY;
        }
        d.data = out->w[i];
        d.grad = out->g[i];
        if ((st = shardopt_register(rt, &d, &h)) != SHARDOPT_OK)
            return st;
    }
    return shardopt_commit(rt);
}

void preset_shards_free(struct preset_shards *s)
{
    for (int i = 0; i < s->n; i++) {
        if (s->dev != NULL) {
            s->dev->free(s->w[i]);
            s->dev->free(s->g[i]);
        } else {
            free(s->w[i]);
            free(s->g[i]);
        }
    }
    free(s->w);
    free(s->g);
    memset(s, 0, sizeof *s);
}

#include "shard.h"

#include <stdlib.h>
#include <string.h>

/* torch.chunk: ceil-sized chunks, the last ones short or empty */
static void chunk(int64_t n, int parts, int i, int64_t *lo, int64_t *len)
{
    const int64_t c = (n + parts - 1) / parts;
    *lo = c * i < n ? c * i : n;
    *len = *lo + c < n ? c : n - *lo;
}

/* The slice dense rank r holds of tensor t, along dim 0 (rows, or experts of a stack): the
 * first index (global, and relative to r's EP stack for experts) and the length. */
static void slice_of(const struct moe_tensor *t, int r, const shardopt_stats_t *st, int64_t *first,
                     int64_t *rel, int64_t *n)
{
    if (t->kind == MOE_EXPERT) { /* EP rank r % ep, expert shard member r / ep */
        const int64_t per = t->shape[0] / st->ep_size;
        chunk(per, st->expert_shard_size, r / st->ep_size, rel, n);
        *first = (r % st->ep_size) * per + *rel;
    } else {
        chunk(t->shape[0], st->dense_size, r, rel, n);
        *first = *rel;
    }
}

shardopt_status_t moe_shards_register(shardopt_runtime_t rt, const struct moe_model *m,
                                      struct moe_shards *s)
{
    shardopt_stats_t st = SHARDOPT_STATS_INIT;
    shardopt_status_t status = shardopt_get_stats(rt, &st);
    if (status != SHARDOPT_OK)
        return status;
    memset(s, 0, sizeof *s);
    s->dense = s->replicate = MPI_COMM_NULL;
    s->dense_size = st.dense_size;
    s->dense_rank = st.dense_rank;
    s->dp_replicate = st.dp_replicate;
    /* the runtime's rank order: replica-major, dense rank within (docs/layouts.md) */
    MPI_Comm_split(MPI_COMM_WORLD, st.replica, st.dense_rank, &s->dense);
    MPI_Comm_split(MPI_COMM_WORLD, st.dense_rank, st.replica, &s->replicate);
    if (st.ep_rank != st.dense_rank % st.ep_size ||
        st.expert_shard_rank != st.dense_rank / st.ep_size)
        return SHARDOPT_ERR_INVALID_ARGUMENT; /* not the layout this example assumes */

    const int D = s->dense_size;
    s->lo = calloc((size_t)D, sizeof *s->lo);
    s->len = calloc((size_t)D, sizeof *s->len);
    s->counts = calloc((size_t)D, sizeof(int));
    s->displs = calloc((size_t)D, sizeof(int));
    if (!s->lo || !s->len || !s->counts || !s->displs)
        return SHARDOPT_ERR_OUT_OF_MEMORY;
    int64_t total = 0;
    for (int r = 0; r < D; r++) {
        int64_t c = 0;
        for (int i = 0; i < MOE_NPARAMS; i++) {
            const struct moe_tensor *t = &m->p[i];
            int64_t first, rel, n;
            if (t->kind == MOE_REPLICATED)
                continue;
            slice_of(t, r, &st, &first, &rel, &n);
            const int64_t row = t->numel / t->shape[0];
            s->lo[r][i] = first * row;
            s->len[r][i] = n * row;
            c += n * row;
        }
        s->counts[r] = (int)c;
        s->displs[r] = (int)total;
        total += c;
    }
    s->pack = malloc(sizeof(float) * (size_t)(total + 1));
    s->mine = malloc(sizeof(float) * (size_t)(s->counts[s->dense_rank] + 1));
    if (s->pack == NULL || s->mine == NULL)
        return SHARDOPT_ERR_OUT_OF_MEMORY;

    for (int i = 0; i < MOE_NPARAMS; i++) {
        const struct moe_tensor *t = &m->p[i];
        shardopt_param_desc_t d = SHARDOPT_PARAM_DESC_INIT;
        int64_t first = 0, rel = 0, n = t->shape[0];
        if (t->kind != MOE_REPLICATED)
            slice_of(t, s->dense_rank, &st, &first, &rel, &n);
        const int64_t numel = t->kind == MOE_REPLICATED ? t->numel : s->len[s->dense_rank][i];
        const int64_t lo = t->kind == MOE_REPLICATED ? 0 : s->lo[s->dense_rank][i];
        s->w[i] = malloc(sizeof(float) * (size_t)(numel + 1));
        s->g[i] = calloc((size_t)(numel + 1), sizeof(float));
        if (s->w[i] == NULL || s->g[i] == NULL)
            return SHARDOPT_ERR_OUT_OF_MEMORY;
        memcpy(s->w[i], t->w + lo, sizeof(float) * (size_t)numel);
        d.name = t->name;
        d.ndim = t->ndim;
        memcpy(d.shape, t->shape, sizeof d.shape);
        d.placement = t->kind == MOE_EXPERT       ? SHARDOPT_PLACEMENT_EXPERT
                      : t->kind == MOE_REPLICATED ? SHARDOPT_PLACEMENT_REPLICATED
                                                  : SHARDOPT_PLACEMENT_DENSE;
        d.shard_dim = 0;
        d.shard_offset = t->kind == MOE_REPLICATED ? 0 : rel;
        d.shard_length = t->kind == MOE_REPLICATED ? -1 : n;
        d.data = s->w[i];
        d.grad = s->g[i];
        if ((status = shardopt_register(rt, &d, &s->h[i])) != SHARDOPT_OK)
            return status;
    }
    return SHARDOPT_OK;
}

void moe_shards_reduce_scatter(struct moe_shards *s, const struct moe_model *m)
{
    const int D = s->dense_size, me = s->dense_rank;
    for (int r = 0; r < D; r++) {
        float *p = s->pack + s->displs[r];
        for (int i = 0; i < MOE_NPARAMS; i++)
            if (m->p[i].kind != MOE_REPLICATED) {
                memcpy(p, m->p[i].g + s->lo[r][i], sizeof(float) * (size_t)s->len[r][i]);
                p += s->len[r][i];
            }
    }
    MPI_Reduce_scatter(s->pack, s->mine, s->counts, MPI_FLOAT, MPI_SUM, s->dense);
    if (s->dp_replicate > 1) /* HSDP: replicas hold the same slices and sum theirs too */
        MPI_Allreduce(MPI_IN_PLACE, s->mine, s->counts[me], MPI_FLOAT, MPI_SUM, s->replicate);
    const float *p = s->mine;
    for (int i = 0; i < MOE_NPARAMS; i++) {
        if (m->p[i].kind == MOE_REPLICATED) {
            MPI_Allreduce(m->p[i].g, s->g[i], (int)m->p[i].numel, MPI_FLOAT, MPI_SUM,
                          MPI_COMM_WORLD);
            continue;
        }
        memcpy(s->g[i], p, sizeof(float) * (size_t)s->len[me][i]);
        p += s->len[me][i];
    }
}

void moe_shards_all_gather(struct moe_shards *s, struct moe_model *m)
{
    const int D = s->dense_size, me = s->dense_rank;
    float *p = s->mine;
    for (int i = 0; i < MOE_NPARAMS; i++) {
        if (m->p[i].kind == MOE_REPLICATED) { /* updated alike on every rank */
            memcpy(m->p[i].w, s->w[i], sizeof(float) * (size_t)m->p[i].numel);
            continue;
        }
        memcpy(p, s->w[i], sizeof(float) * (size_t)s->len[me][i]);
        p += s->len[me][i];
    }
    MPI_Allgatherv(s->mine, s->counts[me], MPI_FLOAT, s->pack, s->counts, s->displs, MPI_FLOAT,
                   s->dense);
    for (int r = 0; r < D; r++) {
        const float *q = s->pack + s->displs[r];
        for (int i = 0; i < MOE_NPARAMS; i++)
            if (m->p[i].kind != MOE_REPLICATED) {
                memcpy(m->p[i].w + s->lo[r][i], q, sizeof(float) * (size_t)s->len[r][i]);
                q += s->len[r][i];
            }
    }
}

void moe_shards_free(struct moe_shards *s)
{
    for (int i = 0; i < MOE_NPARAMS; i++) {
        free(s->w[i]);
        free(s->g[i]);
    }
    free(s->lo);
    free(s->len);
    free(s->counts);
    free(s->displs);
    free(s->pack);
    free(s->mine);
    if (s->dense != MPI_COMM_NULL)
        MPI_Comm_free(&s->dense);
    if (s->replicate != MPI_COMM_NULL)
        MPI_Comm_free(&s->replicate);
    memset(s, 0, sizeof *s);
}

#include "layout.h"

shardopt_status_t layout_init(struct layout *l, int ndim, const int64_t shape[], int shard_dim,
                              int64_t shard_offset, int64_t shard_length, int64_t win_lo,
                              int64_t win_len)
{
    if (ndim < 1 || ndim > LAYOUT_MAX_DIMS)
        return status_set(SHARDOPT_ERR_INVALID_ARGUMENT, "ndim = %d: accepted 1, 2 or 3", ndim);
    l->ndim = ndim;
    l->global_numel = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] <= 0)
            return status_set(SHARDOPT_ERR_INVALID_ARGUMENT,
                              "shape[%d] = %lld: every global dim must be >= 1", d,
                              (long long)shape[d]);
        /* the byte size of the largest tensor must fit in int64 with room for 4-byte dtypes */
        if (l->global_numel > (INT64_MAX / 8) / shape[d])
            return status_set(SHARDOPT_ERR_INVALID_ARGUMENT,
                              "shape[%d] = %lld: tensor has 2^60 elements or more", d,
                              (long long)shape[d]);
        l->shape[d] = shape[d];
        l->global_numel *= shape[d];
    }
    for (int d = ndim; d < LAYOUT_MAX_DIMS; d++)
        l->shape[d] = 1;
    if (shard_dim < 0 || shard_dim >= ndim)
        return status_set(SHARDOPT_ERR_INVALID_ARGUMENT, "shard_dim = %d: accepted 0..%d",
                          shard_dim, ndim - 1);
    if (win_lo < 0 || win_len < 0 || win_lo + win_len > shape[0])
        return status_set(SHARDOPT_ERR_INVALID_ARGUMENT,
                          "dim-0 window [%lld, %lld) is outside the global dim of %lld",
                          (long long)win_lo, (long long)(win_lo + win_len), (long long)shape[0]);
    const int64_t extent = shard_dim == 0 ? win_len : shape[shard_dim];
    /* -1 is the one negative length with a meaning: any other is a caller's arithmetic gone
     * wrong, which "the rest of the dim" would have hidden */
    if (shard_length < -1)
        return status_set(SHARDOPT_ERR_INVALID_ARGUMENT,
                          "shard_length = %lld along dim %d: accepted -1 (the rest of the dim) "
                          "or a length in [0, %lld]",
                          (long long)shard_length, shard_dim, (long long)extent);
    /* the offset is checked before extent - offset is formed (INT64_MIN would overflow it) */
    if (shard_offset < 0 || shard_offset > extent)
        return status_set(SHARDOPT_ERR_INVALID_ARGUMENT,
                          "shard_offset = %lld along dim %d is outside [0, %lld]",
                          (long long)shard_offset, shard_dim, (long long)extent);
    if (shard_length < 0)
        shard_length = extent - shard_offset;
    /* the end printed as unsigned: offset + length may pass INT64_MAX */
    if (shard_length > extent - shard_offset)
        return status_set(SHARDOPT_ERR_INVALID_ARGUMENT,
                          "shard [%lld, %llu) along dim %d is outside [0, %lld)",
                          (long long)shard_offset,
                          (unsigned long long)shard_offset + (unsigned long long)shard_length,
                          shard_dim, (long long)extent);
    l->shard_dim = shard_dim;
    l->win_lo = win_lo;
    l->win_len = win_len;
    l->shard_offset = shard_offset;
    l->shard_length = shard_length;
    l->local_numel = 1;
    for (int d = 0; d < LAYOUT_MAX_DIMS; d++) {
        l->lo[d] = 0;
        l->len[d] = l->shape[d];
    }
    l->lo[0] = win_lo;
    l->len[0] = win_len;
    l->lo[shard_dim] += shard_offset;
    l->len[shard_dim] = shard_length;
    for (int d = 0; d < ndim; d++)
        l->local_numel *= l->len[d];
    return SHARDOPT_OK;
}

void layout_index_runs(const struct layout *l, uint64_t *base, uint64_t *run, uint64_t *stride)
{
    uint64_t inner = 1, gstride[LAYOUT_MAX_DIMS];
    for (int d = l->ndim - 1; d >= 0; d--) {
        gstride[d] = inner;
        inner *= (uint64_t)l->shape[d];
    }
    *base = 0;
    for (int d = 0; d < l->ndim; d++)
        *base += (uint64_t)l->lo[d] * gstride[d];
    const int sd = l->shard_dim;
    *run = (uint64_t)l->len[sd] * gstride[sd];
    /* runs follow each other at the stride of the dim above the shard: when that is dim 0's
     * window (or nothing), the runs are whole rows of the dim above */
    *stride = sd == 0 ? *run : (uint64_t)l->shape[sd] * gstride[sd];
    if (*run == 0)
        *run = 1; /* empty shard: no element is ever mapped; keep the division defined */
}

void layout_tile_range(const struct layout *l, int64_t *lo, int64_t *n)
{
    *lo = l->shard_dim == 0 ? l->win_lo : 0;
    *n = l->shard_dim == 0 ? l->win_len : l->shape[l->shard_dim];
}

void layout_matrix_view(const struct layout *l, int transposed, struct matrix_view *mv)
{
    mv->batch = l->ndim == 3 ? l->shape[0] : 1;
    mv->rows = l->shape[l->ndim - 2];
    mv->cols = l->shape[l->ndim - 1];
    mv->true_rows = transposed ? mv->cols : mv->rows;
    mv->true_cols = transposed ? mv->rows : mv->cols;
    /* work on the wide orientation; for a square matrix on its true orientation */
    mv->ns_transpose = mv->rows != mv->cols ? mv->rows > mv->cols : transposed != 0;
}

#include "layout.h"

#include <stdio.h>

int layout_init(struct layout *l, int ndim, const int64_t shape[], int shard_dim,
                int64_t shard_offset, int64_t shard_length, char *err, size_t errlen)
{
    if (ndim < 1 || ndim > LAYOUT_MAX_DIMS) {
        snprintf(err, errlen, "ndim = %d: accepted 1, 2 or 3", ndim);
        return -1;
    }
    l->ndim = ndim;
    l->global_numel = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] <= 0) {
            snprintf(err, errlen, "shape[%d] = %lld: every global dim must be >= 1", d,
                     (long long)shape[d]);
            return -1;
        }
        /* the byte size of the largest tensor must fit in int64 with room for 4-byte dtypes */
        if (l->global_numel > (INT64_MAX / 8) / shape[d]) {
            snprintf(err, errlen, "shape[%d] = %lld: tensor has more than 2^60 elements", d,
                     (long long)shape[d]);
            return -1;
        }
        l->shape[d] = shape[d];
        l->global_numel *= shape[d];
    }
    if (shard_dim < 0 || shard_dim >= ndim) {
        snprintf(err, errlen, "shard_dim = %d: accepted 0..%d", shard_dim, ndim - 1);
        return -1;
    }
    if (shard_length < 0)
        shard_length = shape[shard_dim] - shard_offset;
    if (shard_offset < 0 || shard_offset > shape[shard_dim] || shard_length < 0 ||
        shard_length > shape[shard_dim] - shard_offset) {
        snprintf(err, errlen, "shard [%lld, %lld) along dim %d is outside the global dim of %lld",
                 (long long)shard_offset, (long long)(shard_offset + shard_length), shard_dim,
                 (long long)shape[shard_dim]);
        return -1;
    }
    l->shard_dim = shard_dim;
    l->shard_offset = shard_offset;
    l->shard_length = shard_length;
    l->local_numel = 1;
    for (int d = 0; d < ndim; d++) {
        l->local_shape[d] = d == shard_dim ? shard_length : shape[d];
        l->local_numel *= l->local_shape[d];
    }
    for (int d = ndim; d < LAYOUT_MAX_DIMS; d++)
        l->shape[d] = l->local_shape[d] = 1;
    return 0;
}

void layout_index_runs(const struct layout *l, uint64_t *base, uint64_t *run, uint64_t *stride)
{
    uint64_t inner = 1;
    for (int d = l->shard_dim + 1; d < l->ndim; d++)
        inner *= (uint64_t)l->shape[d];
    *base = (uint64_t)l->shard_offset * inner;
    *run = (uint64_t)l->shard_length * inner;
    *stride = (uint64_t)l->shape[l->shard_dim] * inner;
    if (*run == 0)
        *run = 1; /* empty shard: no element is ever mapped; keep the division defined */
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

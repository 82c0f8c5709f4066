/* What a rank holds of a parameter: pure geometry, no MPI, no I/O. */
#ifndef SHARDING_LAYOUT_H
#define SHARDING_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

#define LAYOUT_MAX_DIMS 3

/* The local shard is a box of the global tensor: [lo[d], lo[d] + len[d]) per dim. At most two
 * dims are restricted: dim 0 by a window (the experts of this rank's EP group) and shard_dim by
 * the shard; every dim between them is whole, so the local elements are runs of equal length at
 * a constant global stride. */
struct layout {
    int ndim;
    int64_t shape[LAYOUT_MAX_DIMS]; /* global, as stored */
    int shard_dim;
    int64_t win_lo, win_len; /* dim-0 window the shard is relative to */
    int64_t shard_offset;    /* relative to the window when shard_dim is 0 */
    int64_t shard_length;
    int64_t lo[LAYOUT_MAX_DIMS], len[LAYOUT_MAX_DIMS]; /* the box, global coordinates */
    int64_t local_numel;
    int64_t global_numel;
};

/* A Muon parameter seen as a batch of matrices: 2-D [rows, cols] is a batch of one, a 3-D
 * [E, rows, cols] expert stack a batch of E. true_* is the [out, in] shape (swapped when the
 * tensor is stored transposed). ns_transpose: Newton-Schulz works on the stored matrix's
 * transpose, so that the working matrix is wide and a transposed square matrix is seen as it
 * truly is. */
struct matrix_view {
    int64_t batch, rows, cols;
    int64_t true_rows, true_cols;
    int ns_transpose;
};

/* Fill l from a shard description. The shard [shard_offset, + shard_length) along shard_dim is
 * taken inside the dim-0 window [win_lo, win_lo + win_len) (pass 0 and shape[0] for none);
 * shard_length < 0 means the rest of the dim. Returns SHARDOPT_OK, or
 * SHARDOPT_ERR_INVALID_ARGUMENT with a message (naming the field and value) recorded as the last
 * error (status_set: the caller adds the parameter's name and logs it). */
shardopt_status_t layout_init(struct layout *l, int ndim, const int64_t shape[], int shard_dim,
                              int64_t shard_offset, int64_t shard_length, int64_t win_lo,
                              int64_t win_len);

/* Global flat index of local element i = base + (i / run) * stride + i % run. */
void layout_index_runs(const struct layout *l, uint64_t *base, uint64_t *run, uint64_t *stride);

/* The extent the shards of a group tile along shard_dim: [lo, lo + n). */
void layout_tile_range(const struct layout *l, int64_t *lo, int64_t *n);

/* Piece i of n split over `parts` as torch.chunk splits it (FSDP2's Shard(dim)): ceil-sized
 * pieces in order, the last ones short or empty; [*lo, *lo + *len) relative to the extent's
 * start. What shardopt_shard_range hands a trainer, and so what commit computes instead of
 * gathering when every member of a group registered it (sharding/shard_table.h). */
static inline void layout_chunk(int64_t n, int parts, int i, int64_t *lo, int64_t *len)
{
    const int64_t c = (n + parts - 1) / parts;
    *lo = c * i < n ? c * i : n;
    *len = *lo + c < n ? c : n - *lo;
}

/* The matrix view of a 2-D or 3-D global shape. */
void layout_matrix_view(const struct layout *l, int transposed, struct matrix_view *mv);

#endif

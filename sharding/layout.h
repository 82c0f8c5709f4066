/* What a rank holds of a parameter: pure geometry, no MPI, no I/O. */
#ifndef SHARDING_LAYOUT_H
#define SHARDING_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#define LAYOUT_MAX_DIMS 3

struct layout {
    int ndim;
    int64_t shape[LAYOUT_MAX_DIMS]; /* global, as stored */
    int shard_dim;
    int64_t shard_offset;
    int64_t shard_length;
    int64_t local_shape[LAYOUT_MAX_DIMS]; /* shape with shard_dim replaced by shard_length */
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

/* Fill l from a shard description. shard_length < 0 means the whole dim. Returns 0, or -1 with
 * a message (naming the field and value) in err. */
int layout_init(struct layout *l, int ndim, const int64_t shape[], int shard_dim,
                int64_t shard_offset, int64_t shard_length, char *err, size_t errlen);

/* Global flat index of local element i = base + (i / run) * stride + i % run. */
void layout_index_runs(const struct layout *l, uint64_t *base, uint64_t *run, uint64_t *stride);

/* The matrix view of a 2-D or 3-D global shape. */
void layout_matrix_view(const struct layout *l, int transposed, struct matrix_view *mv);

#endif

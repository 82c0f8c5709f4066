/* Which entries of a *_many call go into one launch of the batched elementwise kernels
 * (elementwise.cu's launch_many), in plain C so that test_ew_batch_take checks it without a
 * GPU. A launch takes up to `max` entries; empty ones (n = 0) are skipped without ending it. */
#ifndef KERNELS_CUDA_EW_BATCH_TAKE_H
#define KERNELS_CUDA_EW_BATCH_TAKE_H

#include <stddef.h>

/* From entry *j on, the indices of the next up to `max` non-empty entries into take[]; *j is
 * left just past the last entry taken, where the next launch starts. `first_n` points at entry
 * 0's `n` (the first member of every *_args struct), `stride` is the struct's size. Returns how
 * many were taken. (A launch that restarted at j0 + max instead applied the entries between
 * there and *j twice whenever it had skipped empty ones.) */
static inline int ew_batch_take(const size_t *first_n, size_t stride, int count, int *j, int max,
                                int *take)
{
    int k = 0;
    for (; *j < count && k < max; (*j)++)
        if (*(const size_t *)((const char *)first_n + (size_t)*j * stride) > 0)
            take[k++] = *j;
    return k;
}

#endif

/* Resharding geometry for checkpoint loads: the part of a saved shard a rank needs, as runs of
 * elements contiguous in both the saved shard and the rank's own shard. Pure: boxes in, runs out.
 * Tensors of 1 or 2 dims are given as 3-D with leading dims of 1. */
#ifndef SHARDING_RESHARD_H
#define SHARDING_RESHARD_H

#include <stdint.h>

#include "plan.h"

/* a and b overlap in out; returns 0 when they do not (out undefined). */
int reshard_intersect(const struct plan_box *a, const struct plan_box *b, struct plan_box *out);

/* Runs of the intersection of `src` (a saved shard) and `dst` (this rank's shard), in increasing
 * source order. Each run is `len` elements at element `src_off` of the source shard (row-major
 * in its box) and `dst_off` of the destination shard. */
struct reshard_runs {
    struct plan_box src, dst, in;
    int64_t run;      /* elements per run */
    int64_t outer[2]; /* run index space: outer[0] x outer[1] runs */
    int64_t next;
    int merged; /* dims merged into a run: 1, 2 or 3 */
};

/* Returns 0 when src and dst do not overlap (no runs). */
int reshard_runs_init(struct reshard_runs *r, const struct plan_box *src,
                      const struct plan_box *dst);

/* The next run; returns 0 when there are no more. */
int reshard_runs_next(struct reshard_runs *r, int64_t *src_off, int64_t *dst_off, int64_t *len);

#endif

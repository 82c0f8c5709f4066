/* What each member of a group holds of each parameter along its shard dim: commit's view of the
 * group (runtime/commit_check.c builds it, collectively) and what the planner reads (plan_param).
 *
 * A member's box differs from this rank's along the shard dim only (sharding/layout.c), so a
 * member's part is one slice. Where every member of the group registered the torch.chunk piece
 * of its index (layout_chunk: what shardopt_shard_range gives), the layout determines every
 * member's slice and the table stores nothing for that parameter: the slice is computed when
 * asked. Only the other parameters get a gathered column of [members] slices. On a regular layout
 * a rank therefore holds O(parameters + members), not O(parameters x members) (issue 22;
 * docs/scaling.md). Pure data: no MPI. */
#ifndef SHARDING_SHARD_TABLE_H
#define SHARDING_SHARD_TABLE_H

#include <stddef.h>

#include "layout.h"
#include "plan.h"

struct shard_table {
    int members, me, nparams;
    int *col; /* [nparams]: -1, the torch.chunk piece of each member (computed); else the
                 parameter's column in slices. NULL: every parameter computed */
    int ncols;
    struct plan_slice *slices; /* [members][ncols]: member m's slice of column c at m * ncols + c,
                                  filled by the caller (commit's all-gather) */
    int *ranks;                /* [members]: each member's global rank (for messages), filled by
                                  the caller */
    double *xload;             /* [members] or NULL: each member's NS load in the other group */
};

/* 1 when l's slice along its shard dim is the torch.chunk piece `me` of `members` of the extent
 * its group tiles (layout_tile_range), 0 when not. */
int shard_table_is_chunk(const struct layout *l, int members, int me);

/* Set t up for a group of `members` (this rank is member `me`) and nparams parameters: those
 * with chunk[i] = 0 get a column in t->slices, left for the caller to fill, as is ranks; the
 * others are computed. chunk[] must be the same on every member (commit agrees it). xload is left
 * NULL. Returns 0, or -1 out of memory with *bytes the request that failed (t then holds nothing
 * to free). */
int shard_table_init(struct shard_table *t, int members, int me, int nparams,
                     const unsigned char *chunk, size_t *bytes);

/* Member m's slice of parameter i, whose layout on this rank is l (global coordinates). */
struct plan_slice shard_table_slice(const struct shard_table *t, int i, const struct layout *l,
                                    int m);

/* The planner's view of parameter i (layout l on this rank): ndim, shape, the matrices it
 * orthogonalizes (an expert stack's window), and every member's box: *tmpl (this rank's box)
 * but along the shard dim, where the slice is read from its column in place or computed. param,
 * ns_gram, ns_restarts and ns_transpose are the caller's. */
void shard_table_plan_param(const struct shard_table *t, int i, const struct layout *l,
                            struct plan_box *tmpl, struct plan_param *pp);

/* Frees col, slices, ranks and xload. */
void shard_table_free(struct shard_table *t);

#endif

/* What sharding/plan.c (the exchange) and sharding/plan_owners.c (who orthogonalizes each
 * matrix) share inside the planner: a matrix of the group and a member's piece of it. */
#ifndef SHARDING_PLAN_MAT_H
#define SHARDING_PLAN_MAT_H

#include <stddef.h>
#include <stdint.h>

#include "layout.h"
#include "plan.h"

/* One matrix of the group, in matrix order. */
struct mat {
    const struct plan_param *p;
    int64_t k, rows, cols;
    double cost;
};

/* Member `i`'s rectangle of matrix `m`; returns its element count (0: holds none of it). */
static inline int64_t plan_piece_of(const struct mat *m, int i, int64_t *r0, int64_t *r1,
                                    int64_t *c0, int64_t *c1, int64_t *local_off)
{
    const size_t at = (size_t)i * (m->p->box_stride > 1 ? m->p->box_stride : 1);
    struct plan_box sliced;
    const struct plan_box *b = &sliced;
    if (m->p->boxes != NULL) {
        b = &m->p->boxes[at];
    } else {
        sliced = *m->p->tmpl;
        if (m->p->slices != NULL) {
            sliced.lo[m->p->slice_dim] = m->p->slices[at].lo;
            sliced.len[m->p->slice_dim] = m->p->slices[at].len;
        } else { /* the layout determines it: computed, not gathered */
            layout_chunk(m->p->tile_len, m->p->parts, i, &sliced.lo[m->p->slice_dim],
                         &sliced.len[m->p->slice_dim]);
            sliced.lo[m->p->slice_dim] += m->p->tile_lo;
        }
    }
    int rd = m->p->ndim - 2; /* the row dim */

    if (m->p->ndim == 3 && (m->k < b->lo[0] || m->k >= b->lo[0] + b->len[0]))
        return 0;
    *r0 = b->lo[rd];
    *r1 = b->lo[rd] + b->len[rd];
    *c0 = b->lo[rd + 1];
    *c1 = b->lo[rd + 1] + b->len[rd + 1];
    *local_off = m->p->ndim == 3 ? (m->k - b->lo[0]) * b->len[1] * b->len[2] : 0;
    return (*r1 - *r0) * (*c1 - *c0);
}

static inline int64_t plan_piece_count(const struct mat *m, int i)
{
    int64_t r0, r1, c0, c1, off;
    return plan_piece_of(m, i, &r0, &r1, &c0, &c1, &off);
}

/* Owners (and planned teams) of the group's n matrices into P (owner, load, work): returns 0,
 * -1 when out of memory. */
int plan_owners_assign(const struct plan_cfg *cfg, const struct mat *mats, int n,
                       struct group_plan *P);

#endif

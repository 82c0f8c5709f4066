#include "shard_table.h"

#include <stdlib.h>
#include <string.h>

#include "base/mem.h"

int shard_table_is_chunk(const struct layout *l, int members, int me)
{
    int64_t lo, n, c_lo, c_len;
    layout_tile_range(l, &lo, &n);
    layout_chunk(n, members, me, &c_lo, &c_len);
    return l->lo[l->shard_dim] == lo + c_lo && l->len[l->shard_dim] == c_len;
}

int shard_table_init(struct shard_table *t, int members, int me, int nparams,
                     const unsigned char *chunk, size_t *bytes)
{
    memset(t, 0, sizeof *t);
    t->members = members;
    t->me = me;
    t->nparams = nparams;
    *bytes = sizeof(int) * (size_t)(nparams ? nparams : 1);
    t->col = mem_malloc(*bytes);
    if (t->col == NULL)
        return -1;
    for (int i = 0; i < nparams; i++)
        t->col[i] = chunk[i] ? -1 : t->ncols++;
    *bytes = sizeof(int) * (size_t)members;
    t->ranks = mem_malloc(*bytes);
    if (t->ranks != NULL && t->ncols > 0) {
        *bytes = sizeof(struct plan_slice) * (size_t)members * (size_t)t->ncols;
        t->slices = mem_malloc(*bytes);
    }
    if (t->ranks == NULL || (t->ncols > 0 && t->slices == NULL)) {
        shard_table_free(t);
        return -1;
    }
    return 0;
}

struct plan_slice shard_table_slice(const struct shard_table *t, int i, const struct layout *l,
                                    int m)
{
    if (t->col != NULL && t->col[i] >= 0)
        return t->slices[(size_t)m * (size_t)t->ncols + (size_t)t->col[i]];
    int64_t lo, n;
    struct plan_slice s;
    layout_tile_range(l, &lo, &n);
    layout_chunk(n, t->members, m, &s.lo, &s.len);
    s.lo += lo;
    return s;
}

void shard_table_plan_param(const struct shard_table *t, int i, const struct layout *l,
                            struct plan_box *tmpl, struct plan_param *pp)
{
    memcpy(tmpl->lo, l->lo, sizeof tmpl->lo);
    memcpy(tmpl->len, l->len, sizeof tmpl->len);
    pp->ndim = l->ndim;
    memcpy(pp->shape, l->shape, sizeof pp->shape);
    /* an expert group orthogonalizes its EP rank's experts; a dense stack all of them */
    pp->k_lo = l->ndim == 3 ? l->win_lo : 0;
    pp->k_count = l->ndim == 3 ? l->win_len : 1;
    pp->boxes = NULL;
    pp->tmpl = tmpl;
    pp->slice_dim = l->shard_dim;
    if (t->col != NULL && t->col[i] >= 0) {
        pp->slices = &t->slices[t->col[i]]; /* member m's at m * ncols */
        pp->box_stride = (size_t)t->ncols;
    } else {
        pp->slices = NULL;
        layout_tile_range(l, &pp->tile_lo, &pp->tile_len);
        pp->parts = t->members;
    }
}

void shard_table_free(struct shard_table *t)
{
    free(t->col);
    free(t->slices);
    free(t->ranks);
    free(t->xload);
    t->col = NULL;
    t->slices = NULL;
    t->ranks = NULL;
    t->xload = NULL;
}

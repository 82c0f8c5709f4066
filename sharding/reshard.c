#include "reshard.h"

int reshard_intersect(const struct plan_box *a, const struct plan_box *b, struct plan_box *out)
{
    for (int d = 0; d < 3; d++) {
        int64_t lo = a->lo[d] > b->lo[d] ? a->lo[d] : b->lo[d];
        int64_t ha = a->lo[d] + a->len[d], hb = b->lo[d] + b->len[d];
        int64_t hi = ha < hb ? ha : hb;
        if (hi <= lo)
            return 0;
        out->lo[d] = lo;
        out->len[d] = hi - lo;
    }
    return 1;
}

/* Element offset of global coordinates c inside box b, row-major. */
static int64_t box_offset(const struct plan_box *b, const int64_t c[3])
{
    return ((c[0] - b->lo[0]) * b->len[1] + (c[1] - b->lo[1])) * b->len[2] + (c[2] - b->lo[2]);
}

int reshard_runs_init(struct reshard_runs *r, const struct plan_box *src,
                      const struct plan_box *dst)
{
    r->src = *src;
    r->dst = *dst;
    r->next = 0;
    if (!reshard_intersect(src, dst, &r->in))
        return 0;
    /* a run grows over inner dims the intersection covers whole in both boxes */
    r->run = r->in.len[2];
    r->merged = 1;
    if (r->in.len[2] == src->len[2] && r->in.len[2] == dst->len[2]) {
        r->run *= r->in.len[1];
        r->merged = 2;
        if (r->in.len[1] == src->len[1] && r->in.len[1] == dst->len[1]) {
            r->run *= r->in.len[0];
            r->merged = 3;
        }
    }
    r->outer[0] = r->merged >= 3 ? 1 : r->in.len[0];
    r->outer[1] = r->merged >= 2 ? 1 : r->in.len[1];
    return 1;
}

int reshard_runs_next(struct reshard_runs *r, int64_t *src_off, int64_t *dst_off, int64_t *len)
{
    if (r->next >= r->outer[0] * r->outer[1])
        return 0;
    int64_t c[3] = {r->in.lo[0] + r->next / r->outer[1], r->in.lo[1] + r->next % r->outer[1],
                    r->in.lo[2]};
    if (r->merged >= 2)
        c[1] = r->in.lo[1];
    if (r->merged >= 3)
        c[0] = r->in.lo[0];
    *src_off = box_offset(&r->src, c);
    *dst_off = box_offset(&r->dst, c);
    *len = r->run;
    r->next++;
    return 1;
}

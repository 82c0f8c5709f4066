/* Phase clocks (timeline.h). */
#include "timeline.h"

#include <stdlib.h>

#include "base/mem.h"
#include "clock.h"

void timeline_init(struct timeline *tl, const struct device_ops *dev, const struct kernel_ctx *ctx)
{
    *tl = (struct timeline){.dev = dev, .ctx = ctx};
}

void timeline_free(struct timeline *tl)
{
    free(tl->span);
    tl->span = NULL;
    tl->nspan = tl->cap = 0;
}

int timeline_on_device(const struct timeline *tl) { return device_has(tl->dev, DEVICE_CAP_MARKS); }

void timeline_begin(struct timeline *tl)
{
    tl->nspan = 0;
    tl->marks = 0;
    tl->dropped = 0;
    tl->active = 1;
}

void timeline_end(struct timeline *tl) { tl->active = 0; }

/* The next mark, queued on lane now; -1 when none is left or queuing failed. */
static int mark_now(struct timeline *tl, int lane)
{
    if (tl->marks >= KERNEL_MAX_MARKS || tl->dev->mark(tl->ctx, lane, tl->marks) != 0)
        return -1;
    return tl->marks++;
}

void timeline_start(struct timeline *tl, struct tl_clock *c, int lane)
{
    c->lane = lane;
    c->mark = -1;
    c->t = 0;
    if (!timeline_on_device(tl))
        c->t = monotonic_seconds();
    else if (tl->active)
        c->mark = mark_now(tl, lane);
}

void timeline_lap(struct timeline *tl, struct tl_clock *c, double *counter)
{
    if (!timeline_on_device(tl)) {
        const double now = monotonic_seconds();
        *counter += now - c->t;
        c->t = now;
        return;
    }
    if (!tl->active)
        return;
    const int m = mark_now(tl, c->lane);
    if (m < 0 || c->mark < 0) {
        tl->dropped++;
        c->mark = m;
        return;
    }
    if (tl->nspan == tl->cap) {
        const int cap = tl->cap ? 2 * tl->cap : 64;
        struct tl_span *s = mem_realloc(tl->span, sizeof *s * (size_t)cap);
        if (s == NULL) { /* the interval is lost, the step is not */
            tl->dropped++;
            c->mark = m;
            return;
        }
        tl->span = s;
        tl->cap = cap;
    }
    tl->span[tl->nspan++] = (struct tl_span){c->mark, m, counter};
    c->mark = m;
}

int timeline_pending(const struct timeline *tl) { return tl->nspan > 0; }

int timeline_ready(const struct timeline *tl)
{
    if (tl->nspan == 0 || !timeline_on_device(tl))
        return 1;
    /* a span's end comes after its start on the same lane: the ends are enough */
    for (int i = 0; i < tl->nspan; i++)
        if (tl->dev->mark_done(tl->ctx, tl->span[i].to) == 0)
            return 0;
    return 1;
}

int timeline_resolve(struct timeline *tl)
{
    int rc = 0;
    for (int i = 0; i < tl->nspan; i++) {
        const double s = tl->dev->mark_seconds(tl->ctx, tl->span[i].from, tl->span[i].to);
        if (s == s)
            *tl->span[i].counter += s;
        else
            rc = -1;
    }
    tl->nspan = 0;
    return rc;
}

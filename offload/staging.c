#include "staging.h"

#include <stdint.h>
#include <string.h>

#include "base/mem.h"
#include "base/status.h"
#include "kernels/clock.h"

/* Where a chunk's second segment starts in its slot. It cannot overflow: staging_chunk_elems
 * sizes a chunk to fit a slot with STAGING_ALIGN bytes to spare, so bytes[0] is at most
 * slot_bytes - STAGING_ALIGN, an allocated size. */
static size_t seg1_offset(const struct stream_chunk *c)
{
    size_t off = SIZE_MAX;
    (void)mem_align_up(c->bytes[0], STAGING_ALIGN, &off);
    return off;
}

shardopt_status_t staging_init(struct staging *s, const struct device_ops *dev,
                               const struct kernel_ctx *ctx, size_t slot_bytes, int poison)
{
    memset(s, 0, sizeof *s);
    s->dev = dev;
    s->ctx = ctx;
    s->slot_bytes = slot_bytes;
    s->poison = poison;
    for (int i = 0; i < STAGING_SLOTS && slot_bytes > 0; i++) {
        s->slot[i] = dev->alloc(slot_bytes);
        if (s->slot[i] == NULL)
            return status_set(SHARDOPT_ERR_OUT_OF_MEMORY,
                              "staging: out of memory allocating %zu bytes for slot %d (device %s)",
                              slot_bytes, i, dev->name);
        if (poison)
            dev->fill(ctx, s->slot[i], 0xff, slot_bytes);
    }
    return SHARDOPT_OK;
}

void staging_free(struct staging *s)
{
    for (int i = 0; i < STAGING_SLOTS; i++)
        if (s->dev != NULL && s->slot[i] != NULL)
            s->dev->free(s->slot[i]);
    memset(s->slot, 0, sizeof s->slot);
}

size_t staging_chunk_elems(const struct staging *s, size_t es0, size_t es1)
{
    /* seg 1 starts at the 64-byte boundary after seg 0: at most 63 bytes of padding */
    const size_t room = s->slot_bytes > STAGING_ALIGN ? s->slot_bytes - STAGING_ALIGN : 0;
    return room / (es0 + es1);
}

/* Copy lanes: a device table's copy streams, when it has them. Poisoning (a debug mode) fills
 * slots on the compute stream, so it keeps every copy there too. */
enum { LANE_COMPUTE = 0, LANE_IN = 1, LANE_OUT = 2, TAG_JOIN = STAGING_SLOTS };

static int lanes(const struct staging *s)
{
    return device_has(s->dev, DEVICE_CAP_COPY_LANES) && !s->poison;
}

/* Device timing: the copy lanes' work and the compute stream's waits on them, timed on the
 * device (kernels/timeline.h); host clocks would only time the queuing. */
static int dev_timed(const struct staging *s)
{
    return lanes(s) && s->tl != NULL && timeline_on_device(s->tl);
}

static void copy_timed(struct staging *s, int lane, void *dst, const void *src, size_t bytes)
{
    if (lane != LANE_COMPUTE && dev_timed(s)) {
        struct tl_clock c;
        timeline_start(s->tl, &c, lane);
        s->dev->copy_on(s->ctx, lane, dst, src, bytes);
        timeline_lap(s->tl, &c, &s->seconds_copy_busy);
        return;
    }
    double t = monotonic_seconds();
    if (lanes(s))
        s->dev->copy_on(s->ctx, lane, dst, src, bytes);
    else
        s->dev->copy(s->ctx, dst, src, bytes);
    s->seconds_copy += monotonic_seconds() - t;
}

/* Event (lane, tag) marks the work queued on lane so far. Each slot's events are recorded
 * right after the slot's copy-in, kernel and copy-out are queued, and waited for by the next
 * stage of that slot only: a wait recorded at the waiter's turn would also cover what the
 * signaler was given in between (run(k) waiting for in(k+1), in(k+1) for out(k-1)). */
static void lane_record(struct staging *s, int lane, int tag)
{
    if (lanes(s))
        s->dev->lane_record(s->ctx, lane, tag);
}

/* waiter waits for event (signaler, tag) as last recorded */
static void lane_wait(struct staging *s, int waiter, int signaler, int tag)
{
    if (lanes(s))
        s->dev->lane_wait(s->ctx, waiter, signaler, tag);
}

/* The compute stream waits for a copy lane: with a device timeline, how long it stood still
 * is copy time exposed. */
static void compute_waits(struct staging *s, int signaler, int tag)
{
    if (!dev_timed(s)) {
        lane_wait(s, LANE_COMPUTE, signaler, tag);
        return;
    }
    struct tl_clock c;
    timeline_start(s->tl, &c, LANE_COMPUTE);
    lane_wait(s, LANE_COMPUTE, signaler, tag);
    timeline_lap(s->tl, &c, &s->seconds_copy);
}

static void slot_addrs(const struct staging *s, int i, const struct stream_chunk *c, void *dev[2])
{
    dev[0] = s->slot[i];
    dev[1] = c->nseg > 1 ? s->slot[i] + seg1_offset(c) : NULL;
}

static void chunk_in(struct staging *s, int i, const struct stream_chunk *c)
{
    void *dev[2];
    slot_addrs(s, i, c, dev);
    /* the slot's last contents have gone out (and with them the kernels that used it): in an
     * earlier round, or the previous call's */
    lane_wait(s, LANE_IN, LANE_OUT, i);
    for (int k = 0; k < c->nseg; k++) {
        copy_timed(s, LANE_IN, dev[k], c->host[k], c->bytes[k]);
        s->in[c->kind[k]] += c->bytes[k];
    }
    lane_record(s, LANE_IN, i);
    s->used[i] = c->nseg > 1 ? seg1_offset(c) + c->bytes[1] : c->bytes[0];
    size_t live = 0;
    for (int k = 0; k < STAGING_SLOTS; k++)
        live += s->used[k];
    s->peak = live > s->peak ? live : s->peak;
}

static void chunk_out(struct staging *s, int i, const struct stream_chunk *c)
{
    void *dev[2];
    slot_addrs(s, i, c, dev);
    lane_wait(s, LANE_OUT, LANE_COMPUTE, i); /* the chunk's kernel has run */
    for (int k = 0; k < c->nseg; k++) {
        copy_timed(s, LANE_OUT, c->host[k], dev[k], c->bytes[k]);
        s->out[c->kind[k]] += c->bytes[k];
    }
    lane_record(s, LANE_OUT, i);
    s->pending_out |= lanes(s);
    if (s->poison)
        s->dev->fill(s->ctx, s->slot[i], 0xff, s->used[i]);
    s->used[i] = 0;
}

void staging_stream(struct staging *s, stream_next_fn next, stream_run_fn run, void *arg)
{
    struct stream_chunk ring[STAGING_SLOTS]; /* by slot */
    /* The slots go round across calls: a call's first chunk takes the slot the last call's
     * copy-outs freed first. Restarting at slot 0 put a bucket's first chunks behind the
     * previous bucket's last copy-outs (the copy-in lane runs in order: a chunk waiting for
     * the newest copy-out holds up the ones queued after it). */
    const long base = s->next_slot;

    if (!next(arg, &ring[base]))
        return;
    chunk_in(s, (int)base, &ring[base]);
    for (long k = 0;; k++) {
        const int cur = (int)((base + k) % STAGING_SLOTS),
                  nxt = (int)((base + k + 1) % STAGING_SLOTS),
                  prv = (int)((base + k + 2) % STAGING_SLOTS);
        /* the slot of k+1 is the one k-2 left: its copy-out finished in the previous round */
        const int more = next(arg, &ring[nxt]);
        if (more)
            chunk_in(s, nxt, &ring[nxt]);
        if (k > 0)
            chunk_out(s, prv, &ring[prv]);
        void *dev[2];
        slot_addrs(s, cur, &ring[cur], dev);
        compute_waits(s, LANE_IN, cur); /* its state has arrived, and only its own */
        run(arg, &ring[cur], dev);
        lane_record(s, LANE_COMPUTE, cur);
        if (!more) {
            /* The last copy-out goes on while the compute stream moves on to the next bucket:
             * nothing there reads the host store, and the next call's copy-in into a slot
             * waits for that slot's copy-out. staging_join is the one wait, at the step's end */
            chunk_out(s, cur, &ring[cur]);
            s->next_slot = nxt;
            return;
        }
    }
}

void staging_join(struct staging *s)
{
    if (!s->pending_out)
        return;
    lane_record(s, LANE_OUT, TAG_JOIN);
    compute_waits(s, LANE_OUT, TAG_JOIN);
    s->pending_out = 0;
}

void staging_copy(struct staging *s, void *dst, const void *src, size_t bytes, int kind, int in)
{
    copy_timed(s, LANE_COMPUTE, dst, src, bytes);
    if (in)
        s->in[kind] += bytes;
    else
        s->out[kind] += bytes;
}

void staging_counts_reset(struct staging *s)
{
    memset(s->in, 0, sizeof s->in);
    memset(s->out, 0, sizeof s->out);
    s->peak = 0;
    s->seconds_copy = 0;
    s->seconds_copy_busy = 0;
}

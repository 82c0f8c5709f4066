/* Phase times measured where the work runs. A clock is a chain of laps on one lane (the compute
 * stream, or a copy lane): each lap adds the time since the previous one to a counter.
 *
 * On the CPU backend (a device table without DEVICE_CAP_MARKS) that is the host's clock, added at
 * once. On a device backend the host only queues work, so its clock says how long queuing took;
 * there a lap queues a timing mark on the lane instead, and the interval between two marks is the
 * time the lane spent on the work queued between them, its waits on other lanes included. The
 * intervals are added when timeline_resolve runs, after the marks have completed: the stats call,
 * so the step itself never waits for them. Only laps between timeline_begin and timeline_end
 * (one step) are timed on a device; a new step drops what was never resolved. */
#ifndef KERNELS_TIMELINE_H
#define KERNELS_TIMELINE_H

#include "device.h"

struct tl_span {
    int from, to; /* marks */
    double *counter;
};

struct timeline {
    const struct device_ops *dev;
    const struct kernel_ctx *ctx;
    struct tl_span *span;
    int nspan, cap;
    int marks;    /* queued this step */
    int active;   /* between timeline_begin and timeline_end */
    long dropped; /* laps not timed this step: marks or memory ran out, or a mark failed */
};

struct tl_clock {
    double t; /* host clock: the last start or lap */
    int mark; /* device: the last mark, -1 when none */
    int lane; /* device: where the marks go */
};

void timeline_init(struct timeline *tl, const struct device_ops *dev, const struct kernel_ctx *ctx);
void timeline_free(struct timeline *tl);

/* Whether laps queue marks (a device backend) rather than read the host clock. */
int timeline_on_device(const struct timeline *tl);

void timeline_begin(struct timeline *tl);
void timeline_end(struct timeline *tl);

/* A clock on lane (KERNEL_LANES: 0 the compute stream), starting now. */
void timeline_start(struct timeline *tl, struct tl_clock *c, int lane);

/* *counter += the time since the clock's start or last lap; the clock goes on from here. */
void timeline_lap(struct timeline *tl, struct tl_clock *c, double *counter);

/* Wait for the marks and add their intervals to the counters (nothing to do on the CPU).
 * 0, or -1 when a mark could not be read (those intervals are left out). */
int timeline_resolve(struct timeline *tl);

/* Whether intervals wait to be resolved (a device's last step, not yet read). */
int timeline_pending(const struct timeline *tl);

/* Without waiting: 1 when every pending interval's marks have happened, so that
 * timeline_resolve will not wait (also when nothing is pending); 0 when the device has not
 * reached them yet. A backend that cannot tell (mark_done -1) counts as ready: the resolve then
 * waits, as before there was a way to ask. */
int timeline_ready(const struct timeline *tl);

#endif

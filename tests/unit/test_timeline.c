/* kernels/timeline.h: on a device table without marks a lap adds host time at once; on one with
 * marks (a fake device whose mark i happens at time i seconds) laps become intervals added once, at
 * resolve, only between begin and end, and a new step drops what was never resolved; a mark
 * that fails or runs past KERNEL_MAX_MARKS loses its intervals (counted) and nothing else. */
#include <math.h>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/timeline.h"
#include "test.h"

static int fake_lane[KERNEL_MAX_MARKS], fake_fail_at = -1;
static long fake_marks;

static int fake_mark(const struct kernel_ctx *c, int lane, int id)
{
    (void)c;
    if (id == fake_fail_at)
        return -1;
    fake_lane[id] = lane;
    fake_marks++;
    return 0;
}

/* mark i "happened" at i seconds, lane 1 ten times slower */
static double fake_seconds(const struct kernel_ctx *c, int a, int b)
{
    (void)c;
    if (fake_lane[a] != fake_lane[b])
        return NAN;
    return (double)(b - a) * (fake_lane[a] == 1 ? 10.0 : 1.0);
}

/* a device that cannot tell whether a mark has happened: timeline_ready counts it as ready */
static int fake_cannot_tell(const struct kernel_ctx *c, int id)
{
    (void)c, (void)id;
    return -1;
}

static struct device_ops fake_ops(void)
{
    struct device_ops o = *device_ops_cpu();
    o.name = "fake";
    o.caps = DEVICE_CAP_MARKS;
    o.mark = fake_mark;
    o.mark_seconds = fake_seconds;
    o.mark_done = fake_cannot_tell;
    return o;
}

TEST(timeline_host_clock_adds_at_once)
{
    const struct device_ops *cpu = device_ops_cpu();
    struct kernel_ctx ctx = {0};
    struct timeline tl;
    struct tl_clock c;
    double a = 0, b = 0;
    timeline_init(&tl, cpu, &ctx);
    EXPECT_EQ_INT(timeline_on_device(&tl), 0);
    timeline_start(&tl, &c, 0); /* no begin needed: host laps always count */
    for (volatile int i = 0; i < 1000000; i++)
        ;
    timeline_lap(&tl, &c, &a);
    timeline_lap(&tl, &c, &b);
    EXPECT_TRUE(a > 0 && b >= 0);
    EXPECT_EQ_INT(timeline_resolve(&tl), 0);
    timeline_free(&tl);
}

TEST(timeline_device_marks_become_intervals_at_resolve)
{
    const struct device_ops ops = fake_ops();
    struct kernel_ctx ctx = {0};
    struct timeline tl;
    struct tl_clock c, copy;
    double x = 0, y = 0, z = 0;

    timeline_init(&tl, &ops, &ctx);
    EXPECT_EQ_INT(timeline_on_device(&tl), 1);
    timeline_start(&tl, &c, 0); /* before begin: nothing is marked */
    timeline_lap(&tl, &c, &x);
    EXPECT_EQ_INT((int)fake_marks, 0);

    timeline_begin(&tl);
    timeline_start(&tl, &c, 0);              /* mark 0 */
    timeline_lap(&tl, &c, &x);               /* mark 1: x += 1 */
    timeline_start(&tl, &copy, 1);           /* mark 2, lane 1 */
    timeline_lap(&tl, &copy, &z);            /* mark 3: z += 10 */
    timeline_lap(&tl, &c, &y);               /* mark 4: y += 3 (from mark 1) */
    timeline_lap(&tl, &c, &x);               /* mark 5: x += 1 */
    EXPECT_TRUE(x == 0 && y == 0 && z == 0); /* nothing read until resolve */
    EXPECT_EQ_INT(timeline_resolve(&tl), 0);
    EXPECT_TRUE(x == 2 && y == 3 && z == 10);
    EXPECT_EQ_INT(timeline_resolve(&tl), 0); /* twice: nothing added twice */
    EXPECT_TRUE(x == 2 && y == 3 && z == 10);

    timeline_begin(&tl); /* a new step: unresolved intervals of the last one are dropped */
    timeline_start(&tl, &c, 0);
    timeline_lap(&tl, &c, &x);
    timeline_begin(&tl);
    EXPECT_EQ_INT(timeline_resolve(&tl), 0);
    EXPECT_TRUE(x == 2);
    timeline_start(&tl, &c, 0);
    timeline_end(&tl); /* after the step: laps do nothing */
    timeline_lap(&tl, &c, &x);
    EXPECT_EQ_INT(timeline_resolve(&tl), 0);
    EXPECT_TRUE(x == 2);
    timeline_free(&tl);
}

TEST(timeline_failed_or_exhausted_marks_lose_their_intervals_only)
{
    const struct device_ops ops = fake_ops();
    struct kernel_ctx ctx = {0};
    struct timeline tl;
    struct tl_clock c;
    double x = 0;

    timeline_init(&tl, &ops, &ctx);
    timeline_begin(&tl);
    fake_fail_at = 1;
    timeline_start(&tl, &c, 0); /* mark 0 */
    timeline_lap(&tl, &c, &x);  /* mark 1 fails: dropped */
    fake_fail_at = -1;
    timeline_lap(&tl, &c,
                 &x); /* mark 1 (ids are used only when queued), nothing to start from: dropped */
    timeline_lap(&tl, &c, &x); /* mark 2: x += 1, from mark 1 */
    EXPECT_EQ_INT((int)tl.dropped, 2);
    EXPECT_EQ_INT(timeline_resolve(&tl), 0);
    EXPECT_TRUE(x == 1);

    timeline_begin(&tl);
    timeline_start(&tl, &c, 0);
    for (int i = 1; i < KERNEL_MAX_MARKS + 10; i++)
        timeline_lap(&tl, &c, &x);
    EXPECT_EQ_INT(tl.marks, KERNEL_MAX_MARKS);
    EXPECT_EQ_INT((int)tl.dropped, 10);
    x = 0;
    EXPECT_EQ_INT(timeline_resolve(&tl), 0);
    EXPECT_TRUE(x == KERNEL_MAX_MARKS - 1);
    timeline_free(&tl);
}

/* mark_done: marks below fake_done_below have happened */
static int fake_done_below;
static int fake_done(const struct kernel_ctx *c, int id)
{
    (void)c;
    return id < 0 ? -1 : id < fake_done_below;
}

/* timeline_ready asks the backend without waiting: ready only once every pending interval's end
 * mark has happened; nothing pending is ready; a backend that cannot tell (mark_done -1)
 * counts as ready, so that a resolve waits as it always did. */
TEST(timeline_ready_only_when_every_pending_mark_has_happened)
{
    struct device_ops ops = fake_ops();
    struct kernel_ctx ctx = {0};
    struct timeline tl;
    struct tl_clock c;
    double x = 0;
    ops.mark_done = fake_done;
    timeline_init(&tl, &ops, &ctx);
    EXPECT_EQ_INT(timeline_pending(&tl), 0);
    EXPECT_EQ_INT(timeline_ready(&tl), 1);
    timeline_begin(&tl);
    timeline_start(&tl, &c, 0); /* mark 0 */
    timeline_lap(&tl, &c, &x);  /* mark 1 */
    timeline_lap(&tl, &c, &x);  /* mark 2 */
    timeline_end(&tl);
    EXPECT_EQ_INT(timeline_pending(&tl), 1);
    fake_done_below = 2; /* mark 2 not yet */
    EXPECT_EQ_INT(timeline_ready(&tl), 0);
    EXPECT_TRUE(x == 0); /* asking added nothing */
    fake_done_below = 3;
    EXPECT_EQ_INT(timeline_ready(&tl), 1);
    EXPECT_EQ_INT(timeline_resolve(&tl), 0);
    EXPECT_NEAR(x, 2.0, 0);
    EXPECT_EQ_INT(timeline_pending(&tl), 0);

    ops.mark_done = fake_cannot_tell; /* -1: ready (the resolve will wait) */
    timeline_begin(&tl);
    timeline_start(&tl, &c, 0);
    timeline_lap(&tl, &c, &x);
    timeline_end(&tl);
    fake_done_below = 0;
    EXPECT_EQ_INT(timeline_ready(&tl), 1);
    timeline_free(&tl);
}

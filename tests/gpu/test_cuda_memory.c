/* The CUDA backend's memory layer on a real device: allocate through the device table, copy a
 * pattern in and back. Skips (77) where no device is visible, as on the CI machines. */
#include "kernels/cuda/cuda_probe.h"
#include "kernels/device.h"
#include "test.h"

TEST(cuda_alloc_copy_roundtrip)
{
    const struct device_ops *ops = device_ops_cuda();
    enum { N = 1 << 20 };
    static float host[N], back[N];

    ASSERT_TRUE(ops != NULL);
    if (cuda_probe_device_count() == 0)
        test_skip("no CUDA device visible");
    for (int i = 0; i < N; i++)
        host[i] = (float)i * 0.5f - 7.0f;
    void *dev = ops->alloc(sizeof host);
    ASSERT_TRUE(dev != NULL);
    EXPECT_EQ_INT(cuda_probe_copy(dev, host, back, sizeof host), 0);
    EXPECT_EQ_INT(memcmp(host, back, sizeof host), 0);
    ops->free(dev);
}

/* device_ops.pointer_kind: host (pageable and pinned) and this device's memory told apart, as
 * the step's pointer check needs; timing marks on the compute and a copy lane give positive
 * intervals around real work, NaN for a mark never recorded or out of range; mark_done says
 * passed marks are done without waiting. */
TEST(cuda_pointer_kinds_and_timing_marks)
{
    const struct device_ops *ops = device_ops_cuda();
    struct kernel_ctx ctx = {0, NULL, NULL};
    int dev[2];
    enum { BYTES = 64 << 20 };

    ASSERT_TRUE(ops != NULL);
    if (cuda_probe_device_count() == 0)
        test_skip("no CUDA device visible");
    ASSERT_EQ_INT(ops->backend_create(-1, &ctx.stream, &ctx.backend), SHARDOPT_OK);
    ASSERT_TRUE(ctx.backend != NULL);
    void *pageable = malloc(BYTES), *pinned = ops->host_alloc(BYTES), *d = ops->alloc(BYTES);
    ASSERT_TRUE(pageable != NULL && pinned != NULL && d != NULL);
    EXPECT_EQ_INT(ops->pointer_kind(&ctx, pageable, dev), KERNEL_PTR_HOST);
    EXPECT_EQ_INT(ops->pointer_kind(&ctx, pinned, dev), KERNEL_PTR_HOST);
    EXPECT_EQ_INT(ops->pointer_kind(&ctx, (char *)d + 4096, dev), KERNEL_PTR_DEVICE);
    EXPECT_EQ_INT(dev[0], dev[1]);

    EXPECT_EQ_INT(ops->mark(&ctx, 0, 0), 0);
    for (int i = 0; i < 8; i++)
        ops->fill(&ctx, d, i, BYTES);
    EXPECT_EQ_INT(ops->mark(&ctx, 0, 1), 0);
    /* asked while 512 MiB of fills are likely still running: "not ready" (0) must not stay
     * behind as the thread's last error, which the sync below would report as a failure */
    const int early = ops->mark_done(&ctx, 1);
    printf("  mark_done right after queuing 512 MiB of fills: %d\n", early);
    EXPECT_TRUE(early == 0 || early == 1);
    EXPECT_EQ_INT(ops->mark(&ctx, 1, 2), 0);
    ops->copy_on(&ctx, 1, d, pinned, BYTES);
    EXPECT_EQ_INT(ops->mark(&ctx, 1, 3), 0);
    ops->lane_record(&ctx, 1, 0);
    ops->lane_wait(&ctx, 0, 1, 0);
    EXPECT_EQ_INT(ops->sync(&ctx), 0);
    const double fills = ops->mark_seconds(&ctx, 0, 1), copy = ops->mark_seconds(&ctx, 2, 3);
    printf("  8 fills of 64 MiB: %.3e s; a 64 MiB pinned copy in: %.3e s\n", fills, copy);
    EXPECT_TRUE(fills > 0 && copy > 0);
    EXPECT_EQ_INT(ops->mark_done(&ctx, 1), 1); /* passed: the stream was synchronised */
    EXPECT_EQ_INT(ops->mark_done(&ctx, 3), 1);
    EXPECT_EQ_INT(ops->mark_done(&ctx, 9999), -1);                               /* never made */
    EXPECT_TRUE(ops->mark_seconds(&ctx, 0, 7) != ops->mark_seconds(&ctx, 0, 7)); /* unrecorded */
    EXPECT_TRUE(ops->mark_seconds(&ctx, 0, 5000) != ops->mark_seconds(&ctx, 0, 5000));
    EXPECT_EQ_INT(ops->mark(&ctx, 3, 4), -1); /* no such lane */
    EXPECT_EQ_INT(ops->sync(&ctx), 0);        /* nothing left pending by the refusals */
    free(pageable);
    ops->host_free(pinned);
    ops->free(d);
    ops->backend_destroy(ctx.backend);
}

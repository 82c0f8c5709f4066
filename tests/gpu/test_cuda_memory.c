/* The CUDA backend's memory layer on a real device: allocate through the kernel table, copy a
 * pattern in and back. Skips (77) where no device is visible, as on the CI machines. */
#include "kernels/cuda/cuda_probe.h"
#include "kernels/ops.h"
#include "test.h"

TEST(cuda_alloc_copy_roundtrip)
{
    const struct kernel_ops *ops = kernel_ops_cuda();
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

/* kernels/device.h: every device table fills exactly the slots its caps promise (the CPU's, and
 * CUDA's in a CUDA build; the simulated device's is checked in test_device_sim), so that a
 * caller that tests a capability finds its slots; and device_ops_check names the slot of a
 * table that breaks the rule either way. */
#include "kernels/device.h"
#include "test.h"

static void *no_alloc(size_t bytes)
{
    (void)bytes;
    return NULL;
}

static int no_register(void *p, size_t bytes)
{
    (void)p, (void)bytes;
    return -1;
}

TEST(every_table_fills_what_its_caps_promise)
{
    const struct device_ops *cpu = device_ops_cpu();
    ASSERT_TRUE(cpu != NULL);
    EXPECT_TRUE(device_ops_check(cpu) == NULL);
    EXPECT_EQ_INT(cpu->caps, 0); /* host memory: nothing to pin, no lanes, marks or device */
    EXPECT_EQ_INT(device_has(cpu, DEVICE_CAP_DEVICE_MEMORY), 0);
    EXPECT_EQ_INT(device_has(NULL, 0), 0);
    const struct device_ops *cuda = device_ops_cuda(); /* NULL without CUDA */
    if (cuda != NULL) {
        EXPECT_TRUE(device_ops_check(cuda) == NULL);
        EXPECT_EQ_INT(device_has(cuda, DEVICE_CAP_DEVICE_MEMORY | DEVICE_CAP_HOST_PINNED |
                                           DEVICE_CAP_COPY_LANES | DEVICE_CAP_STREAMS |
                                           DEVICE_CAP_MARKS | DEVICE_CAP_BACKEND),
                      1);
    }
}

TEST(check_names_a_claimed_capability_without_its_slots_and_a_slot_without_its_capability)
{
    struct device_ops d = *device_ops_cpu();
    d.caps = DEVICE_CAP_HOST_PINNED; /* claimed, host_alloc not filled */
    const char *bad = device_ops_check(&d);
    ASSERT_TRUE(bad != NULL);
    EXPECT_STR_CONTAINS(bad, "host_alloc");

    d = *device_ops_cpu();
    d.host_register = no_register; /* filled, not claimed: no caller would ever use it */
    bad = device_ops_check(&d);
    ASSERT_TRUE(bad != NULL);
    EXPECT_STR_CONTAINS(bad, "host_register");

    d = *device_ops_cpu();
    d.sync = NULL; /* a slot every table fills */
    bad = device_ops_check(&d);
    ASSERT_TRUE(bad != NULL);
    EXPECT_STR_CONTAINS(bad, "sync");

    /* device memory moves through pinned host mirrors: claiming it without them is refused */
    d = *device_ops_cpu();
    d.caps = DEVICE_CAP_DEVICE_MEMORY;
    bad = device_ops_check(&d);
    ASSERT_TRUE(bad != NULL);
    EXPECT_STR_CONTAINS(bad, "host_alloc");
    d.caps |= DEVICE_CAP_HOST_PINNED;
    d.host_alloc = no_alloc;
    d.host_free = d.free;
    EXPECT_TRUE(device_ops_check(&d) == NULL);
}

/* offload/state_store.c and host_store.c report what went wrong as a status, not -1 beside a
 * message: the runtime passes that status on (commit, save, load), so out of memory must stay
 * SHARDOPT_ERR_OUT_OF_MEMORY and a failed device copy SHARDOPT_ERR_DEVICE, each with its message
 * (the bytes, the limit, the device) as the thread's last error. A device table whose memory is
 * host memory stands in for a device here: its sync can be made to fail. */
#include <stdlib.h>

#include "base/fault.h"
#include "base/mem.h"
#include "kernels/cpu/cpu_kernels.h"
#include "offload/state_store.h"
#include "test.h"

static int sync_fails;
static int fake_sync(const struct kernel_ctx *c)
{
    (void)c;
    return sync_fails ? -1 : 0;
}

static int no_alloc_at; /* > 0: that many allocations succeed, then one fails */
static void *fake_alloc(size_t bytes)
{
    if (no_alloc_at > 0 && --no_alloc_at == 0)
        return NULL;
    return cpu_alloc(bytes);
}

static struct device_ops fake_device(void)
{
    struct device_ops d = *device_ops_cpu();
    d.name = "fakedev";
    d.caps = DEVICE_CAP_DEVICE_MEMORY | DEVICE_CAP_HOST_PINNED;
    d.host_alloc = cpu_alloc;
    d.host_free = cpu_free;
    d.alloc = fake_alloc;
    d.sync = fake_sync;
    return d;
}

TEST(state_store_failures_keep_their_status_and_message)
{
    const struct device_ops dev = fake_device();
    const struct kernel_ctx ctx = {0};
    struct state_store s;
    ASSERT_TRUE(device_ops_check(&dev) == NULL);
    state_store_init(&s, &dev);
    state_store_reserve(&s, 1000);
    EXPECT_EQ_INT(state_store_on_device(&s), 1);

    no_alloc_at = 1; /* the arena itself */
    EXPECT_EQ_INT(state_store_alloc(&s), SHARDOPT_ERR_OUT_OF_MEMORY);
    EXPECT_TRUE(s.base == NULL);
    EXPECT_STR_CONTAINS(shardopt_last_error(),
                        "out of memory allocating 1024 bytes (device fakedev)");
    no_alloc_at = 0;
    ASSERT_EQ_INT(state_store_alloc(&s), SHARDOPT_OK);

    /* the host view of device state: its host copy out of memory, or the copy failing */
    const unsigned char *view = (const unsigned char *)&s;
    void *copy = NULL;
    fault_arm("alloc:1");
    EXPECT_EQ_INT(state_store_host_view(&s, &ctx, s.base, &view, &copy),
                  SHARDOPT_ERR_OUT_OF_MEMORY);
    fault_arm(NULL);
    EXPECT_TRUE(view == NULL && copy == NULL);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "1024 bytes for a host copy of the device state");
    sync_fails = 1;
    EXPECT_EQ_INT(state_store_host_view(&s, &ctx, s.base, &view, &copy), SHARDOPT_ERR_DEVICE);
    EXPECT_TRUE(view == NULL && copy == NULL);
    EXPECT_STR_CONTAINS(shardopt_last_error(),
                        "copying 1024 bytes from the device failed (fakedev)");
    EXPECT_EQ_INT(state_store_upload(&s, &ctx, s.base, s.base), SHARDOPT_ERR_DEVICE);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "copying 1024 bytes to the device failed (fakedev)");
    sync_fails = 0;
    ASSERT_EQ_INT(state_store_host_view(&s, &ctx, s.base, &view, &copy), SHARDOPT_OK);
    EXPECT_TRUE(view != NULL && view == copy);
    free(copy);

    /* a second buffer like the arena */
    void *other = NULL;
    no_alloc_at = 1;
    EXPECT_EQ_INT(state_store_buffer_alloc(&s, &other), SHARDOPT_ERR_OUT_OF_MEMORY);
    EXPECT_TRUE(other == NULL);
    no_alloc_at = 0;
    state_store_free(&s);
}

TEST(host_store_limit_and_memory_are_out_of_memory)
{
    const struct device_ops dev = fake_device();
    const struct kernel_ctx ctx = {0};
    struct state_store s;
    state_store_init(&s, &dev);
    state_store_use_host(&s, NULL, NULL, 512);
    state_store_reserve(&s, 1000);
    EXPECT_EQ_INT(state_store_on_device(&s), 0);
    EXPECT_EQ_INT(state_store_alloc(&s), SHARDOPT_ERR_OUT_OF_MEMORY);
    EXPECT_STR_CONTAINS(shardopt_last_error(),
                        "1024 bytes of optimizer state asked for, host_store_limit is 512");

    state_store_use_host(&s, NULL, NULL, 0);
    fault_arm("alloc:1");
    EXPECT_EQ_INT(state_store_alloc(&s), SHARDOPT_ERR_OUT_OF_MEMORY);
    fault_arm(NULL);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "host store: out of memory allocating 1024 bytes");
    ASSERT_EQ_INT(state_store_alloc(&s), SHARDOPT_OK);

    /* a host store is its own view, once the device's copies into it are done */
    const unsigned char *view = NULL;
    void *copy = NULL;
    sync_fails = 1;
    EXPECT_EQ_INT(state_store_host_view(&s, &ctx, s.base, &view, &copy), SHARDOPT_ERR_DEVICE);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "waiting for the device's copies failed (fakedev)");
    sync_fails = 0;
    EXPECT_EQ_INT(state_store_host_view(&s, &ctx, s.base, &view, &copy), SHARDOPT_OK);
    EXPECT_TRUE(view == s.base && copy == NULL);
    state_store_free(&s);
}

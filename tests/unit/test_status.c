/* Status strings, the thread-local last error, the version. */
#include <pthread.h>

#include "base/status.h"
#include "shardopt.h"
#include "test.h"

TEST(status_strings_cover_every_code)
{
    for (int s = 0; s >= SHARDOPT_ERR_DEVICE; s--) { /* the last code of the enum */
        const char *text = shardopt_status_string((shardopt_status_t)s);
        EXPECT_TRUE(text != NULL && strcmp(text, "unknown status") != 0);
    }
    /* each code its own text: a new code without one would show another's */
    for (int s = 0; s >= SHARDOPT_ERR_DEVICE; s--)
        for (int t = s - 1; t >= SHARDOPT_ERR_DEVICE; t--)
            EXPECT_TRUE(strcmp(shardopt_status_string((shardopt_status_t)s),
                               shardopt_status_string((shardopt_status_t)t)) != 0);
    EXPECT_STR_CONTAINS(shardopt_status_string((shardopt_status_t)-999), "unknown");
    EXPECT_STR_CONTAINS(shardopt_status_string(SHARDOPT_ERR_OUT_OF_MEMORY), "memory");
}

/* ERR_DEVICE comes from any device table, the simulated device's and offload's on a CPU too
 * (tests/mpi/devsim.h), so its text names no vendor */
TEST(device_status_text_names_no_vendor)
{
    const char *text = shardopt_status_string(SHARDOPT_ERR_DEVICE);
    EXPECT_STR_CONTAINS(text, "device error");
    EXPECT_TRUE(strstr(text, "CUDA") == NULL);
}

TEST(version_matches_macros)
{
    int a = -1, b = -1, c = -1;
    EXPECT_EQ_INT(shardopt_get_version(&a, &b, &c), SHARDOPT_OK);
    EXPECT_EQ_INT(a, SHARDOPT_VERSION_MAJOR);
    EXPECT_EQ_INT(b, SHARDOPT_VERSION_MINOR);
    EXPECT_EQ_INT(c, SHARDOPT_VERSION_PATCH);
    EXPECT_EQ_INT(shardopt_get_version(NULL, NULL, NULL), SHARDOPT_OK);
}

static void *other_thread(void *arg)
{
    (void)arg;
    status_set(SHARDOPT_ERR_IO, "from the other thread");
    return NULL;
}

TEST(last_error_is_per_thread)
{
    pthread_t t;
    EXPECT_EQ_INT(status_set(SHARDOPT_ERR_STATE, "main thread %d", 7), SHARDOPT_ERR_STATE);
    pthread_create(&t, NULL, other_thread, NULL);
    pthread_join(t, NULL);
    EXPECT_TRUE(strcmp(shardopt_last_error(), "main thread 7") == 0);
}

/* Enum values come back from stats and get_algo as ints: their names, as config keys spell them,
 * and "unknown" for a value outside the enum. */
TEST(enum_names)
{
    EXPECT_TRUE(strcmp(shardopt_dtype_name(SHARDOPT_DTYPE_BF16), "bf16") == 0);
    EXPECT_TRUE(strcmp(shardopt_algo_name(SHARDOPT_ALGO_MUON), "muon") == 0);
    EXPECT_TRUE(strcmp(shardopt_placement_name(SHARDOPT_PLACEMENT_EXPERT), "expert") == 0);
    EXPECT_TRUE(strcmp(shardopt_offload_name(SHARDOPT_OFFLOAD_CPU), "cpu") == 0);
    EXPECT_TRUE(strcmp(shardopt_ns_compute_name(SHARDOPT_NS_COMPUTE_FP32), "fp32") == 0);
    EXPECT_TRUE(strcmp(shardopt_backend_name(SHARDOPT_BACKEND_CUDA), "cuda") == 0);
    EXPECT_TRUE(strcmp(shardopt_offload_name((shardopt_offload_t)7), "unknown") == 0);
    EXPECT_TRUE(strcmp(shardopt_dtype_name((shardopt_dtype_t)-1), "unknown") == 0);
}

/* A NULL runtime or parameter handle is the one misuse of a handle the library can detect: every
 * call taking one refuses it with ERR_INVALID_ARGUMENT, a message that names the call, and no MPI
 * call (these are local refusals: the test runs on MPI_COMM_SELF). shardopt_finalize(NULL) is OK,
 * as free(NULL). A runtime handle used after shardopt_finalize (or finalized twice) is refused
 * by its pointer, never read (runtime/live.c); a parameter handle after it stays undefined
 * behaviour: docs/api.md, "Handles after finalize". */
#include "fixture.h"

static float w[64], g[64];

/* the status and the call named in the thread's last error */
static void refused(shardopt_status_t s, const char *call)
{
    EXPECT_EQ_INT(s, SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), call);
}

TEST(every_call_refuses_a_null_handle_naming_itself)
{
    shardopt_param_desc_t d = fixture_desc("a", 2, 8, 8, 0, w, g);
    shardopt_param_t p = NULL;
    shardopt_stats_t st = SHARDOPT_STATS_INIT;
    shardopt_param_stats_t ps = SHARDOPT_PARAM_STATS_INIT;
    shardopt_step_args_t args = SHARDOPT_STEP_ARGS_INIT;
    shardopt_algo_t algo;
    shardopt_dtype_t dt;
    int64_t off, len, n;
    uint64_t step;
    void *data[1] = {w};
    const void *grad[1] = {g};
    float buf[64];
    args.lr = 0.01;

    refused(shardopt_layout_print(NULL, NULL), "layout_print");
    refused(shardopt_register(NULL, &d, &p), "register");
    refused(shardopt_shard_range(NULL, &d, &off, &len, NULL), "shard_range");
    refused(shardopt_param_set_pointers(NULL, w, g), "param_set_pointers");
    refused(shardopt_params_set_pointers(NULL, 1, &p, data, grad), "params_set_pointers");
    refused(shardopt_param_get_algo(NULL, &algo), "param_get_algo");
    refused(shardopt_commit(NULL), "commit");
    refused(shardopt_step(NULL, &args), "step");
    refused(shardopt_get_stats(NULL, &st), "get_stats");
    refused(shardopt_param_get_stats(NULL, &ps), "param_get_stats");
    refused(shardopt_param_state_info(NULL, SHARDOPT_STATE_MOMENTUM, &dt, &n), "param_state_info");
    refused(shardopt_param_get_state(NULL, SHARDOPT_STATE_MOMENTUM, buf, sizeof buf,
                                     SHARDOPT_DTYPE_FP32),
            "param_get_state");
    refused(shardopt_param_set_state(NULL, SHARDOPT_STATE_MOMENTUM, buf, sizeof buf,
                                     SHARDOPT_DTYPE_FP32),
            "param_set_state");
    refused(shardopt_param_get_step(NULL, &step), "param_get_step");
    refused(shardopt_param_set_step(NULL, 1), "param_set_step");
    refused(shardopt_save(NULL, "unused"), "save");
    refused(shardopt_load(NULL, "unused"), "load");
    EXPECT_EQ_INT(shardopt_finalize(NULL), SHARDOPT_OK);
    EXPECT_TRUE(p == NULL);
}

/* A runtime handle after shardopt_finalize: a second finalize freed the runtime twice (glibc's
 * "double free detected" abort, or heap damage found later), a step, commit, save or get_stats
 * read and wrote freed memory (AddressSanitizer: heap-use-after-free). Each is now refused by
 * the handle's pointer, naming the call, with nothing read from the freed runtime (the
 * sanitizer build runs this test too). */
TEST(a_finalized_runtime_is_refused_by_its_pointer_not_read)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_runtime_t rt = fixture_runtime(&cfg);
    shardopt_param_desc_t d = fixture_desc("a", 2, 8, 8, 0, w, g);
    shardopt_param_t p = NULL;
    ASSERT_EQ_INT(shardopt_register(rt, &d, &p), SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_commit(rt), SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_finalize(rt), SHARDOPT_OK);
    shardopt_step_args_t args = SHARDOPT_STEP_ARGS_INIT;
    shardopt_stats_t st = SHARDOPT_STATS_INIT;
    args.lr = 0.01;
    refused(shardopt_finalize(rt), "finalize: runtime 0x");
    EXPECT_STR_CONTAINS(shardopt_last_error(), "is not a live runtime of this process");
    refused(shardopt_step(rt, &args), "step: runtime");
    refused(shardopt_commit(rt), "commit: runtime");
    refused(shardopt_register(rt, &d, &p), "register: runtime");
    refused(shardopt_get_stats(rt, &st), "get_stats: runtime");
    int64_t off, len;
    refused(shardopt_shard_range(rt, &d, &off, &len, NULL), "shard_range: runtime");
    refused(shardopt_save(rt, "unused"), "save: runtime");
    refused(shardopt_load(rt, "unused"), "load: runtime");
    refused(shardopt_layout_print(rt, NULL), "layout_print: runtime");
    void *data[1] = {w};
    const void *grad[1] = {g};
    refused(shardopt_params_set_pointers(rt, 1, &p, data, grad), "params_set_pointers: runtime");
    /* a live one next to it still works */
    shardopt_runtime_t other = fixture_runtime(&cfg);
    EXPECT_EQ_INT(shardopt_get_stats(other, &st), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_finalize(other), SHARDOPT_OK);
}

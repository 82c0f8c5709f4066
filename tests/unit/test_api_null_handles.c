/* A NULL runtime or parameter handle is the one misuse of a handle the library can detect: every
 * call taking one refuses it with ERR_INVALID_ARGUMENT, a message that names the call, and no MPI
 * call (these are local refusals: the test runs on MPI_COMM_SELF). shardopt_finalize(NULL) is OK,
 * as free(NULL). A runtime handle used after shardopt_finalize (or finalized twice) is refused
 * by its pointer, never read (runtime/live.c); so is a parameter handle of it, found through
 * the runtime's shell that finalize keeps a while (no later init or register is given those
 * addresses meanwhile): docs/api.md, "Handles after finalize". */
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

/* A parameter handle after its runtime's shardopt_finalize: each call read the freed parameter
 * to find its runtime (a crash, or a step count and state read from whatever the allocator put
 * there), and a later init could be given the freed runtime's address, so that the old handle
 * stepped the new runtime. Finalize keeps the shells of its runtime and parameters a while
 * (runtime/live.c, live_retire): the handle is refused naming the parameter, and the addresses
 * are not handed out again meanwhile. */
TEST(a_parameter_of_a_finalized_runtime_is_refused_naming_it)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_runtime_t rt = fixture_runtime(&cfg);
    shardopt_param_desc_t d = fixture_desc("layers.0.w", 2, 8, 8, 0, w, g);
    shardopt_param_t p = NULL;
    ASSERT_EQ_INT(shardopt_register(rt, &d, &p), SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_commit(rt), SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_finalize(rt), SHARDOPT_OK);

    uint64_t step = 77;
    shardopt_algo_t algo = SHARDOPT_ALGO_AUTO;
    shardopt_dtype_t dt;
    int64_t n;
    float buf[64] = {0};
    shardopt_param_stats_t ps = SHARDOPT_PARAM_STATS_INIT;
    refused(shardopt_param_get_step(p, &step), "param_get_step 'layers.0.w': parameter 0x");
    EXPECT_STR_CONTAINS(shardopt_last_error(), "which is not live (finalized already)");
    EXPECT_STR_CONTAINS(shardopt_last_error(), "nothing was done");
    EXPECT_TRUE(step == 77);
    refused(shardopt_param_set_step(p, 3), "param_set_step 'layers.0.w'");
    refused(shardopt_param_get_algo(p, &algo), "param_get_algo 'layers.0.w'");
    EXPECT_TRUE(algo == SHARDOPT_ALGO_AUTO);
    refused(shardopt_param_get_stats(p, &ps), "param_get_stats 'layers.0.w'");
    refused(shardopt_param_state_info(p, SHARDOPT_STATE_MOMENTUM, &dt, &n),
            "param_state_info 'layers.0.w'");
    refused(
        shardopt_param_get_state(p, SHARDOPT_STATE_MOMENTUM, buf, sizeof buf, SHARDOPT_DTYPE_FP32),
        "param_get_state 'layers.0.w'");
    refused(
        shardopt_param_set_state(p, SHARDOPT_STATE_MOMENTUM, buf, sizeof buf, SHARDOPT_DTYPE_FP32),
        "param_set_state 'layers.0.w'");
    refused(shardopt_param_set_pointers(p, w, g), "param_set_pointers 'layers.0.w'");

    /* a runtime made after it is not given its address, nor its parameter the parameter's:
     * the old handles stay refused, the new ones work */
    shardopt_runtime_t other = fixture_runtime(&cfg);
    shardopt_param_desc_t d2 = fixture_desc("layers.0.w", 2, 8, 8, 0, w, g);
    shardopt_param_t q = NULL;
    ASSERT_EQ_INT(shardopt_register(other, &d2, &q), SHARDOPT_OK);
    EXPECT_TRUE(other != rt);
    EXPECT_TRUE(q != p);
    ASSERT_EQ_INT(shardopt_commit(other), SHARDOPT_OK);
    shardopt_stats_t st = SHARDOPT_STATS_INIT;
    refused(shardopt_get_stats(rt, &st), "get_stats: runtime");
    refused(shardopt_param_get_step(p, &step), "param_get_step 'layers.0.w'");
    void *data[1] = {w};
    const void *grad[1] = {g};
    refused(shardopt_params_set_pointers(other, 1, &p, data, grad),
            "entry 0 of 1 ('layers.0.w'): the parameter was registered with a runtime finalized "
            "since");
    EXPECT_EQ_INT(shardopt_param_get_step(q, &step), SHARDOPT_OK);
    EXPECT_TRUE(step == 0);
    EXPECT_EQ_INT(shardopt_param_set_pointers(q, w, g), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_finalize(other), SHARDOPT_OK);
}

/* A NULL runtime or parameter handle is the one misuse of a handle the library can detect: every
 * call taking one refuses it with ERR_INVALID_ARGUMENT, a message that names the call, and no MPI
 * call (these are local refusals: the test runs on MPI_COMM_SELF). shardopt_finalize(NULL) is OK,
 * as free(NULL). A handle used after shardopt_finalize (or finalized twice) is undefined
 * behaviour, as a pointer after free: docs/api.md, "Handles after finalize", says why nothing
 * detects it. */
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

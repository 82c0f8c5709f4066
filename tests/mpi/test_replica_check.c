/* replica_check_every: replicas that step alike pass; a bit flipped in one replica's shard of a
 * dense matrix, or in one rank's copy of a replicated tensor, fails the next checked step with
 * SHARDOPT_ERR_MISMATCH on every rank, naming that parameter. Layout from SHARDOPT_TEST_LAYOUT
 * (dp_replicate 2). */
#include <string.h>

#include "model_run.h"
#include "test.h"

static shardopt_config_t check_cfg(int every)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    cfg.num_threads = 1;
    cfg.replica_check_every = every;
    return cfg;
}

static int param_index(const char *name)
{
    for (int p = 0; p < MODEL_NPARAMS; p++)
        if (strcmp(model_params[p].name, name) == 0)
            return p;
    return -1;
}

/* Flip the lowest bit of the first element of parameter p on the rank at (replica, dense). */
static void flip_on(struct run *r, int p, int replica, int dense)
{
    shardopt_stats_t s = SHARDOPT_STATS_INIT;
    shardopt_get_stats(r->rt, &s);
    if (s.replica == replica && s.dense_rank == dense && r->box[p].numel > 0)
        ((unsigned char *)r->w[p])[0] ^= 1;
}

TEST(replicas_that_step_alike_pass_every_check)
{
    setup();
    struct run r = {0};
    ASSERT_EQ_INT(run_setup(&r, MPI_COMM_WORLD, check_cfg(2), 0), SHARDOPT_OK);
    EXPECT_EQ_INT(run_steps(&r, 1, 4), SHARDOPT_OK); /* checked after steps 2 and 4 */
    run_free(&r);
}

TEST(a_flipped_bit_in_one_replica_is_named_on_every_rank)
{
    setup();
    struct run r = {0};
    const int p = param_index("layers.0.attn.o_proj.weight");
    ASSERT_TRUE(p >= 0);
    ASSERT_EQ_INT(run_setup(&r, MPI_COMM_WORLD, check_cfg(1), 0), SHARDOPT_OK);
    ASSERT_EQ_INT(run_steps(&r, 1, 2), SHARDOPT_OK);
    flip_on(&r, p, 1, 0);
    EXPECT_EQ_INT(run_steps(&r, 3, 3), SHARDOPT_ERR_MISMATCH);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "'layers.0.attn.o_proj.weight' differs across the "
                                               "replicate group");
    EXPECT_STR_CONTAINS(shardopt_last_error(), "step 3");
    run_free(&r);
}

TEST(a_replicated_tensor_that_drifts_between_dense_ranks_is_named)
{
    setup();
    shardopt_stats_t s = SHARDOPT_STATS_INIT;
    struct run r = {0};
    const int p = param_index("layers.1.replicated_proj.weight");
    ASSERT_TRUE(p >= 0 && model_params[p].placement == SHARDOPT_PLACEMENT_REPLICATED);
    ASSERT_EQ_INT(run_setup(&r, MPI_COMM_WORLD, check_cfg(1), 0), SHARDOPT_OK);
    shardopt_get_stats(r.rt, &s);
    if (s.dense_size < 2) { /* every rank: the layout is the same everywhere */
        /* a dense group of 1: nothing to compare a replicated tensor with, and the check must
         * not report a difference where there is no other copy */
        printf("  (dense group of 1: the check runs and finds nothing)\n");
        EXPECT_EQ_INT(run_steps(&r, 1, 2), SHARDOPT_OK);
        run_free(&r);
        return;
    }
    ASSERT_EQ_INT(run_steps(&r, 1, 1), SHARDOPT_OK);
    flip_on(&r, p, 0, 1);
    EXPECT_EQ_INT(run_steps(&r, 2, 2), SHARDOPT_ERR_MISMATCH);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "'layers.1.replicated_proj.weight' differs");
    run_free(&r);
}

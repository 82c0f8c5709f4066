/* Calls after MPI_Finalize: every collective call refuses with SHARDOPT_ERR_STATE naming the
 * cause, before any MPI call (Open MPI aborts the process on one: before, shardopt_init, step,
 * save and load after MPI_Finalize ended the process); local calls and finalize still work. One
 * process; this test's main does not wrap MPI (main_plain.c): the test finalizes MPI itself. */
#include <mpi.h>

#include "fixture.h"

TEST(collective_calls_after_mpi_finalize_refuse_instead_of_aborting)
{
    static float w[64], g[64], w2[64], g2[64];
    MPI_Init(NULL, NULL);
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    cfg.num_threads = 1;
    shardopt_runtime_t rt = fixture_runtime(&cfg), idle = fixture_runtime(&cfg);
    for (int i = 0; i < 64; i++)
        g[i] = g2[i] = 0.01f * (float)(i % 7);
    shardopt_param_desc_t d = fixture_desc("w", 2, 8, 8, 0, w, g);
    shardopt_param_t p, q;
    ASSERT_EQ_INT(shardopt_register(rt, &d, &p), SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_commit(rt), SHARDOPT_OK);
    d.data = w2;
    d.grad = g2;
    ASSERT_EQ_INT(shardopt_register(idle, &d, &q), SHARDOPT_OK);
    shardopt_step_args_t a = SHARDOPT_STEP_ARGS_INIT;
    a.lr = 0.01;
    ASSERT_EQ_INT(shardopt_step(rt, &a), SHARDOPT_OK);
    MPI_Finalize();

    const char *want = "MPI is finalized (MPI_Finalize was called)";
    EXPECT_EQ_INT(shardopt_step(rt, &a), SHARDOPT_ERR_STATE);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "step: MPI is finalized");
    EXPECT_EQ_INT(shardopt_save(rt, "/tmp/shardopt_after_finalize"), SHARDOPT_ERR_STATE);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "save: MPI is finalized");
    EXPECT_EQ_INT(shardopt_load(rt, "/tmp/shardopt_after_finalize"), SHARDOPT_ERR_STATE);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "load: MPI is finalized");
    EXPECT_EQ_INT(shardopt_commit(idle), SHARDOPT_ERR_STATE);
    EXPECT_STR_CONTAINS(shardopt_last_error(), want);
    EXPECT_EQ_INT(shardopt_layout_print(rt, stdout), SHARDOPT_ERR_STATE);
    shardopt_runtime_t again = NULL;
    EXPECT_EQ_INT(shardopt_init(MPI_COMM_WORLD, &cfg, &again), SHARDOPT_ERR_STATE);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "init: MPI is finalized");
    EXPECT_TRUE(again == NULL);
    /* local calls go on, and both runtimes finalize */
    shardopt_stats_t st = SHARDOPT_STATS_INIT;
    EXPECT_EQ_INT(shardopt_get_stats(rt, &st), SHARDOPT_OK);
    EXPECT_EQ_INT(st.steps, 1);
    uint64_t step = 0;
    EXPECT_EQ_INT(shardopt_param_get_step(p, &step), SHARDOPT_OK);
    EXPECT_EQ_INT(step, 1);
    EXPECT_EQ_INT(shardopt_finalize(rt), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_finalize(idle), SHARDOPT_OK);
}

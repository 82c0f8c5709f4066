/* The Newton-Schulz FLOPs a rank counts (shardopt_stats_t.ns_flops_last) are the arithmetic its
 * kernels performed (docs/design.md, "Counting Newton-Schulz FLOPs"). With ns_strategy = sharded
 * a rank that holds none of a matrix's columns forms neither B nor Y (it only joins the Gram
 * all-reduces) and counts nothing; a holder of n_j columns counts 4m^2 n_j + 2m^3 per step. The
 * whole-layout counts against shardopt-plan are tests/mpi/plan_vs_runtime.sh. */
#include "fixture.h"
#include "kernels/ns_shape.h"

/* A 2 x 2(world - 1) matrix chunked along its long side over the dense group: 2 columns for each
 * rank but the last, which holds none (torch.chunk). */
TEST(a_rank_without_columns_counts_no_sharded_flops)
{
    int world, me;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    ASSERT_TRUE(world >= 3);
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    cfg.ns_strategy = SHARDOPT_NS_STRATEGY_SHARDED;
    shardopt_runtime_t rt = fixture_runtime_on(MPI_COMM_WORLD, &cfg);
    const int64_t rows = 2, cols = 2 * (world - 1);
    shardopt_param_desc_t d = fixture_desc("layers.0.attn.q.weight", 2, rows, cols, 1, NULL, NULL);
    d.shard_dim = 1;
    d.algo = SHARDOPT_ALGO_MUON;
    ASSERT_EQ_INT(shardopt_shard_range(rt, &d, &d.shard_offset, &d.shard_length, NULL),
                  SHARDOPT_OK);
    EXPECT_EQ_INT((int)d.shard_length, me == world - 1 ? 0 : 2);
    float *w = malloc(sizeof(float) * (size_t)(rows * d.shard_length + 1));
    float *g = malloc(sizeof(float) * (size_t)(rows * d.shard_length + 1));
    for (int64_t i = 0; i < rows * d.shard_length; i++) {
        w[i] = 0.1f * (float)(i + 1);
        g[i] = 0.01f * (float)((i * 7 + me) % 5 - 2) + 0.005f;
    }
    /* shard_length 0: no rows x 0 slice to point at, the layout's NULL pointers are accepted */
    d.data = d.shard_length > 0 ? w : NULL;
    d.grad = d.shard_length > 0 ? g : NULL;
    shardopt_param_t h;
    ASSERT_EQ_INT(shardopt_register(rt, &d, &h), SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_commit(rt), SHARDOPT_OK);
    shardopt_step_args_t args = SHARDOPT_STEP_ARGS_INIT;
    args.lr = 0.02;
    ASSERT_EQ_INT(shardopt_step(rt, &args), SHARDOPT_OK);
    shardopt_stats_t st = SHARDOPT_STATS_INIT;
    ASSERT_EQ_INT(shardopt_get_stats(rt, &st), SHARDOPT_OK);
    const double want =
        d.shard_length > 0
            ? ns_shard_iter_flops((double)rows, (double)d.shard_length, 1) * cfg.ns_steps
            : 0;
    EXPECT_NEAR(st.ns_flops_last, want, 0.0);
    EXPECT_EQ_INT(st.muon_matrices, 0); /* sharded: no rank owns it whole */
    shardopt_finalize(rt);
    free(w);
    free(g);
}

/* kernels = ref forms every fp32 product whole (kernels/cpu/ns_ref.c) whatever the variant table
 * says for the shape (symmetric from m = 384): the owner counts the whole products. */
TEST(reference_kernels_count_whole_products)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    cfg.kernels = SHARDOPT_KERNELS_REFERENCE;
    cfg.ns_compute = SHARDOPT_NS_COMPUTE_FP32;
    shardopt_runtime_t rt = fixture_runtime_on(MPI_COMM_WORLD, &cfg);
    const int64_t side = 384;
    shardopt_param_desc_t d = fixture_desc("layers.0.attn.o.weight", 2, side, side, 1, NULL, NULL);
    d.algo = SHARDOPT_ALGO_MUON;
    ASSERT_EQ_INT(shardopt_shard_range(rt, &d, &d.shard_offset, &d.shard_length, NULL),
                  SHARDOPT_OK);
    const size_t n = (size_t)(d.shard_length * side);
    float *w = malloc(sizeof(float) * (n + 1)), *g = malloc(sizeof(float) * (n + 1));
    for (size_t i = 0; i < n; i++) {
        w[i] = 0.01f * (float)(i % 13);
        g[i] = 0.001f * (float)((i * 7) % 11) - 0.005f;
    }
    d.data = n > 0 ? w : NULL;
    d.grad = n > 0 ? g : NULL;
    shardopt_param_t h;
    ASSERT_EQ_INT(shardopt_register(rt, &d, &h), SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_commit(rt), SHARDOPT_OK);
    shardopt_step_args_t args = SHARDOPT_STEP_ARGS_INIT;
    args.lr = 0.02;
    ASSERT_EQ_INT(shardopt_step(rt, &args), SHARDOPT_OK);
    shardopt_stats_t st = SHARDOPT_STATS_INIT;
    ASSERT_EQ_INT(shardopt_get_stats(rt, &st), SHARDOPT_OK);
    double sum = st.ns_flops_last;
    MPI_Allreduce(MPI_IN_PLACE, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    EXPECT_NEAR(sum, ns_iter_flops((double)side, (double)side) * cfg.ns_steps, 0.0);
    shardopt_finalize(rt);
    free(w);
    free(g);
}

/* ns_compute = auto resolves to bf16 only where every rank of the runtime has native bf16
 * (runtime/context.c, ns_compute_agree). A rank that resolved fp32 while the others took bf16
 * planned its owners from other variant tables and the first exchange failed (MPI_ERR_TRUNCATE).
 * SHARDOPT_CPU_NO_BF16 on the last rank only stands in for a node without AVX512_BF16. On a CPU
 * without native bf16 every rank resolves fp32 with or without the fix. */
#include <stdlib.h>

#include "fixture.h"

/* dp_shard 2 x ep 2 on 4 ranks (dense 4 on 2): the masked rank is in another expert group than
 * rank 0, so the agreement must cross the groups. Two dense matrices and an expert stack. */
static void run(int masked_rank, int want_bf16_if_native)
{
    int world, me;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    if (me == masked_rank)
        setenv("SHARDOPT_CPU_NO_BF16", "1", 1);
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    cfg.ep = world >= 4 ? 2 : 1;
    shardopt_runtime_t rt = fixture_runtime_on(MPI_COMM_WORLD, &cfg);
    unsetenv("SHARDOPT_CPU_NO_BF16");

    const char *names[3] = {"layers.0.attn.q.weight", "layers.0.mlp.down.weight",
                            "layers.0.experts.w1"};
    const int64_t shape[3][3] = {{96, 64, 1}, {64, 160, 1}, {4, 48, 32}};
    float *w[3], *g[3];
    shardopt_param_t h[3];
    for (int i = 0; i < 3; i++) {
        shardopt_param_desc_t d = fixture_desc(names[i], i == 2 ? 3 : 2, shape[i][0], shape[i][1],
                                               shape[i][2], NULL, NULL);
        d.algo = SHARDOPT_ALGO_MUON;
        if (i == 2)
            d.placement = SHARDOPT_PLACEMENT_EXPERT;
        ASSERT_EQ_INT(shardopt_shard_range(rt, &d, &d.shard_offset, &d.shard_length, NULL),
                      SHARDOPT_OK);
        int64_t inner = 1;
        for (int k = 1; k < d.ndim; k++)
            inner *= d.shape[k];
        const size_t n = (size_t)(d.shard_length * inner);
        w[i] = malloc(sizeof(float) * (n + 1));
        g[i] = malloc(sizeof(float) * (n + 1));
        for (size_t e = 0; e < n; e++) {
            w[i][e] = 0.01f * (float)((e * 13 + (size_t)i) % 17);
            g[i][e] = 0.001f * (float)((e * 7 + (size_t)me) % 11) - 0.005f;
        }
        d.data = n > 0 ? w[i] : NULL;
        d.grad = n > 0 ? g[i] : NULL;
        ASSERT_EQ_INT(shardopt_register(rt, &d, &h[i]), SHARDOPT_OK);
    }
    ASSERT_EQ_INT(shardopt_commit(rt), SHARDOPT_OK);
    shardopt_step_args_t args = SHARDOPT_STEP_ARGS_INIT;
    args.lr = 0.02;
    for (int s = 0; s < 2; s++)
        ASSERT_EQ_INT(shardopt_step(rt, &args), SHARDOPT_OK);
    shardopt_stats_t st = SHARDOPT_STATS_INIT;
    ASSERT_EQ_INT(shardopt_get_stats(rt, &st), SHARDOPT_OK);
    /* every rank iterates in the same dtype: the lowest common one */
    int mine = st.ns_compute, lo = mine, hi = mine;
    MPI_Allreduce(&mine, &lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&mine, &hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    EXPECT_EQ_INT(lo, hi);
    if (!want_bf16_if_native)
        EXPECT_EQ_INT(st.ns_compute, SHARDOPT_NS_COMPUTE_FP32);
    shardopt_finalize(rt);
    for (int i = 0; i < 3; i++) {
        free(w[i]);
        free(g[i]);
    }
}

TEST(auto_takes_fp32_everywhere_when_one_rank_lacks_bf16)
{
    int world;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    run(world - 1, 0);
}

TEST(auto_is_alike_on_every_rank_without_a_mask) { run(-1, 1); }

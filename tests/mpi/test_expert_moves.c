/* expert_moves changes owners and traffic, never the update (issue 22): the tiny-experts preset
 * on 4 ranks with ep 1 (2 experts, so 2 of the 4 expert shard group members hold none), three
 * steps with expert_moves = 0 and = 1 from the same shards, then every parameter compared
 * bitwise on every rank. The moves must have happened (expert exchange bytes, which are 0 with
 * every expert kept by its holder). Both runs keep the joint plan (rt->union_off): LPT over the
 * union, which commit keeps where it finishes first, moves whole experts too (test_union_plan). */
#include <string.h>

#include "bench/preset.h"
#include "bench/preset_shards.h"
#include "runtime/runtime.h"
#include "test.h"

#define NSTEPS 3

static int me;

/* Run NSTEPS steps; return this rank's parameters (every tensor's shard, concatenated) and the
 * expert group's bytes sent + received over the steps. */
static float *run(const struct preset *p, int moves, size_t *n, uint64_t *expert_bytes)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_runtime_t rt = NULL;
    struct preset_shards ps;
    cfg.ep = 1;
    cfg.num_threads = 1;
    cfg.expert_moves = moves;
    if (shardopt_init(MPI_COMM_WORLD, &cfg, &rt) != SHARDOPT_OK)
        return NULL;
    rt->union_off = 1;
    if (preset_shards_register(rt, p, 0, 4242 + (uint64_t)me, NULL, &ps) != SHARDOPT_OK)
        return NULL;
    for (int s = 0; s < NSTEPS; s++) {
        shardopt_step_args_t a = SHARDOPT_STEP_ARGS_INIT;
        a.lr = 0.02;
        if (shardopt_step(rt, &a) != SHARDOPT_OK)
            return NULL;
    }
    shardopt_stats_t st = SHARDOPT_STATS_INIT;
    shardopt_get_stats(rt, &st);
    *expert_bytes = st.bytes_sent_expert + st.bytes_recv_expert;
    float *out = malloc(sizeof(float) * (size_t)(ps.local + 1));
    size_t o = 0;
    for (int i = 0; out != NULL && i < p->n; i++) {
        const struct preset_tensor *t = &p->t[i];
        struct preset_shard sh;
        preset_shard_of(t, 1, 4, me, 0, &sh); /* ep 1: both groups are the 4 ranks */
        memcpy(out + o, ps.w[i], sizeof(float) * (size_t)sh.numel);
        o += (size_t)sh.numel;
    }
    *n = o;
    preset_shards_free(&ps);
    shardopt_finalize(rt);
    return out;
}

TEST(expert_moves_change_the_owners_not_the_bits)
{
    struct preset p;
    char err[256];
    int ranks;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    ASSERT_EQ_INT(ranks, 4);
    struct preset_scale sc = {0, 1, 1};
    ASSERT_EQ_INT(preset_load("tiny-experts", SHARDOPT_PRESET_DIR, &sc, &p, err, sizeof err), 0);
    size_t n0 = 0, n1 = 0;
    uint64_t b0 = 0, b1 = 0;
    float *kept = run(&p, 0, &n0, &b0);
    float *moved = run(&p, 1, &n1, &b1);
    ASSERT_TRUE(kept != NULL && moved != NULL);
    ASSERT_EQ_INT(n0, n1);
    long differ = 0;
    for (size_t i = 0; i < n0; i++)
        differ += memcmp(&kept[i], &moved[i], sizeof(float)) != 0;
    EXPECT_EQ_INT(differ, 0);
    /* the holders (ranks 0 and 1) keep every expert without moves; with them some travel */
    uint64_t tot[2] = {b0, b1};
    MPI_Allreduce(MPI_IN_PLACE, tot, 2, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    EXPECT_EQ_INT(tot[0], 0);
    EXPECT_TRUE(tot[1] > 0);
    free(kept);
    free(moved);
    preset_free(&p);
}

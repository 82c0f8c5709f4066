/* LPT over the union of both groups replaces the joint plan where it finishes first
 * (runtime/commit_union.c), and changes owners only, never the update. 4 ranks, ep 2 (expert
 * shard groups {0, 2} and {1, 3}): two dense 64 x 128 matrices (NS cost 8 units, a unit being a
 * 32 x 64 matrix's) and two stacks of 6 experts of 32 x 64, so 6 expert matrices per EP rank,
 * sharded along rows (no member holds one whole). The joint plan places the experts first (3
 * units on every member) and the dense matrices on top (members 0 and 1): its busiest member does
 * 11 units. The union places the dense matrices first (on 0 and 1) and each group's 6 experts on
 * its other member: 8 units. Three steps with the union plan and without it (rt->union_off, the
 * joint plan of before) from the same shards: the busiest rank's Newton-Schulz FLOPs must be 8
 * and 11 units, every parameter the same bits. */
#include <stdlib.h>
#include <string.h>

#include "runtime/runtime.h"
#include "test.h"

#define NSTEPS 3
#define E      6 /* experts, 3 per EP rank */

static int me;

static double ns_units(double rows, double cols)
{
    return 4 * rows * rows * cols + 2 * rows * rows * rows;
}

/* fill n floats from seed (the same on every run) */
static void fill(float *x, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = (float)((int)(seed >> 9) - (1 << 22)) / (float)(1 << 22);
    }
}

struct tensor {
    const char *name;
    int ndim;
    int64_t shape[3];
    shardopt_placement_t placement;
    int dim;
};

/* Registers this rank's shard of Muon tensor t (rows [off, off + len) of every matrix its slice
 * holds: the range shardopt_shard_range gives) over w and g, filled from seeds sw and sg; the
 * shard's element count, 0 on a refusal. */
static size_t register_shard(shardopt_runtime_t rt, const struct tensor *t, float *w, float *g,
                             uint32_t sw, uint32_t sg)
{
    shardopt_param_desc_t d = SHARDOPT_PARAM_DESC_INIT;
    shardopt_param_t p;
    int64_t off, len, goff;
    d.name = t->name;
    d.ndim = t->ndim;
    memcpy(d.shape, t->shape, sizeof d.shape);
    d.placement = t->placement;
    d.shard_dim = t->dim;
    d.algo = SHARDOPT_ALGO_MUON;
    if (shardopt_shard_range(rt, &d, &off, &len, &goff) != SHARDOPT_OK)
        return 0;
    d.shard_offset = off;
    d.shard_length = len;
    const int64_t cols = t->shape[t->ndim - 1],
                  slice = t->ndim == 3 && t->placement == SHARDOPT_PLACEMENT_EXPERT
                              ? t->shape[0] / rt->cfg.ep
                              : 1; /* the experts this EP rank holds */
    const size_t numel = (size_t)slice * (size_t)len * (size_t)cols;
    fill(w, numel, sw);
    fill(g, numel, sg);
    d.data = w;
    d.grad = g;
    return shardopt_register(rt, &d, &p) == SHARDOPT_OK ? numel : 0;
}

/* Run NSTEPS steps; this rank's parameters concatenated into out (returned count) and its NS
 * FLOPs of the last step. */
static size_t run(int union_off, int teams, float *out, double *flops, int *kept, int *nteams)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_runtime_t rt = NULL;
    cfg.ep = 2;
    cfg.num_threads = 1;
    cfg.ns_compute = SHARDOPT_NS_COMPUTE_FP32;
    if (teams) { /* every dense matrix in a team of 2 */
        cfg.ns_team_cap = 2;
        cfg.ns_team_frac = 0.01;
    }
    if (shardopt_init(MPI_COMM_WORLD, &cfg, &rt) != SHARDOPT_OK)
        return 0;
    rt->union_off = union_off;
    static float w[4][E * 32 * 64], g[4][E * 32 * 64];
    const struct tensor t[4] = {{"dense.a", 2, {64, 128}, SHARDOPT_PLACEMENT_DENSE, 0},
                                {"dense.b", 2, {64, 128}, SHARDOPT_PLACEMENT_DENSE, 0},
                                {"experts.w1", 3, {E, 32, 64}, SHARDOPT_PLACEMENT_EXPERT, 1},
                                {"experts.w2", 3, {E, 32, 64}, SHARDOPT_PLACEMENT_EXPERT, 1}};
    size_t n = 0;
    for (int i = 0; i < 4; i++) {
        const size_t numel =
            register_shard(rt, &t[i], w[i], g[i], 77u + 1000u * (uint32_t)i + 10u * (uint32_t)me,
                           99u + 1000u * (uint32_t)i + 10u * (uint32_t)me);
        if (numel == 0)
            return 0;
        n += numel;
    }
    if (shardopt_commit(rt) != SHARDOPT_OK)
        return 0;
    *kept = rt->union_kept;
    *nteams = rt->gx[GROUP_DENSE].plan.nteams;
    for (int s = 0; s < NSTEPS; s++) {
        shardopt_step_args_t a = SHARDOPT_STEP_ARGS_INIT;
        a.lr = 0.02;
        if (shardopt_step(rt, &a) != SHARDOPT_OK)
            return 0;
    }
    shardopt_stats_t st = SHARDOPT_STATS_INIT;
    shardopt_get_stats(rt, &st);
    *flops = st.ns_flops_last;
    size_t o = 0;
    for (int i = 0; i < 4; i++) {
        const size_t numel = i < 2 ? 16 * 128 : (size_t)(E / 2) * 16 * 64;
        memcpy(out + o, w[i], sizeof(float) * numel);
        o += numel;
    }
    shardopt_finalize(rt);
    return o == n ? n : 0;
}

/* What both runs of one setting give: with and without the union plan */
struct pair {
    int kept[2], nteams[2];
    double most[2]; /* the busiest rank's NS FLOPs */
};

/* The two runs (teams or not) from the same shards; the bits must be the same. */
static int run_pair(int teams, struct pair *r)
{
    static float a[4 * E * 32 * 64], b[4 * E * 32 * 64];
    const size_t na = run(0, teams, a, &r->most[0], &r->kept[0], &r->nteams[0]);
    const size_t nb = run(1, teams, b, &r->most[1], &r->kept[1], &r->nteams[1]);
    if (na == 0 || na != nb)
        return -1;
    long differ = 0;
    for (size_t i = 0; i < na; i++)
        differ += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    EXPECT_EQ_INT(differ, 0);
    MPI_Allreduce(MPI_IN_PLACE, r->most, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return 0;
}

TEST(the_union_plan_is_kept_where_it_finishes_first_with_the_same_bits)
{
    int ranks;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    ASSERT_EQ_INT(ranks, 4);
    struct pair r;
    ASSERT_EQ_INT(run_pair(0, &r), 0);
    EXPECT_EQ_INT(r.kept[0], 1);
    EXPECT_EQ_INT(r.kept[1], 0);
    const double unit = ns_units(32, 64) * 5; /* 5 Newton-Schulz steps per matrix */
    EXPECT_NEAR(r.most[0] / unit, 8.0, 1e-9);
    EXPECT_NEAR(r.most[1] / unit, 11.0, 1e-9);
}

/* With the dense matrices forced into teams of 2 (ns_team_frac 0.01, as the team tests force
 * them) the union is computed around the teams and never drops them: the team path still runs
 * (here the joint plan finishes no later, so it stays), the busiest rank is no busier than the
 * joint plan's and the update is the same bits. test_plan_union checks that a plan for the
 * union's owners keeps the teams it is given. */
TEST(the_union_plan_keeps_the_joint_plans_teams)
{
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    struct pair r;
    ASSERT_EQ_INT(run_pair(1, &r), 0);
    EXPECT_EQ_INT(r.nteams[0], 2);
    EXPECT_EQ_INT(r.nteams[1], 2);
    EXPECT_TRUE(r.most[0] <= r.most[1]);
}

/* The exchange term of the rule is the busiest dense sender's elements plus the busiest expert
 * sender's (shardopt-plan's t_comm), not each rank's own sum. ep 1, every matrix sharded along
 * rows over the 4 ranks (an owner sends 3/4 of it back, every other rank its 1/4): one dense
 * 32 x 256 (3.4 units) and 12 experts of 32 x 64 (1 unit). The joint plan: 3 experts on every rank
 * and the dense one on rank 0 (6.4 units, rank 0 sending 6144 dense + 9216 expert elements,
 * every other 2048 + 9216: 15360). The union: the dense on rank 0 and 4 experts on each other
 * (4 units; rank 0 sends 6144 + 6144, the others 2048 + 10240: 12288 each, but 6144 + 10240 =
 * 16384 from the two groups' busiest senders). At the default rates (an element 1.6 units) the
 * union's work decides: kept. With the exchange priced high (an element 10,000 units) the union's
 * 16384 elements finish after the joint plan's 15360: the joint plan stays (with each rank's own
 * sum, 12288, the union was kept, and shardopt-plan's step was later). */
static int run_rates(double gflops, double gbps, int *kept, double *most)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_runtime_t rt = NULL;
    cfg.num_threads = 1;
    cfg.ns_compute = SHARDOPT_NS_COMPUTE_FP32;
    cfg.cost_gemm_gflops = gflops;
    cfg.cost_net_gbps = gbps;
    if (shardopt_init(MPI_COMM_WORLD, &cfg, &rt) != SHARDOPT_OK)
        return -1;
    static float w[2][12 * 8 * 64], g[2][12 * 8 * 64];
    const struct tensor t[2] = {{"dense.c", 2, {32, 256}, SHARDOPT_PLACEMENT_DENSE, 0},
                                {"experts.w3", 3, {12, 32, 64}, SHARDOPT_PLACEMENT_EXPERT, 1}};
    for (int i = 0; i < 2; i++)
        if (register_shard(rt, &t[i], w[i], g[i], 7u + 100u * (uint32_t)i + 10u * (uint32_t)me,
                           9u + 100u * (uint32_t)i + 10u * (uint32_t)me) == 0)
            return -1;
    if (shardopt_commit(rt) != SHARDOPT_OK)
        return -1;
    *kept = rt->union_kept;
    shardopt_step_args_t a = SHARDOPT_STEP_ARGS_INIT;
    shardopt_stats_t st = SHARDOPT_STATS_INIT;
    a.lr = 0.02;
    if (shardopt_step(rt, &a) != SHARDOPT_OK)
        return -1;
    shardopt_get_stats(rt, &st);
    *most = st.ns_flops_last;
    MPI_Allreduce(MPI_IN_PLACE, most, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    shardopt_finalize(rt);
    return 0;
}

TEST(the_rules_exchange_is_the_busiest_senders_of_both_groups)
{
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    const double unit = ns_units(32, 64) * 5, dense = ns_units(32, 256) * 5;
    int kept = -1;
    double most = 0;
    /* the config's defaults, 0: the CPU's 100 GFLOP/s and 25 GB/s here (a device's 632,000 and 50
     * would price an element at 5,056 units and keep the joint plan) */
    ASSERT_EQ_INT(run_rates(0, 0, &kept, &most), 0);
    EXPECT_EQ_INT(kept, 1);
    EXPECT_NEAR(most / unit, 4.0, 1e-9);
    ASSERT_EQ_INT(run_rates(1e5, 4, &kept, &most), 0); /* 2 B x 1e5 / (4 x 5): 10,000 */
    EXPECT_EQ_INT(kept, 0);
    EXPECT_NEAR(most / (3 * unit + dense), 1.0, 1e-9);
}

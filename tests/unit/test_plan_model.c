/* shardopt-plan's model (bench/plan_model.c) prices Newton-Schulz teams as the runtime's planner
 * does. The runtime's teams iterate in the dtype ns_compute resolves to (runtime/commit.c,
 * teams_setup), bf16 on the CUDA backend since issue 22 (a bf16 Gram all-reduce: half the bytes;
 * A^2 formed on every block), and commit prices them with plan_cfg_team_dtype from that dtype and
 * its cost rates. --ns-compute device must give the same cost for the same shape and team size,
 * not fp32's (the tool priced device teams as fp32 ones before: twice the all-reduce bytes, and
 * the narrow form's FLOPs on blocks narrower than m). */
#include "bench/plan_model.h"
#include "bench/preset.h"
#include "kernels/dtype.h"
#include "kernels/ns_coeffs.h"
#include "sharding/plan.h"
#include "test.h"

static const struct machine h200 = {.name = "h200-like",
                                    .gemm_tflops = 790,
                                    .ns_fraction = 0.8,
                                    .hbm_gbps = 4300,
                                    .intra_gbps = 450,
                                    .inter_gbps = 50,
                                    .host_link_gbps = 55,
                                    .host_mem_gbps = 150,
                                    .gpus_per_node = 8};

/* shapes (rows, cols) and team sizes: a block narrower than m (the fp32 teams' narrow form),
 * wider than m, a tall matrix, an uneven split, GLM-4.5-Air's 4096 x 12288 in teams of 8 */
static const int64_t shapes[][3] = {{4096, 12288, 8}, {512, 4096, 4}, {12288, 4096, 2},
                                    {1408, 4096, 8},  {37, 29, 4},    {13, 41, 2}};
#define NSHAPES (int)(sizeof shapes / sizeof shapes[0])

static struct plan_cfg tool_cfg(int ns_compute, double gflops, double gbps)
{
    struct opts o = {.ns_compute = ns_compute, .cost_gflops = gflops, .cost_gbps = gbps};
    struct plan_cfg cfg = {0};
    plan_model_team_cfg(&o, &h200, &cfg);
    return cfg;
}

TEST(device_teams_cost_what_the_runtime_plans_for_its_bf16_teams)
{
    /* at commit's rates (--cost-rates) and at the machine's (NS rate over the node's links) */
    const double rates[2][2] = {{100, 25}, {0, 0}};
    for (int r = 0; r < 2; r++) {
        const double ns =
            rates[r][0] > 0 ? rates[r][0] : h200.gemm_tflops * 1e12 * h200.ns_fraction;
        const double link = rates[r][0] > 0 ? rates[r][1] : h200.intra_gbps * 1e9;
        /* what commit sets for teams in bf16 (the CUDA backend's) and in fp32 */
        struct plan_cfg rt16 = {0}, rt32 = {0};
        plan_cfg_team_dtype(&rt16, 1, ns, link);
        plan_cfg_team_dtype(&rt32, 0, ns, link);
        const struct plan_cfg dev = tool_cfg(-1, rates[r][0], rates[r][1]);
        const struct plan_cfg b16 = tool_cfg(KDT_BF16, rates[r][0], rates[r][1]);
        const struct plan_cfg f32 = tool_cfg(KDT_F32, rates[r][0], rates[r][1]);
        EXPECT_EQ_INT(dev.team_bf16, 1);
        EXPECT_NEAR(dev.allreduce_cost, rt16.allreduce_cost, 0.0);
        EXPECT_NEAR(b16.allreduce_cost, rt16.allreduce_cost, 0.0);
        EXPECT_NEAR(f32.allreduce_cost, rt32.allreduce_cost, 0.0);
        EXPECT_NEAR(rt32.allreduce_cost, 2.0 * rt16.allreduce_cost, 0.0);
        for (int s = 0; s < NSHAPES; s++) {
            const int64_t rows = shapes[s][0], cols = shapes[s][1];
            const int k = (int)shapes[s][2];
            const double want = plan_team_member_cost(&rt16, rows, cols, k);
            EXPECT_NEAR(plan_team_member_cost(&dev, rows, cols, k), want, 0.0);
            EXPECT_NEAR(plan_team_member_cost(&b16, rows, cols, k), want, 0.0);
            EXPECT_NEAR(plan_team_member_cost(&f32, rows, cols, k),
                        plan_team_member_cost(&rt32, rows, cols, k), 0.0);
            /* fp32's differs: its all-reduce carries twice the bytes */
            EXPECT_TRUE(plan_team_member_cost(&f32, rows, cols, k) != want);
        }
    }
    /* a bf16 team forms A^2 on a narrow block (4096 x 12288 in 8: 1536 < 4096 wide), fp32 not */
    const struct plan_cfg dev = tool_cfg(-1, 100, 25), f32 = tool_cfg(KDT_F32, 100, 25);
    const double m = 4096, nk = 1536;
    EXPECT_NEAR(plan_team_member_cost(&dev, 4096, 12288, 8) -
                    dev.allreduce_cost * plan_team_allreduce_elems(4096, 12288, 8),
                4 * m * m * nk + 2 * m * m * m, 0.0);
    EXPECT_NEAR(plan_team_member_cost(&f32, 4096, 12288, 8) -
                    f32.allreduce_cost * plan_team_allreduce_elems(4096, 12288, 8),
                6 * m * m * nk, 0.0);
}

/* The whole prediction: plan_vs_runtime's team layout (the tiny preset, 4 ranks, cp 2, teams of
 * 4 forced by --team-frac 0.01, commit's default cost rates), whose bf16 team bytes and FLOPs it
 * checks against a CPU run with ns_compute bf16. A device plans the same teams, sends the same
 * bf16 all-reduce bytes (half of fp32's) and performs the same team FLOPs. */
TEST(device_team_prediction_is_the_bf16_teams_one)
{
    struct preset p;
    char err[256];
    const struct preset_scale scale = {0, 1, 1};
    ASSERT_EQ_INT(preset_load("tiny", SHARDOPT_PRESET_DIR, &scale, &p, err, sizeof err), 0);
    struct prediction r[3]; /* device, bf16, fp32 */
    const int computes[3] = {-1, KDT_BF16, KDT_F32};
    for (int i = 0; i < 3; i++) {
        const struct opts o = {.scale = scale,
                               .rep = 1,
                               .shard = -1,
                               .cp = 2,
                               .ep = 1,
                               .mom_es = 4,
                               .adam_es = 4,
                               .offload = "none",
                               .ns_steps = NS_STEPS,
                               .ns_table = NS_TABLE_QUINTIC,
                               .ns_compute = computes[i],
                               .joint = 1,
                               .teams = 4,
                               .team_frac = 0.01,
                               .cost_gflops = 100,
                               .cost_gbps = 25};
        ASSERT_EQ_INT(plan_model_predict(&o, &p, &h200, 4, &r[i], err, sizeof err), 0);
    }
    preset_free(&p);
    ASSERT_TRUE(r[0].nteams > 0);
    EXPECT_EQ_INT(r[0].team_sizes[1], r[0].nteams); /* all teams of 4 */
    for (int i = 1; i < 3; i++) {
        EXPECT_EQ_INT(r[i].nteams, r[0].nteams);
        EXPECT_EQ_INT(r[i].team_sizes[1], r[0].team_sizes[1]);
    }
    EXPECT_NEAR(r[0].team_bytes, r[1].team_bytes, 0.0);
    EXPECT_NEAR(2.0 * r[0].team_bytes, r[2].team_bytes, 0.0);
    /* the tiny shapes run the plain variant on the CPU too: the same FLOPs as the device's */
    EXPECT_NEAR(r[0].flops_max, r[1].flops_max, 0.0);
    EXPECT_NEAR(r[0].flops_mean, r[1].flops_mean, 0.0);
    EXPECT_TRUE(r[0].flops_max != r[2].flops_max);
}

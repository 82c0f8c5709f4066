/* A Newton-Schulz team on a device (here the simulated one of devsim.h, offload = cpu: only
 * Newton-Schulz on the device) with ns_precondition = aol, whose member's device <-> host copy for
 * AOL's row scales fails (the fault site step.ns.copy stands in for the device's error). Before,
 * aol_scale's failure returned from that member alone while the rest of its team went on into the
 * next Gram all-reduce and waited there until comm_timeout_s ended the job with MPI_Abort (here
 * 20 s: the test aborts). Now the failure rides on that all-reduce, as a failed kernel's does
 * (test_ns_failed): ERR_INTERNAL on every rank, and every later step refuses with ERR_STATE,
 * nothing written. Both of AOL's copies: the block down (hit 2 of a matrix: hit 1 is the first
 * Gram matrix's copy down, which already carried its failure) and the scaled block back (hit 3).
 * And on a device whose exchanges go over MPI through the pinned host mirrors (every table the
 * simulated one, gathered Newton-Schulz): one member's copy of its blocks down to the mirror fails
 * (the fault site copy): exchange #1, replica_split's all-gather (4 ranks), exchange #2. Before,
 * that member returned ERR_DEVICE before posting its messages and every peer waited for them until
 * comm_timeout_s ended the job; now its blocks go as zeros and the Muon phase's agreement returns
 * ERR_DEVICE on every rank, later steps ERR_STATE.
 * 2 ranks in one dense group; 4 as 2 replicas of 2. */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS (devsim.h) */
#include <string.h>

#include "base/fault.h"
#include "devsim.h"
#include "step_fail.h"
#include "test.h"

#define NMAT STEP_FAIL_NMAT
#define ROWS 16
#define COLS 32

static int me, world;

struct run {
    shardopt_runtime_t rt;
    float w[NMAT][ROWS / 2 * COLS], g[NMAT][ROWS / 2 * COLS];
};

/* setup's modes: a team with AOL (TEAM_AOL), one owner per matrix (GATHER), ns_strategy =
 * sharded (SHARDED); Newton-Schulz on the device, the rest on the host (offload = cpu) */
enum { TEAM_AOL, GATHER, SHARDED };

static void setup(struct run *r, int mode)
{
    /* without the fix the team's peers wait into comm_timeout_s, then abort */
    shardopt_config_t cfg = step_fail_config();
    cfg.kernels = SHARDOPT_KERNELS_REFERENCE; /* what the simulated device computes with */
    cfg.offload = SHARDOPT_OFFLOAD_CPU;
    cfg.dp_replicate = world / 2;
    cfg.dp_shard = 2;
    cfg.replica_check_every = 1;
    if (mode == TEAM_AOL) { /* every matrix split over a team of both ranks (test_ns_teams') */
        cfg.ns_precondition = SHARDOPT_NS_PRECONDITION_AOL;
        cfg.ns_team_cap = 2;
        cfg.ns_team_frac = 0.01;
        cfg.cost_gemm_gflops = 1e-3;
        cfg.cost_net_gbps = 1e3;
    }
    cfg.ns_strategy = mode == SHARDED ? SHARDOPT_NS_STRATEGY_SHARDED : SHARDOPT_NS_STRATEGY_GATHER;
    r->rt = fixture_runtime_on(MPI_COMM_WORLD, &cfg);
    r->rt->ns_ops = &sim_ops; /* Newton-Schulz on the simulated device, before commit sizes it */
    r->rt->ns_dev = &sim_dev;
    for (int m = 0; m < NMAT; m++) {
        step_fail_fill(r->w[m], r->g[m], ROWS / 2 * COLS, m, me % 2);
        step_fail_register(r->rt, m, ROWS, COLS, 1, me % 2, r->w[m], r->g[m]);
    }
    step_fail_commit(r->rt);
}

/* Rank `who`'s `at`-th call of fault site `site` in the step fails; every rank returns `want`
 * with `words` in the message. */
static void copy_fails_on_one_rank(int mode, const char *site, int who, int at,
                                   shardopt_status_t want, const char *words)
{
    static struct run r;
    char spec[40];
    setup(&r, mode);
    const long calls = sim_shard_calls, ns_calls = sim_ns_other;
    EXPECT_EQ_INT(step_fail_step(r.rt), SHARDOPT_OK); /* a step as usual first */
    if (mode == GATHER) /* the owners' matrices did run on the device */
        EXPECT_TRUE(sim_ns_other > ns_calls);
    else /* the team's blocks, or the sharded pieces */
        EXPECT_TRUE(sim_shard_calls > calls);
    if (mode == TEAM_AOL)
        EXPECT_TRUE(r.rt->gx[GROUP_DENSE].plan.nteams > 0);
    float before[NMAT][ROWS / 2 * COLS];
    snprintf(spec, sizeof spec, "%s:%d", site, at);
    fault_arm(me == who ? spec : NULL);
    EXPECT_EQ_INT(step_fail_step(r.rt), want); /* on every rank */
    EXPECT_STR_CONTAINS(shardopt_last_error(), words);
    fault_arm(NULL);
    memcpy(before, r.w, sizeof before);
    EXPECT_EQ_INT(step_fail_step(r.rt), SHARDOPT_ERR_STATE); /* on every rank, nothing written */
    EXPECT_TRUE(strstr(shardopt_last_error(), "an earlier step failed in its Muon phase") != NULL);
    EXPECT_TRUE(memcmp(before, r.w, sizeof before) == 0);
    shardopt_finalize(r.rt);
    setup(&r, mode); /* a new runtime steps as before */
    EXPECT_EQ_INT(step_fail_step(r.rt), SHARDOPT_OK);
    shardopt_finalize(r.rt);
    EXPECT_EQ_INT(nsim, 0); /* every device allocation released */
}

TEST(an_aol_copy_failing_on_one_team_member_fails_the_step_on_every_rank)
{
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    sim_current = SIM_DEVICE; /* the trainer's thread is on the device init uses */
    const shardopt_status_t in = SHARDOPT_ERR_INTERNAL;
    /* the agreed message is the failed member's, or a peer's that read the flag */
    const char *failed = "sharded Newton-Schulz failed on";
    copy_fails_on_one_rank(TEAM_AOL, "step.ns.copy", 1, 2, in, failed); /* AOL's block down */
    copy_fails_on_one_rank(TEAM_AOL, "step.ns.copy", 0, 3, in, failed); /* ... and back */
    copy_fails_on_one_rank(TEAM_AOL, "step.ns.copy", 0, 1, in, failed); /* Gram down (before) */
    EXPECT_EQ_INT((int)sim_wrong_device, 0);
}

/* offload = cpu: Newton-Schulz's results copied back to the host (offload_ns_out) failing on one
 * rank. Before, the failure was not even seen: that rank sent (gathered) or applied (sharded)
 * whatever the host buffer held, and the step returned OK everywhere. Now the results count as a
 * zero update there and the Muon phase's agreement returns ERR_DEVICE on every rank. */
TEST(newton_schulz_results_failing_to_reach_the_host_fail_the_step_on_every_rank)
{
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    sim_current = SIM_DEVICE;
    const shardopt_status_t dv = SHARDOPT_ERR_DEVICE;
    const char *back = "copying its results to the host, failed";
    copy_fails_on_one_rank(GATHER, "copy", 1, 1, dv, back);
    copy_fails_on_one_rank(SHARDED, "copy", 0, 2, dv, back); /* matrix 1's piece */
    EXPECT_EQ_INT((int)sim_wrong_device, 0);
}

/* ---- everything on the simulated device: exchanges through the host mirrors ---- */
struct dev_run {
    shardopt_runtime_t rt;
    float *w[NMAT], *g[NMAT]; /* device */
    float hw[NMAT][ROWS / 2 * COLS];
};

static const struct kernel_ctx sim_ctx = {.threads = 1};

static void dev_setup(struct dev_run *r)
{
    /* without the fix the peers wait into comm_timeout_s, then abort */
    shardopt_config_t cfg = step_fail_config();
    cfg.kernels = SHARDOPT_KERNELS_REFERENCE;
    cfg.ns_strategy = SHARDOPT_NS_STRATEGY_GATHER;
    cfg.dp_replicate = world / 2;
    cfg.dp_shard = 2;
    cfg.replica_split = world > 2; /* the replicas share the Newton-Schulz work */
    r->rt = fixture_runtime_on(MPI_COMM_WORLD, &cfg);
    r->rt->ops = r->rt->ns_ops = &sim_ops; /* every table the simulated one, before commit */
    r->rt->dev = r->rt->ns_dev = &sim_dev;
    state_store_init(&r->rt->store, &sim_dev);
    timeline_init(&r->rt->timeline, &sim_dev, &r->rt->kctx);
    const size_t bytes = sizeof(float) * ROWS / 2 * COLS;
    for (int m = 0; m < NMAT; m++) {
        float g[ROWS / 2 * COLS];
        step_fail_fill(r->hw[m], g, ROWS / 2 * COLS, m, me % 2);
        r->w[m] = sim_alloc(bytes);
        r->g[m] = sim_alloc(bytes);
        sim_dev.copy(&sim_ctx, r->w[m], r->hw[m], bytes);
        sim_dev.copy(&sim_ctx, r->g[m], g, bytes);
        step_fail_register(r->rt, m, ROWS, COLS, 1, me % 2, r->w[m], r->g[m]);
    }
    step_fail_commit(r->rt);
}

/* the parameters as they are on the device, into hw */
static void dev_read(struct dev_run *r)
{
    for (int m = 0; m < NMAT; m++)
        sim_dev.copy(&sim_ctx, r->hw[m], r->w[m], sizeof r->hw[m]);
}

static void dev_free(struct dev_run *r)
{
    shardopt_finalize(r->rt);
    for (int m = 0; m < NMAT; m++) {
        sim_free(r->w[m]);
        sim_free(r->g[m]);
    }
}

/* Rank `who`'s `at`-th checked device copy of the step (the mirrors' copies down) fails. */
static void mirror_copy_fails_on_one_rank(int who, int at)
{
    static struct dev_run r;
    char spec[32];
    dev_setup(&r);
    EXPECT_EQ_INT(step_fail_step(r.rt), SHARDOPT_OK);
    shardopt_stats_t s = SHARDOPT_STATS_INIT;
    shardopt_get_stats(r.rt, &s);
    EXPECT_TRUE(s.bytes_sent_dense > 0); /* the matrices did travel to their owners */
    snprintf(spec, sizeof spec, "copy:%d", at);
    fault_arm(me == who ? spec : NULL);
    EXPECT_EQ_INT(step_fail_step(r.rt), SHARDOPT_ERR_DEVICE); /* on every rank */
    EXPECT_TRUE(strstr(shardopt_last_error(), "to the host failed") != NULL);
    fault_arm(NULL);
    float before[NMAT][ROWS / 2 * COLS];
    dev_read(&r);
    memcpy(before, r.hw, sizeof before);
    EXPECT_EQ_INT(step_fail_step(r.rt), SHARDOPT_ERR_STATE); /* on every rank, nothing written */
    EXPECT_TRUE(strstr(shardopt_last_error(), "an earlier step failed in its Muon phase") != NULL);
    dev_read(&r);
    EXPECT_TRUE(memcmp(before, r.hw, sizeof before) == 0);
    dev_free(&r);
    dev_setup(&r); /* a new runtime steps as before */
    EXPECT_EQ_INT(step_fail_step(r.rt), SHARDOPT_OK);
    dev_free(&r);
    EXPECT_EQ_INT(nsim, 0);
}

TEST(an_exchange_copy_failing_on_one_rank_fails_the_step_on_every_rank)
{
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    sim_current = SIM_DEVICE;
    const int copies = world > 2 ? 3 : 2; /* #1, (the all-gather), #2: one bucket */
    for (int at = 1; at <= copies; at++)
        mirror_copy_fails_on_one_rank(at % 2, at);
    EXPECT_EQ_INT((int)sim_wrong_device, 0);
}

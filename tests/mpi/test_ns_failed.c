/* A member whose sharded Newton-Schulz fails (a kernel refusing; the fault site step.ns stands
 * in for one, base/fault.h) while the rest of its group waits in the matrix's all-reduces. Before,
 * the failed rank returned ERR_INTERNAL alone and its peers waited in the Gram all-reduce it never
 * joined until comm_timeout_s ended the job with MPI_Abort (here 20 s: the test aborts). Now the
 * failure rides on the group's next all-reduce, so every member stops at the same one, the matrix
 * is left as it was in that group, the later matrices still run, and the step's agreement returns
 * ERR_INTERNAL on every rank. The other replicas applied that matrix (they learn of the failure
 * only at the agreement: test_xcheck's seed 200738 and four more, whose next step's replica check
 * found the replicas apart), so every later step refuses with ERR_STATE, nothing written, as after
 * a step that abandoned its exchanges; a new runtime steps as before. Both routes: ns_strategy =
 * sharded (runtime/step/ns_sharded.c after the exchanges) and a Newton-Schulz team (inside the
 * exchange pipeline, whose exchanges then complete with a zero update for the block). 2 ranks in
 * one dense group; 4 as 2 replicas of 2 (replica_check_every = 1). */
#include <string.h>

#include "base/fault.h"
#include "step_fail.h"
#include "test.h"

#define NMAT STEP_FAIL_NMAT
#define ROWS 16
#define COLS 32

static int me, world;

#define GATHER 2 /* setup's mode: gathered Newton-Schulz, one owner per matrix */

struct run {
    shardopt_runtime_t rt;
    float w[NMAT][ROWS / 2 * COLS], g[NMAT][ROWS / 2 * COLS];
};

static void setup(struct run *r, int teams)
{
    /* without the fix rank 1's all-reduce waits into comm_timeout_s, then aborts */
    shardopt_config_t cfg = step_fail_config();
    cfg.dp_replicate = world / 2;
    cfg.dp_shard = 2;
    cfg.replica_check_every = 1;
    if (teams == GATHER) { /* one owner per matrix */
        cfg.ns_strategy = SHARDOPT_NS_STRATEGY_GATHER;
    } else if (teams) { /* every matrix split over a team of both ranks (test_ns_teams') */
        cfg.ns_team_cap = 2;
        cfg.ns_team_frac = 0.01;
        cfg.cost_gemm_gflops = 1e-3;
        cfg.cost_net_gbps = 1e3;
    } else {
        cfg.ns_strategy = SHARDOPT_NS_STRATEGY_SHARDED;
    }
    r->rt = fixture_runtime_on(MPI_COMM_WORLD, &cfg);
    for (int m = 0; m < NMAT; m++) {
        step_fail_fill(r->w[m], r->g[m], ROWS / 2 * COLS, m, me % 2);
        /* along the long side: sharded Newton-Schulz keeps each rank's columns */
        step_fail_register(r->rt, m, ROWS, COLS, 1, me % 2, r->w[m], r->g[m]);
    }
    step_fail_commit(r->rt);
}

/* Rank `who` fails at the Gram matrix of its `at`-th iteration (of 5 per matrix), or (GATHER)
 * at the `at`-th gathered Newton-Schulz call it owns. */
static void fail_on_one_rank(int teams, int who, int at)
{
    static struct run r;
    char spec[40];
    setup(&r, teams);
    EXPECT_EQ_INT(step_fail_step(r.rt), SHARDOPT_OK); /* a step as usual first */
    shardopt_stats_t s = SHARDOPT_STATS_INIT;
    shardopt_get_stats(r.rt, &s);
    /* the matrices did run sharded (or, GATHER, were exchanged to their owners) */
    EXPECT_TRUE(teams == GATHER ? s.bytes_sent_dense > 0 : s.bytes_ns_allreduce_last > 0);
    float before[NMAT][ROWS / 2 * COLS];
    memcpy(before, r.w, sizeof before);
    snprintf(spec, sizeof spec, "%s:%d", teams == GATHER ? "step.ns.gather" : "step.ns", at);
    fault_arm(me == who ? spec : NULL);
    EXPECT_EQ_INT(step_fail_step(r.rt), SHARDOPT_ERR_INTERNAL); /* on every rank */
    EXPECT_TRUE(strstr(shardopt_last_error(), "Newton-Schulz failed") != NULL ||
                strstr(shardopt_last_error(), "Newton-Schulz refused") != NULL ||
                strstr(shardopt_last_error(), "another rank") != NULL);
    fault_arm(NULL);
    if (!teams && me / 2 == who / 2) /* matrix 0 failed in this group: not applied here */
        EXPECT_TRUE(memcmp(before[0], r.w[0], sizeof before[0]) == 0);
    if (teams != GATHER) /* which matrix the owner failed is the plan's */
        EXPECT_TRUE(memcmp(before[NMAT - 1], r.w[NMAT - 1], sizeof before[0]) != 0);
    memcpy(before, r.w, sizeof before);
    EXPECT_EQ_INT(step_fail_step(r.rt), SHARDOPT_ERR_STATE); /* on every rank, nothing written */
    EXPECT_TRUE(strstr(shardopt_last_error(), "an earlier step failed in its Muon phase") != NULL);
    EXPECT_TRUE(memcmp(before, r.w, sizeof before) == 0);
    shardopt_finalize(r.rt);
    setup(&r, teams); /* a new runtime: its communicators were never out of step either */
    EXPECT_EQ_INT(step_fail_step(r.rt), SHARDOPT_OK);
    EXPECT_EQ_INT(step_fail_step(r.rt), SHARDOPT_OK);
    shardopt_finalize(r.rt);
}

TEST(a_sharded_newton_schulz_failing_on_one_rank_fails_the_step_on_every_rank)
{
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    fail_on_one_rank(0, 0, 2); /* rank 0, matrix 0's second Gram matrix */
    fail_on_one_rank(0, 1, 1); /* rank 1, before matrix 0's first */
}

TEST(a_team_newton_schulz_failing_on_one_rank_fails_the_step_on_every_rank)
{
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    fail_on_one_rank(1, 1, 3);
    fail_on_one_rank(1, 0, 5); /* the last iteration's Gram matrix */
}

/* A gathered matrix's owner whose kernel refuses (step.ns.gather): before, it returned alone and
 * the holders of its matrices waited in exchange #2 until comm_timeout_s ended the job. Now its
 * matrices go back as a zero update and the Muon phase's agreement fails the step everywhere. */
TEST(a_gathered_newton_schulz_failing_on_its_owner_fails_the_step_on_every_rank)
{
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    fail_on_one_rank(GATHER, 1, 1); /* its first matrix of the step */
    fail_on_one_rank(GATHER, 0, 1);
}

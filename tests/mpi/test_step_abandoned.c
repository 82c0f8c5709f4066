/* A step that fails on every rank inside its exchanges over MPI (an MPI call, a Newton-Schulz
 * kernel refusing a matrix: ERR_COMM, ERR_INTERNAL) leaves messages in flight: rank 0 had posted
 * bucket 0's exchange when its next one failed, rank 1 failed before posting any. Before the fix
 * each rank returned with its requests pending: finalize freed the buffers a pending receive
 * still named (test_xcheck's devsim combos, every rank's Newton-Schulz refused: MPI completed it
 * into freed memory, heap corruption in the next combo), and a later step took the failed step's
 * message for its own, same communicator and tag: rank 1 received rank 0's stale piece and rank 0
 * waited for a second one until comm_timeout_s ended the job. Now the requests are freed unwaited,
 * their buffers kept past finalize, and every later step refuses on every rank with ERR_STATE,
 * nothing written; a new runtime steps as before. 2 ranks, one dense group. */
#include <string.h>

#include "base/fault.h"
#include "step_fail.h"
#include "test.h"

#define NMAT STEP_FAIL_NMAT
#define ROWS 8
#define COLS 16

static int me;

struct run {
    shardopt_runtime_t rt;
    float w[NMAT][ROWS / 2 * COLS], g[NMAT][ROWS / 2 * COLS];
};

static void setup(struct run *r)
{
    /* without the fix the second step waits into comm_timeout_s, then aborts */
    shardopt_config_t cfg = step_fail_config();
    cfg.bucket_bytes = 1; /* one matrix per bucket: several exchanges in flight */
    r->rt = fixture_runtime_on(MPI_COMM_WORLD, &cfg);
    for (int m = 0; m < NMAT; m++) {
        step_fail_fill(r->w[m], r->g[m], ROWS / 2 * COLS, m, me);
        step_fail_register(r->rt, m, ROWS, COLS, 0, me, r->w[m], r->g[m]);
    }
    step_fail_commit(r->rt);
}

TEST(a_step_failed_with_exchanges_in_flight_refuses_later_steps)
{
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    static struct run r;
    setup(&r);
    /* rank 0: bucket 0's exchange posted, bucket 1's start fails; rank 1: the first start fails */
    fault_arm(me == 0 ? "step.exchange:2" : "step.exchange:1");
    EXPECT_EQ_INT(step_fail_step(r.rt), SHARDOPT_ERR_COMM);
    fault_arm(NULL);
    float before[NMAT][ROWS / 2 * COLS];
    memcpy(before, r.w, sizeof before);
    const shardopt_status_t st = step_fail_step(r.rt);
    EXPECT_EQ_INT(st, SHARDOPT_ERR_STATE);
    EXPECT_TRUE(strstr(shardopt_last_error(), "an earlier step failed with exchanges in flight") !=
                NULL);
    EXPECT_TRUE(memcmp(before, r.w, sizeof before) == 0); /* nothing written */
    shardopt_finalize(r.rt);
    MPI_Barrier(MPI_COMM_WORLD); /* MPI progresses with the old requests left to it */

    setup(&r); /* new communicators: the old messages match nothing there */
    EXPECT_EQ_INT(step_fail_step(r.rt), SHARDOPT_OK);
    EXPECT_EQ_INT(step_fail_step(r.rt), SHARDOPT_OK);
    shardopt_finalize(r.rt);
}

/* The pre-pass's all-reduce of the non-finite flags over the replicate group ignored its return
 * value: a failed one left each replica acting on flags nothing had agreed (skipping or stepping
 * apart), and the step returned OK. Now it fails the step, as the dense group's all-reduce does,
 * before anything is written. The fault site step.prepass.rep stands in for the MPI failure on
 * every rank (2 ranks as 2 replicas); the next step runs. */
TEST(a_failed_replicate_prepass_allreduce_fails_the_step)
{
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    cfg.apply_env = 0;
    cfg.num_threads = 1;
    cfg.dp_replicate = 2;
    cfg.dp_shard = 1;
    cfg.comm_timeout_s = 20;
    shardopt_runtime_t rt = fixture_runtime_on(MPI_COMM_WORLD, &cfg);
    static float w[2][ROWS * COLS], g[2][ROWS * COLS], before[2][ROWS * COLS];
    for (int i = 0; i < ROWS * COLS; i++) {
        w[0][i] = w[1][i] = 0.01f * (float)(i % 11) - 0.05f;
        g[0][i] = g[1][i] = 0.02f * (float)(i % 13) - 0.12f;
    }
    shardopt_param_t h;
    shardopt_param_desc_t d = fixture_desc("layers.0.proj.weight", 2, ROWS, COLS, 1, w[0], g[0]);
    shardopt_register(rt, &d, &h);
    d = fixture_desc("layers.0.norm.weight", 1, ROWS * COLS, 1, 1, w[1], g[1]); /* AdamW */
    shardopt_register(rt, &d, &h);
    ASSERT_EQ_INT(shardopt_commit(rt), SHARDOPT_OK);
    memcpy(before, w, sizeof before);
    shardopt_step_args_t a = SHARDOPT_STEP_ARGS_INIT;
    a.lr = 0.02;
    fault_arm("step.prepass.rep:1");
    EXPECT_EQ_INT(shardopt_step(rt, &a), SHARDOPT_ERR_COMM); /* on every rank */
    fault_arm(NULL);
    EXPECT_TRUE(strstr(shardopt_last_error(), "replicate group") != NULL);
    EXPECT_TRUE(memcmp(before, w, sizeof before) == 0); /* nothing written */
    EXPECT_EQ_INT(shardopt_step(rt, &a), SHARDOPT_OK);
    EXPECT_TRUE(memcmp(before, w, sizeof before) != 0);
    shardopt_finalize(rt);
}

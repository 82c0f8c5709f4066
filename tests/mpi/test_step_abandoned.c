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
#include "fixture.h"
#include "test.h"

#define NMAT 3
#define ROWS 8
#define COLS 16

static int me;

struct run {
    shardopt_runtime_t rt;
    float w[NMAT][ROWS / 2 * COLS], g[NMAT][ROWS / 2 * COLS];
};

static void setup(struct run *r)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    cfg.apply_env = 0;
    cfg.num_threads = 1;
    cfg.bucket_bytes = 1;    /* one matrix per bucket: several exchanges in flight */
    cfg.comm_timeout_s = 20; /* without the fix the second step waits into this, then aborts */
    cfg.comm_dtype = SHARDOPT_DTYPE_FP32;
    cfg.ns_compute = SHARDOPT_NS_COMPUTE_FP32;
    r->rt = fixture_runtime_on(MPI_COMM_WORLD, &cfg);
    for (int m = 0; m < NMAT; m++) {
        char name[32];
        snprintf(name, sizeof name, "layers.%d.proj.weight", m);
        for (int i = 0; i < ROWS / 2 * COLS; i++) {
            r->w[m][i] = 0.01f * (float)((i * 7 + m * 3 + me * 5) % 11) - 0.05f;
            r->g[m][i] = 0.02f * (float)((i * 5 + m + me * 3) % 13) - 0.12f;
        }
        shardopt_param_desc_t d = fixture_desc(name, 2, ROWS, COLS, 1, r->w[m], r->g[m]);
        d.shard_dim = 0;
        d.shard_offset = me * (ROWS / 2);
        d.shard_length = ROWS / 2;
        shardopt_param_t h;
        shardopt_register(r->rt, &d, &h);
    }
    if (shardopt_commit(r->rt) != SHARDOPT_OK) {
        fprintf(stderr, "rank %d: commit: %s\n", me, shardopt_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
}

static shardopt_status_t step(struct run *r)
{
    shardopt_step_args_t a = SHARDOPT_STEP_ARGS_INIT;
    a.lr = 0.02;
    return shardopt_step(r->rt, &a);
}

TEST(a_step_failed_with_exchanges_in_flight_refuses_later_steps)
{
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    static struct run r;
    setup(&r);
    /* rank 0: bucket 0's exchange posted, bucket 1's start fails; rank 1: the first start fails */
    fault_arm(me == 0 ? "step.exchange:2" : "step.exchange:1");
    EXPECT_EQ_INT(step(&r), SHARDOPT_ERR_COMM);
    fault_arm(NULL);
    float before[NMAT][ROWS / 2 * COLS];
    memcpy(before, r.w, sizeof before);
    const shardopt_status_t st = step(&r);
    EXPECT_EQ_INT(st, SHARDOPT_ERR_STATE);
    EXPECT_TRUE(strstr(shardopt_last_error(), "an earlier step failed with exchanges in flight") !=
                NULL);
    EXPECT_TRUE(memcmp(before, r.w, sizeof before) == 0); /* nothing written */
    shardopt_finalize(r.rt);
    MPI_Barrier(MPI_COMM_WORLD); /* MPI progresses with the old requests left to it */

    setup(&r); /* new communicators: the old messages match nothing there */
    EXPECT_EQ_INT(step(&r), SHARDOPT_OK);
    EXPECT_EQ_INT(step(&r), SHARDOPT_OK);
    shardopt_finalize(r.rt);
}

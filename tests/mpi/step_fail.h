/* The set-up the tests of a step failing on some ranks share (test_ns_failed,
 * test_ns_failed_device, test_step_abandoned): a config whose waits end the job after 20 s (a
 * test run without its fix waits into that, then aborts), STEP_FAIL_NMAT matrices
 * "layers.<m>.proj.weight" split in two along one dim over a pair of ranks, their values, commit
 * or abort, and a step. Each test keeps its own sizes, modes and faults. */
#ifndef SHARDOPT_TEST_STEP_FAIL_H
#define SHARDOPT_TEST_STEP_FAIL_H

#include "fixture.h"

#define STEP_FAIL_NMAT 3

/* fp32 exchanges and Newton-Schulz, one thread, no SHARDOPT_* variables, comm_timeout_s 20 */
static inline shardopt_config_t step_fail_config(void)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    cfg.apply_env = 0;
    cfg.num_threads = 1;
    cfg.comm_timeout_s = 20;
    cfg.comm_dtype = SHARDOPT_DTYPE_FP32;
    cfg.ns_compute = SHARDOPT_NS_COMPUTE_FP32;
    return cfg;
}

/* Matrix m's piece of n elements that member `half` (0 or 1) of the pair holds: its weights w
 * and gradients g, alike on every replica */
static inline void step_fail_fill(float *w, float *g, int n, int m, int half)
{
    for (int i = 0; i < n; i++) {
        w[i] = 0.01f * (float)((i * 7 + m * 3 + half * 5) % 11) - 0.05f;
        g[i] = 0.02f * (float)((i * 5 + m + half * 3) % 13) - 0.12f;
    }
}

/* Register matrix m (rows x cols) of which this rank holds half `half` along shard_dim (0: rows,
 * 1: columns) at w and g. */
static inline void step_fail_register(shardopt_runtime_t rt, int m, int64_t rows, int64_t cols,
                                      int shard_dim, int half, void *w, const void *g)
{
    char name[32];
    snprintf(name, sizeof name, "layers.%d.proj.weight", m);
    shardopt_param_desc_t d = fixture_desc(name, 2, rows, cols, 1, w, g);
    const int64_t len = (shard_dim == 0 ? rows : cols) / 2;
    d.shard_dim = shard_dim;
    d.shard_offset = half * len;
    d.shard_length = len;
    shardopt_param_t h;
    shardopt_register(rt, &d, &h);
}

/* Commit, or end the job naming the rank and why. */
static inline void step_fail_commit(shardopt_runtime_t rt)
{
    if (shardopt_commit(rt) != SHARDOPT_OK) {
        int me;
        MPI_Comm_rank(MPI_COMM_WORLD, &me);
        fprintf(stderr, "rank %d: commit: %s\n", me, shardopt_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
}

/* One step at lr 0.02. */
static inline shardopt_status_t step_fail_step(shardopt_runtime_t rt)
{
    shardopt_step_args_t a = SHARDOPT_STEP_ARGS_INIT;
    a.lr = 0.02;
    return shardopt_step(rt, &a);
}

#endif

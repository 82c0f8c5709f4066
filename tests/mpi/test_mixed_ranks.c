/* Ranks that differ in what their machine offers, on 2 ranks:
 * - CPU kernel kinds: SHARDOPT_CPU_KERNELS_MAX=portable on rank 1 stands in for a node without
 *   AVX2/AVX-512. Where rank 0's auto picks a wider table the kinds differ, and rank 0 warns at
 *   init naming both ranks and kinds (before, nothing was said: docs/design.md, Determinism).
 *   On a CPU whose auto picks portable anyway, both ranks have one kind and nothing is warned.
 * - memory: SHARDOPT_MEM_AVAILABLE on rank 1 only stands in for a node with less memory than the
 *   state needs. Commit refuses on both ranks with one text naming rank 1, the bytes needed and
 *   available and the largest parameter; the same registration commits once it fits. Both
 *   ranks' state is summed: each fitting alone but not together is refused too. */
#include <stdlib.h>

#include "fixture.h"
#include "stderr_capture.h"

static int me;

/* rank 0's stderr during init, into a temp file; returns its text (caller frees) */
static char *init_logged(shardopt_runtime_t *rt, const shardopt_config_t *cfg)
{
    char path[256] = "";
    int saved = -1;
    if (me == 0) {
        snprintf(path, sizeof path, "%s/shardopt_mixed_XXXXXX",
                 getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
        const int fd = mkstemp(path);
        if (fd < 0) {
            perror("mkstemp");
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        close(fd);
        saved = stderr_to(path);
    }
    *rt = fixture_runtime_on(MPI_COMM_WORLD, cfg);
    char *text = NULL;
    if (me == 0) {
        stderr_back(saved);
        text = text_of(path);
        unlink(path);
    }
    return text;
}

/* both ranks' kernels names: equal or not */
static int kinds_differ(shardopt_runtime_t rt, char *k0, char *k1)
{
    shardopt_stats_t st = SHARDOPT_STATS_INIT;
    EXPECT_EQ_INT(shardopt_get_stats(rt, &st), SHARDOPT_OK);
    char both[2][32];
    MPI_Allgather(st.kernels, 32, MPI_CHAR, both, 32, MPI_CHAR, MPI_COMM_WORLD);
    memcpy(k0, both[0], 32);
    memcpy(k1, both[1], 32);
    return strcmp(both[0], both[1]) != 0;
}

static void step_once(shardopt_runtime_t rt)
{
    static float w[2][32 * 16], g[2][32 * 16];
    shardopt_param_t h;
    shardopt_param_desc_t d = fixture_desc("layers.0.w", 2, 32, 32, 0, NULL, NULL);
    ASSERT_EQ_INT(shardopt_shard_range(rt, &d, &d.shard_offset, &d.shard_length, NULL),
                  SHARDOPT_OK);
    for (int e = 0; e < 32 * 16; e++)
        w[me][e] = 0.01f * (float)(e % 7), g[me][e] = 0.001f * (float)(e % 5);
    d.data = w[me];
    d.grad = g[me];
    ASSERT_EQ_INT(shardopt_register(rt, &d, &h), SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_commit(rt), SHARDOPT_OK);
    shardopt_step_args_t a = SHARDOPT_STEP_ARGS_INIT;
    a.lr = 0.02;
    EXPECT_EQ_INT(shardopt_step(rt, &a), SHARDOPT_OK);
}

TEST(ranks_with_different_cpu_kernel_kinds_are_warned_about_on_rank_0)
{
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    cfg.apply_env = 0;
    cfg.num_threads = 1;
    if (me == 1)
        setenv("SHARDOPT_CPU_KERNELS_MAX", "portable", 1);
    shardopt_runtime_t rt = NULL;
    char *log = init_logged(&rt, &cfg);
    unsetenv("SHARDOPT_CPU_KERNELS_MAX");
    char k0[32], k1[32], want[128];
    const int differ = kinds_differ(rt, k0, k1);
    if (me == 1)
        EXPECT_TRUE(strcmp(k1, "cpu-portable") == 0);
    if (me == 0) {
        if (differ) {
            EXPECT_STR_CONTAINS(log, "the ranks run different kinds of CPU kernels");
            snprintf(want, sizeof want, "rank 0 has %s", k0);
            EXPECT_STR_CONTAINS(log, want);
            EXPECT_STR_CONTAINS(log, "rank 1 has cpu-portable");
        } else {
            fprintf(stderr, "rank 0's auto is %s too: one kind, no warning expected\n", k0);
            EXPECT_TRUE(strstr(log, "different kinds of CPU kernels") == NULL);
        }
    }
    free(log);
    step_once(rt); /* a warning, not a refusal: the job steps */
    shardopt_finalize(rt);

    /* the same job without the mask: one kind, no warning */
    log = init_logged(&rt, &cfg);
    if (me == 0)
        EXPECT_TRUE(strstr(log, "different kinds of CPU kernels") == NULL);
    free(log);
    shardopt_finalize(rt);
}

TEST(a_junk_kernels_cap_on_one_rank_fails_init_on_both_naming_it)
{
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    cfg.apply_env = 0;
    if (me == 1)
        setenv("SHARDOPT_CPU_KERNELS_MAX", "avx2 ", 1);
    shardopt_runtime_t rt = NULL;
    EXPECT_EQ_INT(shardopt_init(MPI_COMM_WORLD, &cfg, &rt), SHARDOPT_ERR_INVALID_ARGUMENT);
    unsetenv("SHARDOPT_CPU_KERNELS_MAX");
    EXPECT_TRUE(rt == NULL);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "rank 1");
    EXPECT_STR_CONTAINS(shardopt_last_error(), "SHARDOPT_CPU_KERNELS_MAX = 'avx2 '");
}

TEST(state_too_large_for_one_ranks_memory_fails_commit_on_every_rank)
{
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    cfg.apply_env = 0;
    shardopt_runtime_t rt = fixture_runtime_on(MPI_COMM_WORLD, &cfg);
    /* 64 x 32 fp32, 32 rows a rank: 4096 bytes of momentum each */
    static float w[2][64 * 32], g[2][64 * 32], b[2][64], gb[2][64];
    shardopt_param_t h, hb;
    shardopt_param_desc_t d = fixture_desc("layers.0.mlp.w", 2, 64, 32, 0, NULL, NULL);
    ASSERT_EQ_INT(shardopt_shard_range(rt, &d, &d.shard_offset, &d.shard_length, NULL),
                  SHARDOPT_OK);
    d.data = w[me];
    d.grad = g[me];
    ASSERT_EQ_INT(shardopt_register(rt, &d, &h), SHARDOPT_OK);
    shardopt_param_desc_t e = fixture_desc("layers.0.norm", 1, 64, 0, 0, NULL, NULL);
    ASSERT_EQ_INT(shardopt_shard_range(rt, &e, &e.shard_offset, &e.shard_length, NULL),
                  SHARDOPT_OK);
    e.data = b[me];
    e.grad = gb[me];
    ASSERT_EQ_INT(shardopt_register(rt, &e, &hb), SHARDOPT_OK);
    if (me == 1)
        setenv("SHARDOPT_MEM_AVAILABLE", "4000", 1);
    EXPECT_EQ_INT(shardopt_commit(rt), SHARDOPT_ERR_OUT_OF_MEMORY);
    const char *err = shardopt_last_error();
    EXPECT_STR_CONTAINS(err, "commit: rank 1: needs ");
    EXPECT_STR_CONTAINS(err, "optimizer state 4352 bytes");
    EXPECT_STR_CONTAINS(err, "bytes with this node's 2 ranks of the runtime, but 4000 bytes are "
                             "available (SHARDOPT_MEM_AVAILABLE)");
    EXPECT_STR_CONTAINS(err,
                        "most state here: 'layers.0.mlp.w' 4096 bytes, 'layers.0.norm' 256 bytes");
    /* one text on both ranks */
    char mine[1024], other[1024];
    snprintf(mine, sizeof mine, "%s", err);
    MPI_Sendrecv(mine, sizeof mine, MPI_CHAR, 1 - me, 0, other, sizeof other, MPI_CHAR, 1 - me, 0,
                 MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    EXPECT_TRUE(strcmp(mine, other) == 0);
    shardopt_step_args_t a = SHARDOPT_STEP_ARGS_INIT;
    a.lr = 0.01;
    EXPECT_EQ_INT(shardopt_step(rt, &a), SHARDOPT_ERR_STATE);
    /* each rank's need alone fits, both ranks' on this node do not: refused on both, rank 0
     * named (before, each rank compared its own need only and commit went on). The needs are
     * read from the refusals of a 1-byte machine on each rank in turn (the owner of the matrix
     * needs Newton-Schulz workspace the other does not). */
    unsigned long long need[2] = {0, 0}, node = 0;
    for (int r = 0; r < 2; r++) {
        if (me == r)
            setenv("SHARDOPT_MEM_AVAILABLE", "1", 1);
        else
            unsetenv("SHARDOPT_MEM_AVAILABLE");
        EXPECT_EQ_INT(shardopt_commit(rt), SHARDOPT_ERR_OUT_OF_MEMORY);
        const char *t = strstr(shardopt_last_error(), "needs ");
        const char *u = strstr(shardopt_last_error(), "), ");
        ASSERT_TRUE(t != NULL && u != NULL);
        EXPECT_EQ_INT(sscanf(t, "needs %llu bytes", &need[r]), 1);
        EXPECT_EQ_INT(sscanf(u, "), %llu bytes with this node's 2 ranks", &node), 1);
    }
    EXPECT_TRUE(node == need[0] + need[1]);
    char between[32];
    const unsigned long long most = need[0] > need[1] ? need[0] : need[1];
    snprintf(between, sizeof between, "%llu", most + (node - most) / 2);
    setenv("SHARDOPT_MEM_AVAILABLE", between, 1);
    EXPECT_EQ_INT(shardopt_commit(rt), SHARDOPT_ERR_OUT_OF_MEMORY);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "commit: rank 0: needs");
    EXPECT_STR_CONTAINS(shardopt_last_error(), between);
    /* the memory is there now: the same registration commits and steps */
    unsetenv("SHARDOPT_MEM_AVAILABLE");
    EXPECT_EQ_INT(shardopt_commit(rt), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_step(rt, &a), SHARDOPT_OK);
    shardopt_finalize(rt);
}

/* ranks in different collective calls (rank 0 saves while rank 1 steps; load, layout_print):
 * every call opens with an agreement of one shape carrying the call's tag, so both ranks return
 * ERR_MISMATCH naming the two calls, nothing done (before: the calls' first collectives met
 * each other, MPI_ERR_TRUNCATE ended the job, or a rank waited into comm_timeout_s and
 * MPI_Abort); the runtime steps on afterwards */
TEST(ranks_in_different_collective_calls_fail_both_naming_the_calls)
{
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    char dir[256] = "";
    if (me == 0) {
        snprintf(dir, sizeof dir, "%s/shardopt_calls_XXXXXX",
                 getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
        if (mkdtemp(dir) == NULL) {
            perror("mkdtemp");
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    cfg.apply_env = 0;
    cfg.comm_timeout_s = 120;
    shardopt_runtime_t rt = fixture_runtime_on(MPI_COMM_WORLD, &cfg);
    step_once(rt); /* registers, commits and steps once */
    shardopt_step_args_t a = SHARDOPT_STEP_ARGS_INIT;
    a.lr = 0.02;
    const struct {
        const char *calls[2], *want;
    } cases[] = {
        {{"save", "step"}, "rank 0 in shardopt_save, rank 1 in shardopt_step"},
        {{"load", "step"}, "rank 0 in shardopt_load, rank 1 in shardopt_step"},
        {{"layout_print", "step"}, "rank 0 in shardopt_layout_print, rank 1 in shardopt_step"},
        {{"save", "load"}, "rank 0 in shardopt_save, rank 1 in shardopt_load"},
        {{"step", "layout_print"}, "rank 0 in shardopt_step, rank 1 in shardopt_layout_print"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *call = cases[i].calls[me];
        const shardopt_status_t s = strcmp(call, "save") == 0   ? shardopt_save(rt, dir)
                                    : strcmp(call, "load") == 0 ? shardopt_load(rt, dir)
                                    : strcmp(call, "step") == 0 ? shardopt_step(rt, &a)
                                                                : shardopt_layout_print(rt, NULL);
        EXPECT_EQ_INT(s, SHARDOPT_ERR_MISMATCH);
        EXPECT_STR_CONTAINS(shardopt_last_error(), cases[i].want);
        EXPECT_STR_CONTAINS(shardopt_last_error(), "nothing was done");
    }
    shardopt_stats_t st = SHARDOPT_STATS_INIT;
    EXPECT_EQ_INT(shardopt_get_stats(rt, &st), SHARDOPT_OK);
    EXPECT_EQ_INT((int)st.steps, 1); /* no step was taken by the refused ones */
    /* both in the same calls again: everything works */
    EXPECT_EQ_INT(shardopt_step(rt, &a), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_save(rt, dir), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_load(rt, dir), SHARDOPT_OK);
    shardopt_finalize(rt);
    if (me == 0)
        fixture_rmtree(dir);
}

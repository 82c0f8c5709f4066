/* Allocation failure on one rank of a collective call (issue 10): on 2 ranks, only rank 1 arms
 * SHARDOPT_FAULT=alloc:<n>, for every n up to the allocations its shardopt_commit (then its
 * shardopt_save) makes. Both ranks must return the same status from that same call, out of
 * memory with the bytes in the message on both; the call retried succeeds on both, and the
 * runtimes finalize. A rank left waiting in a collective would hang the test into its timeout. */
#include <unistd.h>

#include "base/fault.h"
#include "base/mem.h"
#include "fixture.h"
#include "runtime/runtime.h"

static int rank, nranks;
static int teams; /* 1: the dense matrix forced to a Newton-Schulz team of both ranks */
static int moves; /* 1: expert_moves (the expert group planned again, then the dense group) */
static float dense_w[12 * 16], dense_g[12 * 16], exp_w[2 * 8 * 12], exp_g[2 * 8 * 12];
static float rep_w[8 * 8], rep_g[8 * 8], bias_w[8], bias_g[8];

static void data_fill(void)
{
    uint64_t s = 777 + (uint64_t)rank;
    float *a[] = {dense_w, dense_g, exp_w, exp_g, rep_w, rep_g, bias_w, bias_g};
    const size_t n[] = {12 * 16, 12 * 16, 2 * 8 * 12, 2 * 8 * 12, 64, 64, 8, 8};
    for (int k = 0; k < 8; k++)
        for (size_t i = 0; i < n[k]; i++)
            a[k][i] = (float)test_rand(&s);
}

/* A runtime over both ranks with this rank's shards of dense, expert and replicated Muon
 * tensors and an AdamW one registered. */
static shardopt_runtime_t setup(void)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    cfg.ns_team_cap = teams ? 2 : 1;
    cfg.ns_team_frac = 0.01;
    cfg.expert_moves = moves;
    shardopt_runtime_t rt = fixture_runtime_on(MPI_COMM_WORLD, &cfg);
    shardopt_param_desc_t d[4] = {
        fixture_desc("layers.0.attn.q_proj.weight", 2, 24, 16, 0, dense_w, dense_g),
        fixture_desc("layers.0.mlp.experts.w1", 3, 4, 8, 12, exp_w, exp_g),
        fixture_desc("layers.0.router.weight", 2, 8, 8, 0, rep_w, rep_g),
        fixture_desc("layers.0.norm.weight", 1, 16, 0, 0, bias_w, bias_g),
    };
    const int64_t len[4] = {12, 2, -1, 8};
    d[1].placement = SHARDOPT_PLACEMENT_EXPERT;
    d[2].placement = SHARDOPT_PLACEMENT_REPLICATED;
    for (int i = 0; i < 4; i++) {
        shardopt_param_t p;
        if (len[i] > 0) {
            d[i].shard_offset = rank * len[i];
            d[i].shard_length = len[i];
        }
        if (shardopt_register(rt, &d[i], &p) != SHARDOPT_OK) {
            fprintf(stderr, "register: %s\n", shardopt_last_error());
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    return rt;
}

enum { AT_COMMIT, AT_SAVE };

/* Run up to the call `at`, with rank 1's n-th allocation inside it failing (n = 0: none).
 * Returns this rank's allocations inside the call. */
static unsigned long run(int at, unsigned long n, const char *dir, int *injected, int *agreed)
{
    char spec[64], msg[1024];
    data_fill();
    shardopt_runtime_t rt = setup();
    shardopt_step_args_t args = SHARDOPT_STEP_ARGS_INIT;
    shardopt_status_t st;

    args.lr = 0.01;
    if (at == AT_SAVE && (shardopt_commit(rt) != SHARDOPT_OK || shardopt_step(rt, &args))) {
        fprintf(stderr, "commit/step: %s\n", shardopt_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    snprintf(spec, sizeof spec, "alloc:%lu", n);
    if (rank == 1 && n > 0)
        fault_arm(spec);
    const unsigned long before = mem_count();
    st = at == AT_COMMIT ? shardopt_commit(rt) : shardopt_save(rt, dir);
    const unsigned long made = mem_count() - before;
    if (rank == 1 && n > 0)
        fault_arm(NULL);
    snprintf(msg, sizeof msg, "%s", shardopt_last_error());
    if (teams && st == SHARDOPT_OK && rt->gx[GROUP_DENSE].plan.nteams != 1)
        TEST_FAIL_("teams: the dense matrix has no team (%d)", rt->gx[GROUP_DENSE].plan.nteams);

    int mine[2] = {(int)st, (int)st}, lo_hi[2];
    MPI_Allreduce(&mine[0], &lo_hi[0], 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&mine[1], &lo_hi[1], 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    *agreed = lo_hi[0] == lo_hi[1];
    *injected = lo_hi[0] != SHARDOPT_OK;
    if (!*agreed)
        TEST_FAIL_("%s, rank 1 alloc:%lu: rank %d returned %d (%s), statuses %d..%d",
                   at == AT_COMMIT ? "commit" : "save", n, rank, (int)st, msg, lo_hi[0], lo_hi[1]);
    if (st != SHARDOPT_OK) {
        if (st != SHARDOPT_ERR_OUT_OF_MEMORY || strstr(msg, "bytes") == NULL)
            TEST_FAIL_("%s, rank 1 alloc:%lu: rank %d returned %d: %s",
                       at == AT_COMMIT ? "commit" : "save", n, rank, (int)st, msg);
        /* rank 0 reads rank 1's message with the prefix once (it used to be doubled) */
        char twice[64];
        snprintf(twice, sizeof twice,
                 "%s: rank 1: %s: rank 1:", at == AT_COMMIT ? "commit" : "save",
                 at == AT_COMMIT ? "commit" : "save");
        if (strstr(msg, twice) != NULL)
            TEST_FAIL_("rank 1 alloc:%lu: the prefix is doubled: %s", n, msg);
        /* the runtime is still usable on both ranks */
        st = at == AT_COMMIT ? shardopt_commit(rt) : shardopt_save(rt, dir);
        if (st != SHARDOPT_OK)
            TEST_FAIL_("%s retried after rank 1 alloc:%lu: rank %d returned %d: %s",
                       at == AT_COMMIT ? "commit" : "save", n, rank, (int)st,
                       shardopt_last_error());
    }
    EXPECT_EQ_INT(shardopt_finalize(rt), SHARDOPT_OK);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0)
        fixture_rmtree(dir);
    MPI_Barrier(MPI_COMM_WORLD);
    return made;
}

static void each_allocation_of_rank_1(int at, const char *what)
{
    char dir[] = "/tmp/shardopt_alloc_fault_mpi_XXXXXX";
    int injected, agreed, failed_both = 0;
    unsigned long total;

    if (rank == 0 && mkdtemp(dir) == NULL)
        MPI_Abort(MPI_COMM_WORLD, 1);
    MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    /* counted armed past the end: cJSON's allocations then count too, as in the runs below */
    if (rank == 1)
        fault_arm("alloc:2000000000");
    run(at, 0, dir, &injected, &agreed);
    total = run(at, 0, dir, &injected, &agreed);
    fault_arm(NULL);
    MPI_Bcast(&total, 1, MPI_UNSIGNED_LONG, 1, MPI_COMM_WORLD);
    EXPECT_TRUE(total > 0);
    int failures = 0; /* enough to see the pattern: stop together */
    for (unsigned long n = 1; n <= total && failures < 20; n++) {
        run(at, n, dir, &injected, &agreed);
        failed_both += injected && agreed;
        MPI_Allreduce(&test_failures, &failures, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    }
    if (rank == 0) {
        printf("alloc faults on rank 1 in %s: %lu injection points, %d failed on both ranks with "
               "ERR_OUT_OF_MEMORY, %lu absorbed\n",
               what, total, failed_both, total - (unsigned long)failed_both);
        fixture_rmtree(dir);
    }
    /* every point failed on both ranks: also the proof that each fault was injected at all */
    EXPECT_TRUE(failed_both > 0);
    EXPECT_EQ_INT(failed_both, (int)total);
}

TEST(out_of_memory_on_rank_1_in_commit_fails_commit_on_both)
{
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    if (nranks != 2)
        test_skip("test_alloc_fault_mpi runs on 2 ranks");
    each_allocation_of_rank_1(AT_COMMIT, "commit");
}

/* The same with a Newton-Schulz team (the plan's team lists, the team sets, their
 * communicators made after the agreement) */
TEST(out_of_memory_on_rank_1_in_commit_with_teams_fails_commit_on_both)
{
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    if (nranks != 2)
        test_skip("test_alloc_fault_mpi runs on 2 ranks");
    teams = 1;
    each_allocation_of_rank_1(AT_COMMIT, "commit with teams");
    teams = 0;
}

/* The same with expert_moves and a team: the dense loads the expert group plans on, then the
 * moved expert loads and the second placement of the dense group (its scratch in the planner) */
TEST(out_of_memory_on_rank_1_in_commit_with_expert_moves_fails_commit_on_both)
{
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    if (nranks != 2)
        test_skip("test_alloc_fault_mpi runs on 2 ranks");
    teams = moves = 1;
    each_allocation_of_rank_1(AT_COMMIT, "commit with expert_moves");
    teams = moves = 0;
}

TEST(out_of_memory_on_rank_1_in_save_fails_save_on_both)
{
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    if (nranks != 2)
        test_skip("test_alloc_fault_mpi runs on 2 ranks");
    each_allocation_of_rank_1(AT_SAVE, "save");
}

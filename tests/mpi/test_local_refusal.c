/* One rank refuses a collective call on its own (a NULL argument, a call out of order) while the
 * others make their call as usual: every rank returns the same status, its message naming the
 * refusing rank (the last one) and its reason, nothing changes anywhere, and the next good call
 * works. Before, the refusing rank returned alone and the others waited in the call's opening
 * agreement until comm_timeout_s ended the job: comm_timeout_s is 300 here and the test's CTest
 * TIMEOUT lower (120), so such a hang fails as a timeout. Each TEST can be run alone by name. */
#include <stdlib.h>

#include "fixture.h"

#define ROWS 16
#define COLS 8

static int me, world, last;

struct job {
    shardopt_runtime_t rt;
    float w[ROWS * COLS], g[ROWS * COLS], b[COLS], gb[COLS];
    shardopt_param_t hw, hb;
};

static shardopt_config_t job_config(void)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    cfg.apply_env = 0;
    cfg.num_threads = 1;
    cfg.comm_timeout_s = 300; /* a hang outlasts the CTest TIMEOUT: it fails as a timeout */
    return cfg;
}

static void who(void)
{
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    last = world - 1;
}

/* init and register a Muon matrix (rows over the ranks) and an AdamW vector (whole) */
static void job_start(struct job *j)
{
    const shardopt_config_t cfg = job_config();
    memset(j, 0, sizeof *j);
    j->rt = fixture_runtime_on(MPI_COMM_WORLD, &cfg);
    for (int i = 0; i < ROWS * COLS; i++)
        j->w[i] = 0.01f * (float)((i * 7 + me) % 11) - 0.05f, j->g[i] = 0.001f * (float)(i % 13);
    for (int i = 0; i < COLS; i++)
        j->b[i] = 1.0f, j->gb[i] = 0.01f * (float)i;
    shardopt_param_desc_t d = fixture_desc("layers.0.w", 2, ROWS, COLS, 0, j->w, j->g);
    ASSERT_EQ_INT(shardopt_shard_range(j->rt, &d, &d.shard_offset, &d.shard_length, NULL),
                  SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_register(j->rt, &d, &j->hw), SHARDOPT_OK);
    shardopt_param_desc_t e = fixture_desc("layers.0.norm", 1, COLS, 0, 0, j->b, j->gb);
    e.placement = SHARDOPT_PLACEMENT_REPLICATED;
    ASSERT_EQ_INT(shardopt_register(j->rt, &e, &j->hb), SHARDOPT_OK);
}

static void job_commit(struct job *j) { ASSERT_EQ_INT(shardopt_commit(j->rt), SHARDOPT_OK); }

static shardopt_step_args_t job_args(void)
{
    shardopt_step_args_t a = SHARDOPT_STEP_ARGS_INIT;
    a.lr = 0.02;
    return a;
}

static uint64_t job_steps(const struct job *j)
{
    shardopt_stats_t st = SHARDOPT_STATS_INIT;
    EXPECT_EQ_INT(shardopt_get_stats(j->rt, &st), SHARDOPT_OK);
    return st.steps;
}

/* what every rank must see: the status, and a message naming the last rank and `reason` */
static void expect_refused(shardopt_status_t got, shardopt_status_t want, const char *reason)
{
    char rank[32];
    snprintf(rank, sizeof rank, "rank %d", last);
    EXPECT_EQ_INT(got, want);
    EXPECT_STR_CONTAINS(shardopt_last_error(), rank);
    EXPECT_STR_CONTAINS(shardopt_last_error(), reason);
}

/* the weights as they were (a snapshot taken before the refused call) */
static void expect_unchanged(const struct job *j, const float *w, const float *b)
{
    EXPECT_TRUE(memcmp(j->w, w, sizeof j->w) == 0);
    EXPECT_TRUE(memcmp(j->b, b, sizeof j->b) == 0);
}

/* a directory every rank names: rank 0 makes it */
static void shared_dir(char *dir, size_t len)
{
    if (me == 0) {
        snprintf(dir, len, "%s/shardopt_refusal_XXXXXX",
                 getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
        if (mkdtemp(dir) == NULL) {
            perror("mkdtemp");
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    MPI_Bcast(dir, (int)len, MPI_CHAR, 0, MPI_COMM_WORLD);
}

/* rank 0: whether dir/latest exists (a save published something) */
static int published(const char *dir)
{
    char p[512];
    snprintf(p, sizeof p, "%s/latest", dir);
    int there = me == 0 && access(p, F_OK) == 0;
    MPI_Bcast(&there, 1, MPI_INT, 0, MPI_COMM_WORLD);
    return there;
}

TEST(init_with_a_null_rt_p_on_one_rank_fails_on_every_rank)
{
    who();
    const shardopt_config_t cfg = job_config();
    shardopt_runtime_t rt = NULL;
    expect_refused(shardopt_init(MPI_COMM_WORLD, &cfg, me == last ? NULL : &rt),
                   SHARDOPT_ERR_INVALID_ARGUMENT, "NULL rt_p");
    EXPECT_TRUE(rt == NULL);
    ASSERT_EQ_INT(shardopt_init(MPI_COMM_WORLD, &cfg, &rt), SHARDOPT_OK);
    shardopt_finalize(rt);
}

TEST(init_from_groups_with_a_null_rt_p_on_one_rank_fails_on_every_rank)
{
    who();
    const shardopt_config_t cfg = job_config();
    shardopt_groups_t gr = SHARDOPT_GROUPS_INIT;
    gr.dense_shard = MPI_COMM_WORLD;
    shardopt_runtime_t rt = NULL;
    expect_refused(shardopt_init_from_groups(&gr, &cfg, me == last ? NULL : &rt),
                   SHARDOPT_ERR_INVALID_ARGUMENT, "NULL rt_p");
    EXPECT_TRUE(rt == NULL);
    ASSERT_EQ_INT(shardopt_init_from_groups(&gr, &cfg, &rt), SHARDOPT_OK);
    shardopt_finalize(rt);
}

TEST(commit_twice_on_one_rank_fails_the_others_step)
{
    who();
    struct job j;
    job_start(&j);
    job_commit(&j);
    float w[ROWS * COLS], b[COLS];
    memcpy(w, j.w, sizeof w);
    memcpy(b, j.b, sizeof b);
    shardopt_step_args_t a = job_args();
    expect_refused(me == last ? shardopt_commit(j.rt) : shardopt_step(j.rt, &a), SHARDOPT_ERR_STATE,
                   "already committed");
    expect_unchanged(&j, w, b);
    EXPECT_TRUE(job_steps(&j) == 0);
    EXPECT_EQ_INT(shardopt_step(j.rt, &a), SHARDOPT_OK);
    EXPECT_TRUE(job_steps(&j) == 1);
    shardopt_finalize(j.rt);
}

TEST(step_with_null_args_on_one_rank_fails_on_every_rank)
{
    who();
    struct job j;
    job_start(&j);
    job_commit(&j);
    float w[ROWS * COLS], b[COLS];
    memcpy(w, j.w, sizeof w);
    memcpy(b, j.b, sizeof b);
    shardopt_step_args_t a = job_args();
    expect_refused(shardopt_step(j.rt, me == last ? NULL : &a), SHARDOPT_ERR_INVALID_ARGUMENT,
                   "NULL args");
    expect_unchanged(&j, w, b);
    EXPECT_TRUE(job_steps(&j) == 0);
    EXPECT_EQ_INT(shardopt_step(j.rt, &a), SHARDOPT_OK);
    EXPECT_TRUE(job_steps(&j) == 1);
    shardopt_finalize(j.rt);
}

/* the rank skipped commit: its step meets the others' commit, which must not go on without it */
TEST(step_before_commit_on_one_rank_fails_the_others_commit)
{
    who();
    struct job j;
    job_start(&j);
    shardopt_step_args_t a = job_args();
    expect_refused(me == last ? shardopt_step(j.rt, &a) : shardopt_commit(j.rt), SHARDOPT_ERR_STATE,
                   "not committed");
    EXPECT_EQ_INT(shardopt_step(j.rt, &a), SHARDOPT_ERR_STATE); /* no rank committed */
    job_commit(&j);
    EXPECT_EQ_INT(shardopt_step(j.rt, &a), SHARDOPT_OK);
    shardopt_finalize(j.rt);
}

TEST(save_before_commit_on_one_rank_fails_the_others_commit)
{
    who();
    char dir[256];
    shared_dir(dir, sizeof dir);
    struct job j;
    job_start(&j);
    expect_refused(me == last ? shardopt_save(j.rt, dir) : shardopt_commit(j.rt),
                   SHARDOPT_ERR_STATE, "not committed");
    EXPECT_TRUE(!published(dir));
    job_commit(&j);
    EXPECT_EQ_INT(shardopt_save(j.rt, dir), SHARDOPT_OK);
    EXPECT_TRUE(published(dir));
    shardopt_finalize(j.rt);
    if (me == 0)
        fixture_rmtree(dir);
}

TEST(save_with_a_null_dir_on_one_rank_fails_on_every_rank)
{
    who();
    char dir[256];
    shared_dir(dir, sizeof dir);
    struct job j;
    job_start(&j);
    job_commit(&j);
    expect_refused(shardopt_save(j.rt, me == last ? NULL : dir), SHARDOPT_ERR_INVALID_ARGUMENT,
                   "NULL dir");
    EXPECT_TRUE(!published(dir));
    EXPECT_EQ_INT(shardopt_save(j.rt, dir), SHARDOPT_OK);
    EXPECT_TRUE(published(dir));
    shardopt_finalize(j.rt);
    if (me == 0)
        fixture_rmtree(dir);
}

/* not a hang before either (each rank checks its own dir after the opening agreement): kept
 * beside the others as the refusal of a bad path on one rank only */
TEST(save_with_an_empty_dir_on_one_rank_fails_on_every_rank)
{
    who();
    char dir[256];
    shared_dir(dir, sizeof dir);
    struct job j;
    job_start(&j);
    job_commit(&j);
    expect_refused(shardopt_save(j.rt, me == last ? "" : dir), SHARDOPT_ERR_INVALID_ARGUMENT,
                   "dir is empty");
    EXPECT_TRUE(!published(dir));
    EXPECT_EQ_INT(shardopt_save(j.rt, dir), SHARDOPT_OK);
    shardopt_finalize(j.rt);
    if (me == 0)
        fixture_rmtree(dir);
}

TEST(load_with_a_null_dir_on_one_rank_fails_on_every_rank)
{
    who();
    char dir[256];
    shared_dir(dir, sizeof dir);
    struct job j;
    job_start(&j);
    job_commit(&j);
    ASSERT_EQ_INT(shardopt_save(j.rt, dir), SHARDOPT_OK);
    shardopt_step_args_t a = job_args();
    ASSERT_EQ_INT(shardopt_step(j.rt, &a), SHARDOPT_OK);
    float w[ROWS * COLS], b[COLS];
    memcpy(w, j.w, sizeof w);
    memcpy(b, j.b, sizeof b);
    /* only rank 0's dir is read: the last rank's NULL was not looked at */
    expect_refused(shardopt_load(j.rt, me == last ? NULL : dir), SHARDOPT_ERR_INVALID_ARGUMENT,
                   "NULL dir");
    expect_unchanged(&j, w, b);
    EXPECT_TRUE(job_steps(&j) == 1);
    EXPECT_EQ_INT(shardopt_load(j.rt, dir), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_step(j.rt, &a), SHARDOPT_OK);
    shardopt_finalize(j.rt);
    if (me == 0)
        fixture_rmtree(dir);
}

TEST(load_before_commit_on_one_rank_fails_the_others_commit)
{
    who();
    char dir[256];
    shared_dir(dir, sizeof dir);
    struct job j;
    job_start(&j);
    job_commit(&j);
    ASSERT_EQ_INT(shardopt_save(j.rt, dir), SHARDOPT_OK);
    shardopt_finalize(j.rt);
    job_start(&j);
    expect_refused(me == last ? shardopt_load(j.rt, dir) : shardopt_commit(j.rt),
                   SHARDOPT_ERR_STATE, "not committed");
    job_commit(&j);
    EXPECT_EQ_INT(shardopt_load(j.rt, dir), SHARDOPT_OK);
    shardopt_finalize(j.rt);
    if (me == 0)
        fixture_rmtree(dir);
}

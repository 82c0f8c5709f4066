/* Step arguments that differ between ranks (a scheduler stepped twice on one rank, a trainer bug):
 * each scalar argument, and a parameter's step count, differing on the last rank only fails the
 * step on every rank with SHARDOPT_ERR_MISMATCH naming the argument, both ranks and both values,
 * with nothing written anywhere; the next consistent step goes ahead. Layout from
 * SHARDOPT_TEST_LAYOUT (a replicate group too on 4 ranks: the check spans both groups). A save's
 * dir refused on one rank only, or naming another directory there, fails that save on every
 * rank alike. */
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model_run.h"
#include "test.h"

static shardopt_config_t quiet_cfg(void)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    cfg.num_threads = 1;
    cfg.comm_timeout_s = 60; /* a build without the check hangs in mismatched collectives */
    return cfg;
}

static shardopt_step_args_t args_at(void)
{
    shardopt_step_args_t a = SHARDOPT_STEP_ARGS_INIT;
    a.lr = 0.02;
    a.adamw_lr = 0.01;
    a.weight_decay = 0.1;
    a.momentum = 0.9;
    a.max_grad_norm = 5.0;
    a.adamw_beta1 = 0.85;
    a.adamw_beta2 = 0.99;
    a.adamw_eps = 1e-6;
    return a;
}

/* One case: the last rank changes one argument; what every rank's message must contain. */
struct arg_case {
    const char *name;
    void (*change)(shardopt_step_args_t *a);
    const char *expect; /* the argument and the two values, as the message prints them */
};

static void ch_lr(shardopt_step_args_t *a) { a->lr = 0.04; }
static void ch_adamw_lr(shardopt_step_args_t *a) { a->adamw_lr = 0.03; }
static void ch_wd(shardopt_step_args_t *a) { a->weight_decay = 0.2; }
static void ch_momentum(shardopt_step_args_t *a) { a->momentum = 0.95; }
static void ch_beta1(shardopt_step_args_t *a) { a->adamw_beta1 = 0.8; }
/* -1: the config's 0.95, compared as it takes effect */
static void ch_beta2(shardopt_step_args_t *a) { a->adamw_beta2 = -1; }
static void ch_eps(shardopt_step_args_t *a) { a->adamw_eps = 1e-8; }
static void ch_clip(shardopt_step_args_t *a) { a->max_grad_norm = 0; }
static void ch_skip(shardopt_step_args_t *a) { a->skip_missing_grads = 1; }
/* the last bit of lr: what a float32 round-trip in one rank's scheduler does */
static void ch_lr_ulp(shardopt_step_args_t *a) { a->lr = nextafter(a->lr, 1.0); }

static const struct arg_case cases[] = {
    {"lr", ch_lr, "args.lr differs between ranks: rank 0 has 0.02, rank %d has 0.04"},
    {"adamw_lr", ch_adamw_lr,
     "args.adamw_lr (in effect: a negative value is lr) differs between "
     "ranks: rank 0 has 0.01, rank %d has 0.03"},
    {"weight_decay", ch_wd,
     "args.weight_decay (Muon's, in effect: a negative value is the "
     "config's weight_decay) differs between ranks: rank 0 has 0.1, rank %d "
     "has 0.2"},
    {"momentum", ch_momentum,
     "args.momentum (in effect: a negative value is the config's "
     "momentum) differs between ranks: rank 0 has 0.9, rank %d has 0.95"},
    {"adamw_beta1", ch_beta1,
     "args.adamw_beta1 (in effect: a negative value is the config's adamw_beta1) differs "
     "between ranks: rank %d has 0.8, rank 0 has 0.85"},
    {"adamw_beta2", ch_beta2,
     "args.adamw_beta2 (in effect: a negative value is the config's adamw_beta2) differs "
     "between ranks: rank %d has 0.95, rank 0 has 0.99"},
    {"adamw_eps", ch_eps,
     "args.adamw_eps (in effect: a negative value is the config's adamw_eps) differs "
     "between ranks: rank %d has 1e-08, rank 0 has 1e-06"},
    {"max_grad_norm", ch_clip,
     "args.max_grad_norm (in effect: <= 0 is no clipping) differs between "
     "ranks: rank %d has 0, rank 0 has 5"},
    {"skip_missing_grads", ch_skip,
     "args.skip_missing_grads differs between ranks: rank 0 has 0, "
     "rank %d has 1"},
    {"lr (last bit)", ch_lr_ulp,
     "args.lr differs between ranks: rank 0 has 0.02, rank %d has "
     "0.020000000000000004"},
};

static int same_everywhere(const unsigned char *a, size_t na, const unsigned char *b, size_t nb)
{
    int same = na == nb && memcmp(a, b, na) == 0;
    MPI_Allreduce(MPI_IN_PLACE, &same, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return same;
}

TEST(each_argument_differing_on_one_rank_fails_every_rank_with_nothing_written)
{
    setup();
    const int last = world - 1;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        struct run r = {0};
        ASSERT_EQ_INT(run_setup(&r, MPI_COMM_WORLD, quiet_cfg(), 0), SHARDOPT_OK);
        shardopt_step_args_t a = args_at();
        run_grads(&r, 1, 0);
        ASSERT_EQ_INT(shardopt_step(r.rt, &a), SHARDOPT_OK);
        unsigned char *before, *after;
        size_t nb, na;
        snapshot(&r, &before, &nb);
        run_grads(&r, 2, 0);
        if (me == last)
            cases[c].change(&a);
        const shardopt_status_t st = shardopt_step(r.rt, &a);
        if (st != SHARDOPT_ERR_MISMATCH)
            printf("  case %s: status %d on rank %d\n", cases[c].name, (int)st, me);
        EXPECT_EQ_INT(st, SHARDOPT_ERR_MISMATCH);
        char want[512];
        snprintf(want, sizeof want, cases[c].expect, last);
        EXPECT_STR_CONTAINS(shardopt_last_error(), want);
        EXPECT_STR_CONTAINS(shardopt_last_error(), "nothing was updated");
        snapshot(&r, &after, &na);
        EXPECT_TRUE(same_everywhere(before, nb, after, na));
        shardopt_stats_t s = SHARDOPT_STATS_INIT;
        shardopt_get_stats(r.rt, &s);
        EXPECT_EQ_INT(s.steps, 1);
        /* the next step with the same arguments everywhere goes ahead and changes the weights */
        a = args_at();
        EXPECT_EQ_INT(shardopt_step(r.rt, &a), SHARDOPT_OK);
        free(after);
        snapshot(&r, &after, &na);
        EXPECT_TRUE(!same_everywhere(before, nb, after, na) || nb == 0);
        free(before);
        free(after);
        run_free(&r);
    }
}

TEST(a_step_count_set_on_one_rank_only_is_named)
{
    setup();
    struct run r = {0};
    ASSERT_EQ_INT(run_setup(&r, MPI_COMM_WORLD, quiet_cfg(), 0), SHARDOPT_OK);
    shardopt_step_args_t a = args_at();
    run_grads(&r, 1, 0);
    ASSERT_EQ_INT(shardopt_step(r.rt, &a), SHARDOPT_OK);
    unsigned char *before, *after;
    size_t nb, na;
    snapshot(&r, &before, &nb);
    /* parameter 3: a trainer restoring its own state set the count on one rank only */
    if (me == world - 1)
        EXPECT_EQ_INT(shardopt_param_set_step(r.h[3], 7), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_step(r.rt, &a), SHARDOPT_ERR_MISMATCH);
    char want[512];
    snprintf(want, sizeof want,
             "the step count of parameter '%s' differs between ranks: rank 0 has 1, "
             "rank %d has 7",
             model_params[3].name, world - 1);
    EXPECT_STR_CONTAINS(shardopt_last_error(), want);
    snapshot(&r, &after, &na);
    EXPECT_TRUE(same_everywhere(before, nb, after, na));
    /* set alike again: the step goes ahead */
    EXPECT_EQ_INT(shardopt_param_set_step(r.h[3], 7), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_step(r.rt, &a), SHARDOPT_OK);
    free(before);
    free(after);
    run_free(&r);
}

TEST(two_spellings_of_the_same_step_agree)
{
    setup();
    struct run r = {0};
    ASSERT_EQ_INT(run_setup(&r, MPI_COMM_WORLD, quiet_cfg(), 0), SHARDOPT_OK);
    shardopt_step_args_t a = SHARDOPT_STEP_ARGS_INIT;
    a.lr = 0.02;
    run_grads(&r, 1, 0);
    if (me == world - 1) { /* the defaults written out: the same step */
        a.adamw_lr = 0.02;
        a.weight_decay = -5; /* any negative: the config's */
        a.momentum = 0.95;   /* the config's */
        a.adamw_beta1 = 0.9; /* the config's */
        a.adamw_eps = -3;
        a.max_grad_norm = -1;
        a.stream = &a; /* a per-rank pointer; ignored on the CPU and not compared */
    }
    EXPECT_EQ_INT(shardopt_step(r.rt, &a), SHARDOPT_OK);
    EXPECT_EQ_INT(run_steps(&r, 2, 2), SHARDOPT_OK);
    run_free(&r);
}

/* shardopt_save with a dir refused on the last rank only (empty, then over 3000 bytes: a path
 * built from a per-rank variable that is unset or runs away there). Before: that rank returned
 * at once and went on to its next call while the others were in the save's collectives
 * (mismatched MPI messages, then a hang until comm_timeout_s); now every rank returns the same
 * refusal, nothing is published, and the next save with the same dir everywhere succeeds. */
TEST(a_save_dir_refused_on_one_rank_fails_the_save_on_every_rank)
{
    setup();
    struct run r = {0};
    ASSERT_EQ_INT(run_setup(&r, MPI_COMM_WORLD, quiet_cfg(), 0), SHARDOPT_OK);
    shardopt_step_args_t a = args_at();
    run_grads(&r, 1, 0);
    ASSERT_EQ_INT(shardopt_step(r.rt, &a), SHARDOPT_OK);
    char dir[64] = "/tmp/shardopt_savedir_XXXXXX", want[128], step_dir[96];
    /* rank 0's mkdtemp, every rank its name: rank 0's pid named it before, which another run's
     * (another PID namespace sharing /tmp) could share, and the test began by removing it */
    if (me == 0 && mkdtemp(dir) == NULL) {
        perror("mkdtemp");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    snprintf(step_dir, sizeof step_dir, "%s/step-00000001", dir);
    static char longp[3100];
    memset(longp, 'd', sizeof longp - 1);
    longp[0] = '/';
    const char *bad[2] = {"", longp};
    const char *says[2] = {"dir is empty", "directory path of 3099 bytes: at most 3000"};
    for (int c = 0; c < 2; c++) {
        const shardopt_status_t st = shardopt_save(r.rt, me == world - 1 ? bad[c] : dir);
        EXPECT_EQ_INT(st, SHARDOPT_ERR_INVALID_ARGUMENT);
        snprintf(want, sizeof want, "save: rank %d: %s", world - 1, says[c]);
        EXPECT_STR_CONTAINS(shardopt_last_error(), want);
        struct stat sb;
        EXPECT_TRUE(stat(step_dir, &sb) != 0); /* nothing published */
    }
    /* a writing rank (rank 1: replica 0 in both layouts) given another directory that exists:
     * the temporary directory rank 0 made is not under it; the message says why */
    char other[80];
    snprintf(other, sizeof other, "%s_other", dir);
    if (me == 1)
        ASSERT_TRUE(mkdir(other, 0755) == 0);
    EXPECT_EQ_INT(shardopt_save(r.rt, me == 1 ? other : dir), SHARDOPT_ERR_IO);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "save: rank 1: ");
    EXPECT_STR_CONTAINS(shardopt_last_error(), "every writing rank's dir must name that directory");
    struct stat sb;
    EXPECT_TRUE(stat(step_dir, &sb) != 0);
    if (me == 1)
        fixture_rmtree(other);
    EXPECT_EQ_INT(shardopt_save(r.rt, dir), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_load(r.rt, dir), SHARDOPT_OK);
    MPI_Barrier(MPI_COMM_WORLD);
    if (me == 0)
        fixture_rmtree(dir);
    run_free(&r);
}

/* Calls on one runtime from two threads at once (docs/api.md, Threads: they must not overlap) are
 * refused with SHARDOPT_ERR_STATE naming both calls, before the second reads anything; the
 * first goes on undisturbed. Before: nothing checked it, and two Python threads stepping one
 * Optimizer returned OK from every step with the weights NaN. */
#include <math.h>
#include <pthread.h>

#include "fixture.h"
#include "runtime/runtime.h"

#define N 32
static float w[N * N], g[N * N], b[N], gb[N];

static shardopt_runtime_t make(float *wm, float *bv, shardopt_param_t *pw, shardopt_param_t *pb)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    cfg.num_threads = 1;
    shardopt_runtime_t rt = fixture_runtime(&cfg);
    for (int i = 0; i < N * N; i++) {
        wm[i] = 0.01f * (float)(i % 13) - 0.06f;
        g[i] = 0.002f * (float)(i % 7) - 0.006f;
    }
    for (int i = 0; i < N; i++) {
        bv[i] = 1.0f;
        gb[i] = 0.01f * (float)(i % 5);
    }
    shardopt_param_desc_t dw = fixture_desc("m.weight", 2, N, N, 0, wm, g);
    shardopt_param_desc_t db = fixture_desc("m.bias", 1, N, 0, 0, bv, gb);
    if (shardopt_register(rt, &dw, pw) != SHARDOPT_OK ||
        shardopt_register(rt, &db, pb) != SHARDOPT_OK || shardopt_commit(rt) != SHARDOPT_OK)
        fprintf(stderr, "setup: %s\n", shardopt_last_error());
    return rt;
}

/* Another thread's call in progress, held open here (rt_claim is what each call takes first):
 * every call that reads or writes the runtime is refused, naming it, and changes nothing. */
TEST(a_call_while_another_runs_on_the_runtime_is_refused_naming_it)
{
    shardopt_param_t pw, pb;
    shardopt_runtime_t rt = make(w, b, &pw, &pb);
    shardopt_step_args_t args = SHARDOPT_STEP_ARGS_INIT;
    args.lr = 0.02;
    ASSERT_EQ_INT(shardopt_step(rt, &args), SHARDOPT_OK);
    float m[N * N];
    ASSERT_EQ_INT(
        shardopt_param_get_state(pw, SHARDOPT_STATE_MOMENTUM, m, sizeof m, SHARDOPT_DTYPE_FP32),
        SHARDOPT_OK);
    float w0[N * N];
    memcpy(w0, w, sizeof w0);
    /* a fresh directory that holds the save's: the refused save must make nothing in it */
    char root[64] = "/tmp/shardopt_threads_XXXXXX", dir[96];
    ASSERT_TRUE(mkdtemp(root) != NULL);
    snprintf(dir, sizeof dir, "%s/ckpt", root);

    ASSERT_EQ_INT(rt_claim(rt, "step"), SHARDOPT_OK); /* "the other thread" is in a step */
    const char *says = "shardopt_step is running on this runtime in another thread";
    EXPECT_EQ_INT(shardopt_step(rt, &args), SHARDOPT_ERR_STATE);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "step: shardopt_step is running");
    EXPECT_EQ_INT(shardopt_save(rt, dir), SHARDOPT_ERR_STATE);
    EXPECT_STR_CONTAINS(shardopt_last_error(), says);
    EXPECT_EQ_INT(shardopt_load(rt, dir), SHARDOPT_ERR_STATE);
    EXPECT_STR_CONTAINS(shardopt_last_error(), says);
    EXPECT_EQ_INT(
        shardopt_param_set_state(pw, SHARDOPT_STATE_MOMENTUM, m, sizeof m, SHARDOPT_DTYPE_FP32),
        SHARDOPT_ERR_STATE);
    EXPECT_STR_CONTAINS(shardopt_last_error(), says);
    EXPECT_EQ_INT(
        shardopt_param_get_state(pw, SHARDOPT_STATE_MOMENTUM, m, sizeof m, SHARDOPT_DTYPE_FP32),
        SHARDOPT_ERR_STATE);
    EXPECT_EQ_INT(shardopt_param_set_step(pb, 5), SHARDOPT_ERR_STATE);
    EXPECT_EQ_INT(shardopt_param_set_pointers(pb, b, gb), SHARDOPT_ERR_STATE);
    EXPECT_EQ_INT(shardopt_params_set_pointers(rt, 1, &pb, (void *const[]){b}, NULL),
                  SHARDOPT_ERR_STATE);
    FILE *out = tmpfile(); /* the refused layout_print prints nothing */
    ASSERT_TRUE(out != NULL);
    EXPECT_EQ_INT(shardopt_layout_print(rt, out), SHARDOPT_ERR_STATE);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "layout_print: shardopt_step is running");
    EXPECT_TRUE(ftell(out) == 0);
    EXPECT_EQ_INT(shardopt_finalize(rt), SHARDOPT_ERR_STATE); /* would free what it uses */
    EXPECT_STR_CONTAINS(shardopt_last_error(), "finalize: shardopt_step is running");
    struct stat st;
    EXPECT_TRUE(stat(dir, &st) != 0); /* the refused save made nothing */
    EXPECT_TRUE(memcmp(w0, w, sizeof w0) == 0);
    uint64_t s = 0;
    EXPECT_EQ_INT(shardopt_param_get_step(pb, &s), SHARDOPT_OK); /* a read of one word */
    EXPECT_EQ_INT((int)s, 1);
    rt_release(rt);

    /* that call over: every call goes ahead */
    EXPECT_EQ_INT(shardopt_param_set_step(pb, 1), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_step(rt, &args), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_save(rt, dir), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_load(rt, dir), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_layout_print(rt, out), SHARDOPT_OK);
    EXPECT_TRUE(ftell(out) > 0);
    fclose(out);
    EXPECT_EQ_INT(shardopt_finalize(rt), SHARDOPT_OK);
    fixture_rmtree(root);
}

struct stepper {
    shardopt_runtime_t rt;
    int ok, refused, other;
};

static void *steps(void *arg)
{
    struct stepper *s = arg;
    shardopt_step_args_t args = SHARDOPT_STEP_ARGS_INIT;
    args.lr = 0.02;
    for (int i = 0; i < 100; i++) {
        const shardopt_status_t st = shardopt_step(s->rt, &args);
        if (st == SHARDOPT_OK)
            s->ok++;
        else if (st == SHARDOPT_ERR_STATE &&
                 strstr(shardopt_last_error(), "is running on this runtime in another thread"))
            s->refused++;
        else
            s->other++;
    }
    return NULL;
}

/* Two threads stepping one runtime: each step either runs whole or is refused, and the weights
 * equal those of as many steps taken one after another on a second runtime, bit for bit. */
TEST(two_threads_stepping_one_runtime_give_the_bits_of_the_steps_taken)
{
    shardopt_param_t pw, pb;
    shardopt_runtime_t rt = make(w, b, &pw, &pb);
    struct stepper s[2] = {{rt, 0, 0, 0}, {rt, 0, 0, 0}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        ASSERT_TRUE(pthread_create(&t[i], NULL, steps, &s[i]) == 0);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    EXPECT_EQ_INT(s[0].other + s[1].other, 0);
    shardopt_stats_t st = SHARDOPT_STATS_INIT;
    ASSERT_EQ_INT(shardopt_get_stats(rt, &st), SHARDOPT_OK);
    EXPECT_EQ_INT((int)st.steps, s[0].ok + s[1].ok);

    static float w2[N * N], b2[N];
    shardopt_param_t qw, qb;
    shardopt_runtime_t ref = make(w2, b2, &qw, &qb);
    shardopt_step_args_t args = SHARDOPT_STEP_ARGS_INIT;
    args.lr = 0.02;
    for (uint64_t i = 0; i < st.steps; i++)
        ASSERT_EQ_INT(shardopt_step(ref, &args), SHARDOPT_OK);
    EXPECT_TRUE(memcmp(w, w2, sizeof w) == 0);
    EXPECT_TRUE(memcmp(b, b2, sizeof b) == 0);
    EXPECT_TRUE(isfinite(w[0]) && isfinite(b[0]));
    EXPECT_EQ_INT(shardopt_finalize(rt), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_finalize(ref), SHARDOPT_OK);
}

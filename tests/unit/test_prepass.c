/* The step's pre-pass on one process: the global gradient norm, clipping folded into the kernels
 * (a clipped step equals an unclipped one on gradients pre-scaled by the same fp32 factor), and
 * NaN/Inf gradients skipping or failing the step with nothing written. */
#include "fixture.h"
#include "kernels/dtype.h"

enum { NW = 24 * 40, NB = 40 };

struct two {
    shardopt_runtime_t rt;
    float w[NW], g[NW], b[NB], gb[NB];
};

static void two_setup(struct two *t, shardopt_config_t cfg, float gscale)
{
    uint64_t seed = 99;
    for (int i = 0; i < NW; i++) {
        t->w[i] = (float)test_rand(&seed);
        t->g[i] = (float)test_rand(&seed) * gscale;
    }
    for (int i = 0; i < NB; i++) {
        t->b[i] = (float)test_rand(&seed);
        t->gb[i] = (float)test_rand(&seed) * gscale;
    }
    t->rt = fixture_runtime(&cfg);
    shardopt_param_desc_t d = fixture_desc("w", 2, 24, 40, 0, t->w, t->g);
    shardopt_param_desc_t db = fixture_desc("b", 1, NB, 0, 0, t->b, t->gb);
    shardopt_param_t h;
    shardopt_register(t->rt, &d, &h);
    shardopt_register(t->rt, &db, &h);
    shardopt_commit(t->rt);
}

TEST(norm_is_the_global_l2_norm)
{
    static struct two t;
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    two_setup(&t, cfg, 1.0f);
    double ss = 0;
    for (int i = 0; i < NW; i++)
        ss += (double)t.g[i] * t.g[i];
    for (int i = 0; i < NB; i++)
        ss += (double)t.gb[i] * t.gb[i];
    shardopt_step_args_t a = SHARDOPT_STEP_ARGS_INIT;
    a.lr = 0.01;
    ASSERT_EQ_INT(shardopt_step(t.rt, &a), SHARDOPT_OK);
    shardopt_stats_t st = SHARDOPT_STATS_INIT;
    shardopt_get_stats(t.rt, &st);
    EXPECT_NEAR(st.grad_norm_last, sqrt(ss), 1e-12 * sqrt(ss));
    shardopt_finalize(t.rt);
}

TEST(clipping_equals_prescaled_gradients_bitwise)
{
    static struct two c, p;
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    two_setup(&c, cfg, 1.0f);
    shardopt_step_args_t a = SHARDOPT_STEP_ARGS_INIT;
    a.lr = 0.01;
    a.max_grad_norm = 0.5;
    ASSERT_EQ_INT(shardopt_step(c.rt, &a), SHARDOPT_OK);
    shardopt_stats_t st = SHARDOPT_STATS_INIT;
    shardopt_get_stats(c.rt, &st);
    EXPECT_TRUE(st.grad_norm_last > 0.5);
    const float scale = (float)(0.5 / (st.grad_norm_last + 1e-6));

    two_setup(&p, cfg, 1.0f);
    for (int i = 0; i < NW; i++)
        p.g[i] *= scale;
    for (int i = 0; i < NB; i++)
        p.gb[i] *= scale;
    a.max_grad_norm = 0;
    ASSERT_EQ_INT(shardopt_step(p.rt, &a), SHARDOPT_OK);
    EXPECT_TRUE(memcmp(c.w, p.w, sizeof c.w) == 0);
    EXPECT_TRUE(memcmp(c.b, p.b, sizeof c.b) == 0);
    /* and clipping did something: not the unclipped result */
    static struct two u;
    two_setup(&u, cfg, 1.0f);
    ASSERT_EQ_INT(shardopt_step(u.rt, &a), SHARDOPT_OK);
    EXPECT_TRUE(memcmp(c.b, u.b, sizeof c.b) != 0);
    /* a norm below the limit leaves the gradients as they are */
    static struct two q;
    two_setup(&q, cfg, 1.0f);
    a.max_grad_norm = 1e9;
    ASSERT_EQ_INT(shardopt_step(q.rt, &a), SHARDOPT_OK);
    EXPECT_TRUE(memcmp(q.w, u.w, sizeof q.w) == 0);
    shardopt_finalize(c.rt);
    shardopt_finalize(p.rt);
    shardopt_finalize(u.rt);
    shardopt_finalize(q.rt);
}

TEST(nonfinite_gradient_skips_or_fails_with_nothing_written)
{
    for (int mode = 0; mode < 2; mode++) {
        static struct two t;
        shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
        cfg.nonfinite = mode ? SHARDOPT_NONFINITE_ERROR : SHARDOPT_NONFINITE_SKIP;
        two_setup(&t, cfg, 1.0f);
        float w0[NW], b0[NB];
        memcpy(w0, t.w, sizeof w0);
        memcpy(b0, t.b, sizeof b0);
        t.gb[7] = mode ? -INFINITY : NAN;
        shardopt_step_args_t a = SHARDOPT_STEP_ARGS_INIT;
        a.lr = 0.01;
        shardopt_status_t status = shardopt_step(t.rt, &a);
        shardopt_stats_t st = SHARDOPT_STATS_INIT;
        shardopt_get_stats(t.rt, &st);
        EXPECT_EQ_INT(status, mode ? SHARDOPT_ERR_NONFINITE : SHARDOPT_OK);
        EXPECT_EQ_INT(st.steps, 0);
        EXPECT_STR_CONTAINS(st.nonfinite_params, "b");
        EXPECT_TRUE(memcmp(w0, t.w, sizeof w0) == 0 && memcmp(b0, t.b, sizeof b0) == 0);
        if (mode)
            EXPECT_STR_CONTAINS(shardopt_last_error(), "NaN/Inf gradients in 1 tensor(s): b");
        else
            EXPECT_EQ_INT(st.steps_skipped, 1);
        shardopt_finalize(t.rt);
    }
}

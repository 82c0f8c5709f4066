/* Multi-step AdamW through the public API, against the update rule computed in double here. */
#include "fixture.h"
#include "kernels/dtype.h"
#include "runtime/runtime.h"
#include "step_tensor.h"

#define NP 3

static double get(const void *p, shardopt_dtype_t dt, size_t i) { return kload(p, dt, i); }

TEST(adamw_multi_step_matches_the_formula)
{
    struct step_tensor t[NP] = {
        {.name = "layers.0.norm.weight",
         .ndim = 1,
         .shape = {37, 1},
         .pdt = SHARDOPT_DTYPE_FP32,
         .gdt = SHARDOPT_DTYPE_FP32,
         .lr_mult = 1.0,
         .wd_mult = 0.0},
        {.name = "layers.0.attn.q.bias",
         .ndim = 1,
         .shape = {1000, 1},
         .pdt = SHARDOPT_DTYPE_BF16,
         .gdt = SHARDOPT_DTYPE_BF16,
         .lr_mult = 0.5,
         .wd_mult = 2.0},
        {.name = "model.embed_tokens.weight",
         .ndim = 2,
         .shape = {50, 16},
         .pdt = SHARDOPT_DTYPE_FP32,
         .gdt = SHARDOPT_DTYPE_BF16,
         .lr_mult = 1.0,
         .wd_mult = 1.0},
    };
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    cfg.adamw_weight_decay = 0.1;
    cfg.weight_decay_1d = 1; /* the bias's wd_mult is part of the formula tested */
    shardopt_runtime_t rt = fixture_runtime(&cfg);
    uint64_t seed = 42;
    double *m[NP], *v[NP]; /* reference state */

    for (int k = 0; k < NP; k++) {
        ASSERT_EQ_INT(step_tensor_register(rt, &t[k], 1.0, &seed), SHARDOPT_OK);
        m[k] = calloc(t[k].n, sizeof(double));
        v[k] = calloc(t[k].n, sizeof(double));
        shardopt_algo_t algo;
        shardopt_param_get_algo(t[k].h, &algo);
        EXPECT_EQ_INT(algo, SHARDOPT_ALGO_ADAMW);
    }
    ASSERT_EQ_INT(shardopt_commit(rt), SHARDOPT_OK);

    for (int step = 1; step <= 6; step++) {
        shardopt_step_args_t args = SHARDOPT_STEP_ARGS_INIT;
        args.lr = 0.01 / step;
        if (step == 4)
            args.adamw_lr = 0.003; /* AdamW-only override */
        if (step == 5)
            args.weight_decay = 0.5; /* per-call override */
        double lr = args.adamw_lr >= 0 ? args.adamw_lr : args.lr;
        double wd = args.weight_decay >= 0 ? args.weight_decay : cfg.adamw_weight_decay;
        double bc1 = 1 - pow(0.9, step), bc2 = 1 - pow(0.95, step);

        for (int k = 0; k < NP; k++) {
            void *g = t[k].g[step & 1];
            for (size_t i = 0; i < t[k].n; i++)
                step_put(g, t[k].gdt, i, test_rand(&seed) * (i % 7 == 0 ? 1e-6 : 1.0));
            EXPECT_EQ_INT(shardopt_param_set_pointers(t[k].h, t[k].w, g), SHARDOPT_OK);
        }
        /* expected value of each weight from this step's starting point */
        double *expect[NP];
        for (int k = 0; k < NP; k++) {
            const void *g = t[k].g[step & 1];
            double lre = lr * t[k].lr_mult, wde = wd * t[k].wd_mult;
            expect[k] = malloc(t[k].n * sizeof(double));
            for (size_t i = 0; i < t[k].n; i++) {
                double gi = get(g, t[k].gdt, i);
                m[k][i] = 0.9 * m[k][i] + 0.1 * gi;
                v[k][i] = 0.95 * v[k][i] + 0.05 * gi * gi;
                double upd = (m[k][i] / bc1) / (sqrt(v[k][i] / bc2) + 1e-8);
                expect[k][i] = get(t[k].w, t[k].pdt, i) * (1 - lre * wde) - lre * upd;
            }
        }
        ASSERT_EQ_INT(shardopt_step(rt, &args), SHARDOPT_OK);
        for (int k = 0; k < NP; k++) {
            double lre = lr * t[k].lr_mult;
            for (size_t i = 0; i < t[k].n; i++) {
                double got = get(t[k].w, t[k].pdt, i), want = expect[k][i];
                /* fp32: a few ulps of the weight plus fp32 error in the update (size ~lr);
                 * bf16: the final rounding, half an ulp (2^-9 relative), plus the same */
                double tol =
                    (t[k].pdt == SHARDOPT_DTYPE_BF16 ? 0.0040 : 4e-7) * fabs(want) + 2e-5 * lre;
                EXPECT_NEAR(got, want, tol);
            }
            free(expect[k]);
        }
    }
    shardopt_stats_t st = SHARDOPT_STATS_INIT;
    EXPECT_EQ_INT(shardopt_get_stats(rt, &st), SHARDOPT_OK);
    EXPECT_EQ_INT(st.steps, 6);
    EXPECT_EQ_INT(st.num_adamw, 3);
    EXPECT_EQ_INT(st.bytes_adam_m, (37 + 1000 + 800) * 4);
    EXPECT_EQ_INT(st.bytes_adam_v, (37 + 1000 + 800) * 4);
    EXPECT_EQ_INT(st.bytes_momentum, 0);
    shardopt_finalize(rt);
    for (int k = 0; k < NP; k++) {
        step_tensor_free(&t[k]);
        free(m[k]);
        free(v[k]);
    }
}

TEST(adamw_first_step_is_a_signed_lr_step)
{
    /* With zero state, bias correction makes step 1 W - lr * g / (|g| + eps): about lr * sign(g).
     */
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    cfg.adamw_weight_decay = 0;
    shardopt_runtime_t rt = fixture_runtime(&cfg);
    float w[4] = {1, 1, 1, 1}, g[4] = {3, -0.25f, 1e-3f, -40};
    shardopt_param_desc_t d = fixture_desc("bias", 1, 4, 0, 0, w, g);
    shardopt_param_t h;
    shardopt_step_args_t args = SHARDOPT_STEP_ARGS_INIT;
    args.lr = 0.125;
    ASSERT_EQ_INT(shardopt_register(rt, &d, &h), SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_commit(rt), SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_step(rt, &args), SHARDOPT_OK);
    for (int i = 0; i < 4; i++)
        EXPECT_NEAR(w[i], 1.0 - 0.125 * (g[i] > 0 ? 1 : -1), 1e-5);
    shardopt_finalize(rt);
}

/* bf16 moments: each rounded once per step, the update uses the stored (rounded) values; the
 * state takes half the bytes. Checked against the rule computed here in double. */
TEST(adamw_bf16_moments)
{
    enum { N = 333 };
    static float w[N], g[N];
    double m[N] = {0}, v[N] = {0};
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    cfg.adam_state_dtype = SHARDOPT_DTYPE_BF16;
    cfg.adam_v_dtype = SHARDOPT_DTYPE_BF16;
    cfg.adamw_weight_decay = 0;
    shardopt_runtime_t rt = fixture_runtime(&cfg);
    shardopt_param_desc_t d = fixture_desc("norm.weight", 1, N, 0, 0, w, g);
    shardopt_param_t h;
    uint64_t seed = 5;
    for (int i = 0; i < N; i++)
        w[i] = (float)test_rand(&seed);
    ASSERT_EQ_INT(shardopt_register(rt, &d, &h), SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_commit(rt), SHARDOPT_OK);
    for (int step = 1; step <= 4; step++) {
        double want[N];
        const double bc1 = 1 - pow(0.9, step), bc2 = 1 - pow(0.95, step);
        for (int i = 0; i < N; i++) {
            g[i] = (float)test_rand(&seed);
            m[i] = f32_from_bf16(bf16_from_f32((float)(0.9 * m[i] + 0.1 * g[i])));
            v[i] = f32_from_bf16(bf16_from_f32((float)(0.95 * v[i] + 0.05 * g[i] * g[i])));
            want[i] = w[i] - 0.01 / bc1 * m[i] / (sqrt(v[i] / bc2) + 1e-8);
        }
        shardopt_step_args_t a = SHARDOPT_STEP_ARGS_INIT;
        a.lr = 0.01;
        ASSERT_EQ_INT(shardopt_step(rt, &a), SHARDOPT_OK);
        const uint16_t *ms = state_store_ptr(&rt->store, h->off_exp_avg);
        const uint16_t *vs = state_store_ptr(&rt->store, h->off_exp_avg_sq);
        for (int i = 0; i < N; i++) {
            /* one bf16 ulp where double and fp32 arithmetic round the sum differently */
            EXPECT_NEAR(f32_from_bf16(ms[i]), m[i], fabs(m[i]) / 128 + 1e-30);
            EXPECT_NEAR(f32_from_bf16(vs[i]), v[i], fabs(v[i]) / 128 + 1e-30);
            m[i] = f32_from_bf16(ms[i]); /* follow the library's stored state */
            v[i] = f32_from_bf16(vs[i]);
            EXPECT_NEAR(w[i], want[i], 0.01 * 0.02 + 1e-6 * fabs(want[i]));
        }
    }
    shardopt_stats_t st = SHARDOPT_STATS_INIT;
    shardopt_get_stats(rt, &st);
    EXPECT_EQ_INT(st.bytes_adam_m, N * 2);
    EXPECT_EQ_INT(st.bytes_adam_v, N * 2);
    shardopt_finalize(rt);
}

/* The usual convention: no weight decay on 1-D tensors (norms, biases) unless weight_decay_1d.
 * A norm at 1.0 with zero gradient stays exactly 1.0 over 100 steps by default (it was 0.98
 * before: (1 - lr * wd)^100 with lr 0.02, wd 0.01), while a 2-D AdamW tensor still decays; with
 * weight_decay_1d = 1 the norm decays as the formula says. */
TEST(no_weight_decay_on_1d_tensors_by_default)
{
    for (int decay_1d = 0; decay_1d < 2; decay_1d++) {
        static float norm[16], gnorm[16], emb[4 * 8], gemb[4 * 8];
        for (int i = 0; i < 16; i++)
            norm[i] = 1.0f;
        for (int i = 0; i < 32; i++)
            emb[i] = 1.0f;
        shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
        cfg.weight_decay_1d = decay_1d;
        shardopt_runtime_t rt = fixture_runtime(&cfg);
        shardopt_param_desc_t d = fixture_desc("final_norm.weight", 1, 16, 0, 0, norm, gnorm);
        shardopt_param_t h;
        ASSERT_EQ_INT(shardopt_register(rt, &d, &h), SHARDOPT_OK);
        d = fixture_desc("embed.weight", 2, 4, 8, 0, emb, gemb);
        ASSERT_EQ_INT(shardopt_register(rt, &d, &h), SHARDOPT_OK);
        ASSERT_EQ_INT(shardopt_commit(rt), SHARDOPT_OK);
        shardopt_step_args_t args = SHARDOPT_STEP_ARGS_INIT;
        args.lr = 0.02;
        for (int s = 0; s < 100; s++)
            ASSERT_EQ_INT(shardopt_step(rt, &args), SHARDOPT_OK);
        const double decayed = pow(1 - 0.02 * 0.01, 100); /* 0.98020 */
        EXPECT_NEAR(norm[0], decay_1d ? decayed : 1.0, decay_1d ? 1e-5 : 0.0);
        EXPECT_NEAR(norm[15], decay_1d ? decayed : 1.0, decay_1d ? 1e-5 : 0.0);
        EXPECT_NEAR(emb[0], decayed, 1e-5);
        shardopt_finalize(rt);
    }
}

/* param_stats = 1 keeps a copy of every shard before the update, one after another in one
 * buffer: after a bf16 tensor of odd length the next fp32 copy started 2 bytes off its alignment
 * (a misaligned load in the step, which the sanitizer build's UBSan reports). The update RMS of
 * each tensor is still what its change says. */
TEST(param_stats_copies_after_an_odd_bf16_tensor_stay_aligned)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    cfg.param_stats = 1;
    shardopt_runtime_t rt = fixture_runtime(&cfg);
    uint16_t wb[3], gb[3];
    float w[8 * 16], g[8 * 16], before[8 * 16];
    for (int i = 0; i < 3; i++) {
        wb[i] = 0x3f80; /* 1.0 */
        gb[i] = 0x3c23; /* 0.01 */
    }
    for (int i = 0; i < 8 * 16; i++) {
        w[i] = before[i] = 0.01f * (float)(i % 7) - 0.03f;
        g[i] = 0.02f * (float)(i % 5) - 0.04f;
    }
    shardopt_param_desc_t a = fixture_desc("norm.weight", 1, 3, 0, 0, wb, gb);
    a.param_dtype = a.grad_dtype = SHARDOPT_DTYPE_BF16;
    shardopt_param_desc_t m = fixture_desc("layers.0.q.weight", 2, 8, 16, 0, w, g);
    shardopt_param_t ha = NULL, hm = NULL;
    ASSERT_EQ_INT(shardopt_register(rt, &a, &ha), SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_register(rt, &m, &hm), SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_commit(rt), SHARDOPT_OK);
    shardopt_step_args_t args = SHARDOPT_STEP_ARGS_INIT;
    args.lr = 0.02;
    ASSERT_EQ_INT(shardopt_step(rt, &args), SHARDOPT_OK);
    shardopt_param_stats_t ps = SHARDOPT_PARAM_STATS_INIT;
    ASSERT_EQ_INT(shardopt_param_get_stats(hm, &ps), SHARDOPT_OK);
    double sum = 0;
    for (int i = 0; i < 8 * 16; i++)
        sum += ((double)w[i] - before[i]) * ((double)w[i] - before[i]);
    EXPECT_TRUE(sum > 0);
    EXPECT_NEAR(ps.update_rms, sqrt(sum / (8 * 16)), 1e-12);
    shardopt_finalize(rt);
}

/* args.adamw_beta1 / beta2 / eps (version 4) are this step's, as torch.optim.AdamW reads its
 * group's betas and eps at every step (OneCycleLR cycling beta1): a first step with (0.8, 0.99,
 * 1e-6) in the args writes the bits of a runtime configured with them; after it, each step's
 * betas and eps (and the config's for < 0, and for a version 3 struct, which has no such fields)
 * drive the moments and the bias correction 1 - beta^t of the double reference. Out-of-range
 * values are refused by name with nothing written. */
TEST(step_betas_and_eps_override_the_config)
{
    enum { N = 300 };
    static float wa[N], wb[N], g[N], before[N], m[N], v[N];
    double rw[N], rm[N] = {0}, rv[N] = {0};
    uint64_t seed = 11;
    for (int i = 0; i < N; i++) {
        wa[i] = wb[i] = (float)test_rand(&seed);
        rw[i] = wb[i];
    }
    shardopt_config_t ca = SHARDOPT_CONFIG_INIT, cb = SHARDOPT_CONFIG_INIT;
    ca.adamw_beta1 = 0.8;
    ca.adamw_beta2 = 0.99;
    ca.adamw_eps = 1e-6;
    shardopt_runtime_t ra = fixture_runtime(&ca), rb = fixture_runtime(&cb);
    shardopt_param_desc_t da = fixture_desc("b.bias", 1, N, 1, 0, wa, g);
    shardopt_param_desc_t db = fixture_desc("b.bias", 1, N, 1, 0, wb, g);
    shardopt_param_t ha, hb;
    ASSERT_EQ_INT(shardopt_register(ra, &da, &ha), SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_register(rb, &db, &hb), SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_commit(ra), SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_commit(rb), SHARDOPT_OK);
    shardopt_step_args_t a = SHARDOPT_STEP_ARGS_INIT, b = SHARDOPT_STEP_ARGS_INIT;
    EXPECT_TRUE(b.adamw_beta1 < 0 && b.adamw_beta2 < 0 && b.adamw_eps < 0);
    /* step 1 as a runtime configured with them; steps 2.. a cycled beta1, the config's (< 0), a
     * beta2 and eps of the step's, and a version 3 struct (the config's: fields past its size) */
    const double sched[6][3] = {{0.8, 0.99, 1e-6}, {0.85, 0.99, 1e-6}, {0.95, -1, -1},
                                {-1, -1, -1},      {0.5, 0.6, 1e-3},   {0.3, 0.2, 1e-2}};
    for (int s = 0; s < 6; s++) {
        for (int i = 0; i < N; i++)
            g[i] = (float)(test_rand(&seed) * (i % 5 == 0 ? 1e-4 : 1.0));
        b.lr = a.lr = 0.01;
        b.adamw_beta1 = sched[s][0];
        b.adamw_beta2 = sched[s][1];
        b.adamw_eps = sched[s][2];
        double b1 = b.adamw_beta1 < 0 ? 0.9 : b.adamw_beta1;
        double b2 = b.adamw_beta2 < 0 ? 0.95 : b.adamw_beta2;
        double eps = b.adamw_eps < 0 ? 1e-8 : b.adamw_eps;
        if (s == 5) {
            b.version = 3;
            b.size = offsetof(shardopt_step_args_t, adamw_beta1);
            b1 = 0.9, b2 = 0.95, eps = 1e-8;
        }
        const double t = s + 1, lr = 0.01;
        for (int i = 0; i < N; i++) {
            rm[i] = b1 * rm[i] + (1 - b1) * g[i];
            rv[i] = b2 * rv[i] + (1 - b2) * (double)g[i] * g[i];
            /* no decay: a 1-D tensor without weight_decay_1d */
            rw[i] -= lr / (1 - pow(b1, t)) * rm[i] / (sqrt(rv[i]) / sqrt(1 - pow(b2, t)) + eps);
        }
        ASSERT_EQ_INT(shardopt_step(rb, &b), SHARDOPT_OK);
        if (s == 0) {
            ASSERT_EQ_INT(shardopt_step(ra, &a), SHARDOPT_OK);
            EXPECT_TRUE(memcmp(wa, wb, sizeof wa) == 0);
        }
    }
    ASSERT_EQ_INT(
        shardopt_param_get_state(hb, SHARDOPT_STATE_EXP_AVG, m, sizeof m, SHARDOPT_DTYPE_FP32),
        SHARDOPT_OK);
    ASSERT_EQ_INT(
        shardopt_param_get_state(hb, SHARDOPT_STATE_EXP_AVG_SQ, v, sizeof v, SHARDOPT_DTYPE_FP32),
        SHARDOPT_OK);
    double em = 0, ev = 0, ew = 0;
    for (int i = 0; i < N; i++) {
        em = fmax(em, fabs(m[i] - rm[i]) / (fabs(rm[i]) + 1e-6));
        ev = fmax(ev, fabs(v[i] - rv[i]) / (fabs(rv[i]) + 1e-12));
        ew = fmax(ew, fabs(wb[i] - rw[i]) / (fabs(rw[i]) + 0.01)); /* lr: an update's size */
    }
    EXPECT_TRUE(em < 1e-5);
    EXPECT_TRUE(ev < 1e-5);
    EXPECT_TRUE(ew < 1e-5);
    b = (shardopt_step_args_t)SHARDOPT_STEP_ARGS_INIT;
    b.lr = 0.01;
    memcpy(before, wb, sizeof wb);
    const struct {
        double *field, value;
        const char *text;
    } bad[] = {{&b.adamw_beta1, 1.0, "adamw_beta1 = 1: accepted"},
               {&b.adamw_beta1, NAN, "adamw_beta1 = nan"},
               {&b.adamw_beta2, 1.5, "adamw_beta2 = 1.5"},
               {&b.adamw_beta2, -INFINITY, "adamw_beta2 = -inf"},
               {&b.adamw_eps, 0.0,
                "adamw_eps = 0: accepted a finite value < 0 (the config's) "
                "or a value in (0, 1]"},
               {&b.adamw_eps, 2.0, "adamw_eps = 2"},
               {&b.adamw_eps, INFINITY, "adamw_eps = inf"}};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        *bad[k].field = bad[k].value;
        EXPECT_EQ_INT(shardopt_step(rb, &b), SHARDOPT_ERR_INVALID_ARGUMENT);
        EXPECT_STR_CONTAINS(shardopt_last_error(), bad[k].text);
        EXPECT_TRUE(memcmp(before, wb, sizeof wb) == 0);
        *bad[k].field = -1.0;
    }
    shardopt_finalize(ra);
    shardopt_finalize(rb);
}

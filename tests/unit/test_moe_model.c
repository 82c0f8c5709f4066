/* The training demo's hand-written backward (examples/moe_train/model.c) against central finite
 * differences of its own forward: for every parameter tensor, the directional derivative along
 * a random direction within that tensor. A wrong term in any tensor's gradient shows there by
 * name. Also: the loss returned equals the one computed from moe_forward. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../examples/moe_train/model.h"
#include "test.h"

static const struct moe_dims dims = {
    .vocab = 11, .hidden = 8, .ffn = 6, .experts = 4, .topk = 2, .out = 5};
enum { NTOK = 24 };

static double rnd(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(*s >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

/* the loss in double from a forward pass */
static double loss_of(struct moe_model *m, const int *tok, const float *target)
{
    float y[NTOK * 5];
    double l = 0;
    moe_forward(m, tok, NTOK, y);
    for (int i = 0; i < NTOK * dims.out; i++)
        l += 0.5 * ((double)y[i] - target[i]) * ((double)y[i] - target[i]);
    return l / (NTOK * dims.out);
}

TEST(backward_matches_finite_differences_for_every_tensor)
{
    struct moe_model m;
    ASSERT_EQ_INT(moe_model_init(&m, &dims, 7, NTOK), 0);
    uint64_t s = 99;
    int tok[NTOK];
    float target[NTOK * 5];
    for (int t = 0; t < NTOK; t++)
        tok[t] = (int)((rnd(&s) + 1.0) * 0.5 * dims.vocab) % dims.vocab;
    for (int i = 0; i < NTOK * dims.out; i++)
        target[i] = (float)rnd(&s);
    /* norms and biases away from their initial 1 and 0, so their gradients are generic */
    for (int p = 0; p < MOE_NPARAMS; p++)
        if (m.p[p].ndim == 1)
            for (int64_t j = 0; j < m.p[p].numel; j++)
                m.p[p].w[j] += 0.3f * (float)rnd(&s);

    moe_zero_grad(&m);
    const double l = moe_forward_backward(&m, tok, NTOK, target, NTOK);
    EXPECT_CLOSE(l, loss_of(&m, tok, target), 1e-6, 0);

    double worst = 0;
    for (int p = 0; p < MOE_NPARAMS; p++) {
        struct moe_tensor *t = &m.p[p];
        float *w0 = malloc(sizeof(float) * (size_t)t->numel);
        double *dir = malloc(sizeof(double) * (size_t)t->numel), analytic = 0;
        memcpy(w0, t->w, sizeof(float) * (size_t)t->numel);
        for (int64_t j = 0; j < t->numel; j++) {
            dir[j] = rnd(&s);
            analytic += dir[j] * t->g[j];
        }
        const double eps = 1e-2;
        for (int64_t j = 0; j < t->numel; j++)
            t->w[j] = (float)(w0[j] + eps * dir[j]);
        const double lp = loss_of(&m, tok, target);
        for (int64_t j = 0; j < t->numel; j++)
            t->w[j] = (float)(w0[j] - eps * dir[j]);
        const double lm = loss_of(&m, tok, target);
        memcpy(t->w, w0, sizeof(float) * (size_t)t->numel);
        const double numeric = (lp - lm) / (2 * eps);
        const double rel = fabs(numeric - analytic) / fmax(fabs(numeric), 1e-4);
        worst = fmax(worst, rel);
        if (rel > 2e-2)
            TEST_FAIL_("%s: analytic %.6e, finite differences %.6e (relative %.2e)", t->name,
                       analytic, numeric, rel);
        test_checks++;
        free(w0);
        free(dir);
    }
    printf("  %d tensors, worst relative difference %.2e\n", MOE_NPARAMS, worst);
    moe_model_free(&m);
}

TEST(gradients_add_over_token_shards)
{
    /* the sum of two halves' gradients (each scaled by the whole count) is the whole's */
    struct moe_model a, b;
    ASSERT_EQ_INT(moe_model_init(&a, &dims, 3, NTOK), 0);
    ASSERT_EQ_INT(moe_model_init(&b, &dims, 3, NTOK), 0);
    uint64_t s = 5;
    int tok[NTOK];
    float target[NTOK * 5];
    for (int t = 0; t < NTOK; t++)
        tok[t] = t % dims.vocab;
    for (int i = 0; i < NTOK * dims.out; i++)
        target[i] = (float)rnd(&s);
    moe_zero_grad(&a);
    moe_zero_grad(&b);
    const double whole = moe_forward_backward(&a, tok, NTOK, target, NTOK);
    const double h1 = moe_forward_backward(&b, tok, NTOK / 2, target, NTOK);
    const double h2 =
        moe_forward_backward(&b, tok + NTOK / 2, NTOK / 2, target + NTOK / 2 * dims.out, NTOK);
    EXPECT_CLOSE(h1 + h2, whole, 1e-5, 0);
    for (int p = 0; p < MOE_NPARAMS; p++)
        for (int64_t j = 0; j < a.p[p].numel; j++)
            EXPECT_CLOSE(b.p[p].g[j], a.p[p].g[j], 1e-4, 1e-7);
    moe_model_free(&a);
    moe_model_free(&b);
}

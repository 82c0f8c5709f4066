/* Which algorithm a parameter gets, and the shapes that are refused. */
#include "fixture.h"

static float buf[4096];

/* The resolved algorithm, or -1 when registration failed. */
static int algo_of(shardopt_runtime_t rt, const char *name, int ndim, int64_t d0, int64_t d1,
                   int64_t d2, shardopt_algo_t force)
{
    shardopt_param_desc_t d = fixture_desc(name, ndim, d0, d1, d2, buf, buf);
    shardopt_param_t p = NULL;
    shardopt_algo_t a = SHARDOPT_ALGO_AUTO;
    d.algo = force;
    if (shardopt_register(rt, &d, &p) != SHARDOPT_OK)
        return -1;
    shardopt_param_get_algo(p, &a);
    return (int)a;
}

TEST(auto_sends_matrices_to_muon_and_the_rest_to_adamw)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_runtime_t rt = fixture_runtime(&cfg);
    const shardopt_algo_t A = SHARDOPT_ALGO_AUTO;

    EXPECT_EQ_INT(algo_of(rt, "layers.0.attn.q.weight", 2, 8, 16, 0, A), SHARDOPT_ALGO_MUON);
    EXPECT_EQ_INT(algo_of(rt, "layers.0.moe.experts.w1", 3, 4, 8, 16, A), SHARDOPT_ALGO_MUON);
    EXPECT_EQ_INT(algo_of(rt, "layers.0.norm.weight", 1, 16, 0, 0, A), SHARDOPT_ALGO_ADAMW);
    EXPECT_EQ_INT(algo_of(rt, "layers.0.attn.q.bias", 1, 8, 0, 0, A), SHARDOPT_ALGO_ADAMW);
    EXPECT_EQ_INT(algo_of(rt, "row_vector", 2, 1, 16, 0, A), SHARDOPT_ALGO_ADAMW);
    EXPECT_EQ_INT(algo_of(rt, "col_vector", 2, 16, 1, 0, A), SHARDOPT_ALGO_ADAMW);
    EXPECT_EQ_INT(algo_of(rt, "experts_of_rows", 3, 4, 1, 16, A), SHARDOPT_ALGO_ADAMW);
    EXPECT_EQ_INT(algo_of(rt, "model.embed_tokens.weight", 2, 64, 16, 0, A), SHARDOPT_ALGO_ADAMW);
    EXPECT_EQ_INT(algo_of(rt, "lm_head.weight", 2, 64, 16, 0, A), SHARDOPT_ALGO_ADAMW);
    EXPECT_EQ_INT(algo_of(rt, "output.weight", 2, 64, 16, 0, A), SHARDOPT_ALGO_ADAMW);
    /* nanoGPT's token and position embeddings (they went to Muon, silently) */
    EXPECT_EQ_INT(algo_of(rt, "transformer.wte.weight", 2, 64, 16, 0, A), SHARDOPT_ALGO_ADAMW);
    EXPECT_EQ_INT(algo_of(rt, "transformer.wpe.weight", 2, 32, 16, 0, A), SHARDOPT_ALGO_ADAMW);
    /* "=output.weight" is exact: a name that merely contains it stays Muon */
    EXPECT_EQ_INT(algo_of(rt, "layers.0.attn.output.weight", 2, 16, 16, 0, A), SHARDOPT_ALGO_MUON);
    shardopt_finalize(rt);
}

/* A trainer registering a wrapped model's named_parameters(): DDP's module., torch.compile's
 * _orig_mod., FSDP1's and checkpointing's wrapper components around llama's output.weight.
 * =output.weight matched none of them, and the head went to Muon, silently. */
TEST(exact_patterns_see_through_wrapper_components)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_runtime_t rt = fixture_runtime(&cfg);
    const shardopt_algo_t A = SHARDOPT_ALGO_AUTO, M = SHARDOPT_ALGO_MUON, W = SHARDOPT_ALGO_ADAMW;

    EXPECT_EQ_INT(algo_of(rt, "module.output.weight", 2, 64, 16, 0, A), W);
    EXPECT_EQ_INT(algo_of(rt, "module.module.output.weight", 2, 64, 16, 0, A), W);
    EXPECT_EQ_INT(algo_of(rt, "_orig_mod.output.weight", 2, 64, 16, 0, A), W);
    EXPECT_EQ_INT(algo_of(rt, "_orig_mod.module.output.weight", 2, 64, 16, 0, A), W);
    EXPECT_EQ_INT(algo_of(rt, "_fsdp_wrapped_module.output.weight", 2, 64, 16, 0, A), W);
    EXPECT_EQ_INT(algo_of(rt, "_checkpoint_wrapped_module.output.weight", 2, 64, 16, 0, A), W);
    /* still exact: a layer's projection, a module named module deeper in, a longer tail */
    EXPECT_EQ_INT(algo_of(rt, "module.layers.0.attn.output.weight", 2, 16, 16, 0, A), M);
    EXPECT_EQ_INT(algo_of(rt, "layers.module.output.weight", 2, 16, 16, 0, A), M);
    EXPECT_EQ_INT(algo_of(rt, "module.output.weight2", 2, 16, 16, 0, A), M);
    EXPECT_EQ_INT(algo_of(rt, "module.output", 2, 16, 16, 0, A), M);
    EXPECT_EQ_INT(algo_of(rt, "module.output.weight.x", 2, 16, 16, 0, A), M);
    shardopt_finalize(rt);

    /* an entry that names a wrapper component itself still matches the name as given */
    snprintf(cfg.adamw_patterns, sizeof cfg.adamw_patterns, "=module.head");
    rt = fixture_runtime(&cfg);
    EXPECT_EQ_INT(algo_of(rt, "module.head", 2, 8, 16, 0, A), W);
    EXPECT_EQ_INT(algo_of(rt, "module.module.head", 2, 8, 16, 0, A), M);
    shardopt_finalize(rt);
}

TEST(overrides_and_custom_patterns)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    snprintf(cfg.adamw_patterns, sizeof cfg.adamw_patterns, "router,=w_special");
    shardopt_runtime_t rt = fixture_runtime(&cfg);

    EXPECT_EQ_INT(algo_of(rt, "layers.0.router.weight", 2, 8, 16, 0, SHARDOPT_ALGO_AUTO),
                  SHARDOPT_ALGO_ADAMW);
    EXPECT_EQ_INT(algo_of(rt, "w_special", 2, 8, 16, 0, SHARDOPT_ALGO_AUTO), SHARDOPT_ALGO_ADAMW);
    /* the default patterns are replaced, not extended */
    EXPECT_EQ_INT(algo_of(rt, "embed.weight", 2, 8, 16, 0, SHARDOPT_ALGO_AUTO), SHARDOPT_ALGO_MUON);
    EXPECT_EQ_INT(algo_of(rt, "forced_adamw", 2, 8, 16, 0, SHARDOPT_ALGO_ADAMW),
                  SHARDOPT_ALGO_ADAMW);
    EXPECT_EQ_INT(algo_of(rt, "lm_head_forced", 2, 8, 16, 0, SHARDOPT_ALGO_MUON),
                  SHARDOPT_ALGO_MUON);
    EXPECT_EQ_INT(algo_of(rt, "vector_forced_muon", 1, 8, 0, 0, SHARDOPT_ALGO_MUON), -1);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "vector_forced_muon");
    EXPECT_STR_CONTAINS(shardopt_last_error(), "ndim = 1");
    shardopt_finalize(rt);
}

TEST(four_d_tensor_is_refused_with_advice)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_runtime_t rt = fixture_runtime(&cfg);
    shardopt_param_desc_t d = fixture_desc("conv.weight", 4, 2, 2, 2, buf, buf);
    shardopt_param_t p = NULL;

    EXPECT_EQ_INT(shardopt_register(rt, &d, &p), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(p == NULL);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "conv.weight");
    EXPECT_STR_CONTAINS(shardopt_last_error(), "ndim = 4");
    EXPECT_STR_CONTAINS(shardopt_last_error(), "register per-layer stacks");
    shardopt_finalize(rt);
}

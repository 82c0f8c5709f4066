/* Model presets: glm45-air, qwen3-30b-a3b and qwen3-0.6b expand to the published
 * architectures' tensors (counts checked against the arithmetic written out here and the
 * published totals), and the scaling knobs do what they say. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "bench/preset.h"
#include "test.h"

TEST(glm45_air_has_the_published_shapes_and_count)
{
    struct preset p;
    struct preset_scale s = {0, 1, 1};
    char err[256];
    ASSERT_EQ_INT(preset_load("glm45-air", SHARDOPT_PRESET_DIR, &s, &p, err, sizeof err), 0);
    const int64_t h = 4096, q = 96 * 128, kv = 8 * 128, V = 151552;
    const int64_t attn = h + q * h + q + kv * h + kv + kv * h + kv + h * q + h;
    const int64_t dense = 3 * 10944 * h;
    const int64_t moe = 128 * h + 3 * 128 * 1408 * h + 3 * 1408 * h;
    const int64_t want = 2 * V * h + h + 46 * attn + dense + 45 * moe;
    EXPECT_EQ_INT(p.total, want);
    /* GLM-4.5-Air is published as 106B parameters in total (12B active) */
    EXPECT_TRUE(p.total > 106000000000ll && p.total < 107000000000ll);
    EXPECT_EQ_INT(p.dense_layers, 1);
    EXPECT_EQ_INT(p.moe_layers, 45);
    int experts = 0;
    for (int i = 0; i < p.n; i++)
        if (strcmp(p.t[i].name, "model.layers.5.mlp.experts.down_proj") == 0) {
            EXPECT_TRUE(p.t[i].expert);
            EXPECT_EQ_INT(p.t[i].ndim, 3);
            EXPECT_EQ_INT(p.t[i].shape[0], 128);
            EXPECT_EQ_INT(p.t[i].shape[1], 4096);
            EXPECT_EQ_INT(p.t[i].shape[2], 1408);
            experts++;
        }
    EXPECT_EQ_INT(experts, 1);
    printf("  glm45-air: %d tensors, %.3f B parameters\n", p.n, (double)p.total / 1e9);
    preset_free(&p);
}

/* Qwen3-30B-A3B: 48 MoE layers of 128 experts, q/k norms, no shared expert, untied embeddings. */
TEST(qwen3_30b_a3b_has_the_published_count)
{
    struct preset p;
    struct preset_scale s = {0, 1, 1};
    char err[256];
    ASSERT_EQ_INT(preset_load("qwen3-30b-a3b", SHARDOPT_PRESET_DIR, &s, &p, err, sizeof err), 0);
    const int64_t h = 2048, q = 32 * 128, kv = 4 * 128, V = 151936;
    const int64_t attn = h + q * h + kv * h + kv * h + h * q + 128 + 128 + h;
    const int64_t moe = 128 * h + 3 * 128 * 768 * h;
    EXPECT_EQ_INT(p.total, 2 * V * h + h + 48 * (attn + moe));
    /* published: 30.5B parameters in total */
    EXPECT_TRUE(p.total > 30450000000ll && p.total < 30550000000ll);
    EXPECT_EQ_INT(p.dense_layers, 0);
    EXPECT_EQ_INT(p.moe_layers, 48);
    printf("  qwen3-30b-a3b: %d tensors, %.3f B parameters\n", p.n, (double)p.total / 1e9);
    preset_free(&p);
}

/* Qwen3-0.6B: 28 dense layers, tied embeddings (one tensor), 0.44B parameters outside it. */
TEST(qwen3_0_6b_has_the_published_count)
{
    struct preset p;
    struct preset_scale s = {0, 1, 1};
    char err[256];
    ASSERT_EQ_INT(preset_load("qwen3-0.6b", SHARDOPT_PRESET_DIR, &s, &p, err, sizeof err), 0);
    const int64_t h = 1024, q = 16 * 128, kv = 8 * 128, V = 151936, f = 3072;
    const int64_t layer = h + q * h + kv * h + kv * h + h * q + 128 + 128 + h + 3 * f * h;
    EXPECT_EQ_INT(p.total, V * h + h + 28 * layer);
    /* published: 0.6B in total, 0.44B non-embedding */
    EXPECT_TRUE(p.total > 590000000ll && p.total < 610000000ll);
    EXPECT_TRUE(p.total - V * h > 435000000ll && p.total - V * h < 445000000ll);
    EXPECT_EQ_INT(p.dense_layers, 28);
    EXPECT_EQ_INT(p.moe_layers, 0);
    int lm_head = 0;
    for (int i = 0; i < p.n; i++)
        lm_head += strcmp(p.t[i].name, "lm_head.weight") == 0;
    EXPECT_EQ_INT(lm_head, 0);
    printf("  qwen3-0.6b: %d tensors, %.3f B parameters\n", p.n, (double)p.total / 1e9);
    /* --layers on a dense model counts its dense layers */
    preset_free(&p);
    s.layers = 2;
    ASSERT_EQ_INT(preset_load("qwen3-0.6b", SHARDOPT_PRESET_DIR, &s, &p, err, sizeof err), 0);
    EXPECT_EQ_INT(p.dense_layers, 2);
    EXPECT_EQ_INT(p.moe_layers, 0);
    preset_free(&p);
}

TEST(scaling_knobs)
{
    struct preset p;
    struct preset_scale s = {2, 8, 4};
    char err[256];
    ASSERT_EQ_INT(preset_load("glm45-air", SHARDOPT_PRESET_DIR, &s, &p, err, sizeof err), 0);
    EXPECT_EQ_INT(p.moe_layers, 2);
    int found = 0;
    for (int i = 0; i < p.n; i++) {
        if (strcmp(p.t[i].name, "model.layers.2.mlp.experts.gate_proj") == 0) {
            EXPECT_EQ_INT(p.t[i].shape[0], 32);  /* 128 / 4 */
            EXPECT_EQ_INT(p.t[i].shape[1], 176); /* 1408 / 8 */
            EXPECT_EQ_INT(p.t[i].shape[2], 512); /* 4096 / 8 */
            found++;
        }
        if (strcmp(p.t[i].name, "model.layers.0.self_attn.q_proj.weight") == 0) {
            EXPECT_EQ_INT(p.t[i].shape[0], 96 * 16); /* heads kept, head_dim 128 / 8 */
            found++;
        }
        EXPECT_TRUE(strncmp(p.t[i].name, "model.layers.3.", 15) != 0);
    }
    EXPECT_EQ_INT(found, 2);
    preset_free(&p);
}

TEST(bad_presets_are_refused_with_the_file_named)
{
    struct preset p;
    struct preset_scale s = {0, 1, 1};
    char err[256];
    EXPECT_EQ_INT(preset_load("no-such-model", SHARDOPT_PRESET_DIR, &s, &p, err, sizeof err), -1);
    EXPECT_STR_CONTAINS(err, "no-such-model.json");
    char dir[] = "/tmp/shardopt_preset_XXXXXX", path[64]; /* unique: concurrent checkouts */
    ASSERT_TRUE(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/bad_preset.json", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"dims\": {\"dense_layers\": 1, \"moe_layers\": 0}, \"global\": [{\"name\": \"x\", "
          "\"shape\": [\"nope\"]}]}",
          f);
    fclose(f);
    EXPECT_EQ_INT(preset_load(path, NULL, &s, &p, err, sizeof err), -1);
    EXPECT_STR_CONTAINS(err, "tensor 'x'");
    unlink(path);
    rmdir(dir);
}

/* Presets a hand-written file can get wrong, each once on the tiny model's text: before, each was
 * planned without a word (a key twice: the first won; a placement typo: planned dense; a list
 * under a misspelt key, or a number for a list: no such tensors; a dim of 0 or E = 0, which
 * register refuses; "h*" and "" as shapes: the empty factor was 1; a name twice; control bytes
 * printed raw into the table, a quote or backslash into shardopt-plan --json's strings). Each is
 * refused naming the file and what is wrong. */
TEST(hostile_presets_are_refused_naming_what_is_wrong)
{
    static const struct {
        const char *text, *want;
    } cases[] = {
        {"\"dims\": {\"h\": 8, \"h\": 16, \"dense_layers\": 1, \"moe_layers\": 0}, \"global\": "
         "[], \"dense_mlp\": [{\"name\": \"w\", \"shape\": [\"h\", \"h\"]}]",
         "key 'h' appears twice"},
        {"\"dims\": {\"h\": 8, \"dense_layers\": 0, \"moe_layers\": 1}, \"moe_mlp\": [{\"name\": "
         "\"e\", \"shape\": [2, \"h\", \"h\"], \"placement\": \"experts\"}]",
         "placement not dense or expert"},
        {"\"dims\": {\"h\": 8, \"dense_layers\": 0, \"moe_layers\": 1}, \"moe_mlps\": []",
         "unknown key 'moe_mlps'"},
        {"\"dims\": {\"h\": 8, \"dense_layers\": 0, \"moe_layers\": 1}, \"attention\": []",
         "\"moe_mlp\" must be an array"},
        {"\"dims\": {\"h\": 8, \"dense_layers\": 0, \"moe_layers\": 0}, \"global\": 5",
         "\"global\" must be an array"},
        {"\"dims\": {\"h\": 8, \"e\": 0, \"dense_layers\": 0, \"moe_layers\": 1}, \"moe_mlp\": "
         "[{\"name\": \"x\", \"shape\": [\"e\", \"h\", \"h\"], \"placement\": \"expert\"}]",
         "shape entry 0 is 0"},
        {"\"dims\": {\"h\": 8, \"dense_layers\": 0, \"moe_layers\": 1}, \"moe_mlp\": [{\"name\": "
         "\"x\", \"shape\": [\"h\", \"h\"], \"placement\": \"expert\"}]",
         "needs a shape of 3 dims"},
        {"\"dims\": {\"h\": 8, \"dense_layers\": 0, \"moe_layers\": 0}, \"global\": [{\"name\": "
         "\"w\", \"shape\": [\"h*\", 4]}]",
         "shape entry 0 is not"},
        {"\"dims\": {\"h\": 8, \"dense_layers\": 0, \"moe_layers\": 0}, \"global\": [{\"name\": "
         "\"w\", \"shape\": [\"\", 4]}]",
         "shape entry 0 is not"},
        {"\"dims\": {\"h\": 8, \"dense_layers\": 0, \"moe_layers\": 0}, \"global\": [{\"name\": "
         "\"w\", \"shape\": [\" 8\", 4]}]",
         "shape entry 0 is not"},
        {"\"dims\": {\"h\": 8, \"dense_layers\": 2, \"moe_layers\": 0}, \"global\": [{\"name\": "
         "\"model.layers.1.w\", \"shape\": [\"h\"]}], \"dense_mlp\": [{\"name\": \"w\", "
         "\"shape\": [\"h\", \"h\"]}]",
         "tensor 'model.layers.1.w' is listed twice"},
        {"\"name\": \"a\\u001b[2Jb\", \"dims\": {\"dense_layers\": 0, \"moe_layers\": 0}",
         "\"name\" must be text"},
        {"\"dims\": {\"dense_layers\": 0, \"moe_layers\": 0}, \"global\": [{\"name\": "
         "\"a\\u001bb\", \"shape\": [4]}]",
         "tensor name 'a\\x1bb'"},
        {"\"name\": \"a\\\"b\", \"dims\": {\"dense_layers\": 0, \"moe_layers\": 0}",
         "\"name\" must be text"},
        {"\"dims\": {\"dense_layers\": 0, \"moe_layers\": 0}, \"global\": [{\"name\": "
         "\"a\\\\b\", \"shape\": [4]}]",
         "tensor name 'a\\\\b'"}, /* shown escaped */
        {"\"dims\": {\"h\": 8, \"dense_layers\": 0, \"moe_layers\": 0}, \"width_dims\": "
         "[\"hidden\"]",
         "\"width_dims\" must be an array of names in \"dims\""},
        {"\"dims\": {\"dense_layers\": 0, \"moe_layers\": 0}} {", "text after"},
    };
    struct preset p;
    struct preset_scale s = {0, 1, 1};
    char err[512], dir[] = "/tmp/shardopt_preset_XXXXXX", path[64];
    ASSERT_TRUE(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/hostile.json", dir);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        FILE *f = fopen(path, "w");
        ASSERT_TRUE(f != NULL);
        fprintf(f, "{%s}", cases[i].text);
        fclose(f);
        err[0] = '\0';
        EXPECT_EQ_INT(preset_load(path, NULL, &s, &p, err, sizeof err), -1);
        EXPECT_STR_CONTAINS(err, path);
        EXPECT_STR_CONTAINS(err, cases[i].want);
        for (const char *c = err; *c != '\0'; c++)
            EXPECT_TRUE((unsigned char)*c >= 0x20);
    }
    unlink(path);
    rmdir(dir);
}

/* Hostile inputs probed beyond test_api_hostile.c and test_api_misuse.c: shapes whose product
 * overflows, names a checkpoint file could misread (quotes, backslashes, path separators, dots),
 * JSON configs with numbers past every range, NaN/Infinity literals, keys spelt twice through
 * escapes, nesting deep enough to exhaust a recursive parser's stack, values of the wrong type;
 * parameters whose buffers partly overlap; checkpoint directories that are files, dangling links
 * or link loops; and commit's host-memory check (SHARDOPT_MEM_AVAILABLE stands in for a small
 * machine). Each gets a status and a message naming what was wrong, and nothing is lost. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#include "fixture.h"

static float w[256], g[256], w2[256], g2[256];

/* A temporary directory of this test (mkdtemp), its path in buf. */
static void temp_dir(char *buf, size_t len)
{
    snprintf(buf, len, "%s/shardopt_probes_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (mkdtemp(buf) == NULL) {
        perror("mkdtemp");
        exit(1);
    }
}

/* A runtime of one parameter (d), committed and stepped once: there is state to save. */
static shardopt_runtime_t stepped_once(shardopt_param_desc_t d)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_runtime_t rt = fixture_runtime(&cfg);
    shardopt_param_t p = NULL;
    shardopt_step_args_t a = SHARDOPT_STEP_ARGS_INIT;
    a.lr = 0.01;
    EXPECT_EQ_INT(shardopt_register(rt, &d, &p), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_commit(rt), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_step(rt, &a), SHARDOPT_OK);
    return rt;
}

static void write_file(const char *path, const char *text, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (f == NULL) {
        perror(path);
        exit(1);
    }
    fwrite(text, 1, n, f);
    fclose(f);
}

static void no_control_bytes(const char *msg)
{
    for (const char *c = msg; *c != '\0'; c++)
        if ((unsigned char)*c < 0x20) {
            EXPECT_TRUE(!"a control character in the message");
            return;
        }
}

/* shapes whose element count passes 2^60 (or int64) in every way the product can be formed:
 * refused at register naming the shape, never wrapped into a small count */
TEST(shapes_whose_product_overflows_are_refused_naming_the_shape)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_runtime_t rt = fixture_runtime(&cfg);
    const int64_t shapes[][3] = {
        {INT64_MAX, 2, 0},         {1ll << 31, 1ll << 31, 1ll << 31},
        {2, INT64_MAX, 0},         {1ll << 40, 1ll << 40, 0},
        {3, 1ll << 62, 0},         {1ll << 59, 4, 0},
        {INT64_MAX, INT64_MAX, 2}, {1ll << 62, 1ll << 2, 1ll << 2},
        {2, 2, INT64_MIN},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        shardopt_param_t p = NULL;
        shardopt_param_desc_t d = fixture_desc("x", shapes[i][2] != 0 ? 3 : 2, shapes[i][0],
                                               shapes[i][1], shapes[i][2], w, g);
        EXPECT_EQ_INT(shardopt_register(rt, &d, &p), SHARDOPT_ERR_INVALID_ARGUMENT);
        EXPECT_TRUE(p == NULL);
        EXPECT_STR_CONTAINS(shardopt_last_error(), "'x'");
        EXPECT_STR_CONTAINS(shardopt_last_error(), "shape");
    }
    EXPECT_EQ_INT(shardopt_finalize(rt), SHARDOPT_OK);
}

/* names with quotes, backslashes, slashes and dots: saved and loaded back inside the checkpoint
 * directory (a state tensor's name is JSON text in a safetensors header and in index.json, never
 * a file name), every state tensor back bit for bit */
TEST(names_with_quotes_slashes_and_dots_round_trip_through_a_checkpoint)
{
    const char *names[] = {"a\"b",       "a\\b",    "../../escape", "/abs/w", "x/../y",
                           ".",          "..",      "a b'c",        "{}[]:,", "\xe2\x80\xa8sep",
                           "k\xc3\xa9y", "\\u0000", "a\"\\\"b"};
    enum { N = sizeof names / sizeof names[0] };
    static float wd[N][64], gd[N][64];
    char dir[512], outside[600];
    temp_dir(dir, sizeof dir);
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    cfg.apply_env = 0;
    shardopt_runtime_t rt = fixture_runtime(&cfg);
    shardopt_param_t h[N];
    for (int i = 0; i < N; i++) {
        for (int e = 0; e < 64; e++) {
            wd[i][e] = 0.01f * (float)((e * 7 + i) % 13);
            gd[i][e] = 0.001f * (float)((e * 5 + i) % 11) - 0.004f;
        }
        shardopt_param_desc_t d = fixture_desc(names[i], 2, 8, 8, 0, wd[i], gd[i]);
        d.algo = i % 2 ? SHARDOPT_ALGO_ADAMW : SHARDOPT_ALGO_MUON;
        ASSERT_EQ_INT(shardopt_register(rt, &d, &h[i]), SHARDOPT_OK);
    }
    ASSERT_EQ_INT(shardopt_commit(rt), SHARDOPT_OK);
    shardopt_step_args_t a = SHARDOPT_STEP_ARGS_INIT;
    a.lr = 0.01;
    ASSERT_EQ_INT(shardopt_step(rt, &a), SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_save(rt, dir), SHARDOPT_OK);
    snprintf(outside, sizeof outside, "%s/../escape", dir);
    EXPECT_TRUE(access(outside, F_OK) != 0); /* nothing written beside the directory */
    float before[N][64], after[N][64];
    for (int i = 0; i < N; i++)
        ASSERT_EQ_INT(
            shardopt_param_get_state(h[i], i % 2 ? SHARDOPT_STATE_EXP_AVG : SHARDOPT_STATE_MOMENTUM,
                                     before[i], sizeof before[i], SHARDOPT_DTYPE_FP32),
            SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_step(rt, &a), SHARDOPT_OK); /* moves the state on */
    ASSERT_EQ_INT(shardopt_load(rt, dir), SHARDOPT_OK);
    for (int i = 0; i < N; i++) {
        ASSERT_EQ_INT(
            shardopt_param_get_state(h[i], i % 2 ? SHARDOPT_STATE_EXP_AVG : SHARDOPT_STATE_MOMENTUM,
                                     after[i], sizeof after[i], SHARDOPT_DTYPE_FP32),
            SHARDOPT_OK);
        EXPECT_TRUE(memcmp(before[i], after[i], sizeof before[i]) == 0);
    }
    EXPECT_EQ_INT(shardopt_finalize(rt), SHARDOPT_OK);
    fixture_rmtree(dir);
}

/* One JSON config per probe: refused naming the key (or the byte offset), cfg unchanged. */
TEST(json_configs_with_hostile_numbers_literals_types_and_nesting_are_refused)
{
    static const struct {
        const char *text, *names;
    } cases[] = {
        {"{\"momentum\": 1e400}", "momentum"},
        {"{\"momentum\": -1e400}", "momentum"},
        {"{\"momentum\": NaN}", "byte"},
        {"{\"momentum\": Infinity}", "byte"},
        {"{\"momentum\": -Infinity}", "byte"},
        {"{\"momentum\": nan}", "byte"},
        {"{\"momentum\": null}", "momentum"},
        {"{\"momentum\": \"0.5\"}", "momentum"},
        {"{\"momentum\": [0.5]}", "momentum"},
        {"{\"momentum\": {}}", "momentum"},
        {"{\"momentum\": 0.5, \"mom\\u0065ntum\": 0.6}", "momentum"},
        {"{\"ns_steps\": 5.5}", "ns_steps"},
        {"{\"ns_steps\": \"5\"}", "ns_steps"},
        {"{\"ns_steps\": true}", "ns_steps"},
        {"{\"ns_steps\": 1e300}", "ns_steps"},
        {"{\"ns_steps\": 99999999999999999999999}", "ns_steps"},
        {"{\"nesterov\": 1}", "nesterov"},
        {"{\"nesterov\": \"true\"}", "nesterov"},
        {"{\"seed\": -1}", "seed"},
        {"{\"seed\": 1e300}", "seed"},
        {"{\"seed\": 18446744073709551616}", "seed"},
        {"{\"seed\": \"18446744073709551616\"}", "seed"},
        {"{\"seed\": \"-1\"}", "seed"},
        {"{\"seed\": \" 1\"}", "seed"},
        {"{\"bucket_bytes\": 1e19}", "bucket_bytes"},
        {"{\"bucket_bytes\": 18446744073709551616}", "bucket_bytes"},
        {"{\"bucket_bytes\": -0.5}", "bucket_bytes"},
        {"{\"num_threads\": 4096.5}", "num_threads"},
        {"{\"dp_shard\": -2}", "dp_shard"},
        {"{\"ns_custom_coeffs\": [[1,2]]}", "ns_custom_coeffs"},
        {"{\"ns_custom_coeffs\": [[1,2,3,4]]}", "ns_custom_coeffs"},
        {"{\"ns_custom_coeffs\": [[[1,2,3]]]}", "ns_custom_coeffs"},
        {"{\"ns_custom_coeffs\": []}", "ns_custom_coeffs"},
        {"{\"ns_custom_coeffs\": [[1e39,0,0]]}", "ns_custom_coeffs"},
        {"{\"ns_coeffs\": \"custom\", \"ns_custom_coeffs\": \"3,-4,2\"}", "ns_custom_coeffs"},
        {"{\"adamw_patterns\": \"\\ud800\"}", "byte"},
        {"{\"adamw_patterns\": \"a\\nb\"}", "adamw_patterns"},
        {"{\"Momentum\": 0.5}", "Momentum"},
        {"{\"\": 0.5}", "key"},
        {"", "byte"},
        {"   ", "byte"},
        {"null", "object"},
        {"[]", "object"},
        {"\"momentum\"", "object"},
        {"{\"momentum\": 0.5,}", "byte"},
        {"{\"momentum\": 0.5", "byte"},
    };
    char dir[512], path[600];
    temp_dir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/cfg.json", dir);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        shardopt_config_t c = SHARDOPT_CONFIG_INIT, before = c;
        write_file(path, cases[i].text, strlen(cases[i].text));
        const shardopt_status_t s = shardopt_config_load_json(path, &c);
        if (s != SHARDOPT_ERR_INVALID_ARGUMENT ||
            strstr(shardopt_last_error(), cases[i].names) == NULL)
            fprintf(stderr, "probe %zu '%s': status %d, '%s'\n", i, cases[i].text, (int)s,
                    shardopt_last_error());
        EXPECT_EQ_INT(s, SHARDOPT_ERR_INVALID_ARGUMENT);
        EXPECT_STR_CONTAINS(shardopt_last_error(), cases[i].names);
        EXPECT_TRUE(memcmp(&c, &before, sizeof c) == 0);
        no_control_bytes(shardopt_last_error());
    }
    /* nesting as deep as 1 MiB allows, in a value and at the top: refused, no stack overflow */
    const size_t depth = 500000;
    char *deep = malloc(2 * depth + 64);
    for (int form = 0; form < 3; form++) {
        size_t n = 0;
        const char open = form == 1 ? '{' : '[';
        if (form != 2)
            n += (size_t)sprintf(deep, "{\"momentum\":");
        for (size_t k = 0; k < depth; k++) {
            deep[n++] = open;
            if (open == '{') {
                memcpy(deep + n, "\"a\":", 4);
                n += 4;
                if (n > 2 * depth)
                    break;
            }
        }
        shardopt_config_t c = SHARDOPT_CONFIG_INIT, before = c;
        write_file(path, deep, n);
        EXPECT_EQ_INT(shardopt_config_load_json(path, &c), SHARDOPT_ERR_INVALID_ARGUMENT);
        EXPECT_TRUE(memcmp(&c, &before, sizeof c) == 0);
    }
    free(deep);
    fixture_rmtree(dir);
}

/* a parameter whose data starts inside another's, or whose gradient overlaps its own data by a
 * few elements: the step refuses before writing anything (it would write what it reads) */
TEST(partly_overlapping_buffers_are_refused_before_anything_is_written)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    for (int form = 0; form < 3; form++) {
        shardopt_runtime_t rt = fixture_runtime(&cfg);
        shardopt_param_t p = NULL, q = NULL;
        for (int e = 0; e < 256; e++)
            w[e] = 0.5f, g[e] = 0.1f, g2[e] = 0.2f;
        /* 0: b's data is a's last 4 elements on; 1: a's grad ends inside a's data;
         * 2: b's grad starts inside a's data */
        shardopt_param_desc_t d = fixture_desc("a", 2, 8, 8, 0, w, form == 1 ? w + 60 : g);
        shardopt_param_desc_t e =
            fixture_desc("b", 2, 8, 8, 0, form == 0 ? w + 60 : w2, form == 2 ? w + 63 : g2);
        shardopt_status_t s = shardopt_register(rt, &d, &p);
        if (s == SHARDOPT_OK)
            s = shardopt_register(rt, &e, &q);
        if (s == SHARDOPT_OK)
            s = shardopt_commit(rt);
        if (s == SHARDOPT_OK) {
            shardopt_step_args_t a = SHARDOPT_STEP_ARGS_INIT;
            a.lr = 0.01;
            s = shardopt_step(rt, &a);
        }
        EXPECT_EQ_INT(s, SHARDOPT_ERR_INVALID_ARGUMENT);
        EXPECT_STR_CONTAINS(shardopt_last_error(), "'a'");
        for (int k = 0; k < 60; k++)
            if (w[k] != 0.5f) {
                EXPECT_TRUE(!"a parameter was written");
                break;
            }
        EXPECT_EQ_INT(shardopt_finalize(rt), SHARDOPT_OK);
    }
}

/* checkpoint directories that are no directory: a regular file, a dangling link, a link loop,
 * a path through a file; a load from each of them. Refused with the path named, the runtime
 * stepping on afterwards. */
TEST(checkpoint_paths_that_are_files_dangling_links_or_loops_are_refused)
{
    char dir[512], file[600], dangling[600], loop_a[600], loop_b[600], through[700];
    temp_dir(dir, sizeof dir);
    snprintf(file, sizeof file, "%s/file", dir);
    snprintf(dangling, sizeof dangling, "%s/dangling", dir);
    snprintf(loop_a, sizeof loop_a, "%s/loop_a", dir);
    snprintf(loop_b, sizeof loop_b, "%s/loop_b", dir);
    snprintf(through, sizeof through, "%s/file/sub", dir);
    write_file(file, "x", 1);
    ASSERT_TRUE(symlink("/nonexistent/shardopt/nowhere", dangling) == 0);
    ASSERT_TRUE(symlink(loop_b, loop_a) == 0);
    ASSERT_TRUE(symlink(loop_a, loop_b) == 0);
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_runtime_t rt = fixture_runtime(&cfg);
    shardopt_param_t p = NULL;
    shardopt_param_desc_t d = fixture_desc("a", 2, 8, 8, 0, w, g);
    ASSERT_EQ_INT(shardopt_register(rt, &d, &p), SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_commit(rt), SHARDOPT_OK);
    const char *bad[] = {file, dangling, loop_a, through, "/dev/null", "/proc/self/status"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const shardopt_status_t s = shardopt_save(rt, bad[i]);
        if (s != SHARDOPT_ERR_IO)
            fprintf(stderr, "save '%s': %d %s\n", bad[i], (int)s, shardopt_last_error());
        EXPECT_EQ_INT(s, SHARDOPT_ERR_IO);
        EXPECT_STR_CONTAINS(shardopt_last_error(), bad[i]);
        const shardopt_status_t l = shardopt_load(rt, bad[i]);
        if (l != SHARDOPT_ERR_IO)
            fprintf(stderr, "load '%s': %d %s\n", bad[i], (int)l, shardopt_last_error());
        EXPECT_EQ_INT(l, SHARDOPT_ERR_IO);
        EXPECT_STR_CONTAINS(shardopt_last_error(), bad[i]);
    }
    shardopt_step_args_t a = SHARDOPT_STEP_ARGS_INIT;
    a.lr = 0.01;
    EXPECT_EQ_INT(shardopt_step(rt, &a), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_finalize(rt), SHARDOPT_OK);
    fixture_rmtree(dir);
}

/* commit's host-memory check: state larger than what SHARDOPT_MEM_AVAILABLE says is refused at
 * commit with the bytes needed, the bytes available and the largest parameters, nothing
 * allocated; the same registration commits once the memory is there; a hook value that is no
 * byte count is refused naming the variable */
TEST(state_larger_than_the_memory_available_is_refused_at_commit)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_runtime_t rt = fixture_runtime(&cfg);
    shardopt_param_t p = NULL, q = NULL;
    shardopt_param_desc_t d = fixture_desc("layers.0.w", 2, 16, 16, 0, w, g);
    shardopt_param_desc_t e = fixture_desc("layers.0.bias", 1, 16, 0, 0, w2, g2);
    ASSERT_EQ_INT(shardopt_register(rt, &d, &p), SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_register(rt, &e, &q), SHARDOPT_OK);
    setenv("SHARDOPT_MEM_AVAILABLE", "1000", 1);
    EXPECT_EQ_INT(shardopt_commit(rt), SHARDOPT_ERR_OUT_OF_MEMORY);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "1000 bytes are available (SHARDOPT_MEM_AVAILABLE)");
    EXPECT_STR_CONTAINS(shardopt_last_error(), "optimizer state 1152 bytes");
    EXPECT_STR_CONTAINS(shardopt_last_error(), "'layers.0.w' 1024 bytes, 'layers.0.bias' 128");
    const char *junk[] = {"12abc", "", "-1", " 5", "1e9", "18446744073709551616"};
    for (size_t i = 0; i < sizeof junk / sizeof junk[0]; i++) {
        setenv("SHARDOPT_MEM_AVAILABLE", junk[i], 1);
        EXPECT_EQ_INT(shardopt_commit(rt), SHARDOPT_ERR_INVALID_ARGUMENT);
        EXPECT_STR_CONTAINS(shardopt_last_error(), "SHARDOPT_MEM_AVAILABLE");
    }
    shardopt_step_args_t a = SHARDOPT_STEP_ARGS_INIT;
    a.lr = 0.01;
    EXPECT_EQ_INT(shardopt_step(rt, &a), SHARDOPT_ERR_STATE);
    setenv("SHARDOPT_MEM_AVAILABLE", "1000000000", 1);
    EXPECT_EQ_INT(shardopt_commit(rt), SHARDOPT_OK);
    unsetenv("SHARDOPT_MEM_AVAILABLE");
    EXPECT_EQ_INT(shardopt_step(rt, &a), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_finalize(rt), SHARDOPT_OK);
}

/* load's host-memory check (shared with commit's: comm_node_memory): the staging copy a load
 * reads into, larger than what SHARDOPT_MEM_AVAILABLE says, is refused before anything is read,
 * naming the bytes; a hook value that is no byte count is refused naming the variable and the
 * call; with the memory there the load goes on */
TEST(a_load_needing_more_memory_than_is_available_is_refused)
{
    char dir[256];
    temp_dir(dir, sizeof dir);
    shardopt_runtime_t rt = stepped_once(fixture_desc("layers.0.w", 2, 16, 16, 0, w, g));
    ASSERT_EQ_INT(shardopt_save(rt, dir), SHARDOPT_OK);
    setenv("SHARDOPT_MEM_AVAILABLE", "100", 1);
    EXPECT_EQ_INT(shardopt_load(rt, dir), SHARDOPT_ERR_OUT_OF_MEMORY);
    EXPECT_STR_CONTAINS(shardopt_last_error(),
                        "the copy of the optimizer state a load reads into needs 1024 bytes");
    EXPECT_STR_CONTAINS(shardopt_last_error(), "100 bytes are available (SHARDOPT_MEM_AVAILABLE)");
    setenv("SHARDOPT_MEM_AVAILABLE", "12abc", 1);
    EXPECT_EQ_INT(shardopt_load(rt, dir), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "load: rank 0: ");
    EXPECT_STR_CONTAINS(shardopt_last_error(), "SHARDOPT_MEM_AVAILABLE");
    unsetenv("SHARDOPT_MEM_AVAILABLE");
    EXPECT_EQ_INT(shardopt_load(rt, dir), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_finalize(rt), SHARDOPT_OK);
    fixture_rmtree(dir);
}

/* parameters whose state adds up past SIZE_MAX (each under the 2^60-element limit): two 1-D
 * AdamW tensors of 2^60 - 1 fp32 elements reserve 2^62 bytes twice each, 2^64 in all, which
 * wrapped to an arena of 0 bytes: commit returned OK and a step would have written past it. The
 * sum saturates now and commit refuses with the bytes. No step runs here either way. */
TEST(state_sizes_that_add_up_past_size_max_are_refused_not_wrapped)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_runtime_t rt = fixture_runtime(&cfg);
    const char *names[2] = {"big0", "big1"};
    for (int i = 0; i < 2; i++) {
        shardopt_param_t p = NULL;
        shardopt_param_desc_t d = fixture_desc(names[i], 1, (1ll << 60) - 1, 0, 0, w, g);
        ASSERT_EQ_INT(shardopt_register(rt, &d, &p), SHARDOPT_OK);
    }
    EXPECT_EQ_INT(shardopt_commit(rt), SHARDOPT_ERR_OUT_OF_MEMORY);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "'big0' 9223372036854775800 bytes");
    shardopt_step_args_t a = SHARDOPT_STEP_ARGS_INIT;
    a.lr = 0.01;
    EXPECT_EQ_INT(shardopt_step(rt, &a), SHARDOPT_ERR_STATE);
    EXPECT_EQ_INT(shardopt_finalize(rt), SHARDOPT_OK);
}

/* an expert stack of 2^40 (or 2^31) experts: the planner counted its matrices in an int, which
 * truncated to 0 (or went negative), and commit wrote 2^40 matrix records into one (a segfault).
 * Refused now with the count, before any planner allocation. */
TEST(expert_stacks_with_more_matrices_than_a_plan_holds_are_refused_at_commit)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    const int64_t experts[] = {1ll << 40, 1ll << 31, (1ll << 30) + 1};
    for (size_t i = 0; i < sizeof experts / sizeof experts[0]; i++) {
        shardopt_runtime_t rt = fixture_runtime(&cfg);
        shardopt_param_t p = NULL;
        shardopt_param_desc_t d = fixture_desc("moe.experts.w1", 3, experts[i], 2, 2, w, g);
        d.placement = SHARDOPT_PLACEMENT_EXPERT;
        d.algo = SHARDOPT_ALGO_MUON;
        ASSERT_EQ_INT(shardopt_register(rt, &d, &p), SHARDOPT_OK);
        EXPECT_EQ_INT(shardopt_commit(rt), SHARDOPT_ERR_UNSUPPORTED);
        char want[64];
        snprintf(want, sizeof want, "%lld Newton-Schulz matrices", (long long)experts[i]);
        EXPECT_STR_CONTAINS(shardopt_last_error(), want);
        shardopt_step_args_t a = SHARDOPT_STEP_ARGS_INIT;
        a.lr = 0.01;
        EXPECT_EQ_INT(shardopt_step(rt, &a), SHARDOPT_ERR_STATE);
        EXPECT_EQ_INT(shardopt_finalize(rt), SHARDOPT_OK);
    }
}

/* a flag field holding neither 0 nor 1 (a binding's int): validate names the number it refuses;
 * it printed "nesterov = true: accepted true/false (1/0)" for 7, as if true were refused */
TEST(a_flag_of_7_is_refused_naming_7)
{
    shardopt_config_t c = SHARDOPT_CONFIG_INIT;
    c.nesterov = 7;
    EXPECT_EQ_INT(shardopt_config_validate(&c), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "nesterov = 7: accepted true/false");
    c = (shardopt_config_t)SHARDOPT_CONFIG_INIT;
    c.param_stats = -1;
    EXPECT_EQ_INT(shardopt_config_validate(&c), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "param_stats = -1");
}

/* offload = optimizer on the CPU: the three staging slots are host memory too, counted in what
 * commit needs (here each slot holds the whole 2048-byte state: 6144 bytes on top of it) */
TEST(offload_staging_slots_count_in_the_host_memory_commit_needs)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    cfg.apply_env = 0;
    cfg.offload = SHARDOPT_OFFLOAD_OPTIMIZER;
    cfg.bucket_bytes = 0;
    shardopt_runtime_t rt = fixture_runtime(&cfg);
    shardopt_param_t p = NULL;
    shardopt_param_desc_t d = fixture_desc("embed.weight", 2, 16, 16, 0, w, g);
    d.algo = SHARDOPT_ALGO_ADAMW;
    ASSERT_EQ_INT(shardopt_register(rt, &d, &p), SHARDOPT_OK);
    setenv("SHARDOPT_MEM_AVAILABLE", "5000", 1);
    EXPECT_EQ_INT(shardopt_commit(rt), SHARDOPT_ERR_OUT_OF_MEMORY);
    EXPECT_STR_CONTAINS(shardopt_last_error(),
                        "optimizer state 2048 bytes, exchange and Newton-Schulz buffers 6144");
    unsetenv("SHARDOPT_MEM_AVAILABLE");
    EXPECT_EQ_INT(shardopt_commit(rt), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_finalize(rt), SHARDOPT_OK);
}

/* a load reads into a whole copy of the state before swapping it in: with less host memory left
 * than that copy, refused with the bytes, nothing read and the state as it was (before, the
 * copy was allocated and zeroed whatever the machine had left) */
TEST(a_load_whose_copy_of_the_state_does_not_fit_is_refused)
{
    char dir[512];
    temp_dir(dir, sizeof dir);
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    cfg.apply_env = 0;
    shardopt_runtime_t rt = fixture_runtime(&cfg);
    shardopt_param_t p = NULL;
    for (int e = 0; e < 256; e++)
        w[e] = 0.01f * (float)(e % 9), g[e] = 0.002f * (float)(e % 7) - 0.006f;
    shardopt_param_desc_t d = fixture_desc("layers.0.w", 2, 16, 16, 0, w, g);
    ASSERT_EQ_INT(shardopt_register(rt, &d, &p), SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_commit(rt), SHARDOPT_OK);
    shardopt_step_args_t a = SHARDOPT_STEP_ARGS_INIT;
    a.lr = 0.01;
    ASSERT_EQ_INT(shardopt_step(rt, &a), SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_save(rt, dir), SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_step(rt, &a), SHARDOPT_OK);
    float before[256], after[256];
    ASSERT_EQ_INT(shardopt_param_get_state(p, SHARDOPT_STATE_MOMENTUM, before, sizeof before,
                                           SHARDOPT_DTYPE_FP32),
                  SHARDOPT_OK);
    setenv("SHARDOPT_MEM_AVAILABLE", "1000", 1);
    EXPECT_EQ_INT(shardopt_load(rt, dir), SHARDOPT_ERR_OUT_OF_MEMORY);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "needs 1024 bytes of host memory");
    EXPECT_STR_CONTAINS(shardopt_last_error(), "but 1000 bytes are available");
    setenv("SHARDOPT_MEM_AVAILABLE", "1k", 1);
    EXPECT_EQ_INT(shardopt_load(rt, dir), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "SHARDOPT_MEM_AVAILABLE = '1k'");
    unsetenv("SHARDOPT_MEM_AVAILABLE");
    ASSERT_EQ_INT(shardopt_param_get_state(p, SHARDOPT_STATE_MOMENTUM, after, sizeof after,
                                           SHARDOPT_DTYPE_FP32),
                  SHARDOPT_OK);
    EXPECT_TRUE(memcmp(before, after, sizeof before) == 0);
    EXPECT_EQ_INT(shardopt_load(rt, dir), SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_param_get_state(p, SHARDOPT_STATE_MOMENTUM, after, sizeof after,
                                           SHARDOPT_DTYPE_FP32),
                  SHARDOPT_OK);
    EXPECT_TRUE(memcmp(before, after, sizeof before) != 0); /* the saved step's state is back */
    EXPECT_EQ_INT(shardopt_finalize(rt), SHARDOPT_OK);
    fixture_rmtree(dir);
}

/* DIR/.latest.tmp planted as a directory: the save publishes its step and returns ERR_IO saying
 * what is in the way (before: "create: File exists (removed; ...)", which it was not); once it
 * is gone the next save replaces latest */
TEST(a_directory_planted_as_latest_tmp_is_named_not_said_removed)
{
    char dir[512], tmp[600];
    temp_dir(dir, sizeof dir);
    snprintf(tmp, sizeof tmp, "%s/.latest.tmp", dir);
    ASSERT_TRUE(mkdir(tmp, 0755) == 0);
    shardopt_runtime_t rt = stepped_once(fixture_desc("a", 2, 8, 8, 0, w, g));
    EXPECT_EQ_INT(shardopt_save(rt, dir), SHARDOPT_ERR_IO);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "/.latest.tmp: create: File exists (not a file");
    EXPECT_TRUE(strstr(shardopt_last_error(), "removed;") == NULL);
    ASSERT_TRUE(rmdir(tmp) == 0);
    shardopt_step_args_t a = SHARDOPT_STEP_ARGS_INIT;
    a.lr = 0.01;
    ASSERT_EQ_INT(shardopt_step(rt, &a), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_save(rt, dir), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_load(rt, dir), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_finalize(rt), SHARDOPT_OK);
    fixture_rmtree(dir);
}

/* SHARDOPT_CPU_NO_BF16 with trailing junk or a word: refused at init naming it (it counted as
 * set, silently); 1, 0 and empty are its values */
TEST(cpu_no_bf16_takes_1_0_or_empty_only)
{
    const char *bad[] = {"0 ", "yes", "1x", "true", " 1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
        shardopt_runtime_t rt = NULL;
        setenv("SHARDOPT_CPU_NO_BF16", bad[i], 1);
        EXPECT_EQ_INT(shardopt_init(MPI_COMM_SELF, &cfg, &rt), SHARDOPT_ERR_INVALID_ARGUMENT);
        EXPECT_STR_CONTAINS(shardopt_last_error(), "SHARDOPT_CPU_NO_BF16");
        EXPECT_TRUE(rt == NULL);
    }
    const char *good[] = {"1", "0", ""};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
        shardopt_runtime_t rt = NULL;
        setenv("SHARDOPT_CPU_NO_BF16", good[i], 1);
        EXPECT_EQ_INT(shardopt_init(MPI_COMM_SELF, &cfg, &rt), SHARDOPT_OK);
        shardopt_finalize(rt);
    }
    unsetenv("SHARDOPT_CPU_NO_BF16");
}

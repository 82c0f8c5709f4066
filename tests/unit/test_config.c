/* Config: defaults, validation messages, env and JSON loaders (strict, atomic on error). */
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fixture.h"
#include "runtime/config/config_keys.h"
#include "shardopt.h"
#include "test.h"

/* Every file the tests write lives in one fresh directory (mkdtemp: never a fixed name another
 * process could hold or plant), removed at exit. */
static char tmp_root[64];

static void tmp_root_remove(void) { fixture_rmtree(tmp_root); }

/* tmp_root/name in out. */
static const char *tmp_path(char *out, size_t len, const char *name)
{
    if (tmp_root[0] == '\0') {
        snprintf(tmp_root, sizeof tmp_root, "/tmp/shardopt_cfg_XXXXXX");
        if (mkdtemp(tmp_root) == NULL) {
            perror("mkdtemp");
            exit(1);
        }
        atexit(tmp_root_remove);
    }
    snprintf(out, len, "%s/%s", tmp_root, name);
    return out;
}

static const char *write_json(const char *text)
{
    static char path[128];
    tmp_path(path, sizeof path, "cfg.json");
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
    return path;
}

/* Loading `json` fails with INVALID_ARGUMENT, the message names every word in `words`, and the
 * config is unchanged. */
static void expect_json_refused(const char *json, const char *w1, const char *w2)
{
    shardopt_config_t c = SHARDOPT_CONFIG_INIT, before;
    before = c;
    const char *path = write_json(json);
    EXPECT_EQ_INT(shardopt_config_load_json(path, &c), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), w1);
    if (w2 != NULL)
        EXPECT_STR_CONTAINS(shardopt_last_error(), w2);
    EXPECT_TRUE(memcmp(&c, &before, sizeof c) == 0);
    unlink(path);
}

TEST(defaults_match_dion)
{
    shardopt_config_t c = SHARDOPT_CONFIG_INIT;
    EXPECT_EQ_INT(shardopt_config_validate(&c), SHARDOPT_OK);
    EXPECT_NEAR(c.momentum, 0.95, 0);
    EXPECT_EQ_INT(c.nesterov, 0);
    EXPECT_NEAR(c.weight_decay, 0.01, 0);
    EXPECT_EQ_INT(c.ns_coeffs, SHARDOPT_NS_QUINTIC);
    EXPECT_EQ_INT(c.ns_steps, 5);
    EXPECT_NEAR(c.ns_eps, 1e-8, 0);
    EXPECT_EQ_INT(c.lr_scale, SHARDOPT_LR_SCALE_RMS_NORM);
    EXPECT_NEAR(c.adamw_beta1, 0.9, 0);
    EXPECT_NEAR(c.adamw_beta2, 0.95, 0);
    EXPECT_NEAR(c.adamw_eps, 1e-8, 0);
    EXPECT_EQ_INT(c.momentum_dtype, SHARDOPT_DTYPE_FP32);
    EXPECT_EQ_INT(c.comm_dtype, SHARDOPT_DTYPE_BF16);
}

TEST(validate_names_key_value_and_range)
{
    shardopt_config_t c = SHARDOPT_CONFIG_INIT;
    c.momentum = 1.0;
    EXPECT_EQ_INT(shardopt_config_validate(&c), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "momentum = 1");
    EXPECT_STR_CONTAINS(shardopt_last_error(), "[0, 1)");

    c = (shardopt_config_t)SHARDOPT_CONFIG_INIT;
    c.adamw_eps = NAN;
    EXPECT_EQ_INT(shardopt_config_validate(&c), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "adamw_eps = nan");

    c = (shardopt_config_t)SHARDOPT_CONFIG_INIT;
    c.ns_coeffs = (shardopt_ns_coeffs_t)9;
    EXPECT_EQ_INT(shardopt_config_validate(&c), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "one of quintic, jordan, polar_express, custom");

    c = (shardopt_config_t)SHARDOPT_CONFIG_INIT;
    c.ns_coeffs = SHARDOPT_NS_POLAR_EXPRESS;
    c.ns_steps = 4;
    EXPECT_EQ_INT(shardopt_config_validate(&c), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "ns_steps = 4: accepted 5..8");

    c = (shardopt_config_t)SHARDOPT_CONFIG_INIT;
    c.ns_coeffs = SHARDOPT_NS_CUSTOM;
    c.ns_steps = 2;
    c.ns_custom_coeffs[0][0] = 3;
    EXPECT_EQ_INT(shardopt_config_validate(&c), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "ns_custom_coeffs step 1");

    c = (shardopt_config_t)SHARDOPT_CONFIG_INIT;
    c.ns_coeffs = SHARDOPT_NS_CUSTOM;
    c.ns_steps = 17;
    EXPECT_EQ_INT(shardopt_config_validate(&c), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "ns_steps = 17");

    /* issue 23's keys: names, values, and aol only on gathered matrices */
    c = (shardopt_config_t)SHARDOPT_CONFIG_INIT;
    EXPECT_EQ_INT(shardopt_config_set(&c, "ns_algorithm", "gram"), SHARDOPT_OK);
    EXPECT_EQ_INT(c.ns_algorithm, SHARDOPT_NS_ALGORITHM_GRAM);
    EXPECT_EQ_INT(shardopt_config_set(&c, "ns_algorithm", "auto"), SHARDOPT_OK);
    EXPECT_EQ_INT(c.ns_algorithm, SHARDOPT_NS_ALGORITHM_AUTO);
    EXPECT_EQ_INT(shardopt_config_set(&c, "ns_algorithm", "fast"), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "one of standard, gram, auto");
    EXPECT_EQ_INT(shardopt_config_set(&c, "ns_precondition", "aol"), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_config_set(&c, "ns_coeffs", "aol"), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_config_set(&c, "ns_steps", "4"), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_config_validate(&c), SHARDOPT_OK);
    c.ns_strategy = SHARDOPT_NS_STRATEGY_SHARDED;
    EXPECT_EQ_INT(shardopt_config_validate(&c), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "ns_precondition = aol with ns_strategy = sharded");
    c.ns_strategy = SHARDOPT_NS_STRATEGY_AUTO;
    EXPECT_EQ_INT(shardopt_config_validate(&c), SHARDOPT_ERR_INVALID_ARGUMENT);
    c.ns_precondition = (shardopt_ns_precondition_t)2;
    c.ns_strategy = SHARDOPT_NS_STRATEGY_GATHER;
    EXPECT_EQ_INT(shardopt_config_validate(&c), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "one of frobenius, aol");

    /* Newton-Schulz teams: a power of two up to 64, a fraction in (0, 1] */
    c = (shardopt_config_t)SHARDOPT_CONFIG_INIT;
    EXPECT_EQ_INT(c.ns_team_cap, 1);
    EXPECT_EQ_INT(shardopt_config_set(&c, "ns_team_cap", "8"), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_config_set(&c, "ns_team_frac", "0.01"), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_config_validate(&c), SHARDOPT_OK);
    c.ns_team_cap = 6;
    EXPECT_EQ_INT(shardopt_config_validate(&c), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "ns_team_cap = 6: accepted a power of two, 1..64");
    EXPECT_EQ_INT(shardopt_config_set(&c, "ns_team_cap", "128"), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "ns_team_cap");
    EXPECT_EQ_INT(shardopt_config_set(&c, "ns_team_cap", "0"), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ_INT(shardopt_config_set(&c, "ns_team_frac", "0"), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "ns_team_frac");
    EXPECT_EQ_INT(shardopt_config_set(&c, "ns_team_frac", "1.5"), SHARDOPT_ERR_INVALID_ARGUMENT);

    c = (shardopt_config_t)SHARDOPT_CONFIG_INIT;
    c.version = 99;
    EXPECT_EQ_INT(shardopt_config_validate(&c), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "version = 99");
    EXPECT_EQ_INT(shardopt_config_validate(NULL), SHARDOPT_ERR_INVALID_ARGUMENT);
}

TEST(env_overlays_and_refuses)
{
    shardopt_config_t c = SHARDOPT_CONFIG_INIT;
    setenv("SHARDOPT_MOMENTUM", "0.9", 1);
    setenv("SHARDOPT_NS_COEFFS", "jordan", 1);
    setenv("SHARDOPT_MOMENTUM_DTYPE", "bf16", 1);
    setenv("SHARDOPT_NESTEROV", "true", 1);
    setenv("SHARDOPT_SEED", "18446744073709551615", 1);
    EXPECT_EQ_INT(shardopt_config_from_env(&c), SHARDOPT_OK);
    EXPECT_NEAR(c.momentum, 0.9, 0);
    EXPECT_EQ_INT(c.ns_coeffs, SHARDOPT_NS_JORDAN);
    EXPECT_EQ_INT(c.momentum_dtype, SHARDOPT_DTYPE_BF16);
    EXPECT_EQ_INT(c.nesterov, 1);
    EXPECT_TRUE(c.seed == UINT64_MAX);

    shardopt_config_t before = c;
    setenv("SHARDOPT_NS_STEPS", "40", 1);
    EXPECT_EQ_INT(shardopt_config_from_env(&c), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "SHARDOPT_NS_STEPS");
    EXPECT_STR_CONTAINS(shardopt_last_error(), "'40'");
    EXPECT_TRUE(memcmp(&c, &before, sizeof c) == 0);
    setenv("SHARDOPT_NS_STEPS", "99999999999999999999", 1);
    EXPECT_EQ_INT(shardopt_config_from_env(&c), SHARDOPT_ERR_INVALID_ARGUMENT);
    unsetenv("SHARDOPT_NS_STEPS");
    setenv("SHARDOPT_SEED", "-1", 1);
    EXPECT_EQ_INT(shardopt_config_from_env(&c), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "SHARDOPT_SEED");
    unsetenv("SHARDOPT_SEED");
    setenv("SHARDOPT_MOMENTUM", "0.5x", 1);
    EXPECT_EQ_INT(shardopt_config_from_env(&c), SHARDOPT_ERR_INVALID_ARGUMENT);
    setenv("SHARDOPT_MOMENTUM", "-0.1", 1);
    EXPECT_EQ_INT(shardopt_config_from_env(&c), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "SHARDOPT_MOMENTUM");
    unsetenv("SHARDOPT_MOMENTUM");

    /* custom triples set the step count */
    setenv("SHARDOPT_NS_COEFFS", "custom", 1);
    setenv("SHARDOPT_NS_CUSTOM_COEFFS", "3,-4,2;1.5,-0.5,0.25", 1);
    c = (shardopt_config_t)SHARDOPT_CONFIG_INIT;
    EXPECT_EQ_INT(shardopt_config_from_env(&c), SHARDOPT_OK);
    EXPECT_EQ_INT(c.ns_steps, 2);
    EXPECT_NEAR(c.ns_custom_coeffs[1][2], 0.25, 0);
    setenv("SHARDOPT_NS_CUSTOM_COEFFS", "3,-4", 1);
    EXPECT_EQ_INT(shardopt_config_from_env(&c), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "SHARDOPT_NS_CUSTOM_COEFFS");
    unsetenv("SHARDOPT_NS_CUSTOM_COEFFS");
    unsetenv("SHARDOPT_NS_COEFFS");
    unsetenv("SHARDOPT_MOMENTUM_DTYPE");
    unsetenv("SHARDOPT_NESTEROV");
}

TEST(json_loads_every_kind_of_key)
{
    shardopt_config_t c = SHARDOPT_CONFIG_INIT;
    const char *path =
        write_json("{\"momentum\": 0.9, \"nesterov\": true, \"ns_coeffs\": \"polar_express\", "
                   "\"ns_steps\": 8, \"comm_dtype\": \"fp32\", \"seed\": \"12345678901234567890\", "
                   "\"adamw_patterns\": \"embed,=head.weight\", \"num_threads\": 2}");
    EXPECT_EQ_INT(shardopt_config_load_json(path, &c), SHARDOPT_OK);
    EXPECT_NEAR(c.momentum, 0.9, 0);
    EXPECT_EQ_INT(c.nesterov, 1);
    EXPECT_EQ_INT(c.ns_coeffs, SHARDOPT_NS_POLAR_EXPRESS);
    EXPECT_EQ_INT(c.ns_steps, 8);
    EXPECT_EQ_INT(c.comm_dtype, SHARDOPT_DTYPE_FP32);
    EXPECT_TRUE(c.seed == 12345678901234567890ull);
    EXPECT_TRUE(strcmp(c.adamw_patterns, "embed,=head.weight") == 0);
    EXPECT_EQ_INT(c.num_threads, 2);

    c = (shardopt_config_t)SHARDOPT_CONFIG_INIT;
    path = write_json("{\"ns_coeffs\": \"custom\", \"ns_custom_coeffs\": [[3, -4, 2], [2, -1.5, "
                      "0.5], [1.875, -1.25, 0.375]]}");
    EXPECT_EQ_INT(shardopt_config_load_json(path, &c), SHARDOPT_OK);
    EXPECT_EQ_INT(c.ns_steps, 3);
    EXPECT_NEAR(c.ns_custom_coeffs[2][0], 1.875, 0);
    unlink(path);
}

TEST(json_refuses_bad_input_and_leaves_config_unchanged)
{
    expect_json_refused("{\"momentun\": 0.9}", "unknown key", "momentun");
    expect_json_refused("{\"momentum\": \"0.9\"}", "momentum", "must be a number");
    expect_json_refused("{\"momentum\": 1.5}", "momentum", "[0, 1)");
    expect_json_refused("{\"nesterov\": 1}", "nesterov", "true or false");
    expect_json_refused("{\"ns_steps\": 2.5}", "ns_steps", "integers");
    expect_json_refused("{\"ns_steps\": 1e300}", "ns_steps", NULL);
    expect_json_refused("{\"ns_coeffs\": \"cubic\"}", "ns_coeffs", "'cubic'");
    expect_json_refused("{\"ns_coeffs\": 1}", "ns_coeffs", "must be a string");
    expect_json_refused("{\"momentum_dtype\": \"fp16\"}", "momentum_dtype", "fp32, bf16");
    expect_json_refused("{\"lr_scale\": \"rms\"}", "lr_scale", "rms_norm");
    expect_json_refused("{\"seed\": -3}", "seed", NULL);
    expect_json_refused("{\"momentum\": 0.9, \"momentum\": 0.8}", "momentum", "twice");
    expect_json_refused("[1, 2]", "top level", NULL);
    expect_json_refused("{\"momentum\": 0.9", "not valid JSON", NULL);
    expect_json_refused("{\"ns_coeffs\": \"custom\", \"ns_steps\": 2, \"ns_custom_coeffs\": "
                        "[[1, 2, 3]]}",
                        "ns_steps = 2", "1 triples");
    expect_json_refused("{\"ns_custom_coeffs\": [[1, 2]]}", "ns_custom_coeffs", "3 numbers");

    shardopt_config_t c = SHARDOPT_CONFIG_INIT;
    EXPECT_EQ_INT(shardopt_config_load_json("/nonexistent/shardopt.json", &c), SHARDOPT_ERR_IO);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "/nonexistent/shardopt.json");
}

/* A config file is exactly one JSON value and blanks: cJSON alone loaded the first object of
 * `{"momentum":0.5} {"ep":2}` (ep silently dropped), cut keys and values at "\u0000"
 * ("embed\u0000,w" became "embed"), stopped at a raw NUL byte, and took "05", control bytes
 * between tokens and a byte-order mark. Each is refused naming the byte offset, config unchanged.
 */
TEST(json_refuses_text_that_is_not_exactly_one_json_value)
{
    expect_json_refused("{\"momentum\":0.5} {\"ep\":2}", "byte 17", "text after the JSON object");
    expect_json_refused("{\"momentum\":0.5}x", "byte 16", "text after");
    expect_json_refused("{\"momentum\\u0000x\":0.5}", "byte 10", "\\u0000 in a string");
    expect_json_refused("{\"adamw_patterns\": \"embed\\u0000,w\"}", "byte 25",
                        "\\u0000 in a string");
    expect_json_refused("{\"ns_steps\": 05}", "byte 13", "number '05'");
    expect_json_refused("{\"momentum\": -.5}", "byte 13", "number '-.5'");
    expect_json_refused("{\x01\"momentum\":0.5}", "byte 1", "control character 0x01");
    expect_json_refused("\xef\xbb\xbf{\"momentum\":0.5}", "byte 0",
                        "not the start of a JSON value");
    expect_json_refused("{\"adamw_patterns\": \"a\xc3\"}", "byte 21", "invalid UTF-8");
    expect_json_refused("{\"ep\": 1, \"ep\": 2}", "'ep'", "appears twice");
    /* a raw NUL is not where the text ends: the file is read to its last byte */
    static const char raw[] = "{\"momentum\":0.5}\0{\"ep\":2}";
    char path[128];
    tmp_path(path, sizeof path, "cfg_nul.json");
    FILE *f = fopen(path, "wb");
    ASSERT_TRUE(f != NULL);
    fwrite(raw, 1, sizeof raw - 1, f);
    fclose(f);
    shardopt_config_t c = SHARDOPT_CONFIG_INIT, before = c;
    EXPECT_EQ_INT(shardopt_config_load_json(path, &c), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "byte 16 is a NUL byte");
    EXPECT_TRUE(memcmp(&c, &before, sizeof c) == 0);
    unlink(path);
    /* blanks after the object, and an escaped backslash before "u0000", are JSON */
    const char *ok = write_json("{\"adamw_patterns\": \"a\\\\u0000\"} \n\t\r\n");
    EXPECT_EQ_INT(shardopt_config_load_json(ok, &c), SHARDOPT_OK);
    EXPECT_TRUE(strcmp(c.adamw_patterns, "a\\u0000") == 0);
}

/* Text from a file or a variable reaches messages: an escaped CR, ESC or DEL in a JSON key or
 * value (valid JSON), a CR in an environment variable's value. The message holds no control byte
 * (a raw CR moves the terminal back over what was wrong, ESC starts a terminal sequence), each
 * shown escaped; valid UTF-8 stays as it is. */
static void expect_no_control_bytes(const char *msg, const char *shown)
{
    for (const unsigned char *c = (const unsigned char *)msg; *c != '\0'; c++)
        EXPECT_TRUE(*c >= 0x20 && *c != 0x7f);
    EXPECT_STR_CONTAINS(msg, shown);
}

TEST(messages_show_control_characters_from_files_and_variables_escaped)
{
    shardopt_config_t c = SHARDOPT_CONFIG_INIT;
    const char *path = write_json("{\"momen\\rtum\": 0.5}");
    EXPECT_EQ_INT(shardopt_config_load_json(path, &c), SHARDOPT_ERR_INVALID_ARGUMENT);
    expect_no_control_bytes(shardopt_last_error(), "momen\\rtum");
    path = write_json("{\"offload\": \"cpu\\u001b[2J\u00e9\"}");
    EXPECT_EQ_INT(shardopt_config_load_json(path, &c), SHARDOPT_ERR_INVALID_ARGUMENT);
    expect_no_control_bytes(shardopt_last_error(), "cpu\\x1b[2J\xc3\xa9");
    setenv("SHARDOPT_OFFLOAD", "cpu\r\x7f", 1);
    EXPECT_EQ_INT(shardopt_config_from_env(&c), SHARDOPT_ERR_INVALID_ARGUMENT);
    unsetenv("SHARDOPT_OFFLOAD");
    expect_no_control_bytes(shardopt_last_error(), "cpu\\r\\x7f");
}

/* The file's size limit: a valid file padded with blanks to exactly 1 MiB loads; one byte more
 * is refused, naming the limit, and the config stays as it was. */
TEST(json_file_of_the_limit_loads_and_one_byte_more_is_refused)
{
    const char *obj = "{\"momentum\": 0.9}";
    for (int extra = 0; extra < 2; extra++) {
        const size_t size = ((size_t)1 << 20) + (size_t)extra;
        char *text = malloc(size + 1);
        ASSERT_TRUE(text != NULL);
        memset(text, ' ', size);
        memcpy(text, obj, strlen(obj));
        text[size] = '\0';
        const char *path = write_json(text);
        free(text);
        shardopt_config_t c = SHARDOPT_CONFIG_INIT, before = c;
        shardopt_status_t st = shardopt_config_load_json(path, &c);
        if (extra == 0) {
            EXPECT_EQ_INT(st, SHARDOPT_OK);
            EXPECT_NEAR(c.momentum, 0.9, 0);
        } else {
            EXPECT_EQ_INT(st, SHARDOPT_ERR_INVALID_ARGUMENT);
            EXPECT_STR_CONTAINS(shardopt_last_error(), "larger than 1048576 bytes");
            EXPECT_TRUE(memcmp(&c, &before, sizeof c) == 0);
        }
        unlink(path);
    }
}

/* A config path naming a FIFO (a shell's `<(...)`, or one planted in a shared directory), a
 * directory or a device: refused at once, naming the path and what it is, the config unchanged.
 * fopen of a FIFO used to wait for a writer for good (alarm: a hang fails the test); a directory
 * read as an empty file ("not valid JSON"). */
TEST(a_config_path_that_is_not_a_regular_file_is_refused_without_waiting)
{
    char fifo[128], dir[128];
    tmp_path(fifo, sizeof fifo, "fifo");
    tmp_path(dir, sizeof dir, "dir");
    ASSERT_EQ_INT(mkfifo(fifo, 0600), 0);
    ASSERT_EQ_INT(mkdir(dir, 0700), 0);
    const struct {
        const char *path, *what;
    } cases[] = {{fifo, "is a FIFO, expected a regular file"},
                 {dir, "is a directory, expected a regular file"},
                 {"/dev/zero", "is a character device, expected a regular file"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        shardopt_config_t c = SHARDOPT_CONFIG_INIT, before = c;
        alarm(30);
        EXPECT_EQ_INT(shardopt_config_load_json(cases[i].path, &c), SHARDOPT_ERR_INVALID_ARGUMENT);
        alarm(0);
        EXPECT_STR_CONTAINS(shardopt_last_error(), cases[i].path);
        EXPECT_STR_CONTAINS(shardopt_last_error(), cases[i].what);
        EXPECT_TRUE(memcmp(&c, &before, sizeof c) == 0);
    }
    unlink(fifo);
    rmdir(dir);
}

TEST(print_lists_every_key)
{
    shardopt_config_t c = SHARDOPT_CONFIG_INIT;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    EXPECT_EQ_INT(shardopt_config_print(&c, f), SHARDOPT_OK);
    fclose(f);
    EXPECT_STR_CONTAINS(buf, "momentum             = 0.95\n");
    EXPECT_STR_CONTAINS(buf, "ns_coeffs            = quintic");
    EXPECT_STR_CONTAINS(buf, "comm_dtype           = bf16");
    EXPECT_STR_CONTAINS(buf, "adamw_patterns       = embed,lm_head,=output.weight,wte.,wpe.");
    /* every key has its line, once */
    char *text = malloc(len + 2);
    ASSERT_TRUE(text != NULL);
    text[0] = '\n';
    memcpy(text + 1, buf, len + 1);
    int lines = 0;
    for (const char *p = text; *p != '\0'; p++)
        lines += *p == '\n';
    for (size_t i = 0; i < config_key_count; i++) {
        char needle[96];
        snprintf(needle, sizeof needle, "\n%-20s = ", config_keys[i].name);
        const char *at = strstr(text, needle);
        if (at == NULL || strstr(at + 1, needle) != NULL)
            TEST_FAIL_("config_print: no line, or two, for key '%s'", config_keys[i].name);
    }
    EXPECT_EQ_INT(lines - 1, (int)config_key_count); /* and nothing else */
    free(text);
    free(buf);
}

TEST(older_smaller_struct_is_accepted_and_kept_small)
{
    /* A caller compiled against a header whose config ended at num_threads still works. */
    shardopt_config_t c = SHARDOPT_CONFIG_INIT;
    c.size = offsetof(shardopt_config_t, num_threads) + sizeof(int);
    setenv("SHARDOPT_NUM_THREADS", "3", 1);
    EXPECT_EQ_INT(shardopt_config_from_env(&c), SHARDOPT_OK);
    EXPECT_EQ_INT(c.num_threads, 3);
    EXPECT_EQ_INT(c.size, offsetof(shardopt_config_t, num_threads) + sizeof(int));
    unsetenv("SHARDOPT_NUM_THREADS");
    c.size = 8;
    EXPECT_EQ_INT(shardopt_config_validate(&c), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "config.size = 8");
}

/* What a language binding uses in place of SHARDOPT_CONFIG_INIT and field assignment. */
TEST(config_init_and_set_for_bindings)
{
    shardopt_config_t want = SHARDOPT_CONFIG_INIT;
    unsigned char buf[sizeof(shardopt_config_t) + 64];
    shardopt_config_t *c = (shardopt_config_t *)buf;
    memset(buf, 0xa5, sizeof buf);
    EXPECT_EQ_INT(shardopt_config_init(c, sizeof buf), SHARDOPT_OK);
    EXPECT_EQ_INT(c->size, sizeof(shardopt_config_t));
    EXPECT_EQ_INT(buf[sizeof(shardopt_config_t)], 0xa5); /* nothing past the struct */
    EXPECT_EQ_INT(c->apply_env, 0); /* the one difference: a binding's config is its arguments */
    want.apply_env = 0;
    EXPECT_EQ_INT(memcmp(c, &want, sizeof want), 0);
    EXPECT_EQ_INT(shardopt_config_init(c, 4), SHARDOPT_ERR_INVALID_ARGUMENT);

    EXPECT_EQ_INT(shardopt_config_set(c, "momentum", "0.9"), SHARDOPT_OK);
    EXPECT_NEAR(c->momentum, 0.9, 0);
    EXPECT_EQ_INT(shardopt_config_set(c, "momentum_dtype", "bf16"), SHARDOPT_OK);
    EXPECT_EQ_INT(c->momentum_dtype, SHARDOPT_DTYPE_BF16);
    EXPECT_EQ_INT(shardopt_config_set(c, "ns_custom_coeffs", "1,0,0;2,0,0"), SHARDOPT_OK);
    EXPECT_EQ_INT(c->ns_steps, 2);
    /* refused, named, and nothing changed */
    EXPECT_EQ_INT(shardopt_config_set(c, "momentum", "1.5"), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "momentum");
    EXPECT_STR_CONTAINS(shardopt_last_error(), "1.5");
    EXPECT_NEAR(c->momentum, 0.9, 0);
    EXPECT_EQ_INT(shardopt_config_set(c, "momentun", "0.5"), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "unknown key 'momentun'");
    EXPECT_EQ_INT(shardopt_config_set(c, "offload", "gpu"), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "optimizer");
    EXPECT_EQ_INT(c->offload, SHARDOPT_OFFLOAD_NONE);
}

/* docs/config.md documents every key the library accepts (the docs stay true to the code). */
TEST(every_key_is_documented)
{
    FILE *f = fopen(SHARDOPT_DOCS_DIR "/config.md", "rb");
    ASSERT_TRUE(f != NULL);
    static char doc[1 << 17];
    const size_t n = fread(doc, 1, sizeof doc - 1, f);
    fclose(f);
    doc[n] = '\0';
    int missing = 0;
    for (size_t i = 0; i < config_key_count; i++) {
        char needle[96];
        snprintf(needle, sizeof needle, "| `%s` |", config_keys[i].name);
        if (strstr(doc, needle) == NULL) {
            fprintf(stderr, "  docs/config.md has no row for `%s`\n", config_keys[i].name);
            missing++;
        }
    }
    EXPECT_EQ_INT(missing, 0);
    EXPECT_TRUE(config_key_count >= 44);
}

/* A number below the smallest normal double, written in a JSON file, given to config_set or in
 * a variable, is refused: it read as 0, and comm_timeout_s = 0 means "never time out". And
 * apply_env, a flag that is not a key, is held to 0 or 1 as the keys' flags are. */
TEST(numbers_too_small_for_a_double_and_flags_out_of_range_are_refused)
{
    shardopt_config_t c = SHARDOPT_CONFIG_INIT, before = c;

    EXPECT_EQ_INT(shardopt_config_set(&c, "comm_timeout_s", "1e-400"),
                  SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "comm_timeout_s (config_set) = '1e-400'");
    EXPECT_EQ_INT(shardopt_config_set(&c, "ns_custom_coeffs", "1e-400,1,1"),
                  SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(memcmp(&c, &before, sizeof c) == 0);
    setenv("SHARDOPT_COMM_TIMEOUT_S", "2.5e-320", 1);
    EXPECT_EQ_INT(shardopt_config_from_env(&c), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "SHARDOPT_COMM_TIMEOUT_S");
    unsetenv("SHARDOPT_COMM_TIMEOUT_S");
    EXPECT_TRUE(memcmp(&c, &before, sizeof c) == 0);
    expect_json_refused("{\"comm_timeout_s\": 1e-400}", "number '1e-400' is too small for a double",
                        "byte 19");
    expect_json_refused("{\"momentum\": -5e-324}", "number '-5e-324' is too small", NULL);
    /* a plain 0 and the smallest normal double still load */
    const char *path = write_json("{\"comm_timeout_s\": 0e-400, \"momentum\": 2.3e-308}");
    EXPECT_EQ_INT(shardopt_config_load_json(path, &c), SHARDOPT_OK);
    EXPECT_TRUE(c.comm_timeout_s == 0 && c.momentum == 2.3e-308);
    unlink(path);

    c = before;
    c.apply_env = 2;
    EXPECT_EQ_INT(shardopt_config_validate(&c), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "apply_env = 2: accepted 0");
}

/* A JSON number for a 64-bit key (seed, bucket_bytes, host_store_limit) from 2^53 on is not the
 * integer written: 9007199254740993 read as 9007199254740992, a seed silently off by one (before:
 * accepted). Refused, naming the string form; 2^53 - 1 and the string form load exactly. */
TEST(json_integers_a_double_cannot_hold_exactly_are_refused)
{
    shardopt_config_t c = SHARDOPT_CONFIG_INIT;
    expect_json_refused("{\"seed\": 9007199254740993}",
                        "key 'seed' must be an integer in [0, 2^53)", "decimal string");
    expect_json_refused("{\"bucket_bytes\": 9007199254740992}", "key 'bucket_bytes'", NULL);
    const char *path = write_json("{\"seed\": 9007199254740991, \"host_store_limit\": "
                                  "\"9007199254740993\"}");
    EXPECT_EQ_INT(shardopt_config_load_json(path, &c), SHARDOPT_OK);
    EXPECT_TRUE(c.seed == 9007199254740991ull && c.host_store_limit == 9007199254740993ull);
    unlink(path);
}

/* Custom Newton-Schulz coefficients beyond what the fp32 kernels can use are refused from every
 * source. Before: (1e300, 1e300, 1e300) validated, and a step that returned OK left every weight
 * NaN (the kernels take them as fp32: inf). */
TEST(custom_coefficients_beyond_the_kernels_range_are_refused)
{
    shardopt_config_t c = SHARDOPT_CONFIG_INIT, before = c;

    c.ns_coeffs = SHARDOPT_NS_CUSTOM;
    c.ns_steps = 1;
    c.ns_custom_coeffs[0][0] = 1e300;
    c.ns_custom_coeffs[0][1] = 1;
    c.ns_custom_coeffs[0][2] = 1;
    EXPECT_EQ_INT(shardopt_config_validate(&c), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "ns_custom_coeffs step 0 = (1e+300, 1, 1)");
    EXPECT_STR_CONTAINS(shardopt_last_error(), "each in [-1000, 1000]");
    c.ns_custom_coeffs[0][0] = -1000;
    EXPECT_EQ_INT(shardopt_config_validate(&c), SHARDOPT_OK);
    c = before;
    ASSERT_EQ_INT(shardopt_config_set(&c, "ns_coeffs", "custom"), SHARDOPT_OK);
    before = c;
    EXPECT_EQ_INT(shardopt_config_set(&c, "ns_custom_coeffs", "3,-4,2;1001,0,0"),
                  SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(memcmp(&c, &before, sizeof c) == 0);
    expect_json_refused("{\"ns_coeffs\": \"custom\", \"ns_custom_coeffs\": [[3, -4, 2e5]]}",
                        "ns_custom_coeffs", "1000");
}

/* adamw_patterns holding a control character or bytes that are not UTF-8 (which no parameter
 * name can hold: register refuses them) is refused from every source. Before: accepted, matched
 * nothing, and shardopt_config_print wrote the raw bytes (an ESC sequence) to the stream. */
TEST(patterns_with_control_characters_or_not_utf8_are_refused)
{
    shardopt_config_t c = SHARDOPT_CONFIG_INIT, before = c;

    EXPECT_EQ_INT(shardopt_config_set(&c, "adamw_patterns", "embed\x1b[2J"),
                  SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "embed\\x1b[2J");
    EXPECT_STR_CONTAINS(shardopt_last_error(), "without control characters");
    EXPECT_EQ_INT(shardopt_config_set(&c, "adamw_patterns", "embed,\xff"),
                  SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(memcmp(&c, &before, sizeof c) == 0);
    expect_json_refused("{\"adamw_patterns\": \"embed\\u0007\"}", "adamw_patterns", NULL);
    strcpy(c.adamw_patterns, "lm_head,\t=bias");
    EXPECT_EQ_INT(shardopt_config_validate(&c), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "adamw_patterns");
    c = before;
    EXPECT_EQ_INT(shardopt_config_set(&c, "adamw_patterns", "couche.\xc3\xa9,lm_head"),
                  SHARDOPT_OK);
}

/* comm_timeout_s: 0 (never) or at least a millisecond; 1e-300 was taken (the first wait not
 * already complete ended the job). Refused naming the key, the value and the range. */
TEST(comm_timeout_s_below_a_millisecond_but_not_zero_is_refused)
{
    shardopt_config_t c = SHARDOPT_CONFIG_INIT, before = c;
    c.comm_timeout_s = 1e-300;
    EXPECT_EQ_INT(shardopt_config_validate(&c), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(),
                        "comm_timeout_s = 1e-300: accepted 0 or [0.001, 1000000]");
    c = before;
    EXPECT_EQ_INT(shardopt_config_set(&c, "comm_timeout_s", "0.0009"),
                  SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "'0.0009': accepted 0 or [0.001, 1000000]");
    EXPECT_TRUE(memcmp(&c, &before, sizeof c) == 0);
    EXPECT_EQ_INT(shardopt_config_set(&c, "comm_timeout_s", "0"), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_config_set(&c, "comm_timeout_s", "0.001"), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_config_validate(&c), SHARDOPT_OK);
}

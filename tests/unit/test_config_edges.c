/* Every numeric config key at each end of its documented range and one step past it (the next
 * int, the next double; the bound itself where it is open), through each way a value arrives:
 * the struct (shardopt_config_validate), shardopt_config_set, a SHARDOPT_<KEY> variable and a
 * JSON file. Each source must accept the values inside and refuse, naming the key, those outside,
 * leaving the config unchanged: one source that took a value another refuses would let a job
 * start from a file with what its command line rejects. */
#include <float.h>
#include <unistd.h>

#include "runtime/config/config_keys.h"
#include "shardopt.h"
#include "test.h"

static void put(const struct config_key *k, shardopt_config_t *c, double v)
{
    if (k->type == CFG_INT)
        *(int *)((char *)c + k->offset) = (int)v;
    else
        *(double *)((char *)c + k->offset) = v;
}

/* The value as text a reader takes back exactly (a denormal is not one: text refuses it). */
static void text_of(const struct config_key *k, double v, char *out, size_t len)
{
    if (k->type == CFG_INT)
        snprintf(out, len, "%d", (int)v);
    else
        snprintf(out, len, "%.17g", v);
}

/* Each source must take `v` for key k (want 1) or refuse it leaving the config unchanged. */
static void check_value(const struct config_key *k, double v, int want)
{
    shardopt_config_t c = SHARDOPT_CONFIG_INIT, before;
    char text[64], env[96], json[160], path[] = "/tmp/shardopt_edges_XXXXXX";
    c.apply_env = 0;
    /* ns_norm_scale's own range, [0.5, 2], holds with aol; frobenius needs 1 and up, a rule
     * between two keys (test_ns_guards / norm_scale_below_one_needs_aol_...) */
    if (strcmp(k->name, "ns_norm_scale") == 0)
        c.ns_precondition = SHARDOPT_NS_PRECONDITION_AOL;
    before = c;
    text_of(k, v, text, sizeof text);

    put(k, &c, v);
    const int by_struct = shardopt_config_validate(&c) == SHARDOPT_OK;
    c = before;
    const int by_set = shardopt_config_set(&c, k->name, text) == SHARDOPT_OK;
    if (!by_set)
        EXPECT_TRUE(memcmp(&c, &before, sizeof c) == 0);
    c = before;
    config_key_env_name(k, env, sizeof env);
    setenv(env, text, 1);
    const int by_env = shardopt_config_from_env(&c) == SHARDOPT_OK;
    unsetenv(env);
    c = before;
    const int fd = mkstemp(path);
    const int n = snprintf(json, sizeof json, "{\"%s\": %s}\n", k->name, text);
    EXPECT_TRUE(fd >= 0 && write(fd, json, (size_t)n) == n);
    close(fd);
    const int by_json = shardopt_config_load_json(path, &c) == SHARDOPT_OK;
    unlink(path);
    if (by_struct != want || by_set != want || by_env != want || by_json != want)
        TEST_FAIL_("key %s = %s: want %s; struct %d, config_set %d, env %d, json %d", k->name, text,
                   want ? "accepted" : "refused", by_struct, by_set, by_env, by_json);
    test_checks++;
}

TEST(every_numeric_key_at_and_just_past_each_end_of_its_range)
{
    int keys = 0;
    for (size_t i = 0; i < config_key_count; i++) {
        const struct config_key *k = &config_keys[i];
        if (k->type != CFG_INT && k->type != CFG_DOUBLE)
            continue;
        keys++;
        const int is_int = k->type == CFG_INT;
        /* inside: the bound, or the next value toward the range where it is open (the smallest
         * normal double above an open 0: text cannot say a denormal) */
        double lo_in = k->min, hi_in = k->max;
        if (k->min_open)
            lo_in = is_int ? k->min + 1 : (k->min == 0 ? DBL_MIN : nextafter(k->min, INFINITY));
        if (k->max_open)
            hi_in = is_int ? k->max - 1 : nextafter(k->max, -INFINITY);
        const double lo_out = k->min_open ? k->min
                              : is_int    ? k->min - 1
                                          : nextafter(k->min, -INFINITY);
        const double hi_out = k->max_open ? k->max
                              : is_int    ? k->max + 1
                                          : nextafter(k->max, INFINITY);
        check_value(k, lo_in, 1);
        check_value(k, hi_in, 1);
        /* an int key's special value (dp_shard -1: the rest) sits just below its range */
        if (!(k->has_special && lo_out == k->special) && !(is_int && lo_out < INT32_MIN))
            check_value(k, lo_out, 0);
        if (!(is_int && hi_out > INT32_MAX))
            check_value(k, hi_out, 0);
    }
    EXPECT_TRUE(keys > 20);
}

/* An int key given an integral number written with a fraction or an exponent ("5.0", "5e0",
 * "5."): a JSON file took it and config_set and SHARDOPT_<KEY> refused it, as "accepted
 * [1, 16]", a range 5.0 lies in. Every source now takes it, and refuses "5.5" alike, naming the
 * key, the value and integers, the config unchanged (docs/config.md: a value given as text says
 * what the JSON value would). */
static int json_set(const char *key, const char *text, shardopt_config_t *c)
{
    char json[160], path[] = "/tmp/shardopt_edges_XXXXXX";
    const int fd = mkstemp(path);
    const int n = snprintf(json, sizeof json, "{\"%s\": %s}\n", key, text);
    EXPECT_TRUE(fd >= 0 && write(fd, json, (size_t)n) == n);
    close(fd);
    const int st = shardopt_config_load_json(path, c);
    unlink(path);
    return st;
}

TEST(int_keys_take_an_integral_number_from_every_source_alike)
{
    int keys = 0;
    for (size_t i = 0; i < config_key_count; i++) {
        const struct config_key *k = &config_keys[i];
        if (k->type != CFG_INT)
            continue;
        keys++;
        const int lo = (int)(k->min_open ? k->min + 1 : k->min);
        const char *forms[] = {"%d.0", "%de0", "%d.", "%d.5"};
        for (size_t f = 0; f < sizeof forms / sizeof forms[0]; f++) {
            const int want = f < 3; /* "N.5" is no integer */
            shardopt_config_t c = SHARDOPT_CONFIG_INIT, before, by_set;
            char text[64], env[96];
            c.apply_env = 0;
            before = c;
            snprintf(text, sizeof text, forms[f], lo);
            const int set = shardopt_config_set(&c, k->name, text) == SHARDOPT_OK;
            if (!set) {
                EXPECT_STR_CONTAINS(shardopt_last_error(), k->name);
                EXPECT_STR_CONTAINS(shardopt_last_error(), "accepted integers");
                EXPECT_TRUE(memcmp(&c, &before, sizeof c) == 0);
            } else {
                EXPECT_EQ_INT(*(const int *)((const char *)&c + k->offset), lo);
            }
            by_set = c;
            c = before;
            config_key_env_name(k, env, sizeof env);
            setenv(env, text, 1);
            const int by_env = shardopt_config_from_env(&c) == SHARDOPT_OK;
            unsetenv(env);
            if (!by_env)
                EXPECT_STR_CONTAINS(shardopt_last_error(), env);
            EXPECT_TRUE(memcmp(&c, by_env ? &by_set : &before, sizeof c) == 0);
            c = before;
            const int by_json = json_set(k->name, text[strlen(text) - 1] == '.' ? "0" : text, &c);
            if (set != want || by_env != want ||
                (text[strlen(text) - 1] != '.' && (by_json == SHARDOPT_OK) != want))
                TEST_FAIL_("key %s = %s: want %s; config_set %d, env %d, json %d", k->name, text,
                           want ? "accepted" : "refused", set, by_env, by_json == SHARDOPT_OK);
            test_checks++;
        }
    }
    EXPECT_TRUE(keys >= 8);
    /* text that is no number keeps the plain range; a 64-bit key takes 1e3 below 2^53 */
    shardopt_config_t c = SHARDOPT_CONFIG_INIT;
    EXPECT_EQ_INT(shardopt_config_set(&c, "ns_steps", "five"), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "'five': accepted [1, 16]");
    EXPECT_EQ_INT(shardopt_config_set(&c, "seed", "1e3"), SHARDOPT_OK);
    EXPECT_TRUE(c.seed == 1000);
    EXPECT_EQ_INT(shardopt_config_set(&c, "seed", "9007199254740992.0"),
                  SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ_INT(shardopt_config_set(&c, "seed", "1.5"), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(c.seed == 1000);
}

/* shardopt_config_print's output sets back line by line through shardopt_config_set, each key
 * to the same value: the defaults, a custom table, and a config whose table is not in use
 * (printed "(unused)", which config_set refused: a printed config could not be replayed, and the
 * libFuzzer config_set target could not round-trip the key). */
static void print_sets_back(const shardopt_config_t *cfg)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    EXPECT_TRUE(f != NULL);
    EXPECT_EQ_INT(shardopt_config_print(cfg, f), SHARDOPT_OK);
    fclose(f);
    shardopt_config_t again = SHARDOPT_CONFIG_INIT;
    again.apply_env = 0;
    int keys = 0;
    for (char *line = strtok(text, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        char *eq = strstr(line, " = ");
        EXPECT_TRUE(eq != NULL);
        char *end = line + strcspn(line, " ");
        *end = '\0';
        const char *value = eq + 3;
        if (shardopt_config_set(&again, line, value) != SHARDOPT_OK)
            TEST_FAIL_("printed %s = %s is not taken back: %s", line, value, shardopt_last_error());
        keys++;
    }
    free(text);
    EXPECT_EQ_INT(keys, (int)config_key_count);
    again.apply_env = cfg->apply_env;
    EXPECT_EQ_INT(shardopt_config_validate(&again), SHARDOPT_OK);
    for (size_t i = 0; i < config_key_count; i++) {
        char a[CONFIG_TEXT_MAX], b[CONFIG_TEXT_MAX];
        config_key_format(&config_keys[i], cfg, a, sizeof a);
        config_key_format(&config_keys[i], &again, b, sizeof b);
        if (strcmp(a, b) != 0)
            TEST_FAIL_("key %s printed %s, set back it prints %s", config_keys[i].name, a, b);
    }
    test_checks++;
}

TEST(a_printed_config_sets_back_key_by_key)
{
    shardopt_config_t c = SHARDOPT_CONFIG_INIT;
    c.apply_env = 0;
    print_sets_back(&c); /* ns_custom_coeffs = (unused) */
    EXPECT_EQ_INT(shardopt_config_set(&c, "ns_coeffs", "custom"), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_config_set(&c, "ns_custom_coeffs", "3.4445,-4.775,2.0315;1,0.1,-0.0001"),
                  SHARDOPT_OK);
    print_sets_back(&c);
    /* a table left behind when ns_coeffs changed back: printed (unused), taken as no table */
    EXPECT_EQ_INT(shardopt_config_set(&c, "ns_coeffs", "quintic"), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_config_set(&c, "ns_steps", "5"), SHARDOPT_OK);
    print_sets_back(&c);
    EXPECT_EQ_INT(shardopt_config_set(&c, "ns_custom_coeffs", "(unused)"), SHARDOPT_OK);
    EXPECT_TRUE(c.ns_custom_coeffs[0][0] == 0 && c.ns_custom_coeffs[1][2] == 0 && c.ns_steps == 5);
    /* custom with no table is still refused, at validate */
    EXPECT_EQ_INT(shardopt_config_set(&c, "ns_coeffs", "custom"), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_config_validate(&c), SHARDOPT_ERR_INVALID_ARGUMENT);
}

/* The environment rule (docs/config.md): shardopt_init applies SHARDOPT_* variables when the
 * config's apply_env is 1 (SHARDOPT_CONFIG_INIT), reads none when it is 0 (shardopt_config_init,
 * a version-1 config) and then warns about the ones set; typos, step arguments given as
 * variables, unknown JSON keys and adamw_patterns entries that match nothing are reported. The
 * log (stderr) is captured into a file to read the warnings back. */
#include <fcntl.h>
#include <stddef.h>
#include <unistd.h>

#include "base/env.h"
#include "fixture.h"
#include "runtime/config/config_keys.h"

static char captured[1 << 14];

/* Run fn with stderr going to a file; its text into `captured`. */
static void capture(void (*fn)(void *), void *arg)
{
    char path[] = "/tmp/shardopt_env_rule_XXXXXX";
    const int fd = mkstemp(path), saved = dup(2);
    fflush(stderr);
    dup2(fd, 2);
    fn(arg);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    lseek(fd, 0, SEEK_SET);
    const ssize_t n = read(fd, captured, sizeof captured - 1);
    captured[n > 0 ? n : 0] = '\0';
    close(fd);
    unlink(path);
}

struct init_case {
    shardopt_config_t cfg;
    shardopt_status_t status;
    shardopt_offload_t offload;
    int ep;
};

static void run_init(void *arg)
{
    struct init_case *c = arg;
    shardopt_runtime_t rt = NULL;
    c->status = shardopt_init(MPI_COMM_SELF, &c->cfg, &rt);
    if (rt != NULL) {
        c->offload = rt == NULL ? -1 : SHARDOPT_OFFLOAD_NONE;
        shardopt_stats_t st = SHARDOPT_STATS_INIT;
        shardopt_get_stats(rt, &st);
        c->offload = (shardopt_offload_t)st.offload;
        c->ep = st.ep_size;
    }
    shardopt_finalize(rt);
}

/* Before, init never read the environment: a launcher's SHARDOPT_OFFLOAD=bogus (or a valid
 * SHARDOPT_OFFLOAD=cpu) did nothing unless the trainer called shardopt_config_from_env. */
TEST(init_applies_the_environment_by_default)
{
    struct init_case c = {.cfg = SHARDOPT_CONFIG_INIT};
    EXPECT_EQ_INT(c.cfg.apply_env, 1);
    setenv("SHARDOPT_OFFLOAD", "bogus", 1);
    capture(run_init, &c);
    EXPECT_EQ_INT(c.status, SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(),
                        "init: rank 0: config SHARDOPT_OFFLOAD (env) = 'bogus'");
    EXPECT_STR_CONTAINS(shardopt_last_error(), "apply_env = 1");

    setenv("SHARDOPT_OFFLOAD", "cpu", 1);
    c = (struct init_case){.cfg = SHARDOPT_CONFIG_INIT};
    capture(run_init, &c);
    EXPECT_EQ_INT(c.status, SHARDOPT_OK);
    EXPECT_EQ_INT(c.offload, SHARDOPT_OFFLOAD_CPU);
    unsetenv("SHARDOPT_OFFLOAD");
}

/* apply_env = 0, shardopt_config_init's configs (bindings) and version-1 configs: the
 * environment is not applied, and each config variable set is logged as not applied. */
TEST(apply_env_0_ignores_the_environment_and_says_so)
{
    setenv("SHARDOPT_OFFLOAD", "bogus", 1);
    struct init_case c = {.cfg = SHARDOPT_CONFIG_INIT};
    c.cfg.apply_env = 0;
    capture(run_init, &c);
    EXPECT_EQ_INT(c.status, SHARDOPT_OK);
    EXPECT_EQ_INT(c.offload, SHARDOPT_OFFLOAD_NONE);
    EXPECT_STR_CONTAINS(captured, "init: SHARDOPT_OFFLOAD is set but not applied");

    c = (struct init_case){.status = SHARDOPT_ERR_INTERNAL};
    EXPECT_EQ_INT(shardopt_config_init(&c.cfg, sizeof c.cfg), SHARDOPT_OK);
    EXPECT_EQ_INT(c.cfg.apply_env, 0);
    capture(run_init, &c);
    EXPECT_EQ_INT(c.status, SHARDOPT_OK);
    EXPECT_EQ_INT(c.offload, SHARDOPT_OFFLOAD_NONE);

    /* a caller compiled against the version-1 header: its size ends before apply_env */
    c = (struct init_case){.cfg = SHARDOPT_CONFIG_INIT};
    c.cfg.version = 1;
    c.cfg.size = offsetof(shardopt_config_t, apply_env);
    capture(run_init, &c);
    EXPECT_EQ_INT(c.status, SHARDOPT_OK);
    EXPECT_EQ_INT(c.offload, SHARDOPT_OFFLOAD_NONE);
    unsetenv("SHARDOPT_OFFLOAD");
}

/* SHARDOPT_LR once suggested SHARDOPT_CP (two edits away): it is a step argument. A typo of a
 * key is still reported, with the key, and a typo'd variable still does nothing. */
TEST(a_learning_rate_variable_is_called_a_step_argument)
{
    setenv("SHARDOPT_LR", "0.02", 1);
    setenv("SHARDOPT_MOMENTUN", "0.9", 1);
    struct init_case c = {.cfg = SHARDOPT_CONFIG_INIT};
    capture(run_init, &c);
    EXPECT_EQ_INT(c.status, SHARDOPT_OK);
    EXPECT_STR_CONTAINS(captured, "SHARDOPT_LR is not a config key and is ignored: the "
                                  "learning rate");
    EXPECT_STR_CONTAINS(captured, "step arguments (shardopt_step_args_t lr");
    EXPECT_TRUE(strstr(captured, "did you mean SHARDOPT_CP") == NULL);
    EXPECT_STR_CONTAINS(captured, "SHARDOPT_MOMENTUN is not a config key and is ignored; did you "
                                  "mean SHARDOPT_MOMENTUM?");
    unsetenv("SHARDOPT_LR");
    unsetenv("SHARDOPT_MOMENTUN");
}

/* Environment variables had "did you mean"; JSON keys and shardopt_config_set had not. */
TEST(an_unknown_json_key_gets_did_you_mean)
{
    char path[] = "/tmp/shardopt_env_rule_json_XXXXXX";
    const int fd = mkstemp(path);
    const char text[] = "{\"momentun\": 0.9}";
    ASSERT_TRUE(write(fd, text, sizeof text - 1) == (ssize_t)(sizeof text - 1));
    close(fd);
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    EXPECT_EQ_INT(shardopt_config_load_json(path, &cfg), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "unknown key 'momentun' (did you mean 'momentum'?");
    unlink(path);
    EXPECT_EQ_INT(shardopt_config_set(&cfg, "adamw_beta", "0.9"), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "did you mean 'adamw_beta1'?");
    EXPECT_EQ_INT(shardopt_config_set(&cfg, "zzzzzzzzzz", "1"), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(strstr(shardopt_last_error(), "did you mean") == NULL);
}

struct patterns_case {
    const char *patterns;
    shardopt_algo_t head;
};

static void run_patterns(void *arg)
{
    struct patterns_case *c = arg;
    static float w[16 * 8], g[16 * 8];
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    snprintf(cfg.adamw_patterns, sizeof cfg.adamw_patterns, "%s", c->patterns);
    shardopt_runtime_t rt = fixture_runtime(&cfg);
    shardopt_param_desc_t d = fixture_desc("model.embed_tokens.weight", 2, 16, 8, 0, w, g);
    shardopt_param_t h;
    shardopt_register(rt, &d, &h);
    d = fixture_desc("lm_head.weight", 2, 16, 8, 0, w, g);
    shardopt_register(rt, &d, &h);
    shardopt_param_get_algo(h, &c->head);
    shardopt_commit(rt);
    shardopt_finalize(rt);
}

/* "embed, lm_head" sent lm_head (entry " lm_head") to Muon without a word. */
TEST(adamw_patterns_are_trimmed_and_unmatched_entries_warned)
{
    struct patterns_case c = {"embed, lm_head", SHARDOPT_ALGO_AUTO};
    capture(run_patterns, &c);
    EXPECT_EQ_INT(c.head, SHARDOPT_ALGO_ADAMW);
    EXPECT_TRUE(strstr(captured, "adamw_patterns") == NULL);
    c = (struct patterns_case){"embed,lm_haed, =model.output.weight", SHARDOPT_ALGO_AUTO};
    capture(run_patterns, &c);
    EXPECT_EQ_INT(c.head, SHARDOPT_ALGO_MUON);
    EXPECT_STR_CONTAINS(captured, "commit: adamw_patterns entries 'lm_haed', "
                                  "'=model.output.weight' match no registered parameter");
}

static void count_seen(const char *name, void *ctx)
{
    int *seen = ctx;
    seen[0] += strcmp(name, "SHARDOPT_ENV_EACH_PROBE") == 0;
    seen[1] += strncmp(name, "SHARDOPT_", 9) != 0;
}

/* The variables that are no config keys were a hand-kept list in config.c, apart from the files
 * that read them: now one table in base/env.c, which the typo check consults. A name there that
 * is also a key's variable would be read twice with two meanings. */
TEST(the_env_table_holds_no_config_key_and_the_walk_sees_ours_only)
{
    char env[96];
    for (size_t i = 0; i < env_var_count; i++) {
        EXPECT_TRUE(env_var_find(env_vars[i].name) == &env_vars[i]);
        EXPECT_TRUE(strncmp(env_vars[i].name, "SHARDOPT_", 9) == 0);
        EXPECT_TRUE(env_vars[i].meaning != NULL && env_vars[i].meaning[0] != '\0');
        for (size_t k = 0; k < config_key_count; k++) {
            config_key_env_name(&config_keys[k], env, sizeof env);
            EXPECT_TRUE(strcmp(env, env_vars[i].name) != 0);
        }
    }
    EXPECT_TRUE(env_var_find("SHARDOPT_MOMENTUM") == NULL);
    int seen[2] = {0, 0};
    setenv("SHARDOPT_ENV_EACH_PROBE", "1", 1);
    setenv("NOT_SHARDOPT_ENV_EACH_PROBE", "1", 1);
    env_each_set(count_seen, seen);
    EXPECT_EQ_INT(seen[0], 1);
    EXPECT_EQ_INT(seen[1], 0);
    EXPECT_TRUE(env_get("SHARDOPT_ENV_EACH_PROBE") != NULL);
    unsetenv("SHARDOPT_ENV_EACH_PROBE");
    unsetenv("NOT_SHARDOPT_ENV_EACH_PROBE");
    EXPECT_TRUE(env_get("SHARDOPT_ENV_EACH_PROBE") == NULL);
}

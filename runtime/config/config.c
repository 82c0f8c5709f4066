#include "runtime/config/config.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/env.h"
#include "base/log.h"
#include "base/status.h"
#include "kernels/ns_coeffs.h"
#include "runtime/config/config_keys.h"

/* Oldest layout of shardopt_config_t we accept: version 1 is the current one. */
#define CONFIG_V1_SIZE (offsetof(shardopt_config_t, num_threads) + sizeof(int))

shardopt_status_t config_import(const shardopt_config_t *in, shardopt_config_t *out)
{
    shardopt_config_t c = SHARDOPT_CONFIG_INIT;

    if (in == NULL || out == NULL)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "config: NULL pointer");
    if (in->version < 1 || in->version > SHARDOPT_CONFIG_VERSION)
        return log_fail(
            SHARDOPT_ERR_INVALID_ARGUMENT,
            "config.version = %u: accepted 1..%d (initialise with SHARDOPT_CONFIG_INIT)",
            in->version, SHARDOPT_CONFIG_VERSION);
    if (in->size < CONFIG_V1_SIZE)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "config.size = %zu: at least %zu (initialise with SHARDOPT_CONFIG_INIT)",
                        in->size, (size_t)CONFIG_V1_SIZE);
    memcpy(&c, in, in->size < sizeof c ? in->size : sizeof c);
    /* a caller built against version 1 never asked for the environment */
    if (in->size < offsetof(shardopt_config_t, apply_env) + sizeof c.apply_env)
        c.apply_env = 0;
    c.size = sizeof c;
    c.version = SHARDOPT_CONFIG_VERSION;
    *out = c;
    return SHARDOPT_OK;
}

void config_export(const shardopt_config_t *full, shardopt_config_t *out)
{
    size_t size = out->size < sizeof *full ? out->size : sizeof *full;
    uint32_t version = out->version;
    memcpy(out, full, size);
    out->size = size; /* the caller's struct keeps describing itself */
    out->version = version;
}

/* A custom table's iterated image of the singular values it starts from ([0, 1], or [0, 1/s] with
 * Frobenius scaling by s < 1), at every step. Each step's products reach |c| S^5 for the last
 * bound S (an element is at most the spectral norm); with S <= NS_CUSTOM_BOUND_MAX and |c| <=
 * 1000 they stay below 1e33, inside fp32 (and bf16). (1000, 1000, 1000) five times reached 2e20
 * at step 2 and (-1000, 0, 0) 1e9 at step 3: every weight NaN, the step OK. The published
 * tables keep the bound under 2. */
#define NS_CUSTOM_BOUND_MAX 1e6
static shardopt_status_t custom_table_bounded(const shardopt_config_t *cfg, const char *source)
{
    float tab[SHARDOPT_NS_MAX_STEPS][3];
    const double s0 = cfg->ns_precondition != SHARDOPT_NS_PRECONDITION_AOL &&
                              cfg->ns_norm_scale > 0 && cfg->ns_norm_scale < 1
                          ? 1.0 / cfg->ns_norm_scale
                          : 1.0;
    for (int i = 0; i < cfg->ns_steps; i++)
        for (int j = 0; j < 3; j++)
            tab[i][j] = (float)cfg->ns_custom_coeffs[i][j];
    for (int k = 1; k <= cfg->ns_steps; k++) {
        const double s = ns_coeffs_output_bound((const float(*)[3])tab, k, s0);
        if (!(s <= NS_CUSTOM_BOUND_MAX))
            return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                            "config %sns_custom_coeffs: after step %d (%g, %g, %g) the singular "
                            "values can reach %.3g: accepted tables keep them at most %g at "
                            "every step from [0, %g] (beyond, the next step's fp32 products "
                            "overflow and the weights turn NaN; the published tables stay under "
                            "2)",
                            source, k, cfg->ns_custom_coeffs[k - 1][0],
                            cfg->ns_custom_coeffs[k - 1][1], cfg->ns_custom_coeffs[k - 1][2], s,
                            NS_CUSTOM_BOUND_MAX, s0);
    }
    return SHARDOPT_OK;
}

shardopt_status_t config_check_all(const shardopt_config_t *cfg, const char *source)
{
    shardopt_status_t status;
    char name[96];
    int lo, hi;

    for (size_t i = 0; i < config_key_count; i++) {
        snprintf(name, sizeof name, "%s%s", source, config_keys[i].name);
        status = config_key_check(&config_keys[i], cfg, name);
        if (status != SHARDOPT_OK)
            return status;
    }
    /* not a key, so the table does not check it: 2 read as 1 where every key's bool refuses it */
    if (cfg->apply_env != 0 && cfg->apply_env != 1)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "config %sapply_env = %d: accepted 0 (the environment is not read) or 1 "
                        "(SHARDOPT_<KEY> variables overlay the config at init)",
                        source, cfg->apply_env);
    ns_coeffs_step_range(cfg->ns_coeffs, &lo, &hi);
    if (cfg->ns_steps < lo || cfg->ns_steps > hi)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "config %sns_steps = %d: accepted %d..%d with ns_coeffs = %s", source,
                        cfg->ns_steps, lo, hi,
                        cfg->ns_coeffs == SHARDOPT_NS_AOL             ? "aol"
                        : cfg->ns_coeffs == SHARDOPT_NS_POLAR_EXPRESS ? "polar_express"
                        : cfg->ns_coeffs == SHARDOPT_NS_CUSTOM        ? "custom"
                        : cfg->ns_coeffs == SHARDOPT_NS_JORDAN        ? "jordan"
                                                                      : "quintic");
    /* AOL scales rows by sums over the whole Gram matrix: the sharded strategy, whose ranks hold
     * column pieces, does not compute them (yet) */
    if (cfg->ns_precondition == SHARDOPT_NS_PRECONDITION_AOL &&
        cfg->ns_strategy != SHARDOPT_NS_STRATEGY_GATHER)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "config %sns_precondition = aol with ns_strategy = %s: aol runs on "
                        "gathered matrices only; use ns_strategy = gather or ns_precondition = "
                        "frobenius",
                        source,
                        cfg->ns_strategy == SHARDOPT_NS_STRATEGY_SHARDED ? "sharded" : "auto");
    /* Frobenius scaling bounds |X|_2 by 1/s only, reached when U has rank 1 (a momentum close to
     * one outer product): with s < 1 the iteration starts outside the [0, 1] every table is made
     * for, and each table overflows past some point (polar_express from 1.011, jordan 1.26, aol's
     * table 1.27, quintic 1.32): ns_norm_scale = 0.8 with polar_express stepped a 12 x 1 matrix
     * to NaN and returned OK. aol's row scaling bounds |X|_2 by 1 whatever s is */
    if (cfg->ns_norm_scale != 0.0 && cfg->ns_norm_scale < 1.0 &&
        cfg->ns_precondition != SHARDOPT_NS_PRECONDITION_AOL)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "config %sns_norm_scale = %g with ns_precondition = frobenius: accepted 0 "
                        "(the table's) or [1, 2], [0.5, 2] with ns_precondition = aol (a rank-1 "
                        "update would start Newton-Schulz at 1/s, beyond the tables' [0, 1], and "
                        "overflow to NaN)",
                        source, cfg->ns_norm_scale);
    if (cfg->ns_team_cap & (cfg->ns_team_cap - 1))
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "config %sns_team_cap = %d: accepted a power of two, 1..64 (1: no teams)",
                        source, cfg->ns_team_cap);
    if (cfg->ns_coeffs == SHARDOPT_NS_CUSTOM)
        for (int i = 0; i < cfg->ns_steps; i++) {
            const double *c = cfg->ns_custom_coeffs[i];
            /* the kernels take them as fp32: 1e300 was inf there, and a step that returned OK
             * left every weight NaN. The published tables stay under 25 in magnitude */
            if (!(fabs(c[0]) <= NS_COEFF_MAX && fabs(c[1]) <= NS_COEFF_MAX &&
                  fabs(c[2]) <= NS_COEFF_MAX) ||
                (c[0] == 0 && c[1] == 0 && c[2] == 0))
                return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                                "config %sns_custom_coeffs step %d = (%g, %g, %g): custom needs "
                                "ns_steps = %d not all-zero (a, b, c) triples, each in [-%g, %g]",
                                source, i, c[0], c[1], c[2], cfg->ns_steps, NS_COEFF_MAX,
                                NS_COEFF_MAX);
        }
    if (cfg->ns_coeffs == SHARDOPT_NS_CUSTOM)
        return custom_table_bounded(cfg, source);
    return SHARDOPT_OK;
}

shardopt_status_t shardopt_config_validate(const shardopt_config_t *cfg)
{
    shardopt_config_t c;
    shardopt_status_t status = config_import(cfg, &c);
    if (status != SHARDOPT_OK)
        return status;
    return config_check_all(&c, "");
}

shardopt_status_t shardopt_config_init(shardopt_config_t *cfg, size_t size)
{
    const shardopt_config_t d = SHARDOPT_CONFIG_INIT;
    if (cfg == NULL || size < offsetof(shardopt_config_t, version) + sizeof(uint32_t))
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "config_init: %s",
                        cfg == NULL ? "NULL cfg" : "buffer smaller than the config's header");
    const size_t n = size < sizeof d ? size : sizeof d;
    memcpy(cfg, &d, n);
    if (n >= offsetof(shardopt_config_t, apply_env) + sizeof d.apply_env)
        cfg->apply_env = 0; /* a binding's config is its arguments: documented in the header */
    cfg->size = n;
    return SHARDOPT_OK;
}

shardopt_status_t shardopt_config_set(shardopt_config_t *cfg, const char *key, const char *value)
{
    shardopt_config_t c;
    int steps = 0;
    char source[96];
    if (cfg == NULL || key == NULL || value == NULL)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "config_set: NULL %s",
                        cfg == NULL   ? "cfg"
                        : key == NULL ? "key"
                                      : "value");
    const struct config_key *k = config_key_find(key);
    if (k == NULL) {
        const char *near = config_key_nearest(key);
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "config_set: unknown key '%s' (%s%s%sshardopt_config_print lists them)",
                        key, near != NULL ? "did you mean '" : "", near != NULL ? near : "",
                        near != NULL ? "'? " : "");
    }
    shardopt_status_t status = config_import(cfg, &c);
    if (status == SHARDOPT_OK)
        status = config_key_fits(k, cfg, "config_set");
    if (status != SHARDOPT_OK)
        return status;
    snprintf(source, sizeof source, "%s (config_set)", key);
    status = config_key_parse(k, value, &c, &steps, source);
    if (status == SHARDOPT_OK && steps > 0) /* custom triples carry their step count */
        c.ns_steps = steps;
    if (status == SHARDOPT_OK)
        status = config_key_check(k, &c, "(config_set) ");
    if (status != SHARDOPT_OK)
        return status;
    config_export(&c, cfg);
    return SHARDOPT_OK;
}

shardopt_status_t config_env_overlay(shardopt_config_t *cfg, config_env_lookup_fn lookup, void *ctx)
{
    shardopt_config_t c;
    shardopt_status_t status;
    int coeff_steps = 0, steps_given = 0;
    char env[96], source[160];

    status = config_import(cfg, &c);
    if (status != SHARDOPT_OK)
        return status;
    for (size_t i = 0; i < config_key_count; i++) {
        const struct config_key *k = &config_keys[i];
        config_key_env_name(k, env, sizeof env);
        const char *v = lookup(env, ctx);
        if (v == NULL)
            continue;
        snprintf(source, sizeof source, "config_from_env: %s is set, but its", env);
        if ((status = config_key_fits(k, cfg, source)) != SHARDOPT_OK)
            return status;
        snprintf(source, sizeof source, "%s (env)", env);
        status = config_key_parse(k, v, &c, &coeff_steps, source);
        if (status != SHARDOPT_OK)
            return status;
        steps_given |= strcmp(k->name, "ns_steps") == 0;
    }
    if (coeff_steps > 0 && !steps_given)
        c.ns_steps = coeff_steps;
    else if (coeff_steps > 0 && c.ns_steps != coeff_steps)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "config SHARDOPT_NS_STEPS = %d but SHARDOPT_NS_CUSTOM_COEFFS has %d "
                        "triples: give one or make them agree",
                        c.ns_steps, coeff_steps);
    status = config_check_all(&c, "(env) ");
    if (status != SHARDOPT_OK)
        return status;
    config_export(&c, cfg);
    return SHARDOPT_OK;
}

static const char *env_lookup(const char *name, void *ctx)
{
    (void)ctx;
    return env_get(name);
}

/* Edit distance of a and b (at most 63 bytes each; longer counts as far apart). */
static int edit_distance(const char *a, const char *b)
{
    const size_t n = strlen(a), m = strlen(b);
    int row[64];
    if (n >= 64 || m >= 64)
        return 64;
    for (size_t j = 0; j <= m; j++)
        row[j] = (int)j;
    for (size_t i = 1; i <= n; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= m; j++) {
            const int up = row[j], sub = diag + (a[i - 1] != b[j - 1]);
            int best = up + 1 < row[j - 1] + 1 ? up + 1 : row[j - 1] + 1;
            row[j] = sub < best ? sub : best;
            diag = up;
        }
    }
    return row[m];
}

/* Step arguments a launcher might try to set as variables: they are not config keys. */
static const char *const env_step_args[] = {"SHARDOPT_LR", "SHARDOPT_ADAMW_LR",
                                            "SHARDOPT_MAX_GRAD_NORM", "SHARDOPT_LEARNING_RATE"};

const char *config_key_nearest(const char *name)
{
    const char *nearest = NULL;
    int best = 3; /* one or two edits: a typo; further is another name */
    for (size_t i = 0; i < config_key_count; i++) {
        const int d = edit_distance(name, config_keys[i].name);
        if (d < best) {
            best = d;
            nearest = config_keys[i].name;
        }
    }
    return nearest;
}

/* A SHARDOPT_ variable one or two letters away from a key's is most likely that key mistyped,
 * and would silently do nothing: say so. Names further from every key (other tools' variables)
 * are left alone. */
static void env_typo_warn(const char *name, void *ctx)
{
    char env[96], nearest[96];
    int known = 0, best = 64, step_arg = 0;
    (void)ctx;
    for (size_t i = 0; i < sizeof env_step_args / sizeof env_step_args[0]; i++)
        step_arg |= strcmp(name, env_step_args[i]) == 0;
    if (step_arg) { /* before the nearest key: SHARDOPT_LR is two edits from SHARDOPT_CP */
        log_warn("config: %s is not a config key and is ignored: the learning rate, the "
                 "AdamW learning rate and gradient clipping are step arguments "
                 "(shardopt_step_args_t lr, adamw_lr, max_grad_norm), set by the trainer "
                 "each step",
                 name);
        return;
    }
    known = env_var_find(name) != NULL; /* the library's variables that are no keys */
    for (size_t i = 0; i < config_key_count && !known; i++) {
        config_key_env_name(&config_keys[i], env, sizeof env);
        const int d = edit_distance(name, env);
        known = d == 0;
        if (d < best) {
            best = d;
            memcpy(nearest, env, sizeof nearest);
        }
    }
    if (!known && best <= 2)
        log_warn("config: %s is not a config key and is ignored; did you mean %s?", name, nearest);
}

shardopt_status_t shardopt_config_from_env(shardopt_config_t *cfg)
{
    env_each_set(env_typo_warn, NULL);
    return config_env_overlay(cfg, env_lookup, NULL);
}

shardopt_status_t config_env_for_init(shardopt_config_t *cfg, const char *who)
{
    char env[96];
    if (cfg->apply_env) {
        /* a value the code set is refused as the code's, before the overlay (which checks the
         * whole result and would blame the environment) */
        shardopt_status_t status = config_check_all(cfg, "");
        if (status != SHARDOPT_OK)
            return status;
        status = shardopt_config_from_env(cfg);
        if (status != SHARDOPT_OK) { /* the message names the variable: say who read it */
            char why[768];
            snprintf(why, sizeof why, "%s", shardopt_last_error()); /* not formatted in place */
            return status_set(status, "%s: %s (apply_env = 1 reads SHARDOPT_* variables)", who,
                              why);
        }
        return SHARDOPT_OK;
    }
    /* a launcher's SHARDOPT_OFFLOAD that does nothing must not pass unseen */
    env_each_set(env_typo_warn, NULL);
    for (size_t i = 0; i < config_key_count; i++) {
        config_key_env_name(&config_keys[i], env, sizeof env);
        if (env_get(env) != NULL)
            log_warn("%s: %s is set but not applied: this config has apply_env = 0 (made by "
                     "shardopt_config_init, as language bindings do, or an older header): set "
                     "the key in the config, or apply_env = 1",
                     who, env);
    }
    return SHARDOPT_OK;
}

shardopt_status_t shardopt_config_print(const shardopt_config_t *cfg, FILE *stream)
{
    shardopt_config_t c;
    shardopt_status_t status = config_import(cfg, &c);
    char val[CONFIG_TEXT_MAX];

    if (status != SHARDOPT_OK)
        return status;
    if (stream == NULL)
        stream = stdout;
    /* a stream that cannot take the text (a full disk, /dev/full, a stream opened for reading)
     * returned OK with the output lost: each write and the flush are checked */
    int failed = 0, err = 0;
    for (size_t i = 0; i < config_key_count && !failed; i++) {
        config_key_format(&config_keys[i], &c, val, sizeof val);
        failed = fprintf(stream, "%-20s = %s\n", config_keys[i].name, val) < 0;
        err = errno;
    }
    if (!failed) {
        failed = fflush(stream) != 0;
        err = errno;
    }
    if (failed)
        return log_fail(SHARDOPT_ERR_IO,
                        "config_print: writing to the stream failed (%s): the text is lost or "
                        "cut; the config is unchanged",
                        strerror(err));
    return SHARDOPT_OK;
}

void config_ns_resolve(const shardopt_config_t *cfg, float coeffs[][3], float *norm_scale)
{
    ns_coeffs_fill(cfg->ns_coeffs, cfg->ns_steps, (const double(*)[3])cfg->ns_custom_coeffs,
                   coeffs);
    *norm_scale = (float)(cfg->ns_norm_scale != 0.0 ? cfg->ns_norm_scale
                                                    : ns_coeffs_default_norm_scale(cfg->ns_coeffs));
}

/* Fuzz target: key=value text through shardopt_config_set and the environment overlay
 * (config_env_overlay, what shardopt_config_from_env runs with getenv).
 *
 * The input is lines `key=value`, split at the first '='; a line without '=' is passed as a key
 * with a NULL value, empty lines are skipped, and lines past MAX_LINES are ignored (the overlay
 * of the whole input scans every line per key: that keeps one input fast). Each line goes
 *   1. to shardopt_config_set on the config the lines before it built: a refusal leaves it
 *      unchanged byte for byte and the last error names the key; an acceptance leaves every key
 *      in its range, a number that is decimal, finite and the value the text says, the rest of
 *      the config as valid as it was (cross-field rules wait for validate: docs/api.md), and the
 *      key's printed value sets back to the same field bytes;
 *   2. alone, as SHARDOPT_<KEY>, to the overlay on the defaults: accepted exactly when
 *      config_set on the defaults accepts it and the result validates, with the same fields.
 * Then all lines together as variables (the last line of a name wins, as with setenv) go to the
 * overlay on the defaults: refused, nothing changed and the message names the environment;
 * accepted, the config validates. Any broken rule aborts.
 * Returns OK when every line was set, the result validates and the overlay took them all;
 * otherwise the first refusal's status (the corpus's ok-* / bad-* split). */
#include <ctype.h>
#include <math.h>
#include <string.h>

#include "fuzz.h"
#include "runtime/config/config.h"
#include "runtime/config/config_keys.h"

#define MAX_LINES 64

/* Static, so its padding is zero too: a refused call's config is compared byte for byte, padding
 * included, and every copy below is a memcpy for the same reason. */
static const shardopt_config_t defaults = SHARDOPT_CONFIG_INIT;

struct line {
    const char *key;
    const char *value; /* NULL: the line had no '=' */
};

struct env {
    const struct line *lines;
    int n;
};

static void check(int ok)
{
    if (!ok)
        abort();
}

static int error_names(const char *what) { return strstr(shardopt_last_error(), what) != NULL; }

/* The oracle's number grammar, written apart from the library's: [+-]digits[.digits][e[+-]digits]
 * (or .digits), no whitespace, no hex, no inf/nan; `integer` allows only [+-]digits. */
static int is_decimal(const char *s, int integer)
{
    int digits = 0;
    if (*s == '+' || *s == '-')
        s++;
    for (; isdigit((unsigned char)*s); s++)
        digits++;
    if (integer)
        return digits > 0 && *s == '\0';
    if (*s == '.')
        for (s++; isdigit((unsigned char)*s); s++)
            digits++;
    if (digits == 0)
        return 0;
    if (*s == 'e' || *s == 'E') {
        int exp_digits = 0;
        s++;
        if (*s == '+' || *s == '-')
            s++;
        for (; isdigit((unsigned char)*s); s++)
            exp_digits++;
        if (exp_digits == 0)
            return 0;
    }
    return *s == '\0';
}

/* The accepted value of k in cfg is what `value` says, in the form the key takes. */
static int value_matches(const struct config_key *k, const shardopt_config_t *cfg,
                         const char *value)
{
    const void *f = (const char *)cfg + k->offset;
    switch (k->type) {
    case CFG_DOUBLE:
        return is_decimal(value, 0) && isfinite(*(const double *)f) &&
               *(const double *)f == strtod(value, NULL);
    /* an int key takes an integral number as a JSON file does ("5.0", "5e0"); a 64-bit key
     * digits, or such a number below 2^53 (exact in a double) */
    case CFG_INT: return is_decimal(value, 0) && (double)*(const int *)f == strtod(value, NULL);
    case CFG_U64:
        if (!is_decimal(value, 0) || value[0] == '-' || value[0] == '+')
            return 0;
        if (is_decimal(value, 1))
            return *(const uint64_t *)f == strtoull(value, NULL, 10);
        return strtod(value, NULL) < 9007199254740992.0 &&
               (double)*(const uint64_t *)f == strtod(value, NULL);
    case CFG_COEFFS: /* numbers, separators and spaces only: no hex, inf, nan or tabs; or what
                        the printer writes for a table not in use, taken as no table */
        if (strcmp(value, CONFIG_COEFFS_UNUSED) == 0) {
            for (int i = 0; i < SHARDOPT_NS_MAX_STEPS; i++)
                for (int j = 0; j < 3; j++)
                    if (cfg->ns_custom_coeffs[i][j] != 0)
                        return 0;
            return 1;
        }
        return strspn(value, "0123456789+-.eE,; ") == strlen(value);
    case CFG_BOOL:
    case CFG_ENUM:
    case CFG_STRING: return 1; /* the parser compares whole words or copies the text */
    }
    return 0;
}

/* Two configs hold the same values: every key's field compared as bytes (padding, which a
 * struct copy inside the library need not carry, is left out; -0.0 and 0.0 still differ). */
static int same_values(const shardopt_config_t *a, const shardopt_config_t *b)
{
    if (a->size != b->size || a->version != b->version)
        return 0;
    for (size_t i = 0; i < config_key_count; i++) {
        const struct config_key *k = &config_keys[i];
        size_t n = k->type == CFG_DOUBLE || k->type == CFG_U64 ? 8
                   : k->type == CFG_STRING                     ? SHARDOPT_PATTERNS_MAX
                   : k->type == CFG_COEFFS                     ? sizeof a->ns_custom_coeffs
                                                               : sizeof(int);
        if (memcmp((const char *)a + k->offset, (const char *)b + k->offset, n) != 0)
            return 0;
    }
    return 1;
}

static int keys_in_range(const shardopt_config_t *cfg)
{
    for (size_t i = 0; i < config_key_count; i++)
        if (config_key_check(&config_keys[i], cfg, "fuzz ") != SHARDOPT_OK)
            return 0;
    return 1;
}

static int cross_field_key(const char *key)
{
    /* every key a rule of config_check_all reads with another: the table and its steps, aol
     * with ns_strategy, ns_norm_scale below 1 with aol */
    static const char *const keys[] = {"ns_coeffs",       "ns_steps",    "ns_custom_coeffs",
                                       "ns_precondition", "ns_strategy", "ns_norm_scale"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (strcmp(key, keys[i]) == 0)
            return 1;
    return 0;
}

/* "SHARDOPT_" + key in upper case names this line's variable. */
static int line_is_var(const struct line *l, const char *name)
{
    if (strncmp(name, "SHARDOPT_", 9) != 0)
        return 0;
    name += 9;
    const char *k = l->key;
    for (; *k != '\0' && *name != '\0'; k++, name++)
        if (toupper((unsigned char)*k) != *name)
            return 0;
    return *k == '\0' && *name == '\0';
}

static const char *env_lookup(const char *name, void *ctx)
{
    const struct env *e = ctx;
    for (int i = e->n - 1; i >= 0; i--) /* the last definition wins */
        if (e->lines[i].value != NULL && line_is_var(&e->lines[i], name))
            return e->lines[i].value;
    return NULL;
}

/* *valid says whether cfg passes shardopt_config_validate, before the call and after it: carried
 * from line to line, so each line validates once (validation formats a name per key: costly). */
static shardopt_status_t set_one(shardopt_config_t *cfg, const struct line *l, int *valid)
{
    const struct config_key *k = config_key_find(l->key);
    shardopt_config_t before;
    memcpy(&before, cfg, sizeof before);

    shardopt_status_t st = shardopt_config_set(cfg, l->key, l->value);
    if (st != SHARDOPT_OK) {
        check(memcmp(&before, cfg, sizeof before) == 0);
        check(error_names(l->value == NULL ? "NULL value" : k == NULL ? "unknown key" : k->name));
        return st;
    }
    check(k != NULL && l->value != NULL);
    check(keys_in_range(cfg) && value_matches(k, cfg, l->value));
    int valid_after = shardopt_config_validate(cfg) == SHARDOPT_OK;
    if (*valid && !cross_field_key(k->name))
        check(valid_after);
    *valid = valid_after;
    /* every key, the coefficients included: they print as they round-trip (format_double), and
     * a table not in use prints "(unused)", taken back as no table (ns_steps left alone) */
    char printed[CONFIG_TEXT_MAX];
    shardopt_config_t again, want;
    memcpy(&again, &before, sizeof again);
    memcpy(&want, cfg, sizeof want);
    config_key_format(k, cfg, printed, sizeof printed);
    check(shardopt_config_set(&again, l->key, printed) == SHARDOPT_OK);
    if (k->type == CFG_COEFFS && strcmp(printed, CONFIG_COEFFS_UNUSED) == 0) {
        memset(want.ns_custom_coeffs, 0, sizeof want.ns_custom_coeffs);
        want.ns_steps = before.ns_steps;
    }
    check(same_values(&again, &want));
    return SHARDOPT_OK;
}

/* The line alone: config_set on the defaults and the overlay of its one variable agree. */
static void env_matches_set(const struct line *l)
{
    shardopt_config_t by_set, by_env;
    const struct env e = {l, 1};
    char name[96];

    memcpy(&by_set, &defaults, sizeof by_set);
    memcpy(&by_env, &defaults, sizeof by_env);
    shardopt_status_t set = shardopt_config_set(&by_set, l->key, l->value);
    if (set == SHARDOPT_OK)
        set = shardopt_config_validate(&by_set);
    shardopt_status_t env = config_env_overlay(&by_env, env_lookup, (void *)&e);
    check((env == SHARDOPT_OK) == (set == SHARDOPT_OK));
    if (env == SHARDOPT_OK) {
        check(same_values(&by_set, &by_env));
    } else {
        check(memcmp(&defaults, &by_env, sizeof by_env) == 0);
        config_key_env_name(config_key_find(l->key), name, sizeof name);
        check(error_names(name) || error_names("(env)"));
    }
}

shardopt_status_t fuzz_one(const uint8_t *data, size_t size)
{
    struct line lines[MAX_LINES];
    int n = 0;
    char *text = fuzz_text(data, size);
    if (text == NULL)
        return SHARDOPT_ERR_OUT_OF_MEMORY;
    for (char *p = text; p < text + size && n < MAX_LINES;) {
        char *end = memchr(p, '\n', (size_t)(text + size - p));
        if (end == NULL)
            end = text + size;
        *end = '\0';
        if (end > p) {
            char *eq = strchr(p, '=');
            if (eq != NULL)
                *eq = '\0';
            lines[n].key = p;
            lines[n].value = eq != NULL ? eq + 1 : NULL;
            n++;
        }
        p = end + 1;
    }

    shardopt_config_t cfg;
    memcpy(&cfg, &defaults, sizeof cfg);
    shardopt_status_t result = SHARDOPT_OK;
    int valid = 1; /* the defaults */
    for (int i = 0; i < n; i++) {
        shardopt_status_t st = set_one(&cfg, &lines[i], &valid);
        if (result == SHARDOPT_OK)
            result = st;
        if (lines[i].value != NULL && config_key_find(lines[i].key) != NULL)
            env_matches_set(&lines[i]);
    }
    if (result == SHARDOPT_OK && !valid)
        result = shardopt_config_validate(&cfg); /* for its status */

    shardopt_config_t by_env;
    memcpy(&by_env, &defaults, sizeof by_env);
    const struct env e = {lines, n};
    shardopt_status_t env = config_env_overlay(&by_env, env_lookup, (void *)&e);
    if (env == SHARDOPT_OK)
        check(shardopt_config_validate(&by_env) == SHARDOPT_OK);
    else
        check(memcmp(&defaults, &by_env, sizeof by_env) == 0 &&
              (error_names("SHARDOPT_") || error_names("(env)")));
    if (result == SHARDOPT_OK)
        result = env;
    free(text);
    return result;
}

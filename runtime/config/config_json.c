/* Config files: one JSON object whose keys are the config key names. Strict: an unknown key, a
 * wrong type or an invalid value is an error naming the file and the key, and the caller's
 * config stays as it was. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file_read.h"
#include "base/mem.h"
#include "base/status.h"
#include "runtime/config/config.h"
#include "runtime/config/config_keys.h"
#include "runtime/config/json_strict.h"
#include "runtime/config/json_util.h"

/* A config file is a few hundred bytes; refuse anything that is clearly not one. */
#define CONFIG_FILE_MAX (1 << 20)

static shardopt_status_t wrong_type(const char *path, const struct config_key *k, const cJSON *v,
                                    const char *expected)
{
    return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "config %s: key '%s' must be %s, got %s", path,
                    k->name, expected, json_type_name(v));
}

/* JSON numbers are doubles: an integer key takes an integral number that fits exactly. */
static int json_integral(const cJSON *v, double lo, double hi)
{
    double d = v->valuedouble;
    return isfinite(d) && d == floor(d) && d >= lo && d <= hi;
}

static shardopt_status_t coeffs_from_json(const char *path, const struct config_key *k,
                                          const cJSON *v, shardopt_config_t *c, int *steps)
{
    double t[SHARDOPT_NS_MAX_STEPS][3] = {{0}};
    int n = cJSON_GetArraySize(v);

    if (n < 1 || n > SHARDOPT_NS_MAX_STEPS)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "config %s: key '%s' has %d triples: accepted 1-%d", path, k->name, n,
                        SHARDOPT_NS_MAX_STEPS);
    for (int i = 0; i < n; i++) {
        const cJSON *row = cJSON_GetArrayItem(v, i);
        if (!cJSON_IsArray(row) || cJSON_GetArraySize(row) != 3)
            return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                            "config %s: key '%s' entry %d must be an array of 3 numbers", path,
                            k->name, i);
        for (int j = 0; j < 3; j++) {
            const cJSON *x = cJSON_GetArrayItem(row, j);
            if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble))
                return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                                "config %s: key '%s' entry %d element %d must be a finite number",
                                path, k->name, i, j);
            /* the range the text form (env, config_set) takes: the file took 1e39 while
             * SHARDOPT_NS_CUSTOM_COEFFS refused it, and kept it until ns_coeffs became custom */
            if (!(fabs(x->valuedouble) <= NS_COEFF_MAX))
                return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                                "config %s: key '%s' entry %d element %d = %g: accepted [-%g, %g]",
                                path, k->name, i, j, x->valuedouble, NS_COEFF_MAX, NS_COEFF_MAX);
            t[i][j] = x->valuedouble;
        }
    }
    memcpy((char *)c + k->offset, t, sizeof t);
    *steps = n;
    return SHARDOPT_OK;
}

/* Set one key from a JSON value. Values go through the same text parser as env values, so the
 * two sources accept exactly the same things. */
static shardopt_status_t key_from_json(const char *path, const struct config_key *k, const cJSON *v,
                                       shardopt_config_t *c, int *steps)
{
    char text[64], source[1200];

    snprintf(source, sizeof source, "%s: key '%s'", path, k->name);
    switch (k->type) {
    case CFG_DOUBLE:
        if (!cJSON_IsNumber(v))
            return wrong_type(path, k, v, "a number");
        snprintf(text, sizeof text, "%.17g", v->valuedouble);
        break;
    case CFG_INT:
        if (!cJSON_IsNumber(v))
            return wrong_type(path, k, v, "an integer");
        if (!json_integral(v, -2147483648.0, 2147483647.0)) {
            snprintf(text, sizeof text, "%.17g", v->valuedouble);
            char acc[96];
            config_key_accepted(k, acc, sizeof acc);
            return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "config %s = %s: accepted integers %s",
                            source, text, acc);
        }
        snprintf(text, sizeof text, "%.0f", v->valuedouble);
        break;
    case CFG_BOOL:
        if (!cJSON_IsBool(v))
            return wrong_type(path, k, v, "true or false");
        snprintf(text, sizeof text, "%d", cJSON_IsTrue(v) ? 1 : 0);
        break;
    case CFG_U64:
        /* from 2^53 on a JSON number is not exact: such seeds are given as strings. 2^53 itself
         * is refused too: 9007199254740993 reads as 2^53, and a seed changed by one without a
         * word draws other random bits than the run it was copied from */
        if (cJSON_IsString(v))
            return config_key_parse(k, v->valuestring, c, NULL, source);
        if (!cJSON_IsNumber(v) || !json_integral(v, 0, 9007199254740991.0))
            return wrong_type(path, k, v,
                              "an integer in [0, 2^53) (or a decimal string for larger values)");
        snprintf(text, sizeof text, "%.0f", v->valuedouble);
        break;
    case CFG_ENUM:
    case CFG_STRING:
        if (!cJSON_IsString(v))
            return wrong_type(path, k, v, "a string");
        return config_key_parse(k, v->valuestring, c, NULL, source);
    case CFG_COEFFS:
        if (!cJSON_IsArray(v))
            return wrong_type(path, k, v, "an array of [a, b, c] triples");
        return coeffs_from_json(path, k, v, c, steps);
    }
    return config_key_parse(k, text, c, NULL, source);
}

static shardopt_status_t file_read(const char *path, char **text_p, size_t *len_p)
{
    struct file_read_error e;
    if (file_read_text(path, CONFIG_FILE_MAX, text_p, len_p, &e) == 0)
        return SHARDOPT_OK;
    switch (e.fault) {
    case FILE_READ_SIZE:
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "config %s: larger than %d bytes", path,
                        CONFIG_FILE_MAX);
    case FILE_READ_KIND: /* a FIFO or a device would never end, or never start, the read */
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "config %s: %s", path, e.why);
    case FILE_READ_MEMORY:
        return log_fail(SHARDOPT_ERR_OUT_OF_MEMORY, "config %s: %s", path, e.why);
    case FILE_READ_IO: return log_fail(SHARDOPT_ERR_IO, "config %s: read failed: %s", path, e.why);
    default: return log_fail(SHARDOPT_ERR_IO, "config %s: cannot open: %s", path, e.why);
    }
}

shardopt_status_t shardopt_config_load_json(const char *path, shardopt_config_t *cfg)
{
    shardopt_config_t c;
    shardopt_status_t status;
    char *text = NULL;
    size_t len = 0;

    if (path == NULL)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "config_load_json: NULL path");
    /* "config : cannot open" showed nothing where the path belongs: say it is empty */
    if (path[0] == '\0')
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "config_load_json: path = \"\" (empty): give a JSON file's path");
    status = config_import(cfg, &c);
    if (status != SHARDOPT_OK)
        return status;
    status = file_read(path, &text, &len);
    if (status != SHARDOPT_OK)
        return status;
    status = config_json_text(path, text, len, cfg);
    free(text);
    return status;
}

shardopt_status_t config_json_text(const char *path, const char *text, size_t len,
                                   shardopt_config_t *cfg)
{
    shardopt_config_t c;
    shardopt_status_t status = config_import(cfg, &c);
    cJSON *root = NULL;
    int coeff_steps = 0, steps_given = 0;

    if (status != SHARDOPT_OK)
        return status;
    char err[256];
    status = json_strict_parse(text, len, 0, &root, err, sizeof err);
    if (status == SHARDOPT_ERR_OUT_OF_MEMORY) {
        status = log_fail(status, "config %s: %s while parsing it", path, err);
        goto out;
    }
    if (status != SHARDOPT_OK) { /* a file, not a checkpoint: the caller's argument is wrong */
        status = log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "config %s: %s", path, err);
        goto out;
    }
    if (!cJSON_IsObject(root)) {
        status =
            log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "config %s: top level must be an object", path);
        goto out;
    }
    for (const cJSON *item = root->child; item != NULL; item = item->next) {
        const struct config_key *k = config_key_find(item->string); /* keys unique: parsed so */
        if (k == NULL) {
            const char *near = config_key_nearest(item->string);
            char hint[96] = "";
            if (near != NULL)
                snprintf(hint, sizeof hint, "did you mean '%s'? ", near);
            status = log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                              "config %s: unknown key '%.128s' (%sshardopt_config_print lists "
                              "the keys)",
                              path, item->string, hint);
            goto out;
        }
        char who[1100];
        snprintf(who, sizeof who, "config %s", path);
        if ((status = config_key_fits(k, cfg, who)) != SHARDOPT_OK)
            goto out;
        status = key_from_json(path, k, item, &c, &coeff_steps);
        if (status != SHARDOPT_OK)
            goto out;
        steps_given |= strcmp(k->name, "ns_steps") == 0;
    }
    if (coeff_steps > 0 && !steps_given) {
        c.ns_steps = coeff_steps;
    } else if (coeff_steps > 0 && c.ns_steps != coeff_steps) {
        status = log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                          "config %s: ns_steps = %d but ns_custom_coeffs has %d triples", path,
                          c.ns_steps, coeff_steps);
        goto out;
    }
    char source[1100];
    snprintf(source, sizeof source, "%s: ", path);
    status = config_check_all(&c, source);
    if (status == SHARDOPT_OK)
        config_export(&c, cfg);
out:
    cJSON_Delete(root);
    return status;
}

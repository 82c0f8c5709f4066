/* One table describes every config key: its type, where it lives in shardopt_config_t, what
 * values it accepts. The JSON loader, the env reader, validation and printing all walk it, so a
 * new knob is one row here (and its field in the header). */
#ifndef RUNTIME_CONFIG_KEYS_H
#define RUNTIME_CONFIG_KEYS_H

#include <stddef.h>

#include "shardopt.h"

enum config_type {
    CFG_DOUBLE,
    CFG_INT,
    CFG_BOOL,
    CFG_ENUM,
    CFG_U64,
    CFG_STRING, /* char[SHARDOPT_PATTERNS_MAX] */
    CFG_COEFFS, /* double[SHARDOPT_NS_MAX_STEPS][3] */
};

struct config_key {
    const char *name;
    enum config_type type;
    size_t offset;
    const char *const *enum_names; /* CFG_ENUM: names by value, NULL-terminated */
    double min, max;               /* CFG_DOUBLE / CFG_INT */
    int min_open, max_open;        /* exclude the bound itself */
    int has_special;               /* `special` is accepted besides [min, max] ("auto", "rest") */
    double special;
    const char *doc;
};

extern const struct config_key config_keys[];
extern const size_t config_key_count;

const struct config_key *config_key_find(const char *name);

/* OK when the caller's cfg (of cfg->size bytes, an older header's perhaps) holds k's field; else
 * ERR_INVALID_ARGUMENT naming who, the key and the sizes (a value set there was dropped when the
 * config went back to the caller, and OK returned). */
shardopt_status_t config_key_fits(const struct config_key *k, const shardopt_config_t *cfg,
                                  const char *who);

/* "SHARDOPT_" + upper-case name. */
void config_key_env_name(const struct config_key *k, char *out, size_t len);

/* Human-readable accepted values, e.g. "[0, 1)" or "one of fp32, bf16". */
void config_key_accepted(const struct config_key *k, char *out, size_t len);

/* Check one field of cfg. `source` names where the value came from (for the message). */
shardopt_status_t config_key_check(const struct config_key *k, const shardopt_config_t *cfg,
                                   const char *source);

/* Parse text (an env value) into cfg's field; *steps_p receives the triple count for
 * CFG_COEFFS. Errors name `source`, the text and the accepted values. */
shardopt_status_t config_key_parse(const struct config_key *k, const char *text,
                                   shardopt_config_t *cfg, int *steps_p, const char *source);

/* The longest text config_key_format writes, its NUL included: ns_custom_coeffs' 16 triples of
 * numbers written to round-trip, each at most 24 characters ("-2.2250738585072014e-308"), is
 * 1200; a shorter buffer cut it, and the agreement across ranks compared the cut text. */
#define CONFIG_TEXT_MAX 2048

/* What config_key_format prints for ns_custom_coeffs when ns_coeffs is not custom, and what
 * config_key_parse takes back as no table (all zero, ns_steps unchanged). */
#define CONFIG_COEFFS_UNUSED "(unused)"

/* The field's value as text (exactly: doubles round-trip); config_key_parse takes it back. */
void config_key_format(const struct config_key *k, const shardopt_config_t *cfg, char *out,
                       size_t len);

/* The largest |a|, |b|, |c| of a custom Newton-Schulz table (text, JSON and validate) */
#define NS_COEFF_MAX 1000.0

/* The smallest ns_eps / adamw_eps (config and step arguments): FLT_MIN, the smallest normal
 * fp32, as the kernels take them; below it an eps is 0 (or a denormal, flushed to 0 on CPUs that
 * do) and a zero gradient divides 0 by 0. */
#define CONFIG_EPS_MIN 1.1754943508222875e-38

#endif

/* Config handling shared by init and the loaders. */
#ifndef RUNTIME_CONFIG_H
#define RUNTIME_CONFIG_H

#include "shardopt.h"

/* Copy a caller's config of any known version into a full current one (missing fields take
 * their defaults). Errors on a NULL pointer, an unknown version or a size too small. */
shardopt_status_t config_import(const shardopt_config_t *in, shardopt_config_t *out);

/* Copy a full config back into a caller's struct of possibly older size, keeping its
 * size/version. */
void config_export(const shardopt_config_t *full, shardopt_config_t *out);

/* Cross-field checks after keys were overlaid: ns_steps against the table, custom triples.
 * `source` names where the values came from. */
shardopt_status_t config_check_all(const shardopt_config_t *cfg, const char *source);

/* shardopt_config_load_json on text already read: len bytes, with a NUL at text[len] (a NUL
 * before it is refused, never a place the text ends); path names it in messages. The fuzz target
 * tests/fuzz/fuzz_config.c calls it directly. */
shardopt_status_t config_json_text(const char *path, const char *text, size_t len,
                                   shardopt_config_t *cfg);

/* shardopt_config_from_env with the variables read through lookup (NULL: not set) instead of
 * getenv, so the fuzz target tests/fuzz/fuzz_config_set.c can run the overlay on its own
 * variables without touching the process environment. */
typedef const char *(*config_env_lookup_fn)(const char *name, void *ctx);
shardopt_status_t config_env_overlay(shardopt_config_t *cfg, config_env_lookup_fn lookup,
                                     void *ctx);

/* init's environment rule: apply_env = 1 overlays the SHARDOPT_* variables on cfg (errors name
 * the variable, prefixed by who); 0 leaves cfg and warns about config variables that are set.
 * Either way a SHARDOPT_ name close to a key's is reported as a likely typo. */
shardopt_status_t config_env_for_init(shardopt_config_t *cfg, const char *who);

/* The config key one or two edits from name (a likely typo), or NULL. */
const char *config_key_nearest(const char *name);

/* Resolve ns_coeffs/ns_steps/custom into float triples and the norm multiplier. */
void config_ns_resolve(const shardopt_config_t *cfg, float coeffs[][3], float *norm_scale);

#endif

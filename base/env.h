/* The one reader of the process environment for the library's SHARDOPT_* variables
 * (docs/config.md, Environment). Every layer reads through it: base/log.c and base/fault.c their
 * settings before init has run (log: at the first message; fault: at load), runtime/config the
 * config keys' variables at init. The variables that are not config keys are declared once, in
 * env_vars, with what they do; config's typo check takes them from there. */
#ifndef BASE_ENV_H
#define BASE_ENV_H

#include <stddef.h>

/* A SHARDOPT_* variable that is no config key: its name and what it does. */
struct env_var {
    const char *name;
    const char *meaning;
};

extern const struct env_var env_vars[];
extern const size_t env_var_count;

/* The value of the variable `name` (a SHARDOPT_ name), or NULL when it is not set. */
const char *env_get(const char *name);

/* The entry of env_vars named `name`, or NULL: a config key's variable, or no variable of ours. */
const struct env_var *env_var_find(const char *name);

/* Call fn with the name of every variable set in the environment that starts with SHARDOPT_
 * (names of 96 bytes or more are skipped: no variable of ours is that long). */
void env_each_set(void (*fn)(const char *name, void *ctx), void *ctx);

#endif

/* The single place the library calls getenv or walks environ (base/env.h). */
#include "env.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* docs/config.md (Environment) lists the same variables with the same meaning. */
const struct env_var env_vars[] = {
    {"SHARDOPT_LOG_LEVEL",
     "log level: error, warn (default), info, debug; read at the first message (base/log.c)"},
    {"SHARDOPT_LOG_FILE",
     "log file path, %h host, %p pid, %r rank (opened once init knows the rank); default stderr "
     "(base/log.c)"},
    {"SHARDOPT_FAULT",
     "fault injection for tests: [kill@|hang@]<site>:<n>[:<errno>]; read at load (base/fault.h)"},
    {"SHARDOPT_FAULT_RANK", "the runtime rank SHARDOPT_FAULT applies to (base/fault.h)"},
    {"SHARDOPT_CPU_NO_BF16",
     "1: ns_compute = auto treats the CPU as one without native bf16; 0 or empty: not; else init "
     "fails naming it (init)"},
    {"SHARDOPT_CPU_KERNELS_MAX",
     "avx2 or portable: kernels = auto takes at most that table, as on a CPU without the others "
     "(init; tests of a job over mixed CPUs)"},
    {"SHARDOPT_MEM_AVAILABLE",
     "bytes of host memory commit takes as available instead of the machine's (tests; "
     "base/meminfo.h)"},
};
const size_t env_var_count = sizeof env_vars / sizeof env_vars[0];

const char *env_get(const char *name) { return getenv(name); }

const struct env_var *env_var_find(const char *name)
{
    for (size_t i = 0; i < env_var_count; i++)
        if (strcmp(name, env_vars[i].name) == 0)
            return &env_vars[i];
    return NULL;
}

void env_each_set(void (*fn)(const char *name, void *ctx), void *ctx)
{
    extern char **environ;
    char name[96];
    for (char **e = environ; e != NULL && *e != NULL; e++) {
        const char *eq = strchr(*e, '=');
        if (strncmp(*e, "SHARDOPT_", 9) != 0 || eq == NULL || (size_t)(eq - *e) >= sizeof name)
            continue;
        snprintf(name, sizeof name, "%.*s", (int)(eq - *e), *e);
        fn(name, ctx);
    }
}

/* The public calls that describe the library rather than a runtime: its version and the names
 * of the public enums. Apart from base/status.c, which must not see shardopt.h (MPI). */
#include <stddef.h>

#include "shardopt.h"

shardopt_status_t shardopt_get_version(int *major, int *minor, int *patch)
{
    if (major != NULL)
        *major = SHARDOPT_VERSION_MAJOR;
    if (minor != NULL)
        *minor = SHARDOPT_VERSION_MINOR;
    if (patch != NULL)
        *patch = SHARDOPT_VERSION_PATCH;
    return SHARDOPT_OK;
}

/* Names as the config keys spell them (runtime/config/config_keys.c); a value outside the enum is a
 * caller's cast, not a crash. */
#define NAME_OF(v, names)                                                                          \
    ((int)(v) >= 0 && (size_t)(v) < sizeof(names) / sizeof(names[0]) ? names[(int)(v)] : "unknown")

const char *shardopt_dtype_name(shardopt_dtype_t v)
{
    static const char *const n[] = {"fp32", "bf16"};
    return NAME_OF(v, n);
}

const char *shardopt_algo_name(shardopt_algo_t v)
{
    static const char *const n[] = {"auto", "muon", "adamw"};
    return NAME_OF(v, n);
}

const char *shardopt_placement_name(shardopt_placement_t v)
{
    static const char *const n[] = {"dense", "expert", "replicated"};
    return NAME_OF(v, n);
}

const char *shardopt_offload_name(shardopt_offload_t v)
{
    static const char *const n[] = {"none", "optimizer", "cpu"};
    return NAME_OF(v, n);
}

const char *shardopt_ns_compute_name(shardopt_ns_compute_t v)
{
    static const char *const n[] = {"auto", "fp32", "bf16"};
    return NAME_OF(v, n);
}

const char *shardopt_backend_name(shardopt_backend_t v)
{
    static const char *const n[] = {"cpu", "cuda"};
    return NAME_OF(v, n);
}

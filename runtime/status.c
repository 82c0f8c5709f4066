#include "status.h"

#include <stdarg.h>
#include <stdio.h>

#include "log.h"

static _Thread_local char last_error[1024];

const char *shardopt_status_string(shardopt_status_t status)
{
    switch (status) {
    case SHARDOPT_OK: return "success";
    case SHARDOPT_ERR_INVALID_ARGUMENT: return "invalid argument";
    case SHARDOPT_ERR_STATE: return "call not valid in the runtime's current state";
    case SHARDOPT_ERR_OUT_OF_MEMORY: return "out of memory";
    case SHARDOPT_ERR_MISMATCH: return "ranks disagree";
    case SHARDOPT_ERR_UNSUPPORTED: return "unsupported";
    case SHARDOPT_ERR_IO: return "I/O error";
    case SHARDOPT_ERR_CORRUPT: return "corrupt data";
    case SHARDOPT_ERR_NONFINITE: return "non-finite value";
    case SHARDOPT_ERR_INTERNAL: return "internal error";
    case SHARDOPT_ERR_COMM: return "communication error";
    case SHARDOPT_ERR_NCCL: return "NCCL error (communicator aborted)";
    case SHARDOPT_ERR_DEVICE: return "CUDA device error";
    }
    return "unknown status";
}

const char *shardopt_last_error(void) { return last_error; }

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

static void record(const char *fmt, va_list ap)
{
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    log_defang(last_error, sizeof last_error);
}

shardopt_status_t status_set(shardopt_status_t status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    record(fmt, ap);
    va_end(ap);
    return status;
}

shardopt_status_t log_fail(shardopt_status_t status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    record(fmt, ap);
    va_end(ap);
    log_msg(LOG_ERROR, "%s (%s)", last_error, shardopt_status_string(status));
    return status;
}

/* Names as the config keys spell them (runtime/config_keys.c); a value outside the enum is a
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

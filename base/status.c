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
    /* not "CUDA": the simulated device and offload's tables on a CPU return it too */
    case SHARDOPT_ERR_DEVICE: return "device error";
    }
    return "unknown status";
}

const char *shardopt_last_error(void) { return last_error; }

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

shardopt_status_t log_fail_context(shardopt_status_t status, const char *fmt, ...)
{
    char detail[sizeof last_error], where[256];
    va_list ap;
    snprintf(detail, sizeof detail, "%s", last_error); /* not formatted in place */
    va_start(ap, fmt);
    vsnprintf(where, sizeof where, fmt, ap);
    va_end(ap);
    return log_fail(status, "%s: %s", where, detail);
}

/* Errors: recorded once where first detected (thread-local last error + log), then passed up. */
#ifndef BASE_STATUS_H
#define BASE_STATUS_H

#include "shardopt_status.h"

/* Record fmt as this thread's last error, log it at error level, return status. */
shardopt_status_t log_fail(shardopt_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Record fmt as this thread's last error without logging (for errors a caller may retry). */
shardopt_status_t status_set(shardopt_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The thread's last error, recorded by a lower floor (status_set: kernels/ and offload/ know
 * neither the call nor the rank), prefixed with fmt and ": ", then recorded and logged as
 * log_fail does. Returns status. */
shardopt_status_t log_fail_context(shardopt_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif

/*
 * shardopt's status codes and the calls that describe a failure: the part of the public API that
 * needs no MPI, so that every layer of the library (and a tool that only reports errors) can use
 * one status type. shardopt.h includes it; include shardopt.h, not this, in a trainer.
 */
#ifndef SHARDOPT_STATUS_H
#define SHARDOPT_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

/* The library is built with hidden visibility; only what this header declares is exported. */
#if defined(__GNUC__)
#define SHARDOPT_API __attribute__((visibility("default")))
#else
#define SHARDOPT_API
#endif

/** Status codes: 0 is success, every error is negative. */
typedef enum shardopt_status {
    SHARDOPT_OK = 0,
    SHARDOPT_ERR_INVALID_ARGUMENT = -1, /**< a value is outside what is accepted */
    SHARDOPT_ERR_STATE = -2,            /**< call not valid now (e.g. step before commit) */
    SHARDOPT_ERR_OUT_OF_MEMORY = -3,    /**< an allocation failed; the message gives the bytes */
    SHARDOPT_ERR_MISMATCH = -4,         /**< ranks disagree (registration, layout, config, step
                                             arguments, calls, replicas), or a checkpoint does
                                             not match the registered parameters */
    SHARDOPT_ERR_UNSUPPORTED = -5,      /**< valid request this build or version cannot serve */
    SHARDOPT_ERR_IO = -6,               /**< file or system call failed */
    SHARDOPT_ERR_CORRUPT = -7,          /**< malformed file or data */
    SHARDOPT_ERR_NONFINITE = -8,        /**< NaN or Inf where a finite value is required */
    SHARDOPT_ERR_INTERNAL = -9,         /**< a bug in shardopt: please report it */
    SHARDOPT_ERR_COMM = -10,            /**< a communication call failed */
    SHARDOPT_ERR_NCCL = -11,            /**< an NCCL operation failed or timed out (aborted) */
    SHARDOPT_ERR_DEVICE = -12,          /**< a device call, kernel or copy failed */
} shardopt_status_t;

/** Static text for a status code; never NULL. */
SHARDOPT_API const char *shardopt_status_string(shardopt_status_t status);

/** Detail of the last failure on this thread ("" if none). Valid until the next failing call on
 *  the same thread. */
SHARDOPT_API const char *shardopt_last_error(void);

#ifdef __cplusplus
}
#endif

#endif

/* The CUDA backend's per-runtime state (C linkage): the device, the cuBLAS handle, and the small
 * buffers the reductions use. kernel_ctx.backend points to one. */
#ifndef KERNELS_CUDA_CUDA_BACKEND_H
#define KERNELS_CUDA_CUDA_BACKEND_H

#include <stddef.h>

#include "shardopt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct cuda_backend;

/* device < 0: the current device (a trainer has chosen it). SHARDOPT_OK with the state in *out;
 * else SHARDOPT_ERR_OUT_OF_MEMORY (its host state) or SHARDOPT_ERR_DEVICE (a CUDA call), with
 * the message recorded (status_set) and *out NULL. *stream (when stream is not NULL): the
 * backend's own stream. */
shardopt_status_t cuda_backend_create(int device, void **stream, struct cuda_backend **out);
void cuda_backend_destroy(struct cuda_backend *b);

#ifdef __cplusplus
}
#endif

#endif

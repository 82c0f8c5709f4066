/* The CUDA backend's per-runtime state (C linkage): the device, the cuBLAS handle, and the small
 * buffers the reductions use. kernel_ctx.backend points to one. */
#ifndef KERNELS_CUDA_CUDA_BACKEND_H
#define KERNELS_CUDA_CUDA_BACKEND_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

struct cuda_backend;

/* device < 0: the current device (a trainer has chosen it). NULL on failure, with err set.
 * *stream (when stream is not NULL): the backend's own stream. */
struct cuda_backend *cuda_backend_create(int device, void **stream, char *err, size_t errlen);
void cuda_backend_destroy(struct cuda_backend *b);

#ifdef __cplusplus
}
#endif

#endif

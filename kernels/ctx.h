/* The per-call execution context every kernel table entry takes, compute (kernels/ops.h) and
 * device services (kernels/device.h) alike. */
#ifndef KERNELS_CTX_H
#define KERNELS_CTX_H

struct kernel_ctx {
    int threads;   /* 0: as the OpenMP runtime decides */
    void *stream;  /* CUDA stream; NULL on the CPU */
    void *backend; /* CUDA: the backend state of device_ops.backend_create; NULL on the CPU */
};

#endif

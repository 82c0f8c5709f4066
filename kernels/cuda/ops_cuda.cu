/* CUDA backend: the skeleton of the kernel table. Memory entry points are real; the compute
 * entries are not implemented yet (the CUDA issue), so the runtime refuses backend = cuda and
 * only the memory path is exercised (tests/gpu/test_cuda_memory.c on a machine with a GPU). */
#include <cuda_runtime.h>

extern "C" {
#include "../ops.h"
#include "cuda_probe.h"
}

static void *cuda_alloc(size_t bytes)
{
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess)
        return NULL;
    return p;
}

static void cuda_free(void *p)
{
    if (p != NULL)
        cudaFree(p);
}

static const struct kernel_ops cuda_ops = {
    "cuda", NULL, NULL, NULL, NULL, NULL,       NULL,      NULL,
    NULL,   NULL, NULL, NULL, NULL, cuda_alloc, cuda_free,
};

extern "C" const struct kernel_ops *kernel_ops_cuda(void) { return &cuda_ops; }

extern "C" int cuda_probe_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess)
        return 0;
    return n;
}

extern "C" int cuda_probe_copy(void *dst_dev, const void *src_host, void *back_host, size_t bytes)
{
    if (cudaMemcpy(dst_dev, src_host, bytes, cudaMemcpyHostToDevice) != cudaSuccess)
        return -1;
    if (cudaMemcpy(back_host, dst_dev, bytes, cudaMemcpyDeviceToHost) != cudaSuccess)
        return -1;
    return 0;
}

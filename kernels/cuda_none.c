/* Built without CUDA: there is no CUDA kernel table, nor a CUDA device table. */
#include "device.h"
#include "ops.h"

const struct kernel_ops *kernel_ops_cuda(void) { return NULL; }

const struct device_ops *device_ops_cuda(void) { return NULL; }

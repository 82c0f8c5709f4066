/* Built without CUDA: there is no CUDA kernel table. */
#include "ops.h"

const struct kernel_ops *kernel_ops_cuda(void) { return NULL; }

/* OpenBLAS keeps one thread count for the whole process: set it once, at init. */
#include "../blas_threads.h"

#include <cblas.h>

void kernel_blas_set_threads(int threads)
{
    if (threads > 0)
        openblas_set_num_threads(threads);
}

int kernel_blas_get_threads(void) { return openblas_get_num_threads(); }

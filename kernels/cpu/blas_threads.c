/* OpenBLAS keeps one thread count for the whole process: set it once, at init. */
#include "../blas_threads.h"

#include <cblas.h>

void kernel_blas_set_threads(int threads)
{
    if (threads > 0)
        openblas_set_num_threads(threads);
}

int kernel_blas_get_threads(void) { return openblas_get_num_threads(); }

/* openblas_get_parallel(): 0 sequential, 1 pthreads, 2 OpenMP */
int kernel_blas_uses_openmp(void) { return openblas_get_parallel() == 2; }

/* OpenBLAS keeps one thread count for the whole process: set it once, at init. The OpenMP
 * default goes with it, since oneDNN's bf16 matmul (OpenMP runtime) takes its threads from
 * omp_get_max_threads(): the OpenMP OpenBLAS sets it too, the pthread build would not. */
#include "../blas_threads.h"

#include <cblas.h>
#include <omp.h>

void blas_threads_set(int threads)
{
    if (threads > 0) {
        openblas_set_num_threads(threads);
        omp_set_num_threads(threads);
    }
}

int blas_threads_get(void) { return openblas_get_num_threads(); }

/* openblas_get_parallel(): 0 sequential, 1 pthreads, 2 OpenMP */
int blas_threads_uses_openmp(void) { return openblas_get_parallel() == 2; }

const char *blas_threads_core(void)
{
    const char *core = openblas_get_corename();
    return core != NULL ? core : "unknown";
}

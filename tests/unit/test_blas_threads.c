/* BLAS threading: the linked OpenBLAS must be the OpenMP build. With the pthread build,
 * libgomp's idle workers spin while BLAS threads compute, and on 2 cores Newton-Schulz ran 2.3x
 * slower with 2 threads than with 1 (found in moe_demo). */
#include <omp.h>

#include "kernels/blas_threads.h"
#include "test.h"

TEST(openblas_is_the_openmp_build) { EXPECT_TRUE(kernel_blas_uses_openmp()); }

TEST(blas_thread_count_is_settable)
{
    int before = kernel_blas_get_threads();
    kernel_blas_set_threads(1);
    EXPECT_EQ_INT(kernel_blas_get_threads(), 1);
    EXPECT_EQ_INT(omp_get_max_threads(), 1); /* oneDNN's threads follow */
    kernel_blas_set_threads(2);
    EXPECT_EQ_INT(omp_get_max_threads(), 2);
    kernel_blas_set_threads(1);
    kernel_blas_set_threads(0); /* 0 leaves it as it is */
    EXPECT_EQ_INT(kernel_blas_get_threads(), 1);
    EXPECT_EQ_INT(omp_get_max_threads(), 1);
    kernel_blas_set_threads(before);
    EXPECT_EQ_INT(kernel_blas_get_threads(), before);
}

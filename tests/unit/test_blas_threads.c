/* BLAS threading: the linked OpenBLAS must be the OpenMP build. With the pthread build,
 * libgomp's idle workers spin while BLAS threads compute, and on 2 cores Newton-Schulz ran 2.3x
 * slower with 2 threads than with 1 (found in moe_demo). */
#include <omp.h>

#include "kernels/blas_threads.h"
#include "test.h"

TEST(openblas_is_the_openmp_build) { EXPECT_TRUE(blas_threads_uses_openmp()); }

TEST(blas_thread_count_is_settable)
{
    int before = blas_threads_get();
    blas_threads_set(1);
    EXPECT_EQ_INT(blas_threads_get(), 1);
    EXPECT_EQ_INT(omp_get_max_threads(), 1); /* oneDNN's threads follow */
    blas_threads_set(2);
    EXPECT_EQ_INT(omp_get_max_threads(), 2);
    blas_threads_set(1);
    blas_threads_set(0); /* 0 leaves it as it is */
    EXPECT_EQ_INT(blas_threads_get(), 1);
    EXPECT_EQ_INT(omp_get_max_threads(), 1);
    blas_threads_set(before);
    EXPECT_EQ_INT(blas_threads_get(), before);
}

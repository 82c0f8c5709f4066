#ifndef KERNELS_BLAS_THREADS_H
#define KERNELS_BLAS_THREADS_H

/* Threads OpenBLAS uses (process-wide); threads <= 0 leaves the current setting. */
void kernel_blas_set_threads(int threads);
int kernel_blas_get_threads(void);

/* 1 when the linked BLAS threads through OpenMP, sharing the elementwise kernels' pool. */
int kernel_blas_uses_openmp(void);

#endif

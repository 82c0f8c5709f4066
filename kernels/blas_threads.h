#ifndef KERNELS_BLAS_THREADS_H
#define KERNELS_BLAS_THREADS_H

/* Threads OpenBLAS uses (process-wide); threads <= 0 leaves the current setting. */
void kernel_blas_set_threads(int threads);
int kernel_blas_get_threads(void);

#endif

#ifndef KERNELS_BLAS_THREADS_H
#define KERNELS_BLAS_THREADS_H

/* Threads OpenBLAS uses (process-wide); threads <= 0 leaves the current setting. */
void blas_threads_set(int threads);
int blas_threads_get(void);

/* 1 when the linked BLAS threads through OpenMP, sharing the elementwise kernels' pool. */
int blas_threads_uses_openmp(void);

/* The CPU core whose kernels the linked OpenBLAS runs ("SkylakeX", "Haswell"): its sums, and so
 * Newton-Schulz's bits, follow it. Static text, never NULL ("unknown"). */
const char *blas_threads_core(void);

#endif

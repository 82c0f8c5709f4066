/* How the CPU elementwise kernels split their work over threads. */
#ifndef KERNELS_CPU_ELEM_SPLIT_H
#define KERNELS_CPU_ELEM_SPLIT_H

#include "../ops.h"

#ifdef _OPENMP
#include <omp.h>
#endif

/* Split [0, n) into chunks of a multiple of 64 elements (whole rng groups, whole cache lines).
 * Each element's result depends only on its own inputs, so the split never changes the bits. */
#define KCHUNK ((size_t)1 << 14)

/* Threads for an elementwise pass over n elements: one for small passes, where waking a team
 * costs more than it saves. */
static inline int kthreads(const struct kernel_ctx *ctx, size_t n)
{
    if (n <= 2 * KCHUNK)
        return 1;
#ifdef _OPENMP
    return ctx->threads > 0 ? ctx->threads : omp_get_max_threads();
#else
    (void)ctx;
    return 1;
#endif
}

#endif

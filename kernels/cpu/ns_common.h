/* The parts of Newton-Schulz every CPU variant shares, so that they differ only in the products. */
#ifndef KERNELS_CPU_NS_COMMON_H
#define KERNELS_CPU_NS_COMMON_H

#include "../ops.h"

/* Working shape: m x n with m <= n (the stored matrix, or its transpose). */
static inline void ns_work_shape(const struct ns_args *a, int64_t *m, int64_t *n)
{
    *m = a->transpose ? a->cols : a->rows;
    *n = a->transpose ? a->rows : a->cols;
}

/* X <- U_k / (|U_k|_F * norm_scale + eps), in the working orientation. The norm is a double
 * sum in storage order over a fixed set of lanes, so it depends on neither threads nor variants. */
void ns_load_normalized(const struct ns_args *a, int64_t k, float *x);

/* X <- U_k * inv in the working orientation (inv from a norm summed elsewhere, e.g. over the
 * pieces of a sharded matrix). */
void ns_load_with_inv(const struct ns_args *a, int64_t k, double inv, float *x);

/* O_k <- X rounded to nearest in out_dtype, back in the stored orientation. */
void ns_store_output(const struct ns_args *a, int64_t k, const float *x);

#endif

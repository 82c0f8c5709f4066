/* Which Newton-Schulz variant a shape uses: a table committed in the source, measured with
 * bench/ns_bench, never re-timed during a run, so every rank, replica and rerun runs the same
 * kernel for the same shape and gets the same bits. */
#ifndef KERNELS_NS_VARIANT_H
#define KERNELS_NS_VARIANT_H

#include <stdint.h>

/* NS_VARIANT_PLAIN or NS_VARIANT_SYMMETRIC for a rows x cols matrix. */
int ns_variant_for_shape(int64_t rows, int64_t cols);

/* The same for the bf16 path, with the rows per block row of its symmetric variant. */
int ns_bf16_variant_for_shape(int64_t rows, int64_t cols, int *block);

/* NS_ALGO_STANDARD or NS_ALGO_GRAM for a rows x cols matrix under ns_algorithm = auto, for
 * compute KDT_F32 or KDT_BF16, `steps` steps of these coefficients (Gram's restarts depend on
 * them, and with them whether Gram saves anything: ns_algorithm_gram_saves). */
int ns_algorithm_for_shape(int64_t rows, int64_t cols, int compute, const float (*coeffs)[3],
                           int steps);

/* 1 when Gram Newton-Schulz with the restarts ns_coeffs_gram_restarts_for gives this table, shape
 * and compute performs fewer FLOPs than the standard iteration (ns_flops_count, every product
 * whole; the comparison comes out the same with symmetric products wherever n >= 2m). */
int ns_algorithm_gram_saves(int64_t rows, int64_t cols, int compute, const float (*coeffs)[3],
                            int steps);

#endif

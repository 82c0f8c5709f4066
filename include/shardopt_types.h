/*
 * The public enums that the compute below the runtime works with (dtypes, rounding, the
 * Newton-Schulz coefficient tables, algorithm and preconditioning): apart from shardopt.h so
 * that the library's compute layer uses these very values without seeing MPI, instead of keeping
 * copies in step. shardopt.h includes it; include shardopt.h, not this, in a trainer.
 */
#ifndef SHARDOPT_TYPES_H
#define SHARDOPT_TYPES_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum shardopt_dtype {
    SHARDOPT_DTYPE_FP32 = 0,
    SHARDOPT_DTYPE_BF16 = 1,
} shardopt_dtype_t;

/** How a value is rounded when it is stored in a narrower dtype. */
typedef enum shardopt_rounding {
    SHARDOPT_ROUNDING_NEAREST = 0,    /**< round to nearest, ties to even */
    SHARDOPT_ROUNDING_STOCHASTIC = 1, /**< counter-based random bits, layout-independent */
} shardopt_rounding_t;

/** Newton-Schulz coefficient tables (their values: the configuration reference, ns_coeffs). */
typedef enum shardopt_ns_coeffs {
    SHARDOPT_NS_QUINTIC = 0, /**< dion / Megatron per-step triples (default) */
    SHARDOPT_NS_JORDAN = 1,  /**< (3.4445, -4.7750, 2.0315) every step */
    SHARDOPT_NS_POLAR_EXPRESS = 2,
    SHARDOPT_NS_CUSTOM = 3, /**< ns_custom_coeffs */
    SHARDOPT_NS_AOL = 4,    /**< 4-step schedule for ns_precondition = aol */
} shardopt_ns_coeffs_t;

/** How the Newton-Schulz iterations are arranged: on X itself, or on its m x m Gram matrix
 *  X X^T (the same polynomial in exact arithmetic, fewer FLOPs on wide matrices). */
typedef enum shardopt_ns_algorithm {
    SHARDOPT_NS_ALGORITHM_STANDARD = 0, /**< per step X X^T, A A and B X (default) */
    SHARDOPT_NS_ALGORITHM_GRAM =
        1, /**< steps on the m x m Gram matrix; X read for it, at restarts and for the result */
    SHARDOPT_NS_ALGORITHM_AUTO = 2, /**< per shape, from a committed table */
} shardopt_ns_algorithm_t;

/** How X is scaled before the first Newton-Schulz step. */
typedef enum shardopt_ns_precondition {
    SHARDOPT_NS_PRECONDITION_FROBENIUS = 0, /**< U / (|U|_F s + eps) (default) */
    SHARDOPT_NS_PRECONDITION_AOL = 1,       /**< then rows by (sum_j |(X X^T)_ij|)^(-1/2) */
} shardopt_ns_precondition_t;

#ifdef __cplusplus
}
#endif

#endif

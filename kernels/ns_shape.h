/* Newton-Schulz's sizes on its working shape m x n (m <= n, the wide orientation), written once
 * for the CPU kernels, the CUDA driver (kernels/cuda/ns_driver.h) and the sharded step
 * (runtime/step/ns_sharded.c, where n is a rank's columns of the matrix). Plain C, inline: the
 * CUDA sources include it too. sharding/plan.c keeps the planner's copy of the FLOP count
 * (plan_ns_cost; sharding/ does not see kernels/), and test_ns_gram checks that the two agree. */
#ifndef KERNELS_NS_SHAPE_H
#define KERNELS_NS_SHAPE_H

#include <stddef.h>
#include <stdint.h>

/* FLOPs (2 per multiply-add) of one standard iteration: A = X X^T 2m^2n, B = bA + cAA 2m^3,
 * Y = aX + BX 2m^2n. A sharded piece of n = 0 columns still forms B from the all-reduced A. */
static inline double ns_iter_flops(double m, double n) { return 4.0 * m * m * n + 2.0 * m * m * m; }

/* Elements of the standard iteration's operands: X and Y (m x n, trading places each
 * iteration), A and B (m x m). */
static inline size_t ns_xyab_elems(int64_t m, int64_t n)
{
    return 2 * (size_t)m * (size_t)n + 2 * (size_t)m * (size_t)m;
}

#endif

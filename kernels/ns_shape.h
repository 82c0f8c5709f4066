/* Newton-Schulz's sizes on its working shape m x n (m <= n, the wide orientation), written once
 * for the CPU kernels, the CUDA driver (kernels/cuda/ns_driver.h) and the sharded step
 * (runtime/step/ns_sharded.c, where n is a rank's columns of the matrix). Plain C, inline: the
 * CUDA sources include it too. sharding/plan.c keeps the planner's copy of the FLOP count
 * (plan_ns_cost; sharding/ does not see kernels/), and test_ns_gram checks that the two agree. */
#ifndef KERNELS_NS_SHAPE_H
#define KERNELS_NS_SHAPE_H

#include <stddef.h>
#include <stdint.h>

/* FLOPs (2 per multiply-add) of one standard iteration with every product whole: A = X X^T
 * 2m^2n, B = bA + cAA 2m^3, Y = aX + BX 2m^2n. A sharded piece of n = 0 columns forms neither B
 * nor Y (runtime/step/ns_sharded.c counts nothing for it). */
static inline double ns_iter_flops(double m, double n) { return 4.0 * m * m * n + 2.0 * m * m * m; }

/* A sharded block of n columns (a team member's, or a holder's under ns_strategy sharded)
 * iterated in fp32 runs the update in the cheaper of two forms, chosen from its shape only:
 * n >= m, B = bA + cAA then Y = aX + BX (2m^3 + 2m^2n, ns_iter_flops); n < m, A applied twice,
 * Y = aX + A(bX + c(AX)) (4m^2n, no m^3 term: cheaper exactly when n < m). Every member of a team
 * computes A^2 whole, so a narrow block's A^2 costs more than its own columns' products. A team
 * iterating in bf16 always takes the A^2 form (kernels/cpu/ns_bf16.c says why). */
static inline int ns_shard_narrow(double m, double n) { return n < m; }

/* FLOPs of one sharded iteration on such a block: X X^T 2m^2n, then the update; n = 0: none
 * (the block forms neither). narrow_ok: 1 where the block may take the narrow form (fp32), 0
 * where it always forms A^2 (bf16 teams). sharding/plan.c's plan_ns_block_cost is the planner's
 * copy. */
static inline double ns_shard_iter_flops(double m, double n, int narrow_ok)
{
    return n <= 0                               ? 0.0
           : narrow_ok && ns_shard_narrow(m, n) ? 6.0 * m * m * n
                                                : ns_iter_flops(m, n);
}

/* FLOPs (2 per multiply-add) of one matrix's whole Newton-Schulz on the working shape m x n,
 * `steps` steps: standard (gram = 0), or Gram with these restarts (ns_coeffs_gram_restarts: bit
 * k, a restart before step k). A product whose result is symmetric (X X^T, A A, R R, (Z R) Z) is
 * counted at `share` of the whole one: 1 whole, 0.5 its upper half (the CPU's symmetric
 * variant), (1 + 1/k) / 2 for k equal block columns (the device's). Standard: per step X X^T, A A
 * (share) and B X. Gram: per segment G (share) and X <- Q X; per step R R (share), Z Q but in a
 * segment's first step (whole), Z R (whole) and (Z R) Z (share) but before a restart or after the
 * last step. ns_flops_total (kernels/ops.h) is this for the CPU's variants. */
static inline double ns_flops_count(double m, double n, int steps, int gram, uint32_t restarts,
                                    double share)
{
    const double h = 2.0 * share;
    if (!gram)
        return steps * (h * m * m * n + h * m * m * m + 2.0 * m * m * n);
    double f = 0.0;
    for (int lo = 0, hi; lo < steps; lo = hi) {
        for (hi = lo + 1; hi < steps && !(restarts >> hi & 1u); hi++) {
        }
        f += h * m * m * n + 2.0 * m * m * n; /* G = X X^T, and X <- Q X at the segment's end */
        for (int s = lo; s < hi; s++) {
            f += h * m * m * m;                            /* R R */
            f += s > lo ? 2.0 * m * m * m : 0.0;           /* Q = Z Q, whole */
            f += s + 1 < hi ? (2.0 + h) * m * m * m : 0.0; /* T = Z R whole, R = T Z */
        }
    }
    return f;
}

/* Elements of the standard iteration's operands: X and Y (m x n, trading places each
 * iteration), A and B (m x m). */
static inline size_t ns_xyab_elems(int64_t m, int64_t n)
{
    return 2 * (size_t)m * (size_t)n + 2 * (size_t)m * (size_t)m;
}

#endif

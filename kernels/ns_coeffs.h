/* Newton-Schulz coefficient tables, by name. */
#ifndef KERNELS_NS_COEFFS_H
#define KERNELS_NS_COEFFS_H

#include <stdint.h>

#include "shardopt_types.h"

#define NS_TABLE_MAX_STEPS 16

/* The kernels' names for shardopt_ns_coeffs_t: the same values by construction. */
enum ns_table {
    NS_TABLE_QUINTIC = SHARDOPT_NS_QUINTIC,
    NS_TABLE_JORDAN = SHARDOPT_NS_JORDAN,
    NS_TABLE_POLAR_EXPRESS = SHARDOPT_NS_POLAR_EXPRESS,
    NS_TABLE_CUSTOM = SHARDOPT_NS_CUSTOM,
    NS_TABLE_AOL = SHARDOPT_NS_AOL
};

/* The triples for `steps` iterations of `table` (custom: taken from `custom`). Tables shorter
 * than steps repeat their last triple. Returns 0, or -1 for an unknown table or steps out of
 * 1..NS_TABLE_MAX_STEPS. */
int ns_coeffs_fill(int table, int steps, const double (*custom)[3], float out[][3]);

/* Frobenius-norm multiplier the table was designed for: 1.01 for polar_express (its safety
 * factor), 1 otherwise. */
double ns_coeffs_default_norm_scale(int table);

/* Steps the table accepts: [*min, *max]. */
void ns_coeffs_step_range(int table, int *min, int *max);

/* Where Gram Newton-Schulz (kernels/cpu/ns_gram.c) restarts for these steps on a rows x cols
 * matrix: bit k (1 <= k < steps) set when X <- Q X, G = X X^T, Q = I comes before step k. A
 * function of the coefficients and the shape only, the same on every rank, for the CPU paths,
 * the CUDA driver and the FLOP count (ns_flops_total); docs/design.md has the derivation:
 * - a segment's R = Q G Q^T is stepped on without looking at X again, and its rounding errors on
 *   the small eigenvalues grow by p_k(0)^2 = a_k^2 per step, as the eigenvalues themselves do: a
 *   negative one (R's rounding makes them) grows without bound. The segment's exposure, the
 *   product over its steps but the last of g_k = max |p_k| over the spectrum step k can see (a_k
 *   for every published table), is kept at most NS_COEFFS_GRAM_EXPOSURE: quintic's second segment
 *   (steps 2-4) has 10.8, polar_express's 8 steps without the bound 101 (it diverges in bf16),
 *   jordan's first three steps 11.9 (they diverged in bf16 on small wide matrices);
 * - where the working shape is not wide (n < 2 m, what `auto` never sends to Gram), every step
 *   restarts: Gram is then the standard iteration's arithmetic (G = X X^T, X <- p(G) X) and its
 *   FLOP count, and keeps its accuracy. Restarting only where a restart costs no more than the
 *   products it saves (n <= 1.5 m) left aol's 4 steps on a 7 x 12 bf16 matrix 2.4 from the fp64
 *   result (test_xcheck, seed 20306);
 * - past 5 steps, also before step 5 and every 2 steps after it (quintic's table, its last triple
 *   repeated, reached 1.4e4 times the fp64 result at 12 steps in bf16 with the exposure bound
 *   alone);
 * - where the short side m is at most NS_COEFFS_GRAM_SMALL_M, every step restarts, whatever the
 *   table: see that bound. */
uint32_t ns_coeffs_gram_restarts(const float (*coeffs)[3], int steps, int64_t rows, int64_t cols);

/* The restarts of Gram Newton-Schulz computed in `compute` (KDT_F32 or KDT_BF16):
 * ns_coeffs_gram_restarts' for bf16 (the CPU bf16 path, the CUDA driver). In fp32 (the CPU path,
 * kernels/cpu/ns_gram.c), where those leave a segment of three steps or more, the first step runs
 * alone and the exposure bound counts from step 1: quintic's 5 steps restart before steps 1 and 3
 * instead of 2 (the other published tables' segments are at most two steps long and keep theirs).
 * A segment of one step is the standard step, product for product, so the fp32 result shares the
 * standard iteration's first-step rounding. Issue 23 asks for fp32 Gram within 1e-5 of fp32
 * standard on condition-1e4 inputs, where standard itself is 9.1e-6 from the fp64 iteration:
 * measured (tests/unit/test_ns_gram.c, ns_gram_matches_standard_fp32; OpenBLAS SkylakeX kernels,
 * Haswell's in brackets) at 300 x 700 Gram 1.71e-5 [1.62e-5] from standard before, 7.25e-6
 * [7.2e-6] with this, 1.46e-5 -> 8.65e-6 from fp64 (standard 9.08e-6); 96 x 384 1.48e-5 [1.14e-5]
 * -> 5.89e-6 [5.3e-6]; 800 x 1600 1.96e-5 -> 8.1e-6. Restarting before steps 2 and 4 instead
 * (the same FLOPs) is nearer fp64 (5.9e-6) but 1.08e-5 from standard, its rounding its own.
 * Cost: 9 m^2 n + 15 m^3 FLOPs instead of 6 m^2 n + 20 m^3 (ideal speedup over symmetric
 * standard 1.18x instead of 1.30x at 1408 x 4096, 1.27x instead of 1.48x at n = 4m). On tables
 * whose segments are at most two steps the first step alone measured farther from fp64 (jordan
 * 5.6e-6 -> 8.1e-6 at 96 x 384, the aol table 7.6e-6 -> 1.0e-5 and one restart more), so it is
 * not applied there. A function of the coefficients, the shape and the compute only. */
uint32_t ns_coeffs_gram_restarts_for(const float (*coeffs)[3], int steps, int64_t rows,
                                     int64_t cols, int compute);

/* A bound on the singular values Newton-Schulz with these `steps` triples can output from an X
 * whose singular values are at most s0: each step's image of the last bound (max |s p_k(s^2)|
 * over [0, s], the same iteration ns_coeffs_gram_restarts runs, uncapped); 1.145 for quintic's
 * 5 steps from s0 = 1. Infinity where it overflows. The Gram result guard (ns_gram_guard_ok) checks
 * the output's squared Frobenius norm against m times its square. */
double ns_coeffs_output_bound(const float (*coeffs)[3], int steps, double s0);

/* The Gram result guard's test, shared by the CPU paths (ns_gram_guard_ok) and the CUDA driver
 * (kernels/cuda/ns_driver.h): 1 when a working m x n result whose squared Frobenius norm is
 * sumsq is finite and sumsq <= NS_COEFFS_GUARD_SLACK m S^2, S = ns_coeffs_output_bound from
 * max(1, 1 / norm_scale) (Frobenius scaling leaves |X|_2 <= 1 / norm_scale, AOL <= 1). */
int ns_coeffs_output_norm_ok(const float (*coeffs)[3], int steps, float norm_scale, int64_t m,
                             double sumsq);

/* The slack on m S^2 above: 2, room for bf16's rounding of every product (the published schedules
 * reach |O|_F^2 / m of at most 1.09 where m S^2 / m is 1.0 to 1.31: test_ns_gram_guard). */
#define NS_COEFFS_GUARD_SLACK 2.0

/* Tests only: 1 makes ns_coeffs_gram_restarts (and _for) return `mask` for every table and shape
 * (0: the rule), so that a test can run Gram with fewer restarts than the rule allows and make it
 * diverge on purpose (the result guard's test, test_ns_guards). Never set by the library. */
void ns_coeffs_gram_restarts_force(int on, uint32_t mask);

/* The bound on a segment's exposure above: 11. Measured in a bf16 simulation of the driver's
 * products: a segment of exposure 26 (polar_express restarting after steps 2 and 3) made the
 * error 1.6x standard bf16's on condition-1e4 inputs and 4x on square ones, one of 29 (after 2
 * and 6) diverged. 14 (before) let jordan's 5 steps run steps 0-2 on one R (exposure 11.9): on
 * 2 x 5 to 8 x 33 matrices with one small singular value |O| reached 6.5e6 times the fp64 result
 * in bf16 (test_ns_guards, gram_bf16_jordan_stays_bounded_on_small_wide_matrices). 11 keeps
 * quintic's published schedule (one restart, after step 2: exposures 4.1 and 10.8) and the aol
 * table's 4 after step 2 (4.6, 4.2), and gives jordan's 5 restarts after steps 2 and 4 (then
 * within 1.06x there), polar_express's 5 after 2 and 4, its 8 after 2, 4, 5 and 7. */
#define NS_COEFFS_GRAM_EXPOSURE 11.0

/* Up to this short side m Gram restarts before every step (the standard iteration's arithmetic),
 * whatever the table. On small wide matrices whose singular values spread over [1e-4, 1] the
 * exposure bound is not enough in bf16: R's few eigenvalues carry G's rounding (about 4e-3 of
 * |G|) on eigenvalues down to 1e-8, and with the steeper tables a segment of two steps already
 * turns it into a diverging one. Found by test_xcheck (seeds 14154: the aol table on 2 x 5,
 * relative error 19 against fp64; 70174: polar_express x8 on 3 x 7, Inf; 21012: polar_express x6 on
 * 3 x 16, 0.066 off). On 60 drawn spectra per shape (tests/unit/test_ns_bf16.c,
 * bf16_gram_small_wide_spread_spectra_every_table, with more seeds) polar_express's 5, 6 and 8
 * steps diverged (|O| up to 1e18 times the fp64 result, NaN) up to 12 x 30, the aol table's ran
 * 0.4-160 from fp64 where standard bf16 was 0.05-0.2 up to 16 x 40; on 40 per shape from 20 x 50
 * to 96 x 200 none left the bound, and quintic and jordan never did. Measured against the other
 * options: the restarts an fp64 emulation of the bf16 products asks for on every shape
 * (polar_express before every step, the aol table before steps 1 and 3) would cost the aol table
 * one more restart (3 m^2 n) at 1408 x 4096, where gram+aol's 1.55x target has no margin
 * (docs/performance.md); a rule per table name cannot be had here (the mask is a function of the
 * coefficients, shared by the CPU paths, the CUDA driver and the FLOP count); `auto` keeping
 * `standard` on such shapes (kernels/cpu/ns_variant_table.c, as it now does: Gram saves no FLOPs
 * there) would leave an explicit `gram` diverging; the check of the result that the CPU paths now
 * run (ns_gram_guard_ok in kernels/cpu/ns_common.h, else the standard iteration again) catches a
 * diverged result but not surely one 0.066 off (seed 21012), whose norm need not be off, so it
 * backs this rule up rather than replacing it. Up to m = 64 the
 * restarts cost little: Gram then does the standard iteration's FLOPs (3 m^2 n + m^3 per step
 * with symmetric products), and a 64 x 8192 matrix's whole Newton-Schulz (5 quintic steps,
 * 0.51 GFLOP) is 0.5 % of a 1408 x 4096 one's under Gram (104 GFLOP); 64 is 4x the largest m that
 * failed. From m = 65 every table's schedule, quintic's included, is unchanged. */
#define NS_COEFFS_GRAM_SMALL_M 64

#endif

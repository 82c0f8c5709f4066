#include "../ns_coeffs.h"
#include "../ns_shape.h"
#include "../ns_variant.h"
#include "../ops.h"

/* Smallest working-shape m (the shorter side) that runs the symmetric variant. No cap on n/m: the
 * saving on X*X^T alone is m^2 n of the 4m^2 n + 2m^3, so the ideal speedup falls only from 1.5
 * (square) toward 4/3 as n/m grows, and the measurements below show it holding at n/m = 16.
 *
 * Measured on AMD EPYC Zen 4 (2 cores), OpenBLAS 0.3.21 (Cooperlake kernels): plain time /
 * symmetric time for 5 quintic steps, each run a median of 7 reps; 1 thread: median of 3 runs,
 * 2 threads: the range over 3 runs (other jobs shared the machine, which moves the 2-thread ratio):
 *   m x n        1 thread   2 threads
 *   64x64          0.85       0.80-0.85
 *   128x128        1.16       0.89-1.15
 *   256x256        1.33       0.97-1.01
 *   256x1024       1.27       1.00-1.08
 *   320x320        1.36       0.97-0.99
 *   384x384        1.37       1.05-1.11
 *   384x1536       1.31       1.07-1.14
 *   512x512        1.40       1.10-1.16
 *   768x3072       1.34       1.22-1.24
 *   256x8192       1.23       1.02-1.09
 *   512x8192       1.29       1.14-1.17
 * With one thread the symmetric variant wins from m = 128; with two it only pays from m = 384,
 * because OpenBLAS threads ssyrk poorly below that (ssyrk at m = n = 256 takes 0.89 of the full
 * sgemm's time with 2 threads, 0.59 with 1). The table cannot depend on the thread count, and
 * trainers run more BLAS threads than one, so the crossover is the 2-thread one.
 * Reproduce with (3 runs each, on an otherwise idle machine)
 *   S=; for m in 64 128 192 256 320 384 448 512 640 768; do S="$S --shape ${m}x$m --shape
 *   ${m}x$((4*m))"; done; ns_bench --json --reps 7 --threads 2 $S --shape 256x8192
 *   --shape 512x8192          (and --threads 1) */
#define NS_SYMMETRIC_MIN_M 384

int ns_variant_for_shape(int64_t rows, int64_t cols)
{
    const int64_t m = rows < cols ? rows : cols;
    return m >= NS_SYMMETRIC_MIN_M ? NS_VARIANT_SYMMETRIC : NS_VARIANT_PLAIN;
}

/* The bf16 path (ns_compute = bf16, kernels/cpu/ns_bf16.c): symmetric from m = 384, in block rows
 * of 128 up to m = 1024 and of 256 above. Measured on the same machine with oneDNN 2.6
 * (brg:avx512_core_bf16), plain time / symmetric time for 5 quintic steps, median of 5, at
 * blocks 64 / 128 / 256 (1 thread | 2 threads):
 *   m x n        1 thread              2 threads
 *   128x128      0.87 (64)             0.79 (64)
 *   256x256      1.07 / 1.03           0.97 / 0.94
 *   256x1024     1.13 / 1.10           1.03 / 1.05
 *   384x384      1.26 / 1.22 / 1.13    1.06 / 1.06 / 1.02
 *   384x1536     1.19 / 1.15 / 1.09    1.11 / 1.12 / 1.07
 *   512x512      - / 1.22 / 1.14       - / 1.15 / 1.08
 *   1024x1024    - / 1.27 / 1.25       - / 1.25 / 1.23
 *   1024x4096    - / 1.21 / 1.21       - / 1.21 / 1.21
 *   1408x4096    - / 1.29 / 1.31       - / 1.23 / 1.24
 *   2048x2048    - / 1.30 / 1.35       - / 1.28 / 1.29
 * Small blocks waste less on the diagonal blocks (n m^2 (1 + block/m) for X X^T) but run smaller
 * matmuls; 128 is within 0.04 of the best block up to m = 1024, 256 above it. */
#define NS_BF16_SYMMETRIC_MIN_M 384
#define NS_BF16_LARGE_M         1024

/* ns_algorithm = auto: Gram Newton-Schulz from n >= 2m (the working shape) where it performs
 * fewer FLOPs than the standard iteration, for both computes. The counts of ns_flops_total
 * (symmetric products) give the Gram algorithm an ideal speedup of (15r + 5) / (6r + 20) for 5
 * quintic steps at r = n/m: 0.80 at r = 1, break-even at 1.67, 1.09 at 2, 1.30 at 2.9, 1.48 at
 * 4; measured ratios are in docs/performance.md. Where Gram restarts before every step (short
 * side m <= NS_COEFFS_GRAM_SMALL_M, a table steep enough that each step alone passes the
 * exposure bound, or a single step) it performs exactly the standard iteration's products (G =
 * X X^T, Z = p(G), X <- Z X per step) with R, Z and Q rounded on top: no saving, worse rounding,
 * so auto keeps standard there. The rule reads the shape and the table only, never a timing, so
 * every rank, layout and rerun resolves it the same. */
#define NS_GRAM_MIN_ASPECT_X2 4 /* n/m >= 2, in halves */

int ns_algorithm_gram_saves(int64_t rows, int64_t cols, int compute, const float (*coeffs)[3],
                            int steps)
{
    const double m = (double)(rows < cols ? rows : cols), n = (double)(rows < cols ? cols : rows);
    const uint32_t restarts = ns_coeffs_gram_restarts_for(coeffs, steps, rows, cols, compute);
    /* Gram saves (L - 1)((h + 2) m^2 n - (h + 4) m^3) on a segment of L steps (h = 2 whole, 1
     * symmetric), so the answer is the same for either count where n >= 2m; the counts are sums
     * of integers below 2^53 for any shape that fits memory, so equal ones compare equal */
    return ns_flops_count(m, n, steps, 1, restarts, 1.0) < ns_flops_count(m, n, steps, 0, 0u, 1.0);
}

int ns_algorithm_for_shape(int64_t rows, int64_t cols, int compute, const float (*coeffs)[3],
                           int steps)
{
    const int64_t m = rows < cols ? rows : cols, n = rows < cols ? cols : rows;
    return 2 * n >= NS_GRAM_MIN_ASPECT_X2 * m &&
                   ns_algorithm_gram_saves(rows, cols, compute, coeffs, steps)
               ? NS_ALGO_GRAM
               : NS_ALGO_STANDARD;
}

int ns_bf16_variant_for_shape(int64_t rows, int64_t cols, int *block)
{
    const int64_t m = rows < cols ? rows : cols;
    *block = m > NS_BF16_LARGE_M ? 256 : 128;
    return m >= NS_BF16_SYMMETRIC_MIN_M ? NS_VARIANT_SYMMETRIC : NS_VARIANT_PLAIN;
}

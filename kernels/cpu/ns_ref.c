/* Reference Newton-Schulz: the literal iteration with double accumulation, fp32 between steps.
 * O(m^2 n) loops with no blocking: for tests and small shapes, not for speed. */
#include "cpu_kernels.h"
#include "ns_bf16.h"
#include "ns_common.h"

/* the literal iteration, shared with the sharded reference */
static void ref_iter(const struct kernel_ctx *ctx, int64_t m, int64_t n, const float c[3],
                     const float *x, float *y, float *A, float *B)
{
    ref_shard_gram(ctx, x, m, n, A);
    ref_shard_update(ctx, A, c, x, m, n, B, y);
}

int ref_newton_schulz(const struct kernel_ctx *ctx, const struct ns_args *a,
                      const struct ns_workspace *ws)
{
    if (a->compute == KDT_BF16)
        return ns_bf16_run(ctx, a, ws); /* bf16 products exist only as oneDNN's */
    return ns_run_batch(ctx, a, ws, ref_iter);
}

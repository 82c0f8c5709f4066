/* Reference Newton-Schulz: the literal iteration with double accumulation, fp32 between steps.
 * O(m^2 n) loops with no blocking: for tests and small shapes, not for speed. */
#include "cpu_kernels.h"
#include "ns_common.h"

int ref_newton_schulz(const struct kernel_ctx *ctx, const struct ns_args *a,
                      const struct ns_workspace *ws)
{
    int64_t m, n;

    ns_work_shape(a, &m, &n);
    if (m > n || ws->floats < ns_workspace_floats(a->rows, a->cols))
        return -1;

    for (int64_t k = 0; k < a->batch; k++) {
        float *x = ws->buf;
        float *y = x + m * n;
        float *A = y + m * n;
        float *B = A + m * m;

        ns_load_normalized(a, k, x);
        for (int it = 0; it < a->steps; it++) {
            /* the literal iteration, shared with the sharded reference */
            ref_shard_gram(ctx, x, m, n, A);
            ref_shard_update(ctx, A, a->coeffs[it], x, m, n, B, y);
            float *tmp = x;
            x = y;
            y = tmp;
        }
        ns_store_output(a, k, x);
    }
    return 0;
}

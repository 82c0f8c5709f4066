/* Reference Newton-Schulz: the literal iteration with double accumulation, fp32 between steps.
 * O(m^2 n) loops with no blocking: for tests and small shapes, not for speed. */
#include "cpu_kernels.h"
#include "ns_common.h"

int ref_newton_schulz(const struct kernel_ctx *ctx, const struct ns_args *a,
                      const struct ns_workspace *ws)
{
    int64_t m, n;
    (void)ctx;

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
            const double ca = a->coeffs[it][0], cb = a->coeffs[it][1], cc = a->coeffs[it][2];

            for (int64_t i = 0; i < m; i++)
                for (int64_t j = 0; j < m; j++) {
                    double s = 0.0;
                    for (int64_t t = 0; t < n; t++)
                        s += (double)x[i * n + t] * x[j * n + t];
                    A[i * m + j] = (float)s;
                }
            for (int64_t i = 0; i < m; i++)
                for (int64_t j = 0; j < m; j++) {
                    double s = 0.0;
                    for (int64_t t = 0; t < m; t++)
                        s += (double)A[i * m + t] * A[t * m + j];
                    B[i * m + j] = (float)(cb * A[i * m + j] + cc * s);
                }
            for (int64_t i = 0; i < m; i++)
                for (int64_t j = 0; j < n; j++) {
                    double s = 0.0;
                    for (int64_t t = 0; t < m; t++)
                        s += (double)B[i * m + t] * x[t * n + j];
                    y[i * n + j] = (float)(ca * x[i * n + j] + s);
                }
            float *tmp = x;
            x = y;
            y = tmp;
        }
        ns_store_output(a, k, x);
    }
    return 0;
}

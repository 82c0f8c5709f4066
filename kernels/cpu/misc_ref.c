/* Small CPU entry points every CPU table shares: strided copies and the gradient sum of squares. */
#include <string.h>

#include "cpu_kernels.h"

void cpu_copy2d(const struct kernel_ctx *ctx, void *dst, size_t dpitch, const void *src,
                size_t spitch, size_t width, size_t rows)
{
    (void)ctx;
    if (dpitch == width && spitch == width) {
        memcpy(dst, src, width * rows);
        return;
    }
    for (size_t r = 0; r < rows; r++)
        memcpy((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
}

/* Eight independent double accumulators in a fixed order: vectorisable, and the same bits for
 * the same input every time (no threads, no reassociation by the compiler). */
double cpu_sumsq(const struct kernel_ctx *ctx, const void *x, int dt, size_t n)
{
    double acc[8] = {0};
    size_t i = 0;
    (void)ctx;
    if (dt == KDT_F32) {
        const float *p = x;
        for (; i + 8 <= n; i += 8)
            for (int l = 0; l < 8; l++)
                acc[l] += (double)p[i + l] * (double)p[i + l];
        for (; i < n; i++)
            acc[i & 7] += (double)p[i] * (double)p[i];
    } else {
        const uint16_t *p = x;
        for (; i + 8 <= n; i += 8)
            for (int l = 0; l < 8; l++) {
                double v = f32_from_bf16(p[i + l]);
                acc[l] += v * v;
            }
        for (; i < n; i++) {
            double v = f32_from_bf16(p[i]);
            acc[i & 7] += v * v;
        }
    }
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

void cpu_copy(const struct kernel_ctx *ctx, void *dst, const void *src, size_t bytes)
{
    (void)ctx;
    memcpy(dst, src, bytes);
}

void cpu_fill(const struct kernel_ctx *ctx, void *dst, int byte, size_t bytes)
{
    (void)ctx;
    memset(dst, byte, bytes);
}

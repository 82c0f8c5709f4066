/* Storage dtypes and fp32<->bf16 conversion shared by every kernel variant. */
#ifndef KERNELS_DTYPE_H
#define KERNELS_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "hd.h"
#include "shardopt_types.h"

/* The kernels' short names for shardopt_dtype_t / shardopt_rounding_t: the same values by
 * construction (shardopt_types.h needs no MPI). */
enum kdtype { KDT_F32 = SHARDOPT_DTYPE_FP32, KDT_BF16 = SHARDOPT_DTYPE_BF16 };
enum kround {
    KROUND_NEAREST = SHARDOPT_ROUNDING_NEAREST,
    KROUND_STOCHASTIC = SHARDOPT_ROUNDING_STOCHASTIC
};

KHD static inline size_t kdtype_size(int dt) { return dt == KDT_BF16 ? 2 : 4; }

KHD static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

KHD static inline float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

KHD static inline float f32_from_bf16(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }

/* Round to nearest, ties to even. A NaN stays a NaN (quietened, sign kept): plain rounding
 * could carry a NaN payload into the Inf pattern. Values past the largest bf16 become Inf. */
KHD static inline uint16_t bf16_from_f32(float f)
{
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Stochastic rounding with 16 random bits r: rounds away from zero with probability equal to
 * the discarded fraction, so E[result] = f. Inf stays Inf (its low bits are zero). */
KHD static inline uint16_t bf16_from_f32_sr(float f, uint16_t r)
{
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u);
    u += r;
    return (uint16_t)(u >> 16);
}

/* Load element i of a buffer of dtype dt as fp32. */
KHD static inline float kload(const void *p, int dt, size_t i)
{
    return dt == KDT_BF16 ? f32_from_bf16(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

#endif

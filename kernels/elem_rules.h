/* The elementwise update rules of ops.h on fp32 values, written once for both backends: the CPU
 * reference loops over them, and the CUDA kernels call them per element (KHD). Loads and stores
 * stay with the caller (vector loads on the device); these say what is computed and where it
 * is rounded. Every function is exact about its roundings: fmaf is one rounding, and the device
 * code is built with -fmad=false so that no other product is fused. */
#ifndef KERNELS_ELEM_RULES_H
#define KERNELS_ELEM_RULES_H

#include "ops.h"

/* v as it reads back after being stored in dtype dt with the given rounding (r: 16 random bits,
 * used by stochastic rounding into bf16 only). Storing the result again is exact. */
KHD static inline float kround(float v, int dt, int rounding, uint16_t r)
{
    if (dt == KDT_F32)
        return v;
    return f32_from_bf16(rounding == KROUND_STOCHASTIC ? bf16_from_f32_sr(v, r) : bf16_from_f32(v));
}

/* Store v at p[i] in dtype dt, rounding to nearest (exact for a value from kround). */
KHD static inline void kstore_value(void *p, int dt, size_t i, float v)
{
    if (dt == KDT_F32)
        ((float *)p)[i] = v;
    else
        ((uint16_t *)p)[i] = bf16_from_f32(v);
}

/* The gradient as an update uses it: scaled (clipping), and 0 where that is NaN or +-Inf. A step
 * reaches the kernels with such a gradient only under nonfinite = zero (the pre-pass skips or
 * fails it otherwise); for finite values this is the product, bit for bit. g - g is 0 for every
 * finite g and NaN otherwise: the vector variants test the same. */
KHD static inline float rule_grad(float grad, float scale)
{
    const float g = grad * scale;
    return g - g == 0.0f ? g : 0.0f;
}

/* Muon momentum: the stored momentum and U (U still to be rounded into out_dtype). */
KHD static inline void rule_momentum(const struct momentum_args *a, float grad, float mom,
                                     uint16_t r, float *mom_new, float *u)
{
    const float g = rule_grad(grad, a->grad_scale);
    const float m = kround(fmaf(a->mu, mom, g), a->mom_dtype, a->mom_rounding, r);
    *mom_new = m;
    *u = a->nesterov ? fmaf(a->mu, m, g) : m;
}

/* AdamW: the stored moments, and the new parameter as stored. The update uses the stored
 * (rounded) moments, as Muon's U uses the stored momentum. rm, rv, rp: random bits of the
 * exp_avg, exp_avg_sq and param streams. */
KHD static inline float rule_adamw(const struct adamw_args *a, float grad, float *m, float *v,
                                   float w, uint16_t rm, uint16_t rv, uint16_t rp)
{
    const float g = rule_grad(grad, a->grad_scale);
    const float mn =
        kround(fmaf(a->beta1, *m, a->one_minus_beta1 * g), a->m_dtype, a->state_rounding, rm);
    const float vn =
        kround(fmaf(a->beta2, *v, a->one_minus_beta2 * (g * g)), a->v_dtype, a->state_rounding, rv);
    const float denom = fmaf(sqrtf(vn), a->bc2_rsqrt, a->eps);
    *m = mn;
    *v = vn;
    return kround(fmaf(-a->step_size, mn / denom, w * a->decay), a->param_dtype, a->param_rounding,
                  rp);
}

/* Apply: the new parameter as stored. */
KHD static inline float rule_apply(const struct apply_args *a, float update, float w, uint16_t r)
{
    return kround(fmaf(-a->alpha, update, w * a->decay), a->param_dtype, a->param_rounding, r);
}

/* Whether an AdamW element needs random bits (and so its global index). */
KHD static inline int adamw_stochastic(const struct adamw_args *a)
{
    return a->param_rounding == KROUND_STOCHASTIC ||
           (a->state_rounding == KROUND_STOCHASTIC &&
            (a->m_dtype == KDT_BF16 || a->v_dtype == KDT_BF16));
}

#endif

/* Portable elementwise kernels: the oracle for every other variant, written to the exact fp32
 * sequences documented in ops.h. fmaf is a single rounding on every platform, which is what
 * lets the SIMD variants match these bit for bit. */
#include <math.h>

#include "cpu_kernels.h"
#include "round_store.h"

void ref_momentum(const struct kernel_ctx *ctx, const struct momentum_args *a)
{
    const size_t n = a->n;

#pragma omp parallel for schedule(static) num_threads(kthreads(ctx, n))
    for (size_t c0 = 0; c0 < n; c0 += KCHUNK) {
        size_t c1 = c0 + KCHUNK < n ? c0 + KCHUNK : n;
        struct rng_cursor rc;
        rng_cursor_init(&rc, &a->rng);
        for (size_t i = c0; i < c1; i++) {
            float g = kload(a->grad, a->grad_dtype, i) * a->grad_scale;
            float m = fmaf(a->mu, kload(a->mom, a->mom_dtype, i), g);
            uint64_t gi = a->mom_rounding == KROUND_STOCHASTIC ? elem_index_global(&a->idx, i) : 0;
            kstore(a->mom, a->mom_dtype, i, m, a->mom_rounding, &rc, gi);
            float ms = kload(a->mom, a->mom_dtype, i);
            float u = a->nesterov ? fmaf(a->mu, ms, g) : ms;
            kstore(a->out, a->out_dtype, i, u, KROUND_NEAREST, NULL, 0);
        }
    }
}

void ref_adamw(const struct kernel_ctx *ctx, const struct adamw_args *a)
{
    const size_t n = a->n;

#pragma omp parallel for schedule(static) num_threads(kthreads(ctx, n))
    for (size_t c0 = 0; c0 < n; c0 += KCHUNK) {
        size_t c1 = c0 + KCHUNK < n ? c0 + KCHUNK : n;
        struct rng_cursor rc, rm, rv;
        rng_cursor_init(&rc, &a->rng);
        rng_cursor_init(&rm, &a->rng_m);
        rng_cursor_init(&rv, &a->rng_v);
        for (size_t i = c0; i < c1; i++) {
            const int sr = a->param_rounding == KROUND_STOCHASTIC ||
                           (a->state_rounding == KROUND_STOCHASTIC &&
                            (a->m_dtype == KDT_BF16 || a->v_dtype == KDT_BF16));
            const uint64_t gi = sr ? elem_index_global(&a->idx, i) : 0;
            float g = kload(a->grad, a->grad_dtype, i) * a->grad_scale;
            float m = fmaf(a->beta1, kload(a->exp_avg, a->m_dtype, i), a->one_minus_beta1 * g);
            float v =
                fmaf(a->beta2, kload(a->exp_avg_sq, a->v_dtype, i), a->one_minus_beta2 * (g * g));
            /* moments are rounded once into their dtype and the update uses the stored values,
             * as Muon's U uses the stored momentum (no-ops for fp32 moments) */
            kstore(a->exp_avg, a->m_dtype, i, m, a->state_rounding, &rm, gi);
            kstore(a->exp_avg_sq, a->v_dtype, i, v, a->state_rounding, &rv, gi);
            m = kload(a->exp_avg, a->m_dtype, i);
            v = kload(a->exp_avg_sq, a->v_dtype, i);
            float denom = fmaf(sqrtf(v), a->bc2_rsqrt, a->eps);
            float w = kload(a->param, a->param_dtype, i) * a->decay;
            w = fmaf(-a->step_size, m / denom, w);
            kstore(a->param, a->param_dtype, i, w, a->param_rounding, &rc, gi);
        }
    }
}

void ref_apply(const struct kernel_ctx *ctx, const struct apply_args *a)
{
    const size_t n = a->n;

#pragma omp parallel for schedule(static) num_threads(kthreads(ctx, n))
    for (size_t c0 = 0; c0 < n; c0 += KCHUNK) {
        size_t c1 = c0 + KCHUNK < n ? c0 + KCHUNK : n;
        struct rng_cursor rc;
        rng_cursor_init(&rc, &a->rng);
        for (size_t i = c0; i < c1; i++) {
            float o = kload(a->update, a->update_dtype, i);
            float w = fmaf(-a->alpha, o, kload(a->param, a->param_dtype, i) * a->decay);
            uint64_t gi =
                a->param_rounding == KROUND_STOCHASTIC ? elem_index_global(&a->idx, i) : 0;
            kstore(a->param, a->param_dtype, i, w, a->param_rounding, &rc, gi);
        }
    }
}

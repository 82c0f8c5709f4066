/* Portable elementwise kernels: the oracle for every other variant, the rules of
 * kernels/elem_rules.h applied element by element. fmaf is a single rounding on every platform,
 * which is what lets the SIMD and CUDA variants match these bit for bit. */
#include <math.h>

#include "../elem_rules.h"
#include "cpu_kernels.h"
#include "elem_split.h"

void ref_momentum(const struct kernel_ctx *ctx, const struct momentum_args *a)
{
    const size_t n = a->n;
    const int sr = a->mom_rounding == KROUND_STOCHASTIC;

#pragma omp parallel for schedule(static) num_threads(kthreads(ctx, n))
    for (size_t c0 = 0; c0 < n; c0 += KCHUNK) {
        size_t c1 = c0 + KCHUNK < n ? c0 + KCHUNK : n;
        struct rng_cursor rc;
        rng_cursor_init(&rc, &a->rng);
        for (size_t i = c0; i < c1; i++) {
            const uint16_t r = sr ? rng_cursor_bits(&rc, elem_index_global(&a->idx, i)) : 0;
            float m, u;
            rule_momentum(a, kload(a->grad, a->grad_dtype, i), kload(a->mom, a->mom_dtype, i), r,
                          &m, &u);
            kstore_value(a->mom, a->mom_dtype, i, m);
            kstore_value(a->out, a->out_dtype, i, u);
        }
    }
}

void ref_adamw(const struct kernel_ctx *ctx, const struct adamw_args *a)
{
    const size_t n = a->n;
    const int sr = adamw_stochastic(a);

#pragma omp parallel for schedule(static) num_threads(kthreads(ctx, n))
    for (size_t c0 = 0; c0 < n; c0 += KCHUNK) {
        size_t c1 = c0 + KCHUNK < n ? c0 + KCHUNK : n;
        struct rng_cursor rc, rm, rv;
        rng_cursor_init(&rc, &a->rng);
        rng_cursor_init(&rm, &a->rng_m);
        rng_cursor_init(&rv, &a->rng_v);
        for (size_t i = c0; i < c1; i++) {
            uint16_t bp = 0, bm = 0, bv = 0;
            if (sr) {
                const uint64_t gi = elem_index_global(&a->idx, i);
                bp = rng_cursor_bits(&rc, gi);
                bm = rng_cursor_bits(&rm, gi);
                bv = rng_cursor_bits(&rv, gi);
            }
            float m = kload(a->exp_avg, a->m_dtype, i), v = kload(a->exp_avg_sq, a->v_dtype, i);
            const float w = rule_adamw(a, kload(a->grad, a->grad_dtype, i), &m, &v,
                                       kload(a->param, a->param_dtype, i), bm, bv, bp);
            kstore_value(a->exp_avg, a->m_dtype, i, m);
            kstore_value(a->exp_avg_sq, a->v_dtype, i, v);
            kstore_value(a->param, a->param_dtype, i, w);
        }
    }
}

void ref_apply(const struct kernel_ctx *ctx, const struct apply_args *a)
{
    const size_t n = a->n;
    const int sr = a->param_rounding == KROUND_STOCHASTIC;

#pragma omp parallel for schedule(static) num_threads(kthreads(ctx, n))
    for (size_t c0 = 0; c0 < n; c0 += KCHUNK) {
        size_t c1 = c0 + KCHUNK < n ? c0 + KCHUNK : n;
        struct rng_cursor rc;
        rng_cursor_init(&rc, &a->rng);
        for (size_t i = c0; i < c1; i++) {
            const uint16_t r = sr ? rng_cursor_bits(&rc, elem_index_global(&a->idx, i)) : 0;
            const float w = rule_apply(a, kload(a->update, a->update_dtype, i),
                                       kload(a->param, a->param_dtype, i), r);
            kstore_value(a->param, a->param_dtype, i, w);
        }
    }
}

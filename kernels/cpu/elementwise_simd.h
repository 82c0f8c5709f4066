/* The loop framework of the vector elementwise kernels (momentum + pack, AdamW, apply): the fp32
 * sequences of ops.h over vectors of VLEN lanes, bit-identical to elementwise_ref.c, written once
 * over a small set of vector primitives. Each ISA file (elementwise_avx2.c, elementwise_avx512.c)
 * defines its primitives, includes this header, and wraps the three simd_ entry points in its
 * public names; each is compiled with its own target flags, so the same text becomes AVX2 code in
 * one and AVX-512 code in the other.
 *
 * Why the results agree with the reference: mul, div, sqrt and fma are correctly rounded in both,
 * fusing happens exactly where ops.h says (the build passes -ffp-contract=off), bf16 rounding is
 * done with integer ops (VCVTNEPS2BF16 flushes denormal inputs to zero, bf16_from_f32 does not),
 * and stochastic rounding takes its bits from the reference's Philox stream. A vector whose values
 * hold a NaN goes to the reference before anything is stored (see ref_piece), so the vector
 * rounding never sees a NaN. The loops are specialised on the dtypes (a table of instantiations
 * per kernel), so the nearest-rounding paths carry no per-vector dtype branches.
 *
 * What the ISA file defines before including this header:
 *   AI                 static inline, always inlined (the dtype and mask tests fold away)
 *   VLEN               lanes of a vf: the loops' step, a divisor of SR_BLOCK and KCHUNK
 *   vf                 VLEN fp32 lanes (AVX2: two registers)
 *   vk, VK_FULL        which lanes a load or store touches; VK_FULL all of them
 *   SIMD_MASKED_TAIL   1: vk_tail(k) is the first k lanes, and the last n % VLEN elements of a
 *                      span run as one masked vector; 0: vk is only ever VK_FULL, and those
 *                      elements go to the reference
 *   vnan_t             a set of lanes found NaN
 *   vf   vset1(float)  every lane x
 *   vf   vmul(a, b), vdiv(a, b), vsqrt(a), vfma(a, b, c) = a * b + c, one rounding
 *   vf   vload(p, dt, i, k)           elements [i, i + VLEN) of p, dtype dt, widened to fp32
 *   void vstore(p, dt, i, v, k)       v, already exact in dt (vround's result), stored as dt
 *   vf   vround_rne(v), vround_sr(v, bits)
 *                                     bf16_from_f32 / bf16_from_f32_sr of non-NaN lanes, widened
 *                                     back to fp32; bits: VLEN uint16_t, one per lane
 *   vf   vfinite_or_zero(v)           v, 0 in the lanes where v is not finite
 *   vnan_t vnan_lanes(k, a, b), vnan_or(x, y); int vnan_any(x)
 *                                     lanes of k where a or b is NaN; union; nonempty
 *   void rng_bits_contiguous(s, g, count, out)
 *                                     the random bits of global indices [g, g + count), as
 *                                     rng_cursor_bits gives them, vectorised
 */
#ifndef KERNELS_CPU_ELEMENTWISE_SIMD_H
#define KERNELS_CPU_ELEMENTWISE_SIMD_H

#include "cpu_kernels.h"
#include "elem_split.h"

#if !defined(AI) || !defined(VLEN) || !defined(VK_FULL) || !defined(SIMD_MASKED_TAIL)
#error "elementwise_simd.h: define the ISA's primitives first (see the top of this file)"
#endif

/* Stochastic-rounding bits are drawn this many elements at a time ahead of the vector loop, which
 * then makes no calls and keeps its constants in registers. */
#define SR_BLOCK 1024
_Static_assert(SR_BLOCK % VLEN == 0 && KCHUNK % VLEN == 0, "blocks and chunks are whole vectors");

/* v as dtype dt holds it (bf16: stochastically with the lanes' bits when bits is given). */
AI vf vround(int dt, vf v, const uint16_t *bits)
{
    if (dt == KDT_F32)
        return v;
    return bits != NULL ? vround_sr(v, bits) : vround_rne(v);
}

/* rule_grad: grad * scale, 0 where that is not finite */
AI vf vgrad(vf grad, vf scale) { return vfinite_or_zero(vmul(grad, scale)); }

/* ---- random bits for stochastic rounding ---- */

/* Walks the global index of consecutive local elements without a division per element. */
struct sr_source {
    struct rng_cursor rc;
    const struct rng_stream *rng;
    const struct elem_index_map *map;
    uint64_t q, r; /* the next local index is q * run + r */
};

static void sr_source_init(struct sr_source *s, const struct rng_stream *rng,
                           const struct elem_index_map *map, size_t i)
{
    rng_cursor_init(&s->rc, rng);
    s->rng = rng;
    s->map = map;
    s->q = i / map->run;
    s->r = i % map->run;
}

/* The bits of the next `count` (<= SR_BLOCK) local elements, a run piece at a time: long pieces
 * through the vector Philox, short ones (narrow shards) through the scalar cursor. The rest of
 * the last vector is zeroed so that a masked tail vector reads defined values. */
static void sr_source_fill(struct sr_source *s, uint16_t *bits, size_t count)
{
    for (size_t k = 0; k < count;) {
        uint64_t left = s->map->run - s->r;
        size_t len = left < count - k ? (size_t)left : count - k;
        uint64_t g = s->map->base + s->q * s->map->stride + s->r;
        if (len >= 64) {
            rng_bits_contiguous(s->rng, g, len, bits + k);
        } else {
            for (size_t j = 0; j < len; j++)
                bits[k + j] = rng_cursor_bits(&s->rc, g + j);
        }
        k += len;
        s->r += len;
        if (s->r == s->map->run) {
            s->r = 0;
            s->q++;
        }
    }
    for (size_t k = count; k % VLEN != 0; k++)
        bits[k] = 0;
}

/* ---- the reference for what the vector loop leaves ----
 * Which payload an operation passes on when two NaNs meet depends on the instruction form the
 * compiler picked (vfmadd132 vs 213 vs 231, the operand order of a mul), not on the math, so a
 * vector whose values hold a NaN is handed to the reference before anything is stored: its bits
 * then agree by construction. Such vectors are rare (an optimizer step with a non-finite grad is
 * skipped). The reference sees a piece at a time, split where the global index jumps so that
 * each piece's stochastic bits come from a plain index map. */
struct ref_piece {
    size_t i, n;
    struct elem_index_map idx;
};

static size_t ref_piece_next(struct ref_piece *pc, const struct elem_index_map *map, int stochastic,
                             size_t i, size_t end)
{
    pc->i = i;
    pc->n = end - i;
    pc->idx = *map;
    if (stochastic) {
        size_t left = map->run - i % map->run;
        pc->n = pc->n < left ? pc->n : left;
        pc->idx = (struct elem_index_map){elem_index_global(map, i), UINT64_MAX, 0};
    }
    return i + pc->n;
}

static const void *elem_ptr(const void *p, int dt, size_t i)
{
    return (const char *)p + i * kdtype_size(dt);
}

static const struct kernel_ctx one_thread = {.threads = 1};

/* ---- the loop ----
 * The loops read their pointers and scalars from locals (a kernel's _vars) rather than through
 * the args pointer: vector stores may alias anything, so fields read through a pointer would be
 * reloaded (and scalars re-broadcast) on every iteration. A kernel's _span runs vectors over
 * [i, end) and returns the start of the first one it did not store: one whose values hold a NaN,
 * or (without masked tails) the last n % VLEN elements. SIMD_RUN hands that vector to the
 * reference and goes on: the hot loop itself makes no call. */

#if SIMD_MASKED_TAIL
#define SIMD_SPAN_TAIL(vec_call)                                                                   \
    if (i < end && (vec_call))                                                                     \
        return i;                                                                                  \
    return end;
#else
#define SIMD_SPAN_TAIL(vec_call) return i;
#endif

/* The body of every K##_span(c, i, end, dtype arguments..., bits): K##_vec over the whole vectors
 * of [i, end), then the tail. */
#define SIMD_SPAN(K, ...)                                                                          \
    for (; i + VLEN <= end; i += VLEN, bits = bits != NULL ? bits + VLEN : NULL)                   \
        if (K##_vec(c, i, VK_FULL, __VA_ARGS__, bits))                                             \
            return i;                                                                              \
    SIMD_SPAN_TAIL(K##_vec(c, i, vk_tail(end - i), __VA_ARGS__, bits))

/* Runs [from, to) through K##_span (vars c, dtype arguments ARGS, stochastic bits BITS, an
 * expression of i_) and each vector the span leaves through K##_ref. */
#define SIMD_PIECES(K, a, c, from, to, BITS, ...)                                                  \
    for (size_t i_ = (from); i_ < (to);) {                                                         \
        i_ = K##_span(c, i_, to, __VA_ARGS__, BITS);                                               \
        if (i_ < (to)) {                                                                           \
            const size_t e_ = i_ + VLEN < (to) ? i_ + VLEN : (to);                                 \
            K##_ref(a, i_, e_);                                                                    \
            i_ = e_;                                                                               \
        }                                                                                          \
    }

/* The block driver of every kernel: runs [c0, c1) with vars c. With stochastic rounding, the bits
 * of SR_BLOCK elements at a time are drawn first and the span reads them in step with its
 * elements; without, the span is instantiated with bits NULL, which folds its rounding to
 * nearest. */
#define SIMD_RUN(K, a, c, c0, c1, stochastic, ...)                                                 \
    do {                                                                                           \
        if (stochastic) {                                                                          \
            struct sr_source src_;                                                                 \
            uint16_t bits_[SR_BLOCK];                                                              \
            sr_source_init(&src_, &(a)->rng, &(a)->idx, c0);                                       \
            for (size_t b0_ = c0; b0_ < c1; b0_ += SR_BLOCK) {                                     \
                const size_t b1_ = b0_ + SR_BLOCK < c1 ? b0_ + SR_BLOCK : c1;                      \
                sr_source_fill(&src_, bits_, b1_ - b0_);                                           \
                SIMD_PIECES(K, a, c, b0_, b1_, bits_ + (i_ - b0_), __VA_ARGS__)                    \
            }                                                                                      \
        } else {                                                                                   \
            SIMD_PIECES(K, a, c, c0, c1, NULL, __VA_ARGS__)                                        \
        }                                                                                          \
    } while (0)

/* ---- Muon momentum + pack ---- */

struct momentum_vars {
    const void *grad;
    void *mom, *out;
    vf mu, scale;
};

static void momentum_ref(const struct momentum_args *a, size_t i, size_t end)
{
    int stochastic = a->mom_dtype == KDT_BF16 && a->mom_rounding == KROUND_STOCHASTIC;
    struct ref_piece pc;
    while (i < end) {
        i = ref_piece_next(&pc, &a->idx, stochastic, i, end);
        struct momentum_args s = *a;
        s.n = pc.n;
        s.grad = elem_ptr(a->grad, a->grad_dtype, pc.i);
        s.mom = (void *)elem_ptr(a->mom, a->mom_dtype, pc.i);
        s.out = (void *)elem_ptr(a->out, a->out_dtype, pc.i);
        s.idx = pc.idx;
        ref_momentum(&one_thread, &s);
    }
}

/* One vector; returns nonzero, having stored nothing, when its values hold a NaN. */
AI int momentum_vec(struct momentum_vars c, size_t i, vk k, int gdt, int mdt, int odt, int nesterov,
                    const uint16_t *bits)
{
    vf g = vgrad(vload(c.grad, gdt, i, k), c.scale);
    vf m = vfma(c.mu, vload(c.mom, mdt, i, k), g);
    vf ms = vround(mdt, m, bits);
    vf u = nesterov ? vfma(c.mu, ms, g) : ms;
    if (__builtin_expect(vnan_any(vnan_lanes(k, m, u)), 0))
        return 1;
    vstore(c.mom, mdt, i, ms, k);
    /* a stored bf16 momentum is already exact in a bf16 pack */
    vstore(c.out, odt, i, !nesterov && mdt == odt ? ms : vround(odt, u, NULL), k);
    return 0;
}

AI size_t momentum_span(struct momentum_vars c, size_t i, size_t end, int gdt, int mdt, int odt,
                        int nesterov,
                        const uint16_t *bits){SIMD_SPAN(momentum, gdt, mdt, odt, nesterov)}

AI void momentum_run(const struct momentum_args *a, size_t c0, size_t c1, int gdt, int mdt, int odt,
                     int nesterov)
{
    const struct momentum_vars c = {a->grad, a->mom, a->out, vset1(a->mu), vset1(a->grad_scale)};
    SIMD_RUN(momentum, a, c, c0, c1, mdt == KDT_BF16 && a->mom_rounding == KROUND_STOCHASTIC, gdt,
             mdt, odt, nesterov);
}

typedef void (*momentum_fn)(const struct momentum_args *, size_t, size_t);

#define MOMENTUM_FN(g, m, o, nes)                                                                  \
    static void momentum_##g##m##o##nes(const struct momentum_args *a, size_t c0, size_t c1)       \
    {                                                                                              \
        momentum_run(a, c0, c1, g, m, o, nes);                                                     \
    }
#define MOMENTUM_FNS(g, m)                                                                         \
    MOMENTUM_FN(g, m, 0, 0) MOMENTUM_FN(g, m, 0, 1) MOMENTUM_FN(g, m, 1, 0) MOMENTUM_FN(g, m, 1, 1)
MOMENTUM_FNS(0, 0)
MOMENTUM_FNS(0, 1)
MOMENTUM_FNS(1, 0)
MOMENTUM_FNS(1, 1)

/* Indexed by grad, mom, out dtype and nesterov, one bit each (KDT_F32 = 0, KDT_BF16 = 1). */
static const momentum_fn momentum_fns[16] = {
    momentum_0000, momentum_0001, momentum_0010, momentum_0011, momentum_0100, momentum_0101,
    momentum_0110, momentum_0111, momentum_1000, momentum_1001, momentum_1010, momentum_1011,
    momentum_1100, momentum_1101, momentum_1110, momentum_1111,
};

static void simd_momentum(const struct kernel_ctx *ctx, const struct momentum_args *a)
{
    const momentum_fn fn =
        momentum_fns[(a->grad_dtype == KDT_BF16) << 3 | (a->mom_dtype == KDT_BF16) << 2 |
                     (a->out_dtype == KDT_BF16) << 1 | (a->nesterov != 0)];
    const size_t n = a->n;
#pragma omp parallel for schedule(static) num_threads(kthreads(ctx, n))
    for (size_t c0 = 0; c0 < n; c0 += KCHUNK)
        fn(a, c0, c0 + KCHUNK < n ? c0 + KCHUNK : n);
}

/* ---- AdamW ---- */

struct adamw_vars {
    void *param;
    const void *grad;
    float *m, *v;
    vf scale, b1, b2, omb1, omb2, eps, neg_step, bc2_rsqrt, decay;
};

static void adamw_ref(const struct adamw_args *a, size_t i, size_t end)
{
    int stochastic = a->param_dtype == KDT_BF16 && a->param_rounding == KROUND_STOCHASTIC;
    struct ref_piece pc;
    while (i < end) {
        i = ref_piece_next(&pc, &a->idx, stochastic, i, end);
        struct adamw_args s = *a;
        s.n = pc.n;
        s.param = (void *)elem_ptr(a->param, a->param_dtype, pc.i);
        s.grad = elem_ptr(a->grad, a->grad_dtype, pc.i);
        s.exp_avg = (float *)a->exp_avg + pc.i;
        s.exp_avg_sq = (float *)a->exp_avg_sq + pc.i;
        s.idx = pc.idx;
        ref_adamw(&one_thread, &s);
    }
}

AI int adamw_vec(struct adamw_vars c, size_t i, vk k, int pdt, int gdt, const uint16_t *bits)
{
    vf g = vgrad(vload(c.grad, gdt, i, k), c.scale);
    vf m = vfma(c.b1, vload(c.m, KDT_F32, i, k), vmul(c.omb1, g));
    vf v = vfma(c.b2, vload(c.v, KDT_F32, i, k), vmul(c.omb2, vmul(g, g)));
    vf denom = vfma(vsqrt(v), c.bc2_rsqrt, c.eps);
    vf w = vmul(vload(c.param, pdt, i, k), c.decay);
    w = vfma(c.neg_step, vdiv(m, denom), w);
    if (__builtin_expect(vnan_any(vnan_or(vnan_lanes(k, m, v), vnan_lanes(k, w, w))), 0))
        return 1;
    vstore(c.m, KDT_F32, i, m, k);
    vstore(c.v, KDT_F32, i, v, k);
    vstore(c.param, pdt, i, vround(pdt, w, bits), k);
    return 0;
}

AI size_t adamw_span(struct adamw_vars c, size_t i, size_t end, int pdt, int gdt,
                     const uint16_t *bits){SIMD_SPAN(adamw, pdt, gdt)}

AI void adamw_run(const struct adamw_args *a, size_t c0, size_t c1, int pdt, int gdt)
{
    const struct adamw_vars c = {
        a->param,
        a->grad,
        a->exp_avg,
        a->exp_avg_sq,
        vset1(a->grad_scale),
        vset1(a->beta1),
        vset1(a->beta2),
        vset1(a->one_minus_beta1),
        vset1(a->one_minus_beta2),
        vset1(a->eps),
        vset1(-a->step_size),
        vset1(a->bc2_rsqrt),
        vset1(a->decay),
    };
    SIMD_RUN(adamw, a, c, c0, c1, pdt == KDT_BF16 && a->param_rounding == KROUND_STOCHASTIC, pdt,
             gdt);
}

typedef void (*adamw_fn)(const struct adamw_args *, size_t, size_t);

#define ADAMW_FN(p, g)                                                                             \
    static void adamw_##p##g(const struct adamw_args *a, size_t c0, size_t c1)                     \
    {                                                                                              \
        adamw_run(a, c0, c1, p, g);                                                                \
    }
ADAMW_FN(0, 0)
ADAMW_FN(0, 1)
ADAMW_FN(1, 0)
ADAMW_FN(1, 1)

/* Indexed by param and grad dtype. */
static const adamw_fn adamw_fns[4] = {adamw_00, adamw_01, adamw_10, adamw_11};

static void simd_adamw(const struct kernel_ctx *ctx, const struct adamw_args *a)
{
    /* bf16 moments take the reference path (the same bits by definition); the vector code
     * covers the fp32 moments everyone starts with */
    if (a->m_dtype != KDT_F32 || a->v_dtype != KDT_F32) {
        ref_adamw(ctx, a);
        return;
    }
    const adamw_fn fn = adamw_fns[(a->param_dtype == KDT_BF16) << 1 | (a->grad_dtype == KDT_BF16)];
    const size_t n = a->n;
#pragma omp parallel for schedule(static) num_threads(kthreads(ctx, n))
    for (size_t c0 = 0; c0 < n; c0 += KCHUNK)
        fn(a, c0, c0 + KCHUNK < n ? c0 + KCHUNK : n);
}

/* ---- apply ---- */

struct apply_vars {
    void *param;
    const void *update;
    vf neg_alpha, decay;
};

static void apply_ref(const struct apply_args *a, size_t i, size_t end)
{
    int stochastic = a->param_dtype == KDT_BF16 && a->param_rounding == KROUND_STOCHASTIC;
    struct ref_piece pc;
    while (i < end) {
        i = ref_piece_next(&pc, &a->idx, stochastic, i, end);
        struct apply_args s = *a;
        s.n = pc.n;
        s.param = (void *)elem_ptr(a->param, a->param_dtype, pc.i);
        s.update = elem_ptr(a->update, a->update_dtype, pc.i);
        s.idx = pc.idx;
        ref_apply(&one_thread, &s);
    }
}

AI int apply_vec(struct apply_vars c, size_t i, vk k, int pdt, int udt, const uint16_t *bits)
{
    vf o = vload(c.update, udt, i, k);
    vf w = vmul(vload(c.param, pdt, i, k), c.decay);
    w = vfma(c.neg_alpha, o, w);
    if (__builtin_expect(vnan_any(vnan_lanes(k, w, w)), 0))
        return 1;
    vstore(c.param, pdt, i, vround(pdt, w, bits), k);
    return 0;
}

AI size_t apply_span(struct apply_vars c, size_t i, size_t end, int pdt, int udt,
                     const uint16_t *bits){SIMD_SPAN(apply, pdt, udt)}

AI void apply_run(const struct apply_args *a, size_t c0, size_t c1, int pdt, int udt)
{
    const struct apply_vars c = {a->param, a->update, vset1(-a->alpha), vset1(a->decay)};
    SIMD_RUN(apply, a, c, c0, c1, pdt == KDT_BF16 && a->param_rounding == KROUND_STOCHASTIC, pdt,
             udt);
}

typedef void (*apply_fn)(const struct apply_args *, size_t, size_t);

#define APPLY_FN(p, u)                                                                             \
    static void apply_##p##u(const struct apply_args *a, size_t c0, size_t c1)                     \
    {                                                                                              \
        apply_run(a, c0, c1, p, u);                                                                \
    }
APPLY_FN(0, 0)
APPLY_FN(0, 1)
APPLY_FN(1, 0)
APPLY_FN(1, 1)

/* Indexed by param and update dtype. */
static const apply_fn apply_fns[4] = {apply_00, apply_01, apply_10, apply_11};

static void simd_apply(const struct kernel_ctx *ctx, const struct apply_args *a)
{
    const apply_fn fn =
        apply_fns[(a->param_dtype == KDT_BF16) << 1 | (a->update_dtype == KDT_BF16)];
    const size_t n = a->n;
#pragma omp parallel for schedule(static) num_threads(kthreads(ctx, n))
    for (size_t c0 = 0; c0 < n; c0 += KCHUNK)
        fn(a, c0, c0 + KCHUNK < n ? c0 + KCHUNK : n);
}

#endif

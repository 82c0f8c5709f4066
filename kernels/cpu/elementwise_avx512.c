/* AVX-512 elementwise kernels: the fp32 sequences of ops.h, 16 lanes at a time, bit-identical to
 * elementwise_ref.c. mul, div, sqrt and fma are correctly rounded in both, so the only care
 * needed is to fuse exactly where ops.h says and to round to bf16 with integer ops:
 * VCVTNEPS2BF16 flushes denormal inputs to zero, bf16_from_f32 does not.
 *
 * The loops are specialised on the dtypes (a table of instantiations per kernel) so the nearest
 * rounding paths carry no per-vector dtype branches. Stochastic rounding takes its bits from the
 * same Philox stream as the reference, 16 counters at a time. A vector whose values hold a NaN
 * is handed to the reference (see ref_piece), so the vector rounding never sees a NaN and needs
 * no NaN branch. */
#include <immintrin.h>
#include <string.h>

#include "cpu_kernels.h"
#include "elem_split.h"

#define VLEN 16
#define FULL ((__mmask16)0xffff)

/* Every helper is inlined into the specialised loops, where dtype and mask tests fold away. */
#define AI static inline __attribute__((always_inline))

static __mmask16 tail_mask(size_t k) { return (__mmask16)((1u << k) - 1u); }

AI __m512 vload(const void *p, int dt, size_t i, __mmask16 k)
{
    if (dt == KDT_BF16) {
        const uint16_t *h = (const uint16_t *)p + i;
        __m256i x =
            k == FULL ? _mm256_loadu_si256((const __m256i *)h) : _mm256_maskz_loadu_epi16(k, h);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(x), 16));
    }
    const float *f = (const float *)p + i;
    return k == FULL ? _mm512_loadu_ps(f) : _mm512_maskz_loadu_ps(k, f);
}

/* bf16_from_f32 (ties to even) for lanes that are not NaN, widened back to fp32: the value a
 * reload of the stored bf16 would see. */
AI __m512 round_rne(__m512 v)
{
    __m512i u = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
    return _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32((int)0xffff0000u)));
}

/* bf16_from_f32_sr for lanes that are not NaN; `bits` holds 16 random bits per lane. */
AI __m512 round_sr(__m512 v, __m512i bits)
{
    __m512i r = _mm512_add_epi32(_mm512_castps_si512(v), bits);
    return _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32((int)0xffff0000u)));
}

/* v as dtype dt holds it (bf16: stochastically when `bits` is given). */
AI __m512 vround(int dt, __m512 v, const __m512i *bits)
{
    if (dt == KDT_F32)
        return v;
    return bits != NULL ? round_sr(v, *bits) : round_rne(v);
}

/* Stores v, already exact in dtype dt (the result of vround). */
AI void vstore(void *p, int dt, size_t i, __m512 v, __mmask16 k)
{
    if (dt == KDT_F32) {
        float *d = (float *)p + i;
        if (k == FULL)
            _mm512_storeu_ps(d, v);
        else
            _mm512_mask_storeu_ps(d, k, v);
        return;
    }
    uint16_t *d = (uint16_t *)p + i;
    __m256i h = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(v), 16));
    if (k == FULL)
        _mm256_storeu_si256((__m256i *)d, h);
    else
        _mm256_mask_storeu_epi16(d, k, h);
}

/* Lanes of k where a or b is NaN. */
AI __mmask16 nan_lanes(__mmask16 k, __m512 a, __m512 b)
{
    return _mm512_mask_cmp_ps_mask(k, a, b, _CMP_UNORD_Q);
}

/* rule_grad: grad * scale, 0 where that is not finite (g - g is 0 exactly for finite g) */
AI __m512 vgrad(__m512 grad, __m512 scale)
{
    const __m512 g = _mm512_mul_ps(grad, scale);
    return _mm512_maskz_mov_ps(
        _mm512_cmp_ps_mask(_mm512_sub_ps(g, g), _mm512_setzero_ps(), _CMP_EQ_OQ), g);
}

/* ---- random bits for stochastic rounding ----
 * Philox4x32-10 as in kernels/rng.c, 16 counters (16 groups of 8 global indices) per call, one
 * per 32-bit lane. Drawn a block at a time ahead of the vector loop, which then makes no calls
 * and keeps its constants in registers. */
#define SR_BLOCK 1024

/* High and low 32 bits of m * x per lane. */
AI void mul32_wide(__m512i m, __m512i x, __m512i *hi, __m512i *lo)
{
    __m512i even = _mm512_mul_epu32(x, m);                       /* lanes 0, 2, ... as 64 bit */
    __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(x, 32), m); /* lanes 1, 3, ... */
    *hi = _mm512_mask_blend_epi32((__mmask16)0xaaaa, _mm512_srli_epi64(even, 32), odd);
    *lo = _mm512_mullo_epi32(x, m);
}

/* The 128 bits of each of the 16 groups [group, group + 16), in group order: word j of group l
 * at out[4 * l + j], exactly what rng_bits16x8 splits into 8 x 16 bits. */
static void philox_groups16(const struct rng_stream *s, uint64_t group, uint32_t out[64])
{
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512i m0 = _mm512_set1_epi32((int)0xD2511F53u),
                  m1 = _mm512_set1_epi32((int)0xCD9E8D57u);
    __m512i base = _mm512_set1_epi32((int)(uint32_t)group);
    __m512i c0 = _mm512_add_epi32(base, lane);
    /* the counter is 64-bit: lanes whose low word wrapped carry into the high one */
    __mmask16 carry = _mm512_cmplt_epu32_mask(c0, base);
    __m512i c1 = _mm512_mask_add_epi32(_mm512_set1_epi32((int)(uint32_t)(group >> 32)), carry,
                                       _mm512_set1_epi32((int)(uint32_t)(group >> 32)),
                                       _mm512_set1_epi32(1));
    __m512i c2 = _mm512_set1_epi32((int)s->step_lo), c3 = _mm512_set1_epi32((int)s->kind_hi);
    uint32_t k0 = s->key[0], k1 = s->key[1];

    for (int round = 0; round < 10; round++) {
        __m512i hi0, lo0, hi1, lo1;
        mul32_wide(m0, c0, &hi0, &lo0);
        mul32_wide(m1, c2, &hi1, &lo1);
        c0 = _mm512_xor_si512(_mm512_xor_si512(hi1, c1), _mm512_set1_epi32((int)k0));
        c2 = _mm512_xor_si512(_mm512_xor_si512(hi0, c3), _mm512_set1_epi32((int)k1));
        c1 = lo1;
        c3 = lo0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    uint32_t w[4][16];
    _mm512_storeu_si512(w[0], c0);
    _mm512_storeu_si512(w[1], c1);
    _mm512_storeu_si512(w[2], c2);
    _mm512_storeu_si512(w[3], c3);
    for (int l = 0; l < 16; l++)
        for (int j = 0; j < 4; j++)
            out[4 * l + j] = w[j][l];
}

/* The bits of `count` consecutive global indices from g (one run of a shard). */
static void rng_bits_contiguous(const struct rng_stream *s, uint64_t g, size_t count, uint16_t *out)
{
    uint32_t words[64];
    uint16_t bits[128];
    for (uint64_t grp = g >> 3; grp <= (g + count - 1) >> 3; grp += 16) {
        philox_groups16(s, grp, words);
        memcpy(bits, words, sizeof bits); /* little endian: low half first, as rng_bits16x8 */
        uint64_t lo = grp * 8 > g ? grp * 8 : g;
        uint64_t hi = grp * 8 + 128 < g + count ? grp * 8 + 128 : g + count;
        memcpy(out + (lo - g), bits + (lo - grp * 8), (size_t)(hi - lo) * sizeof *out);
    }
}

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
 * the last vector is zeroed so that a tail vector reads defined values. */
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

AI __m512i sr_bits(const uint16_t *bits, size_t off)
{
    return _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(bits + off)));
}

/* Which payload an operation passes on when two NaNs meet depends on the instruction form the
 * compiler picked (vfmadd132 vs 213 vs 231, the operand order of a mul), not on the math, so a
 * vector whose values hold a NaN is handed to the reference before anything is stored: its bits
 * then agree by construction. Such vectors are rare (a step with a non-finite grad is skipped).
 * The reference sees a piece at a time, split where the global index jumps so that each piece's
 * stochastic bits come from a plain index map. */
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

/* The loops read their pointers and scalars from locals rather than through the args pointer:
 * vector stores may alias anything, so fields read through a pointer would be reloaded (and
 * scalars re-broadcast) on every iteration. A span function runs vectors over [i, end), tail
 * included, and returns `end`, or the start of a vector holding a NaN, which it leaves unstored
 * for the caller to hand to the reference: the hot loop itself makes no call. */

/* ---- Muon momentum + pack ---- */

struct momentum_vars {
    const void *grad;
    void *mom, *out;
    __m512 mu, scale;
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
AI int momentum_vec(struct momentum_vars c, size_t i, __mmask16 k, int gdt, int mdt, int odt,
                    int nesterov, const uint16_t *bits)
{
    __m512 g = vgrad(vload(c.grad, gdt, i, k), c.scale);
    __m512 m = _mm512_fmadd_ps(c.mu, vload(c.mom, mdt, i, k), g);
    __m512i r = bits != NULL ? sr_bits(bits, 0) : _mm512_setzero_si512();
    __m512 ms = vround(mdt, m, bits != NULL ? &r : NULL);
    __m512 u = nesterov ? _mm512_fmadd_ps(c.mu, ms, g) : ms;
    if (__builtin_expect(nan_lanes(k, m, u) != 0, 0))
        return 1;
    vstore(c.mom, mdt, i, ms, k);
    /* a stored bf16 momentum is already exact in a bf16 pack */
    vstore(c.out, odt, i, !nesterov && mdt == odt ? ms : vround(odt, u, NULL), k);
    return 0;
}

AI size_t momentum_span(struct momentum_vars c, size_t i, size_t end, int gdt, int mdt, int odt,
                        int nesterov, const uint16_t *bits)
{
    for (; i + VLEN <= end; i += VLEN, bits = bits != NULL ? bits + VLEN : NULL)
        if (momentum_vec(c, i, FULL, gdt, mdt, odt, nesterov, bits))
            return i;
    if (i < end && momentum_vec(c, i, tail_mask(end - i), gdt, mdt, odt, nesterov, bits))
        return i;
    return end;
}

/* The vector at i (if any) through the reference; returns where the vector loop goes on. */
static size_t momentum_ref_vector(const struct momentum_args *a, size_t i, size_t end)
{
    if (i >= end)
        return i;
    size_t e = i + VLEN < end ? i + VLEN : end;
    momentum_ref(a, i, e);
    return e;
}

AI void momentum_run(const struct momentum_args *a, size_t c0, size_t c1, int gdt, int mdt, int odt,
                     int nesterov)
{
    const struct momentum_vars c = {a->grad, a->mom, a->out, _mm512_set1_ps(a->mu),
                                    _mm512_set1_ps(a->grad_scale)};
    if (mdt == KDT_BF16 && a->mom_rounding == KROUND_STOCHASTIC) {
        struct sr_source src;
        uint16_t bits[SR_BLOCK];
        sr_source_init(&src, &a->rng, &a->idx, c0);
        for (size_t b0 = c0; b0 < c1; b0 += SR_BLOCK) {
            size_t b1 = b0 + SR_BLOCK < c1 ? b0 + SR_BLOCK : c1;
            sr_source_fill(&src, bits, b1 - b0);
            for (size_t i = b0; i < b1;) {
                i = momentum_span(c, i, b1, gdt, mdt, odt, nesterov, bits + (i - b0));
                i = momentum_ref_vector(a, i, b1);
            }
        }
        return;
    }
    for (size_t i = c0; i < c1;) {
        i = momentum_span(c, i, c1, gdt, mdt, odt, nesterov, NULL);
        i = momentum_ref_vector(a, i, c1);
    }
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

void avx512_momentum(const struct kernel_ctx *ctx, const struct momentum_args *a)
{
    const size_t n = a->n;
    const momentum_fn fn =
        momentum_fns[(a->grad_dtype == KDT_BF16) << 3 | (a->mom_dtype == KDT_BF16) << 2 |
                     (a->out_dtype == KDT_BF16) << 1 | (a->nesterov != 0)];

#pragma omp parallel for schedule(static) num_threads(kthreads(ctx, n))
    for (size_t c0 = 0; c0 < n; c0 += KCHUNK)
        fn(a, c0, c0 + KCHUNK < n ? c0 + KCHUNK : n);
}

/* ---- AdamW ---- */

struct adamw_vars {
    void *param;
    const void *grad;
    float *m, *v;
    __m512 scale, b1, b2, omb1, omb2, eps, neg_step, bc2_rsqrt, decay;
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

AI int adamw_vec(struct adamw_vars c, size_t i, __mmask16 k, int pdt, int gdt, const uint16_t *bits)
{
    __m512 g = vgrad(vload(c.grad, gdt, i, k), c.scale);
    __m512 m = _mm512_fmadd_ps(c.b1, vload(c.m, KDT_F32, i, k), _mm512_mul_ps(c.omb1, g));
    __m512 v = _mm512_fmadd_ps(c.b2, vload(c.v, KDT_F32, i, k),
                               _mm512_mul_ps(c.omb2, _mm512_mul_ps(g, g)));
    __m512 denom = _mm512_fmadd_ps(_mm512_sqrt_ps(v), c.bc2_rsqrt, c.eps);
    __m512 w = _mm512_mul_ps(vload(c.param, pdt, i, k), c.decay);
    w = _mm512_fmadd_ps(c.neg_step, _mm512_div_ps(m, denom), w);
    if (__builtin_expect((nan_lanes(k, m, v) | nan_lanes(k, w, w)) != 0, 0))
        return 1;
    __m512i r = bits != NULL ? sr_bits(bits, 0) : _mm512_setzero_si512();
    vstore(c.m, KDT_F32, i, m, k);
    vstore(c.v, KDT_F32, i, v, k);
    vstore(c.param, pdt, i, vround(pdt, w, bits != NULL ? &r : NULL), k);
    return 0;
}

AI size_t adamw_span(struct adamw_vars c, size_t i, size_t end, int pdt, int gdt,
                     const uint16_t *bits)
{
    for (; i + VLEN <= end; i += VLEN, bits = bits != NULL ? bits + VLEN : NULL)
        if (adamw_vec(c, i, FULL, pdt, gdt, bits))
            return i;
    if (i < end && adamw_vec(c, i, tail_mask(end - i), pdt, gdt, bits))
        return i;
    return end;
}

static size_t adamw_ref_vector(const struct adamw_args *a, size_t i, size_t end)
{
    if (i >= end)
        return i;
    size_t e = i + VLEN < end ? i + VLEN : end;
    adamw_ref(a, i, e);
    return e;
}

AI void adamw_run(const struct adamw_args *a, size_t c0, size_t c1, int pdt, int gdt)
{
    const struct adamw_vars c = {
        a->param,
        a->grad,
        a->exp_avg,
        a->exp_avg_sq,
        _mm512_set1_ps(a->grad_scale),
        _mm512_set1_ps(a->beta1),
        _mm512_set1_ps(a->beta2),
        _mm512_set1_ps(a->one_minus_beta1),
        _mm512_set1_ps(a->one_minus_beta2),
        _mm512_set1_ps(a->eps),
        _mm512_set1_ps(-a->step_size),
        _mm512_set1_ps(a->bc2_rsqrt),
        _mm512_set1_ps(a->decay),
    };
    if (pdt == KDT_BF16 && a->param_rounding == KROUND_STOCHASTIC) {
        struct sr_source src;
        uint16_t bits[SR_BLOCK];
        sr_source_init(&src, &a->rng, &a->idx, c0);
        for (size_t b0 = c0; b0 < c1; b0 += SR_BLOCK) {
            size_t b1 = b0 + SR_BLOCK < c1 ? b0 + SR_BLOCK : c1;
            sr_source_fill(&src, bits, b1 - b0);
            for (size_t i = b0; i < b1;) {
                i = adamw_span(c, i, b1, pdt, gdt, bits + (i - b0));
                i = adamw_ref_vector(a, i, b1);
            }
        }
        return;
    }
    for (size_t i = c0; i < c1;) {
        i = adamw_span(c, i, c1, pdt, gdt, NULL);
        i = adamw_ref_vector(a, i, c1);
    }
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

void avx512_adamw(const struct kernel_ctx *ctx, const struct adamw_args *a)
{
    const size_t n = a->n;

    /* bf16 moments take the reference path (the same bits by definition); the vector code
     * covers the fp32 moments everyone starts with */
    if (a->m_dtype != KDT_F32 || a->v_dtype != KDT_F32) {
        ref_adamw(ctx, a);
        return;
    }
    const adamw_fn fn = adamw_fns[(a->param_dtype == KDT_BF16) << 1 | (a->grad_dtype == KDT_BF16)];

#pragma omp parallel for schedule(static) num_threads(kthreads(ctx, n))
    for (size_t c0 = 0; c0 < n; c0 += KCHUNK)
        fn(a, c0, c0 + KCHUNK < n ? c0 + KCHUNK : n);
}

/* ---- apply ---- */

struct apply_vars {
    void *param;
    const void *update;
    __m512 neg_alpha, decay;
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

AI int apply_vec(struct apply_vars c, size_t i, __mmask16 k, int pdt, int udt, const uint16_t *bits)
{
    __m512 o = vload(c.update, udt, i, k);
    __m512 w = _mm512_mul_ps(vload(c.param, pdt, i, k), c.decay);
    w = _mm512_fmadd_ps(c.neg_alpha, o, w);
    if (__builtin_expect(nan_lanes(k, w, w) != 0, 0))
        return 1;
    __m512i r = bits != NULL ? sr_bits(bits, 0) : _mm512_setzero_si512();
    vstore(c.param, pdt, i, vround(pdt, w, bits != NULL ? &r : NULL), k);
    return 0;
}

AI size_t apply_span(struct apply_vars c, size_t i, size_t end, int pdt, int udt,
                     const uint16_t *bits)
{
    for (; i + VLEN <= end; i += VLEN, bits = bits != NULL ? bits + VLEN : NULL)
        if (apply_vec(c, i, FULL, pdt, udt, bits))
            return i;
    if (i < end && apply_vec(c, i, tail_mask(end - i), pdt, udt, bits))
        return i;
    return end;
}

static size_t apply_ref_vector(const struct apply_args *a, size_t i, size_t end)
{
    if (i >= end)
        return i;
    size_t e = i + VLEN < end ? i + VLEN : end;
    apply_ref(a, i, e);
    return e;
}

AI void apply_run(const struct apply_args *a, size_t c0, size_t c1, int pdt, int udt)
{
    const struct apply_vars c = {a->param, a->update, _mm512_set1_ps(-a->alpha),
                                 _mm512_set1_ps(a->decay)};
    if (pdt == KDT_BF16 && a->param_rounding == KROUND_STOCHASTIC) {
        struct sr_source src;
        uint16_t bits[SR_BLOCK];
        sr_source_init(&src, &a->rng, &a->idx, c0);
        for (size_t b0 = c0; b0 < c1; b0 += SR_BLOCK) {
            size_t b1 = b0 + SR_BLOCK < c1 ? b0 + SR_BLOCK : c1;
            sr_source_fill(&src, bits, b1 - b0);
            for (size_t i = b0; i < b1;) {
                i = apply_span(c, i, b1, pdt, udt, bits + (i - b0));
                i = apply_ref_vector(a, i, b1);
            }
        }
        return;
    }
    for (size_t i = c0; i < c1;) {
        i = apply_span(c, i, c1, pdt, udt, NULL);
        i = apply_ref_vector(a, i, c1);
    }
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

void avx512_apply(const struct kernel_ctx *ctx, const struct apply_args *a)
{
    const size_t n = a->n;
    const apply_fn fn =
        apply_fns[(a->param_dtype == KDT_BF16) << 1 | (a->update_dtype == KDT_BF16)];

#pragma omp parallel for schedule(static) num_threads(kthreads(ctx, n))
    for (size_t c0 = 0; c0 < n; c0 += KCHUNK)
        fn(a, c0, c0 + KCHUNK < n ? c0 + KCHUNK : n);
}

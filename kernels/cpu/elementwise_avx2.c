/* AVX2 + FMA elementwise kernels: the fp32 sequences of ops.h, 8 lanes a vector, bit-identical to
 * elementwise_ref.c. For the CPUs without AVX-512 (Zen 2/3 and older Intel), where the portable
 * table would otherwise run the plain-C reference.
 *
 * Same shape as elementwise_avx512.c, and the same reasons: mul, div, sqrt and fma are correctly
 * rounded here and in the reference, fusing happens exactly where ops.h says, bf16 rounding is
 * done with integer ops (no instruction rounds to bf16 on these CPUs anyway), the loops are
 * specialised on the dtypes, and a step whose values hold a NaN goes to the reference before
 * anything is stored. Without mask registers a partial step would need a scalar load or store per
 * lane for bf16 data, so the last n % STEP elements of a call go to the reference as well: chunks
 * and stochastic-rounding blocks are multiples of STEP, so that is one short piece per call. */
#include <immintrin.h>
#include <string.h>

#include "cpu_kernels.h"
#include "elem_split.h"

/* A step is two vectors, so a bf16 buffer is stored 32 bytes at a time as in the AVX-512 kernels.
 * One vector a step measured 0.75-0.81 of a triad for bf16 momentum and 1.17-1.21 for AdamW
 * (elementwise_bench, 256 MiB); two measured 0.85 and 1.35 on the same machine. */
#define VLEN 8
#define STEP 16

/* Every helper is inlined into the specialised loops, where the dtype tests fold away. */
#define AI static inline __attribute__((always_inline))

AI __m256 vload(const void *p, int dt, size_t i)
{
    if (dt == KDT_BF16) {
        __m128i x = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + i));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(x), 16));
    }
    return _mm256_loadu_ps((const float *)p + i);
}

/* bf16_from_f32 (ties to even) for lanes that are not NaN, widened back to fp32: the value a
 * reload of the stored bf16 would see. */
AI __m256 round_rne(__m256 v)
{
    __m256i u = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
    return _mm256_castsi256_ps(_mm256_and_si256(r, _mm256_set1_epi32((int)0xffff0000u)));
}

/* bf16_from_f32_sr for lanes that are not NaN; `bits` holds 16 random bits per lane. */
AI __m256 round_sr(__m256 v, __m256i bits)
{
    __m256i r = _mm256_add_epi32(_mm256_castps_si256(v), bits);
    return _mm256_castsi256_ps(_mm256_and_si256(r, _mm256_set1_epi32((int)0xffff0000u)));
}

/* v as dtype dt holds it (bf16: stochastically when `bits` is given). */
AI __m256 vround(int dt, __m256 v, const __m256i *bits)
{
    if (dt == KDT_F32)
        return v;
    return bits != NULL ? round_sr(v, *bits) : round_rne(v);
}

/* Stores the STEP elements v[0], v[1], already exact in dtype dt (the results of vround). */
AI void vstore(void *p, int dt, size_t i, const __m256 v[2])
{
    if (dt == KDT_F32) {
        _mm256_storeu_ps((float *)p + i, v[0]);
        _mm256_storeu_ps((float *)p + i + VLEN, v[1]);
        return;
    }
    /* the high halves fit in 16 bits, so the signed-to-unsigned saturation never clips; the pack
     * works within 128-bit lanes, the permute puts the four quarters back in order */
    __m256i h0 = _mm256_srli_epi32(_mm256_castps_si256(v[0]), 16);
    __m256i h1 = _mm256_srli_epi32(_mm256_castps_si256(v[1]), 16);
    __m256i b = _mm256_permute4x64_epi64(_mm256_packus_epi32(h0, h1), 0xd8);
    _mm256_storeu_si256((__m256i *)((uint16_t *)p + i), b);
}

/* Lanes where a or b is NaN, all ones; the others zero. */
AI __m256 nan_lanes(__m256 a, __m256 b) { return _mm256_cmp_ps(a, b, _CMP_UNORD_Q); }

/* rule_grad: grad * scale, 0 where that is not finite (g - g is 0 exactly for finite g) */
AI __m256 vgrad(__m256 grad, __m256 scale)
{
    const __m256 g = _mm256_mul_ps(grad, scale);
    return _mm256_and_ps(g, _mm256_cmp_ps(_mm256_sub_ps(g, g), _mm256_setzero_ps(), _CMP_EQ_OQ));
}

/* ---- random bits for stochastic rounding ----
 * Philox4x32-10 as in kernels/rng.c, 8 counters (8 groups of 8 global indices) per call, one per
 * 32-bit lane. It pays: bf16 momentum with stochastic rounding measured 0.45-0.66 of a triad with
 * it, 0.16-0.23 with the scalar cursor (elementwise_bench, 256 MiB, 1-2 threads). Drawn a block at
 * a time ahead of the vector loop, which then makes no calls and keeps its constants in
 * registers. */
#define SR_BLOCK 1024

/* High and low 32 bits of m * x per lane, without vpmulld (10 cycles of latency on Intel). */
AI void mul32_wide(__m256i m, __m256i x, __m256i *hi, __m256i *lo)
{
    __m256i even = _mm256_mul_epu32(x, m);                       /* lanes 0, 2, ... as 64 bit */
    __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(x, 32), m); /* lanes 1, 3, ... */
    *hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xaa);
    *lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xaa);
}

/* The 8 x 16 bits of each of the 8 groups [group, group + 8), in group order: exactly what
 * rng_bits16x8 gives for each (word j of a group's Philox output holds its bits 2j and 2j+1). */
static void philox_groups8(const struct rng_stream *s, uint64_t group, uint16_t out[64])
{
    const __m256i m0 = _mm256_set1_epi32((int)0xD2511F53u),
                  m1 = _mm256_set1_epi32((int)0xCD9E8D57u);
    const __m256i w0 = _mm256_set1_epi32((int)0x9E3779B9u),
                  w1 = _mm256_set1_epi32((int)0xBB67AE85u);
    const __m256i sign = _mm256_set1_epi32((int)0x80000000u);
    __m256i base = _mm256_set1_epi32((int)(uint32_t)group);
    __m256i c0 = _mm256_add_epi32(base, _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    /* the counter is 64-bit: lanes whose low word wrapped carry into the high one (an unsigned
     * compare, which AVX2 lacks, as a signed one on sign-flipped words; true is -1) */
    __m256i wrapped = _mm256_cmpgt_epi32(_mm256_xor_si256(base, sign), _mm256_xor_si256(c0, sign));
    __m256i c1 = _mm256_sub_epi32(_mm256_set1_epi32((int)(uint32_t)(group >> 32)), wrapped);
    __m256i c2 = _mm256_set1_epi32((int)s->step_lo), c3 = _mm256_set1_epi32((int)s->kind_hi);
    __m256i k0 = _mm256_set1_epi32((int)s->key[0]), k1 = _mm256_set1_epi32((int)s->key[1]);

    for (int round = 0; round < 10; round++) {
        __m256i hi0, lo0, hi1, lo1;
        mul32_wide(m0, c0, &hi0, &lo0);
        mul32_wide(m1, c2, &hi1, &lo1);
        c0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), k0);
        c2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), k1);
        c1 = lo1;
        c3 = lo0;
        k0 = _mm256_add_epi32(k0, w0);
        k1 = _mm256_add_epi32(k1, w1);
    }
    /* 4 x 8 words to 8 x 4: group l's words side by side, which in little-endian memory are
     * its 8 x 16 bits in rng_bits16x8 order */
    __m256i t0 = _mm256_unpacklo_epi32(c0, c1), t1 = _mm256_unpackhi_epi32(c0, c1);
    __m256i t2 = _mm256_unpacklo_epi32(c2, c3), t3 = _mm256_unpackhi_epi32(c2, c3);
    __m256i g04 = _mm256_unpacklo_epi64(t0, t2), g15 = _mm256_unpackhi_epi64(t0, t2);
    __m256i g26 = _mm256_unpacklo_epi64(t1, t3), g37 = _mm256_unpackhi_epi64(t1, t3);
    _mm256_storeu_si256((__m256i *)out, _mm256_permute2x128_si256(g04, g15, 0x20));
    _mm256_storeu_si256((__m256i *)(out + 16), _mm256_permute2x128_si256(g26, g37, 0x20));
    _mm256_storeu_si256((__m256i *)(out + 32), _mm256_permute2x128_si256(g04, g15, 0x31));
    _mm256_storeu_si256((__m256i *)(out + 48), _mm256_permute2x128_si256(g26, g37, 0x31));
}

/* The bits of `count` consecutive global indices from g (one run of a shard). */
static void rng_bits_contiguous(const struct rng_stream *s, uint64_t g, size_t count, uint16_t *out)
{
    uint16_t bits[64];
    for (uint64_t grp = g >> 3; grp <= (g + count - 1) >> 3; grp += 8) {
        uint64_t lo = grp * 8 > g ? grp * 8 : g;
        uint64_t hi = grp * 8 + 64 < g + count ? grp * 8 + 64 : g + count;
        if (lo == grp * 8 && hi == grp * 8 + 64) {
            philox_groups8(s, grp, out + (lo - g));
        } else {
            philox_groups8(s, grp, bits);
            memcpy(out + (lo - g), bits + (lo - grp * 8), (size_t)(hi - lo) * sizeof *out);
        }
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
 * through the vector Philox, short ones (narrow shards) through the scalar cursor. */
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
}

AI __m256i sr_bits(const uint16_t *bits)
{
    return _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)bits));
}

/* Which payload an operation passes on when two NaNs meet depends on the instruction form the
 * compiler picked (vfmadd132 vs 213 vs 231, the operand order of a mul), not on the math, so a
 * step whose values hold a NaN is handed to the reference before anything is stored: its bits
 * then agree by construction. Such steps are rare (an optimizer step with a non-finite grad is
 * skipped).
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
 * scalars re-broadcast) on every iteration. A span function runs whole steps over [i, end) and
 * returns the start of the first one it did not store: a step whose values hold a NaN, or the
 * tail of fewer than STEP elements. The caller hands that piece to the reference: the hot loop
 * itself makes no call. */

/* ---- Muon momentum + pack ---- */

struct momentum_vars {
    const void *grad;
    void *mom, *out;
    __m256 mu, scale;
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

/* One step; returns nonzero, having stored nothing, when its values hold a NaN. */
AI int momentum_vec(struct momentum_vars c, size_t i, int gdt, int mdt, int odt, int nesterov,
                    const uint16_t *bits)
{
    __m256 ms[2], u[2], nan = _mm256_setzero_ps();
    for (int h = 0; h < 2; h++) {
        size_t j = i + (size_t)h * VLEN;
        __m256 g = vgrad(vload(c.grad, gdt, j), c.scale);
        __m256 m = _mm256_fmadd_ps(c.mu, vload(c.mom, mdt, j), g);
        __m256i r = bits != NULL ? sr_bits(bits + h * VLEN) : _mm256_setzero_si256();
        ms[h] = vround(mdt, m, bits != NULL ? &r : NULL);
        __m256 uh = nesterov ? _mm256_fmadd_ps(c.mu, ms[h], g) : ms[h];
        nan = _mm256_or_ps(nan, nan_lanes(m, uh));
        /* a stored bf16 momentum is already exact in a bf16 pack */
        u[h] = !nesterov && mdt == odt ? ms[h] : vround(odt, uh, NULL);
    }
    if (__builtin_expect(_mm256_movemask_ps(nan) != 0, 0))
        return 1;
    vstore(c.mom, mdt, i, ms);
    vstore(c.out, odt, i, u);
    return 0;
}

AI size_t momentum_span(struct momentum_vars c, size_t i, size_t end, int gdt, int mdt, int odt,
                        int nesterov, const uint16_t *bits)
{
    for (; i + STEP <= end; i += STEP, bits = bits != NULL ? bits + STEP : NULL)
        if (momentum_vec(c, i, gdt, mdt, odt, nesterov, bits))
            return i;
    return i;
}

/* The step (or tail) at i, if any, through the reference; returns where the vector loop goes on. */
static size_t momentum_ref_step(const struct momentum_args *a, size_t i, size_t end)
{
    if (i >= end)
        return i;
    size_t e = i + STEP < end ? i + STEP : end;
    momentum_ref(a, i, e);
    return e;
}

AI void momentum_run(const struct momentum_args *a, size_t c0, size_t c1, int gdt, int mdt, int odt,
                     int nesterov)
{
    const struct momentum_vars c = {a->grad, a->mom, a->out, _mm256_set1_ps(a->mu),
                                    _mm256_set1_ps(a->grad_scale)};
    if (mdt == KDT_BF16 && a->mom_rounding == KROUND_STOCHASTIC) {
        struct sr_source src;
        uint16_t bits[SR_BLOCK];
        sr_source_init(&src, &a->rng, &a->idx, c0);
        for (size_t b0 = c0; b0 < c1; b0 += SR_BLOCK) {
            size_t b1 = b0 + SR_BLOCK < c1 ? b0 + SR_BLOCK : c1;
            sr_source_fill(&src, bits, b1 - b0);
            for (size_t i = b0; i < b1;) {
                i = momentum_span(c, i, b1, gdt, mdt, odt, nesterov, bits + (i - b0));
                i = momentum_ref_step(a, i, b1);
            }
        }
        return;
    }
    for (size_t i = c0; i < c1;) {
        i = momentum_span(c, i, c1, gdt, mdt, odt, nesterov, NULL);
        i = momentum_ref_step(a, i, c1);
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

void avx2_momentum(const struct kernel_ctx *ctx, const struct momentum_args *a)
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
    __m256 scale, b1, b2, omb1, omb2, eps, neg_step, bc2_rsqrt, decay;
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

AI int adamw_vec(struct adamw_vars c, size_t i, int pdt, int gdt, const uint16_t *bits)
{
    __m256 m[2], v[2], w[2], nan = _mm256_setzero_ps();
    for (int h = 0; h < 2; h++) {
        size_t j = i + (size_t)h * VLEN;
        __m256 g = vgrad(vload(c.grad, gdt, j), c.scale);
        m[h] = _mm256_fmadd_ps(c.b1, vload(c.m, KDT_F32, j), _mm256_mul_ps(c.omb1, g));
        v[h] = _mm256_fmadd_ps(c.b2, vload(c.v, KDT_F32, j),
                               _mm256_mul_ps(c.omb2, _mm256_mul_ps(g, g)));
        __m256 denom = _mm256_fmadd_ps(_mm256_sqrt_ps(v[h]), c.bc2_rsqrt, c.eps);
        __m256 wd = _mm256_mul_ps(vload(c.param, pdt, j), c.decay);
        __m256 wh = _mm256_fmadd_ps(c.neg_step, _mm256_div_ps(m[h], denom), wd);
        nan = _mm256_or_ps(nan, _mm256_or_ps(nan_lanes(m[h], v[h]), nan_lanes(wh, wh)));
        __m256i r = bits != NULL ? sr_bits(bits + h * VLEN) : _mm256_setzero_si256();
        w[h] = vround(pdt, wh, bits != NULL ? &r : NULL);
    }
    if (__builtin_expect(_mm256_movemask_ps(nan) != 0, 0))
        return 1;
    vstore(c.m, KDT_F32, i, m);
    vstore(c.v, KDT_F32, i, v);
    vstore(c.param, pdt, i, w);
    return 0;
}

AI size_t adamw_span(struct adamw_vars c, size_t i, size_t end, int pdt, int gdt,
                     const uint16_t *bits)
{
    for (; i + STEP <= end; i += STEP, bits = bits != NULL ? bits + STEP : NULL)
        if (adamw_vec(c, i, pdt, gdt, bits))
            return i;
    return i;
}

static size_t adamw_ref_step(const struct adamw_args *a, size_t i, size_t end)
{
    if (i >= end)
        return i;
    size_t e = i + STEP < end ? i + STEP : end;
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
        _mm256_set1_ps(a->grad_scale),
        _mm256_set1_ps(a->beta1),
        _mm256_set1_ps(a->beta2),
        _mm256_set1_ps(a->one_minus_beta1),
        _mm256_set1_ps(a->one_minus_beta2),
        _mm256_set1_ps(a->eps),
        _mm256_set1_ps(-a->step_size),
        _mm256_set1_ps(a->bc2_rsqrt),
        _mm256_set1_ps(a->decay),
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
                i = adamw_ref_step(a, i, b1);
            }
        }
        return;
    }
    for (size_t i = c0; i < c1;) {
        i = adamw_span(c, i, c1, pdt, gdt, NULL);
        i = adamw_ref_step(a, i, c1);
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

void avx2_adamw(const struct kernel_ctx *ctx, const struct adamw_args *a)
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
    __m256 neg_alpha, decay;
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

AI int apply_vec(struct apply_vars c, size_t i, int pdt, int udt, const uint16_t *bits)
{
    __m256 w[2], nan = _mm256_setzero_ps();
    for (int h = 0; h < 2; h++) {
        size_t j = i + (size_t)h * VLEN;
        __m256 o = vload(c.update, udt, j);
        __m256 wd = _mm256_mul_ps(vload(c.param, pdt, j), c.decay);
        __m256 wh = _mm256_fmadd_ps(c.neg_alpha, o, wd);
        nan = _mm256_or_ps(nan, nan_lanes(wh, wh));
        __m256i r = bits != NULL ? sr_bits(bits + h * VLEN) : _mm256_setzero_si256();
        w[h] = vround(pdt, wh, bits != NULL ? &r : NULL);
    }
    if (__builtin_expect(_mm256_movemask_ps(nan) != 0, 0))
        return 1;
    vstore(c.param, pdt, i, w);
    return 0;
}

AI size_t apply_span(struct apply_vars c, size_t i, size_t end, int pdt, int udt,
                     const uint16_t *bits)
{
    for (; i + STEP <= end; i += STEP, bits = bits != NULL ? bits + STEP : NULL)
        if (apply_vec(c, i, pdt, udt, bits))
            return i;
    return i;
}

static size_t apply_ref_step(const struct apply_args *a, size_t i, size_t end)
{
    if (i >= end)
        return i;
    size_t e = i + STEP < end ? i + STEP : end;
    apply_ref(a, i, e);
    return e;
}

AI void apply_run(const struct apply_args *a, size_t c0, size_t c1, int pdt, int udt)
{
    const struct apply_vars c = {a->param, a->update, _mm256_set1_ps(-a->alpha),
                                 _mm256_set1_ps(a->decay)};
    if (pdt == KDT_BF16 && a->param_rounding == KROUND_STOCHASTIC) {
        struct sr_source src;
        uint16_t bits[SR_BLOCK];
        sr_source_init(&src, &a->rng, &a->idx, c0);
        for (size_t b0 = c0; b0 < c1; b0 += SR_BLOCK) {
            size_t b1 = b0 + SR_BLOCK < c1 ? b0 + SR_BLOCK : c1;
            sr_source_fill(&src, bits, b1 - b0);
            for (size_t i = b0; i < b1;) {
                i = apply_span(c, i, b1, pdt, udt, bits + (i - b0));
                i = apply_ref_step(a, i, b1);
            }
        }
        return;
    }
    for (size_t i = c0; i < c1;) {
        i = apply_span(c, i, c1, pdt, udt, NULL);
        i = apply_ref_step(a, i, c1);
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

void avx2_apply(const struct kernel_ctx *ctx, const struct apply_args *a)
{
    const size_t n = a->n;
    const apply_fn fn =
        apply_fns[(a->param_dtype == KDT_BF16) << 1 | (a->update_dtype == KDT_BF16)];

#pragma omp parallel for schedule(static) num_threads(kthreads(ctx, n))
    for (size_t c0 = 0; c0 < n; c0 += KCHUNK)
        fn(a, c0, c0 + KCHUNK < n ? c0 + KCHUNK : n);
}

/* AVX-512 elementwise kernels: the vector primitives of elementwise_simd.h, 16 fp32 lanes a
 * zmm register, and the framework's instantiation over them (bit-identical to elementwise_ref.c;
 * the framework's header says why). Mask registers make a partial vector cheap, so the last
 * n % 16 elements of a call run as one masked vector. */
#include <immintrin.h>
#include <string.h>

#include "cpu_kernels.h"

/* Every helper is inlined into the specialised loops, where dtype and mask tests fold away. */
#define AI static inline __attribute__((always_inline))

#define VLEN 16
typedef __m512 vf;
typedef __mmask16 vk;
typedef __mmask16 vnan_t;
#define VK_FULL          ((__mmask16)0xffff)
#define SIMD_MASKED_TAIL 1

AI vk vk_tail(size_t k) { return (__mmask16)((1u << k) - 1u); }

AI vf vset1(float x) { return _mm512_set1_ps(x); }
AI vf vmul(vf a, vf b) { return _mm512_mul_ps(a, b); }
AI vf vdiv(vf a, vf b) { return _mm512_div_ps(a, b); }
AI vf vsqrt(vf a) { return _mm512_sqrt_ps(a); }
AI vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }

AI vf vload(const void *p, int dt, size_t i, vk k)
{
    if (dt == KDT_BF16) {
        const uint16_t *h = (const uint16_t *)p + i;
        __m256i x =
            k == VK_FULL ? _mm256_loadu_si256((const __m256i *)h) : _mm256_maskz_loadu_epi16(k, h);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(x), 16));
    }
    const float *f = (const float *)p + i;
    return k == VK_FULL ? _mm512_loadu_ps(f) : _mm512_maskz_loadu_ps(k, f);
}

AI void vstore(void *p, int dt, size_t i, vf v, vk k)
{
    if (dt == KDT_F32) {
        float *d = (float *)p + i;
        if (k == VK_FULL)
            _mm512_storeu_ps(d, v);
        else
            _mm512_mask_storeu_ps(d, k, v);
        return;
    }
    uint16_t *d = (uint16_t *)p + i;
    __m256i h = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(v), 16));
    if (k == VK_FULL)
        _mm256_storeu_si256((__m256i *)d, h);
    else
        _mm256_mask_storeu_epi16(d, k, h);
}

AI vf vround_rne(vf v)
{
    __m512i u = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
    return _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32((int)0xffff0000u)));
}

AI vf vround_sr(vf v, const uint16_t *bits)
{
    __m512i b = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)bits));
    __m512i r = _mm512_add_epi32(_mm512_castps_si512(v), b);
    return _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32((int)0xffff0000u)));
}

/* v - v is 0 exactly for finite v */
AI vf vfinite_or_zero(vf v)
{
    return _mm512_maskz_mov_ps(
        _mm512_cmp_ps_mask(_mm512_sub_ps(v, v), _mm512_setzero_ps(), _CMP_EQ_OQ), v);
}

AI vnan_t vnan_lanes(vk k, vf a, vf b) { return _mm512_mask_cmp_ps_mask(k, a, b, _CMP_UNORD_Q); }
AI vnan_t vnan_or(vnan_t x, vnan_t y) { return x | y; }
AI int vnan_any(vnan_t x) { return x != 0; }

/* ---- random bits for stochastic rounding ----
 * Philox4x32-10 as in kernels/rng.c, 16 counters (16 groups of 8 global indices) per call, one
 * per 32-bit lane. */

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

#include "elementwise_simd.h"

void avx512_momentum(const struct kernel_ctx *ctx, const struct momentum_args *a)
{
    simd_momentum(ctx, a);
}

void avx512_adamw(const struct kernel_ctx *ctx, const struct adamw_args *a) { simd_adamw(ctx, a); }

void avx512_apply(const struct kernel_ctx *ctx, const struct apply_args *a) { simd_apply(ctx, a); }

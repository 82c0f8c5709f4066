/* AVX2 + FMA elementwise kernels: the vector primitives of elementwise_simd.h and the framework's
 * instantiation over them (bit-identical to elementwise_ref.c; the framework's header says why).
 * For the CPUs without AVX-512 (Zen 2/3 and older Intel), where the portable table would
 * otherwise run the plain-C reference.
 *
 * A framework vector is two ymm registers, 16 lanes: a bf16 buffer is then stored 32 bytes at a
 * time as in the AVX-512 kernels. One register a vector measured 0.75-0.81 of a triad for bf16
 * momentum and 1.17-1.21 for AdamW (elementwise_bench, 256 MiB); two measured 0.85 and 1.35 on the
 * same machine. Without mask registers a partial vector would need a scalar load or store per
 * lane for bf16 data, so the last n % 16 elements of a call go to the reference: chunks and
 * stochastic-rounding blocks are whole vectors, so that is one short piece per call. */
#include <immintrin.h>
#include <string.h>

#include "cpu_kernels.h"

/* Every helper is inlined into the specialised loops, where the dtype tests fold away. */
#define AI static inline __attribute__((always_inline))

#define VLEN 16
typedef struct {
    __m256 h[2]; /* lanes 0-7, 8-15 */
} vf;
typedef int vk; /* always VK_FULL: no masked tails */
typedef __m256 vnan_t;
#define VK_FULL          1
#define SIMD_MASKED_TAIL 0

AI vf vset1(float x) { return (vf){{_mm256_set1_ps(x), _mm256_set1_ps(x)}}; }
AI vf vmul(vf a, vf b)
{
    return (vf){{_mm256_mul_ps(a.h[0], b.h[0]), _mm256_mul_ps(a.h[1], b.h[1])}};
}
AI vf vdiv(vf a, vf b)
{
    return (vf){{_mm256_div_ps(a.h[0], b.h[0]), _mm256_div_ps(a.h[1], b.h[1])}};
}
AI vf vsqrt(vf a) { return (vf){{_mm256_sqrt_ps(a.h[0]), _mm256_sqrt_ps(a.h[1])}}; }
AI vf vfma(vf a, vf b, vf c)
{
    return (vf){{_mm256_fmadd_ps(a.h[0], b.h[0], c.h[0]), _mm256_fmadd_ps(a.h[1], b.h[1], c.h[1])}};
}

AI __m256 load8(const void *p, int dt, size_t i)
{
    if (dt == KDT_BF16) {
        __m128i x = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + i));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(x), 16));
    }
    return _mm256_loadu_ps((const float *)p + i);
}

AI vf vload(const void *p, int dt, size_t i, vk k)
{
    (void)k;
    return (vf){{load8(p, dt, i), load8(p, dt, i + 8)}};
}

AI void vstore(void *p, int dt, size_t i, vf v, vk k)
{
    (void)k;
    if (dt == KDT_F32) {
        _mm256_storeu_ps((float *)p + i, v.h[0]);
        _mm256_storeu_ps((float *)p + i + 8, v.h[1]);
        return;
    }
    /* the high halves fit in 16 bits, so the signed-to-unsigned saturation never clips; the pack
     * works within 128-bit lanes, the permute puts the four quarters back in order */
    __m256i h0 = _mm256_srli_epi32(_mm256_castps_si256(v.h[0]), 16);
    __m256i h1 = _mm256_srli_epi32(_mm256_castps_si256(v.h[1]), 16);
    __m256i b = _mm256_permute4x64_epi64(_mm256_packus_epi32(h0, h1), 0xd8);
    _mm256_storeu_si256((__m256i *)((uint16_t *)p + i), b);
}

AI __m256 rne8(__m256 v)
{
    __m256i u = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
    return _mm256_castsi256_ps(_mm256_and_si256(r, _mm256_set1_epi32((int)0xffff0000u)));
}

AI vf vround_rne(vf v) { return (vf){{rne8(v.h[0]), rne8(v.h[1])}}; }

AI __m256 sr8(__m256 v, const uint16_t *bits)
{
    __m256i b = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)bits));
    __m256i r = _mm256_add_epi32(_mm256_castps_si256(v), b);
    return _mm256_castsi256_ps(_mm256_and_si256(r, _mm256_set1_epi32((int)0xffff0000u)));
}

AI vf vround_sr(vf v, const uint16_t *bits)
{
    return (vf){{sr8(v.h[0], bits), sr8(v.h[1], bits + 8)}};
}

/* v - v is 0 exactly for finite v */
AI __m256 finite8(__m256 v)
{
    return _mm256_and_ps(v, _mm256_cmp_ps(_mm256_sub_ps(v, v), _mm256_setzero_ps(), _CMP_EQ_OQ));
}

AI vf vfinite_or_zero(vf v) { return (vf){{finite8(v.h[0]), finite8(v.h[1])}}; }

/* all ones in a lane where either half's lane is NaN: only "any" is asked of the set */
AI vnan_t vnan_lanes(vk k, vf a, vf b)
{
    (void)k;
    return _mm256_or_ps(_mm256_cmp_ps(a.h[0], b.h[0], _CMP_UNORD_Q),
                        _mm256_cmp_ps(a.h[1], b.h[1], _CMP_UNORD_Q));
}
AI vnan_t vnan_or(vnan_t x, vnan_t y) { return _mm256_or_ps(x, y); }
AI int vnan_any(vnan_t x) { return _mm256_movemask_ps(x) != 0; }

/* ---- random bits for stochastic rounding ----
 * Philox4x32-10 as in kernels/rng.c, 8 counters (8 groups of 8 global indices) per call, one per
 * 32-bit lane. It pays: bf16 momentum with stochastic rounding measured 0.45-0.66 of a triad with
 * it, 0.16-0.23 with the scalar cursor (elementwise_bench, 256 MiB, 1-2 threads). */

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

#include "elementwise_simd.h"

void avx2_momentum(const struct kernel_ctx *ctx, const struct momentum_args *a)
{
    simd_momentum(ctx, a);
}

void avx2_adamw(const struct kernel_ctx *ctx, const struct adamw_args *a) { simd_adamw(ctx, a); }

void avx2_apply(const struct kernel_ctx *ctx, const struct apply_args *a) { simd_apply(ctx, a); }

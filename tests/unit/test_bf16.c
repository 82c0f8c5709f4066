/* fp32 -> bf16 conversion: round to nearest even (ties, subnormals, NaN, Inf, overflow) and
 * stochastic rounding (exact values stay, only the two neighbours, unbiased). */
#include <float.h>

#include "kernels/dtype.h"
#include "kernels/rng.h"
#include "test.h"

static uint16_t rne_bits(uint32_t u) { return bf16_from_f32(f32_from_bits(u)); }

/* Uniform random fp32 bit patterns (every exponent equally likely). */
static uint32_t rand_u32(uint64_t *s)
{
    test_rand(s);
    return (uint32_t)((*s * 0x2545F4914F6CDD1Dull) >> 32);
}

TEST(bf16_round_ties_to_even)
{
    /* 1 + 2^-8 is exactly halfway between two bf16 values: the even one wins */
    EXPECT_EQ_U16(bf16_from_f32(1.00390625f), 0x3f80);
    EXPECT_EQ_U16(bf16_from_f32(1.01171875f), 0x3f82);
    EXPECT_EQ_U16(bf16_from_f32(-1.00390625f), 0xbf80);
    EXPECT_EQ_U16(bf16_from_f32(-1.01171875f), 0xbf82);
    /* one fp32 ulp either side of the tie is no longer a tie */
    EXPECT_EQ_U16(rne_bits(0x3f807fffu), 0x3f80);
    EXPECT_EQ_U16(rne_bits(0x3f808001u), 0x3f81);
    EXPECT_EQ_U16(rne_bits(0xbf808001u), 0xbf81);
    /* a tie that carries into the exponent */
    EXPECT_EQ_U16(rne_bits(0x3fff8000u), 0x4000);
}

TEST(bf16_round_subnormals)
{
    EXPECT_EQ_U16(rne_bits(0x00000001u), 0x0000); /* smallest fp32 subnormal */
    EXPECT_EQ_U16(rne_bits(0x80000001u), 0x8000);
    EXPECT_EQ_U16(rne_bits(0x00010000u), 0x0001); /* smallest bf16 subnormal, exact */
    EXPECT_EQ_U16(rne_bits(0x00008000u), 0x0000); /* tie between 0 and it: even is 0 */
    EXPECT_EQ_U16(rne_bits(0x00008001u), 0x0001);
    EXPECT_EQ_U16(rne_bits(0x00018000u), 0x0002); /* subnormal tie, odd below: up */
    EXPECT_EQ_U16(rne_bits(0x80018000u), 0x8002);
    EXPECT_EQ_U16(rne_bits(0x007fffffu),
                  0x0080); /* largest subnormal rounds to the smallest normal */
}

TEST(bf16_round_keeps_nan)
{
    EXPECT_TRUE(isnan(f32_from_bf16(bf16_from_f32(NAN))));
    EXPECT_EQ_U16(rne_bits(0x7fc00000u), 0x7fc0);
    EXPECT_EQ_U16(rne_bits(0xffc00000u), 0xffc0);
    /* signalling NaNs whose payload sits in the low half would round to +-Inf */
    EXPECT_EQ_U16(rne_bits(0x7f800001u), 0x7fc0);
    EXPECT_EQ_U16(rne_bits(0xff800001u), 0xffc0);
    EXPECT_EQ_U16(rne_bits(0x7f80ffffu), 0x7fc0);
    /* ... or carry into the sign bit */
    EXPECT_EQ_U16(rne_bits(0x7fffffffu), 0x7fff);
    /* the top payload bits survive, quietened */
    EXPECT_EQ_U16(rne_bits(0x7fa12345u), 0x7fe1);
    EXPECT_EQ_U16(rne_bits(0xffa18000u), 0xffe1);
}

TEST(bf16_round_inf_and_overflow)
{
    EXPECT_EQ_U16(rne_bits(0x7f800000u), 0x7f80);
    EXPECT_EQ_U16(rne_bits(0xff800000u), 0xff80);
    EXPECT_EQ_U16(bf16_from_f32(FLT_MAX), 0x7f80);
    EXPECT_EQ_U16(bf16_from_f32(-FLT_MAX), 0xff80);
    /* the largest float that stays finite, and the tie just above it (odd below: up to Inf) */
    EXPECT_EQ_U16(rne_bits(0x7f7f7fffu), 0x7f7f);
    EXPECT_EQ_U16(rne_bits(0xff7f7fffu), 0xff7f);
    EXPECT_EQ_U16(rne_bits(0x7f7f8000u), 0x7f80);
    EXPECT_EQ_U16(rne_bits(0x7f7e8000u), 0x7f7e); /* a tie below an even max-1: stays */
}

TEST(bf16_round_signed_zero)
{
    EXPECT_EQ_U16(bf16_from_f32(0.0f), 0x0000);
    EXPECT_EQ_U16(bf16_from_f32(-0.0f), 0x8000);
}

/* Every bf16 value converts back to itself; every bf16 NaN to a quiet NaN of the same sign. */
TEST(bf16_round_trip_exhaustive)
{
    unsigned bad = 0;
    for (uint32_t h = 0; h <= 0xffff; h++) {
        uint16_t r = bf16_from_f32(f32_from_bf16((uint16_t)h));
        int nan = (h & 0x7fff) > 0x7f80;
        bad += nan ? r != (h | 0x40) : r != h;
    }
    EXPECT_EQ_INT(bad, 0);
}

/* Nearest by exact distances in double (every fp32 and bf16 is a double), ties to the even
 * pattern: an independent definition of what the bit trick computes. */
static uint16_t rne_by_distance(float f)
{
    uint32_t u = f32_bits(f);
    uint16_t lo = (uint16_t)(u >> 16);
    double x = f, a = f32_from_bf16(lo);
    double b = (lo & 0x7fff) == 0x7f7f ? copysign(0x1p128, x) : f32_from_bf16((uint16_t)(lo + 1));
    double da = fabs(x - a), db = fabs(x - b);
    if (da < db || (da == db && (lo & 1) == 0))
        return lo;
    return (uint16_t)(lo + 1); /* 0x7f7f + 1 is the Inf pattern, as overflow should give */
}

TEST(bf16_round_matches_distance_definition)
{
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    unsigned bad = 0;
    for (int i = 0; i < 2000000; i++) {
        float f = f32_from_bits(rand_u32(&seed));
        if (!isfinite(f))
            continue;
        bad += bf16_from_f32(f) != rne_by_distance(f);
    }
    EXPECT_EQ_INT(bad, 0);
}

TEST(bf16_stochastic_keeps_exact_values)
{
    static const uint16_t r[] = {0x0000, 0x0001, 0x7fff, 0x8000, 0xfffe, 0xffff};
    unsigned bad = 0;
    for (uint32_t h = 0; h <= 0xffff; h++) {
        if ((h & 0x7fff) > 0x7f80)
            continue;
        for (size_t k = 0; k < sizeof r / sizeof r[0]; k++)
            bad += bf16_from_f32_sr(f32_from_bf16((uint16_t)h), r[k]) != h;
    }
    EXPECT_EQ_INT(bad, 0);
    EXPECT_TRUE(isnan(f32_from_bf16(bf16_from_f32_sr(f32_from_bits(0x7f800001u), 0xffff))));
    EXPECT_EQ_U16(bf16_from_f32_sr(f32_from_bits(0xff800001u), 0xffff), 0xffc0);
}

/* The result is the truncation or the next value away from zero, never anything else. */
TEST(bf16_stochastic_gives_a_neighbour)
{
    uint64_t seed = 42;
    unsigned bad = 0, up = 0;
    for (int i = 0; i < 1000000; i++) {
        uint32_t u = rand_u32(&seed);
        uint16_t r = (uint16_t)rand_u32(&seed);
        if ((u & 0x7fffffff) >= 0x7f800000u)
            continue;
        uint16_t h = bf16_from_f32_sr(f32_from_bits(u), r), lo = (uint16_t)(u >> 16);
        bad += h != lo && h != lo + 1;
        up += h == lo + 1;
    }
    EXPECT_EQ_INT(bad, 0);
    /* both neighbours occur, about equally (the fractions and the bits are uniform) */
    EXPECT_TRUE(up > 400000 && up < 600000);
}

/* Over all 2^16 values of the random bits the mean is exactly the input: the rounding is
 * unbiased by construction, not only on average. */
TEST(bf16_stochastic_exactly_unbiased_over_all_bits)
{
    static const float xs[] = {1.0f + 0x1p-12f, -3.14159265f, 1e-3f, 7.7e-39f, 65504.123f};
    for (size_t k = 0; k < sizeof xs / sizeof xs[0]; k++) {
        double sum = 0;
        for (uint32_t r = 0; r <= 0xffff; r++)
            sum += f32_from_bf16(bf16_from_f32_sr(xs[k], (uint16_t)r));
        EXPECT_NEAR(sum / 65536.0, xs[k], 0.0);
    }
}

/* With the bits the kernels use (Philox over consecutive global indices) the mean converges to
 * the input. Hoeffding: P(|mean - x| >= t*ulp) <= 2 exp(-2 N t^2), ~1e-22 for N = 2^20 and
 * t = 0.005, so this cannot flake for any seed; a biased or stuck stream misses by far more. */
TEST(bf16_stochastic_mean_converges_with_philox_bits)
{
    static const float xs[] = {1.0f + 0x1p-10f, -2.71828183f, 3.0e-5f, 123456.789f};
    const uint32_t n = 1u << 20;
    struct rng_stream s = rng_stream_make(7, rng_name_hash("w"), RNG_KIND_PARAM, 1);
    for (size_t k = 0; k < sizeof xs / sizeof xs[0]; k++) {
        uint16_t lo = (uint16_t)(f32_bits(xs[k]) >> 16);
        double ulp = fabs((double)f32_from_bf16((uint16_t)(lo + 1)) - f32_from_bf16(lo));
        double sum = 0;
        for (uint32_t g = 0; g < n; g++)
            sum += f32_from_bf16(bf16_from_f32_sr(xs[k], rng_bits16(&s, (uint64_t)k << 32 | g)));
        EXPECT_NEAR(sum / n, xs[k], 0.005 * ulp);
    }
}

#include "rng.h"

void rng_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
    rng_philox(ctr, key, out);
}

uint64_t rng_name_hash(const char *name)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
        h ^= *p;
        h *= 0x100000001b3ull;
    }
    return h;
}

uint64_t rng_splitmix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

struct rng_stream rng_stream_make(uint64_t seed, uint64_t name_hash, enum rng_kind kind,
                                  uint64_t step)
{
    struct rng_stream s;
    uint64_t k = rng_splitmix64(seed) ^ name_hash;
    s.key[0] = (uint32_t)k;
    s.key[1] = (uint32_t)(k >> 32);
    s.step_lo = (uint32_t)step;
    s.kind_hi = ((uint32_t)kind & 0xffu) | ((uint32_t)(step >> 32) << 8);
    return s;
}

void rng_bits16x8(const struct rng_stream *s, uint64_t group, uint16_t out[8])
{
    rng_group_bits(s, group, out);
}

uint16_t rng_bits16(const struct rng_stream *s, uint64_t g)
{
    uint16_t b[8];
    rng_bits16x8(s, g >> 3, b);
    return b[g & 7];
}

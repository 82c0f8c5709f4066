#include "rng.h"

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

void philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];

    for (int round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t)PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c0 = n0;
        c1 = (uint32_t)p1;
        c2 = n2;
        c3 = (uint32_t)p0;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
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

static uint64_t splitmix64(uint64_t x)
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
    uint64_t k = splitmix64(seed) ^ name_hash;
    s.key[0] = (uint32_t)k;
    s.key[1] = (uint32_t)(k >> 32);
    s.step_lo = (uint32_t)step;
    s.kind_hi = ((uint32_t)kind & 0xffu) | ((uint32_t)(step >> 32) << 8);
    return s;
}

void rng_bits16x8(const struct rng_stream *s, uint64_t group, uint16_t out[8])
{
    uint32_t ctr[4] = {(uint32_t)group, (uint32_t)(group >> 32), s->step_lo, s->kind_hi};
    uint32_t w[4];
    philox4x32_10(ctr, s->key, w);
    for (int i = 0; i < 4; i++) {
        out[2 * i] = (uint16_t)w[i];
        out[2 * i + 1] = (uint16_t)(w[i] >> 16);
    }
}

uint16_t rng_bits16(const struct rng_stream *s, uint64_t g)
{
    uint16_t b[8];
    rng_bits16x8(s, g >> 3, b);
    return b[g & 7];
}

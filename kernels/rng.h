/* Counter-based random bits for stochastic rounding (Philox4x32-10, Salmon et al. 2011).
 *
 * The bits for an element depend only on (seed, parameter name hash, state kind, step, global
 * flat index): never on a handle, a registration slot, a local index or the thread count, so
 * any layout, any rerun and any resume draw the same bits. One Philox call yields 128 bits,
 * which serve 8 consecutive global indices (16 bits each). */
#ifndef KERNELS_RNG_H
#define KERNELS_RNG_H

#include <stdint.h>

#include "hd.h"

/* What a random stream rounds; part of the counter so two states never share bits. */
enum rng_kind {
    RNG_KIND_MOMENTUM = 1,
    RNG_KIND_PARAM = 2,
    RNG_KIND_EXP_AVG = 3,
    RNG_KIND_EXP_AVG_SQ = 4,
};

struct rng_stream {
    uint32_t key[2];  /* from (seed, name hash) */
    uint32_t step_lo; /* counter word 2 */
    uint32_t kind_hi; /* counter word 3: kind in the low byte, step bits 32..55 above it */
};

void rng_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* The generator itself, inline so that the CUDA kernels draw the very same bits. */
KHD static inline void rng_philox(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];

    for (int round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0;
        uint64_t p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c0 = n0;
        c1 = (uint32_t)p1;
        c2 = n2;
        c3 = (uint32_t)p0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* FNV-1a 64: stable across runs, platforms and versions (it is part of the checkpoint format). */
uint64_t rng_name_hash(const char *name);

/* splitmix64 (Steele, Lea and Flood 2014): a bijection of 64-bit words that mixes every input bit
 * into every output bit; the seed's whitening here, and the runtime's digests chain it */
uint64_t rng_splitmix64(uint64_t x);

struct rng_stream rng_stream_make(uint64_t seed, uint64_t name_hash, enum rng_kind kind,
                                  uint64_t step);

/* 16 random bits for global index g. */
uint16_t rng_bits16(const struct rng_stream *s, uint64_t g);

/* The 8 x 16 bits for the group of global indices [8*group, 8*group + 8). */
void rng_bits16x8(const struct rng_stream *s, uint64_t group, uint16_t out[8]);

KHD static inline void rng_group_bits(const struct rng_stream *s, uint64_t group, uint16_t out[8])
{
    uint32_t ctr[4] = {(uint32_t)group, (uint32_t)(group >> 32), s->step_lo, s->kind_hi};
    uint32_t w[4];
    rng_philox(ctr, s->key, w);
    for (int i = 0; i < 4; i++) {
        out[2 * i] = (uint16_t)w[i];
        out[2 * i + 1] = (uint16_t)(w[i] >> 16);
    }
}

/* Random bits for consecutive global indices, one Philox call per group of 8. */
struct rng_cursor {
    const struct rng_stream *s;
    uint64_t group;
    uint16_t bits[8];
};

KHD static inline void rng_cursor_init(struct rng_cursor *c, const struct rng_stream *s)
{
    c->s = s;
    c->group = UINT64_MAX;
}

KHD static inline uint16_t rng_cursor_bits(struct rng_cursor *c, uint64_t g)
{
    if ((g >> 3) != c->group) {
        c->group = g >> 3;
        rng_group_bits(c->s, c->group, c->bits);
    }
    return c->bits[g & 7];
}

#endif

/* Counter-based random bits for stochastic rounding (Philox4x32-10, Salmon et al. 2011).
 *
 * The bits for an element depend only on (seed, parameter name hash, state kind, step, global
 * flat index): never on a handle, a registration slot, a local index or the thread count, so
 * any layout, any rerun and any resume draw the same bits. One Philox call yields 128 bits,
 * which serve 8 consecutive global indices (16 bits each). */
#ifndef KERNELS_RNG_H
#define KERNELS_RNG_H

#include <stdint.h>

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

void philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* FNV-1a 64: stable across runs, platforms and versions (it is part of the checkpoint format). */
uint64_t rng_name_hash(const char *name);

struct rng_stream rng_stream_make(uint64_t seed, uint64_t name_hash, enum rng_kind kind,
                                  uint64_t step);

/* 16 random bits for global index g. */
uint16_t rng_bits16(const struct rng_stream *s, uint64_t g);

/* The 8 x 16 bits for the group of global indices [8*group, 8*group + 8). */
void rng_bits16x8(const struct rng_stream *s, uint64_t group, uint16_t out[8]);

#endif

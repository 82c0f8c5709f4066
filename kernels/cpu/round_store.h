/* Storing an fp32 result into its dtype, with the rounding the state asks for. */
#ifndef KERNELS_CPU_ROUND_STORE_H
#define KERNELS_CPU_ROUND_STORE_H

#include "../ops.h"

#ifdef _OPENMP
#include <omp.h>
#endif

/* Random bits for consecutive global indices, one Philox call per group of 8. */
struct rng_cursor {
    const struct rng_stream *s;
    uint64_t group;
    uint16_t bits[8];
};

static inline void rng_cursor_init(struct rng_cursor *c, const struct rng_stream *s)
{
    c->s = s;
    c->group = UINT64_MAX;
}

static inline uint16_t rng_cursor_bits(struct rng_cursor *c, uint64_t g)
{
    if ((g >> 3) != c->group) {
        c->group = g >> 3;
        rng_bits16x8(c->s, c->group, c->bits);
    }
    return c->bits[g & 7];
}

/* Store v at p[i] in dtype dt; `g` is the element's global index (used only for stochastic). */
static inline void kstore(void *p, int dt, size_t i, float v, int rounding, struct rng_cursor *c,
                          uint64_t g)
{
    if (dt == KDT_F32)
        ((float *)p)[i] = v;
    else if (rounding == KROUND_STOCHASTIC)
        ((uint16_t *)p)[i] = bf16_from_f32_sr(v, rng_cursor_bits(c, g));
    else
        ((uint16_t *)p)[i] = bf16_from_f32(v);
}

/* Split [0, n) into chunks of a multiple of 64 elements (whole rng groups, whole cache lines).
 * Each element's result depends only on its own inputs, so the split never changes the bits. */
#define KCHUNK ((size_t)1 << 14)

/* Threads for an elementwise pass over n elements: one for small passes, where waking a team
 * costs more than it saves. */
static inline int kthreads(const struct kernel_ctx *ctx, size_t n)
{
    if (n <= 2 * KCHUNK)
        return 1;
#ifdef _OPENMP
    return ctx->threads > 0 ? ctx->threads : omp_get_max_threads();
#else
    (void)ctx;
    return 1;
#endif
}

#endif

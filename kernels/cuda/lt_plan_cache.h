/* Which cached cuBLASLt plan a product uses: the slot table behind ns_cuda.cu's products, in
 * plain C so that test_lt_plan_cache checks it without a GPU. A plan (descriptors, layouts and
 * the heuristic's algorithm) costs about ten host calls to build, and a 1408 x 4096
 * Newton-Schulz runs 15 products of ~35 us each, so building one per product left the device
 * waiting on the host. The key holds everything the plan depends on, the operand alignments
 * included: the heuristic may pick an algorithm that needs 256-byte operands unless told. */
#ifndef KERNELS_CUDA_LT_PLAN_CACHE_H
#define KERNELS_CUDA_LT_PLAN_CACHE_H

#include <stdint.h>
#include <string.h>

#define LT_PLAN_SLOTS 64

/* All int64_t, so there is no padding and memcmp compares keys. */
struct lt_key {
    int64_t ta, tb, m, n, k, lda, ldb, ldc, sa, sb, sc, batch;
    int64_t align_a, align_b, align_c, align_d; /* bytes, powers of two up to 256 */
};

struct lt_slots {
    struct lt_key key[LT_PLAN_SLOTS];
    uint64_t used[LT_PLAN_SLOTS]; /* 0: empty; else the clock at the last use */
    uint64_t clock;
};

/* The largest power of two up to 256 dividing the address, and for a batch the stride too. */
static inline int64_t lt_alignment(const void *p, int64_t stride_bytes, int64_t batch)
{
    uint64_t v = (uint64_t)(uintptr_t)p | 256u;
    if (batch > 1)
        v |= (uint64_t)stride_bytes;
    return (int64_t)(v & (~v + 1));
}

/* The slot for key. *fresh = 1 when it was assigned now (the caller builds the plan there); then
 * *evicted = 1 when it held another key's plan, least recently used, for the caller to free. */
static inline int lt_slot_find(struct lt_slots *t, const struct lt_key *key, int *fresh,
                               int *evicted)
{
    int victim = 0;
    t->clock++;
    for (int i = 0; i < LT_PLAN_SLOTS; i++) {
        if (t->used[i] != 0 && memcmp(&t->key[i], key, sizeof *key) == 0) {
            t->used[i] = t->clock;
            *fresh = 0;
            *evicted = 0;
            return i;
        }
        if (t->used[i] < t->used[victim])
            victim = i;
    }
    *fresh = 1;
    *evicted = t->used[victim] != 0;
    t->key[victim] = *key;
    t->used[victim] = t->clock;
    return victim;
}

#endif

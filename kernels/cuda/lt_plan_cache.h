/* Which cached cuBLASLt plan a product uses: the slot table behind ns_cuda.cu's products, in
 * plain C so that test_lt_plan_cache and test_ns_driver check it without a GPU. A plan
 * (descriptors, layouts and the heuristic's algorithm) costs about ten host calls to build, and
 * a 1408 x 4096 Newton-Schulz runs 15 products of ~35 us each, so building one per product left
 * the device waiting on the host.
 *
 * The key holds everything the plan depends on: transposes, shape, leading dimensions, batch
 * strides and count, and the operand alignments (the heuristic may pick an algorithm that needs
 * 256-byte operands unless told). The alignments are those of the actual pointers; the driver
 * (ns_driver.h) starts each of its X, Y, A, B regions on a 256-byte boundary, so that X and Y,
 * which swap every iteration, give one key and not two.
 *
 * Capacity: the distinct products that recur must fit, or LRU over a cycle longer than the
 * table misses every time (the 64 slots this had did with the symmetric variant). One rank's
 * glm45-air step (ep 8, test_ns_driver counts them) has 17 with the plain variant and 96 with
 * the symmetric one's block products, 79 of them in every MoE layer; other layouts add a
 * product per batch count and shape. LT_PLAN_SLOTS holds ten times that; a plan is a few
 * hundred bytes of host memory. Lookups go through a hash index, not a scan of the table, since
 * every product asks. */
#ifndef KERNELS_CUDA_LT_PLAN_CACHE_H
#define KERNELS_CUDA_LT_PLAN_CACHE_H

#include <stdint.h>
#include <string.h>

#define LT_PLAN_SLOTS 1024
#define LT_PLAN_HASH  2048 /* a power of two, twice the slots: short chains */

/* All int64_t, so there is no padding and memcmp compares keys. */
struct lt_key {
    int64_t ta, tb, m, n, k, lda, ldb, ldc, sa, sb, sc, batch;
    int64_t align_a, align_b, align_c, align_d; /* bytes, powers of two up to 256 */
};

struct lt_slots {
    struct lt_key key[LT_PLAN_SLOTS];
    uint64_t used[LT_PLAN_SLOTS]; /* 0: empty; else the clock at the last use */
    uint64_t clock;
    /* hash chains, slot index + 1 (0 ends a chain; a zeroed table is empty) */
    int32_t head[LT_PLAN_HASH];
    int32_t next[LT_PLAN_SLOTS];
    uint64_t hits, misses;
};

/* The largest power of two up to 256 dividing the address, and for a batch the stride too. */
static inline int64_t lt_alignment(const void *p, int64_t stride_bytes, int64_t batch)
{
    uint64_t v = (uint64_t)(uintptr_t)p | 256u;
    if (batch > 1)
        v |= (uint64_t)stride_bytes;
    return (int64_t)(v & (~v + 1));
}

/* The key of D = alpha op(A) op(B) + beta C on bf16 operands (2 bytes an element), strides in
 * elements. */
static inline struct lt_key lt_key_make(int ta, int tb, int64_t m, int64_t n, int64_t k,
                                        int64_t lda, int64_t ldb, int64_t ldc, int64_t sa,
                                        int64_t sb, int64_t sc, int64_t batch, const void *A,
                                        const void *B, const void *C, const void *D)
{
    struct lt_key key;
    memset(&key, 0, sizeof key);
    key.ta = ta;
    key.tb = tb;
    key.m = m;
    key.n = n;
    key.k = k;
    key.lda = lda;
    key.ldb = ldb;
    key.ldc = ldc;
    key.sa = sa;
    key.sb = sb;
    key.sc = sc;
    key.batch = batch;
    key.align_a = lt_alignment(A, 2 * sa, batch);
    key.align_b = lt_alignment(B, 2 * sb, batch);
    key.align_c = lt_alignment(C, 2 * sc, batch);
    key.align_d = lt_alignment(D, 2 * sc, batch);
    return key;
}

static inline uint32_t lt_key_hash(const struct lt_key *key)
{
    const int64_t *w = (const int64_t *)key;
    uint64_t h = 1469598103934665603ull; /* FNV-1a over the words */
    for (size_t i = 0; i < sizeof *key / sizeof *w; i++) {
        h ^= (uint64_t)w[i];
        h *= 1099511628211ull;
    }
    return (uint32_t)(h ^ (h >> 29)) & (LT_PLAN_HASH - 1);
}

static inline void lt_chain_unlink(struct lt_slots *t, int slot)
{
    int32_t *at = &t->head[lt_key_hash(&t->key[slot])];
    while (*at != 0 && *at != slot + 1)
        at = &t->next[*at - 1];
    if (*at != 0)
        *at = t->next[slot];
}

/* The slot for key. *fresh = 1 when it was assigned now (the caller builds the plan there); then
 * *evicted = 1 when it held another key's plan, least recently used, for the caller to free. */
static inline int lt_slot_find(struct lt_slots *t, const struct lt_key *key, int *fresh,
                               int *evicted)
{
    const uint32_t h = lt_key_hash(key);
    t->clock++;
    for (int32_t i = t->head[h]; i != 0; i = t->next[i - 1])
        if (memcmp(&t->key[i - 1], key, sizeof *key) == 0) {
            t->used[i - 1] = t->clock;
            t->hits++;
            *fresh = 0;
            *evicted = 0;
            return i - 1;
        }
    /* a miss: the plan is built, which costs far more than this scan for the victim */
    int victim = 0;
    for (int i = 1; i < LT_PLAN_SLOTS && t->used[victim] != 0; i++)
        if (t->used[i] < t->used[victim])
            victim = i;
    t->misses++;
    *fresh = 1;
    *evicted = t->used[victim] != 0;
    if (*evicted)
        lt_chain_unlink(t, victim);
    t->key[victim] = *key;
    t->used[victim] = t->clock;
    t->next[victim] = t->head[h];
    t->head[h] = victim + 1;
    return victim;
}

#endif

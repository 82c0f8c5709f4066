/* kernels/cuda/lt_plan_cache.h, the slot table behind the CUDA backend's cached cuBLASLt
 * products: a key finds its own slot again and only its own, keys that differ in any field
 * (an alignment included) get different plans, the least recently used plan is the one
 * evicted, and operand alignments are read off the address and the batch stride. Plain C: it
 * runs without a GPU, in every build. */
#include "kernels/cuda/lt_plan_cache.h"
#include "test.h"

static struct lt_key key_of(int64_t m)
{
    struct lt_key k;
    memset(&k, 0, sizeof k);
    k.m = m;
    k.n = 64;
    k.k = 4096;
    k.lda = k.ldb = 4096;
    k.ldc = m;
    k.batch = 1;
    k.align_a = k.align_b = k.align_c = k.align_d = 256;
    return k;
}

TEST(lt_plan_cache_finds_each_key_again_and_evicts_the_least_recent)
{
    static struct lt_slots t; /* zeroed: every slot empty */
    int slot[LT_PLAN_SLOTS], fresh = 0, evicted = 0;

    for (int i = 0; i < LT_PLAN_SLOTS; i++) {
        const struct lt_key k = key_of(100 + i);
        slot[i] = lt_slot_find(&t, &k, &fresh, &evicted);
        EXPECT_EQ_INT(fresh, 1);
        EXPECT_EQ_INT(evicted, 0);
        for (int j = 0; j < i; j++)
            EXPECT_TRUE(slot[j] != slot[i]);
    }
    for (int i = 0; i < LT_PLAN_SLOTS; i++) { /* all found again, key 0 last: key 1 is oldest */
        const int w = (i + 1) % LT_PLAN_SLOTS;
        const struct lt_key k = key_of(100 + w);
        EXPECT_EQ_INT(lt_slot_find(&t, &k, &fresh, &evicted), slot[w]);
        EXPECT_EQ_INT(fresh, 0);
    }
    struct lt_key k = key_of(100);
    k.align_b = 128; /* the same shape with a less aligned operand is another plan */
    EXPECT_EQ_INT(lt_slot_find(&t, &k, &fresh, &evicted), slot[1]);
    EXPECT_EQ_INT(fresh, 1);
    EXPECT_EQ_INT(evicted, 1);
    k = key_of(101); /* evicted: built again, in the slot of the now least recent key 2 */
    EXPECT_EQ_INT(lt_slot_find(&t, &k, &fresh, &evicted), slot[2]);
    EXPECT_EQ_INT(fresh, 1);
    EXPECT_EQ_INT(evicted, 1);
    k = key_of(100); /* untouched by the evictions */
    EXPECT_EQ_INT(lt_slot_find(&t, &k, &fresh, &evicted), slot[0]);
    EXPECT_EQ_INT(fresh, 0);
}

TEST(lt_alignment_reads_the_address_and_the_batch_stride)
{
    EXPECT_EQ_INT((int)lt_alignment((void *)(uintptr_t)0x10000, 0, 1), 256);
    EXPECT_EQ_INT((int)lt_alignment((void *)(uintptr_t)0x10040, 0, 1), 64);
    EXPECT_EQ_INT((int)lt_alignment((void *)(uintptr_t)0x10002, 0, 1), 2);
    /* a bf16 block at row and column 704 of a 1408 x 1408 matrix: (704 + 704 * 1408) * 2 */
    EXPECT_EQ_INT((int)lt_alignment((void *)(uintptr_t)(0x100000 + 1983872), 0, 1), 128);
    /* the batch's later matrices start a stride apart: 1408 * 1408 * 2 bytes is 256-aligned,
     * 13 * 7 * 2 is not */
    EXPECT_EQ_INT((int)lt_alignment((void *)(uintptr_t)0x10000, 1408 * 1408 * 2, 32), 256);
    EXPECT_EQ_INT((int)lt_alignment((void *)(uintptr_t)0x10000, 13 * 7 * 2, 3), 2);
    EXPECT_EQ_INT((int)lt_alignment((void *)(uintptr_t)0x10000, 13 * 7 * 2, 1), 256);
}

/* The hash index against a plain LRU table (a scan of every slot): over a long random
 * sequence of more keys than slots, the same hits, the same slots, the same evictions. */
TEST(lt_plan_cache_index_agrees_with_a_scanned_lru)
{
    static struct lt_slots t;
    static struct lt_key ref_key[LT_PLAN_SLOTS];
    static uint64_t ref_used[LT_PLAN_SLOTS];
    uint64_t clock = 0, x = 88172645463325252ull;
    long hits = 0, evictions = 0;

    for (int it = 0; it < 200000; it++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        /* mostly a working set that fits, sometimes one of many more keys */
        const int64_t id = x % 8 == 0 ? (int64_t)(x >> 8) % (4 * LT_PLAN_SLOTS)
                                      : (int64_t)(x >> 8) % (LT_PLAN_SLOTS / 2);
        struct lt_key k = key_of(1000 + id);
        int fresh, evicted, want = -1, victim = 0;
        clock++;
        for (int i = 0; i < LT_PLAN_SLOTS; i++) {
            if (ref_used[i] != 0 && memcmp(&ref_key[i], &k, sizeof k) == 0)
                want = i;
            if (ref_used[i] < ref_used[victim])
                victim = i;
        }
        const int got = lt_slot_find(&t, &k, &fresh, &evicted);
        if (want >= 0) {
            hits++;
            if (got != want || fresh) {
                EXPECT_EQ_INT(got, want);
                EXPECT_EQ_INT(fresh, 0);
                return;
            }
        } else {
            evictions += ref_used[victim] != 0;
            if (got != victim || !fresh || evicted != (ref_used[victim] != 0)) {
                EXPECT_EQ_INT(got, victim);
                EXPECT_EQ_INT(fresh, 1);
                return;
            }
            ref_key[victim] = k;
            want = victim;
        }
        ref_used[want] = clock;
    }
    EXPECT_EQ_INT((int)t.hits, (int)hits);
    EXPECT_TRUE(hits > 0 && evictions > 0);
}

/* The counter-based generator behind stochastic rounding: Philox4x32-10 known answers, the name
 * hash, stream separation, and bits that depend on the global index only. */
#include "kernels/ops.h"
#include "kernels/rng.h"
#include "test.h"

static void expect_philox(const uint32_t ctr[4], const uint32_t key[2], const uint32_t want[4])
{
    uint32_t out[4];
    rng_philox4x32_10(ctr, key, out);
    for (int i = 0; i < 4; i++)
        EXPECT_EQ_U32(out[i], want[i]);
}

/* Known-answer vectors of Random123 (kat_vectors, philox4x32_10). */
TEST(philox_known_answers)
{
    const uint32_t c0[4] = {0, 0, 0, 0}, k0[2] = {0, 0};
    const uint32_t w0[4] = {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8};
    expect_philox(c0, k0, w0);

    const uint32_t c1[4] = {~0u, ~0u, ~0u, ~0u}, k1[2] = {~0u, ~0u};
    const uint32_t w1[4] = {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd};
    expect_philox(c1, k1, w1);

    const uint32_t c2[4] = {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344};
    const uint32_t k2[2] = {0xa4093822, 0x299f31d0};
    const uint32_t w2[4] = {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1};
    expect_philox(c2, k2, w2);
}

/* The hash is part of the checkpoint format: these values may never change. */
TEST(name_hash_is_fnv1a_64)
{
    EXPECT_TRUE(rng_name_hash("") == 0xcbf29ce484222325ull);
    EXPECT_TRUE(rng_name_hash("a") == 0xaf63dc4c8601ec8cull);
    EXPECT_TRUE(rng_name_hash("foobar") == 0x85944171f73967e8ull);
    EXPECT_TRUE(rng_name_hash("layers.0.attn.wq") == 0x91096c2f3237ff6cull);
    EXPECT_TRUE(rng_name_hash("layers.0.attn.wq") != rng_name_hash("layers.0.attn.wk"));
}

/* Positions (of the first 256) where two streams draw the same 16 bits; ~256/65536 by chance. */
static int same_bits(const struct rng_stream *a, const struct rng_stream *b)
{
    int same = 0;
    for (uint64_t g = 0; g < 256; g++)
        same += rng_bits16(a, g) == rng_bits16(b, g);
    return same;
}

TEST(streams_differ_by_seed_name_kind_step)
{
    const uint64_t h = rng_name_hash("layers.1.mlp.w2");
    struct rng_stream base = rng_stream_make(1, h, RNG_KIND_MOMENTUM, 10);
    struct rng_stream other[] = {
        rng_stream_make(2, h, RNG_KIND_MOMENTUM, 10),
        rng_stream_make(1, rng_name_hash("layers.1.mlp.w3"), RNG_KIND_MOMENTUM, 10),
        rng_stream_make(1, h, RNG_KIND_PARAM, 10),
        rng_stream_make(1, h, RNG_KIND_EXP_AVG, 10),
        rng_stream_make(1, h, RNG_KIND_MOMENTUM, 11),
        rng_stream_make(1, h, RNG_KIND_MOMENTUM, 10 + (1ull << 32)), /* the step's high word */
        rng_stream_make(0, h, RNG_KIND_MOMENTUM, 10),
    };
    for (size_t k = 0; k < sizeof other / sizeof other[0]; k++)
        EXPECT_TRUE(same_bits(&base, &other[k]) < 8);
    /* and the same inputs give the same stream */
    struct rng_stream again = rng_stream_make(1, h, RNG_KIND_MOMENTUM, 10);
    EXPECT_EQ_INT(same_bits(&base, &again), 256);
}

/* Indices whose groups differ only in the counter's high word draw different bits. */
TEST(stream_uses_all_64_index_bits)
{
    struct rng_stream s = rng_stream_make(3, rng_name_hash("x"), RNG_KIND_PARAM, 1);
    int same = 0;
    for (uint64_t g = 0; g < 256; g++)
        same += rng_bits16(&s, g) == rng_bits16(&s, g + (8ull << 32));
    EXPECT_TRUE(same < 8);
}

/* One Philox call gives the 8 x 16 bits of a group: rng_bits16, rng_bits16x8 and the kernels'
 * cursor agree for every index, whatever the order they are reached in. */
TEST(bits_of_an_index_do_not_depend_on_the_path)
{
    struct rng_stream s = rng_stream_make(99, rng_name_hash("w"), RNG_KIND_MOMENTUM, 5);
    const uint64_t starts[] = {0, 5, (1ull << 32) * 8 - 13, (1ull << 40) + 3, UINT64_MAX - 40};
    unsigned bad = 0;
    for (size_t k = 0; k < sizeof starts / sizeof starts[0]; k++) {
        struct rng_cursor fwd, back;
        rng_cursor_init(&fwd, &s);
        rng_cursor_init(&back, &s);
        for (uint64_t j = 0; j < 40; j++) {
            uint64_t g = starts[k] + j, gb = starts[k] + 39 - j;
            uint16_t grp[8];
            rng_bits16x8(&s, g >> 3, grp);
            bad += rng_bits16(&s, g) != grp[g & 7];
            bad += rng_cursor_bits(&fwd, g) != grp[g & 7];
            bad += rng_cursor_bits(&back, gb) != rng_bits16(&s, gb);
        }
    }
    EXPECT_EQ_INT(bad, 0);
    /* the two halves of each 32-bit word are both used, in order */
    uint32_t ctr[4] = {7, 0, s.step_lo, s.kind_hi}, w[4];
    rng_philox4x32_10(ctr, s.key, w);
    EXPECT_EQ_U16(rng_bits16(&s, 7 * 8 + 0), (uint16_t)w[0]);
    EXPECT_EQ_U16(rng_bits16(&s, 7 * 8 + 1), (uint16_t)(w[0] >> 16));
    EXPECT_EQ_U16(rng_bits16(&s, 7 * 8 + 6), (uint16_t)w[3]);
    EXPECT_EQ_U16(rng_bits16(&s, 7 * 8 + 7), (uint16_t)(w[3] >> 16));
}

/* A row-major tensor [A, B, C] sharded along one dim: each local element maps to its global flat
 * index through (base, run, stride). */
static unsigned check_shard_map(uint64_t A, uint64_t B, uint64_t C, int dim, uint64_t lo,
                                uint64_t hi)
{
    const uint64_t ext[3] = {A, B, C};
    uint64_t inner = 1, outer = 1;
    for (int d = dim + 1; d < 3; d++)
        inner *= ext[d];
    for (int d = 0; d < dim; d++)
        outer *= ext[d];
    struct elem_index_map m = {lo * inner, (hi - lo) * inner, ext[dim] * inner};
    unsigned bad = 0;
    uint64_t i = 0;
    for (uint64_t a = 0; a < A; a++)
        for (uint64_t b = 0; b < B; b++)
            for (uint64_t c = 0; c < C; c++) {
                uint64_t pos[3] = {a, b, c};
                if (pos[dim] < lo || pos[dim] >= hi)
                    continue;
                bad += elem_index_global(&m, i++) != (a * B + b) * C + c;
            }
    bad += i != outer * (hi - lo) * inner;
    return bad;
}

TEST(elem_index_global_over_runs)
{
    EXPECT_EQ_INT(check_shard_map(1, 37, 129, 1, 10, 20), 0); /* rows of a matrix: one run */
    EXPECT_EQ_INT(check_shard_map(1, 37, 129, 2, 40, 77), 0); /* columns: runs of 37 */
    EXPECT_EQ_INT(check_shard_map(4, 16, 24, 0, 1, 3), 0);    /* experts of a stack */
    EXPECT_EQ_INT(check_shard_map(4, 16, 24, 1, 5, 11), 0);   /* the middle dim of a stack */
    EXPECT_EQ_INT(check_shard_map(4, 16, 24, 2, 0, 24), 0);   /* the whole stack */
    /* a whole tensor is one run: the identity even past 2^32 */
    struct elem_index_map whole = {0, UINT64_MAX, 0};
    EXPECT_TRUE(elem_index_global(&whole, (1ull << 35) + 7) == (1ull << 35) + 7);
}

/* Two shards of a matrix draw, element by element, the bits the whole matrix draws. */
TEST(bits_are_layout_independent)
{
    enum { ROWS = 13, COLS = 100, SPLIT = 37 };
    struct rng_stream s = rng_stream_make(5, rng_name_hash("m"), RNG_KIND_PARAM, 2);
    struct elem_index_map left = {0, SPLIT, COLS}, right = {SPLIT, COLS - SPLIT, COLS};
    unsigned bad = 0;
    for (uint64_t r = 0; r < ROWS; r++)
        for (uint64_t c = 0; c < COLS; c++) {
            uint16_t whole = rng_bits16(&s, r * COLS + c);
            uint64_t g = c < SPLIT ? elem_index_global(&left, r * SPLIT + c)
                                   : elem_index_global(&right, r * (COLS - SPLIT) + c - SPLIT);
            bad += rng_bits16(&s, g) != whole;
        }
    EXPECT_EQ_INT(bad, 0);
}

/* The 16-bit draws are uniform, in each of their four nibbles (stochastic rounding uses all 16
 * bits): each of 16 buckets gets 1/16 of 2^20 draws. A chi-square with 15 degrees of freedom
 * above 60 has probability ~1e-7 for a good generator. */
TEST(bits_are_uniform)
{
    struct rng_stream s = rng_stream_make(11, rng_name_hash("u"), RNG_KIND_EXP_AVG_SQ, 1);
    unsigned long count[4][16] = {{0}};
    const unsigned long n = 1ul << 20;
    for (uint64_t g = 0; g < n; g++) {
        const unsigned v = rng_bits16(&s, g);
        for (int k = 0; k < 4; k++)
            count[k][(v >> (4 * k)) & 15]++;
    }
    const double e = n / 16.0;
    for (int k = 0; k < 4; k++) {
        double chi2 = 0;
        for (int b = 0; b < 16; b++)
            chi2 += (count[k][b] - e) * (count[k][b] - e) / e;
        if (!(chi2 < 60.0))
            fprintf(stderr, "  bits %d..%d: chi-square %.1f\n", 4 * k, 4 * k + 3, chi2);
        EXPECT_TRUE(chi2 < 60.0);
    }
}

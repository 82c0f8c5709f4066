/* CRC-32C (ISA-L's crc32_iscsi behind crc32c_update): known answers, chaining, lengths and
 * alignments against a bit-at-a-time oracle kept here, lengths past crc32_iscsi's int, combining,
 * and throughput. */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#include <sys/mman.h>
#include <time.h>

#include "base/crc32c.h"
#include "test.h"

/* The definition itself, one bit at a time: the oracle the library is checked against. */
static uint32_t crc_bitwise(uint32_t crc, const unsigned char *p, size_t n)
{
    crc = ~crc;
    while (n--) {
        crc ^= *p++;
        for (int k = 0; k < 8; k++)
            crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
    }
    return ~crc;
}

static void fill_random(unsigned char *p, size_t n, uint64_t seed)
{
    uint64_t s = seed | 1;
    for (size_t i = 0; i < n; i++) {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        p[i] = (unsigned char)((s * 0x2545F4914F6CDD1Dull) >> 56);
    }
}

/* Long enough for every stage of a folding CRC (wide blocks, narrower ones, a ragged end). */
#define BIG (3 * 8192 * 5 + 3 * 256 * 2 + 77)

struct known {
    const char *what;
    unsigned char data[32];
    size_t len;
    uint32_t crc;
};

/* RFC 3720 B.4 and the usual check value. */
static void known_answers(struct known *k)
{
    memcpy(k[0].data, "123456789", 9);
    k[0].len = 9;
    k[0].crc = 0xE3069283;
    memset(k[1].data, 0, 32);
    k[1].len = 32;
    k[1].crc = 0x8A9136AA;
    memset(k[2].data, 0xFF, 32);
    k[2].len = 32;
    k[2].crc = 0x62A8AB43;
    for (int i = 0; i < 32; i++)
        k[3].data[i] = (unsigned char)i;
    k[3].len = 32;
    k[3].crc = 0x46DD794E;
}

TEST(crc32c_known_answers)
{
    struct known k[4];
    known_answers(k);
    for (int i = 0; i < 4; i++) {
        EXPECT_EQ_U32(crc32c_update(0, k[i].data, k[i].len), k[i].crc);
        EXPECT_EQ_U32(crc_bitwise(0, k[i].data, k[i].len), k[i].crc);
    }
}

TEST(crc32c_empty_input_keeps_crc)
{
    EXPECT_EQ_U32(crc32c_update(0, NULL, 0), 0);
    EXPECT_EQ_U32(crc32c_update(0xE3069283, NULL, 0), 0xE3069283);
    EXPECT_EQ_U32(crc32c_update(0x12345678, "x", 0), 0x12345678);
}

TEST(crc32c_chains_like_zlib)
{
    unsigned char *buf = malloc(BIG);
    ASSERT_TRUE(buf != NULL);
    fill_random(buf, BIG, 11);
    uint32_t whole = crc32c_update(0, buf, BIG);
    EXPECT_EQ_U32(whole, crc_bitwise(0, buf, BIG));
    size_t cuts[] = {0, 1, 7, 8, 9, 255, 768, 4096, 24576, 24577, BIG - 1, BIG};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        size_t c = cuts[i];
        EXPECT_EQ_U32(crc32c_update(crc32c_update(0, buf, c), buf + c, BIG - c), whole);
    }
    /* three pieces, as a writer streaming a tensor in chunks does */
    uint32_t crc = crc32c_update(0, buf, 1000);
    crc = crc32c_update(crc, buf + 1000, 30000);
    EXPECT_EQ_U32(crc32c_update(crc, buf + 31000, BIG - 31000), whole);
    free(buf);
}

/* Every length 0-300 at every alignment, then the sizes around the block boundaries, from a
 * register that is not 0. */
TEST(crc32c_matches_bitwise_every_short_length_and_alignment)
{
    unsigned char *buf = malloc(BIG + 8);
    ASSERT_TRUE(buf != NULL);
    fill_random(buf, BIG + 8, 7);
    int bad = 0;
    for (size_t off = 0; off < 8; off++)
        for (size_t n = 0; n <= 300; n++)
            if (crc32c_update(0x9E3779B9u, buf + off, n) != crc_bitwise(0x9E3779B9u, buf + off, n))
                bad++;
    size_t sizes[] = {767, 768, 769, 1536, 24575, 24576, 24577, 49152 + 768 + 5, BIG};
    for (size_t off = 0; off < 8; off++)
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
            if (crc32c_update(0, buf + off, sizes[i]) != crc_bitwise(0, buf + off, sizes[i])) {
                fprintf(stderr, "%zu bytes at offset %zu differ\n", sizes[i], off);
                bad++;
            }
    EXPECT_EQ_INT(bad, 0);
    free(buf);
}

TEST(crc32c_matches_bitwise_on_random_lengths_and_alignments)
{
    size_t max = 200000;
    unsigned char *buf = malloc(max + 64);
    ASSERT_TRUE(buf != NULL);
    uint64_t s = 5;
    int bad = 0;
    for (int trial = 0; trial < 400; trial++) {
        /* lengths spread over 0-200000, half of them short */
        size_t n = (size_t)((test_rand(&s) * 0.5 + 0.5) * (trial % 2 ? max : 3000));
        size_t off = (size_t)((test_rand(&s) * 0.5 + 0.5) * 63);
        uint32_t seed = (uint32_t)(s >> 32); /* any register, not only 0 */
        fill_random(buf + off, n, (uint64_t)trial + 1);
        if (crc32c_update(seed, buf + off, n) != crc_bitwise(seed, buf + off, n))
            bad++;
    }
    EXPECT_EQ_INT(bad, 0);
    free(buf);
}

/* The CRC-32C of len zero bytes, without reading them: doubling with crc32c_combine. */
static uint32_t crc_of_zeros(uint64_t len)
{
    const unsigned char zero = 0;
    uint32_t crc = 0, block = crc32c_update(0, &zero, 1);
    for (uint64_t block_len = 1; len != 0; len >>= 1, block_len <<= 1) {
        if (len & 1)
            crc = crc32c_combine(crc, block, block_len);
        block = crc32c_combine(block, block, block_len);
    }
    return crc;
}

/* crc32_iscsi takes an int length: a buffer past 4 GiB (where an int or a 32-bit count would
 * wrap) must still give its CRC. Zero pages that are only read take no memory, and the CRC of
 * zeros is known without reading them. */
TEST(crc32c_length_past_4_gib)
{
    const size_t n = ((size_t)1 << 32) + 4099;
    unsigned char *buf = mmap(NULL, n, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_TRUE(buf != MAP_FAILED);
    EXPECT_EQ_U32(crc_of_zeros(4099), crc32c_update(0, buf, 4099));
    /* from a register that is not 0, so that a dropped or repeated piece of zeros shows */
    EXPECT_EQ_U32(crc32c_update(0x12345678u, buf, n),
                  crc32c_combine(0x12345678u, crc_of_zeros(n), n));
    munmap(buf, n);
}

static double seconds_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Best of three passes over a buffer, in GB/s; *crc receives the CRC. */
static double gbps(uint32_t (*path)(uint32_t, const void *, size_t), const unsigned char *buf,
                   size_t n, uint32_t *crc)
{
    double best = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = seconds_now();
        *crc = path(0, buf, n);
        double t = seconds_now() - t0;
        if (t < best)
            best = t;
    }
    return (double)n / best / 1e9;
}

/* Reported, not asserted: what matters is the ratio to disk bandwidth, which a checkpoint
 * benchmark measures. */
TEST(crc32c_throughput_256mib)
{
    size_t n = (size_t)256 << 20;
    unsigned char *buf = malloc(n);
    ASSERT_TRUE(buf != NULL);
    fill_random(buf, n, 3);
    uint32_t a;
    printf("  crc32c (ISA-L crc32_iscsi): %.2f GB/s\n", gbps(crc32c_update, buf, n, &a));
    EXPECT_EQ_U32(crc32c_update(0, buf, n), a);
    free(buf);
}

TEST(combine_equals_the_crc_of_the_concatenation)
{
    static unsigned char buf[3 << 20];
    uint64_t seed = 77;
    for (size_t i = 0; i < sizeof buf; i++)
        buf[i] = (unsigned char)(test_rand(&seed) * 127 + 128);
    const size_t cuts[] = {0, 1, 7, 4096, 1 << 20, (1 << 20) + 3, sizeof buf - 1, sizeof buf};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        const size_t k = cuts[i];
        const uint32_t a = crc32c_update(0, buf, k), b = crc32c_update(0, buf + k, sizeof buf - k);
        EXPECT_EQ_U32(crc32c_combine(a, b, sizeof buf - k), crc32c_update(0, buf, sizeof buf));
    }
}

/* Which matrices may be orthogonalized sharded, at the edge of what one MPI call carries: the m x m
 * Gram matrix is all-reduced with an int count, so from m = 46341 (m^2 > 2^31 - 1) a sharded
 * matrix would wrap it (before: eligible, and ns_strategy = sharded forced it). */
#include "sharding/ns_strategy.h"
#include "test.h"

TEST(a_gram_matrix_beyond_one_mpi_count_is_never_sharded)
{
    static struct plan_box b[2];
    struct ns_strategy_in in = {.ndim = 2,
                                .shard_dim = 1,
                                .boxes = b,
                                .members = 2,
                                .steps = 5,
                                .esize = 2,
                                .gflops = 100,
                                .gbps = 25};
    const int64_t ms[3] = {46340, 46341, 1 << 20};
    for (int k = 0; k < 3; k++) {
        const int64_t m = ms[k], n = m + 2;
        in.shape[0] = m;
        in.shape[1] = n;
        in.shape[2] = 1;
        for (int i = 0; i < 2; i++) { /* two halves of the columns */
            b[i] = (struct plan_box){.lo = {0, i * (n / 2), 0}, .len = {m, n / 2, 1}};
        }
        const int want = k == 0;
        EXPECT_EQ_INT(ns_strategy_eligible(&in), want);
        EXPECT_EQ_INT(ns_strategy_choose(&in, NS_MODE_SHARDED), want);
        EXPECT_EQ_INT(ns_strategy_choose(&in, NS_MODE_AUTO) && !want, 0);
    }
    /* the same for a tall matrix, which works on its transpose: m is its column count */
    in.shape[0] = 46343;
    in.shape[1] = 46341;
    in.ns_transpose = 1;
    in.shard_dim = 0;
    b[0] = (struct plan_box){.lo = {0, 0, 0}, .len = {23171, 46341, 1}};
    b[1] = (struct plan_box){.lo = {23171, 0, 0}, .len = {23172, 46341, 1}};
    EXPECT_EQ_INT(ns_strategy_eligible(&in), 0);
    in.shape[1] = 46340;
    b[0].len[1] = b[1].len[1] = 46340;
    EXPECT_EQ_INT(ns_strategy_eligible(&in), 1);
}

/* auto prices each side at the FLOPs the runtime performs (issue 23), where it counted 4m^2n /
 * holders + 2m^3 per sharded iteration and every gathered product whole. Each case below is one
 * that count decided the other way. */
static struct ns_strategy_in wide_in(struct plan_box *b, int64_t m, int64_t n, const int64_t *w,
                                     int members)
{
    struct ns_strategy_in in = {.ndim = 2,
                                .shape = {m, n, 1},
                                .shard_dim = 1,
                                .boxes = b,
                                .members = members,
                                .steps = 5,
                                .esize = 2,
                                .gflops = 100,
                                .gbps = 1};
    int64_t lo = 0;
    for (int i = 0; i < members; i++) {
        b[i] = (struct plan_box){.lo = {0, lo, 0}, .len = {m, w[i], 1}};
        lo += w[i];
    }
    return in;
}

/* t_gather: the whole NS on the owner (the widest holder) and the rest of the matrix there and
 * back; t_sharded: the widest holder's iterations and a ring all-reduce of the fp32 Gram matrix */
static double t_gather(int64_t m, int64_t n, int64_t widest, double flops)
{
    return flops / 100e9 + 2.0 * (double)(n - widest) * (double)m * 2 / 1e9;
}
static double t_sharded(int64_t m, int members, double block_flops)
{
    return 5 * block_flops / 100e9 + 5 * 4.0 * 2.0 * (members - 1) / members * m * m / 1e9;
}

TEST(auto_prices_the_widest_holder_not_an_even_share)
{
    /* 256 x 512 along its columns, one member holding 506 of them: the even share (128 columns)
     * made sharded look 30% cheaper; the widest holder iterates almost the whole matrix and its
     * all-reduces cost more than moving 6 columns */
    static struct plan_box b[4];
    const int64_t w[4] = {506, 2, 2, 2};
    struct ns_strategy_in in = wide_in(b, 256, 512, w, 4);
    const double tg = t_gather(256, 512, 506, 5 * plan_ns_cost(256, 512));
    const double ts = t_sharded(256, 4, plan_ns_block_cost(256, 506, 1));
    EXPECT_TRUE(ts > tg); /* the case's premise, by the model's own terms */
    EXPECT_EQ_INT(ns_strategy_choose(&in, NS_MODE_AUTO), 0);
    EXPECT_EQ_INT(ns_strategy_choose(&in, NS_MODE_SHARDED), 1); /* still eligible */
}

TEST(auto_prices_a_narrow_block_without_its_a_squared)
{
    /* 256 x 256 in two halves of 128 columns: each holder updates its block without A^2 (6m^2n,
     * runtime/step/ns_sharded.c counts the same), a third less than 4m^2n + 2m^3: sharded pays */
    static struct plan_box b[2];
    const int64_t w[2] = {128, 128};
    struct ns_strategy_in in = wide_in(b, 256, 256, w, 2);
    const double tg = t_gather(256, 256, 128, 5 * plan_ns_cost(256, 256));
    EXPECT_TRUE(t_sharded(256, 2, 6.0 * 256 * 256 * 128) < tg);
    /* the count of before: 4m^2n / holders + 2m^3 and 2m^2 fp32 elements a step, over gather */
    EXPECT_TRUE(5 * (4.0 * 256 * 256 * 128 + 2.0 * 256 * 256 * 256) / 100e9 +
                    5 * 8.0 * 256 * 256 / 1e9 >
                tg);
    EXPECT_EQ_INT(ns_strategy_choose(&in, NS_MODE_AUTO), 1);
}

TEST(auto_prices_the_gathered_kernels_symmetric_products)
{
    /* the same matrix gathered by a kernel forming X X^T and A A as their upper halves (the CPU's
     * symmetric variant, ssyrk): 2m^2(m + 1) + 2m^3 per step instead of 6m^3, now under the
     * sharded time: gather. Whole products (blocks NULL): sharded, as above */
    static struct plan_box b[2];
    const int64_t w[2] = {128, 128};
    struct ns_strategy_in in = wide_in(b, 256, 256, w, 2);
    const struct plan_ns_blocks syrk = {1, 1, 0};
    in.blocks = &syrk;
    const double f = plan_ns_flops_blocked(256, 256, 5, 0, 0u, &syrk);
    EXPECT_NEAR(f, 5 * (2.0 * 256 * (256 * 257 / 2) * 2 + 2.0 * 256 * 256 * 256), 0.0);
    EXPECT_TRUE(t_gather(256, 256, 128, f) < t_sharded(256, 2, 6.0 * 256 * 256 * 128));
    EXPECT_EQ_INT(ns_strategy_choose(&in, NS_MODE_AUTO), 0);
    in.blocks = NULL;
    EXPECT_EQ_INT(ns_strategy_choose(&in, NS_MODE_AUTO), 1);
}

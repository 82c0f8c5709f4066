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

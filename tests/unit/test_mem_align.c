/* base/mem.h's mem_align_up, the one rounding of sizes and offsets to an alignment (the state
 * store's slices, the staging slots' second segment, ckpt_weights' staging, param_stats' copy):
 * exact multiples stay, everything else goes up to the next one, and a size whose multiple is
 * past SIZE_MAX is reported, not wrapped to a small one (a hand-written (x + 63) & ~63 gives 0
 * for SIZE_MAX - 62: an allocation sized with it is written past). */
#include <stdint.h>

#include "base/mem.h"
#include "test.h"

TEST(mem_align_up_rounds_to_the_next_multiple)
{
    size_t out = 12345;
    ASSERT_EQ_INT(mem_align_up(0, 64, &out), 1);
    EXPECT_TRUE(out == 0);
    ASSERT_EQ_INT(mem_align_up(1, 64, &out), 1);
    EXPECT_TRUE(out == 64);
    ASSERT_EQ_INT(mem_align_up(63, 64, &out), 1);
    EXPECT_TRUE(out == 64);
    ASSERT_EQ_INT(mem_align_up(64, 64, &out), 1);
    EXPECT_TRUE(out == 64);
    ASSERT_EQ_INT(mem_align_up(65, 64, &out), 1);
    EXPECT_TRUE(out == 128);
    /* a bf16 tensor of odd length: the next fp32 one starts at a 64-byte boundary */
    ASSERT_EQ_INT(mem_align_up(2 * 7, 64, &out), 1);
    EXPECT_TRUE(out == 64);
    ASSERT_EQ_INT(mem_align_up(5, 1, &out), 1);
    EXPECT_TRUE(out == 5);
    ASSERT_EQ_INT(mem_align_up(257, 256, &out), 1);
    EXPECT_TRUE(out == 512);
}

TEST(mem_align_up_reports_overflow_near_size_max)
{
    const size_t top = SIZE_MAX - 63; /* the largest multiple of 64 */
    size_t out = 7;
    ASSERT_EQ_INT(mem_align_up(top, 64, &out), 1);
    EXPECT_TRUE(out == top);
    ASSERT_EQ_INT(mem_align_up(top - 1, 64, &out), 1);
    EXPECT_TRUE(out == top);
    /* past the last multiple: no size_t holds the result; *out stays as it was */
    out = 7;
    EXPECT_EQ_INT(mem_align_up(top + 1, 64, &out), 0);
    EXPECT_EQ_INT(mem_align_up(SIZE_MAX - 62, 64, &out), 0);
    EXPECT_EQ_INT(mem_align_up(SIZE_MAX, 64, &out), 0);
    EXPECT_TRUE(out == 7);
    /* align 1 never overflows */
    ASSERT_EQ_INT(mem_align_up(SIZE_MAX, 1, &out), 1);
    EXPECT_TRUE(out == SIZE_MAX);
}

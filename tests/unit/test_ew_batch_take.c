/* kernels/cuda/ew_batch_take.h, how the CUDA backend's batched elementwise kernels split a
 * *_many call into launches: every non-empty entry exactly once, in order, launches full but the
 * last, empty entries skipped wherever they are (also where a launch would end). Plain C: it runs
 * without a GPU, in every build. The loop it replaced restarted each launch at j0 + 48, so an
 * empty entry among the first 48 made the next launch apply entries a second time. */
#include <stdint.h>

#include "kernels/cuda/ew_batch_take.h"
#include "test.h"

struct entry { /* as the *_args structs: n first */
    size_t n;
    double pad[3];
};

/* count entries, entry i empty when empty(i); launches of at most max */
static void check(int count, int max, int every)
{
    static struct entry e[1000];
    int seen[1000] = {0}, take[64], launches = 0, last = -1, nonempty = 0;
    for (int i = 0; i < count; i++) {
        e[i].n = every > 0 && i % every == 0 ? 0 : (size_t)(1 + i % 5);
        nonempty += e[i].n > 0;
    }
    int taken = 0;
    for (int j = 0; j < count;) {
        const int k = ew_batch_take(&e[0].n, sizeof e[0], count, &j, max, take);
        EXPECT_TRUE(k <= max);
        for (int t = 0; t < k; t++) {
            EXPECT_TRUE(take[t] > last); /* in order, never again */
            EXPECT_TRUE(e[take[t]].n > 0);
            last = take[t];
            seen[take[t]]++;
        }
        taken += k;
        if (k > 0)
            launches++;
        if (j < count) /* not the last launch: a full one */
            EXPECT_EQ_INT(k, max);
    }
    int twice = 0;
    for (int i = 0; i < count; i++)
        twice += seen[i] > 1;
    EXPECT_EQ_INT(twice, 0);
    EXPECT_EQ_INT(taken, nonempty);
    EXPECT_EQ_INT(launches, (nonempty + max - 1) / max);
}

TEST(every_nonempty_entry_goes_into_exactly_one_launch)
{
    check(110, 48, 7);  /* empties throughout */
    check(110, 48, 0);  /* none empty */
    check(96, 48, 48);  /* an empty entry where a launch would end */
    check(1000, 48, 2); /* half empty */
    check(5, 48, 1);    /* all empty: no launch */
    check(0, 48, 0);
}

/* A checkpoint directory's housekeeping on its own (runtime/checkpoint/checkpoint_dir.c): which
 * entries keep_last counts as step directories and in what order it prunes them. */
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fixture.h"
#include "runtime/checkpoint/checkpoint_dir.h"
#include "test.h"

static int exists(const char *dir, const char *name)
{
    char p[512];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &st) == 0;
}

/* From step 1e8 a save names its directory with 9 digits (step-%08llu). Such names used to be
 * no step directory to keep_last: never counted, never pruned (the disk filled), while older
 * 8-digit ones were pruned against them, in name order ("step-99999999" above
 * "step-100000000"). Now every name a save gives counts, in step order; others are left. */
TEST(keep_last_counts_and_orders_steps_past_eight_digits)
{
    char dir[64] = "/tmp/shardopt_ckpt_dir_XXXXXX"; /* unique: never a fixed name */
    ASSERT_TRUE(mkdtemp(dir) != NULL);
    static const char *const made[] = {
        "step-00000001",
        "step-00000007",
        "step-99999999",
        "step-100000000",
        "step-100000001",
        "step-100000002",           /* the one just published */
        "step-0100000000",          /* 9+ digits with a leading zero: no save's name */
        "step-12",                  /* too short: no save's name */
        "step-1000000000000000000", /* 19 digits: past any step a checkpoint holds */
    };
    const int nmade = (int)(sizeof made / sizeof made[0]);
    for (int i = 0; i < nmade; i++) {
        char p[512];
        snprintf(p, sizeof p, "%s/%s", dir, made[i]);
        ASSERT_TRUE(mkdir(p, 0755) == 0);
    }
    const int dfd = open(dir, O_RDONLY | O_DIRECTORY);
    ASSERT_TRUE(dfd >= 0);
    ckpt_dir_steps_prune(dfd, dir, 2, "step-100000002");
    close(dfd);
    /* kept: the published step and the highest other */
    EXPECT_TRUE(exists(dir, "step-100000002"));
    EXPECT_TRUE(exists(dir, "step-100000001"));
    /* pruned: the lower steps, 8 digits or 9 */
    EXPECT_TRUE(!exists(dir, "step-100000000"));
    EXPECT_TRUE(!exists(dir, "step-99999999"));
    EXPECT_TRUE(!exists(dir, "step-00000007"));
    EXPECT_TRUE(!exists(dir, "step-00000001"));
    /* not a save's names: left */
    EXPECT_TRUE(exists(dir, "step-0100000000"));
    EXPECT_TRUE(exists(dir, "step-12"));
    EXPECT_TRUE(exists(dir, "step-1000000000000000000"));
    fixture_rmtree(dir);
}

/* Resharding runs: copying every saved shard's runs into every destination shard rebuilds the
 * tensor exactly, whatever the two layouts; runs are as long as both layouts allow. */
#include "sharding/reshard.h"
#include "test.h"

static void split(struct plan_box *b, int parts, int i, const int64_t shape[3], int dim)
{
    for (int d = 0; d < 3; d++) {
        b->lo[d] = 0;
        b->len[d] = shape[d];
    }
    int64_t c = (shape[dim] + parts - 1) / parts;
    b->lo[dim] = c * i < shape[dim] ? c * i : shape[dim];
    b->len[dim] = b->lo[dim] + c < shape[dim] ? c : shape[dim] - b->lo[dim];
}

TEST(any_layout_to_any_layout_is_exact)
{
    const int64_t shape[3] = {6, 10, 7};
    const int64_t n = shape[0] * shape[1] * shape[2];
    int checked = 0;
    /* (parts, dim) of the saved and the loading layout */
    for (int sp = 1; sp <= 4; sp++)
        for (int sd = 0; sd < 3; sd++)
            for (int dp = 1; dp <= 5; dp++)
                for (int dd = 0; dd < 3; dd++) {
                    float *dst_all = calloc((size_t)n, sizeof(float));
                    long bad = 0;
                    for (int j = 0; j < dp; j++) {
                        struct plan_box db;
                        split(&db, dp, j, shape, dd);
                        int64_t dn = db.len[0] * db.len[1] * db.len[2];
                        float *dst = calloc((size_t)dn + 1, sizeof(float));
                        for (int i = 0; i < sp; i++) {
                            struct plan_box sb;
                            struct reshard_runs r;
                            split(&sb, sp, i, shape, sd);
                            if (!reshard_runs_init(&r, &sb, &db))
                                continue;
                            int64_t so, doff, len;
                            while (reshard_runs_next(&r, &so, &doff, &len))
                                for (int64_t e = 0; e < len; e++) {
                                    /* the saved value is its global index, recomputed from sb */
                                    int64_t s = so + e;
                                    int64_t c2 = sb.lo[2] + s % sb.len[2];
                                    int64_t c1 = sb.lo[1] + (s / sb.len[2]) % sb.len[1];
                                    int64_t c0 = sb.lo[0] + s / (sb.len[2] * sb.len[1]);
                                    dst[doff + e] = (float)((c0 * shape[1] + c1) * shape[2] + c2);
                                }
                        }
                        for (int64_t e = 0; e < dn; e++) {
                            int64_t c2 = db.lo[2] + e % db.len[2];
                            int64_t c1 = db.lo[1] + (e / db.len[2]) % db.len[1];
                            int64_t c0 = db.lo[0] + e / (db.len[2] * db.len[1]);
                            int64_t g = (c0 * shape[1] + c1) * shape[2] + c2;
                            bad += dst[e] != (float)g;
                            dst_all[g] += 1;
                        }
                        free(dst);
                    }
                    for (int64_t g = 0; g < n; g++)
                        bad += dst_all[g] != 1.0f;
                    EXPECT_EQ_INT(bad, 0);
                    free(dst_all);
                    checked++;
                }
    EXPECT_EQ_INT(checked, 4 * 3 * 5 * 3);
}

TEST(same_layout_is_one_run)
{
    const int64_t shape[3] = {8, 12, 16};
    struct plan_box b;
    struct reshard_runs r;
    int64_t so, d, len;
    split(&b, 4, 1, shape, 0);
    ASSERT_TRUE(reshard_runs_init(&r, &b, &b));
    ASSERT_TRUE(reshard_runs_next(&r, &so, &d, &len));
    EXPECT_EQ_INT(len, 2 * 12 * 16);
    EXPECT_EQ_INT(so, 0);
    EXPECT_EQ_INT(reshard_runs_next(&r, &so, &d, &len), 0);
    /* a column shard into the whole tensor: one run per row */
    struct plan_box whole;
    split(&whole, 1, 0, shape, 0);
    split(&b, 4, 1, shape, 2);
    ASSERT_TRUE(reshard_runs_init(&r, &b, &whole));
    int runs = 0;
    while (reshard_runs_next(&r, &so, &d, &len)) {
        runs++;
        EXPECT_EQ_INT(len, 4);
    }
    EXPECT_EQ_INT(runs, 8 * 12);
}

/* The planner from two threads at once: two runtimes committing in two threads (each its own
 * communicators) plan at the same time, and each must get the plan it gets alone. The planner's
 * sorts pass their matrices to qsort's comparator through a file-level pointer (qsort has no
 * context argument in C11); before it was per thread, the other thread's commit could replace
 * it mid-sort: owners from another plan's costs, or a read past the end of the shorter array. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sharding/plan.h"
#include "sharding/plan_union.h"
#include "test.h"

enum { N = 3000, MEMBERS = 16, ROUNDS = 60, NP = 48, PM = 4 };

/* run(a) and run(b) in two threads at once: 0 once both returned, -1 when one could not start */
static int side_by_side(void *(*run)(void *), void *a, void *b)
{
    pthread_t ta, tb;
    if (pthread_create(&ta, NULL, run, a) != 0)
        return -1;
    const int rc = pthread_create(&tb, NULL, run, b);
    pthread_join(ta, NULL);
    if (rc != 0)
        return -1;
    pthread_join(tb, NULL);
    return 0;
}

struct union_job {
    double cost[N];
    int group[N];
    int want[N];
    int bad; /* rounds whose owners differed from the plan made alone */
};

static void union_owners(struct union_job *j, int *owner)
{
    double load[MEMBERS];
    if (plan_union_owners(j->cost, j->group, N, MEMBERS, NULL, 1, NULL, owner, load) != 0)
        owner[0] = -2;
}

static void *union_run(void *arg)
{
    struct union_job *j = arg;
    int *owner = malloc(sizeof(int) * N);
    for (int r = 0; owner != NULL && r < ROUNDS; r++) {
        union_owners(j, owner);
        j->bad += memcmp(owner, j->want, sizeof(int) * N) != 0;
    }
    if (owner == NULL)
        j->bad = -1;
    free(owner);
    return NULL;
}

/* Two cost lists whose LPT orders differ everywhere: one rising, one falling, both with every
 * cost distinct, so any cost read from the other list moves owners. */
TEST(lpt_over_the_union_in_two_threads_gives_each_its_own_plan)
{
    static struct union_job a, b;
    for (int m = 0; m < N; m++) {
        a.cost[m] = 1.0 + m;
        b.cost[m] = 1.0 + 0.5 * (N - m) + (m % 7) * 1e-3;
        a.group[m] = b.group[m] = -1;
    }
    union_owners(&a, a.want);
    union_owners(&b, b.want);
    ASSERT_TRUE(a.want[0] >= 0 && b.want[0] >= 0);
    ASSERT_EQ_INT(side_by_side(union_run, &a, &b), 0);
    EXPECT_EQ_INT(a.bad, 0);
    EXPECT_EQ_INT(b.bad, 0);
}

struct build_job {
    struct plan_param ps[NP];
    struct plan_box bx[NP][PM];
    int want[NP];
    int bad;
};

/* NP matrices of distinct heights, each sharded by rows over PM members (no member holds one
 * whole, so every owner comes from the LPT sort); tall: the heights of the other job. */
static void build_make(struct build_job *j, int tall)
{
    for (int p = 0; p < NP; p++) {
        const int64_t rows = tall ? 64 + 8 * p : 16 + 4 * (NP - p), cols = 32;
        j->ps[p] = (struct plan_param){
            .param = p, .ndim = 2, .shape = {rows, cols, 1}, .k_lo = 0, .k_count = 1};
        for (int i = 0; i < PM; i++) {
            const int64_t c = (rows + PM - 1) / PM, lo = c * i < rows ? c * i : rows;
            j->bx[p][i] = (struct plan_box){.lo = {lo, 0, 0},
                                            .len = {lo + c < rows ? c : rows - lo, cols, 1}};
        }
        j->ps[p].boxes = j->bx[p];
    }
}

static int build_owners(struct build_job *j, int *owner)
{
    struct plan_cfg cfg = {.members = PM, .me = 0, .bucket_bytes = 1 << 20, .esize = 4};
    struct group_plan P;
    if (plan_build(&cfg, j->ps, NP, &P) != SHARDOPT_OK)
        return -1;
    for (int m = 0; m < NP && m < P.nmatrices; m++)
        owner[m] = P.owner[m];
    const int n = P.nmatrices;
    plan_free(&P);
    return n == NP ? 0 : -1;
}

static void *build_run(void *arg)
{
    struct build_job *j = arg;
    int owner[NP];
    for (int r = 0; r < 40 * ROUNDS; r++)
        j->bad += build_owners(j, owner) != 0 || memcmp(owner, j->want, sizeof owner) != 0;
    return NULL;
}

TEST(the_group_planner_in_two_threads_gives_each_its_own_owners)
{
    static struct build_job a, b;
    build_make(&a, 1);
    build_make(&b, 0);
    ASSERT_EQ_INT(build_owners(&a, a.want), 0);
    ASSERT_EQ_INT(build_owners(&b, b.want), 0);
    ASSERT_EQ_INT(side_by_side(build_run, &a, &b), 0);
    EXPECT_EQ_INT(a.bad, 0);
    EXPECT_EQ_INT(b.bad, 0);
}

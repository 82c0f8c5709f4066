/* runtime/comm/comm_nccl.c, the CUDA backend's NCCL exchanges, compiled against a mock NCCL and
 * CUDA stream API over MPI (tests/mock): no GPU, no NCCL. NCCL refuses two ranks on one GPU and the
 * GPU machines lent to this project have one, so this is where the code's own logic runs: the
 * unique id's broadcast, all-to-all-v as grouped sends and receives with counts and
 * displacements, the in-place all-gather-v, several exchanges in flight on slots, two groups
 * sharing one stream, the Newton-Schulz teams' in-place fp32 all-reduces over communicators made
 * by their members alone, and the failure paths: a failed post aborts the communicator with
 * SHARDOPT_ERR_NCCL, a peer that never turns up or a rank stuck in NCCL becomes a timeout
 * (comm_timeout_s) with SHARDOPT_ERR_NCCL instead of a hang, an aborted communicator refuses later
 * exchanges, and an initialisation that fails on one rank is reported there. What it cannot check
 * is NCCL itself and the ordering on real streams (the mock streams execute nothing). 4 ranks. */
#include <mpi.h>
#include <stdint.h>

#include "base/status.h"
#include "cuda_runtime.h" /* tests/mock: the mock streams */
#include "runtime/comm/comm_nccl.h"
#include "runtime/comm/groups.h"
#include "test.h"
#include "tests/mock/nccl_mock.h"

#define ES   2 /* bytes per element: a bf16 exchange */
#define MAXN 8 /* elements to one peer at most */

static int me, world;

static void setup(void)
{
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
}

/* Elements world rank `from` sends to `to` in round r: 0 to 6, some zero; from round 100 on,
 * 1 to 6 (every member then waits for every other). */
static int count_of(int from, int to, int r)
{
    return r >= 100 ? 1 + (from * 3 + to * 5 + r) % 6 : (from * 3 + to * 5 + r) % 7;
}

static uint16_t value_of(int from, int to, int r, int k)
{
    return (uint16_t)(from * 4096 + to * 256 + r * 16 + k);
}

/* One exchange's buffers for this rank over a group whose member i is world rank ranks[i]. */
struct xfer {
    int sc[16], sd[16], rc[16], rd[16]; /* by member */
    int ns, nr;                         /* as the plan lists them: non-empty blocks only */
    int sp[16], lsc[16], lsd[16], rp[16], lrc[16], lrd[16];
    uint16_t sbuf[16 * (MAXN + 3)], rbuf[16 * (MAXN + 3)];
};

static void xfer_fill(struct xfer *x, const int *ranks, int n, int mine, int r)
{
    int so = 0, ro = 0;
    memset(x->rbuf, 0xee, sizeof x->rbuf);
    for (int i = 0; i < n; i++) {
        x->sc[i] = count_of(ranks[mine], ranks[i], r);
        x->rc[i] = count_of(ranks[i], ranks[mine], r);
        x->sd[i] = so;
        x->rd[i] = ro;
        for (int k = 0; k < x->sc[i]; k++)
            x->sbuf[so + k] = value_of(ranks[mine], ranks[i], r, k);
        so += x->sc[i] + 3; /* gaps: displacements, not packed counts */
        ro += x->rc[i] + 2;
    }
    x->ns = x->nr = 0;
    for (int i = 0; i < n; i++) { /* my own block stays listed: the exchange must skip it */
        if (x->sc[i] > 0) {
            x->sp[x->ns] = i;
            x->lsc[x->ns] = x->sc[i];
            x->lsd[x->ns++] = x->sd[i];
        }
        if (x->rc[i] > 0) {
            x->rp[x->nr] = i;
            x->lrc[x->nr] = x->rc[i];
            x->lrd[x->nr++] = x->rd[i];
        }
    }
}

static shardopt_status_t xfer_post(struct nccl_group *g, int slot, struct xfer *x)
{
    return nccl_group_exchange(g, slot, x->sbuf, x->ns, x->sp, x->lsc, x->lsd, x->rbuf, x->nr,
                               x->rp, x->lrc, x->lrd, ES);
}

/* Every block from another member arrived where rd says; my own block was not written. */
static int xfer_bad(const struct xfer *x, const int *ranks, int n, int mine, int r)
{
    int bad = 0;
    for (int i = 0; i < n; i++)
        for (int k = 0; k < x->rc[i]; k++) {
            const uint16_t want = i == mine ? 0xeeee : value_of(ranks[i], ranks[mine], r, k);
            bad += x->rbuf[x->rd[i] + k] != want;
        }
    return bad;
}

/* The world group and a pair group ({0,1}, {2,3}) sharing its stream. */
struct groups2 {
    struct nccl_group *all, *pair;
    MPI_Comm pair_comm;
    int pair_ranks[2];
    cudaStream_t compute;
};

/* The world as the runtime's groups, for the bootstrap's deadline and names (60 s: these tests
 * are about NCCL's own timeouts, not a member that never arrives, as hang_nccl_id_np2 is). */
static struct groups world_groups(void)
{
    struct groups v;
    groups_view(&v, MPI_COMM_WORLD, MPI_COMM_NULL, me, 60.0);
    return v;
}

static void groups2_make(struct groups2 *g, double timeout_s, double pair_timeout_s)
{
    const struct groups v = world_groups();
    ASSERT_EQ_INT(cudaStreamCreateWithFlags(&g->compute, 0), cudaSuccess);
    ASSERT_EQ_INT(
        nccl_group_create(&v, MPI_COMM_WORLD, g->compute, timeout_s, "dense", NULL, &g->all),
        SHARDOPT_OK);
    ASSERT_TRUE(g->all != NULL);
    MPI_Comm_split(MPI_COMM_WORLD, me / 2, me, &g->pair_comm);
    g->pair_ranks[0] = me / 2 * 2;
    g->pair_ranks[1] = me / 2 * 2 + 1;
    ASSERT_EQ_INT(nccl_group_create(&v, g->pair_comm, g->compute, pair_timeout_s, "expert shard",
                                    g->all, &g->pair),
                  SHARDOPT_OK);
    ASSERT_TRUE(g->pair != NULL);
}

static void groups2_free(struct groups2 *g)
{
    nccl_group_destroy(g->pair); /* the sharer first: the first group owns the stream */
    nccl_group_destroy(g->all);
    MPI_Comm_free(&g->pair_comm);
    cudaStreamDestroy(g->compute);
}

TEST(exchanges_move_every_block_to_its_displacement)
{
    setup();
    ASSERT_EQ_INT(world, 4);
    int all_ranks[4] = {0, 1, 2, 3};
    struct groups2 g;
    static struct xfer xa[3], xp[3];
    groups2_make(&g, 30.0, 30.0);
    const long before = nccl_mock_posted();
    for (int r = 0; r < 3; r++) { /* three exchanges in flight on each group before the wait */
        xfer_fill(&xa[r], all_ranks, 4, me, r);
        xfer_fill(&xp[r], g.pair_ranks, 2, me % 2, r + 10);
        EXPECT_EQ_INT(xfer_post(g.all, r, &xa[r]), SHARDOPT_OK);
        EXPECT_EQ_INT(xfer_post(g.pair, r + 3, &xp[r]), SHARDOPT_OK);
        EXPECT_EQ_INT(nccl_group_wait(g.all, r), SHARDOPT_OK);
        EXPECT_EQ_INT(nccl_group_wait(g.pair, r + 3), SHARDOPT_OK);
    }
    EXPECT_EQ_INT(nccl_group_drain(g.all), SHARDOPT_OK);
    EXPECT_EQ_INT(nccl_group_drain(g.pair), SHARDOPT_OK);
    for (int r = 0; r < 3; r++) {
        EXPECT_EQ_INT(xfer_bad(&xa[r], all_ranks, 4, me, r), 0);
        EXPECT_EQ_INT(xfer_bad(&xp[r], g.pair_ranks, 2, me % 2, r + 10), 0);
    }
    /* only non-empty blocks to and from the others were posted */
    long want = 0;
    for (int r = 0; r < 3; r++)
        for (int i = 0; i < 4; i++)
            if (i != me)
                want += (count_of(me, i, r) > 0) + (count_of(i, me, r) > 0);
    for (int r = 0; r < 3; r++) {
        const int peer = g.pair_ranks[1 - me % 2];
        want += (count_of(me, peer, r + 10) > 0) + (count_of(peer, me, r + 10) > 0);
    }
    EXPECT_EQ_INT((int)(nccl_mock_posted() - before), (int)want);
    groups2_free(&g);
}

/* replica_split's all-gather in place: each member's share (counts[i] at displs[i], gaps between,
 * member 0's empty) lands in every other member's buffer, mine is sent once to each other
 * member and nothing else is written. */
TEST(an_allgatherv_puts_every_share_at_its_displacement)
{
    setup();
    struct groups2 g;
    int counts[4], displs[4], o = 0;
    uint16_t buf[64];
    groups2_make(&g, 30.0, 30.0);
    for (int i = 0; i < 4; i++) {
        counts[i] = 2 * i;
        displs[i] = o;
        o += counts[i] + 3;
    }
    memset(buf, 0xee, sizeof buf);
    for (int k = 0; k < counts[me]; k++)
        buf[displs[me] + k] = value_of(me, me, 50, k);
    const long before = nccl_mock_posted();
    EXPECT_EQ_INT(nccl_group_allgatherv(g.all, 4, buf, counts, displs, ES), SHARDOPT_OK);
    EXPECT_EQ_INT(nccl_group_wait(g.all, 4), SHARDOPT_OK);
    EXPECT_EQ_INT(nccl_group_drain(g.all), SHARDOPT_OK);
    int bad = 0, at = 0;
    for (int i = 0; i < 4; i++) {
        for (; at < displs[i]; at++)
            bad += buf[at] != 0xeeee;
        for (int k = 0; k < counts[i]; k++, at++)
            bad += buf[at] != value_of(i, i, 50, k);
    }
    for (; at < (int)(sizeof buf / sizeof buf[0]); at++)
        bad += buf[at] != 0xeeee;
    EXPECT_EQ_INT(bad, 0);
    long want = 0; /* a receive per other member with a share, my share to each other member */
    for (int i = 0; i < 4; i++)
        if (i != me)
            want += (counts[i] > 0) + (counts[me] > 0);
    EXPECT_EQ_INT((int)(nccl_mock_posted() - before), (int)want);
    groups2_free(&g);
}

/* Newton-Schulz teams' communicators (commit_teams.c): made by their members alone, in one order
 * (team {1, 2, 3} first, rank 0 taking no part; then {0, 1}), on the first group's stream; each
 * all-reduce sums the members' floats in place (nccl_group_allreduce_f32), several in flight
 * before the drain. With the mock's old bootstrap (a split of the whole world per communicator)
 * the first team waited for rank 0 for ever. */
TEST(team_allreduces_sum_over_communicators_their_members_alone_made)
{
    setup();
    const struct groups v = world_groups();
    struct groups2 g;
    groups2_make(&g, 30.0, 30.0);
    MPI_Comm c3, c2;
    MPI_Comm_split(MPI_COMM_WORLD, me > 0 ? 0 : MPI_UNDEFINED, me, &c3);
    MPI_Comm_split(MPI_COMM_WORLD, me < 2 ? 0 : MPI_UNDEFINED, me, &c2);
    struct nccl_group *t3 = NULL, *t2 = NULL;
    if (c3 != MPI_COMM_NULL)
        EXPECT_EQ_INT(nccl_group_create(&v, c3, g.compute, 30.0, "team 0", g.all, &t3),
                      SHARDOPT_OK);
    if (c2 != MPI_COMM_NULL)
        EXPECT_EQ_INT(nccl_group_create(&v, c2, g.compute, 30.0, "team 1", g.all, &t2),
                      SHARDOPT_OK);
    EXPECT_TRUE((t3 != NULL) == (me > 0) && (t2 != NULL) == (me < 2));
    float a[2][5], b[5];
    const long before = nccl_mock_allreduces();
    for (int r = 0; r < 2 && t3 != NULL; r++) {
        for (int k = 0; k < 5; k++)
            a[r][k] = (float)(me * 10 + k + r * 100);
        EXPECT_EQ_INT(nccl_group_allreduce_f32(t3, a[r], 5), SHARDOPT_OK);
    }
    for (int k = 0; k < 5 && t2 != NULL; k++)
        b[k] = 0.5f * (float)(me + k);
    if (t2 != NULL)
        EXPECT_EQ_INT(nccl_group_allreduce_f32(t2, b, 5), SHARDOPT_OK);
    EXPECT_EQ_INT(nccl_group_drain(g.all), SHARDOPT_OK); /* the one stream: every team's too */
    int bad = 0;
    for (int r = 0; r < 2 && t3 != NULL; r++)
        for (int k = 0; k < 5; k++) /* ranks 1, 2 and 3 */
            bad += a[r][k] != (float)(60 + 3 * (k + r * 100));
    for (int k = 0; k < 5 && t2 != NULL; k++) /* ranks 0 and 1 */
        bad += b[k] != 0.5f * (float)(1 + 2 * k);
    EXPECT_EQ_INT(bad, 0);
    EXPECT_EQ_INT((int)(nccl_mock_allreduces() - before), 2 * (t3 != NULL) + (t2 != NULL));
    nccl_group_destroy(t2); /* sharers first */
    nccl_group_destroy(t3);
    if (c2 != MPI_COMM_NULL)
        MPI_Comm_free(&c2);
    if (c3 != MPI_COMM_NULL)
        MPI_Comm_free(&c3);
    groups2_free(&g);
}

/* A drain that polls while the exchanges are still in flight (ranks 1-3 post 0.3 s after rank
 * 0) leaves no "not ready" behind as the thread's last error: CUDA keeps it there, and the
 * step's end (kernel_ops.stream_end) reads the last error as a failed launch, so every NCCL
 * step would fail with ERR_DEVICE. Then, aborted, the group refuses a drain and a wait without
 * reaching the communicator NCCL has freed (a step after a failed one drains with nothing
 * posted). */
TEST(a_polling_drain_leaves_no_error_and_an_aborted_group_is_not_touched)
{
    setup();
    int all_ranks[4] = {0, 1, 2, 3};
    struct groups2 g;
    static struct xfer x;
    groups2_make(&g, 30.0, 30.0);
    (void)cudaGetLastError();
    for (const double t0 = MPI_Wtime(); me != 0 && MPI_Wtime() - t0 < 0.3;)
        ;
    xfer_fill(&x, all_ranks, 4, me, 7);
    const long polls = nccl_mock_not_ready();
    EXPECT_EQ_INT(xfer_post(g.all, 0, &x), SHARDOPT_OK);
    EXPECT_EQ_INT(nccl_group_drain(g.all), SHARDOPT_OK);
    if (me == 0)
        EXPECT_TRUE(nccl_mock_not_ready() > polls); /* it did poll an unfinished exchange */
    EXPECT_EQ_INT((int)cudaGetLastError(), (int)cudaSuccess);
    EXPECT_EQ_INT(xfer_bad(&x, all_ranks, 4, me, 7), 0);
    /* a launch of the step that failed before the drain is reported, not polled over */
    nccl_mock_fail_launch();
    EXPECT_EQ_INT(nccl_group_drain(g.all), SHARDOPT_ERR_DEVICE);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "a launch of the step failed");
    (void)cudaGetLastError();

    const long touched = nccl_mock_after_abort();
    nccl_group_abort(g.all);
    EXPECT_EQ_INT(nccl_group_aborted(g.all), 1);
    EXPECT_EQ_INT(nccl_group_drain(g.all), SHARDOPT_ERR_NCCL);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "communicator was aborted earlier");
    EXPECT_EQ_INT(nccl_group_wait(g.all, 0), SHARDOPT_ERR_NCCL);
    EXPECT_EQ_INT((int)(nccl_mock_after_abort() - touched), 0);
    groups2_free(&g);
}

/* Rank 3's post fails: it aborts its communicator with ERR_NCCL there; the others' exchanges
 * wait for rank 3's blocks, so their drain ends at comm_timeout_s with ERR_NCCL and an abort;
 * every later exchange on the group is refused. */
TEST(a_failed_post_aborts_and_the_peers_time_out)
{
    setup();
    int all_ranks[4] = {0, 1, 2, 3};
    struct groups2 g;
    static struct xfer x;
    /* the pair group waits longer: its peer may still be timing out on the other group */
    groups2_make(&g, 1.0, 60.0);
    const int aborted0 = nccl_mock_aborted();
    xfer_fill(&x, all_ranks, 4, me, 100);
    if (me == 3)
        nccl_mock_inject(NCCL_MOCK_FAIL_GROUP);
    shardopt_status_t st = xfer_post(g.all, 0, &x);
    if (me == 3) {
        EXPECT_EQ_INT(st, SHARDOPT_ERR_NCCL);
        EXPECT_STR_CONTAINS(shardopt_last_error(), "NCCL dense group (rank 3 of 4): posting an "
                                                   "exchange: unhandled system error");
        EXPECT_STR_CONTAINS(shardopt_last_error(), "communicator aborted");
    } else {
        EXPECT_EQ_INT(st, SHARDOPT_OK);
        EXPECT_EQ_INT(nccl_group_drain(g.all), SHARDOPT_ERR_NCCL);
        EXPECT_STR_CONTAINS(shardopt_last_error(),
                            "waiting for the step's exchanges: timed out (comm_timeout_s)");
    }
    EXPECT_EQ_INT(nccl_mock_aborted() - aborted0, 1);
    EXPECT_EQ_INT(xfer_post(g.all, 1, &x), SHARDOPT_ERR_NCCL);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "communicator was aborted earlier");
    /* the pair group is untouched: {0,1} and {2,3} still exchange */
    static struct xfer xp;
    xfer_fill(&xp, g.pair_ranks, 2, me % 2, 5);
    EXPECT_EQ_INT(xfer_post(g.pair, 0, &xp), SHARDOPT_OK);
    EXPECT_EQ_INT(nccl_group_drain(g.pair), SHARDOPT_OK);
    EXPECT_EQ_INT(xfer_bad(&xp, g.pair_ranks, 2, me % 2, 5), 0);
    groups2_free(&g);
}

/* Rank 1 is stuck inside NCCL (its communicator never settles): its own wait ends at
 * comm_timeout_s with ERR_NCCL, and so do the others', whose blocks from rank 1 never come. */
TEST(a_stuck_rank_becomes_a_timeout_on_every_rank_not_a_hang)
{
    setup();
    int all_ranks[4] = {0, 1, 2, 3};
    struct groups2 g;
    static struct xfer x;
    groups2_make(&g, 1.0, 1.0);
    xfer_fill(&x, all_ranks, 4, me, 101);
    if (me == 1)
        nccl_mock_inject(NCCL_MOCK_STUCK);
    shardopt_status_t st = xfer_post(g.all, 2, &x);
    if (st == SHARDOPT_OK)
        st = nccl_group_drain(g.all);
    EXPECT_EQ_INT(st, SHARDOPT_ERR_NCCL);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "timed out (comm_timeout_s); communicator aborted");
    if (me == 1)
        EXPECT_STR_CONTAINS(shardopt_last_error(), "posting an exchange");
    int all = st == SHARDOPT_ERR_NCCL;
    MPI_Allreduce(MPI_IN_PLACE, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    EXPECT_EQ_INT(all, 1);
    groups2_free(&g);
}

/* Initialisation that fails on rank 2 is reported there, naming the call; the runtime's
 * agreement (groups_agree) then fails init everywhere. */
TEST(an_init_failure_is_reported_on_its_rank)
{
    setup();
    cudaStream_t s;
    struct nccl_group *grp = NULL;
    ASSERT_EQ_INT(cudaStreamCreateWithFlags(&s, 0), cudaSuccess);
    if (me == 2)
        nccl_mock_inject(NCCL_MOCK_FAIL_INIT);
    const struct groups v = world_groups();
    shardopt_status_t st = nccl_group_create(&v, MPI_COMM_WORLD, s, 5.0, "replicate", NULL, &grp);
    if (me == 2) {
        EXPECT_EQ_INT(st, SHARDOPT_ERR_NCCL);
        EXPECT_TRUE(grp == NULL);
        EXPECT_STR_CONTAINS(shardopt_last_error(),
                            "NCCL replicate group (rank 2 of 4): ncclCommInitRankConfig");
    } else {
        EXPECT_EQ_INT(st, SHARDOPT_OK);
    }
    /* what init does next (rt_nccl_create): every rank gets rank 2's status and message */
    st = groups_agree_on(MPI_COMM_WORLD, MPI_COMM_NULL, me, st, "init", 5.0);
    EXPECT_EQ_INT(st, SHARDOPT_ERR_NCCL);
    if (me != 2)
        EXPECT_STR_CONTAINS(shardopt_last_error(), "init: rank 2: NCCL replicate group");
    nccl_group_destroy(grp);
    cudaStreamDestroy(s);
}

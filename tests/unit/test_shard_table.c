/* sharding/shard_table.c, without MPI: which slices are torch.chunk pieces, what the table keeps
 * for them (nothing per member) and for the others (a column of gathered slices), and that the
 * planner, reading members' slices computed from the layout, builds the very plan it builds from
 * every member's box spelt out (issue 22: commit must plan alike without the table). */
#include <string.h>

#include "sharding/shard_table.h"
#include "test.h"

#define MAXM 13

/* The layout member m of `members` registers, sliced as torch.chunk (shardopt_shard_range). */
static struct layout chunk_layout(int ndim, const int64_t *shape, int dim, int64_t win_lo,
                                  int64_t win_len, int members, int m)
{
    struct layout l;
    int64_t lo, len;
    layout_chunk(dim == 0 ? win_len : shape[dim], members, m, &lo, &len);
    EXPECT_EQ_INT(layout_init(&l, ndim, shape, dim, lo, len, win_lo, win_len), SHARDOPT_OK);
    return l;
}

TEST(chunk_pieces_are_recognised_and_nothing_else)
{
    const int64_t shape[3] = {37, 5, 1};
    for (int members = 1; members <= MAXM; members++)
        for (int m = 0; m < members; m++) {
            struct layout l = chunk_layout(2, shape, 0, 0, 37, members, m);
            EXPECT_EQ_INT(shard_table_is_chunk(&l, members, m), 1);
            /* the same slice is not member m + 1's piece unless both are empty at the end */
            if (m + 1 < members && l.len[0] > 0)
                EXPECT_EQ_INT(shard_table_is_chunk(&l, members, m + 1), 0);
        }
    /* an expert stack along dim 0: pieces count from the EP rank's window */
    const int64_t stack[3] = {8, 3, 4};
    struct layout e = chunk_layout(3, stack, 0, 4, 4, 2, 1);
    EXPECT_EQ_INT(e.lo[0], 6);
    EXPECT_EQ_INT(shard_table_is_chunk(&e, 2, 1), 1);
    struct layout skew;
    ASSERT_EQ_INT(layout_init(&skew, 3, stack, 0, 0, 3, 4, 4), SHARDOPT_OK); /* 3, 1: not 2, 2 */
    EXPECT_EQ_INT(shard_table_is_chunk(&skew, 2, 0), 0);
}

TEST(only_parameters_not_chunked_on_every_member_get_a_column)
{
    struct shard_table t;
    size_t bytes = 0;
    const unsigned char chunk[5] = {1, 0, 1, 1, 0};
    ASSERT_EQ_INT(shard_table_init(&t, 4096, 7, 5, chunk, &bytes), 0);
    EXPECT_EQ_INT(t.ncols, 2);
    EXPECT_EQ_INT(t.col[0], -1);
    EXPECT_EQ_INT(t.col[1], 0);
    EXPECT_EQ_INT(t.col[4], 1);
    EXPECT_TRUE(t.slices != NULL && t.ranks != NULL && t.xload == NULL);
    /* gathered: read back as written, [members][ncols] */
    t.slices[(size_t)9 * 2 + 1] = (struct plan_slice){3, 4};
    const int64_t shape[3] = {37, 5, 1};
    struct layout l = chunk_layout(2, shape, 0, 0, 37, 4096, 7);
    struct plan_slice s = shard_table_slice(&t, 4, &l, 9);
    EXPECT_TRUE(s.lo == 3 && s.len == 4);
    /* computed: member 3 of 4096 holds row 3; member 40 nothing, at the end */
    s = shard_table_slice(&t, 0, &l, 3);
    EXPECT_TRUE(s.lo == 3 && s.len == 1);
    s = shard_table_slice(&t, 0, &l, 40);
    EXPECT_TRUE(s.lo == 37 && s.len == 0);
    shard_table_free(&t);

    const unsigned char all[3] = {1, 1, 1};
    ASSERT_EQ_INT(shard_table_init(&t, 16384, 0, 3, all, &bytes), 0);
    EXPECT_EQ_INT(t.ncols, 0);
    EXPECT_TRUE(t.slices == NULL); /* nothing over the members at all */
    shard_table_free(&t);
}

static void expect_same_plan(const struct group_plan *P, const struct group_plan *Q)
{
    EXPECT_EQ_INT(Q->nmatrices, P->nmatrices);
    EXPECT_EQ_INT(Q->nbuckets, P->nbuckets);
    EXPECT_EQ_INT(Q->npieces, P->npieces);
    EXPECT_EQ_INT(Q->nowned, P->nowned);
    EXPECT_EQ_INT(Q->nincoming, P->nincoming);
    EXPECT_TRUE(Q->bytes_sent == P->bytes_sent && Q->bytes_recv == P->bytes_recv);
    EXPECT_TRUE(Q->max_a == P->max_a && Q->max_b == P->max_b && Q->max_ns == P->max_ns);
    if (Q->nmatrices != P->nmatrices || Q->npieces != P->npieces || Q->nowned != P->nowned ||
        Q->nincoming != P->nincoming || Q->nbuckets != P->nbuckets)
        return;
    EXPECT_TRUE(memcmp(Q->owner, P->owner, sizeof(int) * (size_t)P->nmatrices) == 0);
    EXPECT_TRUE(memcmp(Q->load, P->load, sizeof(double) * (size_t)P->members) == 0);
    for (int q = 0; q < P->npieces; q++) {
        const struct plan_piece *a = &P->pieces[q], *b = &Q->pieces[q];
        EXPECT_TRUE(a->param == b->param && a->k == b->k && a->local_off == b->local_off &&
                    a->count == b->count && a->direct == b->direct && a->buf == b->buf);
    }
    for (int q = 0; q < P->nowned; q++) {
        const struct plan_owned *a = &P->owned[q], *b = &Q->owned[q];
        EXPECT_TRUE(a->param == b->param && a->k == b->k && a->slot == b->slot &&
                    a->in_lo == b->in_lo && a->in_hi == b->in_hi);
    }
    for (int q = 0; q < P->nincoming; q++) {
        const struct plan_incoming *a = &P->incoming[q], *b = &Q->incoming[q];
        EXPECT_TRUE(a->src == b->src && a->r0 == b->r0 && a->r1 == b->r1 && a->c0 == b->c0 &&
                    a->c1 == b->c1 && a->buf == b->buf);
    }
    for (int k = 0; k < P->nbuckets; k++) {
        const struct plan_bucket *a = &P->buckets[k], *b = &Q->buckets[k];
        EXPECT_TRUE(a->a.n == b->a.n && a->b.n == b->b.n && a->a_elems == b->a_elems &&
                    a->b_elems == b->b_elems && a->ns_elems == b->ns_elems);
        if (a->a.n == b->a.n && a->a.n > 0)
            EXPECT_TRUE(memcmp(a->a.peer, b->a.peer, sizeof(int) * (size_t)a->a.n) == 0 &&
                        memcmp(a->a.count, b->a.count, sizeof(int) * (size_t)a->a.n) == 0 &&
                        memcmp(a->a.displ, b->a.displ, sizeof(int) * (size_t)a->a.n) == 0);
        if (a->b.n == b->b.n && a->b.n > 0)
            EXPECT_TRUE(memcmp(a->b.peer, b->b.peer, sizeof(int) * (size_t)a->b.n) == 0 &&
                        memcmp(a->b.count, b->b.count, sizeof(int) * (size_t)a->b.n) == 0 &&
                        memcmp(a->b.displ, b->b.displ, sizeof(int) * (size_t)a->b.n) == 0);
    }
}

/* Four parameters, torch.chunk on every member: a dense matrix by rows and one by columns, an
 * expert stack of one EP rank's window by experts (dim 0) and by rows; one more, sliced
 * otherwise, through a gathered column. For every member count, including more members than a
 * dim has rows (empty pieces), and every member as `me`, the plan from shard_table_plan_param
 * equals the plan from every member's box written out, field by field. */
TEST(plans_from_computed_slices_equal_plans_from_every_box)
{
    enum { NP = 5 };
    const struct {
        int ndim, dim;
        int64_t shape[3], win_lo, win_len;
    } P[NP] = {
        {2, 0, {37, 29, 1}, 0, 37}, {2, 1, {30, 50, 1}, 0, 30}, {3, 0, {12, 9, 10}, 4, 4},
        {3, 1, {12, 11, 6}, 8, 4},  {2, 0, {23, 17, 1}, 0, 23}, /* the last: skewed */
    };
    static struct plan_box boxes[NP][MAXM], tmpl[NP];
    static struct layout lay[NP][MAXM];
    static struct plan_param ref[NP], got[NP];
    for (int members = 1; members <= MAXM; members++) {
        for (int p = 0; p < NP; p++)
            for (int m = 0; m < members; m++) {
                if (p < NP - 1) {
                    lay[p][m] = chunk_layout(P[p].ndim, P[p].shape, P[p].dim, P[p].win_lo,
                                             P[p].win_len, members, m);
                } else { /* the chunk lengths in reverse member order */
                    int64_t lo = 0, x, len;
                    for (int j = 0; j < m; j++) {
                        layout_chunk(23, members, members - 1 - j, &x, &len);
                        lo += len;
                    }
                    layout_chunk(23, members, members - 1 - m, &x, &len);
                    ASSERT_EQ_INT(layout_init(&lay[p][m], 2, P[p].shape, 0, lo, len, 0, 23),
                                  SHARDOPT_OK);
                }
                memcpy(boxes[p][m].lo, lay[p][m].lo, sizeof boxes[p][m].lo);
                memcpy(boxes[p][m].len, lay[p][m].len, sizeof boxes[p][m].len);
            }
        for (int me = 0; me < members; me++) {
            unsigned char chunk[NP];
            struct shard_table t;
            size_t bytes;
            for (int p = 0; p < NP; p++) {
                chunk[p] = 1;
                for (int m = 0; m < members; m++)
                    chunk[p] &= (unsigned char)shard_table_is_chunk(&lay[p][m], members, m);
            }
            EXPECT_EQ_INT(chunk[0] && chunk[1] && chunk[2] && chunk[3], 1);
            ASSERT_EQ_INT(shard_table_init(&t, members, me, NP, chunk, &bytes), 0);
            for (int m = 0; m < members && t.ncols > 0; m++) /* what commit all-gathers */
                t.slices[(size_t)m * (size_t)t.ncols] =
                    (struct plan_slice){lay[NP - 1][m].lo[0], lay[NP - 1][m].len[0]};
            EXPECT_EQ_INT(t.ncols, members > 1); /* 23 rows: reversed pieces are never chunk's */
            for (int p = 0; p < NP; p++) {
                got[p] = (struct plan_param){.param = p};
                shard_table_plan_param(&t, p, &lay[p][me], &tmpl[p], &got[p]);
                ref[p] = (struct plan_param){.param = p,
                                             .ndim = P[p].ndim,
                                             .k_lo = P[p].ndim == 3 ? P[p].win_lo : 0,
                                             .k_count = P[p].ndim == 3 ? P[p].win_len : 1,
                                             .boxes = boxes[p]};
                memcpy(ref[p].shape, P[p].shape, sizeof ref[p].shape);
            }
            for (int bucket = 0; bucket < 2; bucket++) {
                struct plan_cfg cfg = {
                    .members = members, .me = me, .bucket_bytes = bucket ? 1500 : 0, .esize = 2};
                struct group_plan A, B;
                ASSERT_EQ_INT(plan_build(&cfg, ref, NP, &A), SHARDOPT_OK);
                ASSERT_EQ_INT(plan_build(&cfg, got, NP, &B), SHARDOPT_OK);
                expect_same_plan(&A, &B);
                plan_free(&A);
                plan_free(&B);
            }
            shard_table_free(&t);
        }
    }
}

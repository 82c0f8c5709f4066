/* The exchange plan, without MPI: plans for every member of a group are executed against each
 * other in memory (pack, all-to-all by copying, unpack, and back), so a wrong offset anywhere
 * shows up as a wrong matrix. Then GLM-4.5-Air planned for 16 and 64 ranks: one owner per
 * matrix, owned NS FLOPs balanced within 1.05, and bytes per rank as the formula says.
 * One file, over 600 lines: every case, the owners' (joint load, moves, teams) as well as the
 * exchange's, is checked by the same in-memory execution (simulate) over boxes made by the same
 * builders; split, the halves would share all of that through a header. */
#include <limits.h>
#include <math.h>
#include <stdint.h>

#include "kernels/ns_shape.h"
#include "sharding/plan.h"
#include "test.h"

#define MAXM 16

/* Even split of n over parts, torch.chunk style: ceil-sized chunks, the last ones may be empty. */
static void chunk(int64_t n, int parts, int i, int64_t *lo, int64_t *len)
{
    int64_t c = (n + parts - 1) / parts;
    *lo = c * i < n ? c * i : n;
    *len = *lo + c < n ? c : n - *lo;
}

/* Boxes for a param sharded along `dim` over `members` (3-D: experts [k_lo, k_lo + kc) first). */
static void boxes_make(struct plan_box *b, int members, int ndim, const int64_t *shape, int dim,
                       int64_t k_lo, int64_t kc, int uneven)
{
    for (int i = 0; i < members; i++) {
        for (int d = 0; d < 3; d++) {
            b[i].lo[d] = 0;
            b[i].len[d] = d < ndim ? shape[d] : 1;
        }
        if (ndim == 3) {
            b[i].lo[0] = k_lo;
            b[i].len[0] = kc;
        }
        int64_t n = ndim == 3 && dim == 0 ? kc : shape[dim], lo, len;
        if (uneven) { /* 37 over 3 as 13, 12, 12 style, but skewed: first gets the most */
            int64_t base = n / members, extra = n % members;
            lo = i * base + (i < extra ? i : extra);
            len = base + (i < extra);
        } else {
            chunk(n, members, i, &lo, &len);
        }
        b[i].lo[dim] = (ndim == 3 && dim == 0 ? k_lo : 0) + lo;
        b[i].len[dim] = len;
    }
}

/* Global value of element (k, r, c) of param p: distinct everywhere. */
static float gval(int p, int64_t k, int64_t r, int64_t c)
{
    return (float)(p * 1000000 + k * 10000 + r * 100 + c);
}

/* Member i's box of pp, in whichever form pp gives it (sharding/plan.h). */
static struct plan_box box_at(const struct plan_param *pp, int i)
{
    const size_t at = (size_t)i * (pp->box_stride > 1 ? pp->box_stride : 1);
    if (pp->boxes != NULL)
        return pp->boxes[at];
    struct plan_box b = *pp->tmpl;
    b.lo[pp->slice_dim] = pp->slices[at].lo;
    b.len[pp->slice_dim] = pp->slices[at].len;
    return b;
}

/* Member i's block on list l: its displacement, *count its elements (0 when i is not listed). */
static int blk(const struct plan_blocks *l, int i, int *count)
{
    for (int j = 0; j < l->n; j++)
        if (l->peer[j] == i) {
            *count = l->count[j];
            return l->displ[j];
        }
    *count = 0;
    return 0;
}

/* A list as the step posts it: members in increasing order, each block non-empty, packed in
 * that order from 0. Returns the number of faults. */
static long list_bad(const struct plan_blocks *l, int members, size_t elems)
{
    long bad = 0;
    size_t at = 0;
    for (int j = 0; j < l->n; j++) {
        bad += l->peer[j] < 0 || l->peer[j] >= members || (j > 0 && l->peer[j] <= l->peer[j - 1]);
        bad += l->count[j] <= 0 || (size_t)l->displ[j] != at;
        at += (size_t)l->count[j];
    }
    return bad + (at != elems);
}

/* Run the plans of all members against each other and check every NS slot receives exactly its
 * matrix, and every holder gets its own rectangle back. Returns the number of wrong elements. */
static long simulate(const struct plan_cfg *base, const struct plan_param *params, int np)
{
    const int M = base->members;
    struct group_plan plans[MAXM];
    long bad = 0;

    memset(plans, 0, sizeof plans); /* GCC cannot tell M >= 1 here once simulate is inlined */

    for (int i = 0; i < M; i++) {
        struct plan_cfg c = *base;
        c.me = i;
        if (plan_build(&c, params, np, &plans[i]) != SHARDOPT_OK) {
            fprintf(stderr, "plan_build: %s\n", shardopt_last_error());
            return -1;
        }
    }
    /* the same owners on every member */
    for (int i = 1; i < M; i++)
        for (int m = 0; m < plans[0].nmatrices; m++)
            bad += plans[i].owner[m] != plans[0].owner[m];

    for (int i = 0; i < M; i++)
        for (int bk = 0; bk < plans[i].nbuckets; bk++) {
            const struct plan_bucket *b = &plans[i].buckets[bk];
            bad += list_bad(&b->a, M, b->a_elems) + list_bad(&b->b, M, b->b_elems);
        }
    for (int bk = 0; bk < plans[0].nbuckets; bk++) {
        float *A[MAXM], *B[MAXM], *NS[MAXM];
        for (int i = 0; i < M; i++) {
            const struct plan_bucket *b = &plans[i].buckets[bk];
            A[i] = calloc(b->a_elems + 1, sizeof(float));
            B[i] = calloc(b->b_elems + 1, sizeof(float));
            NS[i] = calloc(b->ns_elems + 1, sizeof(float));
            /* "momentum": my pieces' values, from my local shard's view of the global tensor */
            for (int q = b->piece_lo; q < b->piece_hi; q++) {
                const struct plan_piece *pc = &plans[i].pieces[q];
                const struct plan_param *pp = NULL;
                for (int p = 0; p < np; p++)
                    if (params[p].param == pc->param)
                        pp = &params[p];
                const struct plan_box bxv = box_at(pp, i), *bx = &bxv;
                const int rd = pp->ndim - 2;
                const int64_t mat = bx->len[rd] * bx->len[rd + 1];
                float *dst = pc->direct ? NS[i] : A[i];
                for (int64_t e = 0; e < pc->count; e++) {
                    /* a run of my shard: a team's row runs start inside the matrix */
                    const int64_t at = (pc->local_off + e) % mat;
                    int64_t r = bx->lo[rd] + at / bx->len[rd + 1];
                    int64_t c = bx->lo[rd + 1] + at % bx->len[rd + 1];
                    if (pc->direct)
                        dst[pc->buf + (size_t)(r * pp->shape[rd + 1] + c)] =
                            gval(pc->param, pc->k, r, c);
                    else
                        dst[pc->buf + (size_t)e] = gval(pc->param, pc->k, r, c);
                }
            }
        }
        /* exchange #1: A[i] block for owner o -> B[o] block from i */
        for (int i = 0; i < M; i++)
            for (int o = 0; o < M; o++) {
                const struct plan_bucket *bi = &plans[i].buckets[bk], *bo = &plans[o].buckets[bk];
                int ac, bc;
                const int ad = blk(&bi->a, o, &ac), bd = blk(&bo->b, i, &bc);
                bad += ac != bc;
                if (ac == bc)
                    memcpy(B[o] + bd, A[i] + ad, sizeof(float) * (size_t)ac);
            }
        /* unpack and check every owned matrix, then pack O = -U back */
        for (int o = 0; o < M; o++) {
            const struct plan_bucket *b = &plans[o].buckets[bk];
            for (int w = b->owned_lo; w < b->owned_hi; w++) {
                const struct plan_owned *ow = &plans[o].owned[w];
                for (int in = ow->in_lo; in < ow->in_hi; in++) {
                    const struct plan_incoming *pi = &plans[o].incoming[in];
                    size_t e = pi->buf;
                    for (int64_t r = pi->r0; r < pi->r1; r++)
                        for (int64_t c = pi->c0; c < pi->c1; c++)
                            NS[o][ow->slot + (size_t)(r * ow->cols + c)] = B[o][e++];
                }
                /* a team member's slot holds its block of the long side */
                int64_t lo = 0, hi = 0;
                if (ow->team > 1) {
                    const struct group_plan *P = &plans[o];
                    const int64_t *sh = NULL;
                    for (int p = 0; p < np; p++)
                        if (params[p].param == ow->param)
                            sh = &params[p].shape[params[p].ndim - 2];
                    bad += plan_team_block(sh[0], sh[1], sh[0] > sh[1], ow->team, ow->team_j, &lo,
                                           &hi) != ow->team_rows;
                    bad +=
                        P->team_of[(size_t)ow->mat * (size_t)P->team_cap + (size_t)ow->team_j] != o;
                }
                const int64_t dr = ow->team_rows ? lo : 0,
                              dc = ow->team > 1 && !ow->team_rows ? lo : 0;
                for (int64_t r = 0; r < ow->rows; r++)
                    for (int64_t c = 0; c < ow->cols; c++) {
                        float *v = &NS[o][ow->slot + (size_t)(r * ow->cols + c)];
                        bad += *v != gval(ow->param, ow->k, r + dr, c + dc);
                        *v = -*v;
                    }
                for (int in = ow->in_lo; in < ow->in_hi; in++) {
                    const struct plan_incoming *pi = &plans[o].incoming[in];
                    size_t e = pi->buf;
                    for (int64_t r = pi->r0; r < pi->r1; r++)
                        for (int64_t c = pi->c0; c < pi->c1; c++)
                            B[o][e++] = NS[o][ow->slot + (size_t)(r * ow->cols + c)];
                }
            }
        }
        /* exchange #2: B[o] block for holder i -> A[i] block from o; holders check -U */
        for (int i = 0; i < M; i++)
            for (int o = 0; o < M; o++) {
                const struct plan_bucket *bi = &plans[i].buckets[bk], *bo = &plans[o].buckets[bk];
                int ac, bc;
                const int ad = blk(&bi->a, o, &ac), bd = blk(&bo->b, i, &bc);
                memcpy(A[i] + ad, B[o] + bd, sizeof(float) * (size_t)bc);
            }
        for (int i = 0; i < M; i++) {
            const struct plan_bucket *b = &plans[i].buckets[bk];
            for (int q = b->piece_lo; q < b->piece_hi; q++) {
                const struct plan_piece *pc = &plans[i].pieces[q];
                const struct plan_param *pp = NULL;
                for (int p = 0; p < np; p++)
                    if (params[p].param == pc->param)
                        pp = &params[p];
                const struct plan_box bxv = box_at(pp, i), *bx = &bxv;
                const int rd = pp->ndim - 2;
                const int64_t mat = bx->len[rd] * bx->len[rd + 1];
                for (int64_t e = 0; e < pc->count; e++) {
                    const int64_t at = (pc->local_off + e) % mat;
                    int64_t r = bx->lo[rd] + at / bx->len[rd + 1];
                    int64_t c = bx->lo[rd + 1] + at % bx->len[rd + 1];
                    float got = pc->direct ? NS[i][pc->buf + (size_t)(r * pp->shape[rd + 1] + c)]
                                           : A[i][pc->buf + (size_t)e];
                    bad += got != -gval(pc->param, pc->k, r, c);
                }
            }
            free(A[i]);
            free(B[i]);
            free(NS[i]);
        }
    }
    for (int i = 0; i < M; i++)
        plan_free(&plans[i]);
    return bad;
}

TEST(every_layout_moves_every_element_to_its_owner_and_back)
{
    static struct plan_box bx[8][MAXM];
    const int64_t w[2] = {37, 29}, t[2] = {30, 50}, st[3] = {6, 12, 10};
    /* (members, shard dim of the 2-D params, shard dim of the stack, uneven, bucket bytes) */
    const int cases[][5] = {{1, 0, 0, 0, 1 << 20}, {3, 0, 1, 1, 1 << 20}, {3, 1, 2, 0, 64},
                            {4, 0, 0, 0, 1 << 20}, {5, 1, 1, 1, 2000},    {2, 0, 2, 0, 1}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int *c = cases[ci];
        const int M = c[0];
        struct plan_param ps[3] = {
            {.param = 0, .ndim = 2, .shape = {w[0], w[1], 1}, .k_lo = 0, .k_count = 1},
            {.param = 1, .ndim = 3, .shape = {st[0], st[1], st[2]}, .k_lo = 2, .k_count = 3},
            {.param = 4, .ndim = 2, .shape = {t[0], t[1], 1}, .k_lo = 0, .k_count = 1},
        };
        boxes_make(bx[0], M, 2, ps[0].shape, c[1], 0, 1, c[3]);
        boxes_make(bx[1], M, 3, ps[1].shape, c[2], 2, 3, c[3]);
        boxes_make(bx[2], M, 2, ps[2].shape, 1 - c[1], 0, 1, c[3]);
        for (int p = 0; p < 3; p++)
            ps[p].boxes = bx[p];
        struct plan_cfg cfg = {.members = M, .me = 0, .bucket_bytes = (size_t)c[4], .esize = 2};
        long bad = simulate(&cfg, ps, 3);
        EXPECT_EQ_INT(bad, 0);
    }
}

/* Commit hands the planner its shard table as gathered, [members][nparams], with box_stride
 * nparams instead of a copy per parameter, and the table holds each member's slice along the
 * shard dim only (the rest of the box is the same on every member): either way the plan is the
 * one of contiguous boxes, and it still delivers every element. */
TEST(boxes_read_in_place_from_a_strided_table_plan_alike)
{
    static struct plan_box bx[3][MAXM], table[MAXM * 3], tmpl[3];
    static struct plan_slice slices[MAXM * 3];
    const int sdim[3] = {0, 1, 1};
    const int M = 5;
    struct plan_param ps[3] = {
        {.param = 0, .ndim = 2, .shape = {37, 29, 1}, .k_lo = 0, .k_count = 1},
        {.param = 1, .ndim = 3, .shape = {6, 12, 10}, .k_lo = 2, .k_count = 3},
        {.param = 2, .ndim = 2, .shape = {30, 50, 1}, .k_lo = 0, .k_count = 1},
    };
    boxes_make(bx[0], M, 2, ps[0].shape, 0, 0, 1, 1);
    boxes_make(bx[1], M, 3, ps[1].shape, 1, 2, 3, 0);
    boxes_make(bx[2], M, 2, ps[2].shape, 1, 0, 1, 1);
    struct plan_param qs[3], rs[3];
    memcpy(qs, ps, sizeof qs);
    memcpy(rs, ps, sizeof rs);
    for (int p = 0; p < 3; p++) {
        ps[p].boxes = bx[p];
        tmpl[p] = bx[p][M - 1];
        for (int m = 0; m < M; m++) {
            table[m * 3 + p] = bx[p][m];
            slices[m * 3 + p] = (struct plan_slice){bx[p][m].lo[sdim[p]], bx[p][m].len[sdim[p]]};
        }
        qs[p].boxes = &table[p];
        qs[p].box_stride = 3;
        rs[p] = (struct plan_param){.param = ps[p].param,
                                    .ndim = ps[p].ndim,
                                    .k_lo = ps[p].k_lo,
                                    .k_count = ps[p].k_count,
                                    .tmpl = &tmpl[p],
                                    .slice_dim = sdim[p],
                                    .slices = &slices[p],
                                    .box_stride = 3};
        memcpy(rs[p].shape, ps[p].shape, sizeof rs[p].shape);
    }
    for (int me = 0; me < 2 * M; me++) {
        struct plan_cfg cfg = {.members = M, .me = me % M, .bucket_bytes = 2000, .esize = 2};
        struct group_plan P, Q;
        ASSERT_EQ_INT(plan_build(&cfg, ps, 3, &P), SHARDOPT_OK);
        ASSERT_EQ_INT(plan_build(&cfg, me < M ? qs : rs, 3, &Q), SHARDOPT_OK);
        EXPECT_EQ_INT(Q.nbuckets, P.nbuckets);
        EXPECT_EQ_INT(Q.npieces, P.npieces);
        EXPECT_EQ_INT(Q.nincoming, P.nincoming);
        EXPECT_TRUE(Q.bytes_sent == P.bytes_sent && Q.bytes_recv == P.bytes_recv);
        EXPECT_TRUE(memcmp(Q.owner, P.owner, sizeof(int) * (size_t)P.nmatrices) == 0);
        for (int q = 0; q < P.npieces && q < Q.npieces; q++) {
            const struct plan_piece *a = &P.pieces[q], *b = &Q.pieces[q];
            EXPECT_TRUE(a->param == b->param && a->k == b->k && a->local_off == b->local_off &&
                        a->count == b->count && a->direct == b->direct && a->buf == b->buf);
        }
        for (int q = 0; q < P.nincoming && q < Q.nincoming; q++) {
            const struct plan_incoming *a = &P.incoming[q], *b = &Q.incoming[q];
            EXPECT_TRUE(a->src == b->src && a->r0 == b->r0 && a->r1 == b->r1 && a->c0 == b->c0 &&
                        a->c1 == b->c1 && a->buf == b->buf);
        }
        plan_free(&P);
        plan_free(&Q);
    }
    struct plan_cfg all = {.members = M, .me = 0, .bucket_bytes = 2000, .esize = 2};
    EXPECT_EQ_INT(simulate(&all, qs, 3), 0);
    EXPECT_EQ_INT(simulate(&all, rs, 3), 0);
}

TEST(a_matrix_whole_on_a_member_stays_there)
{
    static struct plan_box bx[MAXM];
    struct plan_param p = {.param = 0, .ndim = 3, .shape = {8, 16, 32}, .k_lo = 0, .k_count = 8};
    boxes_make(bx, 4, 3, p.shape, 0, 0, 8, 0); /* experts along dim 0: two whole experts each */
    p.boxes = bx;
    for (int me = 0; me < 4; me++) {
        struct plan_cfg cfg = {.members = 4, .me = me, .bucket_bytes = 1 << 20, .esize = 2};
        struct group_plan P;
        ASSERT_EQ_INT(plan_build(&cfg, &p, 1, &P), SHARDOPT_OK);
        for (int m = 0; m < 8; m++)
            EXPECT_EQ_INT(P.owner[m], m / 2);
        EXPECT_EQ_INT(P.bytes_sent, 0);
        EXPECT_EQ_INT(P.bytes_recv, 0);
        EXPECT_EQ_INT(P.nowned, 2);
        for (int q = 0; q < P.npieces; q++)
            EXPECT_TRUE(P.pieces[q].direct);
        plan_free(&P);
    }
}

/* Joint planning: owners fill in around what each member already carries from its other group
 * (issue 22), and the exchange still delivers every element; all-zero base loads plan exactly
 * what no base load does. */
TEST(joint_owners_fill_in_around_the_other_groups_load)
{
    static struct plan_box bx[2][MAXM];
    struct plan_param ps[2] = {
        {.param = 0, .ndim = 2, .shape = {40, 24, 1}, .k_lo = 0, .k_count = 1},
        {.param = 1, .ndim = 3, .shape = {6, 16, 20}, .k_lo = 0, .k_count = 6},
    };
    boxes_make(bx[0], 4, 2, ps[0].shape, 0, 0, 1, 0);
    boxes_make(bx[1], 4, 3, ps[1].shape, 1, 0, 6, 0); /* rows: every matrix on every member */
    ps[0].boxes = bx[0];
    ps[1].boxes = bx[1];
    const double heavy = 1e12, zero[4] = {0, 0, 0, 0}, base[4] = {heavy, 0, heavy, 0};
    struct plan_cfg cfg = {.members = 4, .me = 0, .bucket_bytes = 1 << 20, .esize = 2};
    struct group_plan P0, Pz, Pb;
    ASSERT_EQ_INT(plan_build(&cfg, ps, 2, &P0), SHARDOPT_OK);
    cfg.base_load = zero;
    ASSERT_EQ_INT(plan_build(&cfg, ps, 2, &Pz), SHARDOPT_OK);
    cfg.base_load = base;
    ASSERT_EQ_INT(plan_build(&cfg, ps, 2, &Pb), SHARDOPT_OK);
    int spread = 0;
    for (int m = 0; m < P0.nmatrices; m++) {
        EXPECT_EQ_INT(Pz.owner[m], P0.owner[m]);
        EXPECT_TRUE(Pb.owner[m] == 1 || Pb.owner[m] == 3); /* never the loaded members */
        spread |= 1 << P0.owner[m];
    }
    EXPECT_EQ_INT(spread, 15); /* without a base load every member owns some */
    /* load: what each member owns, not the base */
    EXPECT_TRUE(Pb.load[0] == 0 && Pb.load[2] == 0 && Pb.load[1] > 0 && Pb.load[3] > 0);
    EXPECT_TRUE(Pb.work[0] == heavy && Pb.work[1] == Pb.load[1]);
    EXPECT_EQ_INT(simulate(&cfg, ps, 2), 0);
    plan_free(&P0);
    plan_free(&Pz);
    plan_free(&Pb);
}

/* Experts held whole by members 0 and 1 of 4 (2 and 3 hold none, as in an expert shard group
 * with more members than experts): with moves allowed and cheap, half go to the idle members and
 * the exchange carries them there and back; moves that cost more than they save, or a balanced
 * group, move nothing; move_cost 0 keeps every matrix on its holder. */
TEST(whole_matrices_move_to_idle_members_only_when_it_pays)
{
    static struct plan_box bx[MAXM], even[MAXM];
    struct plan_param p = {.param = 0, .ndim = 3, .shape = {8, 16, 32}, .k_lo = 0, .k_count = 8};
    boxes_make(bx, 2, 3, p.shape, 0, 0, 8, 0); /* 4 experts each on members 0 and 1 */
    for (int i = 2; i < 4; i++) {
        bx[i] = bx[1];
        bx[i].lo[0] = 8;
        bx[i].len[0] = 0;
    }
    p.boxes = bx;
    const double c = plan_ns_cost(16, 32);
    const double costs[4] = {0, c * 1e-6 / (16 * 32), c * 10.0 / (16 * 32), c * 1e-6 / (16 * 32)};
    for (int t = 0; t < 4; t++) {
        if (t == 3) { /* balanced: two experts each on four members */
            boxes_make(even, 4, 3, p.shape, 0, 0, 8, 0);
            p.boxes = even;
        }
        struct plan_cfg cfg = {
            .members = 4, .me = 0, .bucket_bytes = 1 << 20, .esize = 2, .move_cost = costs[t]};
        struct group_plan P;
        ASSERT_EQ_INT(plan_build(&cfg, &p, 1, &P), SHARDOPT_OK);
        int on_idle = 0;
        for (int m = 0; m < 8; m++)
            on_idle += P.owner[m] >= 2;
        EXPECT_EQ_INT(P.nmoved, t == 1 ? 4 : 0);
        EXPECT_EQ_INT(on_idle, t == 1 ? 4 : t == 3 ? 4 : 0); /* balanced: 2 and 3 hold theirs */
        if (t == 1)
            for (int i = 0; i < 4; i++)
                EXPECT_TRUE(P.load[i] == 2 * c);
        EXPECT_EQ_INT(simulate(&cfg, &p, 1), 0);
        plan_free(&P);
    }
}

/* The planner's finish (max over members of max(work, comm), as the moves pass weighs them) of
 * owners own[8] of the [8, 16, 32] stack with boxes bx on 4 members. */
static double whole_finish(const int *own, const struct plan_box *bx, const double *base, double c,
                           double mc, double bc)
{
    const double W = 16.0 * 32;
    double f = 0;
    for (int i = 0; i < 4; i++) {
        double work = base[i], sent = 0;
        for (int m = 0; m < 8; m++) {
            const double h = m >= bx[i].lo[0] && m < bx[i].lo[0] + bx[i].len[0] ? W : 0;
            work += own[m] == i ? c : 0.0;
            sent += own[m] == i ? W - h : h;
        }
        f = fmax(f, fmax(work, bc + mc * sent));
    }
    return f;
}

/* Identical experts held whole (all eight on member 0, or four each on members 0 and 1), over
 * other members' base loads, at several transfer costs: the moves pass's owners finish exactly
 * when the best of all 4^8 owner assignments does (docs/scaling.md's bounds on whole experts
 * rest on it: the plan keeps the integer best count on each holder). */
TEST(moves_of_identical_whole_matrices_reach_the_best_assignment)
{
    static struct plan_box bx[MAXM];
    struct plan_param p = {.param = 0, .ndim = 3, .shape = {8, 16, 32}, .k_lo = 0, .k_count = 8};
    const double c = plan_ns_cost(16, 32), W = 16.0 * 32;
    const double bases[3][4] = {{0, 0, 0, 0}, {0, 0, c, 2.5 * c}, {0, 0.5 * c, 3 * c, 0}};
    const double mcs[4] = {0.3 * c / W, 0.6 * c / W, 0.9 * c / W, 1.7 * c / W};
    const double bcs[2] = {0, 1.3 * c};
    for (int holders = 1; holders <= 2; holders++) {
        boxes_make(bx, holders, 3, p.shape, 0, 0, 8, 0);
        for (int i = holders; i < 4; i++) {
            bx[i] = bx[0];
            bx[i].lo[0] = 8;
            bx[i].len[0] = 0;
        }
        p.boxes = bx;
        for (int b = 0; b < 3; b++)
            for (int t = 0; t < 4; t++)
                for (int u = 0; u < 2; u++) {
                    struct plan_cfg cfg = {.members = 4,
                                           .bucket_bytes = 1 << 20,
                                           .esize = 2,
                                           .base_load = bases[b],
                                           .move_cost = mcs[t],
                                           .base_comm = bcs[u]};
                    struct group_plan P;
                    ASSERT_EQ_INT(plan_build(&cfg, &p, 1, &P), SHARDOPT_OK);
                    double best = INFINITY;
                    int own[8];
                    for (int code = 0; code < 1 << 16; code++) {
                        for (int m = 0; m < 8; m++)
                            own[m] = (code >> (2 * m)) & 3;
                        best = fmin(best, whole_finish(own, bx, bases[b], c, mcs[t], bcs[u]));
                    }
                    const double f = whole_finish(P.owner, bx, bases[b], c, mcs[t], bcs[u]);
                    if (!(f <= best * (1 + 1e-12)))
                        fprintf(stderr, "holders %d base %d mc %d bc %d: plan %.6g best %.6g\n",
                                holders, b, t, u, f / c, best / c);
                    EXPECT_TRUE(f <= best * (1 + 1e-12));
                    plan_free(&P);
                }
    }
}

/* The planner's finish of a plan of one [8, 64, 64] stack sharded along rows over 4 members:
 * max over members of max(base + owned NS cost, base_comm + move_cost x the elements each sends
 * in the two exchanges: an owner the three quarters it does not hold, a holder its quarter). */
static double rows_finish(const struct group_plan *P, const double *base, double mc, double bc)
{
    double f = 0;
    for (int i = 0; i < 4; i++) {
        double work = base[i], sent = 0;
        for (int m = 0; m < 8; m++) {
            work += P->owner[m] == i ? plan_ns_cost(64, 64) : 0.0;
            sent += P->owner[m] == i ? 64.0 * 64 - 16 * 64 : 16.0 * 64;
        }
        f = fmax(f, fmax(work, bc + mc * sent));
    }
    return f;
}

/* Experts sharded along their rows, so none is held whole, with member 3 free of the other
 * group's load: when the exchange is dear, the moves pass keeps the group's own owners (two
 * each), since an owner sends back three quarters of its matrix and member 3 would finish later
 * with more of them; the LPT around the base load once sent five there. When it is cheap, they
 * go to member 3 and the finish drops, unless the other group's exchange (base_comm) already
 * takes longer than any member's work: then a move only adds to the later transfers. Either way
 * no later than without moves. */
TEST(sharded_matrices_change_owner_only_when_the_exchange_pays)
{
    static struct plan_box bx[MAXM];
    struct plan_param p = {.param = 0, .ndim = 3, .shape = {8, 64, 64}, .k_lo = 0, .k_count = 8};
    boxes_make(bx, 4, 3, p.shape, 1, 0, 8, 0); /* 16 rows of each expert on every member */
    p.boxes = bx;
    const double c = plan_ns_cost(64, 64), base[4] = {4 * c, 4 * c, 4 * c, 0};
    const double costs[3] = {c / 1000, c * 1e-6, c * 1e-6}, bcs[3] = {0, 0, 7 * c};
    for (int t = 0; t < 3; t++) {
        struct plan_cfg cfg = {.members = 4, .me = 0, .bucket_bytes = 1 << 20, .esize = 2};
        struct group_plan P0, P;
        ASSERT_EQ_INT(plan_build(&cfg, &p, 1, &P0), SHARDOPT_OK); /* the group on its own */
        cfg.base_load = base;
        cfg.move_cost = costs[t];
        cfg.base_comm = bcs[t];
        ASSERT_EQ_INT(plan_build(&cfg, &p, 1, &P), SHARDOPT_OK);
        const double f0 = rows_finish(&P0, base, costs[t], bcs[t]);
        const double f = rows_finish(&P, base, costs[t], bcs[t]);
        EXPECT_TRUE(f <= f0);
        if (t != 1) {
            EXPECT_EQ_INT(P.nmoved, 0);
            for (int m = 0; m < 8; m++)
                EXPECT_EQ_INT(P.owner[m], P0.owner[m]);
        } else {
            EXPECT_TRUE(P.nmoved > 0 && f < f0);
        }
        EXPECT_EQ_INT(simulate(&cfg, &p, 1), 0);
        plan_free(&P0);
        plan_free(&P);
    }
}

/* Teams: a matrix heavier than the mean share goes to a team of distinct members
 * inside one node, each charged its share (plan_ns_team_cost); light matrices and team_cap 1
 * keep one owner. */
TEST(teams_form_inside_a_node_for_matrices_too_heavy_for_one_member)
{
    static struct plan_box bx[3][MAXM];
    struct plan_param ps[3] = {
        {.param = 0, .ndim = 2, .shape = {64, 512, 1}, .k_lo = 0, .k_count = 1},
        {.param = 1, .ndim = 2, .shape = {16, 64, 1}, .k_lo = 0, .k_count = 1},
        {.param = 2, .ndim = 3, .shape = {12, 16, 64}, .k_lo = 0, .k_count = 12},
    };
    for (int p = 0; p < 3; p++) {
        boxes_make(bx[p], 8, ps[p].ndim, ps[p].shape, ps[p].ndim - 2, 0, ps[p].shape[0], 0);
        ps[p].boxes = bx[p];
    }
    EXPECT_TRUE(plan_ns_team_cost(64, 512, 1, 1) == plan_ns_cost(64, 512));
    EXPECT_TRUE(plan_ns_team_cost(64, 512, 1, 0) == plan_ns_cost(64, 512));
    EXPECT_TRUE(plan_team_allreduce_elems(64, 512, 1) == 0);
    for (int cap = 1; cap <= 4; cap *= 4) {
        struct plan_cfg cfg = {.members = 8,
                               .me = 0,
                               .bucket_bytes = 1 << 20,
                               .esize = 2,
                               .team_cap = cap,
                               .node_members = 4};
        struct group_plan P;
        ASSERT_EQ_INT(plan_build(&cfg, ps, 3, &P), SHARDOPT_OK);
        EXPECT_EQ_INT(P.team[0], cap); /* 64 x 512: over the mean alone */
        for (int m = 1; m < P.nmatrices; m++)
            EXPECT_EQ_INT(P.team[m], 1);
        EXPECT_EQ_INT(P.nteams, cap > 1);
        if (cap > 1) {
            const int *t = P.team_of;
            EXPECT_EQ_INT(P.owner[0], t[0]);
            for (int u = 0; u < cap; u++) {
                EXPECT_EQ_INT(t[u] / 4, t[0] / 4); /* one node */
                if (u > 0)
                    EXPECT_TRUE(t[u] > t[u - 1]); /* distinct, lead first */
            }
            double sum = 0;
            for (int i = 0; i < 8; i++)
                sum += P.load[i];
            double whole = 0;
            for (int m = 1; m < P.nmatrices; m++) /* 16 x 64 and the stack's 16 x 64 */
                whole += plan_ns_cost(16, 64);
            EXPECT_TRUE(fabs(sum - whole - cap * plan_ns_team_cost(64, 512, cap, 1)) < 1e-6 * sum);
        }
        plan_free(&P);
    }
    /* a cap above PLAN_TEAM_MAX is held to it (the team lists are that wide) */
    static struct plan_box big[256];
    struct plan_param one = {
        .param = 0, .ndim = 2, .shape = {256, 4096, 1}, .k_lo = 0, .k_count = 1, .boxes = big};
    boxes_make(big, 256, 2, one.shape, 0, 0, 1, 0);
    struct plan_cfg wide = {.members = 256,
                            .me = 0,
                            .bucket_bytes = 1 << 20,
                            .esize = 2,
                            .team_cap = 256,
                            .node_members = 256};
    struct group_plan W;
    ASSERT_EQ_INT(plan_build(&wide, &one, 1, &W), SHARDOPT_OK);
    EXPECT_EQ_INT(W.team_cap, PLAN_TEAM_MAX);
    EXPECT_EQ_INT(W.team[0], PLAN_TEAM_MAX);
    plan_free(&W);
}

/* A team all-reduces the m x m Gram matrix in one MPI call (an int count): a matrix whose short
 * side is 46341 or more (m^2 > INT_MAX) never goes to a team, though its blocks of the long side
 * would each be small enough to gather. One owner then holds all 2^31 or more elements, which
 * plan_build refuses by name; before, a team of 8 formed and its count would have wrapped. */
TEST(a_gram_matrix_beyond_one_mpi_count_never_goes_to_a_team)
{
    static struct plan_box bx[2][MAXM];
    struct plan_param ps[2] = {
        {.param = 0, .ndim = 2, .shape = {46341, 46344, 1}, .k_lo = 0, .k_count = 1},
        {.param = 1, .ndim = 2, .shape = {46340, 46344, 1}, .k_lo = 0, .k_count = 1},
    };
    for (int p = 0; p < 2; p++) {
        boxes_make(bx[p], 8, 2, ps[p].shape, 0, 0, 1, 0);
        ps[p].boxes = bx[p];
    }
    struct plan_cfg cfg = {.members = 8,
                           .me = 0,
                           .bucket_bytes = 1 << 20,
                           .esize = 2,
                           .team_cap = 8,
                           .node_members = 8};
    struct group_plan P;
    /* alone, 46340 (m^2 = 2,147,395,600 <= INT_MAX) still forms a team */
    ASSERT_EQ_INT(plan_build(&cfg, &ps[1], 1, &P), SHARDOPT_OK);
    EXPECT_TRUE(P.team[0] > 1);
    plan_free(&P);
    const shardopt_status_t st = plan_build(&cfg, &ps[0], 1, &P);
    if (st == SHARDOPT_OK) {
        EXPECT_EQ_INT(P.team[0], 1);
        plan_free(&P);
    } else {
        EXPECT_EQ_INT(st, SHARDOPT_ERR_UNSUPPORTED);
    }
}

/* A team's blocks are ceil(L / k) of the long side L, the last ones narrower or empty
 * (plan_team_block), and each member iterates its own (runtime/step/ns_sharded.c counts
 * ns_shard_iter_flops of it, kernels/ns_shape.h): the plan charges each member that block's FLOPs
 * as its load, and sizes the team on its widest block, which every member waits for at each
 * all-reduce (issue 23; it priced every member at L / k). Wide 13 x 41 (blocks 11, 11, 11, 8),
 * tall 37 x 29 (10, 10, 10, 7) and 8 x 9 (3, 3, 3 and an empty one), fp32 (narrow blocks updated
 * without A^2) and bf16 (always with it). */
TEST(team_members_are_charged_their_own_blocks_and_teams_their_widest)
{
    static struct plan_box bx[4];
    const int64_t shapes[3][2] = {{13, 41}, {37, 29}, {8, 9}};
    for (int si = 0; si < 3; si++)
        for (int bf16 = 0; bf16 < 2; bf16++) {
            const int64_t rows = shapes[si][0], cols = shapes[si][1];
            const int64_t m = rows < cols ? rows : cols, L = rows < cols ? cols : rows;
            struct plan_param ps = {
                .param = 0, .ndim = 2, .shape = {rows, cols, 1}, .k_lo = 0, .k_count = 1};
            boxes_make(bx, 4, 2, ps.shape, 0, 0, 1, 0);
            ps.boxes = bx;
            struct plan_cfg cfg = {.members = 4,
                                   .me = 0,
                                   .bucket_bytes = 1 << 20,
                                   .esize = 2,
                                   .team_cap = 4,
                                   .node_members = 4,
                                   .team_frac = 0.01,
                                   .team_bf16 = bf16};
            struct group_plan P;
            ASSERT_EQ_INT(plan_build(&cfg, &ps, 1, &P), SHARDOPT_OK);
            ASSERT_EQ_INT(P.team[0], 4);
            const int64_t c = (L + 3) / 4;
            double widest = 0;
            for (int j = 0; j < 4; j++) {
                const int64_t nj = c * j >= L ? 0 : (c * (j + 1) <= L ? c : L - c * j);
                const double want = ns_shard_iter_flops((double)m, (double)nj, !bf16);
                widest = want > widest ? want : widest;
                EXPECT_NEAR(P.load[P.team_of[j]], want, 0.0);
                EXPECT_NEAR(plan_ns_team_block_cost(rows, cols, 4, j, !bf16), want, 0.0);
            }
            EXPECT_NEAR(plan_ns_team_cost(rows, cols, 4, !bf16), widest, 0.0);
            for (int i = 0; i < 4; i++) /* time: every member waits for the widest block */
                EXPECT_NEAR(P.work[i], widest, 0.0);
            plan_free(&P);
        }
}

/* Teams run (issue 22): each member of a matrix's team receives exactly its block of the long
 * side (stored rows of a tall matrix, columns of a wide or square one) from every holder, and
 * every holder gets its piece back, whichever dim the layout shards: a block cutting across a
 * holder's rows travels as one run per row. Executed by simulate, with teams of 2 and 4 over 4
 * and 8 members, uneven shards, tiny buckets. */
TEST(team_members_receive_their_blocks_of_the_long_side_and_send_them_back)
{
    static struct plan_box bx[4][MAXM];
    /* (members, node members, cap, shard dim of the 2-D params, uneven, bucket bytes) */
    const int cases[][6] = {{4, 4, 2, 0, 0, 1 << 20},
                            {4, 4, 4, 1, 1, 64},
                            {8, 4, 4, 0, 1, 1 << 20},
                            {8, 8, 2, 1, 0, 2000},
                            {3, 3, 2, 0, 1, 1}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int *c = cases[ci];
        const int M = c[0];
        struct plan_param ps[4] = {
            {.param = 0, .ndim = 2, .shape = {37, 29, 1}, .k_lo = 0, .k_count = 1},  /* tall */
            {.param = 1, .ndim = 2, .shape = {13, 41, 1}, .k_lo = 0, .k_count = 1},  /* wide */
            {.param = 2, .ndim = 3, .shape = {3, 12, 10}, .k_lo = 0, .k_count = 3},  /* stack */
            {.param = 5, .ndim = 2, .shape = {24, 24, 1}, .k_lo = 0, .k_count = 1}}; /* square */
        boxes_make(bx[0], M, 2, ps[0].shape, c[3], 0, 1, c[4]);
        boxes_make(bx[1], M, 2, ps[1].shape, 1 - c[3], 0, 1, c[4]);
        boxes_make(bx[2], M, 3, ps[2].shape, 1 + c[3], 0, 3, c[4]);
        boxes_make(bx[3], M, 2, ps[3].shape, c[3], 0, 1, c[4]);
        for (int p = 0; p < 4; p++)
            ps[p].boxes = bx[p];
        struct plan_cfg cfg = {.members = M,
                               .me = 0,
                               .bucket_bytes = (size_t)c[5],
                               .esize = 2,
                               .team_cap = c[2],
                               .node_members = c[1],
                               .team_frac = 0.01,
                               .allreduce_cost = 0.5};
        struct group_plan P;
        ASSERT_EQ_INT(plan_build(&cfg, ps, 4, &P), SHARDOPT_OK);
        EXPECT_TRUE(P.nteams >= 4); /* every matrix is split: each is heavy against 0.01 */
        /* each member is charged its teams' all-reduces, apart from its load (team_comm) */
        double comm = 0, want = 0;
        for (int i = 0; i < M; i++)
            comm += P.team_comm[i];
        for (int q = 0, m = 0; q < 4; q++)
            for (int64_t k = 0; k < ps[q].k_count; k++, m++)
                want += P.team[m] * 0.5 *
                        plan_team_allreduce_elems(ps[q].shape[ps[q].ndim - 2],
                                                  ps[q].shape[ps[q].ndim - 1], P.team[m]);
        EXPECT_TRUE(want > 0 && fabs(comm - want) <= 1e-9 * want);
        int largest = 0;
        for (int m = 0; m < P.nmatrices; m++)
            largest = P.team[m] > largest ? P.team[m] : largest;
        EXPECT_EQ_INT(largest, c[2] < c[1] ? c[2] : c[1]);
        plan_free(&P);
        EXPECT_EQ_INT(simulate(&cfg, ps, 4), 0);
    }
}

/* ---- GLM-4.5-Air ---- */

struct glm_matrix {
    int64_t rows, cols;
};

/* Dense (non-expert) Muon matrices of GLM-4.5-Air: 1 dense + 45 MoE layers, hidden 4096, 96 query
 * heads and 8 KV heads of 128, dense FFN 10944, router 128 x 4096, shared expert of 1408.
 * Embeddings, lm_head, norms and biases go to AdamW and are not planned. */
static int glm_dense(struct glm_matrix *out)
{
    int n = 0;
    for (int l = 0; l < 46; l++) {
        out[n++] = (struct glm_matrix){12288, 4096}; /* q */
        out[n++] = (struct glm_matrix){1024, 4096};  /* k */
        out[n++] = (struct glm_matrix){1024, 4096};  /* v */
        out[n++] = (struct glm_matrix){4096, 12288}; /* o */
        if (l == 0) {
            out[n++] = (struct glm_matrix){10944, 4096}; /* gate */
            out[n++] = (struct glm_matrix){10944, 4096}; /* up */
            out[n++] = (struct glm_matrix){4096, 10944}; /* down */
        } else {
            out[n++] = (struct glm_matrix){128, 4096};  /* router */
            out[n++] = (struct glm_matrix){1408, 4096}; /* shared gate */
            out[n++] = (struct glm_matrix){1408, 4096}; /* shared up */
            out[n++] = (struct glm_matrix){4096, 1408}; /* shared down */
        }
    }
    return n;
}

/* Plan one group for every member; check owners, balance and bytes against the formula: a
 * matrix of B bytes moves f_i*B from each non-owner i holding a fraction f_i (and back), and
 * (1 - f_owner)*B into its owner (and back). */
static void glm_group_check(const struct plan_param *ps, int np, int members, const char *what)
{
    struct group_plan P;
    double *bytes = calloc((size_t)members, sizeof(double)), maxload = 0, sum = 0;
    int *owner0 = NULL, nm = 0;

    for (int me = 0; me < members; me++) {
        struct plan_cfg cfg = {
            .members = members, .me = me, .bucket_bytes = 256u << 20, .esize = 2};
        ASSERT_EQ_INT(plan_build(&cfg, ps, np, &P), SHARDOPT_OK);
        if (me == 0) {
            nm = P.nmatrices;
            owner0 = malloc(sizeof(int) * (size_t)nm);
            memcpy(owner0, P.owner, sizeof(int) * (size_t)nm);
            for (int i = 0; i < members; i++) {
                sum += P.load[i];
                maxload = P.load[i] > maxload ? P.load[i] : maxload;
            }
        }
        int same = 1, valid = 1;
        for (int m = 0; m < nm; m++) {
            same &= P.owner[m] == owner0[m];
            valid &= P.owner[m] >= 0 && P.owner[m] < members;
        }
        EXPECT_TRUE(same && valid);
        /* expected bytes for this member, from the layout alone */
        double want = 0;
        int m = 0;
        for (int p = 0; p < np; p++)
            for (int64_t k = ps[p].k_lo; k < ps[p].k_lo + ps[p].k_count; k++, m++) {
                const struct plan_box *b = &ps[p].boxes[me];
                const int rd = ps[p].ndim - 2;
                const double B = 2.0 * (double)(ps[p].shape[rd] * ps[p].shape[rd + 1]);
                int held = ps[p].ndim == 2 || (k >= b->lo[0] && k < b->lo[0] + b->len[0]);
                double f = held ? (double)(b->len[rd] * b->len[rd + 1]) /
                                      (double)(ps[p].shape[rd] * ps[p].shape[rd + 1])
                                : 0;
                /* sent: f*B in #1 as a holder, (1-f)*B in #2 as the owner; received alike */
                want += owner0[m] == me ? (1 - f) * B : f * B;
            }
        EXPECT_NEAR((double)P.bytes_sent, want, 0.5);
        EXPECT_NEAR((double)P.bytes_recv, want, 0.5);
        bytes[me] = want;
        plan_free(&P);
    }
    printf("  %s: %d matrices over %d ranks, owned NS FLOPs max/mean %.4f, bytes/rank/step %.1f "
           "MiB (rank 0)\n",
           what, nm, members, maxload / (sum / members), bytes[0] / 1048576.0);
    EXPECT_TRUE(maxload / (sum / members) <= 1.05);
    free(owner0);
    free(bytes);
}

static void glm_plan(int dense_members, int ep, int expert_dim)
{
    static struct glm_matrix gm[400];
    static struct plan_param ps[400];
    static struct plan_box boxes[400][64];
    const int nd = glm_dense(gm), xs = dense_members / ep;
    char what[96];

    for (int i = 0; i < nd; i++) {
        ps[i] = (struct plan_param){.param = i,
                                    .ndim = 2,
                                    .shape = {gm[i].rows, gm[i].cols, 1},
                                    .k_lo = 0,
                                    .k_count = 1,
                                    .boxes = boxes[i]};
        boxes_make(boxes[i], dense_members, 2, ps[i].shape, 0, 0, 1, 0);
    }
    snprintf(what, sizeof what, "GLM-4.5-Air dense group");
    glm_group_check(ps, nd, dense_members, what);

    /* one expert shard group: the 128/ep experts of one EP rank, gate/up/down of 45 layers */
    const int64_t E = 128, kc = E / ep;
    int ne = 0;
    for (int l = 0; l < 45; l++)
        for (int s = 0; s < 3; s++) {
            int64_t r = s < 2 ? 1408 : 4096, c = s < 2 ? 4096 : 1408;
            ps[ne] = (struct plan_param){.param = ne,
                                         .ndim = 3,
                                         .shape = {E, r, c},
                                         .k_lo = 3 * kc,
                                         .k_count = kc,
                                         .boxes = boxes[ne]};
            boxes_make(boxes[ne], xs, 3, ps[ne].shape, expert_dim, 3 * kc, kc, 0);
            ne++;
        }
    snprintf(what, sizeof what, "GLM-4.5-Air expert shard group (experts along dim %d)",
             expert_dim);
    glm_group_check(ps, ne, xs, what);
}

/* The latest finish of the plan of a 16-member group, max over members of max(load + NS work,
 * comm + cost x the elements it sends), each member's elements as its own plan counts them
 * (bytes_sent) and its work from the owners and teams (a team member waits for the widest
 * block and its all-reduce); *work and *xfer: the latest of each. */
static double refine_finish(const struct plan_cfg *cfg, const struct plan_param *ps, int np,
                            const double *load, double comm, double cost, double *work,
                            double *xfer)
{
    double w[16], f = 0;
    *work = *xfer = 0;
    for (int i = 0; i < 16; i++)
        w[i] = load[i];
    struct group_plan P;
    for (int me = 0; me < 16; me++) {
        struct plan_cfg c = *cfg;
        c.me = me;
        if (plan_build(&c, ps, np, &P) != SHARDOPT_OK)
            return -1;
        const double x = comm + cost * (double)(P.bytes_sent / c.esize);
        *xfer = fmax(*xfer, x);
        if (me == 0)
            for (int m = 0; m < P.nmatrices; m++) {
                const int k = P.team[m];
                const int64_t r = ps[m].shape[0], cl = ps[m].shape[1];
                const double per =
                    k > 1 ? plan_ns_team_cost(r, cl, k, 1) +
                                cfg->allreduce_cost * plan_team_allreduce_elems(r, cl, k)
                          : plan_ns_cost(r, cl);
                for (int u = 0; u < k; u++)
                    w[k > 1 ? P.team_of[(size_t)m * (size_t)P.team_cap + (size_t)u] : P.owner[m]] +=
                        per;
            }
        plan_free(&P);
    }
    for (int i = 0; i < 16; i++)
        *work = fmax(*work, w[i]);
    f = fmax(*work, *xfer);
    return f;
}

/* The second placement (plan_cfg.refine_load), on a reduced Qwen3-30B-A3B at 256 GPUs with
 * whole experts and expert_moves (docs/scaling.md, "The two near misses"): members 0 to 7 keep
 * experts up to the latest finish (load 5e6), members 8 to 15 hold none and carry nothing; six
 * 64 x 256 matrices sharded by rows over all 16. The first plan, whose FLOP rule forms no team
 * (each under team_frac x the mean), gives each its own owner, who then sends the most: its
 * pieces, its matrix less twice its piece, past the latest finish. Two blocks of teams of 2 send
 * as much; three of teams of 4 take too long (their all-reduces included); one of each fits. So
 * only teams of 2 and 4 mixed, one block of each on every member the experts left, keep the
 * finish at the experts' 5e6, and the refined plan is that, with an exchange that still runs
 * (simulate) and every member's plan alike. Without refine_load the first plan stays. */
TEST(refine_forms_mixed_teams_where_one_owner_would_send_too_much)
{
    static struct plan_box bx[6][MAXM];
    struct plan_param ps[6];
    for (int p = 0; p < 6; p++) {
        ps[p] = (struct plan_param){
            .param = p, .ndim = 2, .shape = {64, 256, 1}, .k_lo = 0, .k_count = 1};
        boxes_make(bx[p], 16, 2, ps[p].shape, 0, 0, 1, 0); /* 4 rows each */
        ps[p].boxes = bx[p];
    }
    double before[16], after[16];
    for (int i = 0; i < 16; i++) {
        before[i] = i < 8 ? 1e7 : 0; /* the experts before their moves: all on 0 to 7 */
        after[i] = i < 8 ? 5e6 : 0;
    }
    const double cost = 100, comm = 3.2e6;
    struct plan_cfg cfg = {.members = 16,
                           .me = 0,
                           .bucket_bytes = 1 << 20,
                           .esize = 2,
                           .base_load = before,
                           .team_cap = 8,
                           .node_members = 8,
                           .team_frac = 0.9,
                           .allreduce_cost = 64};
    struct group_plan P0, P;
    ASSERT_EQ_INT(plan_build(&cfg, ps, 6, &P0), SHARDOPT_OK);
    EXPECT_EQ_INT(P0.nteams, 0);
    EXPECT_EQ_INT(P0.refined, 0);
    double w0, x0, w, x;
    const double f0 = refine_finish(&cfg, ps, 6, after, comm, cost, &w0, &x0);
    EXPECT_TRUE(x0 > 5e6); /* an owner's transfers are the latest */

    cfg.refine_load = after;
    cfg.refine_cost = cost;
    cfg.refine_comm = comm;
    ASSERT_EQ_INT(plan_build(&cfg, ps, 6, &P), SHARDOPT_OK);
    EXPECT_EQ_INT(P.refined, 1);
    EXPECT_EQ_INT(P.nteams, 6);
    int in2[16] = {0}, in4[16] = {0}, n2 = 0, n4 = 0;
    for (int m = 0; m < 6; m++) {
        n2 += P.team[m] == 2;
        n4 += P.team[m] == 4;
        for (int u = 0; u < P.team[m]; u++) {
            const int t = P.team_of[(size_t)m * (size_t)P.team_cap + (size_t)u];
            in2[t] += P.team[m] == 2;
            in4[t] += P.team[m] == 4;
        }
    }
    EXPECT_EQ_INT(n2, 4);
    EXPECT_EQ_INT(n4, 2);
    for (int i = 0; i < 16; i++) {
        EXPECT_EQ_INT(in2[i], i >= 8);
        EXPECT_EQ_INT(in4[i], i >= 8);
    }
    const double f = refine_finish(&cfg, ps, 6, after, comm, cost, &w, &x);
    EXPECT_NEAR(f, 5e6, 0.0); /* the experts' finish: nobody later */
    EXPECT_TRUE(f < f0 && w <= w0 && x <= x0);
    EXPECT_EQ_INT(simulate(&cfg, ps, 6), 0);
    plan_free(&P0);
    plan_free(&P);
}

/* The first placement's team size counts the exchange (plan_cfg.refine_cost without refine_load;
 * issue 22, docs/scaling.md: Qwen3-30B-A3B, experts by rows, 1,024 GPUs, whose bf16 teams of 4
 * sent more than teams of 8 and lengthened the step). 16 members in two nodes of 8; member 0
 * carries 6.5e6 of the other group's work (the latest Newton-Schulz), the others 4e6; one 64 x 256
 * matrix sharded by rows (1,024 elements a member). The FLOP rule's smallest team under
 * team_frac x the mean is one of 4 (2: 2.88e6 a member, over 0.5 x 4.45e6; 4: 1.97e6): its
 * members' blocks (4,096 elements) take their transfers to 6.56e6, past member 0's finish. A team
 * of 8 (2,048-element blocks, 6.38e6) stays within it: the plan counting the exchange forms that
 * one, in the node where it finishes first, the latest finish member 0's 6.5e6, neither the
 * latest Newton-Schulz nor the latest exchange later. Where the exchange does not matter
 * (refine_comm 0) the team of 4 stays, and the plan too. */
TEST(team_sizes_count_the_exchange_bytes)
{
    static struct plan_box bx[MAXM];
    struct plan_param ps = {.param = 0, .ndim = 2, .shape = {64, 256, 1}, .k_lo = 0, .k_count = 1};
    boxes_make(bx, 16, 2, ps.shape, 0, 0, 1, 0); /* 4 rows each */
    ps.boxes = bx;
    double base[16];
    for (int i = 0; i < 16; i++)
        base[i] = i == 0 ? 6.5e6 : 4e6;
    const double cost = 100, comm = 6.1e6;
    struct plan_cfg cfg = {.members = 16,
                           .me = 0,
                           .bucket_bytes = 1 << 20,
                           .esize = 2,
                           .base_load = base,
                           .team_cap = 8,
                           .node_members = 8,
                           .team_frac = 0.5,
                           .allreduce_cost = 64};
    struct group_plan P0, P;
    ASSERT_EQ_INT(plan_build(&cfg, &ps, 1, &P0), SHARDOPT_OK); /* Newton-Schulz alone */
    EXPECT_EQ_INT(P0.team[0], 4);
    double w0, x0, w, x;
    const double f0 = refine_finish(&cfg, &ps, 1, base, comm, cost, &w0, &x0);
    EXPECT_NEAR(x0, comm + cost * (1024 + 4096 - 2 * 256), 0.0); /* a member of the team of 4 */
    EXPECT_TRUE(x0 > 6.5e6);

    cfg.refine_cost = cost;
    cfg.refine_comm = comm;
    ASSERT_EQ_INT(plan_build(&cfg, &ps, 1, &P), SHARDOPT_OK);
    EXPECT_EQ_INT(P.refined, 0); /* no second placement: the first one sized the team */
    EXPECT_EQ_INT(P.team[0], 8);
    for (int u = 0; u < P.team[0]; u++) /* the node without member 0 */
        EXPECT_EQ_INT(P.team_of[(size_t)u], 8 + u);
    const double f = refine_finish(&cfg, &ps, 1, base, comm, cost, &w, &x);
    EXPECT_NEAR(f, 6.5e6, 0.0);
    EXPECT_NEAR(x, comm + cost * (1024 + 2048 - 2 * 128), 0.0);
    EXPECT_TRUE(f < f0 && w <= w0 && x <= x0);
    EXPECT_EQ_INT(simulate(&cfg, &ps, 1), 0);
    plan_free(&P);

    cfg.refine_comm = 0;
    ASSERT_EQ_INT(plan_build(&cfg, &ps, 1, &P), SHARDOPT_OK);
    EXPECT_EQ_INT(P.team[0], 4);
    for (int u = 0; u < 4; u++)
        EXPECT_EQ_INT(P.team_of[(size_t)u], P0.team_of[(size_t)u]);
    plan_free(&P);
    plan_free(&P0);
}

TEST(glm45_air_16_ranks_dp_shard4_cp4_ep8)
{
    glm_plan(16, 8, 1);
    glm_plan(16, 8, 0);
}

TEST(glm45_air_64_ranks_dp_replicate2_dp_shard8_cp4_ep8)
{
    /* planning is per replica: the dense group is dp_shard x cp = 32 ranks */
    glm_plan(32, 8, 1);
    glm_plan(32, 8, 2);
}

/* ---- gather or sharded ---- */
#include "sharding/ns_strategy.h"

TEST(sharded_strategy_eligibility_and_auto)
{
    static struct plan_box b[16];
    struct ns_strategy_in in = {.ndim = 2,
                                .shape = {4096, 12288, 1},
                                .ns_transpose = 0,
                                .shard_dim = 1,
                                .boxes = b,
                                .members = 16,
                                .steps = 5,
                                .esize = 2,
                                .gflops = 100,
                                .gbps = 25};
    boxes_make(b, 16, 2, in.shape, 1, 0, 1, 0);
    /* a wide matrix split along its columns (the long side): eligible */
    EXPECT_EQ_INT(ns_strategy_eligible(&in), 1);
    EXPECT_EQ_INT(ns_strategy_choose(&in, NS_MODE_GATHER), 0);
    EXPECT_EQ_INT(ns_strategy_choose(&in, NS_MODE_SHARDED), 1);
    /* auto: alone in its group (mean share = a sixteenth of it): sharded pays */
    in.group_mean_cost = plan_ns_cost(4096, 12288) / 16;
    EXPECT_EQ_INT(ns_strategy_choose(&in, NS_MODE_AUTO), 1);
    /* auto: one of many such matrices, LPT balances them: gather */
    in.group_mean_cost = plan_ns_cost(4096, 12288) * 4;
    EXPECT_EQ_INT(ns_strategy_choose(&in, NS_MODE_AUTO), 0);
    /* split along the short side (rows of a wide matrix): never sharded */
    boxes_make(b, 16, 2, in.shape, 0, 0, 1, 0);
    in.shard_dim = 0;
    EXPECT_EQ_INT(ns_strategy_eligible(&in), 0);
    EXPECT_EQ_INT(ns_strategy_choose(&in, NS_MODE_SHARDED), 0);
    /* a tall matrix works on its transpose: its rows are the long side */
    in.shape[0] = 12288;
    in.shape[1] = 4096;
    in.ns_transpose = 1;
    boxes_make(b, 16, 2, in.shape, 0, 0, 1, 0);
    EXPECT_EQ_INT(ns_strategy_eligible(&in), 1);
    /* only one member holds columns: nothing to share */
    boxes_make(b, 1, 2, in.shape, 0, 0, 1, 0);
    in.members = 1;
    EXPECT_EQ_INT(ns_strategy_eligible(&in), 0);
}

/* Buckets too large for one MPI call are refused at planning (-2), never wrapped into ints:
 * - replica_split all-gathers a bucket's NS slots in one call: two [256, 4096, 1536] stacks held
 *   whole (a group of 1) in one 8 GiB bf16 bucket give 3.2e9 slots. Before, nothing checked them
 *   (whole matrices never reach the exchange counts) and replica 3's displacement became
 *   -1879048192;
 * - per-member counts past 2^32: twelve such stacks split in two along cols in one bucket send
 *   9.7e9 elements to the other member. Before, the int sum wrapped to 536870912, passed the
 *   check, and buffer A was laid out past its end.
 * Nothing is allocated for the data: planning only counts. */
TEST(buckets_beyond_an_mpi_count_are_refused_not_wrapped)
{
    static const struct plan_box whole = {{0, 0, 0}, {256, 4096, 1536}};
    static const struct plan_box halves[2] = {{{0, 0, 0}, {256, 4096, 768}},
                                              {{0, 0, 768}, {256, 4096, 768}}};
    struct plan_param ps[12];
    struct group_plan P;

    for (int i = 0; i < 12; i++)
        ps[i] = (struct plan_param){.param = i,
                                    .ndim = 3,
                                    .shape = {256, 4096, 1536},
                                    .k_lo = 0,
                                    .k_count = 256,
                                    .boxes = i < 2 ? &whole : halves};
    /* replica_split: refused with 4 replicas, planned without */
    struct plan_cfg one = {
        .members = 1, .me = 0, .bucket_bytes = 8ull << 30, .esize = 2, .replicas = 4};
    EXPECT_EQ_INT(plan_build(&one, ps, 2, &P), SHARDOPT_ERR_UNSUPPORTED);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "replica_split all-gather");
    one.replicas = 1;
    ASSERT_EQ_INT(plan_build(&one, ps, 2, &P), SHARDOPT_OK);
    EXPECT_TRUE(P.nbuckets == 1 && P.buckets[0].ns_elems > (size_t)INT_MAX);
    plan_free(&P);

    for (int i = 0; i < 12; i++)
        ps[i].boxes = halves;
    struct plan_cfg two = {.members = 2, .me = 0, .bucket_bytes = SIZE_MAX, .esize = 2};
    EXPECT_EQ_INT(plan_build(&two, ps, 12, &P), SHARDOPT_ERR_UNSUPPORTED);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "more than 2^31 - 1 elements");
    /* the same stacks in buckets of 1 GiB plan, and every count is what the pieces add up to */
    two.bucket_bytes = 1ull << 30;
    ASSERT_EQ_INT(plan_build(&two, ps, 12, &P), SHARDOPT_OK);
    uint64_t sent = 0;
    for (int b = 0; b < P.nbuckets; b++) {
        int ac, bc;
        blk(&P.buckets[b].a, 1, &ac);
        blk(&P.buckets[b].b, 1, &bc);
        sent += (uint64_t)ac + (uint64_t)bc;
    }
    EXPECT_TRUE(sent * 2 == P.bytes_sent);
    plan_free(&P);
}

/* team_guard (an expert shard group's plan, sharding/plan_owners_pick.c): teams only where the
 * group's latest member finishes its work earlier with them. Eight 64 x 512 experts sharded
 * along rows over 8 members: each one over team_frac x the mean, so matrix by matrix every one
 * goes to a team, and every member then carries a redundant 64 x 64 Gram matrix per team it is
 * in: the latest finish is later than one owner each (the expert rows at 16,384 GPUs,
 * docs/scaling.md). With the guard: one owner per matrix, the bits of the plan with team_cap 1;
 * without it (the dense group's rule) the teams stay. One heavy 64 x 4096 matrix among light ones
 * over 4 members: the team shortens the latest finish, and the guard keeps it. */
TEST(an_expert_group_keeps_its_teams_only_where_the_group_finishes_earlier)
{
    static struct plan_box bx[2][MAXM];
    struct plan_param even = {
        .param = 0, .ndim = 3, .shape = {8, 64, 512}, .k_lo = 0, .k_count = 8};
    boxes_make(bx[0], 8, 3, even.shape, 1, 0, 8, 0); /* rows: no member holds one whole */
    even.boxes = bx[0];
    for (int guard = 0; guard <= 1; guard++) {
        struct plan_cfg cfg = {.members = 8,
                               .me = 0,
                               .bucket_bytes = 1 << 20,
                               .esize = 2,
                               .team_cap = 8,
                               .node_members = 8,
                               .team_guard = guard};
        struct plan_cfg solo = cfg;
        solo.team_cap = 1;
        struct group_plan P, S;
        ASSERT_EQ_INT(plan_build(&cfg, &even, 1, &P), SHARDOPT_OK);
        ASSERT_EQ_INT(plan_build(&solo, &even, 1, &S), SHARDOPT_OK);
        EXPECT_EQ_INT(S.nteams, 0);
        EXPECT_EQ_INT(P.nteams, guard ? 0 : 8);
        double latest[2] = {0, 0};
        for (int i = 0; i < 8; i++) {
            latest[0] = P.work[i] > latest[0] ? P.work[i] : latest[0];
            latest[1] = S.work[i] > latest[1] ? S.work[i] : latest[1];
        }
        EXPECT_TRUE(guard ? latest[0] == latest[1] : latest[0] > latest[1]);
        for (int m = 0; guard && m < P.nmatrices; m++) {
            EXPECT_EQ_INT(P.owner[m], S.owner[m]);
            EXPECT_EQ_INT(P.team[m], 1);
        }
        EXPECT_TRUE(!guard || (P.bytes_sent == S.bytes_sent && P.nowned == S.nowned));
        plan_free(&P);
        plan_free(&S);
    }
    struct plan_param mixed[2] = {
        {.param = 0, .ndim = 2, .shape = {64, 4096, 1}, .k_lo = 0, .k_count = 1},
        {.param = 1, .ndim = 3, .shape = {6, 16, 64}, .k_lo = 0, .k_count = 6},
    };
    boxes_make(bx[0], 4, 2, mixed[0].shape, 0, 0, 1, 0);
    boxes_make(bx[1], 4, 3, mixed[1].shape, 1, 0, 6, 0);
    mixed[0].boxes = bx[0];
    mixed[1].boxes = bx[1];
    struct plan_cfg cfg = {.members = 4,
                           .me = 0,
                           .bucket_bytes = 1 << 20,
                           .esize = 2,
                           .team_cap = 4,
                           .node_members = 4,
                           .team_guard = 1};
    struct group_plan P;
    ASSERT_EQ_INT(plan_build(&cfg, mixed, 2, &P), SHARDOPT_OK);
    EXPECT_TRUE(P.team[0] > 1); /* the heavy one, in a team */
    EXPECT_EQ_INT(P.nteams, 1);
    double latest = 0;
    for (int i = 0; i < 4; i++)
        latest = P.work[i] > latest ? P.work[i] : latest;
    EXPECT_TRUE(latest < plan_ns_cost(64, 4096));
    plan_free(&P);
}

/* team_guard_cost: the group-wide choice counts the exchange, as the dense group's team sizes
 * do. One 64 x 4096 matrix sharded along rows over the 4 members of a node, member 0 carrying a
 * base load twice the matrix's cost: one owner (member 1) sends back all it does not hold, 3/4 of
 * the matrix, while a team of 2 on members 1 and 2 sends half of it each; the latest work is
 * member 0's base load either way, and at this element cost the exchange is the latest finish.
 * Work only (team_guard_cost 0, the rule before) keeps one owner, the latest work being no
 * earlier with the team; counting the exchange keeps the team of 2 (its latest finish earlier,
 * neither its latest work nor its latest exchange later), not the team of 4, which would add
 * member 0's block to its base load (the Qwen3-30B-A3B expert rows at 16,384 GPUs,
 * docs/scaling.md). */
TEST(an_expert_groups_team_choice_counts_the_exchange)
{
    static struct plan_box bx[4];
    struct plan_param w = {.param = 0, .ndim = 2, .shape = {64, 4096, 1}, .k_lo = 0, .k_count = 1};
    boxes_make(bx, 4, 2, w.shape, 0, 0, 1, 0); /* rows: 16 each, none whole */
    w.boxes = bx;
    const double base[4] = {2 * plan_ns_cost(64, 4096), 0, 0, 0};
    for (int by_comm = 0; by_comm <= 1; by_comm++) {
        struct plan_cfg cfg = {.members = 4,
                               .me = 1,
                               .bucket_bytes = 1 << 20,
                               .esize = 2,
                               .base_load = base,
                               .team_cap = 4,
                               .node_members = 4,
                               .team_guard = 1,
                               .team_guard_cost = by_comm ? 2000.0 : 0.0};
        struct group_plan P;
        ASSERT_EQ_INT(plan_build(&cfg, &w, 1, &P), SHARDOPT_OK);
        EXPECT_EQ_INT(P.team[0], by_comm ? 2 : 1);
        EXPECT_EQ_INT(P.owner[0], 1);
        EXPECT_TRUE(!by_comm || (P.team_of[0] == 1 && P.team_of[1] == 2));
        double latest = 0;
        for (int i = 0; i < 4; i++)
            latest = P.work[i] > latest ? P.work[i] : latest;
        EXPECT_TRUE(latest == base[0]); /* member 0's, with or without the team */
        /* what the owner, member 1, sends (2-byte elements): alone, back the 48 rows it does not
         * hold; in the team, its piece of block 1 out and block 0 less its piece back */
        EXPECT_TRUE(P.bytes_sent == (uint64_t)2 * (by_comm ? 64 * 2048 : 48 * 4096));
        plan_free(&P);
    }
}

#include "sharding/plan_mat.h"

/* plan_team_place reads each node's k-th least work from the nodes' sorted work (plan_node_sort,
 * what lpt keeps) instead of selecting the k members in every node: the same team either way,
 * ties in work included (a few distinct values), a last node shorter than k included (44 members
 * in nodes of 8), and with the work changing under the sorted copy as lpt changes it (one node
 * re-sorted after each placement). */
TEST(a_team_placed_from_the_sorted_nodes_is_the_selections_team)
{
    enum { MEMBERS = 44, G = 8 };
    const struct plan_cfg cfg = {.members = MEMBERS, .node_members = G};
    double work[MEMBERS], sorted[MEMBERS];
    uint32_t x = 12345;
    for (int i = 0; i < MEMBERS; i++) {
        x = x * 1664525u + 1013904223u;
        work[i] = (double)(x >> 28); /* 16 values: many ties */
    }
    for (int j = 0; j * G < MEMBERS; j++)
        plan_node_sort(&cfg, work, j, sorted);
    for (int round = 0; round < 200; round++) {
        const int k = 1 << (1 + round % 3); /* 2, 4, 8 */
        const double per = 0.5 + round % 5;
        int a[PLAN_TEAM_MAX], b[PLAN_TEAM_MAX];
        plan_team_place(&cfg, work, NULL, per, k, a);
        plan_team_place(&cfg, work, sorted, per, k, b);
        for (int u = 0; u < k; u++)
            EXPECT_EQ_INT(a[u], b[u]);
        for (int u = 0; u < k; u++)
            work[b[u]] += per;
        plan_node_sort(&cfg, work, b[0] / G, sorted);
    }
}

/* Mesh arithmetic: coordinates and group memberships as docs/design.md (Process groups) maps them,
 * and the layout rules, without MPI. */
#include "sharding/mesh.h"
#include "test.h"

static char err[256];

TEST(design_example_16_ranks_dp_shard4_cp4_ep8)
{
    struct mesh m;
    struct mesh_coords c;
    ASSERT_EQ_INT(mesh_init(&m, 16, 1, 4, 4, 8, err, sizeof err), 0);
    /* dense group = all 16; EP groups {0-7}, {8-15}; expert shard groups {0,8}, {1,9}, ... */
    mesh_coords(&m, 9, &c);
    EXPECT_EQ_INT(c.d, 9);
    EXPECT_EQ_INT(c.shard, 2);
    EXPECT_EQ_INT(c.cp_index, 1);
    EXPECT_EQ_INT(c.ep_rank, 1);
    EXPECT_EQ_INT(c.xs_rank, 1);
    for (int i = 0; i < 8; i++)
        EXPECT_EQ_INT(mesh_ep_member(&m, &c, i), 8 + i);
    EXPECT_EQ_INT(mesh_xs_size(&m), 2);
    EXPECT_EQ_INT(mesh_xs_member(&m, &c, 0), 1);
    EXPECT_EQ_INT(mesh_xs_member(&m, &c, 1), 9);
    mesh_coords(&m, 7, &c);
    EXPECT_EQ_INT(mesh_xs_member(&m, &c, 0), 7);
    EXPECT_EQ_INT(mesh_xs_member(&m, &c, 1), 15);
    for (int i = 0; i < 16; i++)
        EXPECT_EQ_INT(mesh_dense_member(&m, &c, i), i);
}

TEST(replicas_are_row_major_outermost)
{
    struct mesh m;
    struct mesh_coords c;
    /* 8 ranks: dp_replicate 2 x dp_shard 2 x cp 2, ep 2 */
    ASSERT_EQ_INT(mesh_init(&m, 8, 2, 2, 2, 2, err, sizeof err), 0);
    mesh_coords(&m, 6, &c);
    EXPECT_EQ_INT(c.rep, 1);
    EXPECT_EQ_INT(c.shard, 1);
    EXPECT_EQ_INT(c.cp_index, 0);
    EXPECT_EQ_INT(c.d, 2);
    EXPECT_EQ_INT(mesh_rep_member(&m, &c, 0), 2);
    EXPECT_EQ_INT(mesh_rep_member(&m, &c, 1), 6);
    EXPECT_EQ_INT(mesh_dense_member(&m, &c, 0), 4);
    EXPECT_EQ_INT(mesh_ep_member(&m, &c, 0), 6);
    EXPECT_EQ_INT(mesh_ep_member(&m, &c, 1), 7);
    EXPECT_EQ_INT(mesh_xs_member(&m, &c, 0), 4);
    EXPECT_EQ_INT(mesh_xs_member(&m, &c, 1), 6);
}

TEST(every_rank_is_in_exactly_the_groups_that_list_it)
{
    /* membership is symmetric: if b is in a's group, a is in b's, at the rank b's group says */
    const int layouts[][5] = {
        {8, 2, 2, 2, 2}, {16, 1, 4, 4, 8}, {12, 1, -1, 2, 2}, {6, 3, 2, 1, 1}};
    for (size_t L = 0; L < sizeof layouts / sizeof layouts[0]; L++) {
        const int *l = layouts[L];
        struct mesh m;
        ASSERT_EQ_INT(mesh_init(&m, l[0], l[1], l[2], l[3], l[4], err, sizeof err), 0);
        int bad = 0;
        for (int r = 0; r < m.world; r++) {
            struct mesh_coords a, b;
            mesh_coords(&m, r, &a);
            for (int i = 0; i < m.ep; i++) {
                mesh_coords(&m, mesh_ep_member(&m, &a, i), &b);
                bad += b.ep_rank != i || mesh_ep_member(&m, &b, a.ep_rank) != r;
            }
            for (int i = 0; i < mesh_xs_size(&m); i++) {
                mesh_coords(&m, mesh_xs_member(&m, &a, i), &b);
                bad += b.xs_rank != i || mesh_xs_member(&m, &b, a.xs_rank) != r;
            }
            for (int i = 0; i < m.dp_replicate; i++) {
                mesh_coords(&m, mesh_rep_member(&m, &a, i), &b);
                bad += b.rep != i || b.d != a.d;
            }
        }
        EXPECT_EQ_INT(bad, 0);
    }
}

TEST(invalid_layouts_give_the_numbers)
{
    struct mesh m;
    EXPECT_EQ_INT(mesh_init(&m, 8, 2, 2, 3, 1, err, sizeof err), -1);
    EXPECT_STR_CONTAINS(err, "2 x dp_shard 2 x cp 3 = 12 ranks, but the communicator has 8");
    EXPECT_EQ_INT(mesh_init(&m, 8, 3, -1, 1, 1, err, sizeof err), -1);
    EXPECT_STR_CONTAINS(err, "8 is not a multiple of 3");
    EXPECT_EQ_INT(mesh_init(&m, 8, 1, 8, 1, 3, err, sizeof err), -1);
    EXPECT_STR_CONTAINS(err, "ep 3 must divide dp_shard x cp = 8 x 1 = 8");
    EXPECT_EQ_INT(mesh_init(&m, 8, 1, 2, 4, 2, err, sizeof err), -1);
    EXPECT_STR_CONTAINS(err, "ep 2 with cp 4");
    EXPECT_EQ_INT(mesh_init(&m, 8, 1, 0, 1, 1, err, sizeof err), -1);
    EXPECT_STR_CONTAINS(err, "dp_shard 0");
    /* sizes whose product wraps an int (each allowed up to 2^20): refused with the product,
     * where 65536 x 65536 = 0 in an int ended the process with a division by zero */
    EXPECT_EQ_INT(mesh_init(&m, 8, 65536, -1, 65536, 1, err, sizeof err), -1);
    EXPECT_STR_CONTAINS(err, "8 is not a multiple of 4294967296");
    EXPECT_EQ_INT(mesh_init(&m, 8, 1 << 20, 1 << 20, 1 << 20, 1, err, sizeof err), -1);
    EXPECT_STR_CONTAINS(err, "= 1152921504606846976 ranks, but the communicator has 8");
    /* ep = 1 with cp > 1: a dense model with context parallelism */
    EXPECT_EQ_INT(mesh_init(&m, 8, 1, -1, 4, 1, err, sizeof err), 0);
    EXPECT_EQ_INT(m.dp_shard, 2);
}

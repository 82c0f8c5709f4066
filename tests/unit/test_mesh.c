/* Mesh arithmetic: coordinates and group memberships as docs/design.md (Process groups) maps them,
 * and the layout rules, without MPI. */
#include "sharding/mesh.h"
#include "test.h"

/* World rank of member i of rank's group g, read from mesh_split (the colours and keys
 * runtime/comm/groups.c splits with): the rank of the same colour whose key is i; -1 when none
 * or more than one has it. */
static int member(const struct mesh *m, int rank, enum mesh_group g, int i)
{
    struct mesh_coords a, b;
    int found = -1, n = 0;
    mesh_coords(m, rank, &a);
    const struct mesh_split mine = mesh_split(m, &a, g);
    for (int r = 0; r < m->world; r++) {
        mesh_coords(m, r, &b);
        const struct mesh_split s = mesh_split(m, &b, g);
        if (s.color == mine.color && s.key == i) {
            found = r;
            n++;
        }
    }
    return n == 1 ? found : -1;
}

/* Members of rank's group g (the ranks of its colour). */
static int group_size(const struct mesh *m, int rank, enum mesh_group g)
{
    struct mesh_coords a, b;
    int n = 0;
    mesh_coords(m, rank, &a);
    const int color = mesh_split(m, &a, g).color;
    for (int r = 0; r < m->world; r++) {
        mesh_coords(m, r, &b);
        n += mesh_split(m, &b, g).color == color;
    }
    return n;
}

TEST(design_example_16_ranks_dp_shard4_cp4_ep8)
{
    struct mesh m;
    struct mesh_coords c;
    ASSERT_EQ_INT(mesh_init(&m, 16, 1, 4, 4, 8), SHARDOPT_OK);
    /* dense group = all 16; EP groups {0-7}, {8-15}; expert shard groups {0,8}, {1,9}, ... */
    mesh_coords(&m, 9, &c);
    EXPECT_EQ_INT(c.d, 9);
    EXPECT_EQ_INT(c.shard, 2);
    EXPECT_EQ_INT(c.cp_index, 1);
    EXPECT_EQ_INT(c.ep_rank, 1);
    EXPECT_EQ_INT(c.xs_rank, 1);
    for (int i = 0; i < 8; i++)
        EXPECT_EQ_INT(member(&m, c.rank, MESH_EP, i), 8 + i);
    EXPECT_EQ_INT(mesh_xs_size(&m), 2);
    EXPECT_EQ_INT(member(&m, c.rank, MESH_XS, 0), 1);
    EXPECT_EQ_INT(member(&m, c.rank, MESH_XS, 1), 9);
    mesh_coords(&m, 7, &c);
    EXPECT_EQ_INT(member(&m, c.rank, MESH_XS, 0), 7);
    EXPECT_EQ_INT(member(&m, c.rank, MESH_XS, 1), 15);
    for (int i = 0; i < 16; i++)
        EXPECT_EQ_INT(member(&m, c.rank, MESH_DENSE, i), i);
}

TEST(replicas_are_row_major_outermost)
{
    struct mesh m;
    struct mesh_coords c;
    /* 8 ranks: dp_replicate 2 x dp_shard 2 x cp 2, ep 2 */
    ASSERT_EQ_INT(mesh_init(&m, 8, 2, 2, 2, 2), SHARDOPT_OK);
    mesh_coords(&m, 6, &c);
    EXPECT_EQ_INT(c.rep, 1);
    EXPECT_EQ_INT(c.shard, 1);
    EXPECT_EQ_INT(c.cp_index, 0);
    EXPECT_EQ_INT(c.d, 2);
    EXPECT_EQ_INT(member(&m, c.rank, MESH_REP, 0), 2);
    EXPECT_EQ_INT(member(&m, c.rank, MESH_REP, 1), 6);
    EXPECT_EQ_INT(member(&m, c.rank, MESH_DENSE, 0), 4);
    EXPECT_EQ_INT(member(&m, c.rank, MESH_EP, 0), 6);
    EXPECT_EQ_INT(member(&m, c.rank, MESH_EP, 1), 7);
    EXPECT_EQ_INT(member(&m, c.rank, MESH_XS, 0), 4);
    EXPECT_EQ_INT(member(&m, c.rank, MESH_XS, 1), 6);
}

TEST(every_rank_is_in_exactly_the_groups_that_list_it)
{
    /* membership is symmetric: if b is in a's group, a is in b's, at the rank b's group says;
     * each group's keys are its ranks 0 .. size - 1, its size what the mesh says, and the
     * coordinates name the same rank in it */
    const int layouts[][5] = {
        {8, 2, 2, 2, 2}, {16, 1, 4, 4, 8}, {12, 1, -1, 2, 2}, {6, 3, 2, 1, 1}};
    for (size_t L = 0; L < sizeof layouts / sizeof layouts[0]; L++) {
        const int *l = layouts[L];
        struct mesh m;
        ASSERT_EQ_INT(mesh_init(&m, l[0], l[1], l[2], l[3], l[4]), SHARDOPT_OK);
        const int size[MESH_GROUPS] = {m.dense, m.ep, mesh_xs_size(&m), m.dp_replicate};
        int bad = 0;
        for (int r = 0; r < m.world; r++) {
            struct mesh_coords a, b;
            mesh_coords(&m, r, &a);
            const int place[MESH_GROUPS] = {a.d, a.ep_rank, a.xs_rank, a.rep};
            for (int g = 0; g < MESH_GROUPS; g++) {
                bad += group_size(&m, r, (enum mesh_group)g) != size[g];
                bad += mesh_split(&m, &a, (enum mesh_group)g).key != place[g];
                for (int i = 0; i < size[g]; i++) {
                    const int o = member(&m, r, (enum mesh_group)g, i);
                    if (o < 0) {
                        bad++;
                        continue;
                    }
                    mesh_coords(&m, o, &b);
                    bad += member(&m, o, (enum mesh_group)g, place[g]) != r;
                    bad += b.rep != a.rep && g != MESH_REP;
                }
            }
            for (int i = 0; i < m.dp_replicate; i++) {
                mesh_coords(&m, member(&m, r, MESH_REP, i), &b);
                bad += b.rep != i || b.d != a.d;
            }
        }
        EXPECT_EQ_INT(bad, 0);
    }
}

TEST(invalid_layouts_give_the_numbers)
{
    struct mesh m;
    EXPECT_EQ_INT(mesh_init(&m, 8, 2, 2, 3, 1), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(),
                        "2 x dp_shard 2 x cp 3 = 12 ranks, but the communicator has 8");
    EXPECT_EQ_INT(mesh_init(&m, 8, 3, -1, 1, 1), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "8 is not a multiple of 3");
    EXPECT_EQ_INT(mesh_init(&m, 8, 1, 8, 1, 3), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "ep 3 must divide dp_shard x cp = 8 x 1 = 8");
    EXPECT_EQ_INT(mesh_init(&m, 8, 1, 2, 4, 2), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "ep 2 with cp 4");
    EXPECT_EQ_INT(mesh_init(&m, 8, 1, 0, 1, 1), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "dp_shard 0");
    /* sizes whose product wraps an int (each allowed up to 2^20): refused with the product,
     * where 65536 x 65536 = 0 in an int ended the process with a division by zero */
    EXPECT_EQ_INT(mesh_init(&m, 8, 65536, -1, 65536, 1), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "8 is not a multiple of 4294967296");
    EXPECT_EQ_INT(mesh_init(&m, 8, 1 << 20, 1 << 20, 1 << 20, 1), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(),
                        "= 1152921504606846976 ranks, but the communicator has 8");
    /* ep = 1 with cp > 1: a dense model with context parallelism */
    EXPECT_EQ_INT(mesh_init(&m, 8, 1, -1, 4, 1), SHARDOPT_OK);
    EXPECT_EQ_INT(m.dp_shard, 2);
}

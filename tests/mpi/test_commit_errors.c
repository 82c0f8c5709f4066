/* Commit's agreed failures as a trainer sees them: the same text on every rank (gathered and
 * compared here), carrying the failing rank's own reason and the group and range that are
 * wrong; and shardopt_shard_range, whose slices commit accepts on every layout of the world. */
#include "fixture.h"

#define MSG_LEN 1024

static int world, me;

static void world_read(void)
{
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
}

/* Every rank's shardopt_last_error() is rank 0's, byte for byte; returns rank 0's in out. */
static void expect_same_text_everywhere(char *out)
{
    char mine[MSG_LEN] = {0};
    char *all = calloc((size_t)world, MSG_LEN);
    snprintf(mine, sizeof mine, "%s", shardopt_last_error());
    MPI_Allgather(mine, MSG_LEN, MPI_CHAR, all, MSG_LEN, MPI_CHAR, MPI_COMM_WORLD);
    for (int r = 1; r < world; r++)
        if (strcmp(all, all + (size_t)r * MSG_LEN) != 0)
            TEST_FAIL_("rank %d's message differs from rank 0's:\n  rank 0: %s\n  rank %d: %s", r,
                       all, r, all + (size_t)r * MSG_LEN);
    snprintf(out, MSG_LEN, "%s", all);
    free(all);
}

/* A register refused on rank 1 (and for another reason on rank 2): every rank's commit returns
 * rank 1's own reason, in one text. Before, rank 0 got "rank 1 failed to register 1
 * parameter(s) (see its log)" and rank 1 its own wording. */
TEST(a_failed_register_gives_every_rank_the_reason)
{
    world_read();
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_runtime_t rt = fixture_runtime_on(MPI_COMM_WORLD, &cfg);
    static float w[64], g[64];
    shardopt_param_desc_t d = fixture_desc("w", 2, 4, 16, 1, NULL, NULL);
    shardopt_param_t h;
    int64_t off, len;
    ASSERT_EQ_INT(shardopt_shard_range(rt, &d, &off, &len, NULL), SHARDOPT_OK);
    d.shard_offset = off;
    d.shard_length = len;
    d.data = w;
    d.grad = g;
    if (me == 1)
        d.lr_mult = -1.0;
    if (me == 2)
        d.ndim = 5;
    shardopt_status_t st = shardopt_register(rt, &d, &h);
    EXPECT_EQ_INT(st, me == 1 || me == 2 ? SHARDOPT_ERR_INVALID_ARGUMENT : SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_commit(rt), SHARDOPT_ERR_MISMATCH);
    char text[MSG_LEN];
    expect_same_text_everywhere(text);
    EXPECT_STR_CONTAINS(text, "commit: rank 1: 1 parameter(s) failed to register");
    EXPECT_STR_CONTAINS(text, "register 'w': lr_mult = -1: accepted [0, 1e6)");
    shardopt_finalize(rt);
}

/* 4 ranks as dp_shard 2 x cp 2, ep 2: an [6, 4, 8] expert stack along dim 0, each EP rank's 3
 * experts in chunks over its expert shard group (ranks {0, 2} for EP rank 0, {1, 3} for EP
 * rank 1). `whole` says which EP ranks' groups register the stack whole on both members. */
static void expert_tiling_case(int whole_ep0, int whole_ep1, char *text)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    cfg.cp = 2;
    cfg.ep = 2;
    shardopt_runtime_t rt = fixture_runtime_on(MPI_COMM_WORLD, &cfg);
    static float w[6 * 4 * 8], g[6 * 4 * 8];
    shardopt_param_desc_t d = fixture_desc("experts.w1", 3, 6, 4, 8, w, g);
    shardopt_param_t h;
    d.placement = SHARDOPT_PLACEMENT_EXPERT;
    ASSERT_EQ_INT(shardopt_shard_range(rt, &d, &d.shard_offset, &d.shard_length, NULL),
                  SHARDOPT_OK);
    const int ep_rank = me % 2;
    if ((ep_rank == 0 && whole_ep0) || (ep_rank == 1 && whole_ep1)) {
        d.shard_offset = 0;
        d.shard_length = -1;
    }
    ASSERT_EQ_INT(shardopt_register(rt, &d, &h), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_commit(rt), SHARDOPT_ERR_MISMATCH);
    expect_same_text_everywhere(text);
    shardopt_finalize(rt);
}

/* Before: rank 0 printed "do not tile [0, 3) over the expert shard group of rank 1" (its own
 * range, another group), and with both groups wrong rank 1 named a group it is not in. */
TEST(an_expert_tiling_error_names_the_group_and_range_that_fail)
{
    world_read();
    ASSERT_EQ_INT(world, 4); /* registered on 4 ranks: the layout of the report */
    char text[MSG_LEN];
    expert_tiling_case(0, 1, text);
    EXPECT_STR_CONTAINS(text, "commit: rank 1: the shards of 'experts.w1' along dim 0 do not tile "
                              "[0, 3) over the expert shard group of EP rank 1 (ranks 1, 3): "
                              "rank 3's [0, 3) overlaps the slices before it");
    EXPECT_STR_CONTAINS(text, "EP rank 1 holds experts [3, 6) of 6");
    EXPECT_TRUE(strstr(text, "EP rank 0") == NULL);
    expert_tiling_case(1, 1, text);
    EXPECT_STR_CONTAINS(text, "commit: rank 0: the shards of 'experts.w1' along dim 0 do not tile "
                              "[0, 3) over the expert shard group of EP rank 0 (ranks 0, 2): "
                              "rank 2's [0, 3) overlaps");
}

/* A shape that differs on the last rank: one text everywhere, the shapes as registered (2-D),
 * not padded to three dims. */
TEST(a_differing_parameter_is_reported_alike_with_its_registered_shape)
{
    world_read();
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_runtime_t rt = fixture_runtime_on(MPI_COMM_WORLD, &cfg);
    static float w[8 * 16], g[8 * 16];
    shardopt_param_desc_t d = fixture_desc("w", 2, me == world - 1 ? 8 : 7, 16, 1, w, g);
    shardopt_param_t h;
    ASSERT_EQ_INT(shardopt_shard_range(rt, &d, &d.shard_offset, &d.shard_length, NULL),
                  SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_register(rt, &d, &h), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_commit(rt), SHARDOPT_ERR_MISMATCH);
    char text[MSG_LEN], want[256];
    expect_same_text_everywhere(text);
    snprintf(want, sizeof want,
             "commit: rank %d: parameter #0 'w' differs in shape: this rank has [8, 16] ('w'), "
             "rank 0 has [7, 16]",
             world - 1);
    EXPECT_STR_CONTAINS(text, want);
    shardopt_finalize(rt);
}

/* The descriptor's enums differing between ranks are named as they are written (bf16, not 1),
 * and a multiplier apart in its last bits shows its every digit (%g printed 0.1 for both). */
static void differing_field_case(int field, char *text)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_runtime_t rt = fixture_runtime_on(MPI_COMM_WORLD, &cfg);
    static float w[8 * 16], g[8 * 16];
    shardopt_param_desc_t d = fixture_desc("w", 2, 8, 16, 1, w, g);
    shardopt_param_t h;
    const int last = me == world - 1;
    if (field == 0 && last)
        d.param_dtype = d.grad_dtype = SHARDOPT_DTYPE_BF16; /* w as bf16: half its bytes */
    if (field == 1 && last)
        d.algo = SHARDOPT_ALGO_ADAMW;
    if (field == 2)
        d.lr_mult = last ? nextafter(0.1, 1.0) : 0.1;
    ASSERT_EQ_INT(shardopt_shard_range(rt, &d, &d.shard_offset, &d.shard_length, NULL),
                  SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_register(rt, &d, &h), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_commit(rt), SHARDOPT_ERR_MISMATCH);
    expect_same_text_everywhere(text);
    shardopt_finalize(rt);
}

TEST(differing_dtypes_algos_and_multipliers_are_named_and_printed_apart)
{
    world_read();
    char text[MSG_LEN], want[256];
    differing_field_case(0, text);
    snprintf(want, sizeof want,
             "commit: rank %d: parameter #0 'w' differs in param_dtype: this rank has bf16 ('w'), "
             "rank 0 has fp32",
             world - 1);
    EXPECT_STR_CONTAINS(text, want);
    differing_field_case(1, text);
    EXPECT_STR_CONTAINS(text, "differs in algo: this rank has adamw ('w'), rank 0 has muon");
    differing_field_case(2, text);
    EXPECT_STR_CONTAINS(text, "differs in lr_mult: this rank has 0.10000000000000002 ('w'), rank "
                              "0 has 0.10000000000000001");
}

/* A global expert offset (what a trainer that indexes the whole stack writes) is refused at
 * register with the rule: offsets count from this EP rank's first expert. */
TEST(a_global_expert_offset_is_refused_with_the_rule)
{
    world_read();
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    cfg.ep = world;
    shardopt_runtime_t rt = fixture_runtime_on(MPI_COMM_WORLD, &cfg);
    static float w[2 * 3 * 4];
    shardopt_param_desc_t d = fixture_desc("experts.w2", 3, 2 * world, 3, 4, w, w);
    shardopt_param_t h;
    d.placement = SHARDOPT_PLACEMENT_EXPERT;
    d.shard_offset = 2 * me; /* global: wrong on every rank but 0 */
    d.shard_length = 2;
    shardopt_status_t st = shardopt_register(rt, &d, &h);
    if (me == 0) {
        EXPECT_EQ_INT(st, SHARDOPT_OK);
    } else {
        char want[256];
        EXPECT_EQ_INT(st, SHARDOPT_ERR_INVALID_ARGUMENT);
        snprintf(want, sizeof want,
                 "offsets along dim 0 count from this EP rank's first expert (EP rank %d holds "
                 "experts [%d, %d) of %d: register a slice of [0, 2)",
                 me, 2 * me, 2 * me + 2, 2 * world);
        EXPECT_STR_CONTAINS(shardopt_last_error(), want);
    }
    shardopt_finalize(rt);
}

/* torch.chunk, written here from its definition. */
static void chunk(int64_t n, int parts, int i, int64_t *lo, int64_t *len)
{
    const int64_t c = (n + parts - 1) / parts;
    *lo = c * i < n ? c * i : n;
    *len = *lo + c < n ? c : n - *lo;
}

/* For every valid layout of the world: the slices shardopt_shard_range gives for uneven dense
 * shards (both dims), a replicated norm and expert stacks (along dim 0 and dim 2) are the
 * torch.chunk slices docs/api.md describes, and commit (which checks that every group's slices
 * tile each parameter exactly) accepts them. */
TEST(shard_range_gives_the_slices_commit_accepts_on_every_layout)
{
    world_read();
    int layouts = 0;
    for (int R = 1; R <= world; R++)
        for (int C = 1; C <= world; C++)
            for (int E = 1; E <= world; E++) {
                if (world % (R * C) != 0)
                    continue;
                const int S = world / R, dr = me % S;
                if (S % E != 0 || (E > 1 && E % C != 0))
                    continue;
                shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
                cfg.dp_replicate = R;
                cfg.cp = C;
                cfg.ep = E;
                shardopt_runtime_t rt = fixture_runtime_on(MPI_COMM_WORLD, &cfg);
                static float buf[5][4096], grad[5][4096];
                struct {
                    const char *name;
                    int ndim;
                    int64_t shape[3];
                    shardopt_placement_t placement;
                    int shard_dim;
                } t[5] = {
                    {"dense.rows", 2, {37, 5, 1}, SHARDOPT_PLACEMENT_DENSE, 0},
                    {"dense.cols", 2, {6, 11, 1}, SHARDOPT_PLACEMENT_DENSE, 1},
                    {"norm.weight", 1, {9, 1, 1}, SHARDOPT_PLACEMENT_REPLICATED, 0},
                    {"experts.w1", 3, {3 * E, 5, 7}, SHARDOPT_PLACEMENT_EXPERT, 0},
                    {"experts.w2", 3, {2 * E, 6, 5}, SHARDOPT_PLACEMENT_EXPERT, 2},
                };
                for (int i = 0; i < 5; i++) {
                    shardopt_param_desc_t d =
                        fixture_desc(t[i].name, t[i].ndim, t[i].shape[0], t[i].shape[1],
                                     t[i].shape[2], buf[i], grad[i]);
                    shardopt_param_t h;
                    int64_t off = -7, len = -7, glob = -7, want_lo, want_len, want_glob;
                    d.placement = t[i].placement;
                    d.shard_dim = t[i].shard_dim;
                    ASSERT_EQ_INT(shardopt_shard_range(rt, &d, &off, &len, &glob), SHARDOPT_OK);
                    const int64_t dim = t[i].shape[t[i].shard_dim];
                    if (t[i].placement == SHARDOPT_PLACEMENT_DENSE) {
                        chunk(dim, S, dr, &want_lo, &want_len);
                        want_glob = want_lo;
                    } else if (t[i].placement == SHARDOPT_PLACEMENT_REPLICATED) {
                        want_lo = want_glob = 0;
                        want_len = dim;
                    } else if (t[i].shard_dim == 0) { /* EP rank dr % E, member dr / E */
                        chunk(dim / E, S / E, dr / E, &want_lo, &want_len);
                        want_glob = (dr % E) * (dim / E) + want_lo;
                    } else {
                        chunk(dim, S / E, dr / E, &want_lo, &want_len);
                        want_glob = want_lo;
                    }
                    EXPECT_EQ_INT(off, want_lo);
                    EXPECT_EQ_INT(len, want_len);
                    EXPECT_EQ_INT(glob, want_glob);
                    d.shard_offset = off;
                    d.shard_length = len;
                    ASSERT_EQ_INT(shardopt_register(rt, &d, &h), SHARDOPT_OK);
                }
                EXPECT_EQ_INT(shardopt_commit(rt), SHARDOPT_OK);
                shardopt_finalize(rt);
                layouts++;
            }
    EXPECT_TRUE(layouts >= 2);
}

TEST(shard_range_refuses_what_register_would)
{
    world_read();
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    cfg.ep = world;
    shardopt_runtime_t rt = fixture_runtime_on(MPI_COMM_WORLD, &cfg);
    int64_t off, len;
    shardopt_param_desc_t d = fixture_desc("experts.w3", 3, world + 1, 4, 4, NULL, NULL);
    d.placement = SHARDOPT_PLACEMENT_EXPERT;
    EXPECT_EQ_INT(shardopt_shard_range(rt, NULL, &off, &len, NULL), SHARDOPT_ERR_INVALID_ARGUMENT);
    if (world > 1) {
        EXPECT_EQ_INT(shardopt_shard_range(rt, &d, &off, &len, NULL),
                      SHARDOPT_ERR_INVALID_ARGUMENT);
        EXPECT_STR_CONTAINS(shardopt_last_error(), "cannot be split over ep");
    }
    d.shape[0] = world;
    d.shard_dim = 3;
    EXPECT_EQ_INT(shardopt_shard_range(rt, &d, &off, &len, NULL), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "shard_dim = 3: accepted 0..2");
    shardopt_finalize(rt);
}

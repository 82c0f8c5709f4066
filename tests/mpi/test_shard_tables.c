/* Commit's shard tables on 4 ranks (dp_shard 2 x cp 2, ep 2): a parameter whose every member
 * registered its torch.chunk piece is computed from the layout, any other is gathered
 * (sharding/shard_table.h). A run where some parameters, in some groups only, are sliced
 * otherwise (pieces out of chunk order, an empty piece) must step to the same bits as the run
 * where shardopt_shard_range slices everything, and a slicing that does not tile is still
 * refused with the message that names its group and range. */
#include "fixture.h"

enum { NPAR = 5, STEPS = 2 };

static int world, me;

static const struct {
    const char *name;
    int ndim;
    int64_t shape[3];
    shardopt_placement_t placement;
    int shard_dim;
} T[NPAR] = {
    {"layers.0.attn.q.weight", 2, {37, 16, 1}, SHARDOPT_PLACEMENT_DENSE, 0},
    {"layers.0.attn.o.weight", 2, {12, 22, 1}, SHARDOPT_PLACEMENT_DENSE, 1},
    {"layers.0.mlp.experts.w1", 3, {4, 8, 6}, SHARDOPT_PLACEMENT_EXPERT, 1},
    {"layers.0.mlp.experts.w2", 3, {4, 6, 10}, SHARDOPT_PLACEMENT_EXPERT, 0},
    {"layers.0.norm.weight", 1, {16, 1, 1}, SHARDOPT_PLACEMENT_REPLICATED, 0},
};

static int64_t numel(int t) { return T[t].shape[0] * T[t].shape[1] * T[t].shape[2]; }

static float value(int t, int64_t i, int grad)
{
    return grad ? (float)(((i * 37 + t * 11) % 23) - 11) * 0.01f
                : (float)(((i * 13 + t * 7) % 17) - 8) * 0.05f + (t == 4 ? 1.0f : 0.0f);
}

/* The box a rank holds (global coordinates), from what it registers. */
static void box_of(int t, int64_t offset, int64_t length, int ep_rank, int ep, int64_t lo[3],
                   int64_t len[3])
{
    for (int d = 0; d < 3; d++) {
        lo[d] = 0;
        len[d] = T[t].shape[d];
    }
    if (T[t].placement == SHARDOPT_PLACEMENT_EXPERT) {
        len[0] = T[t].shape[0] / ep;
        lo[0] = ep_rank * len[0];
    }
    lo[T[t].shard_dim] += offset;
    len[T[t].shard_dim] = length;
}

/* Another tiling than torch.chunk's where the group has room for one: the chunk pieces' lengths
 * in reverse member order (37 rows over 4: 7, 10, 10, 10 instead of 10, 10, 10, 7); the expert
 * stack along its rows in EP rank 1's group only, all rows on its first member and none on the
 * second, so that one expert shard group gathers and the other computes. */
static void skewed(int t, const shardopt_stats_t *s, int64_t *offset, int64_t *length)
{
    if (t == 0 || t == 1) {
        const int64_t n = T[t].shape[T[t].shard_dim], c = (n + 3) / 4;
        int64_t lo = 0;
        for (int m = 0; m < s->dense_rank; m++) {
            const int r = s->dense_size - 1 - m; /* chunk piece r's length */
            lo += c * r < n ? (c * (r + 1) < n ? c : n - c * r) : 0;
        }
        const int r = s->dense_size - 1 - s->dense_rank;
        *offset = lo;
        *length = c * r < n ? (c * (r + 1) < n ? c : n - c * r) : 0;
    } else if (t == 2 && s->ep_rank == 1) {
        *offset = 0;
        *length = s->expert_shard_rank == 0 ? T[t].shape[1] : 0;
    }
}

struct run {
    shardopt_runtime_t rt;
    float *w[NPAR], *g[NPAR];
    int64_t lo[NPAR][3], len[NPAR][3];
};

enum slicing { CHUNK, SKEWED, OVERLAP };

/* Register every tensor sliced as `how` says, commit, step STEPS times. OVERLAP: torch.chunk,
 * but the last rank registers the first tensor's rows [0, 7), the first rank's. */
static shardopt_status_t run(struct run *r, enum slicing how)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_stats_t s = SHARDOPT_STATS_INIT;
    cfg.cp = 2;
    cfg.ep = 2;
    r->rt = fixture_runtime_on(MPI_COMM_WORLD, &cfg);
    if (shardopt_get_stats(r->rt, &s) != SHARDOPT_OK)
        return SHARDOPT_ERR_INTERNAL;
    for (int t = 0; t < NPAR; t++) {
        shardopt_param_desc_t d = fixture_desc(T[t].name, T[t].ndim, T[t].shape[0], T[t].shape[1],
                                               T[t].shape[2], NULL, NULL);
        shardopt_param_t h;
        d.placement = T[t].placement;
        d.shard_dim = T[t].shard_dim;
        if (shardopt_shard_range(r->rt, &d, &d.shard_offset, &d.shard_length, NULL) != SHARDOPT_OK)
            return SHARDOPT_ERR_INTERNAL;
        if (how == SKEWED)
            skewed(t, &s, &d.shard_offset, &d.shard_length);
        if (how == OVERLAP && t == 0 && s.rank == world - 1) {
            d.shard_offset = 0;
            d.shard_length = 7;
        }
        box_of(t, d.shard_offset, d.shard_length, s.ep_rank, s.ep_size, r->lo[t], r->len[t]);
        const int64_t n = r->len[t][0] * r->len[t][1] * r->len[t][2];
        r->w[t] = malloc(sizeof(float) * (size_t)(n + 1));
        r->g[t] = malloc(sizeof(float) * (size_t)(n + 1));
        int64_t i = 0;
        for (int64_t a = 0; a < r->len[t][0]; a++)
            for (int64_t b = 0; b < r->len[t][1]; b++)
                for (int64_t c = 0; c < r->len[t][2]; c++, i++) {
                    const int64_t at =
                        ((r->lo[t][0] + a) * T[t].shape[1] + r->lo[t][1] + b) * T[t].shape[2] +
                        r->lo[t][2] + c;
                    r->w[t][i] = value(t, at, 0);
                    r->g[t][i] = value(t, at, 1);
                }
        d.data = r->w[t];
        d.grad = r->g[t];
        if (shardopt_register(r->rt, &d, &h) != SHARDOPT_OK)
            return SHARDOPT_ERR_INTERNAL;
    }
    shardopt_status_t st = shardopt_commit(r->rt);
    shardopt_step_args_t args = SHARDOPT_STEP_ARGS_INIT;
    args.lr = 0.02;
    for (int k = 0; k < STEPS && st == SHARDOPT_OK; k++)
        st = shardopt_step(r->rt, &args);
    return st;
}

static void run_free(struct run *r)
{
    shardopt_finalize(r->rt);
    for (int t = 0; t < NPAR; t++) {
        free(r->w[t]);
        free(r->g[t]);
    }
}

/* Tensor t, whole, as the bits every rank holds of it (each element from one holder: OR of the
 * holders' bits and everyone else's zeros). */
static uint32_t *whole(const struct run *r, int t)
{
    uint32_t *out = calloc((size_t)numel(t), sizeof(uint32_t));
    int64_t i = 0;
    if (T[t].placement != SHARDOPT_PLACEMENT_REPLICATED || me == 0)
        for (int64_t a = 0; a < r->len[t][0]; a++)
            for (int64_t b = 0; b < r->len[t][1]; b++)
                for (int64_t c = 0; c < r->len[t][2]; c++, i++) {
                    const int64_t at =
                        ((r->lo[t][0] + a) * T[t].shape[1] + r->lo[t][1] + b) * T[t].shape[2] +
                        r->lo[t][2] + c;
                    memcpy(&out[at], &r->w[t][i], sizeof(float));
                }
    MPI_Allreduce(MPI_IN_PLACE, out, (int)numel(t), MPI_UINT32_T, MPI_BOR, MPI_COMM_WORLD);
    return out;
}

TEST(a_slicing_other_than_torch_chunk_steps_to_the_same_bits)
{
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    ASSERT_EQ_INT(world, 4);
    struct run a, b;
    ASSERT_EQ_INT(run(&a, CHUNK), SHARDOPT_OK);
    ASSERT_EQ_INT(run(&b, SKEWED), SHARDOPT_OK);
    /* the skew did change what some rank holds of the dense tensors and of the expert stack */
    int moved = memcmp(a.lo, b.lo, sizeof a.lo) != 0 || memcmp(a.len, b.len, sizeof a.len) != 0;
    MPI_Allreduce(MPI_IN_PLACE, &moved, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
    EXPECT_TRUE(moved);
    for (int t = 0; t < NPAR; t++) {
        uint32_t *x = whole(&a, t), *y = whole(&b, t);
        int64_t changed = 0, differ = 0;
        for (int64_t i = 0; i < numel(t); i++) {
            float v;
            memcpy(&v, &x[i], sizeof v);
            changed += v != value(t, i, 0);
            differ += x[i] != y[i];
        }
        EXPECT_TRUE(changed > 0);
        if (differ != 0)
            TEST_FAIL_("'%s': %lld of %lld elements differ between the torch.chunk and the skewed "
                       "slicing",
                       T[t].name, (long long)differ, (long long)numel(t));
        free(x);
        free(y);
    }
    run_free(&a);
    run_free(&b);
}

/* A member that registers another's rows: the parameter is no longer torch.chunk on every
 * member, so its slices are gathered and checked, and commit fails on every rank with the one
 * text that names the group, the range and the rank (runtime/commit_check.c). */
TEST(a_slicing_that_does_not_tile_is_refused_naming_group_range_and_rank)
{
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    ASSERT_EQ_INT(world, 4);
    struct run r;
    EXPECT_EQ_INT(run(&r, OVERLAP), SHARDOPT_ERR_MISMATCH);
    EXPECT_STR_CONTAINS(shardopt_last_error(),
                        "commit: rank 0: the shards of 'layers.0.attn.q.weight' along dim 0 do not "
                        "tile [0, 37) over the dense shard group (ranks 0, 1, 2, 3): rank 3's [0, "
                        "7) overlaps the slices before it");
    run_free(&r);
}

/* shardopt_param_get_stats on 4 ranks (dp_shard 2 x cp 2, ep 2): each parameter's gradient norm
 * and update RMS equal what the test computes from the whole tensors, and the Newton-Schulz
 * owner every rank names is the rank that says it orthogonalizes the matrix. */
#include "fixture.h"

static int world, me;

enum { NPAR = 3 };

/* Whole tensors, the same on every rank: a dense matrix with uneven shards, an expert stack and
 * a replicated norm. */
static const struct {
    const char *name;
    int ndim;
    int64_t shape[3];
    shardopt_placement_t placement;
} T[NPAR] = {
    {"layers.0.attn.q.weight", 2, {37, 16, 1}, SHARDOPT_PLACEMENT_DENSE},
    {"layers.0.mlp.experts.w1", 3, {4, 8, 6}, SHARDOPT_PLACEMENT_EXPERT},
    {"layers.0.norm.weight", 1, {16, 1, 1}, SHARDOPT_PLACEMENT_REPLICATED},
};

static int64_t numel(int t) { return T[t].shape[0] * T[t].shape[1] * T[t].shape[2]; }

static float value(int t, int64_t i, int grad)
{
    return grad ? (float)(((i * 37 + t * 11) % 23) - 11) * 0.01f
                : (float)(((i * 13 + t * 7) % 17) - 8) * 0.05f + (t == 2 ? 1.0f : 0.0f);
}

struct run {
    shardopt_runtime_t rt;
    shardopt_param_t h[NPAR];
    float *w[NPAR], *g[NPAR];
    int64_t first[NPAR], count[NPAR]; /* flat range of the whole tensor this rank holds */
};

static void run_setup(struct run *r, int param_stats)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    cfg.cp = 2;
    cfg.ep = 2;
    cfg.param_stats = param_stats;
    cfg.weight_decay_1d = 1; /* so that the norm's update is not its gradient step alone */
    r->rt = fixture_runtime_on(MPI_COMM_WORLD, &cfg);
    for (int t = 0; t < NPAR; t++) {
        shardopt_param_desc_t d = fixture_desc(T[t].name, T[t].ndim, T[t].shape[0], T[t].shape[1],
                                               T[t].shape[2], NULL, NULL);
        int64_t glob, row = numel(t) / T[t].shape[0];
        d.placement = T[t].placement;
        ASSERT_EQ_INT(shardopt_shard_range(r->rt, &d, &d.shard_offset, &d.shard_length, &glob),
                      SHARDOPT_OK);
        r->first[t] = glob * row;
        r->count[t] = d.shard_length * row;
        r->w[t] = malloc(sizeof(float) * (size_t)(r->count[t] + 1));
        r->g[t] = malloc(sizeof(float) * (size_t)(r->count[t] + 1));
        for (int64_t i = 0; i < r->count[t]; i++) {
            r->w[t][i] = value(t, r->first[t] + i, 0);
            r->g[t][i] = value(t, r->first[t] + i, 1);
        }
        d.data = r->w[t];
        d.grad = r->g[t];
        ASSERT_EQ_INT(shardopt_register(r->rt, &d, &r->h[t]), SHARDOPT_OK);
    }
    ASSERT_EQ_INT(shardopt_commit(r->rt), SHARDOPT_OK);
}

static void run_free(struct run *r)
{
    shardopt_finalize(r->rt);
    for (int t = 0; t < NPAR; t++) {
        free(r->w[t]);
        free(r->g[t]);
    }
}

TEST(param_stats_match_the_whole_tensors)
{
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    ASSERT_EQ_INT(world, 4);
    struct run r;
    run_setup(&r, 1);
    shardopt_param_stats_t ps = SHARDOPT_PARAM_STATS_INIT;
    ASSERT_EQ_INT(shardopt_param_get_stats(r.h[0], &ps), SHARDOPT_OK);
    EXPECT_TRUE(isnan(ps.grad_norm)); /* no step yet */
    shardopt_step_args_t args = SHARDOPT_STEP_ARGS_INIT;
    args.lr = 0.02;
    ASSERT_EQ_INT(shardopt_step(r.rt, &args), SHARDOPT_OK);
    for (int t = 0; t < NPAR; t++) {
        ASSERT_EQ_INT(shardopt_param_get_stats(r.h[t], &ps), SHARDOPT_OK);
        double g2 = 0.0;
        for (int64_t i = 0; i < numel(t); i++)
            g2 += (double)value(t, i, 1) * value(t, i, 1);
        EXPECT_NEAR(ps.grad_norm, sqrt(g2), 1e-9 * sqrt(g2));
        /* the change over the whole tensor: each rank's part once (the norm: rank 0's copy) */
        double d2 = 0.0;
        if (T[t].placement != SHARDOPT_PLACEMENT_REPLICATED || me == 0)
            for (int64_t i = 0; i < r.count[t]; i++) {
                const double d = (double)r.w[t][i] - (double)value(t, r.first[t] + i, 0);
                d2 += d * d;
            }
        MPI_Allreduce(MPI_IN_PLACE, &d2, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        const double rms = sqrt(d2 / (double)numel(t));
        EXPECT_TRUE(rms > 0);
        EXPECT_NEAR(ps.update_rms, rms, 1e-9 * rms);

        /* the owner everyone names is the rank that orthogonalizes it */
        int here = ps.ns_matrices_here, owner = ps.ns_owner_rank, lo = owner, hi = owner;
        MPI_Allreduce(MPI_IN_PLACE, &here, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        if (t == 0) { /* one matrix: one owner, named alike everywhere */
            EXPECT_EQ_INT(here, 1);
            EXPECT_EQ_INT(lo, hi);
            EXPECT_EQ_INT(ps.ns_matrices_here, owner == me ? 1 : 0);
        } else if (t == 1) { /* 4 experts over 2 EP ranks: each matrix once */
            EXPECT_EQ_INT(here, 4);
            EXPECT_TRUE(owner >= 0 && owner < world);
            /* the owner of this EP rank's first expert is in its expert shard group */
            EXPECT_EQ_INT(owner % 2, me % 2);
        } else { /* AdamW */
            EXPECT_EQ_INT(owner, -1);
            EXPECT_EQ_INT(here, 0);
        }
    }
    run_free(&r);
}

/* Without param_stats the step keeps no copy: the update RMS reads NaN, the gradient norm (the
 * pre-pass's) is still there. */
TEST(without_param_stats_only_the_gradient_norm)
{
    struct run r;
    run_setup(&r, 0);
    shardopt_step_args_t args = SHARDOPT_STEP_ARGS_INIT;
    args.lr = 0.02;
    ASSERT_EQ_INT(shardopt_step(r.rt, &args), SHARDOPT_OK);
    shardopt_param_stats_t ps = SHARDOPT_PARAM_STATS_INIT;
    ASSERT_EQ_INT(shardopt_param_get_stats(r.h[0], &ps), SHARDOPT_OK);
    EXPECT_TRUE(ps.grad_norm > 0);
    EXPECT_TRUE(isnan(ps.update_rms));
    shardopt_param_stats_t bad = {.size = 8, .version = 1};
    EXPECT_EQ_INT(shardopt_param_get_stats(r.h[0], &bad), SHARDOPT_ERR_INVALID_ARGUMENT);
    run_free(&r);
}

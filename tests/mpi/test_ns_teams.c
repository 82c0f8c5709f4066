/* Newton-Schulz teams run by the runtime (issue 22): the tiny preset on 4 or 8 ranks (ep 1, one
 * dense group of every rank), teams forced by ns_team_cap and ns_team_frac = 0.01 (every dense
 * Muon matrix is then heavy enough), against the same steps from the same shards with teams off
 * (ns_team_cap = 1, one owner per matrix). Each tensor's update (weights after minus before) is
 * compared in relative Frobenius norm over all ranks: fp32 within 1e-4, bf16 within 1.5e-2
 * (ns_compute bf16: the teams iterate in bf16 too, their Gram all-reduce carried in bf16, and a
 * bf16 run checks that they did). The same with dp_replicate 2 (the replicas' bits compared every
 * step) and with offload = optimizer. A checkpoint saved with teams on and resumed gives the bits
 * of the run that went on without it. The same with ns_precondition = aol (AOL's row scales from
 * the team's summed Gram matrix). Where teams cannot run (replica_split), a team cap is ignored
 * with a warning on rank 0 naming why, and the run has the bits of teams off. */
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/preset.h"
#include "bench/preset_shards.h"
#include "runtime/runtime.h"
#include "stderr_capture.h"
#include "test.h"

#define NSTEPS 2

static int me, ranks;
static int dense_n, dense_me; /* this rank's dense group: its size and this rank's place */
static int xs_n, xs_me;       /* this rank's expert shard group, the same */
/* the runs' ep and the dim their expert stacks are sharded along (preset_shards_register):
 * 0 (whole experts) but in expert_teams_match_one_owner_per_matrix */
static int run_ep = 1, run_xdim = 0;

struct run_out {
    float *w0, *w;    /* this rank's weights before and after, every tensor's shard in order */
    int64_t *at;      /* [p.n + 1]: where each tensor's shard starts */
    int nteams;       /* the dense plan's team matrices */
    int xteams;       /* this rank's expert shard group plan's */
    int64_t matrices; /* stats.muon_matrices */
    uint64_t dense;   /* dense exchange bytes sent + received */
    int ns_bf16;      /* ns_compute resolved to bf16 */
    int team_bf16;    /* the teams iterated in bf16 (runtime.h's team_compute) */
};

static float *weights(const struct preset *p, const struct preset_shards *ps, int64_t *at)
{
    float *out = malloc(sizeof(float) * (size_t)(ps->local + 1));
    int64_t o = 0;
    for (int i = 0; out != NULL && i < p->n; i++) {
        struct preset_shard sh;
        const int x = p->t[i].expert;
        preset_shard_of(&p->t[i], run_ep, x ? xs_n : dense_n, x ? xs_me : dense_me, run_xdim, &sh);
        if (at != NULL)
            at[i] = o;
        memcpy(out + o, ps->w[i], sizeof(float) * (size_t)sh.numel);
        o += sh.numel;
    }
    if (at != NULL)
        at[p->n] = o;
    return out;
}

static int replicas = 1;                                   /* dp_replicate of the runs */
static shardopt_offload_t offload = SHARDOPT_OFFLOAD_NONE; /* of the runs with teams */

/* Init under cfg, then this rank's shards of the tiny preset: seed 4242 + its dense rank (the
 * replicas hold the same shards). */
static shardopt_status_t start(shardopt_config_t *cfg, const struct preset *p,
                               shardopt_runtime_t *rt, struct preset_shards *ps)
{
    shardopt_status_t st = shardopt_init(MPI_COMM_WORLD, cfg, rt);
    if (st != SHARDOPT_OK)
        return st;
    shardopt_stats_t s = SHARDOPT_STATS_INIT;
    shardopt_get_stats(*rt, &s);
    dense_n = s.dense_size;
    dense_me = s.dense_rank;
    xs_n = s.expert_shard_size;
    xs_me = s.expert_shard_rank;
    return preset_shards_register(*rt, p, run_xdim, 4242 + (uint64_t)dense_me, NULL, ps);
}

static int aol, split; /* the runs' ns_precondition = aol, replica_split */

static shardopt_config_t config(int cap, int bf16)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    cfg.dp_replicate = replicas;
    cfg.replica_check_every = replicas > 1; /* the replicas' bits compared after every step */
    cfg.ep = run_ep;
    cfg.num_threads = 1;
    cfg.ns_team_cap = cap;
    cfg.offload = cap > 1 ? offload : SHARDOPT_OFFLOAD_NONE;
    cfg.ns_team_frac = 0.01;
    cfg.comm_dtype = bf16 ? SHARDOPT_DTYPE_BF16 : SHARDOPT_DTYPE_FP32;
    cfg.ns_compute = bf16 ? SHARDOPT_NS_COMPUTE_AUTO : SHARDOPT_NS_COMPUTE_FP32;
    if (aol) { /* aol runs on gathered matrices only (config.c) */
        cfg.ns_precondition = SHARDOPT_NS_PRECONDITION_AOL;
        cfg.ns_strategy = SHARDOPT_NS_STRATEGY_GATHER;
    }
    cfg.replica_split = split;
    return cfg;
}

static int steps(shardopt_runtime_t rt, int n)
{
    for (int s = 0; s < n; s++) {
        shardopt_step_args_t a = SHARDOPT_STEP_ARGS_INIT;
        a.lr = 0.02;
        if (shardopt_step(rt, &a) != SHARDOPT_OK)
            return -1;
    }
    return 0;
}

/* NSTEPS steps under cfg from the shards of seed 4242 + rank. */
static int run(const struct preset *p, shardopt_config_t cfg, struct run_out *o)
{
    shardopt_runtime_t rt = NULL;
    struct preset_shards ps;
    memset(o, 0, sizeof *o);
    if (start(&cfg, p, &rt, &ps) != SHARDOPT_OK)
        return -1;
    o->at = malloc(sizeof(int64_t) * (size_t)(p->n + 1));
    o->w0 = weights(p, &ps, o->at);
    if (steps(rt, NSTEPS) != 0)
        return -1;
    o->w = weights(p, &ps, NULL);
    o->nteams = rt->gx[GROUP_DENSE].plan.nteams;
    o->xteams = rt->gx[GROUP_EXPERT].plan.nteams;
    o->ns_bf16 = rt->ns_compute == KDT_BF16;
    o->team_bf16 = rt->team_compute == KDT_BF16;
    shardopt_stats_t st = SHARDOPT_STATS_INIT;
    shardopt_get_stats(rt, &st);
    o->matrices = st.muon_matrices;
    preset_shards_free(&ps);
    shardopt_finalize(rt);
    return o->w0 != NULL && o->w != NULL && o->at != NULL ? 0 : -1;
}

static void run_free(struct run_out *o)
{
    free(o->w0);
    free(o->w);
    free(o->at);
}

/* The largest relative Frobenius difference, over the tensors (the expert stacks only: experts
 * 1), of the updates of a and b (b the reference), each tensor's sums taken over every rank. */
static double worst_update_diff(const struct preset *p, const struct run_out *a,
                                const struct run_out *b, const char **which, int experts)
{
    double *s = calloc(2 * (size_t)p->n, sizeof(double)), worst = 0;
    for (int i = 0; i < p->n; i++)
        for (int64_t e = a->at[i]; e < a->at[i + 1]; e++) {
            const double ua = (double)a->w[e] - a->w0[e], ub = (double)b->w[e] - b->w0[e];
            s[2 * i] += (ua - ub) * (ua - ub);
            s[2 * i + 1] += ub * ub;
        }
    MPI_Allreduce(MPI_IN_PLACE, s, 2 * p->n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    for (int i = 0; i < p->n; i++) {
        const double r = s[2 * i + 1] > 0 ? sqrt(s[2 * i] / s[2 * i + 1]) : sqrt(s[2 * i]);
        if ((r > worst || isnan(r)) && (!experts || p->t[i].expert)) {
            worst = r;
            *which = p->t[i].name;
        }
    }
    free(s);
    return worst;
}

/* the runs' preset and MoE layers (0: its own): tiny but in expert_teams_... */
static const char *run_preset = "tiny";
static int run_layers;

static void load_tiny(struct preset *p)
{
    char err[256];
    struct preset_scale sc = {run_layers, 1, 1};
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    if (preset_load(run_preset, SHARDOPT_PRESET_DIR, &sc, p, err, sizeof err) != 0) {
        fprintf(stderr, "preset: %s\n", err);
        abort();
    }
}

/* Teams of 2 and of the whole dense group (one node here), fp32 (and bf16) against teams off */
static void teams_against_owners(int with_bf16)
{
    struct preset p;
    load_tiny(&p);
    for (int bf16 = 0; bf16 <= with_bf16; bf16++) {
        struct run_out off;
        ASSERT_EQ_INT(run(&p, config(1, bf16), &off), 0);
        EXPECT_EQ_INT(off.nteams, 0);
        const int caps[2] = {2, ranks / replicas};
        for (int c = 0; c < (caps[1] > caps[0] ? 2 : 1); c++) {
            const int cap = caps[c];
            struct run_out on;
            const char *which = "";
            ASSERT_EQ_INT(run(&p, config(cap, bf16), &on), 0);
            EXPECT_TRUE(on.nteams > 0);
            /* experts sharded along a matrix dim: no member holds one whole, so they team too */
            EXPECT_TRUE(run_xdim == 0 || on.xteams > 0);
            EXPECT_TRUE(run_xdim != 0 || on.xteams == 0);
            /* bf16 Newton-Schulz (auto: where the CPU has native bf16) runs its teams in bf16 */
            EXPECT_EQ_INT(on.team_bf16, bf16 && on.ns_bf16);
            /* a team's matrix counts once (on its lead): the job's total is unchanged */
            int64_t total[2] = {on.matrices, off.matrices};
            MPI_Allreduce(MPI_IN_PLACE, total, 2, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
            EXPECT_EQ_INT(total[0], total[1]);
            const char *xwhich = "";
            const double d = worst_update_diff(&p, &on, &off, &which, 0),
                         dx = worst_update_diff(&p, &on, &off, &xwhich, 1);
            if (me == 0)
                printf("  ep %d, experts sharded along dim %d, %s, teams of up to %d: worst update "
                       "difference %.3g (%s), of the experts %.3g (%s)\n",
                       run_ep, run_xdim, bf16 ? "bf16" : "fp32", cap, d, which, dx, xwhich);
            EXPECT_TRUE(d <= (bf16 ? 1.5e-2 : 1e-4));
            EXPECT_TRUE(d > 0); /* the teams computed (their sums run in another order) */
            EXPECT_TRUE(run_xdim == 0 || dx > 0); /* and the experts' teams */
            run_free(&on);
        }
        run_free(&off);
    }
    preset_free(&p);
}

TEST(team_updates_match_one_owner_per_matrix) { teams_against_owners(1); }

/* Expert shard groups plan and run teams as the dense group does (issue 22): tiny-experts' two
 * wide experts per stack sharded along their columns, so that no member holds one whole and each
 * team member's block is mostly its own piece (along rows a team member gathers more than one
 * owner sends back, and the group's choice, which counts the exchange, keeps one owner), over an
 * expert shard group of every rank (ep 1) and of every other rank (ep 2: {0, 2}, {1, 3}, ...
 * whose team communicators are made from the expert shard group's), teams forced small as above.
 * An expert group keeps teams only where its latest member finishes earlier with them
 * (plan_cfg.team_guard): one MoE layer on 4 ranks, two on 8, hold more matrices than the group
 * has members but not a multiple of them, where teams of 2 pay. fp32 and bf16 within the bounds
 * of one owner per matrix. Before, the expert groups planned no team (on.xteams 0 fails it). */
TEST(expert_teams_match_one_owner_per_matrix)
{
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    run_preset = "tiny-experts";
    run_layers = ranks == 4 ? 1 : 0;
    run_xdim = 2;
    for (run_ep = 1; run_ep <= 2; run_ep++)
        teams_against_owners(1);
    run_ep = 1;
    run_xdim = run_layers = 0;
    run_preset = "tiny";
}

/* dp_replicate 2: each replica's dense group plans the same teams (the node size is agreed over
 * the replicas), so replica_check_every = 1 finds the replicas' bits equal after every step (a
 * step fails otherwise), and the updates match teams off */
TEST(replicas_run_the_same_teams)
{
    replicas = 2;
    teams_against_owners(0);
    replicas = 1;
}

/* Teams change who computes, not the state: a save after one step, loaded (with the weights)
 * into a fresh runtime and stepped once more, gives the bits of two steps in one run. */
/* offload = optimizer (state streamed through staging slots; a team block's row runs are
 * ranges of it like any piece) against teams off without offload */
TEST(teams_with_offload_optimizer)
{
    offload = SHARDOPT_OFFLOAD_OPTIMIZER;
    teams_against_owners(0);
    offload = SHARDOPT_OFFLOAD_NONE;
}

TEST(a_checkpoint_with_teams_resumes_bitwise)
{
    struct preset p;
    char dir[64] = "/tmp/shardopt_teams_XXXXXX";
    load_tiny(&p);
    if (me == 0 && mkdtemp(dir) == NULL)
        dir[0] = '\0';
    MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    ASSERT_TRUE(dir[0] != '\0');
    shardopt_config_t cfg = config(2, 1);
    cfg.ckpt_weights = 1;
    float *w[2] = {NULL, NULL};
    for (int resume = 0; resume <= 1; resume++) {
        shardopt_runtime_t rt = NULL;
        struct preset_shards ps;
        ASSERT_EQ_INT(start(&cfg, &p, &rt, &ps), SHARDOPT_OK);
        EXPECT_TRUE(rt->gx[GROUP_DENSE].plan.nteams > 0);
        if (resume) {
            EXPECT_EQ_INT(shardopt_load(rt, dir), SHARDOPT_OK);
        } else {
            EXPECT_EQ_INT(steps(rt, 1), 0);
            EXPECT_EQ_INT(shardopt_save(rt, dir), SHARDOPT_OK);
        }
        EXPECT_EQ_INT(steps(rt, 1), 0);
        w[resume] = weights(&p, &ps, NULL);
        preset_shards_free(&ps);
        shardopt_finalize(rt);
    }
    ASSERT_TRUE(w[0] != NULL && w[1] != NULL);
    int64_t n = 0;
    for (int i = 0; i < p.n; i++) {
        struct preset_shard sh;
        preset_shard_of(&p.t[i], 1, dense_n, dense_me, 0, &sh);
        n += sh.numel;
    }
    long differ = 0;
    for (int64_t e = 0; e < n; e++)
        differ += memcmp(&w[0][e], &w[1][e], sizeof(float)) != 0;
    MPI_Allreduce(MPI_IN_PLACE, &differ, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    EXPECT_EQ_INT(differ, 0);
    MPI_Barrier(MPI_COMM_WORLD);
    if (me == 0) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        EXPECT_EQ_INT(system(cmd), 0);
    }
    free(w[0]);
    free(w[1]);
    preset_free(&p);
}

/* A team cap where teams cannot run: rank 0 warns that it is ignored and why, no team is
 * planned, and every rank's weights after NSTEPS steps have the bits of the same run with
 * ns_team_cap = 1. */
static void teams_stay_off(const char *why)
{
    struct preset p;
    char log[64] = "/tmp/shardopt_teams_off_XXXXXX"; /* rank 0's, unique (mkstemp) */
    load_tiny(&p);
    if (me == 0) {
        const int fd = mkstemp(log);
        if (fd < 0) { /* not ASSERT: the other ranks would wait in the runs below */
            perror("mkstemp");
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
        close(fd);
    }
    struct run_out off, on;
    ASSERT_EQ_INT(run(&p, config(1, 0), &off), 0);
    int saved = me == 0 ? stderr_to(log) : -1;
    const int rc = run(&p, config(2, 0), &on);
    if (me == 0)
        stderr_back(saved);
    ASSERT_EQ_INT(rc, 0);
    EXPECT_EQ_INT(on.nteams, 0);
    long differ = 0;
    for (int64_t e = 0; e < off.at[p.n]; e++)
        differ += memcmp(&on.w[e], &off.w[e], sizeof(float)) != 0;
    MPI_Allreduce(MPI_IN_PLACE, &differ, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    EXPECT_EQ_INT(differ, 0);
    if (me == 0) {
        char *t = text_of(log), want[128];
        snprintf(want, sizeof want, "ns_team_cap = 2 ignored with %s: one owner per matrix", why);
        EXPECT_STR_CONTAINS(t, want);
        free(t);
        unlink(log);
    }
    run_free(&on);
    run_free(&off);
    preset_free(&p);
}

/* ns_precondition = aol: each member scales its block's rows by the row sums of the first Gram
 * matrix, summed over the team (ns_sharded.c), against the gathered matrices' AOL, fp32 and bf16
 * within the bounds above. Before, teams were off with aol. */
TEST(teams_with_aol_match_one_owner_per_matrix)
{
    aol = 1;
    teams_against_owners(1);
    aol = 0;
}

TEST(teams_stay_off_with_replica_split)
{
    replicas = 2;
    split = 1;
    teams_stay_off("replica_split");
    split = 0;
    replicas = 1;
}

/* One 16 x 16 matrix sharded by rows over every rank, aol, fp32, one step with teams of every
 * rank (cap = ranks; 0: its team count) or one owner (cap 1): this rank's update, or -1. */
static int square_step(int cap, int transposed, float *upd, int *nteams)
{
    enum { N = 16 };
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    cfg.apply_env = 0;
    cfg.num_threads = 1;
    cfg.ns_team_cap = cap;
    cfg.ns_team_frac = 0.01;
    cfg.cost_gemm_gflops = 1e-3; /* teams pay at this size */
    cfg.cost_net_gbps = 1e3;
    cfg.comm_dtype = SHARDOPT_DTYPE_FP32;
    cfg.ns_compute = SHARDOPT_NS_COMPUTE_FP32;
    cfg.ns_precondition = SHARDOPT_NS_PRECONDITION_AOL;
    shardopt_runtime_t rt = NULL;
    if (shardopt_init(MPI_COMM_WORLD, &cfg, &rt) != SHARDOPT_OK)
        return -1;
    const int64_t rows = N / ranks, r0 = me * rows;
    float *w = calloc((size_t)(rows * N), sizeof(float)), *g = malloc(sizeof(float) * rows * N);
    for (int64_t i = 0; i < rows * N; i++) { /* rows of unequal scale: AOL's row sums differ */
        const int64_t gi = r0 * N + i, r = gi / N;
        g[i] = (float)((double)((gi * 2654435761u) % 1000) / 1000.0 - 0.5) * (float)(1 + r % 5);
    }
    shardopt_param_desc_t d = SHARDOPT_PARAM_DESC_INIT;
    d.name = "sq";
    d.ndim = 2;
    d.shape[0] = d.shape[1] = N;
    d.transposed = transposed;
    d.shard_offset = r0;
    d.shard_length = rows;
    d.data = w;
    d.grad = g;
    shardopt_param_t h;
    shardopt_step_args_t a = SHARDOPT_STEP_ARGS_INIT;
    a.lr = 1;
    int rc = shardopt_register(rt, &d, &h) == SHARDOPT_OK && shardopt_commit(rt) == SHARDOPT_OK &&
                     shardopt_step(rt, &a) == SHARDOPT_OK
                 ? 0
                 : -1;
    *nteams = rt->gx[GROUP_DENSE].plan.nteams;
    memcpy(upd, w, sizeof(float) * (size_t)(rows * N));
    shardopt_finalize(rt);
    free(w);
    free(g);
    return rc;
}

/* Found by test_xcheck (seed 9085): a square matrix registered transposed ([in, out]: its true
 * orientation is the transpose) in a team with ns_precondition = aol was 0.18 off one owner in
 * fp32. The team's blocks were stored columns, so it iterated on the stored orientation and AOL
 * scaled the true matrix's columns, where the gathered path works on the true orientation
 * (sharding/layout.c, ns_transpose); Frobenius scaling cannot tell (the same polynomial). The
 * blocks now follow the working orientation (plan_team_block). */
TEST(a_square_matrix_registered_transposed_in_a_team_with_aol_matches_one_owner)
{
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    for (int transposed = 0; transposed < 2; transposed++) {
        float on[256], off[256];
        int teams_on = 0, teams_off = 0;
        ASSERT_EQ_INT(square_step(ranks, transposed, on, &teams_on), 0);
        ASSERT_EQ_INT(square_step(1, transposed, off, &teams_off), 0);
        EXPECT_TRUE(teams_on == 1 && teams_off == 0);
        double s[2] = {0, 0};
        for (int i = 0; i < 256 / ranks; i++) {
            s[0] += ((double)on[i] - off[i]) * ((double)on[i] - off[i]);
            s[1] += (double)off[i] * off[i];
        }
        MPI_Allreduce(MPI_IN_PLACE, s, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        const double d = sqrt(s[0] / s[1]);
        if (me == 0)
            printf("  16 x 16%s, aol, a team of %d: update %.3g off one owner\n",
                   transposed ? " transposed" : "", ranks, d);
        EXPECT_TRUE(d <= 1e-4); /* docs/config.md, ns_team_cap: fp32 within 1e-4; NaN fails */
    }
}

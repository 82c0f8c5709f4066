/* The distributed step gives the same bits as one rank: the model of model.h on the layout in
 * SHARDOPT_TEST_LAYOUT ("dp_replicate,dp_shard,cp,ep,expert_shard_dim"), 5 steps, then every
 * parameter and optimizer state gathered to rank 0 and compared bitwise with the same 5 steps
 * run there on MPI_COMM_SELF. Also: bytes counted at the MPI calls against the layout's formula,
 * one owner per matrix, registration mismatches and NaN gradients handled on every rank.
 *
 * One file, over 600 lines: every check runs on the same layout in the same processes, against
 * the same one-rank reference run; the layouts are the test's parameter (tests/CMakeLists.txt). */
#include "model_run.h"
#include "stderr_capture.h"

#define NSTEPS 5

/* Run the layout and the single-rank reference; compare everything bitwise on rank 0. */
static void compare_with_single_rank(shardopt_config_t cfg)
{
    struct run d = {0};
    ASSERT_EQ_INT(run_setup(&d, MPI_COMM_WORLD, cfg, 0), SHARDOPT_OK);
    ASSERT_EQ_INT(run_steps(&d, 1, NSTEPS), SHARDOPT_OK);

    struct run ref = {0};
    if (me == 0) {
        ASSERT_EQ_INT(run_setup(&ref, MPI_COMM_SELF, cfg, 0), SHARDOPT_OK);
        ASSERT_EQ_INT(run_steps(&ref, 1, NSTEPS), SHARDOPT_OK);
    }
    /* the global gradient norm counts every element once: same as one rank up to summation
     * order (replicated tensors counted once per replica, replicas not added) */
    shardopt_stats_t sd = SHARDOPT_STATS_INIT, sr = SHARDOPT_STATS_INIT;
    shardopt_get_stats(d.rt, &sd);
    double ref_norm = 0;
    if (me == 0) {
        shardopt_get_stats(ref.rt, &sr);
        ref_norm = sr.grad_norm_last;
    }
    MPI_Bcast(&ref_norm, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    EXPECT_NEAR(sd.grad_norm_last, ref_norm, 1e-12 * ref_norm);
    EXPECT_TRUE(ref_norm > 0);
    long replica_bad = 0, differ = 0;
    for (int p = 0; p < MODEL_NPARAMS; p++)
        for (int k = 0; k < 3; k++) {
            size_t es;
            const void *mine = kind_data(&d, p, k, &es);
            if (mine == NULL)
                continue; /* Muon tensors have no second state */
            const struct tparam *t = &model_params[p];
            const size_t bytes = (size_t)(t->shape[0] * t->shape[1] * t->shape[2]) * es;
            unsigned char *global = me == 0 ? calloc(bytes, 1) : NULL;
            replica_bad += gather(&d, p, k, global);
            if (me == 0) {
                size_t es_ref;
                const void *want = kind_data(&ref, p, k, &es_ref);
                if (memcmp(global, want, bytes) != 0) {
                    differ++;
                    fprintf(stderr, "  %s: %s differs from the single-rank run\n", t->name,
                            k == 0   ? "parameter"
                            : k == 1 ? "momentum/exp_avg"
                                     : "exp_avg_sq");
                }
            }
            free(global);
        }
    if (me == 0) {
        EXPECT_EQ_INT(replica_bad, 0);
        EXPECT_EQ_INT(differ, 0);
        run_free(&ref);
    }
    run_free(&d);
}

TEST(layout_equals_one_rank_fp32)
{
    setup();
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    cfg.momentum_dtype = SHARDOPT_DTYPE_FP32;
    cfg.comm_dtype = SHARDOPT_DTYPE_FP32;
    cfg.ns_compute = SHARDOPT_NS_COMPUTE_FP32;
    cfg.num_threads = 1;
    compare_with_single_rank(cfg);
}

/* Gram Newton-Schulz with AOL and its 4-step table (issue 23): the choice is per shape, so every
 * layout runs the same kernels and gets the same bits */
TEST(layout_equals_one_rank_gram_aol_fp32)
{
    setup();
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    cfg.momentum_dtype = SHARDOPT_DTYPE_FP32;
    cfg.comm_dtype = SHARDOPT_DTYPE_FP32;
    cfg.ns_compute = SHARDOPT_NS_COMPUTE_FP32;
    cfg.ns_algorithm = SHARDOPT_NS_ALGORITHM_GRAM;
    cfg.ns_precondition = SHARDOPT_NS_PRECONDITION_AOL;
    cfg.ns_coeffs = SHARDOPT_NS_AOL;
    cfg.ns_steps = 4;
    cfg.num_threads = 1;
    compare_with_single_rank(cfg);
}

/* the same in bf16 (named: auto keeps standard on this model's matrices, whose short sides are
 * at most 64, where Gram saves no FLOPs) */
TEST(layout_equals_one_rank_bf16_gram_aol)
{
    setup();
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    cfg.ns_compute = SHARDOPT_NS_COMPUTE_BF16;
    cfg.ns_algorithm = SHARDOPT_NS_ALGORITHM_GRAM;
    cfg.ns_precondition = SHARDOPT_NS_PRECONDITION_AOL;
    cfg.ns_coeffs = SHARDOPT_NS_AOL;
    cfg.ns_steps = 4;
    cfg.num_threads = 1;
    compare_with_single_rank(cfg);
}

/* bf16 Newton-Schulz named explicitly, so the layouts are checked with it on any CPU (auto picks
 * it only where bf16 is native); bf16 comm shows its rounding of O */
TEST(layout_equals_one_rank_bf16_newton_schulz)
{
    setup();
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    cfg.ns_compute = SHARDOPT_NS_COMPUTE_BF16;
    cfg.num_threads = 1;
    compare_with_single_rank(cfg);
}

TEST(layout_equals_one_rank_bf16_stochastic)
{
    setup();
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    cfg.momentum_dtype = SHARDOPT_DTYPE_BF16;
    cfg.momentum_rounding = SHARDOPT_ROUNDING_STOCHASTIC;
    cfg.param_rounding = SHARDOPT_ROUNDING_STOCHASTIC;
    cfg.adam_state_dtype = SHARDOPT_DTYPE_BF16;
    cfg.adam_v_dtype = SHARDOPT_DTYPE_BF16;
    cfg.comm_dtype = SHARDOPT_DTYPE_BF16;
    cfg.nesterov = 1;
    cfg.bucket_bytes = 700; /* many buckets */
    cfg.num_threads = 1;
    compare_with_single_rank(cfg);
}

TEST(layout_equals_one_rank_replica_split)
{
    /* replicas split the NS work and share the results: still the same bits */
    setup();
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    cfg.replica_split = 1;
    cfg.bucket_bytes = 3000;
    cfg.num_threads = 1;
    compare_with_single_rank(cfg);
}

/* Sharded Newton-Schulz against gather: one step from the same state, weight decay off, so the
 * update of each Muon matrix is -lr * scale * O; with comm fp32 the two O agree to a relative
 * Frobenius error <= 1e-4 per matrix. */
TEST(sharded_ns_agrees_with_gather)
{
    setup();
    struct run r[2];
    double *num = calloc(MODEL_NPARAMS * 16, sizeof(double)), *den = num + MODEL_NPARAMS * 8;
    int64_t sharded = 0;
    for (int v = 0; v < 2; v++) {
        shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
        cfg.comm_dtype = SHARDOPT_DTYPE_FP32;
        cfg.weight_decay = 0;
        cfg.num_threads = 1;
        cfg.ns_strategy = v ? SHARDOPT_NS_STRATEGY_SHARDED : SHARDOPT_NS_STRATEGY_GATHER;
        cfg.ns_compute = SHARDOPT_NS_COMPUTE_FP32; /* sharded NS runs in fp32 only */
        memset(&r[v], 0, sizeof r[v]);
        ASSERT_EQ_INT(run_setup(&r[v], MPI_COMM_WORLD, cfg, 0), SHARDOPT_OK);
        ASSERT_EQ_INT(run_steps(&r[v], 1, 1), SHARDOPT_OK);
        if (v) {
            shardopt_stats_t st = SHARDOPT_STATS_INIT;
            shardopt_get_stats(r[v].rt, &st);
            sharded = st.ns_sharded_matrices;
        }
    }
    /* per (tensor, expert) sums of squared difference and of the gather update */
    for (int p = 0; p < MODEL_NPARAMS; p++) {
        const struct tparam *t = &model_params[p];
        shardopt_algo_t algo;
        shardopt_param_get_algo(r[0].h[p], &algo);
        if (algo != SHARDOPT_ALGO_MUON || t->dtype != SHARDOPT_DTYPE_FP32)
            continue;
        const int64_t per = r[0].box[p].numel / (t->ndim == 3 ? r[0].box[p].len[0] : 1);
        for (int64_t i = 0; i < r[0].box[p].numel; i++) {
            const int k = t->ndim == 3 ? (int)(r[0].box[p].lo[0] + i / per) : 0;
            const double w0 = model_value(p, 0, model_global(t, &r[0].box[p], i));
            const double dg = ((float *)r[0].w[p])[i] - w0, ds = ((float *)r[1].w[p])[i] - w0;
            num[p * 8 + k % 8] += (ds - dg) * (ds - dg);
            den[p * 8 + k % 8] += dg * dg;
        }
    }
    MPI_Allreduce(MPI_IN_PLACE, num, MODEL_NPARAMS * 16, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    double worst = 0;
    for (int i = 0; i < MODEL_NPARAMS * 8; i++)
        if (den[i] > 0 && sqrt(num[i] / den[i]) > worst)
            worst = sqrt(num[i] / den[i]);
    if (me == 0)
        printf("  sharded NS on %lld matrices (rank 0); worst relative Frobenius error %.3g\n",
               (long long)sharded, worst);
    EXPECT_TRUE(worst <= 1e-4);
    MPI_Allreduce(MPI_IN_PLACE, &sharded, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
    EXPECT_TRUE(sharded > 0); /* every layout tested shards some matrix along its long side */
    free(num);
    run_free(&r[0]);
    run_free(&r[1]);
}

/* Bytes counted where they go to MPI against the layout: per matrix of B bytes, a holder that
 * is not the owner sends its fraction f*B in exchange #1 and receives it back in #2; the owner
 * receives and sends (1 - f_owner)*B. And every matrix has exactly one owner. */
TEST(bytes_follow_the_layout_and_every_matrix_has_one_owner)
{
    setup();
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    struct run d = {0};
    ASSERT_EQ_INT(run_setup(&d, MPI_COMM_WORLD, cfg, 0), SHARDOPT_OK);
    ASSERT_EQ_INT(run_steps(&d, 1, 1), SHARDOPT_OK);
    shardopt_runtime_t rt = d.rt;
    const double es = 2; /* bf16 comm */
    double want[GROUP_KINDS] = {0};

    for (int kind = GROUP_DENSE; kind <= GROUP_EXPERT; kind++) {
        const struct group_plan *P = &rt->gx[kind].plan;
        int *owned = calloc((size_t)P->nmatrices + 1, sizeof(int)), m = 0;
        for (int p = 0; p < MODEL_NPARAMS; p++) {
            const struct tparam *t = &model_params[p];
            shardopt_algo_t algo;
            shardopt_param_get_algo(d.h[p], &algo);
            if (algo != SHARDOPT_ALGO_MUON ||
                t->placement !=
                    (kind == GROUP_DENSE ? SHARDOPT_PLACEMENT_DENSE : SHARDOPT_PLACEMENT_EXPERT))
                continue;
            const struct tbox *b = &d.box[p];
            const int rd = t->ndim - 2;
            const double mat = (double)(t->shape[rd] * t->shape[rd + 1]);
            const int64_t k0 = t->ndim == 3 ? d.h[p]->layout.win_lo : 0;
            const int64_t kn = t->ndim == 3 ? d.h[p]->layout.win_len : 1;
            for (int64_t k = k0; k < k0 + kn; k++, m++) {
                int held = t->ndim == 2 || (k >= b->lo[0] && k < b->lo[0] + b->len[0]);
                double f = held ? (double)(b->len[rd] * b->len[rd + 1]) / mat : 0;
                int mine = 0;
                for (int w = 0; w < P->nowned; w++)
                    mine |= P->owned[w].param == p && P->owned[w].k == k;
                owned[m] = mine;
                want[kind] += (mine ? 1 - f : f) * mat * es;
            }
        }
        EXPECT_EQ_INT(m, P->nmatrices);
        MPI_Allreduce(MPI_IN_PLACE, owned, m, MPI_INT, MPI_SUM, rt->gx[kind].comm);
        int not_one = 0;
        for (int i = 0; i < m; i++)
            not_one += owned[i] != 1;
        EXPECT_EQ_INT(not_one, 0);
        free(owned);
    }
    shardopt_stats_t st = SHARDOPT_STATS_INIT;
    shardopt_get_stats(rt, &st);
    EXPECT_NEAR((double)st.bytes_sent_dense, want[GROUP_DENSE], 0.5);
    EXPECT_NEAR((double)st.bytes_recv_dense, want[GROUP_DENSE], 0.5);
    EXPECT_NEAR((double)st.bytes_sent_expert, want[GROUP_EXPERT], 0.5);
    EXPECT_NEAR((double)st.bytes_recv_expert, want[GROUP_EXPERT], 0.5);
    run_free(&d);
}

TEST(mismatched_registration_fails_on_every_rank)
{
    setup();
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    struct run d = {0};
    EXPECT_EQ_INT(run_setup(&d, MPI_COMM_WORLD, cfg, 1), SHARDOPT_ERR_MISMATCH);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "layers.0.mlp.gate_proj.weight");
    EXPECT_STR_CONTAINS(shardopt_last_error(), "commit: rank 1: parameter #");
    EXPECT_STR_CONTAINS(shardopt_last_error(), "differs in shape: this rank has");
    run_free(&d);

    struct run e = {0};
    EXPECT_EQ_INT(run_setup(&e, MPI_COMM_WORLD, cfg, 2), SHARDOPT_ERR_MISMATCH);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "commit: rank 1: 1 parameter(s) failed to register");
    run_free(&e);
}

/* A replicated tensor's gradient with a NaN on one rank that is not dense rank 0: that rank
 * applies its own copy, so the step must stop everywhere. The pre-pass used to sum replicated
 * gradients on dense rank 0 only: the NaN went unseen and only that rank's copy became NaN. */
TEST(nan_in_one_copy_of_a_replicated_tensor_skips_everywhere)
{
    setup();
    int p = -1;
    for (int i = 0; i < MODEL_NPARAMS; i++)
        if (model_params[i].placement == SHARDOPT_PLACEMENT_REPLICATED &&
            model_params[i].dtype == SHARDOPT_DTYPE_FP32)
            p = i;
    ASSERT_TRUE(p >= 0);
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    struct run d = {0};
    ASSERT_EQ_INT(run_setup(&d, MPI_COMM_WORLD, cfg, 0), SHARDOPT_OK);
    ASSERT_EQ_INT(run_steps(&d, 1, 1), SHARDOPT_OK);
    unsigned char *before, *after;
    size_t nb, na;
    snapshot(&d, &before, &nb);
    run_grads(&d, 2, 0);
    if (me == world - 1)
        ((float *)d.g[p])[0] = NAN;
    shardopt_step_args_t args = SHARDOPT_STEP_ARGS_INIT;
    args.lr = 0.02;
    EXPECT_EQ_INT(shardopt_step(d.rt, &args), SHARDOPT_OK);
    shardopt_stats_t st = SHARDOPT_STATS_INIT;
    shardopt_get_stats(d.rt, &st);
    EXPECT_EQ_INT(st.last_step_skipped, 1);
    EXPECT_STR_CONTAINS(st.nonfinite_params, model_params[p].name);
    snapshot(&d, &after, &na);
    EXPECT_TRUE(na == nb && memcmp(before, after, nb) == 0);
    free(before);
    free(after);
    run_free(&d);
}

/* nonfinite = zero: NaN, +Inf and -Inf on one rank in an expert stack and a dense matrix; the
 * step goes ahead, names both tensors, counts the 6 elements, and gives the same bits as a run
 * whose gradients hold 0 there. */
TEST(nonfinite_zero_steps_as_if_those_elements_were_zero)
{
    setup();
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    cfg.nonfinite = SHARDOPT_NONFINITE_ZERO;
    struct run d = {0}, z = {0};
    ASSERT_EQ_INT(run_setup(&d, MPI_COMM_WORLD, cfg, 0), SHARDOPT_OK);
    ASSERT_EQ_INT(run_setup(&z, MPI_COMM_WORLD, cfg, 0), SHARDOPT_OK);
    ASSERT_EQ_INT(run_steps(&d, 1, 2), SHARDOPT_OK);
    ASSERT_EQ_INT(run_steps(&z, 1, 2), SHARDOPT_OK);
    const int here = me == world - 1 && d.box[11].numel >= 3 && d.box[2].numel >= 3;
    run_grads(&d, 3, here);
    run_grads(&z, 3, 0);
    if (here)
        for (int k = 0; k < 3; k++)
            ((float *)z.g[11])[k] = ((float *)z.g[2])[k] = 0.0f;
    shardopt_step_args_t args = SHARDOPT_STEP_ARGS_INIT;
    args.lr = 0.02;
    EXPECT_EQ_INT(shardopt_step(d.rt, &args), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_step(z.rt, &args), SHARDOPT_OK);
    shardopt_stats_t st = SHARDOPT_STATS_INIT;
    shardopt_get_stats(d.rt, &st);
    EXPECT_EQ_INT(st.last_step_skipped, 0);
    EXPECT_EQ_INT(st.steps, 3);
    /* counted over the replica that had them (replicas are meant to hold equal gradients) */
    EXPECT_EQ_INT((int)st.nonfinite_elements_last,
                  st.replica == (world - 1) / st.dense_size ? 6 : 0);
    EXPECT_STR_CONTAINS(st.nonfinite_params, "layers.1.mlp.experts.gate_proj");
    EXPECT_STR_CONTAINS(st.nonfinite_params, "layers.0.attn.q_proj.weight");
    unsigned char *a, *b;
    size_t na, nb;
    snapshot(&d, &a, &na);
    snapshot(&z, &b, &nb);
    EXPECT_TRUE(na == nb && memcmp(a, b, na) == 0);
    free(a);
    free(b);
    run_free(&d);
    run_free(&z);
}

TEST(nan_on_one_rank_skips_or_fails_everywhere)
{
    setup();
    for (int mode = 0; mode < 2; mode++) {
        shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
        cfg.nonfinite = mode ? SHARDOPT_NONFINITE_ERROR : SHARDOPT_NONFINITE_SKIP;
        struct run d = {0};
        ASSERT_EQ_INT(run_setup(&d, MPI_COMM_WORLD, cfg, 0), SHARDOPT_OK);
        ASSERT_EQ_INT(run_steps(&d, 1, 2), SHARDOPT_OK);
        unsigned char *before, *after;
        size_t nb, na;
        snapshot(&d, &before, &nb);
        /* the last rank holds a piece of both poisoned tensors in every layout tested */
        run_grads(&d, 3, me == world - 1 && d.box[11].numel > 0 && d.box[2].numel > 0);
        shardopt_step_args_t args = SHARDOPT_STEP_ARGS_INIT;
        args.lr = 0.02;
        shardopt_status_t status = shardopt_step(d.rt, &args);
        shardopt_stats_t st = SHARDOPT_STATS_INIT;
        shardopt_get_stats(d.rt, &st);
        if (mode == 0) {
            EXPECT_EQ_INT(status, SHARDOPT_OK);
            EXPECT_EQ_INT(st.last_step_skipped, 1);
            EXPECT_EQ_INT(st.steps_skipped, 1);
            EXPECT_EQ_INT(st.steps, 2);
            EXPECT_STR_CONTAINS(st.nonfinite_params, "layers.1.mlp.experts.gate_proj");
            EXPECT_STR_CONTAINS(st.nonfinite_params, "layers.0.attn.q_proj.weight");
        } else {
            EXPECT_EQ_INT(status, SHARDOPT_ERR_NONFINITE);
            EXPECT_STR_CONTAINS(shardopt_last_error(), "layers.1.mlp.experts.gate_proj");
        }
        snapshot(&d, &after, &na);
        EXPECT_TRUE(na == nb && memcmp(before, after, nb) == 0);
        free(before);
        free(after);
        /* the next clean step goes ahead */
        EXPECT_EQ_INT(run_steps(&d, 4, 4), SHARDOPT_OK);
        run_free(&d);
    }
}

static float weight_at(const void *buf, shardopt_dtype_t dt, int64_t i)
{
    if (dt != SHARDOPT_DTYPE_BF16)
        return ((const float *)buf)[i];
    const uint32_t u = (uint32_t)((const uint16_t *)buf)[i] << 16;
    float v;
    memcpy(&v, &u, 4);
    return v;
}

/* Finite gradients too large for the fp32 optimizer state (3e38 in a dense matrix and an expert
 * stack on the last rank: AdamW would square them, Muon's momentum sums them past FLT_MAX) are
 * handled as NaN/Inf gradients are: skipped (skip, and zero, which has no element to zero), or
 * ERR_NONFINITE (error), on every rank, nothing written. Clipped below the limit they step, and
 * every weight stays finite. Before: the step returned OK, the momentum overflowed to Inf, and
 * from the second such step every weight of the matrix was NaN. Mode 3: zero with a NaN among
 * those gradients too (test_xcheck's find: the tensor was flagged for its NaN only, the too-large
 * check never saw its finite part, and the step went ahead: Inf state, NaN weights). */
TEST(gradients_too_large_for_the_state_skip_or_fail_everywhere)
{
    setup();
    for (int mode = 0; mode < 4; mode++) {
        shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
        cfg.nonfinite = mode == 1   ? SHARDOPT_NONFINITE_ERROR
                        : mode >= 2 ? SHARDOPT_NONFINITE_ZERO
                                    : SHARDOPT_NONFINITE_SKIP;
        struct run d = {0};
        ASSERT_EQ_INT(run_setup(&d, MPI_COMM_WORLD, cfg, 0), SHARDOPT_OK);
        ASSERT_EQ_INT(run_steps(&d, 1, 2), SHARDOPT_OK);
        unsigned char *before, *after;
        size_t nb, na;
        snapshot(&d, &before, &nb);
        shardopt_step_args_t args = SHARDOPT_STEP_ARGS_INIT;
        args.lr = 0.02;
        for (int s = 3; s <= 4; s++) { /* twice: the momentum overflows at the second */
            run_grads(&d, s, 0);
            if (me == world - 1)
                for (int p = 2; p <= 11; p += 9)
                    for (int64_t i = 0; i < d.box[p].numel; i++)
                        ((float *)d.g[p])[i] = mode == 3 && i == 0 ? NAN : 3e38f;
            char logp[64];
            snprintf(logp, sizeof logp, "/tmp/shardopt_too_large_%d_%d.log", (int)getpid(), me);
            const int saved = stderr_to(logp);
            const shardopt_status_t status = shardopt_step(d.rt, &args);
            stderr_back(saved);
            char *logged = text_of(logp);
            unlink(logp);
            fputs(logged, stderr);
            shardopt_stats_t st = SHARDOPT_STATS_INIT;
            shardopt_get_stats(d.rt, &st);
            /* skipped: nothing was zeroed into the weights, so nothing may claim it was */
            EXPECT_TRUE(strstr(logged, "treated as 0") == NULL);
            EXPECT_EQ_INT((int)st.nonfinite_elements_last, 0);
            free(logged);
            if (mode == 1) {
                EXPECT_EQ_INT(status, SHARDOPT_ERR_NONFINITE);
                EXPECT_STR_CONTAINS(shardopt_last_error(), "too large for the optimizer state");
                EXPECT_STR_CONTAINS(shardopt_last_error(), "layers.1.mlp.experts.gate_proj");
            } else {
                EXPECT_EQ_INT(status, SHARDOPT_OK);
                EXPECT_EQ_INT(st.last_step_skipped, 1);
                EXPECT_EQ_INT(st.steps, 2);
                EXPECT_STR_CONTAINS(st.nonfinite_params, "layers.0.attn.q_proj.weight");
                EXPECT_STR_CONTAINS(st.nonfinite_params, "layers.1.mlp.experts.gate_proj");
            }
        }
        snapshot(&d, &after, &na);
        EXPECT_TRUE(na == nb && memcmp(before, after, nb) == 0);
        free(after);
        /* clipped, the same gradients step, and nothing becomes non-finite */
        args.max_grad_norm = 1.0;
        for (int s = 5; s <= 6; s++) {
            run_grads(&d, s, 0);
            if (me == world - 1)
                for (int p = 2; p <= 11; p += 9)
                    for (int64_t i = 0; i < d.box[p].numel; i++)
                        ((float *)d.g[p])[i] = mode == 3 && i == 0 ? NAN : 3e38f;
            EXPECT_EQ_INT(shardopt_step(d.rt, &args), SHARDOPT_OK);
        }
        shardopt_stats_t st = SHARDOPT_STATS_INIT;
        shardopt_get_stats(d.rt, &st);
        EXPECT_EQ_INT(st.steps, 4);
        long nonfinite = 0;
        for (int p = 0; p < MODEL_NPARAMS; p++)
            for (int64_t i = 0; i < d.box[p].numel; i++)
                nonfinite += !isfinite(weight_at(d.w[p], model_params[p].dtype, i));
        EXPECT_EQ_INT(nonfinite, 0);
        snapshot(&d, &after, &na);
        EXPECT_TRUE(na == nb && memcmp(before, after, nb) != 0);
        free(before);
        free(after);
        run_free(&d);
    }
}

/* check_state_every: a NaN in a dense matrix's parameter shard, +Inf in an expert stack's
 * momentum and -Inf in an AdamW tensor's exp_avg_sq, all on the last rank, fail the next step
 * with ERR_NONFINITE on every rank, naming each tensor and array and that rank, and nothing is
 * written anywhere. Without the check the step goes ahead. */
TEST(nonfinite_state_fails_the_step_everywhere_with_nothing_written)
{
    setup();
    for (int every = 1; every >= 0; every--) {
        shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
        cfg.check_state_every = every;
        struct run d = {0};
        ASSERT_EQ_INT(run_setup(&d, MPI_COMM_WORLD, cfg, 0), SHARDOPT_OK);
        ASSERT_EQ_INT(run_steps(&d, 1, 2), SHARDOPT_OK); /* a finite state passes the check */
        const int adamw = 1;                             /* layers.0.input_norm.weight */
        ASSERT_TRUE(d.h[adamw]->algo == SHARDOPT_ALGO_ADAMW && d.h[11]->algo == SHARDOPT_ALGO_MUON);
        const int here =
            me == world - 1 && d.box[2].numel > 0 && d.box[11].numel > 1 && d.box[adamw].numel > 2;
        int anywhere = here;
        MPI_Allreduce(MPI_IN_PLACE, &anywhere, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        ASSERT_TRUE(anywhere); /* the last rank holds a piece of all three in every layout */
        if (here) {
            size_t es;
            ((float *)d.w[2])[0] = NAN;
            ((float *)kind_data(&d, 11, 1, &es))[1] = INFINITY;
            ((float *)kind_data(&d, adamw, 2, &es))[2] = -INFINITY;
        }
        unsigned char *before, *after;
        size_t nb, na;
        snapshot(&d, &before, &nb);
        run_grads(&d, 3, 0);
        shardopt_step_args_t args = SHARDOPT_STEP_ARGS_INIT;
        args.lr = 0.02;
        shardopt_status_t status = shardopt_step(d.rt, &args);
        snapshot(&d, &after, &na);
        shardopt_stats_t st = SHARDOPT_STATS_INIT;
        shardopt_get_stats(d.rt, &st);
        if (every) {
            char first[64];
            snprintf(first, sizeof first, "first on rank %d", world - 1);
            EXPECT_EQ_INT(status, SHARDOPT_ERR_NONFINITE);
            EXPECT_STR_CONTAINS(shardopt_last_error(), first);
            EXPECT_STR_CONTAINS(shardopt_last_error(), "layers.0.attn.q_proj.weight (parameter)");
            EXPECT_STR_CONTAINS(shardopt_last_error(), "layers.1.mlp.experts.gate_proj (momentum)");
            EXPECT_STR_CONTAINS(shardopt_last_error(), "layers.0.input_norm.weight (exp_avg_sq)");
            EXPECT_STR_CONTAINS(shardopt_last_error(), "nothing was updated");
            EXPECT_EQ_INT(st.steps, 2);
            EXPECT_TRUE(na == nb && memcmp(before, after, nb) == 0);
        } else {
            EXPECT_EQ_INT(status, SHARDOPT_OK);
            EXPECT_EQ_INT(st.steps, 3);
        }
        free(before);
        free(after);
        run_free(&d);
    }
}

/* skip_missing_grads: a dense Muon matrix, an expert stack, an AdamW bias and a replicated
 * matrix with a NULL gradient on every rank are skipped exactly (values, state and step count
 * as before), and every other tensor gets the bits of a run that stepped them with a zero
 * gradient (the same global norm, clipping included) and then put their values, state and step
 * count back: the oracle is exact because the skipped tensors add nothing to the norm. With the
 * gather and the sharded Newton-Schulz strategies. */
static const int skipped[] = {2, 11, 3, 17};
#define NSKIP ((int)(sizeof skipped / sizeof skipped[0]))

static int is_skipped(int p)
{
    for (int j = 0; j < NSKIP; j++)
        if (skipped[j] == p)
            return 1;
    return 0;
}

/* Restore tensor p's value, state and step count from a snapshot taken by keep(). */
struct kept {
    void *bytes[MODEL_NPARAMS][3];
    uint64_t step[MODEL_NPARAMS];
};

static void keep(const struct run *r, struct kept *k)
{
    for (int p = 0; p < MODEL_NPARAMS; p++) {
        k->step[p] = r->h[p]->step;
        for (int j = 0; j < 3; j++) {
            size_t es;
            const void *src = kind_data(r, p, j, &es);
            k->bytes[p][j] = NULL;
            if (src == NULL)
                continue;
            k->bytes[p][j] = malloc((size_t)r->box[p].numel * es + 1);
            memcpy(k->bytes[p][j], src, (size_t)r->box[p].numel * es);
        }
    }
}

static void put_back(struct run *r, const struct kept *k, int p)
{
    r->h[p]->step = k->step[p];
    for (int j = 0; j < 3; j++) {
        size_t es;
        void *dst = (void *)kind_data(r, p, j, &es);
        if (dst != NULL)
            memcpy(dst, k->bytes[p][j], (size_t)r->box[p].numel * es);
    }
}

static void kept_free(struct kept *k)
{
    for (int p = 0; p < MODEL_NPARAMS; p++)
        for (int j = 0; j < 3; j++)
            free(k->bytes[p][j]);
}

TEST(missing_gradients_are_skipped_exactly)
{
    setup();
    for (int strategy = 0; strategy < 2; strategy++) {
        shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
        cfg.ns_strategy = strategy ? SHARDOPT_NS_STRATEGY_SHARDED : SHARDOPT_NS_STRATEGY_GATHER;
        struct run a = {0}, b = {0};
        ASSERT_EQ_INT(run_setup(&a, MPI_COMM_WORLD, cfg, 0), SHARDOPT_OK);
        ASSERT_EQ_INT(run_setup(&b, MPI_COMM_WORLD, cfg, 0), SHARDOPT_OK);
        ASSERT_EQ_INT(run_steps(&a, 1, 2), SHARDOPT_OK);
        ASSERT_EQ_INT(run_steps(&b, 1, 2), SHARDOPT_OK);
        struct kept ka, kb;
        keep(&a, &ka);
        keep(&b, &kb);

        shardopt_step_args_t args = SHARDOPT_STEP_ARGS_INIT;
        args.lr = 0.02;
        args.max_grad_norm = 0.5; /* the norm of the rest: clipped, and the same in both runs */
        args.skip_missing_grads = 1;
        run_grads(&a, 3, 0);
        run_grads(&b, 3, 0);
        for (int j = 0; j < NSKIP; j++) {
            const int p = skipped[j];
            ASSERT_EQ_INT(shardopt_param_set_pointers(a.h[p], a.w[p], NULL), SHARDOPT_OK);
            memset(b.g[p], 0, (size_t)b.box[p].numel * model_esize(model_params[p].dtype));
        }
        ASSERT_EQ_INT(shardopt_step(a.rt, &args), SHARDOPT_OK);
        args.skip_missing_grads = 0;
        ASSERT_EQ_INT(shardopt_step(b.rt, &args), SHARDOPT_OK);
        shardopt_stats_t sa = SHARDOPT_STATS_INIT, sb = SHARDOPT_STATS_INIT;
        shardopt_get_stats(a.rt, &sa);
        shardopt_get_stats(b.rt, &sb);
        EXPECT_TRUE(sa.grad_norm_last > args.max_grad_norm);
        EXPECT_TRUE(sa.grad_norm_last == sb.grad_norm_last);
        long moved = 0, differ = 0;
        for (int p = 0; p < MODEL_NPARAMS; p++) {
            if (is_skipped(p)) {
                /* untouched in a: the bytes and the step count kept before the step */
                EXPECT_EQ_INT((int)a.h[p]->step, 2);
                for (int j = 0; j < 3; j++) {
                    size_t es;
                    const void *now = kind_data(&a, p, j, &es);
                    moved += now != NULL &&
                             memcmp(now, ka.bytes[p][j], (size_t)a.box[p].numel * es) != 0;
                }
                shardopt_param_stats_t ps = SHARDOPT_PARAM_STATS_INIT;
                shardopt_param_get_stats(a.h[p], &ps);
                EXPECT_TRUE(isnan(ps.grad_norm));
                put_back(&b, &kb, p); /* the oracle: b's update of it discarded */
            } else {
                EXPECT_EQ_INT((int)a.h[p]->step, 3);
            }
        }
        for (int p = 0; p < MODEL_NPARAMS; p++)
            for (int j = 0; j < 3; j++) {
                size_t es;
                const void *x = kind_data(&a, p, j, &es), *y = kind_data(&b, p, j, &es);
                if (x != NULL && memcmp(x, y, (size_t)a.box[p].numel * es) != 0) {
                    differ++;
                    fprintf(stderr, "  rank %d: %s kind %d differs from the oracle\n", me,
                            model_params[p].name, j);
                }
            }
        EXPECT_EQ_INT(moved, 0);
        EXPECT_EQ_INT(differ, 0);
        /* the skipped tensors take their next gradient as usual, in both runs alike */
        for (int j = 0; j < NSKIP; j++)
            shardopt_param_set_pointers(a.h[skipped[j]], a.w[skipped[j]], a.g[skipped[j]]);
        EXPECT_EQ_INT(run_steps(&a, 4, 4), SHARDOPT_OK);
        EXPECT_EQ_INT(run_steps(&b, 4, 4), SHARDOPT_OK);
        unsigned char *xa, *xb;
        size_t na, nb;
        snapshot(&a, &xa, &na);
        snapshot(&b, &xb, &nb);
        EXPECT_TRUE(na == nb && memcmp(xa, xb, na) == 0);
        free(xa);
        free(xb);
        kept_free(&ka);
        kept_free(&kb);
        run_free(&a);
        run_free(&b);
    }
}

/* A gradient missing on one rank only (a sharded matrix, a replicated tensor) fails the step on
 * every rank, naming the tensor and a rank without it, with nothing written; without the
 * option a NULL gradient is refused as before. */
TEST(a_gradient_missing_on_some_ranks_fails_everywhere)
{
    setup();
    if (world < 2)
        return;
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    const int targets[2] = {17, 2}; /* replicated: every rank holds it; dense: sharded */
    for (int t = 0; t < 2; t++) {
        const int p = targets[t];
        struct run d = {0};
        ASSERT_EQ_INT(run_setup(&d, MPI_COMM_WORLD, cfg, 0), SHARDOPT_OK);
        ASSERT_EQ_INT(run_steps(&d, 1, 1), SHARDOPT_OK);
        /* the last rank holding elements of it lacks the gradient */
        int last = d.box[p].numel > 0 ? me : -1;
        MPI_Allreduce(MPI_IN_PLACE, &last, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        int holders = d.box[p].numel > 0;
        MPI_Allreduce(MPI_IN_PLACE, &holders, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        ASSERT_TRUE(holders > 1);
        unsigned char *before, *after;
        size_t nb, na;
        snapshot(&d, &before, &nb);
        run_grads(&d, 2, 0);
        if (me == last)
            shardopt_param_set_pointers(d.h[p], d.w[p], NULL);
        shardopt_step_args_t args = SHARDOPT_STEP_ARGS_INIT;
        args.lr = 0.02;
        args.skip_missing_grads = 1;
        EXPECT_EQ_INT(shardopt_step(d.rt, &args), SHARDOPT_ERR_MISMATCH);
        char want[160];
        snprintf(want, sizeof want, "parameter '%s' has no gradient (NULL grad) on rank %d",
                 model_params[p].name, last);
        EXPECT_STR_CONTAINS(shardopt_last_error(), want);
        EXPECT_STR_CONTAINS(shardopt_last_error(), "nothing was updated");
        args.skip_missing_grads = 0; /* the default: refused as a NULL pointer */
        EXPECT_EQ_INT(shardopt_step(d.rt, &args), SHARDOPT_ERR_INVALID_ARGUMENT);
        EXPECT_STR_CONTAINS(shardopt_last_error(), model_params[p].name);
        args.skip_missing_grads = 2;
        EXPECT_EQ_INT(shardopt_step(d.rt, &args), SHARDOPT_ERR_INVALID_ARGUMENT);
        EXPECT_STR_CONTAINS(shardopt_last_error(), "skip_missing_grads = 2");
        snapshot(&d, &after, &na);
        EXPECT_TRUE(na == nb && memcmp(before, after, nb) == 0);
        EXPECT_EQ_INT((int)d.h[0]->step, 1);
        free(before);
        free(after);
        run_free(&d);
    }
}

/* AdamW's betas and eps given per step (step args version 4: a scheduler cycling beta1, as
 * OneCycleLR does to torch.optim.AdamW) on this layout: every fp32 AdamW tensor, its shards
 * gathered, follows the fp64 AdamW whose moments and bias correction 1 - beta^t take each step's
 * betas and eps, as torch.optim.AdamW computes them, and equals one rank stepped with the same
 * arguments bit for bit. */
TEST(adamw_betas_changed_between_steps_follow_the_fp64_reference)
{
    setup();
    /* beta1, beta2, eps per step; -1 the config's (0.9, 0.95, 1e-8) */
    static const double sched[NSTEPS][3] = {
        {0.95, 0.99, 1e-8}, {0.85, 0.99, 1e-8}, {-1, -1, -1}, {0.5, 0.7, 1e-3}, {0.9, 0.6, 1e-2}};
    const double lr = 0.02;
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    struct run d = {0}, ref = {0};
    ASSERT_EQ_INT(run_setup(&d, MPI_COMM_WORLD, cfg, 0), SHARDOPT_OK);
    if (me == 0)
        ASSERT_EQ_INT(run_setup(&ref, MPI_COMM_SELF, cfg, 0), SHARDOPT_OK);
    for (int s = 1; s <= NSTEPS; s++) {
        shardopt_step_args_t args = SHARDOPT_STEP_ARGS_INIT;
        args.lr = lr;
        args.adamw_beta1 = sched[s - 1][0];
        args.adamw_beta2 = sched[s - 1][1];
        args.adamw_eps = sched[s - 1][2];
        run_grads(&d, s, 0);
        ASSERT_EQ_INT(shardopt_step(d.rt, &args), SHARDOPT_OK);
        if (me == 0) {
            run_grads(&ref, s, 0);
            ASSERT_EQ_INT(shardopt_step(ref.rt, &args), SHARDOPT_OK);
        }
    }
    int checked = 0;
    long replica_bad = 0, differ = 0, off = 0;
    for (int p = 0; p < MODEL_NPARAMS; p++) {
        const struct tparam *t = &model_params[p];
        if (d.h[p]->algo != SHARDOPT_ALGO_ADAMW || t->dtype != SHARDOPT_DTYPE_FP32)
            continue;
        checked++;
        const int64_t n = t->shape[0] * t->shape[1] * t->shape[2];
        float *got[3];
        for (int k = 0; k < 3; k++) {
            got[k] = me == 0 ? calloc((size_t)n, sizeof(float)) : NULL;
            replica_bad += gather(&d, p, k, (unsigned char *)got[k]);
            if (me == 0) {
                size_t es;
                differ += memcmp(got[k], kind_data(&ref, p, k, &es), (size_t)n * sizeof(float));
            }
        }
        if (me == 0) {
            /* decay on matrices only (weight_decay_1d off by default) */
            const double wd = t->ndim >= 2 ? cfg.adamw_weight_decay : 0.0;
            for (int64_t i = 0; i < n; i++) {
                double w = model_value(p, 0, i), m = 0, v = 0;
                for (int s = 1; s <= NSTEPS; s++) {
                    const double *h = sched[s - 1];
                    const double b1 = h[0] < 0 ? cfg.adamw_beta1 : h[0];
                    const double b2 = h[1] < 0 ? cfg.adamw_beta2 : h[1];
                    const double eps = h[2] < 0 ? cfg.adamw_eps : h[2];
                    const double g = model_value(p, s, i);
                    m = b1 * m + (1 - b1) * g;
                    v = b2 * v + (1 - b2) * g * g;
                    w = w * (1 - lr * wd) -
                        lr / (1 - pow(b1, s)) * m / (sqrt(v) / sqrt(1 - pow(b2, s)) + eps);
                }
                const double want[3] = {w, m, v};
                for (int k = 0; k < 3; k++)
                    if (!(fabs(got[k][i] - want[k]) <= 1e-5 * fabs(want[k]) + 1e-7)) {
                        if (off++ < 5)
                            fprintf(stderr, "  %s kind %d element %lld: %.9g, fp64 %.9g\n", t->name,
                                    k, (long long)i, got[k][i], want[k]);
                    }
            }
        }
        for (int k = 0; k < 3; k++)
            free(got[k]);
    }
    EXPECT_TRUE(checked >= 3); /* the embedding, the head, 1-D norms and biases */
    if (me == 0) {
        EXPECT_EQ_INT(replica_bad, 0);
        EXPECT_EQ_INT(differ, 0);
        EXPECT_EQ_INT(off, 0);
        run_free(&ref);
    }
    run_free(&d);
}

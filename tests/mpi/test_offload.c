/* Offload (issue 5): offload = optimizer and cpu give bitwise the parameters and state of
 * offload = none after 5 steps (fp32 and bf16 momentum, staging poisoned, slots small enough
 * that tensors are cut into chunks), on one rank or on the layout in SHARDOPT_TEST_LAYOUT; the
 * host <-> device bytes counted at the copy op equal their closed forms; a host store over its
 * limit fails commit with OUT_OF_MEMORY naming the bytes and the limit; a checkpoint saved from
 * a host store resumes into one. */
#include <unistd.h>

#include "model_run.h"

#define NSTEPS 5

struct mode_result {
    unsigned char *snap;
    size_t len;
    shardopt_stats_t st;
};

/* The closed forms, from the parameter set: this rank's state bytes by kind, and the Newton-
 * Schulz bytes all ranks move together (each matrix once per replica; replicated tensors on
 * every rank). */
struct closed_form {
    uint64_t momentum, adam_m, adam_v; /* this rank */
    uint64_t ns_all;                   /* all ranks, each way */
};

static struct closed_form closed_form_of(const struct run *r, const shardopt_config_t *cfg)
{
    struct closed_form f = {0};
    const size_t es_comm = model_esize(cfg->comm_dtype);
    for (int p = 0; p < MODEL_NPARAMS; p++) {
        const struct tparam *t = &model_params[p];
        shardopt_algo_t algo;
        shardopt_param_get_algo(r->h[p], &algo);
        const uint64_t n = (uint64_t)r->box[p].numel;
        if (algo == SHARDOPT_ALGO_ADAMW) {
            f.adam_m += n * model_esize(cfg->adam_state_dtype);
            f.adam_v += n * model_esize(cfg->adam_v_dtype);
            continue;
        }
        f.momentum += n * model_esize(cfg->momentum_dtype);
        const uint64_t whole = (uint64_t)(t->shape[0] * t->shape[1] * t->shape[2]);
        const int copies = t->placement == SHARDOPT_PLACEMENT_REPLICATED ? world : L_rep;
        f.ns_all += whole * es_comm * (uint64_t)copies;
    }
    return f;
}

static void run_mode(shardopt_config_t cfg, struct mode_result *out, struct closed_form *f)
{
    struct run r = {0};
    ASSERT_EQ_INT(run_setup(&r, MPI_COMM_WORLD, cfg, 0), SHARDOPT_OK);
    ASSERT_EQ_INT(run_steps(&r, 1, NSTEPS), SHARDOPT_OK);
    snapshot(&r, &out->snap, &out->len);
    out->st = (shardopt_stats_t)SHARDOPT_STATS_INIT;
    shardopt_get_stats(r.rt, &out->st);
    if (f != NULL)
        *f = closed_form_of(&r, &cfg);
    run_free(&r);
}

static long differ_all(const struct mode_result *a, const struct mode_result *b)
{
    long bad = a->len != b->len || memcmp(a->snap, b->snap, a->len) != 0;
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    return bad;
}

static uint64_t sum_all(uint64_t v)
{
    MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    return v;
}

/* The three modes against each other for one configuration; returns the optimizer mode's
 * momentum bytes in. */
static uint64_t modes_bitwise(shardopt_config_t cfg)
{
    struct mode_result none, opt, cpu;
    struct closed_form f;

    cfg.offload = SHARDOPT_OFFLOAD_NONE;
    run_mode(cfg, &none, &f);
    cfg.debug_poison_staging = 1;
    cfg.offload = SHARDOPT_OFFLOAD_OPTIMIZER;
    run_mode(cfg, &opt, NULL);
    cfg.offload = SHARDOPT_OFFLOAD_CPU;
    run_mode(cfg, &cpu, NULL);

    EXPECT_EQ_INT(differ_all(&none, &opt), 0);
    EXPECT_EQ_INT(differ_all(&none, &cpu), 0);

    /* none moves nothing */
    const shardopt_stats_t *n = &none.st, *o = &opt.st, *c = &cpu.st;
    EXPECT_EQ_INT(n->bytes_h2d_momentum + n->bytes_h2d_adam_m + n->bytes_h2d_adam_v +
                      n->bytes_h2d_ns + n->bytes_d2h_ns + n->staging_peak_bytes_last,
                  0);
    EXPECT_EQ_INT(n->bytes_host_store, 0);
    /* optimizer: every state byte in and out once per step, nothing else */
    EXPECT_EQ_INT(o->bytes_h2d_momentum, f.momentum);
    EXPECT_EQ_INT(o->bytes_d2h_momentum, f.momentum);
    EXPECT_EQ_INT(o->bytes_h2d_adam_m, f.adam_m);
    EXPECT_EQ_INT(o->bytes_d2h_adam_m, f.adam_m);
    EXPECT_EQ_INT(o->bytes_h2d_adam_v, f.adam_v);
    EXPECT_EQ_INT(o->bytes_d2h_adam_v, f.adam_v);
    EXPECT_EQ_INT(o->bytes_h2d_ns + o->bytes_d2h_ns, 0);
    EXPECT_TRUE(o->bytes_host_store >= f.momentum + f.adam_m + f.adam_v);
    /* three slots at most; more than one in use at once (chunk k+1 comes in before k-1 goes
     * out) when the AdamW state alone fills more than three */
    EXPECT_TRUE(o->staging_peak_bytes_last <= 3 * o->staging_slot_bytes);
    EXPECT_TRUE(o->staging_peak_bytes_last > 0);
    if (f.adam_m + f.adam_v > 3 * o->staging_slot_bytes)
        EXPECT_TRUE(o->staging_peak_bytes_last > o->staging_slot_bytes);
    /* cpu: the packed U and O only */
    EXPECT_EQ_INT(c->bytes_h2d_momentum + c->bytes_h2d_adam_m + c->bytes_h2d_adam_v, 0);
    EXPECT_EQ_INT(c->bytes_d2h_momentum + c->bytes_d2h_adam_m + c->bytes_d2h_adam_v, 0);
    EXPECT_EQ_INT(c->bytes_h2d_ns, c->bytes_d2h_ns);
    EXPECT_EQ_INT(sum_all(c->bytes_h2d_ns), f.ns_all);
    EXPECT_EQ_INT(c->staging_peak_bytes_last, 0);
    if (me == 0)
        printf("  offload %s momentum: optimizer %llu+%llu+%llu B in (peak %llu of 3 x %llu), "
               "cpu %llu B of U in on rank 0\n",
               cfg.momentum_dtype == SHARDOPT_DTYPE_BF16 ? "bf16" : "fp32",
               (unsigned long long)o->bytes_h2d_momentum, (unsigned long long)o->bytes_h2d_adam_m,
               (unsigned long long)o->bytes_h2d_adam_v,
               (unsigned long long)o->staging_peak_bytes_last,
               (unsigned long long)o->staging_slot_bytes, (unsigned long long)c->bytes_h2d_ns);
    uint64_t mom = o->bytes_h2d_momentum;
    free(none.snap);
    free(opt.snap);
    free(cpu.snap);
    return mom;
}

static shardopt_config_t base_config(void)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    cfg.num_threads = 1;
    cfg.bucket_bytes = 512; /* slots of 512 bytes: most tensors stream in several chunks */
    return cfg;
}

TEST(offload_modes_bitwise_fp32_and_bf16_momentum)
{
    setup();
    shardopt_config_t cfg = base_config();
    cfg.momentum_dtype = SHARDOPT_DTYPE_FP32;
    const uint64_t fp32 = modes_bitwise(cfg);
    cfg.momentum_dtype = SHARDOPT_DTYPE_BF16;
    cfg.momentum_rounding = SHARDOPT_ROUNDING_STOCHASTIC;
    const uint64_t bf16 = modes_bitwise(cfg);
    /* bf16 momentum halves the momentum traffic */
    EXPECT_EQ_INT(2 * bf16, fp32);
    EXPECT_TRUE(fp32 > 0);
}

TEST(offload_modes_bitwise_bf16_adam_sharded_ns_fp32_comm)
{
    setup();
    shardopt_config_t cfg = base_config();
    cfg.momentum_dtype = SHARDOPT_DTYPE_BF16;
    cfg.adam_state_dtype = SHARDOPT_DTYPE_BF16;
    cfg.comm_dtype = SHARDOPT_DTYPE_FP32;
    cfg.ns_strategy = SHARDOPT_NS_STRATEGY_SHARDED;
    cfg.bucket_bytes = 4096;
    modes_bitwise(cfg);
}

/* AdamW betas and eps changed every step (step args version 4): the staged chunks of
 * offload = optimizer and the host state of cpu take each step's values as offload = none does,
 * and those values take effect (the run differs from one with the config's betas). */
TEST(offload_modes_bitwise_with_adamw_betas_changed_every_step)
{
    setup();
    shardopt_config_t cfg = base_config();
    struct mode_result fixed, cycled;
    run_mode(cfg, &fixed, NULL);
    run_betas_cycle = 1;
    modes_bitwise(cfg);
    run_mode(cfg, &cycled, NULL);
    run_betas_cycle = 0;
    EXPECT_TRUE(differ_all(&fixed, &cycled) > 0);
    free(fixed.snap);
    free(cycled.snap);
}

TEST(offload_default_and_zero_bucket_slots)
{
    setup();
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    cfg.num_threads = 1;
    modes_bitwise(cfg);   /* bucket_bytes 128 MiB: slots shrink to the state's size */
    cfg.bucket_bytes = 0; /* one matrix per bucket: a slot holds the largest tensor's state */
    modes_bitwise(cfg);
}

TEST(offload_host_store_limit_fails_commit_cleanly)
{
    setup();
    shardopt_config_t cfg = base_config();
    cfg.offload = SHARDOPT_OFFLOAD_OPTIMIZER;
    setenv("SHARDOPT_HOST_STORE_LIMIT", "1000", 1);
    ASSERT_EQ_INT(shardopt_config_from_env(&cfg), SHARDOPT_OK);
    unsetenv("SHARDOPT_HOST_STORE_LIMIT");
    EXPECT_EQ_INT(cfg.host_store_limit, 1000);
    struct run r = {0};
    EXPECT_EQ_INT(run_setup(&r, MPI_COMM_WORLD, cfg, 0), SHARDOPT_ERR_OUT_OF_MEMORY);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "host_store_limit is 1000");
    EXPECT_STR_CONTAINS(shardopt_last_error(), "bytes of optimizer state asked for");
    /* the runtime is left uncommitted and finalizes cleanly */
    shardopt_step_args_t args = SHARDOPT_STEP_ARGS_INIT;
    EXPECT_EQ_INT(shardopt_step(r.rt, &args), SHARDOPT_ERR_STATE);
    EXPECT_EQ_INT(shardopt_finalize(r.rt), SHARDOPT_OK);
    for (int p = 0; p < MODEL_NPARAMS; p++) {
        free(r.w[p]);
        free(r.g[p]);
    }
}

/* Save from a host store (optimizer) after 3 steps, resume into another (cpu) and into device
 * memory (none): 2 more steps equal 5 uninterrupted ones. */
TEST(offload_checkpoint_resumes_across_modes)
{
    setup();
    shardopt_config_t cfg = base_config();
    cfg.momentum_dtype = SHARDOPT_DTYPE_BF16;
    struct mode_result ref;
    run_mode(cfg, &ref, NULL);

    char dir[64] = "/tmp/shardopt_offload_XXXXXX";
    if (me == 0 && mkdtemp(dir) == NULL)
        dir[0] = '\0';
    MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    ASSERT_TRUE(dir[0] != '\0');
    struct run a = {0};
    cfg.offload = SHARDOPT_OFFLOAD_OPTIMIZER;
    ASSERT_EQ_INT(run_setup(&a, MPI_COMM_WORLD, cfg, 0), SHARDOPT_OK);
    ASSERT_EQ_INT(run_steps(&a, 1, 3), SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_save(a.rt, dir), SHARDOPT_OK);

    const shardopt_offload_t into[2] = {SHARDOPT_OFFLOAD_CPU, SHARDOPT_OFFLOAD_NONE};
    for (int m = 0; m < 2; m++) {
        struct run b = {0};
        cfg.offload = into[m];
        ASSERT_EQ_INT(run_setup(&b, MPI_COMM_WORLD, cfg, 0), SHARDOPT_OK);
        /* the parameters come from the trainer's own checkpoint: copy them over */
        for (int p = 0; p < MODEL_NPARAMS; p++)
            memcpy(b.w[p], a.w[p], (size_t)a.box[p].numel * model_esize(model_params[p].dtype));
        ASSERT_EQ_INT(shardopt_load(b.rt, dir), SHARDOPT_OK);
        ASSERT_EQ_INT(run_steps(&b, 4, 5), SHARDOPT_OK);
        struct mode_result res;
        snapshot(&b, &res.snap, &res.len);
        EXPECT_EQ_INT(differ_all(&ref, &res), 0);
        free(res.snap);
        run_free(&b);
    }
    run_free(&a);
    if (me == 0) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        EXPECT_EQ_INT(system(cmd), 0);
    }
    free(ref.snap);
}

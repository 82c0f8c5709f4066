/* Misuse gets a clear status and message, never a crash, and the runtime still finalizes. */
#include "fixture.h"
#include "kernels/device.h"

static float w[64], g[64];

TEST(step_before_commit_and_register_after_commit)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_runtime_t rt = fixture_runtime(&cfg);
    shardopt_param_desc_t d = fixture_desc("a", 2, 8, 8, 0, w, g);
    shardopt_param_t p = NULL;
    shardopt_step_args_t args = SHARDOPT_STEP_ARGS_INIT;

    EXPECT_EQ_INT(shardopt_register(rt, &d, &p), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_step(rt, &args), SHARDOPT_ERR_STATE);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "not committed");
    EXPECT_EQ_INT(shardopt_commit(rt), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_commit(rt), SHARDOPT_ERR_STATE);
    d.name = "b";
    EXPECT_EQ_INT(shardopt_register(rt, &d, &p), SHARDOPT_ERR_STATE);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "'b'");
    EXPECT_STR_CONTAINS(shardopt_last_error(), "already committed");
    EXPECT_EQ_INT(shardopt_finalize(rt), SHARDOPT_OK);
}

TEST(null_pointers)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_runtime_t rt = NULL;
    shardopt_param_desc_t d = fixture_desc("a", 2, 8, 8, 0, w, g);
    shardopt_param_t p = NULL;
    shardopt_stats_t st = SHARDOPT_STATS_INIT;

    EXPECT_EQ_INT(shardopt_init(MPI_COMM_SELF, NULL, &rt), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ_INT(shardopt_init(MPI_COMM_SELF, &cfg, NULL), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ_INT(shardopt_init(MPI_COMM_NULL, &cfg, &rt), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(rt == NULL);
    rt = fixture_runtime(&cfg);
    EXPECT_EQ_INT(shardopt_register(NULL, &d, &p), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ_INT(shardopt_register(rt, NULL, &p), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ_INT(shardopt_register(rt, &d, NULL), SHARDOPT_ERR_INVALID_ARGUMENT);
    d.name = NULL;
    EXPECT_EQ_INT(shardopt_register(rt, &d, &p), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "name is NULL");
    d.name = "a";
    d.data = NULL;
    EXPECT_EQ_INT(shardopt_register(rt, &d, &p), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "data is NULL");
    EXPECT_TRUE(p == NULL);
    EXPECT_EQ_INT(shardopt_param_set_pointers(NULL, w, g), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ_INT(shardopt_commit(NULL), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ_INT(shardopt_step(rt, NULL), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ_INT(shardopt_get_stats(rt, NULL), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ_INT(shardopt_get_stats(NULL, &st), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ_INT(shardopt_finalize(NULL), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_finalize(rt), SHARDOPT_OK);
}

TEST(duplicate_names_and_bad_shapes)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_runtime_t rt = fixture_runtime(&cfg);
    shardopt_param_desc_t d = fixture_desc("dup", 2, 8, 8, 0, w, g);
    shardopt_param_t p = NULL;

    EXPECT_EQ_INT(shardopt_register(rt, &d, &p), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_register(rt, &d, &p), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "'dup': name already registered");

    d = fixture_desc("zero", 2, 8, 0, 0, w, g);
    EXPECT_EQ_INT(shardopt_register(rt, &d, &p), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "shape[1] = 0");
    d = fixture_desc("neg", 1, -4, 0, 0, w, g);
    EXPECT_EQ_INT(shardopt_register(rt, &d, &p), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "shape[0] = -4");
    d = fixture_desc("nodims", 0, 4, 0, 0, w, g);
    EXPECT_EQ_INT(shardopt_register(rt, &d, &p), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "ndim = 0");
    d = fixture_desc("huge", 3, 1ll << 30, 1ll << 30, 1ll << 30, w, g);
    EXPECT_EQ_INT(shardopt_register(rt, &d, &p), SHARDOPT_ERR_INVALID_ARGUMENT);
    d = fixture_desc("dtype", 1, 4, 0, 0, w, g);
    d.grad_dtype = (shardopt_dtype_t)7;
    EXPECT_EQ_INT(shardopt_register(rt, &d, &p), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "grad_dtype = 7");
    d = fixture_desc("partial", 2, 8, 8, 0, w, g);
    d.shard_length = 4;
    EXPECT_EQ_INT(shardopt_register(rt, &d, &p), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "whole tensor");
    d = fixture_desc("mult", 1, 4, 0, 0, w, g);
    d.lr_mult = -1;
    EXPECT_EQ_INT(shardopt_register(rt, &d, &p), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "lr_mult = -1");
    EXPECT_EQ_INT(shardopt_finalize(rt), SHARDOPT_OK);
}

TEST(null_grad_fails_the_step_before_anything_is_written)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_runtime_t rt = fixture_runtime(&cfg);
    static float w1[16], g1[16], w2[16];
    shardopt_param_desc_t d1 = fixture_desc("first.bias", 1, 16, 0, 0, w1, g1);
    shardopt_param_desc_t d2 = fixture_desc("second.bias", 1, 16, 0, 0, w2, NULL);
    shardopt_param_t p1, p2;
    shardopt_step_args_t args = SHARDOPT_STEP_ARGS_INIT;
    shardopt_stats_t st = SHARDOPT_STATS_INIT;

    for (int i = 0; i < 16; i++) {
        w1[i] = w2[i] = 1.0f;
        g1[i] = 0.5f;
    }
    args.lr = 0.1;
    EXPECT_EQ_INT(shardopt_register(rt, &d1, &p1), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_register(rt, &d2, &p2), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_commit(rt), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_step(rt, &args), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "'second.bias' has a NULL grad");
    for (int i = 0; i < 16; i++)
        EXPECT_TRUE(w1[i] == 1.0f);
    EXPECT_EQ_INT(shardopt_get_stats(rt, &st), SHARDOPT_OK);
    EXPECT_EQ_INT(st.steps, 0);

    args.lr = -2;
    EXPECT_EQ_INT(shardopt_param_set_pointers(p2, w2, g1), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_step(rt, &args), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "lr = -2");
    /* a forgotten lr: SHARDOPT_STEP_ARGS_INIT leaves it unset, and the step refuses it (it was
     * 0: successful steps that changed nothing) */
    args.lr = SHARDOPT_LR_UNSET;
    EXPECT_EQ_INT(shardopt_step(rt, &args), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "lr is not set");
    shardopt_step_args_t fresh = SHARDOPT_STEP_ARGS_INIT;
    EXPECT_EQ_INT(shardopt_step(rt, &fresh), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "set args.lr each step");
    args.lr = NAN;
    EXPECT_EQ_INT(shardopt_step(rt, &args), SHARDOPT_ERR_INVALID_ARGUMENT);
    args.lr = 0.1;
    EXPECT_EQ_INT(shardopt_step(rt, &args), SHARDOPT_OK);
    EXPECT_TRUE(w1[0] < 1.0f && w2[0] < 1.0f);
    EXPECT_EQ_INT(shardopt_finalize(rt), SHARDOPT_OK);
}

TEST(invalid_config_refused_at_init)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_runtime_t rt = NULL;
    cfg.momentum = 1.5;
    EXPECT_EQ_INT(shardopt_init(MPI_COMM_SELF, &cfg, &rt), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "momentum = 1.5");
    EXPECT_TRUE(rt == NULL);
    cfg = (shardopt_config_t)SHARDOPT_CONFIG_INIT;
    cfg.backend = SHARDOPT_BACKEND_CUDA;
    const struct device_ops *cuda = device_ops_cuda();
    if (cuda == NULL) { /* a build without CUDA says so */
        EXPECT_EQ_INT(shardopt_init(MPI_COMM_SELF, &cfg, &rt), SHARDOPT_ERR_UNSUPPORTED);
        EXPECT_STR_CONTAINS(shardopt_last_error(), "backend = cuda");
        EXPECT_TRUE(rt == NULL);
        return;
    }
    if (cuda->device_count() == 0) { /* and a machine without a GPU is named as such */
        EXPECT_EQ_INT(shardopt_init(MPI_COMM_SELF, &cfg, &rt), SHARDOPT_ERR_DEVICE);
        EXPECT_STR_CONTAINS(shardopt_last_error(), "no CUDA device is visible");
        EXPECT_TRUE(rt == NULL);
        /* Gram and AOL run on the device (kernels/cuda/ns_driver.h): not refused for the
         * backend, so what stops init here is the missing device, as above */
        cfg.ns_algorithm = SHARDOPT_NS_ALGORITHM_GRAM;
        cfg.ns_precondition = SHARDOPT_NS_PRECONDITION_AOL;
        cfg.ns_coeffs = SHARDOPT_NS_AOL;
        cfg.ns_steps = 4;
        EXPECT_EQ_INT(shardopt_init(MPI_COMM_SELF, &cfg, &rt), SHARDOPT_ERR_DEVICE);
        EXPECT_STR_CONTAINS(shardopt_last_error(), "no CUDA device is visible");
        EXPECT_TRUE(rt == NULL);
    }
}

/* A name a checkpoint could not hold is refused at registration: "<name>.exp_avg_sq" must fit a
 * safetensors name of 255 bytes. It used to be accepted up to 1024 bytes: a 250-byte name saved
 * fine and then failed to load (ERR_CORRUPT). The longest accepted name round-trips. */
/* One AdamW vector named `name` registered, stepped, saved and loaded back. */
static void one_tensor_round_trip(const char *name)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_param_t p = NULL;
    char dir[] = "/tmp/shardopt_name_XXXXXX";
    ASSERT_TRUE(mkdtemp(dir) != NULL);
    shardopt_runtime_t rt = fixture_runtime(&cfg);
    shardopt_param_desc_t d = fixture_desc(name, 1, 8, 0, 0, w, g);
    for (int i = 0; i < 8; i++)
        g[i] = 0.5f * (float)(i + 1);
    ASSERT_EQ_INT(shardopt_register(rt, &d, &p), SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_commit(rt), SHARDOPT_OK);
    shardopt_step_args_t a = SHARDOPT_STEP_ARGS_INIT;
    a.lr = 0.01;
    ASSERT_EQ_INT(shardopt_step(rt, &a), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_save(rt, dir), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_load(rt, dir), SHARDOPT_OK);
    shardopt_finalize(rt);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    EXPECT_EQ_INT(system(cmd), 0);
}

/* A name that is not UTF-8 used to register, train, and then fail every save (the safetensors
 * header must be UTF-8); it is refused at register now, and a multi-byte UTF-8 name saves and
 * loads. */
TEST(names_that_are_not_utf8_are_refused_at_register)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_runtime_t rt = fixture_runtime(&cfg);
    shardopt_param_t p = NULL;
    const struct {
        const char *name, *where;
    } bad[] = {{"\xff.weight", "byte 0xff at 0"},
               {"layers.0.w\xc3", "byte 0xc3 at 10"},        /* truncated sequence */
               {"layers.\xc0\xaf.w", "byte 0xc0 at 7"},      /* overlong '/' */
               {"layers.\xed\xa0\x80.w", "byte 0xed at 7"}}; /* a surrogate */
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        shardopt_param_desc_t d = fixture_desc(bad[i].name, 1, 8, 0, 0, w, g);
        EXPECT_EQ_INT(shardopt_register(rt, &d, &p), SHARDOPT_ERR_INVALID_ARGUMENT);
        EXPECT_STR_CONTAINS(shardopt_last_error(), "not valid UTF-8");
        EXPECT_STR_CONTAINS(shardopt_last_error(), bad[i].where);
    }
    shardopt_finalize(rt);

    one_tensor_round_trip("couche.\xc3\xa9.\xe6\x9d\x83\xe9\x87\x8d");
}

TEST(names_a_checkpoint_cannot_hold_are_refused_and_the_longest_round_trips)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_runtime_t rt = fixture_runtime(&cfg);
    shardopt_param_t p = NULL;
    char name[300];

    memset(name, 'n', sizeof name);
    name[245] = '\0';
    shardopt_param_desc_t d = fixture_desc(name, 1, 8, 0, 0, w, g);
    EXPECT_EQ_INT(shardopt_register(rt, &d, &p), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "name of 245 bytes: at most 244");
    d = fixture_desc("layers.0\n.weight", 1, 8, 0, 0, w, g);
    EXPECT_EQ_INT(shardopt_register(rt, &d, &p), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "control character (byte 0x0a at 8)");
    shardopt_finalize(rt);

    /* 244 bytes, AdamW (two state tensors, the longer suffix): save, load, the same state */
    name[244] = '\0';
    one_tensor_round_trip(name);
}

/* Saving the step `latest` already names is a refusal of the call in this state (ERR_STATE),
 * not an I/O error (it was ERR_IO); the checkpoint stays and loads. */
TEST(saving_the_latest_step_again_is_a_state_refusal)
{
    char base[] = "/tmp/shardopt_api_misuse_XXXXXX", dir[64]; /* unique: concurrent checkouts */
    static float w[8 * 8], g[8 * 8];
    ASSERT_TRUE(mkdtemp(base) != NULL);
    snprintf(dir, sizeof dir, "%s/ckpt", base);
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_runtime_t rt = fixture_runtime(&cfg);
    shardopt_param_desc_t d = fixture_desc("w", 2, 8, 8, 0, w, g);
    shardopt_param_t p;
    ASSERT_EQ_INT(shardopt_register(rt, &d, &p), SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_commit(rt), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_save(rt, dir), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_save(rt, dir), SHARDOPT_ERR_STATE);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "is the latest checkpoint (step 0)");
    EXPECT_EQ_INT(shardopt_load(rt, dir), SHARDOPT_OK);
    /* resumed, and the only step since skipped (a NaN gradient): the step number is still the
     * loaded one, so the save is the same refusal; a step taken makes it a new checkpoint */
    shardopt_step_args_t args = SHARDOPT_STEP_ARGS_INIT;
    args.lr = 0.01;
    g[3] = NAN;
    EXPECT_EQ_INT(shardopt_step(rt, &args), SHARDOPT_OK);
    shardopt_stats_t st = SHARDOPT_STATS_INIT;
    EXPECT_EQ_INT(shardopt_get_stats(rt, &st), SHARDOPT_OK);
    EXPECT_EQ_INT(st.last_step_skipped, 1);
    EXPECT_EQ_INT(shardopt_save(rt, dir), SHARDOPT_ERR_STATE);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "is the latest checkpoint (step 0)");
    g[3] = 0.0f;
    EXPECT_EQ_INT(shardopt_step(rt, &args), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_save(rt, dir), SHARDOPT_OK);
    shardopt_finalize(rt);
    fixture_rmtree(base);
}

/* shardopt_params_set_pointers re-points every listed parameter at once, or, when one entry is
 * refused, none: the step after a refusal still reads and writes the buffers it had. */
TEST(params_set_pointers_applies_every_entry_or_none)
{
    enum { N = 16 };
    static float w_old[3][N], g_old[3][N], w_new[3][N], g_new[3][N], w_other[N];
    const char *names[3] = {"a.bias", "b.bias", "c.bias"};
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_runtime_t rt = fixture_runtime(&cfg), other = fixture_runtime(&cfg);
    shardopt_param_t p[3], q;
    shardopt_step_args_t args = SHARDOPT_STEP_ARGS_INIT;
    args.lr = 0.1;

    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < N; i++) {
            w_old[k][i] = w_new[k][i] = 1.0f;
            g_old[k][i] = g_new[k][i] = 0.5f;
        }
        shardopt_param_desc_t d = fixture_desc(names[k], 1, N, 0, 0, w_old[k], g_old[k]);
        ASSERT_EQ_INT(shardopt_register(rt, &d, &p[k]), SHARDOPT_OK);
    }
    shardopt_param_desc_t d = fixture_desc("other.bias", 1, N, 0, 0, w_other, g_old[0]);
    ASSERT_EQ_INT(shardopt_register(other, &d, &q), SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_commit(rt), SHARDOPT_OK);

    void *data[3] = {w_new[0], w_new[1], w_new[2]};
    const void *grad[3] = {g_new[0], g_new[1], g_new[2]};
    shardopt_param_t list[3] = {p[0], p[1], p[2]};

    /* a refusal in the middle (entry 1) leaves entry 0 as it was, as well as 1 and 2 */
    data[1] = NULL;
    EXPECT_EQ_INT(shardopt_params_set_pointers(rt, 3, list, data, grad),
                  SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "entry 1 of 3 ('b.bias'): data is NULL");
    EXPECT_STR_CONTAINS(shardopt_last_error(), "no pointer was changed");
    data[1] = w_new[1];
    list[2] = p[0];
    EXPECT_EQ_INT(shardopt_params_set_pointers(rt, 3, list, data, grad),
                  SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "entry 2 of 3 ('a.bias'): the same parameter as "
                                               "entry 0");
    list[2] = q;
    EXPECT_EQ_INT(shardopt_params_set_pointers(rt, 3, list, data, grad),
                  SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "entry 2 of 3 ('other.bias'): the parameter was "
                                               "registered with another runtime");
    list[2] = NULL;
    EXPECT_EQ_INT(shardopt_params_set_pointers(rt, 3, list, data, grad),
                  SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "entry 2 of 3: NULL param");
    list[2] = p[2];
    EXPECT_EQ_INT(shardopt_params_set_pointers(rt, -1, list, data, grad),
                  SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "n = -1");
    EXPECT_EQ_INT(shardopt_params_set_pointers(rt, 3, NULL, data, grad),
                  SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ_INT(shardopt_params_set_pointers(rt, 3, list, NULL, grad),
                  SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ_INT(shardopt_params_set_pointers(NULL, 3, list, data, grad),
                  SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ_INT(shardopt_params_set_pointers(rt, 0, NULL, NULL, NULL), SHARDOPT_OK);

    /* every refusal above changed nothing: the step writes the registered buffers only */
    ASSERT_EQ_INT(shardopt_step(rt, &args), SHARDOPT_OK);
    for (int k = 0; k < 3; k++) {
        EXPECT_TRUE(w_old[k][0] < 1.0f);
        EXPECT_TRUE(w_new[k][0] == 1.0f);
    }

    /* accepted: every parameter steps its new buffers from the next step on */
    EXPECT_EQ_INT(shardopt_params_set_pointers(rt, 3, list, data, grad), SHARDOPT_OK);
    const float stepped = w_old[0][0];
    ASSERT_EQ_INT(shardopt_step(rt, &args), SHARDOPT_OK);
    for (int k = 0; k < 3; k++) {
        EXPECT_TRUE(w_old[k][0] == stepped);
        EXPECT_TRUE(w_new[k][0] < 1.0f);
    }

    /* grad NULL: every listed gradient cleared (zero_grad), which the step then refuses */
    EXPECT_EQ_INT(shardopt_params_set_pointers(rt, 2, list + 1, data + 1, NULL), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_step(rt, &args), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "'b.bias' has a NULL grad");
    args.skip_missing_grads = 1;
    const float kept = w_new[1][0];
    EXPECT_EQ_INT(shardopt_step(rt, &args), SHARDOPT_OK);
    EXPECT_TRUE(w_new[1][0] == kept && w_new[2][0] == kept);
    EXPECT_TRUE(w_new[0][0] < kept);
    shardopt_finalize(other);
    shardopt_finalize(rt);
}

/* A negative shard_length other than -1, and an offset or end past int64, are refused with the
 * numbers; transposed is a flag. Before: -2 read as "the rest of the dim", and the end of an
 * offset near INT64_MAX was computed by a signed overflow. */
TEST(shard_ranges_and_flags_out_of_their_domain_are_refused)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_runtime_t rt = fixture_runtime(&cfg);
    shardopt_param_desc_t d = fixture_desc("r", 2, 8, 8, 0, w, g);
    shardopt_param_t p = NULL;

    d.shard_length = -2;
    EXPECT_EQ_INT(shardopt_register(rt, &d, &p), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "register 'r': shard_length = -2 along dim 0");
    d.shard_length = -1;
    d.shard_offset = INT64_MIN;
    EXPECT_EQ_INT(shardopt_register(rt, &d, &p), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "shard_offset = -9223372036854775808");
    d.shard_offset = 4;
    d.shard_length = INT64_MAX;
    EXPECT_EQ_INT(shardopt_register(rt, &d, &p), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "shard [4, 9223372036854775811) along dim 0");
    d = fixture_desc("r", 2, 8, 8, 0, w, g);
    d.transposed = 2;
    EXPECT_EQ_INT(shardopt_register(rt, &d, &p), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "transposed = 2: accepted 0 or 1");
    EXPECT_TRUE(p == NULL);
    EXPECT_EQ_INT(shardopt_finalize(rt), SHARDOPT_OK);
}

/* Step arguments finite but far outside a learning rate's or a decay's range are refused before
 * anything is written. Before: lr = 1e308 stepped and left every weight -inf, and -inf passed
 * for "the default" adamw_lr and weight_decay. */
TEST(step_arguments_beyond_their_range_are_refused_before_anything_is_written)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_runtime_t rt = fixture_runtime(&cfg);
    static float wm[64], gm[64], wb[8], gb[8];
    shardopt_param_desc_t dm = fixture_desc("m.weight", 2, 8, 8, 0, wm, gm);
    shardopt_param_desc_t db = fixture_desc("m.bias", 1, 8, 0, 0, wb, gb);
    shardopt_param_t pm, pb;
    shardopt_step_args_t args = SHARDOPT_STEP_ARGS_INIT;

    for (int i = 0; i < 64; i++) {
        wm[i] = 0.5f;
        gm[i] = (float)(i % 5) * 0.1f - 0.2f;
    }
    for (int i = 0; i < 8; i++) {
        wb[i] = 1.0f;
        gb[i] = 0.1f;
    }
    ASSERT_EQ_INT(shardopt_register(rt, &dm, &pm), SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_register(rt, &db, &pb), SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_commit(rt), SHARDOPT_OK);
    args.lr = 1e308;
    EXPECT_EQ_INT(shardopt_step(rt, &args), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "lr = 1e+308: accepted [0, 1e+06]");
    args.lr = 0.01;
    args.adamw_lr = -INFINITY;
    EXPECT_EQ_INT(shardopt_step(rt, &args), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "adamw_lr = -inf");
    args.adamw_lr = -1;
    args.weight_decay = 1e300;
    EXPECT_EQ_INT(shardopt_step(rt, &args), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "weight_decay = 1e+300");
    args.weight_decay = -INFINITY;
    EXPECT_EQ_INT(shardopt_step(rt, &args), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "weight_decay = -inf");
    for (int i = 0; i < 64; i++)
        EXPECT_TRUE(wm[i] == 0.5f);
    EXPECT_TRUE(wb[0] == 1.0f);
    args.weight_decay = -1;
    EXPECT_EQ_INT(shardopt_step(rt, &args), SHARDOPT_OK);
    EXPECT_TRUE(isfinite(wm[0]) && wm[0] != 0.5f);
    EXPECT_EQ_INT(shardopt_finalize(rt), SHARDOPT_OK);
}

/* A step count the next step would wrap to 0 is refused (AdamW's bias correction 1 - beta^t
 * is 0 at t = 0: every weight of the tensor became non-finite on a successful step). */
TEST(a_step_count_the_next_step_would_wrap_is_refused)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_runtime_t rt = fixture_runtime(&cfg);
    static float wb[8], gb[8];
    shardopt_param_desc_t db = fixture_desc("norm.weight", 1, 8, 0, 0, wb, gb);
    shardopt_param_t pb;
    shardopt_step_args_t args = SHARDOPT_STEP_ARGS_INIT;
    uint64_t step = 0;

    for (int i = 0; i < 8; i++) {
        wb[i] = 1.0f;
        gb[i] = 0.1f;
    }
    ASSERT_EQ_INT(shardopt_register(rt, &db, &pb), SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_commit(rt), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_param_set_step(pb, UINT64_MAX), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "param_set_step 'norm.weight': step = "
                                               "18446744073709551615: accepted [0, 2^53)");
    EXPECT_EQ_INT(shardopt_param_get_step(pb, &step), SHARDOPT_OK);
    EXPECT_TRUE(step == 0);
    args.lr = 0.01;
    EXPECT_EQ_INT(shardopt_step(rt, &args), SHARDOPT_OK);
    for (int i = 0; i < 8; i++)
        EXPECT_TRUE(isfinite(wb[i]) && wb[i] < 1.0f);
    EXPECT_EQ_INT(shardopt_param_set_step(pb, (1ull << 53) - 1), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_finalize(rt), SHARDOPT_OK);
}

/* An empty checkpoint path, and a load path longer than save takes, are refused naming what is
 * wrong. Before: ERR_IO with a message naming '' ("save: rank 0: : No such file or directory"),
 * and a long load path filled the message before its reason. */
TEST(empty_or_overlong_checkpoint_paths_are_refused)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_runtime_t rt = fixture_runtime(&cfg);
    static float wb[8], gb[8];
    shardopt_param_desc_t db = fixture_desc("b", 1, 8, 0, 0, wb, gb);
    shardopt_param_t pb;
    static char longp[3100];

    ASSERT_EQ_INT(shardopt_register(rt, &db, &pb), SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_commit(rt), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_save(rt, ""), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "save: rank 0: dir is empty");
    EXPECT_EQ_INT(shardopt_load(rt, ""), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "load: rank 0: dir is empty");
    memset(longp, 'd', sizeof longp - 1);
    longp[0] = '/';
    EXPECT_EQ_INT(shardopt_load(rt, longp), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(),
                        "load: rank 0: directory path of 3099 bytes: at most 3000");
    EXPECT_EQ_INT(shardopt_save(rt, longp), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "save: rank 0: directory path of 3099 bytes");
    EXPECT_EQ_INT(shardopt_finalize(rt), SHARDOPT_OK);
}

/* A run resumed through shardopt_param_set_step (a state dict) counts its parameters past its
 * runtime's steps; the checkpoints it saves load, with the counts. Before: every load refused
 * them, ERR_CORRUPT '"step" is not an integer in [0, 1] (the checkpoint's step)'. */
TEST(a_run_resumed_through_set_step_saves_checkpoints_that_load)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_runtime_t rt = fixture_runtime(&cfg);
    static float wb[8], gb[8];
    shardopt_param_desc_t db = fixture_desc("norm.weight", 1, 8, 0, 0, wb, gb);
    shardopt_param_t pb;
    shardopt_step_args_t args = SHARDOPT_STEP_ARGS_INIT;
    char dir[64] = "/tmp/shardopt_resume_XXXXXX"; /* unique: a pid repeats across runs */
    uint64_t step = 0;

    ASSERT_TRUE(mkdtemp(dir) != NULL);
    for (int i = 0; i < 8; i++) {
        wb[i] = 1.0f;
        gb[i] = 0.1f;
    }
    ASSERT_EQ_INT(shardopt_register(rt, &db, &pb), SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_commit(rt), SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_param_set_step(pb, 100), SHARDOPT_OK);
    args.lr = 0.01;
    ASSERT_EQ_INT(shardopt_step(rt, &args), SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_save(rt, dir), SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_param_set_step(pb, 7), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_load(rt, dir), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_param_get_step(pb, &step), SHARDOPT_OK);
    EXPECT_TRUE(step == 101);
    EXPECT_EQ_INT(shardopt_finalize(rt), SHARDOPT_OK);
    fixture_rmtree(dir);
}

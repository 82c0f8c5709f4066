/* The C API as a hostile or careless caller uses it, beyond test_api_misuse.c: versioned structs
 * whose size or version field lies, names with odd bytes, a tensor of 2^40 elements, gradients
 * that are the parameter, a step after a failed commit, every SHARDOPT_* value with trailing
 * junk, overflow, emptiness or a sign, parameter data in memory the process cannot write. Each
 * gets a status and a message naming what was wrong; the runtime still finalizes. */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fixture.h"

static float w[64], g[64], w2[64];

TEST(config_structs_whose_size_or_version_lies_are_refused_at_init)
{
    shardopt_runtime_t rt = NULL;
    const size_t sizes[] = {0, 3, sizeof(size_t) + sizeof(uint32_t) - 1};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
        cfg.size = sizes[i];
        EXPECT_EQ_INT(shardopt_init(MPI_COMM_SELF, &cfg, &rt), SHARDOPT_ERR_INVALID_ARGUMENT);
        EXPECT_TRUE(rt == NULL);
        EXPECT_STR_CONTAINS(shardopt_last_error(), "size");
    }
    const uint32_t versions[] = {0, SHARDOPT_CONFIG_VERSION + 1, UINT32_MAX};
    for (size_t i = 0; i < sizeof versions / sizeof versions[0]; i++) {
        shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
        cfg.version = versions[i];
        EXPECT_EQ_INT(shardopt_init(MPI_COMM_SELF, &cfg, &rt), SHARDOPT_ERR_INVALID_ARGUMENT);
        EXPECT_TRUE(rt == NULL);
        EXPECT_STR_CONTAINS(shardopt_last_error(), "version");
    }
    /* larger than this library knows (a newer header): only the fields it knows are read */
    struct {
        shardopt_config_t cfg;
        unsigned char newer[64];
    } big;
    memset(&big, 0xff, sizeof big);
    big.cfg = (shardopt_config_t)SHARDOPT_CONFIG_INIT;
    big.cfg.size = sizeof big;
    big.cfg.num_threads = 1;
    shardopt_status_t s = shardopt_init(MPI_COMM_SELF, &big.cfg, &rt);
    EXPECT_TRUE(s == SHARDOPT_OK || s == SHARDOPT_ERR_INVALID_ARGUMENT);
    if (s != SHARDOPT_OK)
        EXPECT_STR_CONTAINS(shardopt_last_error(), "size");
    EXPECT_EQ_INT(shardopt_finalize(rt), SHARDOPT_OK);
}

TEST(param_desc_and_step_args_whose_size_or_version_lies_are_refused)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_runtime_t rt = fixture_runtime(&cfg);
    shardopt_param_t p = NULL;
    shardopt_param_desc_t d = fixture_desc("a", 2, 8, 8, 0, w, g);
    d.size = 0;
    EXPECT_EQ_INT(shardopt_register(rt, &d, &p), SHARDOPT_ERR_INVALID_ARGUMENT);
    d = fixture_desc("a", 2, 8, 8, 0, w, g);
    d.version = 0;
    EXPECT_EQ_INT(shardopt_register(rt, &d, &p), SHARDOPT_ERR_INVALID_ARGUMENT);
    d = fixture_desc("a", 2, 8, 8, 0, w, g);
    d.version = UINT32_MAX;
    EXPECT_EQ_INT(shardopt_register(rt, &d, &p), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(p == NULL);
    EXPECT_EQ_INT(shardopt_finalize(rt), SHARDOPT_OK);
    rt = fixture_runtime(&cfg); /* a failed registration fails commit (every rank agrees) */
    d = fixture_desc("a", 2, 8, 8, 0, w, g);
    EXPECT_EQ_INT(shardopt_register(rt, &d, &p), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_commit(rt), SHARDOPT_OK);
    shardopt_step_args_t a = SHARDOPT_STEP_ARGS_INIT;
    a.lr = 0.01;
    a.size = 1;
    EXPECT_EQ_INT(shardopt_step(rt, &a), SHARDOPT_ERR_INVALID_ARGUMENT);
    a = (shardopt_step_args_t)SHARDOPT_STEP_ARGS_INIT;
    a.lr = 0.01;
    a.version = 0;
    EXPECT_EQ_INT(shardopt_step(rt, &a), SHARDOPT_ERR_INVALID_ARGUMENT);
    a = (shardopt_step_args_t)SHARDOPT_STEP_ARGS_INIT;
    a.lr = 0.01;
    a.version = UINT32_MAX;
    EXPECT_EQ_INT(shardopt_step(rt, &a), SHARDOPT_ERR_INVALID_ARGUMENT);
    shardopt_stats_t st = SHARDOPT_STATS_INIT;
    st.size = 0;
    EXPECT_EQ_INT(shardopt_get_stats(rt, &st), SHARDOPT_ERR_INVALID_ARGUMENT);
    /* nothing stepped: the runtime's counters are where they were */
    /* a future or garbage version is refused like the config's, naming the field and value */
    const uint32_t bad_versions[] = {0, SHARDOPT_STATS_VERSION + 1, 999, UINT32_MAX};
    for (size_t i = 0; i < sizeof bad_versions / sizeof bad_versions[0]; i++) {
        st = (shardopt_stats_t)SHARDOPT_STATS_INIT;
        st.version = bad_versions[i];
        st.steps = 12345;
        EXPECT_EQ_INT(shardopt_get_stats(rt, &st), SHARDOPT_ERR_INVALID_ARGUMENT);
        EXPECT_STR_CONTAINS(shardopt_last_error(), "stats.version");
        EXPECT_EQ_INT((int)st.steps, 12345); /* not written */
    }
    shardopt_param_stats_t ps = SHARDOPT_PARAM_STATS_INIT;
    ps.version = 999;
    EXPECT_EQ_INT(shardopt_param_get_stats(p, &ps), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "stats.version = 999");
    st = (shardopt_stats_t)SHARDOPT_STATS_INIT;
    EXPECT_EQ_INT(shardopt_get_stats(rt, &st), SHARDOPT_OK);
    EXPECT_EQ_INT((int)st.steps, 0);
    a = (shardopt_step_args_t)SHARDOPT_STEP_ARGS_INIT;
    a.lr = 0.01;
    EXPECT_EQ_INT(shardopt_step(rt, &a), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_finalize(rt), SHARDOPT_OK);
}

TEST(config_load_json_names_an_empty_or_null_path)
{
    shardopt_config_t c = SHARDOPT_CONFIG_INIT;
    c.momentum = 0.5;
    EXPECT_EQ_INT(shardopt_config_load_json("", &c), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "path = \"\" (empty)");
    EXPECT_TRUE(c.momentum == 0.5); /* unchanged */
    EXPECT_EQ_INT(shardopt_config_load_json(NULL, &c), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "NULL path");
    EXPECT_TRUE(c.momentum == 0.5);
}

TEST(a_binding_s_refusal_fails_commit_naming_its_reason)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_runtime_t rt = fixture_runtime(&cfg);
    EXPECT_EQ_INT(shardopt_register_refused(rt, "w", NULL), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ_INT(shardopt_register_refused(rt, "w", "dtype float16\x1b[2J"),
                  SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "register 'w': refused by the caller: dtype "
                                               "float16\\x1b[2J");
    EXPECT_EQ_INT(shardopt_commit(rt), SHARDOPT_ERR_MISMATCH);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "refused by the caller: dtype float16");
    EXPECT_EQ_INT(shardopt_finalize(rt), SHARDOPT_OK);
}

TEST(names_with_odd_bytes_are_refused_or_shown_escaped)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_runtime_t rt = fixture_runtime(&cfg);
    shardopt_param_t p = NULL;
    const char *bad[] = {"a\nb", "a\rb", "\x1b[2J", "", "a\tb"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        shardopt_param_desc_t d = fixture_desc(bad[i], 2, 8, 8, 0, w, g);
        EXPECT_EQ_INT(shardopt_register(rt, &d, &p), SHARDOPT_ERR_INVALID_ARGUMENT);
        for (const char *c = shardopt_last_error(); *c != '\0'; c++)
            if ((unsigned char)*c < 0x20) {
                EXPECT_TRUE(!"a control character in the message");
                break;
            }
    }
    static char longname[1 << 20];
    memset(longname, 'x', sizeof longname - 1);
    shardopt_param_desc_t d = fixture_desc(longname, 2, 8, 8, 0, w, g);
    EXPECT_EQ_INT(shardopt_register(rt, &d, &p), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(strlen(shardopt_last_error()) < 4096); /* not the whole name back */
    EXPECT_TRUE(p == NULL);
    EXPECT_EQ_INT(shardopt_finalize(rt), SHARDOPT_OK);
}

/* 4 TiB of momentum on one rank: refused with the bytes asked for, the runtime still usable to
 * finalize (the allocation fails where the kernel refuses it: see docs/reliability.md for
 * vm.overcommit_memory = 1, where it would not) */
TEST(a_tensor_of_2_to_the_40_elements_is_refused_with_the_bytes)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_runtime_t rt = fixture_runtime(&cfg);
    shardopt_param_t p = NULL;
    shardopt_param_desc_t d = fixture_desc("big", 2, 1ll << 20, 1ll << 20, 0, w, g);
    shardopt_status_t s = shardopt_register(rt, &d, &p);
    if (s == SHARDOPT_OK)
        s = shardopt_commit(rt);
    EXPECT_TRUE(s == SHARDOPT_ERR_INVALID_ARGUMENT || s == SHARDOPT_ERR_OUT_OF_MEMORY);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "4398046511104 bytes");
    shardopt_step_args_t a = SHARDOPT_STEP_ARGS_INIT;
    a.lr = 0.01;
    EXPECT_EQ_INT(shardopt_step(rt, &a), SHARDOPT_ERR_STATE);
    EXPECT_EQ_INT(shardopt_finalize(rt), SHARDOPT_OK);
}

/* a step, save or load after a commit that failed (a registration refused on this rank): refused
 * as a state error, never a step on half a layout */
TEST(step_save_and_load_after_a_failed_commit_are_refused)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_runtime_t rt = fixture_runtime(&cfg);
    shardopt_param_t p = NULL;
    shardopt_param_desc_t d = fixture_desc("a", 2, 8, 8, 0, w, g);
    EXPECT_EQ_INT(shardopt_register(rt, &d, &p), SHARDOPT_OK);
    d = fixture_desc("b", 2, 8, 8, 0, w2, g);
    d.lr_mult = -1;
    EXPECT_EQ_INT(shardopt_register(rt, &d, &p), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(shardopt_commit(rt) != SHARDOPT_OK);
    shardopt_step_args_t a = SHARDOPT_STEP_ARGS_INIT;
    a.lr = 0.01;
    EXPECT_EQ_INT(shardopt_step(rt, &a), SHARDOPT_ERR_STATE);
    EXPECT_EQ_INT(shardopt_save(rt, "/tmp/shardopt_api_hostile_ckpt"), SHARDOPT_ERR_STATE);
    EXPECT_EQ_INT(shardopt_load(rt, "/tmp/shardopt_api_hostile_ckpt"), SHARDOPT_ERR_STATE);
    EXPECT_TRUE(shardopt_commit(rt) != SHARDOPT_OK); /* and a second commit does not half-work */
    EXPECT_EQ_INT(shardopt_step(rt, &a), SHARDOPT_ERR_STATE);
    EXPECT_EQ_INT(shardopt_finalize(rt), SHARDOPT_OK);
}

/* a gradient that is its parameter (or another's), the same buffer registered twice */
TEST(gradients_aliasing_parameters_are_refused)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_runtime_t rt = fixture_runtime(&cfg);
    shardopt_param_t p = NULL, q = NULL;
    shardopt_param_desc_t d = fixture_desc("a", 2, 8, 8, 0, w, w);
    shardopt_status_t s = shardopt_register(rt, &d, &p);
    if (s == SHARDOPT_OK) {
        shardopt_param_desc_t e = fixture_desc("b", 2, 8, 8, 0, w2, g);
        EXPECT_EQ_INT(shardopt_register(rt, &e, &q), SHARDOPT_OK);
        s = shardopt_commit(rt);
        if (s == SHARDOPT_OK) {
            shardopt_step_args_t a = SHARDOPT_STEP_ARGS_INIT;
            a.lr = 0.01;
            s = shardopt_step(rt, &a);
        }
    }
    EXPECT_EQ_INT(s, SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "'a'");
    EXPECT_EQ_INT(shardopt_finalize(rt), SHARDOPT_OK);

    /* b's gradient is a's parameter */
    rt = fixture_runtime(&cfg);
    d = fixture_desc("a", 2, 8, 8, 0, w, g);
    shardopt_param_desc_t e = fixture_desc("b", 2, 8, 8, 0, w2, w);
    EXPECT_EQ_INT(shardopt_register(rt, &d, &p), SHARDOPT_OK);
    s = shardopt_register(rt, &e, &q);
    if (s == SHARDOPT_OK)
        s = shardopt_commit(rt);
    if (s == SHARDOPT_OK) {
        shardopt_step_args_t a = SHARDOPT_STEP_ARGS_INIT;
        a.lr = 0.01;
        s = shardopt_step(rt, &a);
    }
    EXPECT_EQ_INT(s, SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ_INT(shardopt_finalize(rt), SHARDOPT_OK);
}

/* Every SHARDOPT_* config variable given trailing junk, an overflow, an empty value or a sign
 * where none belongs: refused naming the variable, the config unchanged. */
TEST(environment_values_with_junk_overflow_empty_or_sign_are_refused)
{
    const struct {
        const char *var, *value;
    } cases[] = {
        {"SHARDOPT_NUM_THREADS", "4 "},
        {"SHARDOPT_NUM_THREADS", "4x"},
        {"SHARDOPT_NUM_THREADS", ""},
        {"SHARDOPT_NUM_THREADS", "-1"},
        {"SHARDOPT_NUM_THREADS", "99999999999999999999"},
        {"SHARDOPT_NUM_THREADS", "0x10"},
        {"SHARDOPT_NS_STEPS", "5\n"},
        {"SHARDOPT_MOMENTUM", ""},
        {"SHARDOPT_MOMENTUM", "nan"},
        {"SHARDOPT_MOMENTUM", "1e999"},
        {"SHARDOPT_MOMENTUM", "0.9 junk"},
        {"SHARDOPT_WEIGHT_DECAY", "inf"},
        {"SHARDOPT_SEED", "18446744073709551616"},
        {"SHARDOPT_SEED", "+1"},
        {"SHARDOPT_SEED", " 1"},
        {"SHARDOPT_NESTEROV", "2"},
        {"SHARDOPT_NESTEROV", "yes please"},
        {"SHARDOPT_MOMENTUM_DTYPE", "bf16 "},
        {"SHARDOPT_MOMENTUM_DTYPE", "BF16\x1b"},
        {"SHARDOPT_COMM_TIMEOUT_S", "-5"},
        {"SHARDOPT_HOST_STORE_LIMIT", "-1"},
        {"SHARDOPT_KEEP_LAST", "1.5"}, /* 1e3 is 1000, as a JSON file's 1e3 (test_config_edges) */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        shardopt_config_t c = SHARDOPT_CONFIG_INIT, before = c;
        setenv(cases[i].var, cases[i].value, 1);
        const shardopt_status_t s = shardopt_config_from_env(&c);
        unsetenv(cases[i].var);
        if (s != SHARDOPT_ERR_INVALID_ARGUMENT)
            fprintf(stderr, "taken: %s='%s'\n", cases[i].var, cases[i].value);
        EXPECT_EQ_INT(s, SHARDOPT_ERR_INVALID_ARGUMENT);
        EXPECT_STR_CONTAINS(shardopt_last_error(), cases[i].var);
        EXPECT_TRUE(memcmp(&c, &before, sizeof c) == 0);
        for (const char *ch = shardopt_last_error(); *ch != '\0'; ch++)
            if ((unsigned char)*ch < 0x20) {
                EXPECT_TRUE(!"a control character in the message");
                break;
            }
    }
}

/* One step of a runtime holding one 8 x 8 parameter whose data is at `data`: its status. */
static shardopt_status_t step_with_data_at(float *data)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_runtime_t rt = fixture_runtime(&cfg);
    shardopt_param_t p = NULL;
    shardopt_param_desc_t d = fixture_desc("ro.weight", 2, 8, 8, 0, data, g);
    shardopt_status_t s = shardopt_register(rt, &d, &p);
    if (s == SHARDOPT_OK)
        s = shardopt_commit(rt);
    if (s == SHARDOPT_OK) {
        shardopt_step_args_t a = SHARDOPT_STEP_ARGS_INIT;
        a.lr = 0.01;
        s = shardopt_step(rt, &a);
    }
    EXPECT_EQ_INT(shardopt_finalize(rt), SHARDOPT_OK);
    return s;
}

/* Parameter data in a mapping the process may read but not write (a PROT_READ mmap of weights;
 * numpy's mmap_mode='r' handed to torch.from_numpy) died of SIGSEGV in the step's first write.
 * Refused before anything is written, naming the parameter and the mapping; data that crosses
 * from a writable mapping into a read-only one too, and data over two writable mappings of other
 * protections is stepped. */
TEST(parameter_data_in_read_only_memory_is_refused_not_written)
{
    for (int i = 0; i < 64; i++)
        g[i] = 1;
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    unsigned char *m =
        mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_TRUE(m != MAP_FAILED);
    float *whole = (float *)m, *across = (float *)(m + page - 128);
    ASSERT_EQ_INT(mprotect(m, 2 * page, PROT_READ), 0);
    EXPECT_EQ_INT(step_with_data_at(whole), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "the data of parameter 'ro.weight'");
    EXPECT_STR_CONTAINS(shardopt_last_error(), "cannot write (r--p");
    /* 128 bytes in a writable page, 128 in a read-only one */
    ASSERT_EQ_INT(mprotect(m, page, PROT_READ | PROT_WRITE), 0);
    EXPECT_EQ_INT(step_with_data_at(across), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "cannot write");
    for (size_t i = 0; i < 2 * page; i++)
        EXPECT_TRUE(i < page || m[i] == 0); /* nothing written (the page read-only holds 0s) */
    /* two writable mappings (the second also executable: the kernel keeps them apart) */
    ASSERT_EQ_INT(mprotect(m + page, page, PROT_READ | PROT_WRITE | PROT_EXEC), 0);
    EXPECT_EQ_INT(step_with_data_at(across), SHARDOPT_OK);
    int moved = 0;
    for (int i = 0; i < 64; i++)
        moved += across[i] != 0;
    EXPECT_TRUE(moved > 0);
    munmap(m, 2 * page);
}

/* shardopt_param_get_state into a buffer the process may read but not write (a PROT_READ
 * mapping; a read-only numpy array's memory handed through the C API) died of SIGSEGV in the
 * copy. Refused naming the parameter, the rank, the buffer and the mapping, the buffer
 * unchanged; one that crosses into a read-only page too, and a writable one still gets the
 * momentum. */
TEST(get_state_into_read_only_memory_is_refused_not_a_crash)
{
    for (int i = 0; i < 64; i++)
        g[i] = 1, w[i] = (float)i;
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_runtime_t rt = fixture_runtime(&cfg);
    shardopt_param_t p = NULL;
    shardopt_param_desc_t d = fixture_desc("ro.weight", 2, 8, 8, 0, w, g);
    ASSERT_EQ_INT(shardopt_register(rt, &d, &p), SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_commit(rt), SHARDOPT_OK);
    shardopt_step_args_t a = SHARDOPT_STEP_ARGS_INIT;
    a.lr = 0.01;
    ASSERT_EQ_INT(shardopt_step(rt, &a), SHARDOPT_OK);
    shardopt_dtype_t dt = SHARDOPT_DTYPE_FP32;
    ASSERT_EQ_INT(shardopt_param_state_info(p, SHARDOPT_STATE_MOMENTUM, &dt, NULL), SHARDOPT_OK);
    const size_t bytes = 64 * (dt == SHARDOPT_DTYPE_FP32 ? 4 : 2);
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    unsigned char *m =
        mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_TRUE(m != MAP_FAILED);
    ASSERT_EQ_INT(mprotect(m, 2 * page, PROT_READ), 0);
    EXPECT_EQ_INT(shardopt_param_get_state(p, SHARDOPT_STATE_MOMENTUM, m, bytes, dt),
                  SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "param_get_state 'ro.weight': rank 0: buf = ");
    EXPECT_STR_CONTAINS(shardopt_last_error(), "cannot write (r--p");
    /* the first half in a writable page, the rest in a read-only one */
    unsigned char *across = m + page - bytes / 2;
    ASSERT_EQ_INT(mprotect(m, page, PROT_READ | PROT_WRITE), 0);
    EXPECT_EQ_INT(shardopt_param_get_state(p, SHARDOPT_STATE_MOMENTUM, across, bytes, dt),
                  SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "cannot write");
    for (size_t i = 0; i < 2 * page; i++)
        EXPECT_TRUE(m[i] == 0); /* nothing copied, not even into the writable half */
    /* both pages writable: the copy goes ahead and holds the momentum of a nonzero gradient */
    ASSERT_EQ_INT(mprotect(m + page, page, PROT_READ | PROT_WRITE), 0);
    EXPECT_EQ_INT(shardopt_param_get_state(p, SHARDOPT_STATE_MOMENTUM, across, bytes, dt),
                  SHARDOPT_OK);
    int nonzero = 0;
    for (size_t i = 0; i < bytes; i++)
        nonzero += across[i] != 0;
    EXPECT_TRUE(nonzero > 0);
    munmap(m, 2 * page);
    EXPECT_EQ_INT(shardopt_finalize(rt), SHARDOPT_OK);
}

/* A load with ckpt_weights = true copies the weights read into every parameter's data after all
 * ranks agreed: data in a mapping the process may read but not write died of SIGSEGV there (a
 * step refuses such data, a load did not look). Refused before anything is read, naming the
 * parameter, the rank and the mapping; the momentum unchanged; writable again, the load goes on
 * and puts the saved weights back. */
TEST(load_with_weights_into_read_only_data_is_refused_not_a_crash)
{
    for (int i = 0; i < 64; i++)
        g[i] = 1;
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    float *m = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_TRUE(m != MAP_FAILED);
    for (int i = 0; i < 64; i++)
        m[i] = (float)i / 64;
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    cfg.ckpt_weights = 1;
    shardopt_runtime_t rt = fixture_runtime(&cfg);
    shardopt_param_t p = NULL;
    shardopt_param_desc_t d = fixture_desc("ro.weight", 2, 8, 8, 0, m, g);
    ASSERT_EQ_INT(shardopt_register(rt, &d, &p), SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_commit(rt), SHARDOPT_OK);
    shardopt_step_args_t a = SHARDOPT_STEP_ARGS_INIT;
    a.lr = 0.01;
    ASSERT_EQ_INT(shardopt_step(rt, &a), SHARDOPT_OK);
    char dir[64] = "/tmp/shardopt_ro_load_XXXXXX";
    ASSERT_TRUE(mkdtemp(dir) != NULL);
    ASSERT_EQ_INT(shardopt_save(rt, dir), SHARDOPT_OK);
    float saved[64], mom[64], after[64];
    memcpy(saved, m, sizeof saved);
    ASSERT_EQ_INT(shardopt_step(rt, &a), SHARDOPT_OK); /* the weights and momentum move on */
    ASSERT_EQ_INT(
        shardopt_param_get_state(p, SHARDOPT_STATE_MOMENTUM, mom, sizeof mom, SHARDOPT_DTYPE_FP32),
        SHARDOPT_OK);
    ASSERT_EQ_INT(mprotect(m, page, PROT_READ), 0);
    EXPECT_EQ_INT(shardopt_load(rt, dir), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "load: rank 0: the data of parameter 'ro.weight'");
    EXPECT_STR_CONTAINS(shardopt_last_error(), "cannot write (r--p");
    ASSERT_EQ_INT(shardopt_param_get_state(p, SHARDOPT_STATE_MOMENTUM, after, sizeof after,
                                           SHARDOPT_DTYPE_FP32),
                  SHARDOPT_OK);
    EXPECT_TRUE(memcmp(mom, after, sizeof mom) == 0); /* nothing loaded */
    ASSERT_EQ_INT(mprotect(m, page, PROT_READ | PROT_WRITE), 0);
    EXPECT_EQ_INT(shardopt_load(rt, dir), SHARDOPT_OK);
    EXPECT_TRUE(memcmp(m, saved, sizeof saved) == 0);
    EXPECT_EQ_INT(shardopt_finalize(rt), SHARDOPT_OK);
    munmap(m, page);
    fixture_rmtree(dir);
}

/* shardopt_config_print and shardopt_layout_print into a stream that cannot take the text: a
 * full device (/dev/full: every write ENOSPC, as a full disk) and a file opened for reading
 * (EBADF). Both returned OK with the output lost; they now return ERR_IO naming the error. */
TEST(printing_into_a_stream_that_refuses_the_text_is_an_io_error)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_runtime_t rt = fixture_runtime(&cfg);
    char path[] = "/tmp/shardopt_print_XXXXXX";
    const int fd = mkstemp(path);
    ASSERT_TRUE(fd >= 0);
    close(fd);
    FILE *ro = fopen(path, "r");
    ASSERT_TRUE(ro != NULL);
    EXPECT_EQ_INT(shardopt_config_print(&cfg, ro), SHARDOPT_ERR_IO);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "config_print: writing to the stream failed (");
    EXPECT_STR_CONTAINS(shardopt_last_error(), "the config is unchanged");
    EXPECT_EQ_INT(shardopt_layout_print(rt, ro), SHARDOPT_ERR_IO);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "writing to the stream failed");
    fclose(ro);
    FILE *full = fopen("/dev/full", "w");
    if (full != NULL) { /* Linux */
        EXPECT_EQ_INT(shardopt_config_print(&cfg, full), SHARDOPT_ERR_IO);
        EXPECT_STR_CONTAINS(shardopt_last_error(), "No space left on device");
        EXPECT_EQ_INT(shardopt_layout_print(rt, full), SHARDOPT_ERR_IO);
        EXPECT_STR_CONTAINS(shardopt_last_error(), "No space left on device");
        fclose(full);
    }
    /* a stream that takes it: OK, the text there */
    FILE *f = fopen(path, "w+");
    ASSERT_TRUE(f != NULL);
    EXPECT_EQ_INT(shardopt_config_print(&cfg, f), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_layout_print(rt, f), SHARDOPT_OK);
    EXPECT_TRUE(ftell(f) > 100);
    fclose(f);
    unlink(path);
    EXPECT_EQ_INT(shardopt_finalize(rt), SHARDOPT_OK);
}

/* Step arguments whose version names fields their size does not hold (a struct filled by hand or
 * copied short): version 4 with the size of version 1, 2 or 3. The fields past the size were
 * read as "the config's" and the step went on, adamw_eps = 1e-300 given and dropped; now each is
 * refused naming the version and the size it needs, nothing stepped. */
TEST(step_args_shorter_than_their_version_are_refused)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_runtime_t rt = fixture_runtime(&cfg);
    shardopt_param_t p = NULL;
    shardopt_param_desc_t d = fixture_desc("a", 1, 64, 0, 0, w, g);
    d.algo = SHARDOPT_ALGO_ADAMW;
    ASSERT_EQ_INT(shardopt_register(rt, &d, &p), SHARDOPT_OK);
    ASSERT_EQ_INT(shardopt_commit(rt), SHARDOPT_OK);
    const size_t shorts[] = {offsetof(shardopt_step_args_t, skip_missing_grads),
                             offsetof(shardopt_step_args_t, momentum),
                             offsetof(shardopt_step_args_t, adamw_beta1)};
    for (size_t i = 0; i < sizeof shorts / sizeof shorts[0]; i++) {
        shardopt_step_args_t a = SHARDOPT_STEP_ARGS_INIT;
        a.lr = 0.01;
        a.adamw_eps = 1e-300;
        a.size = shorts[i];
        EXPECT_EQ_INT(shardopt_step(rt, &a), SHARDOPT_ERR_INVALID_ARGUMENT);
        EXPECT_STR_CONTAINS(shardopt_last_error(), "a struct of that version is at least 96 bytes");
        EXPECT_STR_CONTAINS(shardopt_last_error(), "nothing was updated");
    }
    shardopt_stats_t st = SHARDOPT_STATS_INIT;
    EXPECT_EQ_INT(shardopt_get_stats(rt, &st), SHARDOPT_OK);
    EXPECT_EQ_INT((int)st.steps, 0);
    /* an older caller's struct, version and size alike, still steps (its later fields unread) */
    shardopt_step_args_t old = SHARDOPT_STEP_ARGS_INIT;
    old.lr = 0.01;
    old.version = 2;
    old.size = offsetof(shardopt_step_args_t, skip_missing_grads) + sizeof(int);
    old.adamw_eps = 1e-300; /* past its size: not read */
    EXPECT_EQ_INT(shardopt_step(rt, &old), SHARDOPT_OK);
    EXPECT_EQ_INT(shardopt_finalize(rt), SHARDOPT_OK);
}

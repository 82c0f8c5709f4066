/* Allocation failure anywhere (issue 10): a representative sequence (config file, init,
 * registration of dense, expert and replicated Muon tensors and an AdamW one, commit, layout
 * print, two steps, save, load, finalize) is run once to count the library's allocations, then
 * once for every n with the n-th allocation failing (SHARDOPT_FAULT=alloc:<n>, armed through
 * fault_arm). Each call must return OK or ERR_OUT_OF_MEMORY with the bytes in its message, never
 * crash, and the runtime must finalize; a failed commit, save or load must succeed when retried.
 * Under make check-sanitize, LeakSanitizer shows that no failure path leaks. */
#include <unistd.h>

#include "base/fault.h"
#include "base/mem.h"
#include "fixture.h"

enum { C_CONFIG, C_INIT, C_REGISTER, C_COMMIT, C_LAYOUT, C_STEP, C_SAVE, C_LOAD, C_NONE };
static const char *const call_names[C_NONE] = {"config_load_json", "init", "register", "commit",
                                               "layout_print",     "step", "save",     "load"};

struct outcome {
    int failed;         /* the call that failed (C_NONE: none) */
    int retried;        /* a failed commit, save or load was called again */
    int retry_status;   /* and returned this */
    int rt_left_set;    /* init failed but wrote *rt_p */
    char message[1024]; /* shardopt_last_error() of the failed call */
    shardopt_status_t status;
};

static float dense_w[24 * 16], dense_g[24 * 16], exp_w[4 * 8 * 12], exp_g[4 * 8 * 12];
static float rep_w[8 * 8], rep_g[8 * 8], bias_w[16], bias_g[16];

static void data_fill(void)
{
    uint64_t s = 12345;
    float *a[] = {dense_w, dense_g, exp_w, exp_g, rep_w, rep_g, bias_w, bias_g};
    const size_t n[] = {24 * 16, 24 * 16, 4 * 8 * 12, 4 * 8 * 12, 64, 64, 16, 16};
    for (int k = 0; k < 8; k++)
        for (size_t i = 0; i < n[k]; i++)
            a[k][i] = (float)test_rand(&s);
}

/* The sequence in `dir` (which holds config.json), saving to dir/ckpt; stops at the first call
 * that fails, retries it once when it is commit, save or load, then finalizes. */
static void sequence(const char *dir, FILE *sink, struct outcome *o)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_runtime_t rt = NULL;
    shardopt_param_t p = NULL;
    shardopt_step_args_t args = SHARDOPT_STEP_ARGS_INIT;
    shardopt_status_t st = SHARDOPT_OK;
    char path[512], ckpt[512];
    int c = C_CONFIG;

    memset(o, 0, sizeof *o);
    o->failed = C_NONE;
    snprintf(path, sizeof path, "%s/config.json", dir);
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", dir);
    shardopt_param_desc_t d[4] = {
        fixture_desc("layers.0.attn.q_proj.weight", 2, 24, 16, 0, dense_w, dense_g),
        fixture_desc("layers.0.mlp.experts.w1", 3, 4, 8, 12, exp_w, exp_g),
        fixture_desc("layers.0.router.weight", 2, 8, 8, 0, rep_w, rep_g),
        fixture_desc("layers.0.norm.weight", 1, 16, 0, 0, bias_w, bias_g),
    };
    d[1].placement = SHARDOPT_PLACEMENT_EXPERT;
    d[2].placement = SHARDOPT_PLACEMENT_REPLICATED;
    args.lr = 0.01;

#define CALL(which, expr)                                                                          \
    do {                                                                                           \
        c = (which);                                                                               \
        if ((st = (expr)) != SHARDOPT_OK)                                                          \
            goto failed;                                                                           \
    } while (0)
    CALL(C_CONFIG, shardopt_config_load_json(path, &cfg));
    CALL(C_INIT, shardopt_init(MPI_COMM_SELF, &cfg, &rt));
    for (int i = 0; i < 4; i++)
        CALL(C_REGISTER, shardopt_register(rt, &d[i], &p));
    CALL(C_COMMIT, shardopt_commit(rt));
    CALL(C_LAYOUT, shardopt_layout_print(rt, sink));
    CALL(C_STEP, shardopt_step(rt, &args));
    CALL(C_STEP, shardopt_step(rt, &args));
    CALL(C_SAVE, shardopt_save(rt, ckpt));
    CALL(C_LOAD, shardopt_load(rt, ckpt));
#undef CALL
    goto out;

failed:
    o->failed = c;
    o->status = st;
    snprintf(o->message, sizeof o->message, "%s", shardopt_last_error());
    o->rt_left_set = c == C_INIT && rt != NULL;
    /* the runtime is still usable: the allocation that failed is behind us */
    if (c == C_COMMIT || c == C_SAVE || c == C_LOAD) {
        o->retried = 1;
        o->retry_status = c == C_COMMIT ? shardopt_commit(rt)
                          : c == C_SAVE ? shardopt_save(rt, ckpt)
                                        : shardopt_load(rt, ckpt);
    }
out:
    if (shardopt_finalize(rt) != SHARDOPT_OK)
        o->failed = -1;
    fixture_rmtree(ckpt);
}

static void every_allocation_fails_once(const char *config_json, const char *label)
{
    char dir[] = "/tmp/shardopt_alloc_fault_XXXXXX", path[512], spec[64];
    struct outcome o;
    int per_call[C_NONE] = {0}, absorbed = 0;
    FILE *sink = fopen("/dev/null", "w");

    ASSERT_TRUE(sink != NULL);
    ASSERT_TRUE(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    ASSERT_TRUE(f != NULL);
    fputs(config_json, f);
    fclose(f);
    data_fill();

    /* once to settle what is set up once per process, once more (armed past the end, so that
     * cJSON's allocations are counted as in the runs below) to count */
    sequence(dir, sink, &o);
    ASSERT_EQ_INT(o.failed, C_NONE);
    fault_arm("alloc:2000000000");
    const unsigned long before = mem_count();
    sequence(dir, sink, &o);
    const unsigned long total = mem_count() - before;
    fault_arm(NULL);
    ASSERT_EQ_INT(o.failed, C_NONE);
    ASSERT_TRUE(total > 0);

    /* SHARDOPT_TEST_ALLOC_STRIDE=k tries every k-th point only (make check-valgrind: each
     * sequence costs seconds under memcheck); the printed count says how many ran */
    const char *stride_env = getenv("SHARDOPT_TEST_ALLOC_STRIDE");
    const unsigned long stride =
        stride_env != NULL && atol(stride_env) > 1 ? (unsigned long)atol(stride_env) : 1;
    unsigned long tried = 0;
    for (unsigned long n = 1; n <= total; n += stride) {
        tried++;
        snprintf(spec, sizeof spec, "alloc:%lu", n);
        data_fill();
        fault_arm(spec);
        const unsigned long start = mem_count();
        sequence(dir, sink, &o);
        const unsigned long seen = mem_count() - start;
        fault_arm(NULL);
        /* the same allocations as the counted run up to the n-th: the fault was injected */
        if (seen < n)
            TEST_FAIL_("alloc:%lu: only %lu allocations were made", n, seen);
        if (o.failed < 0) {
            TEST_FAIL_("alloc:%lu: finalize failed", n);
            continue;
        }
        if (o.failed == C_NONE) {
            absorbed++;
            continue;
        }
        per_call[o.failed]++;
        if (o.status != SHARDOPT_ERR_OUT_OF_MEMORY || strstr(o.message, "bytes") == NULL ||
            strstr(o.message, "out of memory") == NULL)
            TEST_FAIL_("alloc:%lu: %s returned %d (%s): %s", n, call_names[o.failed], (int)o.status,
                       shardopt_status_string(o.status), o.message);
        if (o.rt_left_set)
            TEST_FAIL_("alloc:%lu: a failed init wrote *rt_p", n);
        if (o.retried && o.retry_status != SHARDOPT_OK)
            TEST_FAIL_("alloc:%lu: %s failed (%s), then failed again when retried (%d): %s", n,
                       call_names[o.failed], o.message, o.retry_status, shardopt_last_error());
        if (test_failures > 20)
            break; /* enough to see the pattern */
    }
    int returned = 0;
    for (int c = 0; c < C_NONE; c++)
        returned += per_call[c];
    printf("alloc faults (%s): %lu of %lu injection points exercised: %d returned "
           "ERR_OUT_OF_MEMORY (",
           label, tried, total, returned);
    for (int c = 0; c < C_NONE; c++)
        printf("%s%s %d", c ? ", " : "", call_names[c], per_call[c]);
    printf("), %d absorbed (a fallback; the sequence succeeded)\n", absorbed);
    /* every point an ERR_OUT_OF_MEMORY: also the proof that each fault was injected at all (a
     * disarmed injector would let every sequence succeed, "absorbed") */
    EXPECT_TRUE(returned > 0);
    EXPECT_EQ_INT(absorbed, 0);
    fclose(sink);
    fixture_rmtree(dir);
}

TEST(every_allocation_failure_is_reported_and_released)
{
    every_allocation_fails_once("{\"momentum\": 0.9, \"nesterov\": true, \"keep_last\": 2,\n"
                                " \"replica_check_every\": 1, \"momentum_dtype\": \"bf16\"}\n",
                                "offload none");
}

TEST(every_allocation_failure_with_offload_is_reported_and_released)
{
    every_allocation_fails_once("{\"offload\": \"optimizer\", \"keep_last\": 2}\n",
                                "offload optimizer");
}

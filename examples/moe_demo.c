/* Single-process demo: a small MoE-shaped parameter set stepped 20 times on synthetic gradients,
 * printing per-step update norms (Muon and AdamW tensors apart) and timings.
 *
 *   moe_demo [options]      (moe_demo --help lists them with their defaults)
 * SHARDOPT_* environment variables override the config (see docs/config.md). As an application
 * (not a library inside a trainer) it asks for bind = auto: threads on this rank's cores. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "shardopt.h"
#include "tools/cli.h"

static const char usage[] =
    "usage: moe_demo [options]\n"
    "  --steps N            steps on synthetic gradients (20)\n"
    "  --layers L           MoE layers (2)\n"
    "  --experts E          experts per layer (8)\n"
    "  --hidden H           model width (256)\n"
    "  --ffn F              expert hidden width (128)\n"
    "  --vocab V            vocabulary size (2048)\n"
    "  --momentum-dtype fp32|bf16\n"
    "                       Muon momentum dtype (the config's: fp32)\n"
    "  --offload none|optimizer|cpu\n"
    "                       where the optimizer state lives (the config's: none)\n"
    "  --config FILE.json   a config file (docs/config.md), read before the two above\n"
    "  --help, -h           this text\n"
    "SHARDOPT_* environment variables override all of these (docs/config.md).\n";

struct tensor {
    char name[96];
    int ndim;
    int64_t shape[3];
    size_t n;
    float *w, *g, *before;
    shardopt_param_t h;
    shardopt_algo_t algo;
};

struct model {
    struct tensor *t;
    int n, cap;
};

/* Each process runs alone (MPI_COMM_SELF): a refusal (a SHARDOPT_* variable, init) ends it
 * alone too, with the library's line and exit 1, without MPI_Abort's banner around it. */
static void die(const char *what, shardopt_status_t status)
{
    fprintf(stderr, "moe_demo: %s: %s (%s)\n", what, shardopt_status_string(status),
            shardopt_last_error());
    MPI_Finalize();
    exit(1);
}

static double rnd(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(*s >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

/* Out of memory for what the command line asked: one line naming it and the bytes, exit 1 (a
 * NULL buffer segfaulted at its first write; --hidden 100000 did). Each process runs alone
 * (MPI_COMM_SELF), so it ends alone. */
static void *alloc_or_exit(size_t count, size_t size, const char *what)
{
    void *p = count <= SIZE_MAX / size ? malloc(count * size) : NULL;
    if (p == NULL) {
        fprintf(stderr,
                "moe_demo: out of memory allocating %zu x %zu bytes for %s: use smaller --layers, "
                "--experts, --hidden, --ffn or --vocab\n",
                count, size, what);
        MPI_Finalize();
        exit(1);
    }
    return p;
}

static void add(struct model *m, const char *name, int ndim, int64_t a, int64_t b, int64_t c)
{
    if (m->n == m->cap) {
        struct tensor *old = m->t;
        m->cap = m->cap ? 2 * m->cap : 32;
        m->t = alloc_or_exit((size_t)m->cap, sizeof(*m->t), "the tensor list");
        if (old != NULL)
            memcpy(m->t, old, sizeof(*m->t) * (size_t)m->n);
        free(old);
    }
    struct tensor *t = &m->t[m->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = ndim;
    t->shape[0] = a;
    t->shape[1] = b;
    t->shape[2] = c;
    /* a product past size_t is refused as memory no machine has (it wrapped to a small size) */
    const size_t nb = (size_t)(ndim > 1 ? b : 1), nc = (size_t)(ndim > 2 ? c : 1);
    t->n = nb > SIZE_MAX / nc || (size_t)a > SIZE_MAX / (nb * nc) ? SIZE_MAX : (size_t)a * nb * nc;
}

/* Embedding, then per layer: attention with biases, two norms, a router, routed experts as
 * [E, out, in] stacks, one shared expert; final norm and lm_head. */
static void model_build(struct model *m, int layers, int experts, int hidden, int ffn, int vocab)
{
    char n[96];
    add(m, "model.embed_tokens.weight", 2, vocab, hidden, 0);
    for (int l = 0; l < layers; l++) {
        const char *proj[] = {"q", "k", "v", "o"};
        for (int p = 0; p < 4; p++) {
            snprintf(n, sizeof n, "layers.%d.attn.%s_proj.weight", l, proj[p]);
            add(m, n, 2, hidden, hidden, 0);
            if (p < 3) {
                snprintf(n, sizeof n, "layers.%d.attn.%s_proj.bias", l, proj[p]);
                add(m, n, 1, hidden, 0, 0);
            }
        }
        snprintf(n, sizeof n, "layers.%d.input_norm.weight", l);
        add(m, n, 1, hidden, 0, 0);
        snprintf(n, sizeof n, "layers.%d.post_attn_norm.weight", l);
        add(m, n, 1, hidden, 0, 0);
        snprintf(n, sizeof n, "layers.%d.mlp.router.weight", l);
        add(m, n, 2, experts, hidden, 0);
        snprintf(n, sizeof n, "layers.%d.mlp.experts.gate_proj", l);
        add(m, n, 3, experts, ffn, hidden);
        snprintf(n, sizeof n, "layers.%d.mlp.experts.up_proj", l);
        add(m, n, 3, experts, ffn, hidden);
        snprintf(n, sizeof n, "layers.%d.mlp.experts.down_proj", l);
        add(m, n, 3, experts, hidden, ffn);
        snprintf(n, sizeof n, "layers.%d.mlp.shared_expert.gate_proj.weight", l);
        add(m, n, 2, ffn, hidden, 0);
        snprintf(n, sizeof n, "layers.%d.mlp.shared_expert.up_proj.weight", l);
        add(m, n, 2, ffn, hidden, 0);
        snprintf(n, sizeof n, "layers.%d.mlp.shared_expert.down_proj.weight", l);
        add(m, n, 2, hidden, ffn, 0);
    }
    add(m, "model.norm.weight", 1, hidden, 0, 0);
    add(m, "lm_head.weight", 2, vocab, hidden, 0);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    int steps = 20, layers = 2, experts = 8, hidden = 256, ffn = 128, vocab = 2048;
    const char *config_path = NULL, *mom_dtype = NULL, *offload = NULL;
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_runtime_t rt;
    shardopt_status_t status;
    struct model m = {0};
    uint64_t seed = 1234;

    int me = 0;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    cli_stdout_at_exit("moe_demo");
    if (cli_argv_refused(argc, argv, "moe_demo", me == 0)) {
        MPI_Finalize();
        return 2;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int *target = strcmp(a, "--steps") == 0     ? &steps
                      : strcmp(a, "--layers") == 0  ? &layers
                      : strcmp(a, "--experts") == 0 ? &experts
                      : strcmp(a, "--hidden") == 0  ? &hidden
                      : strcmp(a, "--ffn") == 0     ? &ffn
                      : strcmp(a, "--vocab") == 0   ? &vocab
                                                    : NULL;
        const char **sv = strcmp(a, "--config") == 0           ? &config_path
                          : strcmp(a, "--momentum-dtype") == 0 ? &mom_dtype
                          : strcmp(a, "--offload") == 0        ? &offload
                                                               : NULL;
        if (cli_is_help(a))
            cli_exit(me, "moe_demo", usage, 0, NULL);
        else if (target == NULL && sv == NULL)
            cli_exit(me, "moe_demo", usage, 2, "unknown argument '%s'", a);
        else if (v == NULL)
            cli_exit(me, "moe_demo", usage, 2, "%s needs a value", a);
        else if (target != NULL)
            /* --steps and --layers bound the run's time and its tensor list; the sizes are
             * bounded by the memory they ask for (alloc_or_exit) */
            cli_int_opt(me, "moe_demo", usage, a, v, 1,
                        target == &steps    ? 1000000
                        : target == &layers ? 1 << 16
                                            : INT_MAX,
                        target);
        else if (sv != NULL)
            *sv = v;
        i++;
    }
    cfg.bind = SHARDOPT_BIND_AUTO; /* the config file or SHARDOPT_BIND may say otherwise */
    if (config_path != NULL && shardopt_config_load_json(config_path, &cfg) != SHARDOPT_OK)
        cli_exit(me, "moe_demo", usage, 2, "--config: %s", shardopt_last_error());
    /* the library parses the names (and says what it accepts) */
    if (mom_dtype != NULL && shardopt_config_set(&cfg, "momentum_dtype", mom_dtype) != SHARDOPT_OK)
        cli_exit(me, "moe_demo", usage, 2, "--momentum-dtype: %s", shardopt_last_error());
    if (offload != NULL && shardopt_config_set(&cfg, "offload", offload) != SHARDOPT_OK)
        cli_exit(me, "moe_demo", usage, 2, "--offload: %s", shardopt_last_error());
    if ((status = shardopt_config_from_env(&cfg)) != SHARDOPT_OK)
        die("environment", status);
    if ((status = shardopt_init(MPI_COMM_SELF, &cfg, &rt)) != SHARDOPT_OK)
        die("init", status);

    model_build(&m, layers, experts, hidden, ffn, vocab);
    size_t total = 0;
    for (int i = 0; i < m.n; i++) {
        struct tensor *t = &m.t[i];
        shardopt_param_desc_t d = SHARDOPT_PARAM_DESC_INIT;
        t->w = alloc_or_exit(t->n, sizeof(float), t->name);
        t->g = alloc_or_exit(t->n, sizeof(float), t->name);
        t->before = alloc_or_exit(t->n, sizeof(float), t->name);
        double fan_in = (double)t->shape[t->ndim - 1];
        for (size_t k = 0; k < t->n; k++)
            t->w[k] = t->ndim == 1 ? 1.0f : (float)(rnd(&seed) / sqrt(fan_in));
        d.name = t->name;
        d.ndim = t->ndim;
        memcpy(d.shape, t->shape, sizeof d.shape);
        d.data = t->w;
        d.grad = t->g;
        if (t->ndim == 3)
            d.placement = SHARDOPT_PLACEMENT_EXPERT;
        if ((status = shardopt_register(rt, &d, &t->h)) != SHARDOPT_OK)
            die("register", status);
        shardopt_param_get_algo(t->h, &t->algo);
        total += t->n;
    }
    if ((status = shardopt_commit(rt)) != SHARDOPT_OK)
        die("commit", status);

    shardopt_stats_t st = SHARDOPT_STATS_INIT;
    shardopt_get_stats(rt, &st);
    printf(
        "moe_demo: %d tensors, %.2f M parameters: %d Muon (%lld matrices), %d AdamW; kernels %s; "
        "momentum %s\n",
        m.n, total / 1e6, st.num_muon, (long long)st.muon_matrices, st.num_adamw, st.kernels,
        cfg.momentum_dtype == SHARDOPT_DTYPE_BF16 ? "bf16" : "fp32");
    printf("optimizer state: momentum %.2f MiB, adam m %.2f MiB, adam v %.2f MiB, workspace %.2f "
           "MiB\n",
           st.bytes_momentum / 1048576.0, st.bytes_adam_m / 1048576.0, st.bytes_adam_v / 1048576.0,
           st.bytes_workspace / 1048576.0);
    printf("%5s %12s %12s %10s %9s %9s %9s %9s %8s\n", "step", "|dW| muon", "|dW| adamw", "step ms",
           "adamw", "momentum", "ns", "apply", "NS GF/s");

    double t_sum = 0;
    for (int s = 1; s <= steps; s++) {
        /* synthetic gradients: a fixed direction per tensor plus fresh noise, so momentum builds */
        uint64_t dir = 99;
        for (int i = 0; i < m.n; i++) {
            struct tensor *t = &m.t[i];
            for (size_t k = 0; k < t->n; k++)
                t->g[k] = (float)(0.5 * rnd(&dir) + rnd(&seed)) * 1e-2f;
            memcpy(t->before, t->w, t->n * sizeof(float));
        }
        shardopt_step_args_t args = SHARDOPT_STEP_ARGS_INIT;
        args.lr = 0.02 * (s < 5 ? s / 5.0 : 1.0); /* short warm-up, as trainers do */
        double t0 = now();
        if ((status = shardopt_step(rt, &args)) != SHARDOPT_OK)
            die("step", status);
        double dt = now() - t0;
        t_sum += s > 1 ? dt : 0;
        double nm = 0, na = 0;
        for (int i = 0; i < m.n; i++) {
            struct tensor *t = &m.t[i];
            double acc = 0;
            for (size_t k = 0; k < t->n; k++) {
                double d = (double)t->w[k] - t->before[k];
                acc += d * d;
            }
            *(t->algo == SHARDOPT_ALGO_MUON ? &nm : &na) += acc;
        }
        shardopt_get_stats(rt, &st);
        printf("%5d %12.5f %12.5f %10.2f %9.2f %9.2f %9.2f %9.2f %8.1f\n", s, sqrt(nm), sqrt(na),
               dt * 1e3, st.seconds_adamw_last * 1e3, st.seconds_momentum_last * 1e3,
               st.seconds_ns_last * 1e3, st.seconds_apply_last * 1e3,
               st.seconds_ns_last > 0 ? st.ns_flops_last / st.seconds_ns_last / 1e9 : 0.0);
        fflush(stdout);
    }
    if (steps > 1)
        printf("moe_demo: %d steps, mean step %.2f ms after the first\n", steps,
               t_sum / (steps - 1) * 1e3);
    if (cfg.offload != SHARDOPT_OFFLOAD_NONE)
        printf(
            "moe_demo: offload %s: %.2f MiB host store; last step host->device %.2f MiB, "
            "device->host %.2f MiB, copies %.2f ms, staging peak %.2f MiB\n",
            cfg.offload == SHARDOPT_OFFLOAD_CPU ? "cpu" : "optimizer",
            st.bytes_host_store / 1048576.0,
            (st.bytes_h2d_momentum + st.bytes_h2d_adam_m + st.bytes_h2d_adam_v + st.bytes_h2d_ns) /
                1048576.0,
            (st.bytes_d2h_momentum + st.bytes_d2h_adam_m + st.bytes_d2h_adam_v + st.bytes_d2h_ns) /
                1048576.0,
            st.seconds_copy_exposed_last * 1e3, st.staging_peak_bytes_last / 1048576.0);

    shardopt_finalize(rt);
    for (int i = 0; i < m.n; i++) {
        free(m.t[i].w);
        free(m.t[i].g);
        free(m.t[i].before);
    }
    free(m.t);
    MPI_Finalize();
    return 0;
}

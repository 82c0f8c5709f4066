/* moe_train: a small MoE model trained with shardopt on several MPI ranks (the README's main job).
 *
 *   mpirun -n 4 moe_train [options]      (moe_train --help lists them with their defaults)
 *
 * Teacher-student regression: a fixed random teacher of the same architecture (model.h) gives
 * the targets, the student learns them. Every step each rank runs forward and backward on its
 * own shard of the global batch with the full parameters, reduce-scatters the gradients into
 * the runtime's layout, calls shardopt_step and all-gathers the updated slices (shard.h).
 * dp_shard is what the ranks leave after dp_replicate and cp; the default on 4 ranks is cp 2,
 * dp_shard 2, ep 2. SHARDOPT_* environment variables override the optimizer config.
 *
 * --save DIR writes the parameters (DIR/model.bin) and the optimizer state (DIR/optimizer) after
 * the last step; --resume DIR loads both and continues the step count, data order and loss curve
 * where the saved run stopped. --ab trains fp32 and bf16 momentum for 3 seeds each and prints the
 * mean loss per window of steps for each arm with its spread over seeds.
 *
 * --backend cuda runs the optimizer step on the GPU with offload = cpu: this example's forward
 * and backward are plain C on the host, so its parameters and gradients are host memory, which
 * is what offload = cpu takes (state and elementwise work on the host, Newton-Schulz on the
 * device, its input and output copied across). offload = none or optimizer would need the
 * parameters in device memory and a copy of every gradient up and parameter down per step;
 * SHARDOPT_OFFLOAD set to either is refused. Without a visible GPU init refuses on every rank
 * and the program exits 1 with the library's message. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <mpi.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model.h"
#include "shard.h"
#include "shardopt.h"
#include "tools/cli.h"
#include "tools/cli_file.h"

static const char usage[] =
    "usage: mpirun -n N moe_train [options]\n"
    "  --steps N            optimizer steps (200)\n"
    "  --dp-replicate R     replicas of the whole layout (1)\n"
    "  --cp C               context-parallel ranks (2); dp_shard = N / (R * C)\n"
    "  --ep E               expert-parallel ranks (2)\n"
    "  --tokens-per-rank T  tokens each rank trains on per step (256)\n"
    "  --hidden H           model width (256)\n"
    "  --ffn F              expert and shared-expert hidden width (512)\n"
    "  --experts X          experts per MoE layer (16)\n"
    "  --topk K             experts each token is routed to (2)\n"
    "  --vocab V            vocabulary size (4096)\n"
    "  --out O              regression output width (64)\n"
    "  --lr LR              Muon learning rate (0.02)\n"
    "  --adamw-lr LR        AdamW learning rate (0.003)\n"
    "  --seed S             data and initialisation seed (1)\n"
    "  --momentum-dtype fp32|bf16\n"
    "                       Muon momentum dtype (fp32)\n"
    "  --backend cpu|cuda   where the optimizer step runs (cpu); cuda: Newton-Schulz on the GPU,\n"
    "                       offload = cpu (the model's forward and backward are host code)\n"
    "  --save DIR           after the last step: parameters to DIR/model.bin, optimizer state\n"
    "                       to DIR/optimizer\n"
    "  --resume DIR         load what --save wrote and continue its step count\n"
    "  --ab                 fp32 against bf16 momentum, 3 seeds each, loss per window\n"
    "  --window W           steps per window of the mean-loss summary (steps / 10)\n"
    "  --quiet              no header and no per-step lines\n"
    "  --help, -h           this text\n"
    "SHARDOPT_* environment variables override the optimizer config (docs/config.md).\n";

struct opts {
    int steps, cp, ep, rep, tokens, window, ab, quiet, seed;
    struct moe_dims d;
    double lr, adamw_lr;
    const char *mom, *save, *resume, *backend;
};

static int me, world;

/* The integer options and what each accepts: a range past which the example stops making sense
 * (the memory a combination asks for is checked once they are all read). */
static const struct cli_int_spec int_opts[] = {
    {"--steps", 1, 10000000, offsetof(struct opts, steps)},
    {"--cp", 1, 1 << 20, offsetof(struct opts, cp)},
    {"--ep", 1, 1 << 20, offsetof(struct opts, ep)},
    {"--dp-replicate", 1, 1 << 20, offsetof(struct opts, rep)},
    {"--tokens-per-rank", 1, 1 << 24, offsetof(struct opts, tokens)},
    {"--window", 0, 10000000, offsetof(struct opts, window)},
    {"--seed", -(1 << 30), 1 << 30, offsetof(struct opts, seed)},
    {"--hidden", 1, 1 << 20, offsetof(struct opts, d.hidden)},
    {"--ffn", 1, 1 << 20, offsetof(struct opts, d.ffn)},
    {"--experts", 1, 1 << 16, offsetof(struct opts, d.experts)},
    {"--topk", 1, 1 << 16, offsetof(struct opts, d.topk)},
    {"--vocab", 1, 1 << 24, offsetof(struct opts, d.vocab)},
    {"--out", 1, 1 << 20, offsetof(struct opts, d.out)},
};

static void die(const char *what, shardopt_status_t st)
{
    fprintf(stderr, "moe_train: rank %d: %s: %s (%s)\n", me, what, shardopt_status_string(st),
            shardopt_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/* A collective call that agrees its outcome on every rank (load, save) failed: every rank is
 * here, so the job ends with the library's line on rank 0 and exit 1, without MPI_Abort. */
static void agreed_exit(const char *what, shardopt_status_t st)
{
    if (me == 0)
        fprintf(stderr, "moe_train: %s: %s (%s)\n", what, shardopt_status_string(st),
                shardopt_last_error());
    MPI_Finalize();
    exit(1);
}

static void fail(const char *msg, const char *detail)
{
    fprintf(stderr, "moe_train: rank %d: %s%s%s\n", me, msg, detail ? ": " : "",
            detail ? detail : "");
    MPI_Abort(MPI_COMM_WORLD, 2);
}

static void opts_parse(int argc, char **argv, struct opts *o)
{
    *o = (struct opts){
        .steps = 200,
        .cp = 2,
        .ep = 2,
        .rep = 1,
        .tokens = 256,
        .window = 0,
        .seed = 1,
        .d = {.vocab = 4096, .hidden = 256, .ffn = 512, .experts = 16, .topk = 2, .out = 64},
        .lr = 0.02,
        .adamw_lr = 3e-3,
        .mom = "fp32",
        .backend = "cpu"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        const struct cli_int_spec *io =
            cli_int_spec_find(int_opts, sizeof int_opts / sizeof int_opts[0], a);
        int *iv = io != NULL ? (int *)((char *)o + io->off) : NULL;
        const char **sv = !strcmp(a, "--momentum-dtype") ? &o->mom
                          : !strcmp(a, "--save")         ? &o->save
                          : !strcmp(a, "--resume")       ? &o->resume
                          : !strcmp(a, "--backend")      ? &o->backend
                                                         : NULL;
        double *dv = !strcmp(a, "--lr") ? &o->lr : !strcmp(a, "--adamw-lr") ? &o->adamw_lr : NULL;
        if (cli_is_help(a))
            cli_exit(me, "moe_train", usage, 0, NULL);
        else if (!strcmp(a, "--ab"))
            o->ab = 1;
        else if (!strcmp(a, "--quiet"))
            o->quiet = 1;
        else if ((iv != NULL || sv != NULL || dv != NULL) && v == NULL)
            cli_exit(me, "moe_train", usage, 2, "%s needs a value", a);
        else if (iv != NULL)
            cli_int_opt(me, "moe_train", usage, a, v, io->lo, io->hi, iv);
        else if (dv != NULL)
            cli_double_opt(me, "moe_train", usage, a, v, 0, 1e6, dv);
        else if (sv != NULL)
            *sv = v;
        else if (iv == NULL && dv == NULL)
            cli_exit(me, "moe_train", usage, 2, "unknown argument '%s'", a);
        i += iv != NULL || sv != NULL || dv != NULL;
    }
    if (o->d.topk > o->d.experts)
        cli_exit(me, "moe_train", usage, 2, "--topk %d is more than --experts %d", o->d.topk,
                 o->d.experts);
    /* what one rank allocates, in double so that no product of the sizes wraps: the student's
     * and the teacher's parameters and gradients, the teacher's output table, and the
     * activations of its tokens (the teacher's forward runs all vocab ids at once) */
    const double H = o->d.hidden, F = o->d.ffn, E = o->d.experts, K = o->d.topk, V = o->d.vocab,
                 O = o->d.out, T = o->tokens > o->d.vocab ? o->tokens : o->d.vocab;
    const double params = V * H + 4 * H * H + 8 * H + E * H + 3 * E * F * H + 3 * F * H + O * H;
    const double acts = T * (8 * H + 4 * F + 2 * E + 2 * K + 2 * O + K * (2 * F + H) + 8);
    const double largest = fmax(fmax(E * F * H, V * H), fmax(V * O, O * H));
    if (largest > INT_MAX) /* counts go to MPI as int */
        cli_exit(me, "moe_train", usage, 2,
                 "a tensor of %.0f elements (--hidden %d, --ffn %d, --experts %d, --vocab %d, "
                 "--out %d): at most %d",
                 largest, o->d.hidden, o->d.ffn, o->d.experts, o->d.vocab, o->d.out, INT_MAX);
    cli_mem_check(me, "moe_train", usage,
                  "the model and batch (--hidden, --ffn, --experts, --topk, --vocab, --out, "
                  "--tokens-per-rank, --steps)",
                  4.0 * (4 * params + V * O + 2 * acts) + 8.0 * o->steps);
    if (strcmp(o->mom, "fp32") && strcmp(o->mom, "bf16"))
        cli_exit(me, "moe_train", usage, 2, "--momentum-dtype takes fp32 or bf16, not '%s'",
                 o->mom);
    if (strcmp(o->backend, "cpu") && strcmp(o->backend, "cuda"))
        cli_exit(me, "moe_train", usage, 2, "--backend takes cpu or cuda, not '%s'", o->backend);
    if (o->window <= 0)
        o->window = o->steps >= 10 ? o->steps / 10 : 1;
    /* the directories, before a run of hours that would end in a save that cannot be made */
    const char *dirs[2] = {o->save, o->resume}, *names[2] = {"--save", "--resume"};
    for (int k = 0; k < 2; k++) {
        struct stat st;
        if (dirs[k] == NULL)
            continue;
        if (dirs[k][0] == '\0')
            cli_exit(me, "moe_train", usage, 2, "%s takes a directory, not ''", names[k]);
        if (stat(dirs[k], &st) == 0 ? !S_ISDIR(st.st_mode) : k == 1)
            cli_exit(me, "moe_train", usage, 2, "%s '%s': %s", names[k], dirs[k],
                     k == 1 && stat(dirs[k], &st) != 0 ? strerror(errno) : "not a directory");
    }
}

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

/* This rank's tokens of a step: the global batch is world * tokens ids drawn from the seed and
 * the step number alone, so a resumed run sees the same data as an uninterrupted one. */
static void batch_of(const struct opts *o, int seed, int step, int *tok)
{
    const uint64_t base =
        (uint64_t)step * (uint64_t)world * (uint64_t)o->tokens + (uint64_t)me * (uint64_t)o->tokens;
    for (int i = 0; i < o->tokens; i++)
        tok[i] = (int)(mix(base + (uint64_t)i + ((uint64_t)seed << 40)) % (uint64_t)o->d.vocab);
}

static uint64_t params_hash(const struct moe_model *m)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < MOE_NPARAMS; i++) {
        const unsigned char *b = (const unsigned char *)m->p[i].w;
        for (size_t j = 0; j < sizeof(float) * (size_t)m->p[i].numel; j++)
            h = (h ^ b[j]) * 0x100000001b3ull;
    }
    return h;
}

/* DIR/model.bin: "SOMOE001", the step count, the model sizes, then every tensor in order. */
static int save_model(const char *dir, const struct moe_model *m, int step)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/model.bin", dir);
    FILE *f = cli_fopen_write(path); /* a model.bin FIFO there: refused, not waited on */
    int ok = f != NULL;
    const int32_t hdr[7] = {step,         m->d.vocab, m->d.hidden, m->d.ffn,
                            m->d.experts, m->d.topk,  m->d.out};
    ok = ok && fwrite("SOMOE001", 8, 1, f) == 1 && fwrite(hdr, sizeof hdr, 1, f) == 1;
    for (int i = 0; ok && i < MOE_NPARAMS; i++)
        ok = fwrite(m->p[i].w, sizeof(float), (size_t)m->p[i].numel, f) == (size_t)m->p[i].numel;
    if (f != NULL && fclose(f) != 0)
        ok = 0;
    if (!ok)
        fprintf(stderr, "moe_train: --save: writing %s failed: %s\n", path, strerror(errno));
    return ok;
}

/* Rank 0 reads DIR/model.bin and broadcasts it; returns the saved step count. */
static int load_model(const char *dir, struct moe_model *m)
{
    int32_t hdr[7] = {0};
    char path[4096], magic[8] = {0};
    int ok = 1;
    if (me == 0) {
        snprintf(path, sizeof path, "%s/model.bin", dir);
        /* a plain file only: fopen of a FIFO waited for a writer for good */
        const int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
        struct stat st;
        FILE *f = fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? fdopen(fd, "rb") : NULL;
        if (f == NULL && fd >= 0)
            close(fd);
        ok = f != NULL && fread(magic, 8, 1, f) == 1 && memcmp(magic, "SOMOE001", 8) == 0 &&
             fread(hdr, sizeof hdr, 1, f) == 1;
        const int32_t want[6] = {m->d.vocab,   m->d.hidden, m->d.ffn,
                                 m->d.experts, m->d.topk,   m->d.out};
        if (ok && memcmp(hdr + 1, want, sizeof want) != 0) {
            fprintf(stderr,
                    "moe_train: %s holds a model of vocab %d hidden %d ffn %d experts %d "
                    "topk %d out %d; this run asks for vocab %d hidden %d ffn %d experts "
                    "%d topk %d out %d\n",
                    path, hdr[1], hdr[2], hdr[3], hdr[4], hdr[5], hdr[6], want[0], want[1], want[2],
                    want[3], want[4], want[5]);
            ok = 0;
        }
        for (int i = 0; ok && i < MOE_NPARAMS; i++)
            ok = fread(m->p[i].w, sizeof(float), (size_t)m->p[i].numel, f) == (size_t)m->p[i].numel;
        if (f != NULL)
            fclose(f);
        if (!ok)
            fprintf(stderr,
                    "moe_train: cannot resume from %s (missing, short or not a "
                    "moe_train model)\n",
                    path);
    }
    MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (!ok) { /* every rank learnt it together: the same way out, without MPI_Abort's banner */
        MPI_Finalize();
        exit(2);
    }
    MPI_Bcast(hdr, 7, MPI_INT32_T, 0, MPI_COMM_WORLD);
    for (int i = 0; i < MOE_NPARAMS; i++)
        MPI_Bcast(m->p[i].w, (int)m->p[i].numel, MPI_FLOAT, 0, MPI_COMM_WORLD);
    return hdr[0];
}

struct run_result {
    double *loss; /* per step of this run */
    double seconds, opt_seconds;
    uint64_t hash;
};

/* One training run: returns the global mean loss of every step (before that step's update). */
static void train(const struct opts *o, const char *mom, int seed, struct run_result *res)
{
    const int dp_shard = world / (o->rep * o->cp);
    const double count = (double)world * o->tokens;

    /* the teacher: its outputs for every token id, the same on every rank */
    struct moe_model teacher, student;
    if (moe_model_init(&teacher, &o->d, 0x7eac4e5ull, o->d.vocab) != 0 ||
        moe_model_init(&student, &o->d, 1000003ull * (uint64_t)seed, o->tokens) != 0)
        fail("out of memory for the model", NULL);
    int *ids = malloc(sizeof(int) * (size_t)o->d.vocab);
    float *table = malloc(sizeof(float) * (size_t)o->d.vocab * o->d.out);
    float *target = malloc(sizeof(float) * (size_t)o->tokens * o->d.out);
    int *tok = malloc(sizeof(int) * (size_t)o->tokens);
    for (int v = 0; v < o->d.vocab; v++)
        ids[v] = v;
    moe_forward(&teacher, ids, o->d.vocab, table);
    moe_model_free(&teacher);

    int step0 = 0;
    if (o->resume != NULL)
        step0 = load_model(o->resume, &student);
    if (step0 < 0 || step0 > INT_MAX - o->steps) /* the step count model.bin holds, run on */
        cli_exit(me, "moe_train", usage, 2,
                 "--resume %s: its step count %d and --steps %d pass %d steps (or it is negative)",
                 o->resume, step0, o->steps, INT_MAX);

    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_runtime_t rt;
    shardopt_status_t st;
    cfg.dp_replicate = o->rep;
    cfg.dp_shard = dp_shard;
    cfg.cp = o->cp;
    cfg.ep = o->ep;
    cfg.momentum_dtype = !strcmp(mom, "bf16") ? SHARDOPT_DTYPE_BF16 : SHARDOPT_DTYPE_FP32;
    if (!strcmp(o->backend, "cuda")) {
        cfg.backend = SHARDOPT_BACKEND_CUDA;
        cfg.offload = SHARDOPT_OFFLOAD_CPU; /* host parameters and gradients (see the top) */
    }
    if ((st = shardopt_config_from_env(&cfg)) != SHARDOPT_OK)
        die("config from SHARDOPT_* environment", st);
    if (cfg.backend == SHARDOPT_BACKEND_CUDA && cfg.offload != SHARDOPT_OFFLOAD_CPU)
        cli_exit(me, "moe_train", usage, 2,
                 "the CUDA backend takes this example's host parameters with offload = cpu "
                 "only (SHARDOPT_OFFLOAD or SHARDOPT_BACKEND set otherwise)");
    if ((st = shardopt_init(MPI_COMM_WORLD, &cfg, &rt)) != SHARDOPT_OK) {
        /* init agrees on its outcome: every rank is here, so the job ends without MPI_Abort
         * (no GPU visible, or a build without CUDA, with --backend cuda) */
        if (me == 0)
            fprintf(stderr, "moe_train: init: %s (%s)\n", shardopt_status_string(st),
                    shardopt_last_error());
        MPI_Finalize();
        exit(1);
    }
    struct moe_shards sh;
    if ((st = moe_shards_register(rt, &student, &sh)) != SHARDOPT_OK)
        die("register (this example assumes the layout of docs/layouts.md)", st);
    if ((st = shardopt_commit(rt)) != SHARDOPT_OK)
        die("commit", st);
    if (o->resume != NULL) {
        char path[4096];
        snprintf(path, sizeof path, "%s/optimizer", o->resume);
        if ((st = shardopt_load(rt, path)) != SHARDOPT_OK)
            agreed_exit("--resume: load", st); /* no checkpoint there, or one of another model */
    }
    if (me == 0 && !o->quiet) {
        shardopt_stats_t s = SHARDOPT_STATS_INIT;
        shardopt_get_stats(rt, &s);
        printf("moe_train: %d ranks = dp_replicate %d x dp_shard %d x cp %d, ep %d; %lld "
               "parameters in %d tensors (%d Muon, %d AdamW); %d tokens per rank per step; "
               "momentum %s; seed %d; backend %s%s%s\n",
               world, o->rep, dp_shard, o->cp, o->ep, (long long)student.total, s.num_params,
               s.num_muon, s.num_adamw, o->tokens, mom, seed, o->backend,
               o->resume ? "; resumed from " : "", o->resume ? o->resume : "");
    }

    res->loss = calloc((size_t)o->steps, sizeof(double));
    res->opt_seconds = 0;
    const double t_start = MPI_Wtime();
    for (int k = 0; k < o->steps; k++) {
        const int step = step0 + k;
        const double t0 = MPI_Wtime();
        batch_of(o, seed, step, tok);
        for (int i = 0; i < o->tokens; i++)
            memcpy(target + (size_t)i * o->d.out, table + (size_t)tok[i] * o->d.out,
                   sizeof(float) * (size_t)o->d.out);
        moe_zero_grad(&student);
        double loss = moe_forward_backward(&student, tok, o->tokens, target, count);
        moe_shards_reduce_scatter(&sh, &student);
        const double t1 = MPI_Wtime();
        shardopt_step_args_t a = SHARDOPT_STEP_ARGS_INIT;
        a.lr = o->lr;
        a.adamw_lr = o->adamw_lr;
        if ((st = shardopt_step(rt, &a)) != SHARDOPT_OK)
            die("step", st);
        const double t2 = MPI_Wtime();
        moe_shards_all_gather(&sh, &student);
        MPI_Allreduce(MPI_IN_PLACE, &loss, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        const double t3 = MPI_Wtime();
        res->loss[k] = loss;
        res->opt_seconds += t2 - t1;
        if (me == 0 && !o->quiet)
            printf("step %5d  loss %.6e  step %7.2f ms  optimizer %7.2f ms (%4.1f%%)\n", step + 1,
                   loss, (t3 - t0) * 1e3, (t2 - t1) * 1e3, 100.0 * (t2 - t1) / (t3 - t0));
        fflush(stdout);
    }
    res->seconds = MPI_Wtime() - t_start;
    res->hash = params_hash(&student);

    if (o->save != NULL) {
        char path[4096];
        snprintf(path, sizeof path, "%s/optimizer", o->save);
        int ok = 1;
        if (me == 0) {
            ok = (mkdir(o->save, 0755) == 0 || errno == EEXIST) &&
                 (mkdir(path, 0755) == 0 || errno == EEXIST);
            if (!ok)
                fprintf(stderr, "moe_train: --save: cannot make %s: %s\n", path, strerror(errno));
            ok = ok && save_model(o->save, &student, step0 + o->steps);
        }
        /* every rank learns it here together: one way out, without MPI_Abort's banner */
        MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
        if (!ok) {
            MPI_Finalize();
            exit(1);
        }
        if ((st = shardopt_save(rt, path)) != SHARDOPT_OK)
            agreed_exit("--save: save", st);
        if (me == 0 && !o->quiet)
            printf("moe_train: saved step %d to %s (model.bin and optimizer/)\n", step0 + o->steps,
                   o->save);
    }
    if (me == 0 && !o->quiet) {
        shardopt_stats_t s = SHARDOPT_STATS_INIT;
        shardopt_get_stats(rt, &s);
        const double first = res->loss[0], last = res->loss[o->steps - 1];
        printf("\nmoe_train: loss %.4e at step %d -> %.4e at step %d (%.1fx lower) in %.1f s; "
               "the optimizer took %.1f%% of the step time\n",
               first, step0 + 1, last, step0 + o->steps, first / last, res->seconds,
               100.0 * res->opt_seconds / res->seconds);
        printf("moe_train: mean loss by window of %d steps:", o->window);
        for (int w = 0; w * o->window < o->steps; w++) {
            double sum = 0;
            int n = 0;
            for (int k = w * o->window; k < o->steps && k < (w + 1) * o->window; k++, n++)
                sum += res->loss[k];
            printf(" %.3e", sum / n);
        }
        printf(
            "\nmoe_train: optimizer on rank 0: %llu steps (%llu skipped), %lld Muon matrices per "
            "step, last step: gradient norm %.4e, %.3f MiB sent in the dense group and %.3f "
            "MiB in the expert group; state %.3f MiB (momentum %s); kernels %s\n",
            (unsigned long long)s.steps, (unsigned long long)s.steps_skipped,
            (long long)s.muon_matrices, s.grad_norm_last, s.bytes_sent_dense / 1048576.0,
            s.bytes_sent_expert / 1048576.0,
            (double)(s.bytes_momentum + s.bytes_adam_m + s.bytes_adam_v) / 1048576.0, mom,
            s.kernels);
        printf("moe_train: params checksum %016llx\n", (unsigned long long)res->hash);
    }
    moe_shards_free(&sh);
    if ((st = shardopt_finalize(rt)) != SHARDOPT_OK)
        die("finalize", st);
    moe_model_free(&student);
    free(ids);
    free(table);
    free(target);
    free(tok);
}

/* fp32 vs bf16 momentum, 3 seeds each: the mean loss per window for each arm, with its spread
 * (min and max over seeds), and the ratio of the arms' means. */
static void ab(const struct opts *o)
{
    static const char *arms[2] = {"fp32", "bf16"};
    enum { SEEDS = 3 };
    struct run_result r[2][SEEDS];
    struct opts q = *o;
    q.quiet = 1;
    for (int a = 0; a < 2; a++)
        for (int s = 0; s < SEEDS; s++) {
            train(&q, arms[a], o->seed + s, &r[a][s]);
            if (me == 0) {
                printf("moe_train --ab: momentum %s, seed %d: loss %.4e -> %.4e in %.1f s\n",
                       arms[a], o->seed + s, r[a][s].loss[0], r[a][s].loss[o->steps - 1],
                       r[a][s].seconds);
                fflush(stdout);
            }
        }
    if (me == 0) {
        printf("\n| steps | fp32 momentum: mean (min - max) | bf16 momentum: mean (min - max) | "
               "bf16 / fp32 |\n|---|---|---|---|\n");
        for (int w = 0; w * o->window < o->steps; w++) {
            const int lo = w * o->window,
                      hi = lo + o->window < o->steps ? lo + o->window : o->steps;
            double mean[2], mn[2], mx[2];
            for (int a = 0; a < 2; a++) {
                mean[a] = 0;
                mn[a] = INFINITY;
                mx[a] = -INFINITY;
                for (int s = 0; s < SEEDS; s++) {
                    double v = 0;
                    for (int k = lo; k < hi; k++)
                        v += r[a][s].loss[k];
                    v /= hi - lo;
                    mean[a] += v / SEEDS;
                    mn[a] = fmin(mn[a], v);
                    mx[a] = fmax(mx[a], v);
                }
            }
            printf("| %d-%d | %.4e (%.4e - %.4e) | %.4e (%.4e - %.4e) | %.3f |\n", lo + 1, hi,
                   mean[0], mn[0], mx[0], mean[1], mn[1], mx[1], mean[1] / mean[0]);
        }
    }
    for (int a = 0; a < 2; a++)
        for (int s = 0; s < SEEDS; s++)
            free(r[a][s].loss);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    cli_stdout_at_exit("moe_train");
    if (cli_argv_refused(argc, argv, "moe_train", me == 0)) {
        MPI_Finalize();
        return 2;
    }
    struct opts o;
    opts_parse(argc, argv, &o);
    /* in long long: 2^20 x 2^20 wrapped int to 0, and the remainder divided by it */
    if (o.rep < 1 || o.cp < 1 || o.ep < 1 || world % ((long long)o.rep * o.cp) != 0)
        cli_exit(me, "moe_train", usage, 2,
                 "%d ranks are not --dp-replicate %d x dp_shard x --cp %d (--ep %d)", world, o.rep,
                 o.cp, o.ep);
    if (o.ab) {
        if (o.save != NULL || o.resume != NULL)
            cli_exit(me, "moe_train", usage, 2,
                     "--ab runs from scratch: no --save or --resume with it");
        ab(&o);
    } else {
        struct run_result r;
        train(&o, o.mom, o.seed, &r);
        free(r.loss);
    }
    MPI_Finalize();
    return 0;
}

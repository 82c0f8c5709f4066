/* A C trainer's integration of shardopt, from the public API only: an embedding, an unevenly
 * sharded dense matrix, a norm, an expert stack and an lm_head, each rank holding the slice
 * shardopt_shard_range gives it; steps with a learning rate; a save and a resume on any layout.
 *
 *   mpirun -n 4 c_trainer --steps 10 [--save-at 5 --dir DIR] [--resume DIR]
 *
 * The layout and the optimizer settings come from SHARDOPT_* variables (shardopt_init applies
 * them: docs/config.md), e.g. SHARDOPT_CP=2 SHARDOPT_EP=2 SHARDOPT_MOMENTUM_DTYPE=bf16.
 *
 * The model is a stand-in: each element's gradient is its distance to a fixed target plus
 * noise, both functions of the element's global index and the step only, so that the run is
 * the same on every layout. What it exercises is the trainer's side: slices, registration,
 * steps, checkpoints.
 *
 * Checkpoints: with ckpt_weights = 1 shardopt_save writes the weights (the registered data)
 * with the optimizer state, in the same files, and shardopt_load reshards both onto whatever
 * layout resumes: the trainer does no gather or scatter of its own. */
#include <errno.h>
#include <inttypes.h>
#include <mpi.h>
#include <shardopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                                                \
    do {                                                                                           \
        shardopt_status_t st_ = (call);                                                            \
        if (st_ != SHARDOPT_OK) {                                                                  \
            fprintf(stderr, "c_trainer: %s: %s\n", #call, shardopt_last_error());                  \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                          \
        }                                                                                          \
    } while (0)

enum { NT = 5 };

static const struct {
    const char *name;
    int ndim;
    int64_t shape[3];
    shardopt_placement_t placement;
    int shard_dim;
} model[NT] = {
    {"embed.weight", 2, {50, 16, 1}, SHARDOPT_PLACEMENT_DENSE, 0},
    {"layers.0.attn.wq.weight", 2, {37, 16, 1}, SHARDOPT_PLACEMENT_DENSE, 0}, /* uneven rows */
    {"layers.0.norm.weight", 1, {16, 1, 1}, SHARDOPT_PLACEMENT_REPLICATED, 0},
    {"layers.0.mlp.experts.w1", 3, {4, 24, 16}, SHARDOPT_PLACEMENT_EXPERT, 0},
    {"lm_head.weight", 2, {50, 16, 1}, SHARDOPT_PLACEMENT_DENSE, 1}, /* columns */
};

/* This rank's slice of tensor t: `len` along shard_dim from global index `glob`. */
struct slice {
    int64_t glob, len, rows_before, row_after; /* dims before and after shard_dim, multiplied */
    int64_t count;                             /* elements */
    float *w, *g;
    shardopt_param_t h;
};

/* Global flat index of local element i. */
static int64_t global_index(int t, const struct slice *s, int64_t i)
{
    const int64_t run = s->len * s->row_after, outer = i / run, in = i % run;
    const int64_t dim = model[t].shape[model[t].shard_dim];
    return outer * dim * s->row_after + s->glob * s->row_after + in;
}

static double unit(uint64_t x) /* a hash of x in [-1, 1) */
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return (double)(x >> 11) / (double)(1ull << 52) - 1.0;
}

static float initial(int t, int64_t gi)
{
    return model[t].ndim == 1 ? 1.0f : (float)(0.1 * unit((uint64_t)(t * 1000003 + gi)));
}

static float target(int t, int64_t gi)
{
    return (float)(0.2 * unit((uint64_t)(t * 7919 + gi) << 1));
}

/* The loss sum (w - target)^2 / 2 and its gradient plus noise, for this step. */
static double gradients(struct slice *s, int step, int count_replicated)
{
    double loss = 0.0;
    for (int t = 0; t < NT; t++)
        for (int64_t i = 0; i < s[t].count; i++) {
            const int64_t gi = global_index(t, &s[t], i);
            const double d = (double)s[t].w[i] - target(t, gi);
            s[t].g[i] = (float)(d + 0.05 * unit((uint64_t)step * 0x9e3779b97f4a7c15ull + gi * 31 +
                                                (uint64_t)t));
            if (model[t].placement != SHARDOPT_PLACEMENT_REPLICATED || count_replicated)
                loss += 0.5 * d * d;
        }
    return loss;
}

/* Order-independent checksum of the whole model: each element once. */
static uint64_t checksum(const struct slice *s, int count_replicated)
{
    uint64_t sum = 0;
    for (int t = 0; t < NT; t++) {
        if (model[t].placement == SHARDOPT_PLACEMENT_REPLICATED && !count_replicated)
            continue;
        for (int64_t i = 0; i < s[t].count; i++) {
            uint32_t bits;
            memcpy(&bits, &s[t].w[i], sizeof bits);
            const uint64_t gi = (uint64_t)global_index(t, &s[t], i) + (uint64_t)t * 1000003;
            sum += ((uint64_t)bits + 1) * (gi * 0x9e3779b97f4a7c15ull | 1);
        }
    }
    MPI_Allreduce(MPI_IN_PLACE, &sum, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    return sum;
}

/* A bad command line: one line naming the argument, exit 2 on every rank (each parsed the same
 * argv), without MPI_Abort's banner. */
static void usage_exit(const char *fmt, const char *a, const char *v)
{
    int me = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    if (me == 0) {
        fputs("c_trainer: ", stderr);
        fprintf(stderr, fmt, a, v);
        fputs("\nusage: c_trainer [--steps N] [--save-at S --dir DIR] [--resume DIR]\n", stderr);
    }
    MPI_Finalize();
    exit(2);
}

/* The whole of s as a decimal integer in [lo, hi] (public API only here, so no tools/cli.h). */
static int int_in(const char *s, long lo, long hi, int *out)
{
    char *end;
    if (*s < '0' || *s > '9')
        return 0;
    errno = 0;
    const long v = strtol(s, &end, 10);
    if (*end != '\0' || errno == ERANGE || v < lo || v > hi)
        return 0;
    *out = (int)v;
    return 1;
}

/* Every slice's weights and gradients (an early exit frees them too: LeakSanitizer). */
static void shards_free(struct slice *s)
{
    for (int t = 0; t < NT; t++) {
        free(s[t].w);
        free(s[t].g);
    }
}

int main(int argc, char **argv)
{
    int steps = 10, save_at = 0;
    const char *dir = NULL, *resume = NULL;
    MPI_Init(&argc, &argv);
    /* an argument with a control byte is refused before any is echoed in a message: an escape
     * sequence printed raw rewrites the terminal over it (the tools do the same: cli_num.h) */
    for (int i = 1; i < argc; i++)
        for (const char *c = argv[i]; *c != '\0'; c++)
            if ((unsigned char)*c < 0x20 || *c == 0x7f) {
                char which[32];
                snprintf(which, sizeof which, "%d", i);
                usage_exit("argument %s holds a control byte, refused%s", which, "");
            }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int *iv = strcmp(a, "--steps") == 0     ? &steps
                  : strcmp(a, "--save-at") == 0 ? &save_at
                                                : NULL;
        const char **sv = strcmp(a, "--dir") == 0      ? &dir
                          : strcmp(a, "--resume") == 0 ? &resume
                                                       : NULL;
        if (iv == NULL && sv == NULL)
            usage_exit("unknown argument '%s'%s", a, "");
        if (v == NULL)
            usage_exit("%s needs a value%s", a, "");
        /* the whole of the value, in range: atoi ran "12abc" as 12 and "-5" as no steps */
        if (iv != NULL && !int_in(v, iv == &steps ? 1 : 0, 1000000, iv))
            usage_exit(iv == &steps ? "%s takes an integer in 1..1000000, not '%s'"
                                    : "%s takes an integer in 0..1000000, not '%s'",
                       a, v);
        if (sv != NULL && *v == '\0')
            usage_exit("%s takes a directory, not '%s'", a, v);
        if (sv != NULL)
            *sv = v;
        i++;
    }
    if (save_at > 0 && dir == NULL)
        usage_exit("%s needs --dir%s", "--save-at", "");

    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT; /* plus SHARDOPT_* from the environment */
    cfg.ckpt_weights = 1; /* checkpoints hold the weights too, resharded on load */
    shardopt_runtime_t rt;
    CHECK(shardopt_init(MPI_COMM_WORLD, &cfg, &rt));
    shardopt_stats_t st = SHARDOPT_STATS_INIT;
    CHECK(shardopt_get_stats(rt, &st));
    /* a replicated tensor, and with replicas every shard, counts once: replica 0, dense rank 0 */
    const int count_rep = st.replica == 0 && st.dense_rank == 0, first_replica = st.replica == 0;

    struct slice s[NT];
    for (int t = 0; t < NT; t++) {
        shardopt_param_desc_t d = SHARDOPT_PARAM_DESC_INIT;
        d.name = model[t].name;
        d.ndim = model[t].ndim;
        memcpy(d.shape, model[t].shape, sizeof d.shape);
        d.placement = model[t].placement;
        d.shard_dim = model[t].shard_dim;
        CHECK(shardopt_shard_range(rt, &d, &d.shard_offset, &d.shard_length, &s[t].glob));
        s[t].len = d.shard_length;
        s[t].rows_before = s[t].row_after = 1;
        for (int k = 0; k < model[t].shard_dim; k++)
            s[t].rows_before *= model[t].shape[k];
        for (int k = model[t].shard_dim + 1; k < 3; k++)
            s[t].row_after *= model[t].shape[k];
        s[t].count = s[t].rows_before * s[t].len * s[t].row_after;
        s[t].w = malloc(sizeof(float) * (size_t)(s[t].count + 1));
        s[t].g = calloc((size_t)(s[t].count + 1), sizeof(float));
        for (int64_t i = 0; i < s[t].count; i++)
            s[t].w[i] = initial(t, global_index(t, &s[t], i));
        d.data = s[t].w;
        d.grad = s[t].g;
        CHECK(shardopt_register(rt, &d, &s[t].h));
    }
    CHECK(shardopt_commit(rt));

    int start = 0;
    if (resume != NULL) {
        /* the weights into each s[t].w and the optimizer state, resharded to this layout */
        /* a load agrees its outcome on every rank, so a --resume that names no checkpoint (a
         * missing path, a file, a FIFO) ends every rank here with the library's one line */
        if (shardopt_load(rt, resume) != SHARDOPT_OK) {
            if (st.rank == 0)
                fprintf(stderr, "c_trainer: --resume '%s': %s\n", resume, shardopt_last_error());
            shardopt_finalize(rt);
            shards_free(s);
            MPI_Finalize();
            return 1;
        }
        CHECK(shardopt_get_stats(rt, &st));
        start = (int)st.steps;
    }

    for (int step = start + 1; step <= steps; step++) {
        double loss = gradients(s, step, count_rep) * (first_replica ? 1 : 0), total = 0;
        MPI_Allreduce(&loss, &total, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        shardopt_step_args_t args = SHARDOPT_STEP_ARGS_INIT;
        args.lr = 0.02;
        CHECK(shardopt_step(rt, &args));
        if (st.rank == 0)
            printf("c_trainer: step %d loss %.9e\n", step, total);
        if (step == save_at)
            /* weights and optimizer state; a save agrees its outcome on every rank, so a --dir
             * that cannot hold a checkpoint (a file, a FIFO) ends every rank here */
            if (shardopt_save(rt, dir) != SHARDOPT_OK) {
                if (st.rank == 0)
                    fprintf(stderr, "c_trainer: --dir '%s': %s\n", dir, shardopt_last_error());
                shardopt_finalize(rt);
                shards_free(s);
                MPI_Finalize();
                return 1;
            }
    }
    shardopt_param_stats_t ps = SHARDOPT_PARAM_STATS_INIT;
    CHECK(shardopt_param_get_stats(s[1].h, &ps));
    CHECK(shardopt_get_stats(rt, &st));
    const uint64_t sum = checksum(s, count_rep);
    if (st.rank == 0) {
        printf("c_trainer: %s's gradient norm %.6e, Newton-Schulz on rank %d\n", model[1].name,
               ps.grad_norm, ps.ns_owner_rank);
        printf("c_trainer: %d ranks (dp_replicate %d, dense %d, ep %d): step %" PRIu64
               ", weights checksum %016" PRIx64 "\n",
               st.world, st.dp_replicate, st.dense_size, st.ep_size, st.steps, sum);
    }
    CHECK(shardopt_finalize(rt));
    shards_free(s);
    MPI_Finalize();
    /* the result lines reach stdout's file only at the flush: a full disk (/dev/full) or a closed
     * stdout lost them, and exit 0 said they were written */
    errno = 0;
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr,
                "c_trainer: writing standard output failed (%s): the output is lost or cut\n",
                errno != 0 ? strerror(errno) : "an earlier write to it failed");
        return 1;
    }
    return 0;
}

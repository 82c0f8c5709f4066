/* step_bench: steady-state optimizer step time on a model preset, under mpirun with any layout.
 *
 *   mpirun -n N shardopt-bench [options]      (--help lists them with their defaults)
 *
 * Dense tensors are sharded along dim 0 over the dense shard group (FSDP-style chunks), expert
 * stacks split over EP and chunked along --expert-shard-dim over the expert shard group.
 * Reports the median over steps of the step time's maximum over ranks, the phase breakdown
 * (same statistic), optimizer state bytes per rank, bytes per group per step, and the
 * Newton-Schulz rate against an OpenBLAS sgemm measured on rank 0 in the same run, and with
 * offload the host <-> device bytes counted at the copy op (both = none and optimizer, all = the
 * three modes, each with every momentum dtype asked for, side by side in one run); for
 * offload = optimizer the same bytes copied alone, and on CUDA the share of them the step hid
 * behind its kernels. Defaults
 * scale GLM-4.5-Air down (2 MoE layers, width / 8, experts / 4) so that it runs on a laptop. */
#include <cblas.h>
#include <math.h>
#include <mpi.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_util.h"
#include "bench/preset.h"
#include "bench/preset_shards.h"
#include "kernels/device.h"
#include "kernels/ops.h"
#include "shardopt.h"
#include "tools/cli.h"

static const char usage[] =
    "usage: mpirun -n N shardopt-bench [options]\n"
    "  --preset NAME        model preset in bench/presets (glm45-air)\n"
    "  --layers L           layers of the preset kept, 0: all of them (2)\n"
    "  --width-div D        hidden and expert widths divided by D (8)\n"
    "  --experts-div D      experts per layer divided by D (4)\n"
    "  --dp-replicate R     replicas (1)\n"
    "  --dp-shard S         dense shard group size (the ranks left after R and C)\n"
    "  --cp C               context-parallel ranks (1)\n"
    "  --ep E               expert-parallel ranks (1)\n"
    "  --expert-shard-dim 0|1|2\n"
    "                       dim of an expert stack chunked over the expert shard group (0)\n"
    "  --momentum-dtype fp32|bf16|both\n"
    "                       Muon momentum dtype; both: one row each (both)\n"
    "  --comm-dtype bf16|fp32\n"
    "                       dtype of the Newton-Schulz exchanges (bf16)\n"
    "  --offload none|optimizer|cpu|both|all\n"
    "                       both: none and optimizer; all: the three, side by side (none)\n"
    "  --ns-compute auto|fp32|bf16\n"
    "                       Newton-Schulz arithmetic on the CPU (auto)\n"
    "  --backend cpu|cuda   kernel backend (cpu)\n"
    "  --comm-backend mpi|nccl\n"
    "                       exchanges over MPI or NCCL (mpi)\n"
    "  --threads T          BLAS and kernel threads per rank; 0: the library's default (0)\n"
    "  --bucket-mib M       exchange bucket size in MiB (128)\n"
    "  --warmup W           steps run before the timed ones (2)\n"
    "  --steps N            timed steps (10)\n"
    "  --set KEY=VALUE      any config key (docs/config.md), after the options above; up to 16\n"
    "  --json               one JSON object instead of the table\n"
    "  --help, -h           this text\n";

struct opts {
    const char *preset;
    struct preset_scale scale;
    int rep, shard, cp, ep, xdim, threads, warmup, steps, json;
    const char *mom, *comm, *offload, *backend, *comm_backend, *ns_compute;
    double bucket_mib;
    int nset;
    const char *set[16]; /* --set key=value: any config key, applied after the options above */
};

static int me, world;
static const char *const offload_modes[3] = {"none", "optimizer", "cpu"};
static int ns_compute_used; /* the runtime's resolution of --ns-compute (stats) */
/* dp_replicate, dp_shard, cp, ep as init resolved them (dp_shard -1 is the rest of the ranks;
 * --set may change any of them): what the header and the JSON report */
static int layout_used[4];

/* The integer options' ranges (init checks the layout, cli_mem_check the preset's memory). */
static const struct cli_int_spec int_opts[] = {
    {"--layers", 0, 1 << 16, offsetof(struct opts, scale.layers)}, /* 0: all the preset has */
    {"--width-div", 1, 1 << 16, offsetof(struct opts, scale.width_div)},
    {"--experts-div", 1, 1 << 16, offsetof(struct opts, scale.experts_div)},
    {"--dp-replicate", 1, 1 << 20, offsetof(struct opts, rep)},
    {"--dp-shard", -1, 1 << 20, offsetof(struct opts, shard)},
    {"--cp", 1, 1 << 20, offsetof(struct opts, cp)},
    {"--ep", 1, 1 << 20, offsetof(struct opts, ep)},
    {"--expert-shard-dim", 0, 2, offsetof(struct opts, xdim)},
    {"--threads", 0, 1024, offsetof(struct opts, threads)},
    {"--warmup", 0, 1000000, offsetof(struct opts, warmup)},
    {"--steps", 1, 1000000, offsetof(struct opts, steps)},
};

static void die(const char *what, shardopt_status_t st)
{
    fprintf(stderr, "step_bench: %s: %s (%s)\n", what, shardopt_status_string(st),
            shardopt_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/* The value of option a is one of names (NULL-terminated), or the run ends here. */
static void one_of(const char *a, const char *v, const char *const *names)
{
    char list[128] = "";
    for (int i = 0; names[i] != NULL; i++) {
        if (strcmp(v, names[i]) == 0)
            return;
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", names[i]);
    }
    cli_exit(me, "shardopt-bench", usage, 2, "%s takes one of %s, not '%s'", a, list, v);
}

static void opts_parse(int argc, char **argv, struct opts *o)
{
    *o = (struct opts){.preset = "glm45-air",
                       .scale = {2, 8, 4},
                       .rep = 1,
                       .shard = -1,
                       .cp = 1,
                       .ep = 1,
                       .xdim = 0,
                       .threads = 0,
                       .warmup = 2,
                       .steps = 10,
                       .mom = "both",
                       .comm = "bf16",
                       .offload = "none",
                       .backend = "cpu",
                       .comm_backend = "mpi",
                       .ns_compute = "auto",
                       .bucket_mib = 128};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        const struct cli_int_spec *io =
            cli_int_spec_find(int_opts, sizeof int_opts / sizeof int_opts[0], a);
        int *iv = io != NULL ? (int *)((char *)o + io->off) : NULL;
        const char **sv = !strcmp(a, "--preset")           ? &o->preset
                          : !strcmp(a, "--momentum-dtype") ? &o->mom
                          : !strcmp(a, "--comm-dtype")     ? &o->comm
                          : !strcmp(a, "--offload")        ? &o->offload
                          : !strcmp(a, "--backend")        ? &o->backend
                          : !strcmp(a, "--comm-backend")   ? &o->comm_backend
                          : !strcmp(a, "--ns-compute")     ? &o->ns_compute
                                                           : NULL;
        const int set = !strcmp(a, "--set"), bucket = !strcmp(a, "--bucket-mib");
        if (cli_is_help(a))
            cli_exit(me, "shardopt-bench", usage, 0, NULL);
        else if (!strcmp(a, "--json"))
            o->json = 1;
        else if (iv == NULL && sv == NULL && !set && !bucket)
            cli_exit(me, "shardopt-bench", usage, 2, "unknown argument '%s'", a);
        else if (v == NULL)
            cli_exit(me, "shardopt-bench", usage, 2, "%s needs a value", a);
        else if (iv != NULL)
            cli_int_opt(me, "shardopt-bench", usage, a, v, io->lo, io->hi, iv);
        else if (bucket && (cli_parse_double_in(v, 1.0 / 1024, 1 << 20, &o->bucket_mib) != 0))
            cli_exit(me, "shardopt-bench", usage, 2,
                     "%s takes a number in 1/1024..1048576 (MiB), not '%s'", a, v);
        else if (set && (strchr(v, '=') == NULL || o->nset == 16))
            cli_exit(me, "shardopt-bench", usage, 2,
                     o->nset == 16 ? "%s: at most 16 of them ('%s' is the 17th)"
                                   : "%s takes KEY=VALUE, not '%s'",
                     a, v);
        else if (set)
            o->set[o->nset++] = v;
        else if (sv != NULL)
            *sv = v;
        i += iv != NULL || sv != NULL || set || bucket;
    }
    static const char *const offloads[] = {"none", "optimizer", "cpu", "both", "all", NULL};
    static const char *const moms[] = {"fp32", "bf16", "both", NULL};
    static const char *const comms[] = {"bf16", "fp32", NULL};
    static const char *const computes[] = {"auto", "fp32", "bf16", NULL};
    static const char *const backends[] = {"cpu", "cuda", NULL};
    static const char *const comm_backends[] = {"mpi", "nccl", NULL};
    one_of("--offload", o->offload, offloads);
    one_of("--momentum-dtype", o->mom, moms);
    one_of("--comm-dtype", o->comm, comms);
    one_of("--ns-compute", o->ns_compute, computes);
    one_of("--backend", o->backend, backends);
    one_of("--comm-backend", o->comm_backend, comm_backends);
}

/* sgemm C[m x n] = A[m x m] B[m x n] at m = 1024, n = 4096 on this rank: the machine's limit
 * for the Newton-Schulz products, measured in the same run. */
static double sgemm_rate(int threads)
{
    const int m = 1024, n = 4096;
    float *A = calloc((size_t)m * m, 4), *B = calloc((size_t)m * n, 4),
          *C = calloc((size_t)m * n, 4);
    double best = 0;
    for (size_t i = 0; i < (size_t)m * m; i++)
        A[i] = (float)(i % 7) * 0.1f;
    for (size_t i = 0; i < (size_t)m * n; i++)
        B[i] = (float)(i % 5) * 0.1f;
    if (threads > 0)
        openblas_set_num_threads(threads);
    double t[5];
    for (int r = 0; r < 5; r++) {
        double t0 = MPI_Wtime();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, m, 1, A, m, B, n, 0, C, n);
        t[r] = MPI_Wtime() - t0;
    }
    best = 2.0 * m * m * n / bench_median(t, 5) / 1e9;
    free(A);
    free(B);
    free(C);
    return best;
}

/* One chunk of a probe's copies in one direction (lane 0: the plain copy op). */
static void probe_copy(const struct device_ops *ops, const struct kernel_ctx *ctx, int lane,
                       void *dst, const void *src, uint64_t total, uint64_t done, size_t chunk)
{
    if (done >= total)
        return;
    const size_t b = total - done < chunk ? (size_t)(total - done) : chunk;
    if (lane != 0)
        ops->copy_on(ctx, lane, dst, src, b);
    else
        ops->copy(ctx, dst, src, b);
}

/* The host <-> device copies of a step alone: h2d and d2h bytes through pinned host buffers and
 * the backend's copy lanes (both directions at once on CUDA; one after the other on the CPU,
 * whose copies are memcpy), in chunks of at most 64 MiB. Seconds, median of 3, max over
 * ranks (every rank copies at once, as in the step). With the step times of offload none and
 * optimizer this says how much of the copying the pipeline hides behind the kernels. */
static double copies_alone_seconds(const struct opts *o, uint64_t h2d, uint64_t d2h)
{
    const int cuda = strcmp(o->backend, "cuda") == 0;
    const struct device_ops *ops = cuda ? device_ops_cuda() : device_ops_cpu();
    struct kernel_ctx ctx = {0, NULL, NULL};
    double t[3], worst;
    uint64_t most = h2d > d2h ? h2d : d2h;
    const size_t chunk = most < (64u << 20) ? (size_t)most : (size_t)64 << 20;

    if (ops == NULL || chunk == 0)
        return 0;
    if (device_has(ops, DEVICE_CAP_BACKEND) &&
        ops->backend_create(-1, &ctx.stream, &ctx.backend) != SHARDOPT_OK) {
        fprintf(stderr, "step_bench: copy probe: %s\n", shardopt_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    const int lanes = device_has(ops, DEVICE_CAP_COPY_LANES);
    const int pinned = device_has(ops, DEVICE_CAP_HOST_PINNED);
    void *(*halloc)(size_t) = pinned ? ops->host_alloc : ops->alloc;
    void (*hfree)(void *) = pinned ? ops->host_free : ops->free;
    void *hin = halloc(chunk), *hout = halloc(chunk), *din = ops->alloc(chunk),
         *dout = ops->alloc(chunk);
    if (hin == NULL || hout == NULL || din == NULL || dout == NULL) {
        fprintf(stderr, "step_bench: copy probe: out of memory for 4 x %zu bytes\n", chunk);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    memset(hin, 1, chunk);
    ops->fill(&ctx, dout, 2, chunk);
    ops->sync(&ctx);
    for (int r = 0; r < 3; r++) {
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = MPI_Wtime();
        for (uint64_t done = 0; done < most; done += chunk) {
            probe_copy(ops, &ctx, lanes ? 1 : 0, din, hin, h2d, done, chunk);
            probe_copy(ops, &ctx, lanes ? 2 : 0, hout, dout, d2h, done, chunk);
        }
        if (lanes) { /* the compute stream joins both lanes, then the host waits for it */
            ops->lane_record(&ctx, 1, 0);
            ops->lane_record(&ctx, 2, 0);
            ops->lane_wait(&ctx, 0, 1, 0);
            ops->lane_wait(&ctx, 0, 2, 0);
        }
        if (ops->sync(&ctx) != 0) {
            fprintf(stderr, "step_bench: copy probe: the copies failed\n");
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        t[r] = MPI_Wtime() - t0;
    }
    worst = bench_median(t, 3);
    MPI_Allreduce(MPI_IN_PLACE, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    hfree(hin);
    hfree(hout);
    ops->free(din);
    ops->free(dout);
    if (ctx.backend != NULL)
        ops->backend_destroy(ctx.backend);
    return worst;
}

/* The share of the copies hidden: 1 when offload = optimizer takes max(none, copies alone), 0
 * when it takes their sum; NaN without a none row of the same momentum dtype. */
static double overlap_of(double none, double copies, double offloaded)
{
    const double shorter = none < copies ? none : copies;
    if (!(none > 0) || !(copies > 0))
        return NAN;
    const double f = (none + copies - offloaded) / shorter;
    return f < 0 ? 0 : f > 1 ? 1 : f;
}

struct result {
    const char *mom, *offload;
    double step, prepass, adamw, momentum, ex1, ns, ex2, apply; /* median over steps of max */
    double ns_gflops;                                           /* min over ranks */
    uint64_t state_mom, state_m, state_v, bytes_dense, bytes_expert, ws;
    uint64_t bytes_ns_allreduce; /* the busiest rank's sharded/team Gram all-reduces */
    int64_t params_local_max;
    uint64_t h2d, d2h, peak, slot; /* host <-> device bytes per step, staging: max over ranks */
    double copy_s;                 /* median over steps of the max over ranks */
    double copies_alone_s;         /* offload = optimizer: copies_alone_seconds, else 0 */
    /* Newton-Schulz balance over the ranks (examples/launch/scaling_test.sh sets it beside
     * shardopt-plan's prediction): the FLOPs each rank counted in the last timed step, max and
     * mean; its seconds, max over mean, median over the timed steps */
    double ns_flops_max, ns_flops_mean, ns_time_max_over_mean;
};

static void run_one(const struct opts *o, const struct preset *p, const char *mom,
                    const char *offload, struct result *r)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_runtime_t rt;
    shardopt_status_t st;
    shardopt_stats_t s = SHARDOPT_STATS_INIT;
    struct preset_shards ps;

    cfg.dp_replicate = o->rep;
    cfg.dp_shard = o->shard;
    cfg.cp = o->cp;
    cfg.ep = o->ep;
    cfg.num_threads = o->threads;
    cfg.momentum_dtype = !strcmp(mom, "bf16") ? SHARDOPT_DTYPE_BF16 : SHARDOPT_DTYPE_FP32;
    cfg.comm_dtype = !strcmp(o->comm, "fp32") ? SHARDOPT_DTYPE_FP32 : SHARDOPT_DTYPE_BF16;
    cfg.bucket_bytes = (uint64_t)(o->bucket_mib * 1048576.0);
    cfg.backend = !strcmp(o->backend, "cuda") ? SHARDOPT_BACKEND_CUDA : SHARDOPT_BACKEND_CPU;
    cfg.comm_backend = !strcmp(o->comm_backend, "nccl") ? SHARDOPT_COMM_NCCL : SHARDOPT_COMM_MPI;
    cfg.ns_compute = !strcmp(o->ns_compute, "fp32")   ? SHARDOPT_NS_COMPUTE_FP32
                     : !strcmp(o->ns_compute, "bf16") ? SHARDOPT_NS_COMPUTE_BF16
                                                      : SHARDOPT_NS_COMPUTE_AUTO;
    cfg.offload = !strcmp(offload, "optimizer") ? SHARDOPT_OFFLOAD_OPTIMIZER
                  : !strcmp(offload, "cpu")     ? SHARDOPT_OFFLOAD_CPU
                                                : SHARDOPT_OFFLOAD_NONE;
    for (int i = 0; i < o->nset; i++) {
        char key[64];
        const char *eq = strchr(o->set[i], '=');
        snprintf(key, sizeof key, "%.*s", (int)(eq - o->set[i]), o->set[i]);
        /* the same argv on every rank, so the same refusal: a clean exit, not MPI_Abort */
        if ((st = shardopt_config_set(&cfg, key, eq + 1)) != SHARDOPT_OK)
            cli_exit(me, "shardopt-bench", usage, 2, "--set %s: %s", o->set[i],
                     shardopt_last_error());
    }
    if ((st = shardopt_init(MPI_COMM_WORLD, &cfg, &rt)) != SHARDOPT_OK) {
        /* init agrees its outcome on every rank (a layout the options ask for that the ranks
         * cannot make): every rank ends here */
        if (me == 0)
            fprintf(stderr, "shardopt-bench: init: %s (%s)\n", shardopt_status_string(st),
                    shardopt_last_error());
        MPI_Finalize();
        exit(1);
    }
    shardopt_get_stats(rt, &s); /* init leaves cp as given: the dense group is dp_shard x cp */
    layout_used[0] = s.dp_replicate;
    layout_used[1] = s.dense_size / cfg.cp;
    layout_used[2] = cfg.cp;
    layout_used[3] = s.ep_size;
    /* device memory for the shards, but offload = cpu works on host parameters */
    const struct device_ops *dev =
        cfg.backend == SHARDOPT_BACKEND_CUDA && cfg.offload != SHARDOPT_OFFLOAD_CPU
            ? device_ops_cuda()
            : NULL;
    if ((st = preset_shards_register(rt, p, o->xdim, 12345 + (uint64_t)me, dev, &ps)) !=
        SHARDOPT_OK)
        die("register", st);

    const int total = o->warmup + o->steps;
    double *step = malloc(sizeof(double) * 9 * (size_t)o->steps), t_start = MPI_Wtime();
    double nsrate = 1e30, *ns_ratio = malloc(sizeof(double) * (size_t)(o->steps + 1));
    int nranks = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    for (int i = 0; i < total; i++) {
        shardopt_step_args_t a = SHARDOPT_STEP_ARGS_INIT;
        a.lr = 1e-4; /* small: the weights stay well scaled over many steps */
        MPI_Barrier(MPI_COMM_WORLD);
        if ((st = shardopt_step(rt, &a)) != SHARDOPT_OK)
            die("step", st);
        shardopt_get_stats(rt, &s);
        double ph[9] = {
            s.seconds_last,           s.seconds_prepass_last,   s.seconds_adamw_last,
            s.seconds_momentum_last,  s.seconds_exchange1_last, s.seconds_ns_last,
            s.seconds_exchange2_last, s.seconds_apply_last,     s.seconds_copy_exposed_last};
        MPI_Allreduce(MPI_IN_PLACE, ph, 9, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (i >= o->warmup) {
            memcpy(&step[9 * (i - o->warmup)], ph, sizeof ph);
            double rate = s.seconds_ns_last > 0 ? s.ns_flops_last / s.seconds_ns_last / 1e9 : 0;
            nsrate = rate > 0 && rate < nsrate ? rate : nsrate;
            double ns[2] = {s.ns_flops_last, s.seconds_ns_last}, mx[2], sum[2];
            MPI_Allreduce(ns, mx, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            MPI_Allreduce(ns, sum, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
            r->ns_flops_max = mx[0];
            r->ns_flops_mean = sum[0] / nranks;
            ns_ratio[i - o->warmup] = sum[1] > 0 ? mx[1] / (sum[1] / nranks) : 0;
        }
        if (me == 0 && MPI_Wtime() - t_start > 5)
            fprintf(stderr,
                    "step_bench: offload %s, momentum %s: step %d/%d: %.3f s (max over ranks)\n",
                    offload, mom, i + 1, total, ph[0]);
    }
    double col[64];
    double *out[9] = {&r->step, &r->prepass, &r->adamw, &r->momentum, &r->ex1,
                      &r->ns,   &r->ex2,     &r->apply, &r->copy_s};
    for (int c = 0; c < 9; c++) {
        for (int i = 0; i < o->steps && i < 64; i++)
            col[i] = step[9 * i + c];
        *out[c] = bench_median(col, o->steps < 64 ? o->steps : 64);
    }
    r->ns_time_max_over_mean = bench_median(ns_ratio, o->steps < 64 ? o->steps : 64);
    free(ns_ratio);
    MPI_Allreduce(MPI_IN_PLACE, &nsrate, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
    r->ns_gflops = nsrate < 1e29 ? nsrate : 0;
    uint64_t v[11] = {
        s.bytes_momentum,
        s.bytes_adam_m,
        s.bytes_adam_v,
        s.bytes_workspace,
        s.bytes_sent_dense + s.bytes_recv_dense,
        s.bytes_sent_expert + s.bytes_recv_expert,
        s.bytes_h2d_momentum + s.bytes_h2d_adam_m + s.bytes_h2d_adam_v + s.bytes_h2d_ns,
        s.bytes_d2h_momentum + s.bytes_d2h_adam_m + s.bytes_d2h_adam_v + s.bytes_d2h_ns,
        s.staging_peak_bytes_last,
        s.staging_slot_bytes,
        s.bytes_ns_allreduce_last};
    MPI_Allreduce(MPI_IN_PLACE, v, 11, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    r->bytes_ns_allreduce = v[10];
    r->h2d = v[6];
    r->d2h = v[7];
    r->peak = v[8];
    r->slot = v[9];
    r->offload = offload;
    r->state_mom = v[0];
    r->state_m = v[1];
    r->state_v = v[2];
    r->ws = v[3];
    r->bytes_dense = v[4];
    r->bytes_expert = v[5];
    MPI_Allreduce(&ps.local, &r->params_local_max, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
    r->mom = mom;
    ns_compute_used = s.ns_compute;
    shardopt_finalize(rt);
    preset_shards_free(&ps);
    free(step);
    /* after finalize: the probe's buffers do not compete with the runtime's for memory */
    r->copies_alone_s = cfg.offload == SHARDOPT_OFFLOAD_OPTIMIZER && r->h2d + r->d2h > 0
                            ? copies_alone_seconds(o, r->h2d, r->d2h)
                            : 0;
}

/* The step time of the offload = none row with momentum dtype mom; 0 when there is none. */
static double none_step(const struct result *res, int nres, const char *mom)
{
    for (int i = 0; i < nres; i++)
        if (strcmp(res[i].offload, "none") == 0 && strcmp(res[i].mom, mom) == 0)
            return res[i].step;
    return 0;
}

int main(int argc, char **argv)
{
    struct opts o;
    struct preset p;
    struct result res[6];
    double overlap[6]; /* copies hidden, offload = optimizer rows; NaN elsewhere */
    char err[256];
    int nres = 0;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    cli_stdout_at_exit("shardopt-bench");
    if (cli_argv_refused(argc, argv, "shardopt-bench", me == 0)) {
        MPI_Finalize();
        return 2;
    }
    opts_parse(argc, argv, &o);
    if (preset_load(o.preset, SHARDOPT_PRESET_DIR, &o.scale, &p, err, sizeof err) != 0)
        cli_exit(me, "shardopt-bench", usage, 2, "%s", err);
    /* a rank's share of the parameters, gradients and optimizer state (fp32, momentum and two
     * AdamW moments at most): --layers and the dividers can ask for more than the machine has */
    cli_mem_check(me, "shardopt-bench", usage,
                  "the preset as scaled (--preset, --layers, --width-div, --experts-div)",
                  20.0 * (double)p.total / world);
    double gemm = me == 0 ? sgemm_rate(o.threads) : 0;
    MPI_Bcast(&gemm, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    for (int m = 0; m < 3; m++) {
        const int want = !strcmp(o.offload, offload_modes[m]) || !strcmp(o.offload, "all") ||
                         (!strcmp(o.offload, "both") && m < 2);
        if (want && (strcmp(o.mom, "fp32") == 0 || strcmp(o.mom, "both") == 0))
            run_one(&o, &p, "fp32", offload_modes[m], &res[nres++]);
        if (want && (strcmp(o.mom, "bf16") == 0 || strcmp(o.mom, "both") == 0))
            run_one(&o, &p, "bf16", offload_modes[m], &res[nres++]);
    }

    for (int i = 0; i < nres; i++)
        overlap[i] = NAN;
    if (me == 0) {
        printf("step_bench: preset %s (%d MoE + %d dense layers, width / %d, experts / %d): %d "
               "tensors, %.2f M parameters; %d ranks = dp_replicate %d x dp_shard %d x cp %d, "
               "ep %d, experts sharded along dim %d; backend %s%s; comm %s; Newton-Schulz %s "
               "(asked: %s); "
               "median of %d steps after %d warm-up, max over ranks; sgemm (rank 0, "
               "1024x1024x4096) %.1f GFLOP/s\n\n",
               p.name, p.moe_layers, p.dense_layers, o.scale.width_div, o.scale.experts_div, p.n,
               (double)p.total / 1e6, world, layout_used[0], layout_used[1], layout_used[2],
               layout_used[3], o.xdim, o.backend,
               strcmp(o.backend, "cuda") ? ""
               : strcmp(o.comm_backend, "nccl") == 0
                   ? " (exchanges over NCCL)"
                   : " (exchanges over MPI via pinned host memory)",
               o.comm, ns_compute_used == SHARDOPT_NS_COMPUTE_BF16 ? "bf16" : "fp32", o.ns_compute,
               o.steps, o.warmup, gemm);
        printf("| offload | momentum | step time (max over ranks) | optimizer state / rank | "
               "host↔device bytes / step (in + out) | copy time (exposed) | staging peak / 3 "
               "slots | copies alone | copies hidden |\n|---|---|---|---|---|---|---|---|---|\n");
        for (int i = 0; i < nres; i++) {
            char alone[32] = "-", hidden[32] = "-";
            if (res[i].copies_alone_s > 0) {
                snprintf(alone, sizeof alone, "%.3f s", res[i].copies_alone_s);
                /* the CPU's copies are memcpy between kernels: nothing to hide, and the
                 * difference of step times would be noise */
                if (strcmp(o.backend, "cuda") == 0)
                    overlap[i] = overlap_of(none_step(res, nres, res[i].mom), res[i].copies_alone_s,
                                            res[i].step);
                if (overlap[i] == overlap[i])
                    snprintf(hidden, sizeof hidden, "%.0f%%", 100 * overlap[i]);
            }
            printf("| %s | %s | %.3f s | %.2f MiB | %.2f + %.2f MiB | %.3f s | %.2f / %.2f MiB | "
                   "%s | %s |\n",
                   res[i].offload, res[i].mom, res[i].step,
                   (res[i].state_mom + res[i].state_m + res[i].state_v) / 1048576.0,
                   res[i].h2d / 1048576.0, res[i].d2h / 1048576.0, res[i].copy_s,
                   res[i].peak / 1048576.0, 3 * res[i].slot / 1048576.0, alone, hidden);
        }
        printf("\ncopies alone: the step's host↔device bytes copied without kernels (both "
               "directions at once on a device's copy streams); copies hidden: (none + copies "
               "alone - optimizer) / the shorter of none and copies alone, 100%% when the copies "
               "overlap the kernels fully (backend cuda only: the CPU's copies are "
               "synchronous)\n");
        printf("\n| offload | momentum | pre-pass | AdamW | momentum | exchange #1 | NS | exchange "
               "#2 | "
               "apply | NS GFLOP/s (min rank) | NS / sgemm | dense bytes/step | expert "
               "bytes/step |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
        for (int i = 0; i < nres; i++)
            printf("| %s | %s | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.1f | %.2f | "
                   "%.1f MiB "
                   "| %.1f MiB |\n",
                   res[i].offload, res[i].mom, res[i].prepass, res[i].adamw, res[i].momentum,
                   res[i].ex1, res[i].ns, res[i].ex2, res[i].apply, res[i].ns_gflops,
                   gemm > 0 ? res[i].ns_gflops / gemm : 0, res[i].bytes_dense / 1048576.0,
                   res[i].bytes_expert / 1048576.0);
        if (strcmp(o.backend, "cuda") == 0)
            printf("\nbackend cuda: the phase columns are device times, intervals between CUDA "
                   "events on the runtime's stream (its waits on the exchange and copy streams "
                   "included); copy time (exposed): that stream's waits on the copy streams\n");
        if (o.json) {
            printf("\n{\"preset\": \"%s\", \"params\": %lld, \"ranks\": %d, \"dp_replicate\": %d, "
                   "\"dp_shard\": %d, \"cp\": %d, \"ep\": %d, \"expert_shard_dim\": %d, "
                   "\"ns_compute\": \"%s\", \"sgemm_gflops\": %.2f, \"results\": [",
                   p.name, (long long)p.total, world, layout_used[0], layout_used[1],
                   layout_used[2], layout_used[3], o.xdim,
                   ns_compute_used == SHARDOPT_NS_COMPUTE_BF16 ? "bf16" : "fp32", gemm);
            for (int i = 0; i < nres; i++)
                printf(
                    "%s{\"offload\": \"%s\", \"momentum\": \"%s\", \"step_s\": %.6f, "
                    "\"prepass_s\": %.6f, \"adamw_s\": %.6f, \"momentum_s\": %.6f, "
                    "\"exchange1_s\": %.6f, \"ns_s\": %.6f, \"exchange2_s\": %.6f, "
                    "\"apply_s\": %.6f, \"ns_gflops_min_rank\": %.3f, \"ns_ratio_vs_sgemm\": "
                    "%.4f, \"state_bytes_per_rank\": %llu, \"momentum_bytes\": %llu, "
                    "\"adam_bytes\": %llu, \"workspace_bytes\": %llu, \"dense_bytes_per_step\": "
                    "%llu, \"expert_bytes_per_step\": %llu, \"ns_allreduce_bytes_per_step\": %llu, "
                    "\"h2d_bytes_per_step\": %llu, "
                    "\"d2h_bytes_per_step\": %llu, \"copy_exposed_s\": %.6f, "
                    "\"staging_peak_bytes\": %llu, \"copies_alone_s\": %.6f, "
                    "\"copies_hidden\": %.4f, \"ns_flops_max\": %.17g, \"ns_flops_mean\": "
                    "%.17g, \"ns_time_max_over_mean\": %.4f}",
                    i ? ", " : "", res[i].offload, res[i].mom, res[i].step, res[i].prepass,
                    res[i].adamw, res[i].momentum, res[i].ex1, res[i].ns, res[i].ex2, res[i].apply,
                    res[i].ns_gflops, gemm > 0 ? res[i].ns_gflops / gemm : 0,
                    (unsigned long long)(res[i].state_mom + res[i].state_m + res[i].state_v),
                    (unsigned long long)res[i].state_mom,
                    (unsigned long long)(res[i].state_m + res[i].state_v),
                    (unsigned long long)res[i].ws, (unsigned long long)res[i].bytes_dense,
                    (unsigned long long)res[i].bytes_expert,
                    (unsigned long long)res[i].bytes_ns_allreduce, (unsigned long long)res[i].h2d,
                    (unsigned long long)res[i].d2h, res[i].copy_s, (unsigned long long)res[i].peak,
                    res[i].copies_alone_s, overlap[i] == overlap[i] ? overlap[i] : -1.0,
                    res[i].ns_flops_max, res[i].ns_flops_mean, res[i].ns_time_max_over_mean);
            printf("]}\n");
        }
    }
    preset_free(&p);
    MPI_Finalize();
    return 0;
}

/* ns_bench: Newton-Schulz (5 quintic steps) with the plain and the symmetric variant, against the
 * machine's limit measured in the same process: an OpenBLAS sgemm (--compute fp32, the default)
 * or a oneDNN bf16 matmul with fp32 accumulation (--compute bf16). Beside them, in the same run
 * (issue 23): Gram Newton-Schulz with quintic's 5 steps ("gram"), and AOL with the aol table's 4
 * steps, standard ("sym+aol") and Gram ("gram+aol"), on the products of the committed variant
 * table, each with its FLOP count (ns_flops_total) and the ratio that count allows against the
 * table's standard variant (today's choice) beside its measured one.
 *
 *   ns_bench [--json] [--threads N] [--reps R] [--compute fp32|bf16] [--torch]
 *            [--algorithm standard|gram|all] [--precondition frobenius|aol|all] [--shape MxN]...
 *
 * --algorithm and --precondition choose which of those columns run (default all of them); the
 * plain and symmetric standard ones always do, as the baseline.
 *   ns_bench --backend cuda [--json] [--reps R] [--algorithm ...] [--precondition ...]
 *            [--shape [Bx]MxN]...
 *
 * --backend cuda times the CUDA backend against a cuBLAS bf16 GEMM (ns_bench_cuda.cu); its
 * default shapes are issue 7's: 4096^2, 1408x4096, 32 x 1408x4096 (batched), 12288x4096. There
 * Gram and AOL columns run only when --algorithm or --precondition is given.
 *
 * --shape replaces the default shapes (issue 2's list); a tall MxN is run as its m <= n working
 * shape. --threads sets the OpenBLAS/OpenMP threads (default: the library's own choice).
 * --torch also times the same Newton-Schulz written in PyTorch in bf16 (bench/ns_torch.py, the
 * torch.optim.Muon / dion formulation) on the same shape and threads, in this run, when python3
 * can import torch.
 *
 * The limit is the largest product of an iteration, C[m x n] = A[m x m] * B[m x n] (2m^2n FLOPs).
 * Both variants are rated on 4m^2n + 2m^3 FLOPs per iteration (ns_flops_per_iter), so the
 * symmetric rate is an effective one: it is the rate the plain path would need to match it. The
 * three are timed interleaved, rep by rep, so that a burst of load on a shared machine hits all
 * of them alike; each reported time is the median over reps. The table and the JSON:
 * ns_bench_report.c. */
#include "bench/ns_bench.h"

#include <cblas.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <oneapi/dnnl/dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_util.h"
#include "bench/ns_bench_cuda.h"
#include "kernels/blas_threads.h"
#include "kernels/clock.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/ns_bf16.h"
#include "kernels/cpu/ns_common.h"
#include "kernels/ns_coeffs.h"
#include "kernels/ns_variant.h"
#include "kernels/ops.h"
#include "tools/cli_num.h"

#define BENCH_MAX_REPS 1000
/* A timed sample repeats a call until it lasts this long, so short calls are not clock noise. */
#define BENCH_MIN_SAMPLE_S 0.05

/* The bf16 limit: C = A B in bf16 with fp32 accumulation, one oneDNN matmul made once. */
struct bench_dnnl {
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    dnnl_primitive_t p;
    dnnl_memory_t a, b, c, s;
    void *scratch;
    char impl[64];
};

/* One matrix and everything the three timed calls touch. */
struct bench_case {
    int64_t m, n;
    float *in, *out_plain, *out_sym, *out_var;
    struct ns_workspace ws;
    float *ga, *gb, *gc; /* sgemm operands (bf16 limit: the same buffers, read as bf16) */
    float coeffs[BENCH_STEPS][3];
    float coeffs_aol[BENCH_AOL_STEPS][3];
    int variant; /* of the table, for issue 23's variants */
    int bf16, block;
    struct bench_dnnl mm;
};

static const int64_t bench_default_shapes[][2] = {
    {512, 512}, {1024, 1024}, {2048, 2048}, {1024, 4096}, {1408, 4096},
};

static int bench_usage(const char *msg)
{
    fprintf(stderr,
            "ns_bench: %s\nusage: ns_bench [--json] [--threads N] [--reps R] [--compute fp32|bf16] "
            "[--torch] [--algorithm standard|gram|all] [--precondition frobenius|aol|all] "
            "[--shape MxN]...\n       ns_bench --backend cuda [--json] [--reps R] "
            "[--shape [Bx]MxN]...\n",
            msg);
    return -1;
}

/* Option arg's value val refused: one line naming both and what it accepts (val NULL: it had
 * none). */
static int bench_bad(const char *arg, const char *val, const char *accepted)
{
    char msg[512];
    if (val == NULL)
        snprintf(msg, sizeof msg, "%s needs a value: %s", arg, accepted);
    else
        snprintf(msg, sizeof msg, "%s takes %s, not '%s'", arg, accepted, val);
    return bench_usage(msg);
}

/* MxN, or BxMxN (a batch of B, --backend cuda): each the whole of a decimal integer (sscanf's
 * %d took " 12", "+12" and wrapped past INT_MAX), and the buffers of one shape within memory. */
static int bench_parse_shape(const char *s, int64_t shape[2], int64_t *batch)
{
    long long v[3];
    char part[24];
    int n = 0;
    for (const char *p = s;; n++) {
        const char *x = strchr(p, 'x');
        const size_t k = x != NULL ? (size_t)(x - p) : strlen(p);
        if (n == 3 || k == 0 || k >= sizeof part)
            return -1;
        memcpy(part, p, k);
        part[k] = '\0';
        if (cli_parse_ll_in(part, 1, 65536, &v[n]) != 0)
            return -1;
        if (x == NULL)
            break;
        p = x + 1;
    }
    if (n == 0 || (n == 2 && v[0] > 4096))
        return -1;
    *batch = n == 2 ? v[0] : 1;
    shape[0] = v[n - 1];
    shape[1] = v[n];
    /* the input, the output and the iteration's products, a few copies each */
    return cli_mem_fits(16.0 * 4.0 * (double)*batch * (double)shape[0] * (double)shape[1]) ? 0 : -1;
}

static int bench_opts_parse(int argc, char **argv, struct bench_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->reps = 5;
    o->algos = 3;
    o->preconds = 3;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(arg, "--json") == 0) {
            o->json = 1;
        } else if (strcmp(arg, "--torch") == 0) {
            o->torch = 1;
        } else if (strcmp(arg, "--compute") == 0) {
            if (val == NULL || (strcmp(val, "fp32") != 0 && strcmp(val, "bf16") != 0))
                return bench_bad(arg, val, "fp32 or bf16");
            o->bf16 = strcmp(val, "bf16") == 0;
            i++;
        } else if (strcmp(arg, "--threads") == 0) {
            if (val == NULL || cli_parse_int_in(val, 1, 1024, &o->threads) != 0)
                return bench_bad(arg, val, "an integer in 1..1024");
            i++;
        } else if (strcmp(arg, "--reps") == 0) {
            if (val == NULL || cli_parse_int_in(val, 1, BENCH_MAX_REPS, &o->reps) != 0)
                return bench_bad(arg, val, "an integer in 1..1000");
            i++;
        } else if (strcmp(arg, "--shape") == 0) {
            if (o->nshapes == BENCH_MAX_SHAPES)
                return bench_bad(arg, val, "at most 32 shapes (this is the 33rd)");
            if (val == NULL ||
                bench_parse_shape(val, o->shape[o->nshapes], &o->batch[o->nshapes]) != 0)
                return bench_bad(arg, val,
                                 "MxN or BxMxN with 1 <= M, N <= 65536, B <= 4096, within memory");
            o->nshapes++;
            i++;
        } else if (strcmp(arg, "--algorithm") == 0) {
            if (val == NULL || (strcmp(val, "standard") != 0 && strcmp(val, "gram") != 0 &&
                                strcmp(val, "all") != 0))
                return bench_bad(arg, val, "standard, gram or all");
            o->algos = strcmp(val, "standard") == 0 ? 1 : strcmp(val, "gram") == 0 ? 2 : 3;
            o->extras_asked = 1;
            i++;
        } else if (strcmp(arg, "--precondition") == 0) {
            if (val == NULL || (strcmp(val, "frobenius") != 0 && strcmp(val, "aol") != 0 &&
                                strcmp(val, "all") != 0))
                return bench_bad(arg, val, "frobenius, aol or all");
            o->preconds = strcmp(val, "frobenius") == 0 ? 1 : strcmp(val, "aol") == 0 ? 2 : 3;
            o->extras_asked = 1;
            i++;
        } else if (strcmp(arg, "--backend") == 0) {
            if (val == NULL || (strcmp(val, "cpu") != 0 && strcmp(val, "cuda") != 0))
                return bench_bad(arg, val, "cpu or cuda");
            o->cuda = strcmp(val, "cuda") == 0;
            i++;
        } else {
            char msg[512];
            snprintf(msg, sizeof msg, "unknown argument '%s'", arg);
            return bench_usage(msg);
        }
    }
    for (int i = 0; i < o->nshapes; i++)
        if (!o->cuda && o->batch[i] != 1)
            return bench_usage("a batch (BxMxN) needs --backend cuda");
    if (o->nshapes == 0 && !o->cuda) {
        o->nshapes = (int)(sizeof(bench_default_shapes) / sizeof(bench_default_shapes[0]));
        memcpy(o->shape, bench_default_shapes, sizeof(bench_default_shapes));
    }
    return 0;
}

static void bench_fill_random(float *p, size_t count, uint64_t seed)
{
    uint64_t s = seed;
    for (size_t i = 0; i < count; i++) {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        p[i] =
            (float)((double)((s * 0x2545F4914F6CDD1Dull) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    }
}

static void bench_dnnl_free(struct bench_dnnl *d)
{
    if (d->p != NULL)
        dnnl_primitive_destroy(d->p);
    dnnl_memory_t *mems[4] = {&d->a, &d->b, &d->c, &d->s};
    for (int i = 0; i < 4; i++)
        if (*mems[i] != NULL)
            dnnl_memory_destroy(*mems[i]);
    if (d->stream != NULL)
        dnnl_stream_destroy(d->stream);
    if (d->engine != NULL)
        dnnl_engine_destroy(d->engine);
    free(d->scratch);
    memset(d, 0, sizeof *d);
}

/* C[m x n] = A[m x m] B[m x n], bf16 operands and result, plain row-major: what oneDNN itself
 * reaches on the largest product of an iteration. */
static int bench_dnnl_init(struct bench_dnnl *d, int64_t m, int64_t n, void *a, void *b, void *c)
{
    dnnl_memory_desc_t ma, mb, mc, ms;
    dnnl_matmul_desc_t md;
    dnnl_primitive_attr_t attr;
    dnnl_primitive_desc_t pd;
    const dnnl_dims_t da = {m, m}, db = {m, n}, dc = {m, n};
    const char *impl = "";

    memset(d, 0, sizeof *d);
    if (dnnl_engine_create(&d->engine, dnnl_cpu, 0) != dnnl_success ||
        dnnl_stream_create(&d->stream, d->engine, dnnl_stream_default_flags) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&ma, 2, da, dnnl_bf16, dnnl_ab) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&mb, 2, db, dnnl_bf16, dnnl_ab) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&mc, 2, dc, dnnl_bf16, dnnl_ab) != dnnl_success ||
        dnnl_matmul_desc_init(&md, &ma, &mb, NULL, &mc) != dnnl_success ||
        dnnl_primitive_attr_create(&attr) != dnnl_success)
        return -1;
    dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
    const int ok = dnnl_primitive_desc_create(&pd, &md, attr, d->engine, NULL) == dnnl_success;
    dnnl_primitive_attr_destroy(attr);
    if (!ok)
        return -1;
    ms = *dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
    snprintf(d->impl, sizeof d->impl, "%s", impl);
    d->scratch = malloc(dnnl_memory_desc_get_size(&ms) + 64);
    const int made = d->scratch != NULL && dnnl_primitive_create(&d->p, pd) == dnnl_success &&
                     dnnl_memory_create(&d->a, &ma, d->engine, a) == dnnl_success &&
                     dnnl_memory_create(&d->b, &mb, d->engine, b) == dnnl_success &&
                     dnnl_memory_create(&d->c, &mc, d->engine, c) == dnnl_success &&
                     dnnl_memory_create(&d->s, &ms, d->engine, d->scratch) == dnnl_success;
    dnnl_primitive_desc_destroy(pd);
    return made ? 0 : -1;
}

static void bench_dnnl_run(const struct bench_dnnl *d)
{
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, d->a},
                               {DNNL_ARG_WEIGHTS, d->b},
                               {DNNL_ARG_DST, d->c},
                               {DNNL_ARG_SCRATCHPAD, d->s}};
    dnnl_primitive_execute(d->p, d->stream, 4, args);
    dnnl_stream_wait(d->stream);
}

static void bench_case_free(struct bench_case *c)
{
    bench_dnnl_free(&c->mm);
    ns_bf16_destroy(c->ws.bf16);
    cpu_free(c->in);
    cpu_free(c->out_plain);
    cpu_free(c->out_sym);
    cpu_free(c->out_var);
    cpu_free(c->ws.buf);
    cpu_free(c->ga);
    cpu_free(c->gb);
    cpu_free(c->gc);
}

static int bench_case_init(struct bench_case *c, int64_t rows, int64_t cols, int bf16)
{
    memset(c, 0, sizeof(*c));
    c->m = rows < cols ? rows : cols;
    c->n = rows < cols ? cols : rows;
    const size_t mn = (size_t)(c->m * c->n), mm = (size_t)(c->m * c->m);

    c->ws.floats = ns_workspace_floats(rows, cols);
    c->in = cpu_alloc(mn * sizeof(float));
    c->out_plain = cpu_alloc(mn * sizeof(float));
    c->out_sym = cpu_alloc(mn * sizeof(float));
    c->out_var = cpu_alloc(mn * sizeof(float));
    c->ws.buf = cpu_alloc(c->ws.floats * sizeof(float));
    c->ga = cpu_alloc(mm * sizeof(float));
    c->gb = cpu_alloc(mn * sizeof(float));
    c->gc = cpu_alloc(mn * sizeof(float));
    if (!c->in || !c->out_plain || !c->out_sym || !c->out_var || !c->ws.buf || !c->ga || !c->gb ||
        !c->gc) {
        bench_case_free(c);
        return -1;
    }
    bench_fill_random(c->in, mn, 0x9e3779b97f4a7c15ull ^ (uint64_t)(rows * 65537 + cols));
    bench_fill_random(c->ga, mm, 11);
    bench_fill_random(c->gb, mn, 12);
    memset(c->gc, 0, mn * sizeof(float));
    if (ns_coeffs_fill(NS_TABLE_QUINTIC, BENCH_STEPS, NULL, c->coeffs) != 0 ||
        ns_coeffs_fill(NS_TABLE_AOL, BENCH_AOL_STEPS, NULL, c->coeffs_aol) != 0)
        return -1;
    c->bf16 = bf16;
    c->variant = ns_variant_for_shape(c->m, c->n);
    if (!bf16)
        return 0;
    /* bf16: the library's table gives the symmetric block; both variants prepared up front */
    c->variant = ns_bf16_variant_for_shape(c->m, c->n, &c->block);
    for (size_t i = 0; i < mm; i++) /* the limit's operands: bf16 views of ga, gb */
        ((uint16_t *)c->ga)[i] = bf16_from_f32(c->ga[i]);
    for (size_t i = 0; i < mn; i++)
        ((uint16_t *)c->gb)[i] = bf16_from_f32(c->gb[i]);
    if (ns_bf16_create(&c->ws.bf16) != SHARDOPT_OK ||
        ns_bf16_prepare(c->ws.bf16, c->m, c->n, NS_VARIANT_PLAIN, 0, NS_ALGO_STANDARD,
                        (const float(*)[3])c->coeffs, BENCH_STEPS) != SHARDOPT_OK ||
        ns_bf16_prepare(c->ws.bf16, c->m, c->n, NS_VARIANT_SYMMETRIC, c->block, NS_ALGO_STANDARD,
                        (const float(*)[3])c->coeffs, BENCH_STEPS) != SHARDOPT_OK ||
        ns_bf16_prepare(c->ws.bf16, c->m, c->n, c->variant, c->block, NS_ALGO_GRAM,
                        (const float(*)[3])c->coeffs, BENCH_STEPS) != SHARDOPT_OK ||
        ns_bf16_prepare(c->ws.bf16, c->m, c->n, c->variant, c->block, NS_ALGO_STANDARD,
                        (const float(*)[3])c->coeffs_aol, BENCH_AOL_STEPS) != SHARDOPT_OK ||
        ns_bf16_prepare(c->ws.bf16, c->m, c->n, c->variant, c->block, NS_ALGO_GRAM,
                        (const float(*)[3])c->coeffs_aol, BENCH_AOL_STEPS) != SHARDOPT_OK) {
        fprintf(stderr, "ns_bench: bf16 %" PRId64 "x%" PRId64 ": %s\n", c->m, c->n,
                shardopt_last_error());
        return -1;
    }
    if (bench_dnnl_init(&c->mm, c->m, c->n, c->ga, c->gb, c->gc) != 0) {
        fprintf(stderr,
                "ns_bench: bf16 %" PRId64 "x%" PRId64
                ": the reference oneDNN matmul could not be made\n",
                c->m, c->n);
        return -1;
    }
    return 0;
}

static int bench_run_ns(const struct bench_case *c, int which, float *out)
{
    const int aol = which == W_SYM_AOL || which == W_GRAM_AOL;
    const struct ns_args a = {
        .batch = 1,
        .rows = c->m,
        .cols = c->n,
        .transpose = 0,
        .in = c->in,
        .in_dtype = KDT_F32,
        .out = out,
        .out_dtype = KDT_F32,
        .coeffs = (const float(*)[3])(aol ? c->coeffs_aol : c->coeffs),
        .steps = aol ? BENCH_AOL_STEPS : BENCH_STEPS,
        .norm_scale = 1.0f,
        .eps = 1e-8f,
        .variant = which == W_PLAIN ? NS_VARIANT_PLAIN
                   : which == W_SYM ? NS_VARIANT_SYMMETRIC
                                    : c->variant,
        .compute = c->bf16 ? KDT_BF16 : KDT_F32,
        .block = c->block,
        .algorithm = which == W_GRAM || which == W_GRAM_AOL ? NS_ALGO_GRAM : NS_ALGO_STANDARD,
        .precondition = aol ? NS_PRECOND_AOL : NS_PRECOND_FROBENIUS,
    };
    const struct kernel_ctx ctx = {.threads = 0, .stream = NULL};
    return kernel_ops_cpu_best()->newton_schulz(&ctx, &a, &c->ws);
}

static void bench_run_sgemm(const struct bench_case *c)
{
    const int m = (int)c->m, n = (int)c->n;
    if (c->bf16) {
        bench_dnnl_run(&c->mm);
        return;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, m, 1.0f, c->ga, m, c->gb, n, 0.0f,
                c->gc, n);
}

static double bench_max_abs_diff(const float *a, const float *b, size_t count)
{
    double d = 0.0;
    for (size_t i = 0; i < count; i++) {
        const double e = fabs((double)a[i] - (double)b[i]);
        d = e > d || isnan(e) ? e : d;
    }
    return d;
}

/* One of W_*. Returns seconds per call over `calls` calls, or a negative value when the kernel
 * refused the arguments. */
static double bench_sample(struct bench_case *c, int which, int calls)
{
    const double t0 = monotonic_seconds();
    for (int i = 0; i < calls; i++) {
        if (which == W_LIMIT)
            bench_run_sgemm(c);
        else if (bench_run_ns(c, which,
                              which == W_PLAIN ? c->out_plain
                              : which == W_SYM ? c->out_sym
                                               : c->out_var) != 0)
            return -1.0;
    }
    return (monotonic_seconds() - t0) / calls;
}

/* The Gram result guard as the kernels run it after each Gram matrix: `calls` passes over an
 * m x n fp32 result x; seconds per call */
static double bench_guard(const struct bench_case *c, const float *x, int calls)
{
    const struct ns_args a = {
        .coeffs = (const float(*)[3])c->coeffs, .steps = BENCH_STEPS, .norm_scale = 1.0f};
    int ok = 0;
    const double t0 = monotonic_seconds();
    for (int i = 0; i < calls; i++)
        ok += ns_gram_guard_ok(x, KDT_F32, c->m, c->n, &a);
    const double t = (monotonic_seconds() - t0) / calls;
    return ok >= 0 ? t : -1.0; /* ok read, so the passes are not optimized away */
}

/* PyTorch's bf16 Newton-Schulz on the same shape and threads: bench/ns_torch.py prints the
 * median seconds per call. Returns 0 when python3 or torch is missing. */
static double bench_torch(int64_t m, int64_t n, int threads, int reps)
{
    char cmd[1024];
    double s = 0;
    snprintf(cmd, sizeof cmd,
             "python3 '%s/ns_torch.py' --m %" PRId64 " --n %" PRId64 " --threads %d --reps %d "
             "--min-sample %g",
             SHARDOPT_BENCH_DIR, m, n, threads, reps, BENCH_MIN_SAMPLE_S);
    FILE *p = popen(cmd, "r");
    if (p == NULL)
        return 0;
    if (fscanf(p, "%lf", &s) != 1)
        s = 0;
    pclose(p);
    return s;
}

/* Whether variant w runs under --algorithm / --precondition. */
int ns_bench_wants(const struct bench_opts *o, int w)
{
    if (w <= W_LIMIT)
        return 1;
    const int gram = w == W_GRAM || w == W_GRAM_AOL, aol = w == W_SYM_AOL || w == W_GRAM_AOL;
    return (o->algos & (gram ? 2 : 1)) && (o->preconds & (aol ? 2 : 1));
}

static int bench_shape(int64_t rows, int64_t cols, const struct bench_opts *o,
                       struct bench_result *r)
{
    static double samples[W_COUNT][BENCH_MAX_REPS];
    struct bench_case c;
    int calls[W_COUNT];
    const int reps = o->reps;

    memset(r, 0, sizeof *r);
    if (bench_case_init(&c, rows, cols, o->bf16) != 0)
        return -1;
    /* The warm-up call also sizes each sample to at least BENCH_MIN_SAMPLE_S; the extra
     * variants' outputs are compared with the symmetric one right after their warm-up. */
    for (int w = 0; w < W_COUNT; w++) {
        if (!ns_bench_wants(o, w))
            continue;
        const double t = bench_sample(&c, w, 1);
        if (t < 0.0) {
            bench_case_free(&c);
            return -1;
        }
        if (w > W_LIMIT)
            r->var_diff[w] = bench_max_abs_diff(c.out_var, c.out_sym, (size_t)(c.m * c.n));
        calls[w] = t >= BENCH_MIN_SAMPLE_S ? 1 : (int)ceil(BENCH_MIN_SAMPLE_S / fmax(t, 1e-6));
    }
    /* the guard, beside Gram, on Gram's result: fp32 for either compute (the bf16 path checks
     * the fp32 copy it makes of its result for the store anyway) */
    static double guard[BENCH_MAX_REPS];
    const int with_guard = ns_bench_wants(o, W_GRAM);
    int guard_calls = 1;
    if (with_guard) {
        const double t = bench_guard(&c, c.out_var, 1);
        guard_calls = t >= BENCH_MIN_SAMPLE_S ? 1 : (int)ceil(BENCH_MIN_SAMPLE_S / fmax(t, 1e-7));
    }
    for (int i = 0; i < reps; i++) {
        for (int w = 0; w < W_COUNT; w++)
            if (ns_bench_wants(o, w))
                samples[w][i] = bench_sample(&c, w, calls[w]);
        if (with_guard)
            guard[i] = bench_guard(&c, c.out_var, guard_calls);
    }
    r->guard_s = with_guard ? bench_median(guard, reps) : 0.0;
    for (int w = W_LIMIT + 1; w < W_COUNT; w++)
        r->var_s[w] = ns_bench_wants(o, w) ? bench_median(samples[w], reps) : 0.0;
    r->var_variant = c.variant;

    r->m = c.m;
    r->n = c.n;
    r->plain_s = bench_median(samples[0], reps);
    r->sym_s = bench_median(samples[1], reps);
    r->sgemm_s = bench_median(samples[2], reps);
    r->max_abs_diff = bench_max_abs_diff(c.out_plain, c.out_sym, (size_t)(c.m * c.n));
    r->block = c.block;
    bench_case_free(&c);
    r->torch_s = o->torch ? bench_torch(r->m, r->n, blas_threads_get(), reps) : 0;
    return 0;
}

int main(int argc, char **argv)
{
    struct bench_opts o;
    struct bench_result res[BENCH_MAX_SHAPES];

    cli_stdout_at_exit("ns_bench");
    if (cli_argv_refused(argc, argv, "ns_bench", 1))
        return 2;
    if (bench_opts_parse(argc, argv, &o) != 0)
        return 2;
    if (o.cuda) {
        int64_t shapes[BENCH_MAX_SHAPES][3];
        for (int i = 0; i < o.nshapes; i++) {
            shapes[i][0] = o.batch[i];
            shapes[i][1] = o.shape[i][0];
            shapes[i][2] = o.shape[i][1];
        }
        return ns_bench_cuda((const int64_t(*)[3])shapes, o.nshapes, o.reps, o.json,
                             o.extras_asked ? o.algos : 1, o.extras_asked ? o.preconds : 1);
    }
    blas_threads_set(o.threads);
    char why[256] = "";
    /* the CPU, not the benchmark: the bf16 limit is oneDNN's matmul rate, and where oneDNN has
     * none the library's bf16 products are its fp32 sgemm fallback (ns_bench --compute fp32) */
    if (o.bf16 && !ns_bf16_onednn(why, sizeof why)) {
        fprintf(stderr, "ns_bench: --compute bf16: no oneDNN bf16 matmul on this CPU (%s)\n", why);
        return 77;
    }
    for (int i = 0; i < o.nshapes; i++) {
        if (bench_shape(o.shape[i][0], o.shape[i][1], &o, &res[i]) != 0) {
            fprintf(stderr, "ns_bench: %" PRId64 "x%" PRId64 ": out of memory or kernel refused\n",
                    o.shape[i][0], o.shape[i][1]);
            return 1;
        }
        if (!o.json)
            fprintf(stderr, "  measured %" PRId64 "x%" PRId64 "\n", res[i].m, res[i].n);
    }
    if (o.json)
        ns_bench_report_json(&o, res);
    else
        ns_bench_report_table(&o, res);
    return 0;
}

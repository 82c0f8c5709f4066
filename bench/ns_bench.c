/* ns_bench: Newton-Schulz (5 quintic steps) with the plain and the symmetric variant, against an
 * OpenBLAS sgemm measured in the same process as the machine's limit.
 *
 *   ns_bench [--json] [--threads N] [--reps R] [--shape MxN]...
 *
 * --shape replaces the default shapes (issue 2's list); a tall MxN is run as its m <= n working
 * shape. --threads sets the OpenBLAS threads (default: OpenBLAS's own choice).
 *
 * The sgemm is the largest product of an iteration, C[m x n] = A[m x m] * B[m x n] (2m^2n FLOPs).
 * Both variants are rated on 4m^2n + 2m^3 FLOPs per iteration (ns_flops_per_iter), so the
 * symmetric rate is an effective one: it is the rate the plain path would need to match it. The
 * three are timed interleaved, rep by rep, so that a burst of load on a shared machine hits all
 * of them alike; each reported time is the median over reps. */
#include <cblas.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/blas_threads.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/ns_coeffs.h"
#include "kernels/ops.h"

#define BENCH_STEPS      5
#define BENCH_MAX_SHAPES 32
#define BENCH_MAX_REPS   1000
/* A timed sample repeats a call until it lasts this long, so short calls are not clock noise. */
#define BENCH_MIN_SAMPLE_S 0.05

struct bench_opts {
    int json;
    int threads;
    int reps;
    int nshapes;
    int64_t shape[BENCH_MAX_SHAPES][2];
};

struct bench_result {
    int64_t m, n;
    double plain_s, sym_s, sgemm_s; /* medians, seconds per call */
    double max_abs_diff;            /* between the two variants' outputs */
};

/* One matrix and everything the three timed calls touch. */
struct bench_case {
    int64_t m, n;
    float *in, *out_plain, *out_sym;
    struct ns_workspace ws;
    float *ga, *gb, *gc; /* sgemm operands */
    float coeffs[BENCH_STEPS][3];
};

static const int64_t bench_default_shapes[][2] = {
    {512, 512}, {1024, 1024}, {2048, 2048}, {1024, 4096}, {1408, 4096},
};

static double bench_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int bench_usage(const char *msg)
{
    fprintf(stderr,
            "ns_bench: %s\nusage: ns_bench [--json] [--threads N] [--reps R] [--shape MxN]...\n",
            msg);
    return -1;
}

static int bench_parse_int(const char *s, int lo, int hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi)
        return -1;
    *out = (int)v;
    return 0;
}

static int bench_parse_shape(const char *s, int64_t shape[2])
{
    int m, n;
    char tail;
    if (sscanf(s, "%dx%d%c", &m, &n, &tail) != 2 || m < 1 || n < 1 || m > 65536 || n > 65536)
        return -1;
    shape[0] = m;
    shape[1] = n;
    return 0;
}

static int bench_opts_parse(int argc, char **argv, struct bench_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->reps = 5;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(arg, "--json") == 0) {
            o->json = 1;
        } else if (strcmp(arg, "--threads") == 0) {
            if (val == NULL || bench_parse_int(val, 1, 1024, &o->threads) != 0)
                return bench_usage("--threads takes an integer in 1..1024");
            i++;
        } else if (strcmp(arg, "--reps") == 0) {
            if (val == NULL || bench_parse_int(val, 1, BENCH_MAX_REPS, &o->reps) != 0)
                return bench_usage("--reps takes an integer in 1..1000");
            i++;
        } else if (strcmp(arg, "--shape") == 0) {
            if (o->nshapes == BENCH_MAX_SHAPES)
                return bench_usage("too many --shape");
            if (val == NULL || bench_parse_shape(val, o->shape[o->nshapes]) != 0)
                return bench_usage("--shape takes MxN with 1 <= M, N <= 65536");
            o->nshapes++;
            i++;
        } else {
            return bench_usage("unknown argument");
        }
    }
    if (o->nshapes == 0) {
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

static void bench_case_free(struct bench_case *c)
{
    cpu_free(c->in);
    cpu_free(c->out_plain);
    cpu_free(c->out_sym);
    cpu_free(c->ws.buf);
    cpu_free(c->ga);
    cpu_free(c->gb);
    cpu_free(c->gc);
}

static int bench_case_init(struct bench_case *c, int64_t rows, int64_t cols)
{
    memset(c, 0, sizeof(*c));
    c->m = rows < cols ? rows : cols;
    c->n = rows < cols ? cols : rows;
    const size_t mn = (size_t)(c->m * c->n), mm = (size_t)(c->m * c->m);

    c->ws.floats = ns_workspace_floats(rows, cols);
    c->in = cpu_alloc(mn * sizeof(float));
    c->out_plain = cpu_alloc(mn * sizeof(float));
    c->out_sym = cpu_alloc(mn * sizeof(float));
    c->ws.buf = cpu_alloc(c->ws.floats * sizeof(float));
    c->ga = cpu_alloc(mm * sizeof(float));
    c->gb = cpu_alloc(mn * sizeof(float));
    c->gc = cpu_alloc(mn * sizeof(float));
    if (!c->in || !c->out_plain || !c->out_sym || !c->ws.buf || !c->ga || !c->gb || !c->gc) {
        bench_case_free(c);
        return -1;
    }
    bench_fill_random(c->in, mn, 0x9e3779b97f4a7c15ull ^ (uint64_t)(rows * 65537 + cols));
    bench_fill_random(c->ga, mm, 11);
    bench_fill_random(c->gb, mn, 12);
    memset(c->gc, 0, mn * sizeof(float));
    return ns_coeffs_fill(NS_TABLE_QUINTIC, BENCH_STEPS, NULL, c->coeffs);
}

static int bench_run_ns(const struct bench_case *c, int variant, float *out)
{
    const struct ns_args a = {
        .batch = 1,
        .rows = c->m,
        .cols = c->n,
        .transpose = 0,
        .in = c->in,
        .in_dtype = KDT_F32,
        .out = out,
        .out_dtype = KDT_F32,
        .coeffs = (const float(*)[3])c->coeffs,
        .steps = BENCH_STEPS,
        .norm_scale = 1.0f,
        .eps = 1e-8f,
        .variant = variant,
    };
    const struct kernel_ctx ctx = {.threads = 0, .stream = NULL};
    return kernel_ops_cpu_best()->newton_schulz(&ctx, &a, &c->ws);
}

static void bench_run_sgemm(const struct bench_case *c)
{
    const int m = (int)c->m, n = (int)c->n;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, m, 1.0f, c->ga, m, c->gb, n, 0.0f,
                c->gc, n);
}

/* 0: plain NS, 1: symmetric NS, 2: sgemm. Returns seconds per call over `calls` calls, or a
 * negative value when the kernel refused the arguments. */
static double bench_sample(struct bench_case *c, int which, int calls)
{
    const double t0 = bench_now();
    for (int i = 0; i < calls; i++) {
        if (which == 2)
            bench_run_sgemm(c);
        else if (bench_run_ns(c, which == 0 ? NS_VARIANT_PLAIN : NS_VARIANT_SYMMETRIC,
                              which == 0 ? c->out_plain : c->out_sym) != 0)
            return -1.0;
    }
    return (bench_now() - t0) / calls;
}

static int bench_cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double bench_median(double *v, int count)
{
    qsort(v, (size_t)count, sizeof(double), bench_cmp_double);
    return count % 2 ? v[count / 2] : 0.5 * (v[count / 2 - 1] + v[count / 2]);
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

static int bench_shape(int64_t rows, int64_t cols, int reps, struct bench_result *r)
{
    double samples[3][BENCH_MAX_REPS];
    struct bench_case c;
    int calls[3];

    if (bench_case_init(&c, rows, cols) != 0)
        return -1;
    /* The warm-up call also sizes each sample to at least BENCH_MIN_SAMPLE_S. */
    for (int w = 0; w < 3; w++) {
        const double t = bench_sample(&c, w, 1);
        if (t < 0.0) {
            bench_case_free(&c);
            return -1;
        }
        calls[w] = t >= BENCH_MIN_SAMPLE_S ? 1 : (int)ceil(BENCH_MIN_SAMPLE_S / fmax(t, 1e-6));
    }
    for (int i = 0; i < reps; i++)
        for (int w = 0; w < 3; w++)
            samples[w][i] = bench_sample(&c, w, calls[w]);

    r->m = c.m;
    r->n = c.n;
    r->plain_s = bench_median(samples[0], reps);
    r->sym_s = bench_median(samples[1], reps);
    r->sgemm_s = bench_median(samples[2], reps);
    r->max_abs_diff = bench_max_abs_diff(c.out_plain, c.out_sym, (size_t)(c.m * c.n));
    bench_case_free(&c);
    return 0;
}

struct bench_rates {
    double plain_gflops, sym_gflops, sgemm_gflops;
};

static struct bench_rates bench_rates_of(const struct bench_result *r)
{
    const double ns_flops = BENCH_STEPS * ns_flops_per_iter(r->m, r->n);
    const double gemm_flops = 2.0 * (double)r->m * (double)r->m * (double)r->n;
    return (struct bench_rates){
        .plain_gflops = ns_flops / r->plain_s * 1e-9,
        .sym_gflops = ns_flops / r->sym_s * 1e-9,
        .sgemm_gflops = gemm_flops / r->sgemm_s * 1e-9,
    };
}

static void bench_print_table(const struct bench_opts *o, const struct bench_result *res)
{
    printf("Newton-Schulz, %d quintic steps, OpenBLAS threads %d, median of %d reps (%s)\n",
           BENCH_STEPS, kernel_blas_get_threads(), o->reps, openblas_get_corename());
    printf("GFLOP/s count 4m^2n + 2m^3 per step for both variants (symmetric: effective rate)\n\n");
    printf("%-11s %10s %9s %10s %9s %10s %9s %9s %9s %9s\n", "m x n", "sgemm", "sgemm", "plain",
           "plain", "symmetric", "sym", "plain/", "sym/", "sym");
    printf("%-11s %10s %9s %10s %9s %10s %9s %9s %9s %9s\n", "", "ms", "GFLOP/s", "ms", "GFLOP/s",
           "ms", "GFLOP/s", "sgemm", "sgemm", "speedup");
    for (int i = 0; i < o->nshapes; i++) {
        const struct bench_result *r = &res[i];
        const struct bench_rates g = bench_rates_of(r);
        char shape[32];
        snprintf(shape, sizeof shape, "%" PRId64 "x%" PRId64, r->m, r->n);
        printf("%-11s %10.3f %9.1f %10.2f %9.1f %10.2f %9.1f %9.3f %9.3f %9.3f\n", shape,
               r->sgemm_s * 1e3, g.sgemm_gflops, r->plain_s * 1e3, g.plain_gflops, r->sym_s * 1e3,
               g.sym_gflops, g.plain_gflops / g.sgemm_gflops, g.sym_gflops / g.sgemm_gflops,
               r->plain_s / r->sym_s);
    }
}

static void bench_print_variant_json(const char *name, double seconds, double gflops,
                                     double sgemm_gflops)
{
    printf("\"%s\": {\"ms\": %.4f, \"gflops\": %.2f, \"ratio_vs_sgemm\": %.4f}", name,
           seconds * 1e3, gflops, gflops / sgemm_gflops);
}

static void bench_print_json(const struct bench_opts *o, const struct bench_result *res)
{
    printf("{\"bench\": \"ns_bench\", \"coeffs\": \"quintic\", \"steps\": %d, \"threads\": %d, "
           "\"reps\": %d, \"openblas_core\": \"%s\",\n \"flops_per_step\": \"4m^2n+2m^3\", "
           "\"results\": [\n",
           BENCH_STEPS, kernel_blas_get_threads(), o->reps, openblas_get_corename());
    for (int i = 0; i < o->nshapes; i++) {
        const struct bench_result *r = &res[i];
        const struct bench_rates g = bench_rates_of(r);
        printf("  {\"m\": %" PRId64 ", \"n\": %" PRId64 ", ", r->m, r->n);
        printf("\"sgemm\": {\"ms\": %.4f, \"gflops\": %.2f}, ", r->sgemm_s * 1e3, g.sgemm_gflops);
        bench_print_variant_json("plain", r->plain_s, g.plain_gflops, g.sgemm_gflops);
        printf(", ");
        bench_print_variant_json("symmetric", r->sym_s, g.sym_gflops, g.sgemm_gflops);
        printf(", \"sym_speedup\": %.4f, \"max_abs_diff\": %.3g}%s\n", r->plain_s / r->sym_s,
               r->max_abs_diff, i + 1 < o->nshapes ? "," : "");
    }
    printf("]}\n");
}

int main(int argc, char **argv)
{
    struct bench_opts o;
    struct bench_result res[BENCH_MAX_SHAPES];

    if (bench_opts_parse(argc, argv, &o) != 0)
        return 2;
    kernel_blas_set_threads(o.threads);
    for (int i = 0; i < o.nshapes; i++) {
        if (bench_shape(o.shape[i][0], o.shape[i][1], o.reps, &res[i]) != 0) {
            fprintf(stderr, "ns_bench: %" PRId64 "x%" PRId64 ": out of memory or kernel refused\n",
                    o.shape[i][0], o.shape[i][1]);
            return 1;
        }
        if (!o.json)
            fprintf(stderr, "  measured %" PRId64 "x%" PRId64 "\n", res[i].m, res[i].n);
    }
    if (o.json)
        bench_print_json(&o, res);
    else
        bench_print_table(&o, res);
    return 0;
}

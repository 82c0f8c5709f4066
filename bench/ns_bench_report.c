/* ns_bench's report (bench/ns_bench.c measures): each shape's times, rates against the limit and
 * the variants' speedups, as a table or as JSON. */
#include <cblas.h>
#include <inttypes.h>
#include <stdio.h>

#include "bench/ns_bench.h"
#include "kernels/blas_threads.h"
#include "kernels/ns_coeffs.h"
#include "kernels/ns_variant.h"
#include "kernels/ops.h"

static const char *const w_names[W_COUNT] = {"plain", "symmetric", "limit",
                                             "gram",  "sym+aol",   "gram+aol"};

struct bench_rates {
    double plain_gflops, sym_gflops, sgemm_gflops, torch_gflops;
};

static struct bench_rates bench_rates_of(const struct bench_result *r)
{
    const double ns_flops = BENCH_STEPS * ns_flops_per_iter(r->m, r->n);
    const double gemm_flops = 2.0 * (double)r->m * (double)r->m * (double)r->n;
    return (struct bench_rates){
        .plain_gflops = ns_flops / r->plain_s * 1e-9,
        .sym_gflops = ns_flops / r->sym_s * 1e-9,
        .sgemm_gflops = gemm_flops / r->sgemm_s * 1e-9,
        .torch_gflops = r->torch_s > 0 ? ns_flops / r->torch_s * 1e-9 : 0,
    };
}

static const char *bench_limit_name(const struct bench_opts *o)
{
    return o->bf16 ? "oneDNN bf16 matmul" : "sgemm";
}

/* FLOPs of variant w on r's shape (ns_flops_total_for the run's compute: Gram's restarts depend
 * on it), and of the best standard one beside it */
static double bench_flops(const struct bench_opts *o, const struct bench_result *r, int w)
{
    const int sym = w == W_SYM || (w > W_LIMIT && r->var_variant == NS_VARIANT_SYMMETRIC);
    const int aol = w == W_SYM_AOL || w == W_GRAM_AOL;
    const int steps = aol ? BENCH_AOL_STEPS : BENCH_STEPS;
    const int algo = w == W_GRAM || w == W_GRAM_AOL ? NS_ALGO_GRAM : NS_ALGO_STANDARD;
    float c[NS_TABLE_MAX_STEPS][3]; /* the run's tables: Gram's restarts depend on them */
    ns_coeffs_fill(aol ? NS_TABLE_AOL : NS_TABLE_QUINTIC, steps, NULL, c);
    return ns_flops_total_for(r->m, r->n, (const float(*)[3])c, steps, algo, sym,
                              o->bf16 ? KDT_BF16 : KDT_F32);
}

/* issue 23's variants: time, measured speedup over the standard variant the committed table
 * runs for this shape (today's choice: symmetric from m = 384), same run, and the speedup their
 * FLOP counts allow over it */
static void bench_print_variants(const struct bench_opts *o, const struct bench_result *res)
{
    int any = 0;
    for (int w = W_LIMIT + 1; w < W_COUNT; w++)
        any |= ns_bench_wants(o, w);
    if (!any)
        return;
    printf(
        "\nagainst the standard variant of the table (today's), same run: ms, measured speedup, "
        "and the speedup the FLOP counts allow (ns_flops_total_for: symmetric products at half)\n");
    printf("%-11s %10s %10s", "m x n", "today ms", "today GFLOP");
    for (int w = W_LIMIT + 1; w < W_COUNT; w++)
        if (ns_bench_wants(o, w))
            printf(" %10s %8s %8s", w_names[w], "speedup", "count");
    printf("\n");
    for (int i = 0; i < o->nshapes; i++) {
        const struct bench_result *r = &res[i];
        const int bw = r->var_variant == NS_VARIANT_SYMMETRIC ? W_SYM : W_PLAIN;
        const double best = bw == W_SYM ? r->sym_s : r->plain_s;
        char shape[32];
        snprintf(shape, sizeof shape, "%" PRId64 "x%" PRId64, r->m, r->n);
        printf("%-11s %10.2f %10.2f", shape, best * 1e3, bench_flops(o, r, bw) * 1e-9);
        for (int w = W_LIMIT + 1; w < W_COUNT; w++)
            if (ns_bench_wants(o, w))
                printf(" %10.2f %8.3f %8.3f", r->var_s[w] * 1e3, best / r->var_s[w],
                       bench_flops(o, r, bw) / bench_flops(o, r, w));
        printf("\n");
    }
}

/* the Gram result guard's pass against Gram's whole call, same run */
static void bench_print_guard(const struct bench_opts *o, const struct bench_result *res)
{
    if (!ns_bench_wants(o, W_GRAM))
        return;
    printf("\nGram result guard (one pass over the m x n result, kernels/cpu/ns_common.h): ms, "
           "and its share of gram's time\n");
    for (int i = 0; i < o->nshapes; i++) {
        const struct bench_result *r = &res[i];
        char shape[32];
        snprintf(shape, sizeof shape, "%" PRId64 "x%" PRId64, r->m, r->n);
        printf("%-11s %10.4f %10.5f\n", shape, r->guard_s * 1e3, r->guard_s / r->var_s[W_GRAM]);
    }
}

void ns_bench_report_table(const struct bench_opts *o, const struct bench_result *res)
{
    printf("Newton-Schulz in %s, %d quintic steps, %d thread(s), median of %d reps; limit: %s "
           "(%s)\n",
           o->bf16 ? "bf16" : "fp32", BENCH_STEPS, blas_threads_get(), o->reps, bench_limit_name(o),
           o->bf16 ? "C[m x n] = A[m x m] B[m x n]" : openblas_get_corename());
    printf(
        "GFLOP/s count 4m^2n + 2m^3 per step for both variants (symmetric: effective rate)%s\n\n",
        o->torch ? "; torch: PyTorch bf16 Newton-Schulz, same count" : "");
    printf("%-11s %6s %10s %9s %10s %9s %10s %9s %8s %8s %8s", "m x n", "block", "limit", "limit",
           "plain", "plain", "symmetric", "sym", "plain/", "sym/", "sym");
    if (o->torch)
        printf(" %9s %9s %8s", "torch", "torch", "best/");
    printf("\n%-11s %6s %10s %9s %10s %9s %10s %9s %8s %8s %8s", "", "", "ms", "GFLOP/s", "ms",
           "GFLOP/s", "ms", "GFLOP/s", "limit", "limit", "speedup");
    if (o->torch)
        printf(" %9s %9s %8s", "ms", "GFLOP/s", "torch");
    printf("\n");
    for (int i = 0; i < o->nshapes; i++) {
        const struct bench_result *r = &res[i];
        const struct bench_rates g = bench_rates_of(r);
        char shape[32];
        snprintf(shape, sizeof shape, "%" PRId64 "x%" PRId64, r->m, r->n);
        printf("%-11s %6d %10.3f %9.1f %10.2f %9.1f %10.2f %9.1f %8.3f %8.3f %8.3f", shape,
               r->block, r->sgemm_s * 1e3, g.sgemm_gflops, r->plain_s * 1e3, g.plain_gflops,
               r->sym_s * 1e3, g.sym_gflops, g.plain_gflops / g.sgemm_gflops,
               g.sym_gflops / g.sgemm_gflops, r->plain_s / r->sym_s);
        if (o->torch && r->torch_s > 0)
            printf(" %9.2f %9.1f %8.3f", r->torch_s * 1e3, g.torch_gflops,
                   (g.sym_gflops > g.plain_gflops ? g.sym_gflops : g.plain_gflops) /
                       g.torch_gflops);
        else if (o->torch)
            printf(" %9s %9s %8s", "n/a", "n/a", "n/a");
        printf("\n");
    }
    bench_print_variants(o, res);
    bench_print_guard(o, res);
}

static void bench_print_variant_json(const char *name, double seconds, double gflops,
                                     double limit_gflops)
{
    printf("\"%s\": {\"ms\": %.4f, \"gflops\": %.2f, \"ratio_vs_limit\": %.4f}", name,
           seconds * 1e3, gflops, gflops / limit_gflops);
}

void ns_bench_report_json(const struct bench_opts *o, const struct bench_result *res)
{
    printf("{\"bench\": \"ns_bench\", \"compute\": \"%s\", \"coeffs\": \"quintic\", "
           "\"steps\": %d, \"threads\": %d, \"reps\": %d, \"limit\": \"%s\", "
           "\"openblas_core\": \"%s\",\n \"flops_per_step\": \"4m^2n+2m^3\", \"results\": [\n",
           o->bf16 ? "bf16" : "fp32", BENCH_STEPS, blas_threads_get(), o->reps, bench_limit_name(o),
           openblas_get_corename());
    for (int i = 0; i < o->nshapes; i++) {
        const struct bench_result *r = &res[i];
        const struct bench_rates g = bench_rates_of(r);
        printf("  {\"m\": %" PRId64 ", \"n\": %" PRId64 ", \"block\": %d, ", r->m, r->n, r->block);
        printf("\"limit\": {\"ms\": %.4f, \"gflops\": %.2f}, ", r->sgemm_s * 1e3, g.sgemm_gflops);
        bench_print_variant_json("plain", r->plain_s, g.plain_gflops, g.sgemm_gflops);
        printf(", ");
        bench_print_variant_json("symmetric", r->sym_s, g.sym_gflops, g.sgemm_gflops);
        if (r->torch_s > 0)
            printf(", \"torch\": {\"ms\": %.4f, \"gflops\": %.2f}", r->torch_s * 1e3,
                   g.torch_gflops);
        const int bw = r->var_variant == NS_VARIANT_SYMMETRIC ? W_SYM : W_PLAIN;
        const double best = bw == W_SYM ? r->sym_s : r->plain_s;
        for (int w = W_LIMIT + 1; w < W_COUNT; w++)
            if (ns_bench_wants(o, w))
                printf(", \"%s\": {\"ms\": %.4f, \"speedup_vs_table\": %.4f, \"flops\": %.6g, "
                       "\"count_speedup_vs_table\": %.4f, \"max_abs_diff_vs_symmetric\": %.3g}",
                       w_names[w], r->var_s[w] * 1e3, best / r->var_s[w], bench_flops(o, r, w),
                       bench_flops(o, r, bw) / bench_flops(o, r, w), r->var_diff[w]);
        if (r->guard_s > 0)
            printf(", \"gram_guard\": {\"ms\": %.4f, \"ratio_vs_gram\": %.5f}", r->guard_s * 1e3,
                   r->guard_s / r->var_s[W_GRAM]);
        printf(", \"sym_speedup\": %.4f, \"max_abs_diff\": %.3g}%s\n", r->plain_s / r->sym_s,
               r->max_abs_diff, i + 1 < o->nshapes ? "," : "");
    }
    printf("]}\n");
}

/* ns_bench --backend cuda: the CUDA backend's Newton-Schulz (5 quintic steps, bf16 in and out)
 * against a cuBLAS bf16 GEMM with fp32 accumulation of matching size, measured in the same run:
 * the largest product of an iteration, C[m x n] = B[m x m] X[m x n], over the same batch.
 * Rates count 4m^2n + 2m^3 FLOPs per iteration for Newton-Schulz and 2m^2n
 * for the GEMM; ratio = NS rate / GEMM rate. The symmetric variant runs beside the plain one, in
 * 2 and in 4 block columns (rows per block rounded up to a multiple of 64), its rate counted with
 * the plain FLOPs, so that its ratio says how much sooner the same result comes. Times are
 * medians over reps of CUDA-event intervals, the variants and the GEMM interleaved rep by rep.
 * With --algorithm gram|all and/or --precondition aol|all (issue 23), Gram Newton-Schulz
 * (quintic's 5 steps), AOL (the aol table's 4 steps) and both run beside them on the plain
 * products (what the runtime runs on the device), in the same interleaving, each reported with
 * its time and its speedup over the standard plain run of the same shape (a second table; in
 * JSON an "algorithms" list per shape). Beside every measured speedup over the standard plain run
 * (the symmetric variants' and these) stands the speedup their FLOP counts allow
 * (ns_flops_count, kernels/ns_shape.h: block lower triangles of k block columns at their exact
 * share, about (1 + 1/k) / 2; Gram with its table's restarts), as the CPU ns_bench prints it: a
 * measured ratio above the count means the plain run's products ran slower than the variant's,
 * not that the count was beaten. */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "bench/bench_util.h"
#include "bench/ns_bench_cuda.h"
#include "kernels/cuda/cuda_probe.h"
#include "kernels/device.h"
#include "kernels/ns_coeffs.h"
#include "kernels/ns_shape.h"
#include "kernels/ops.h"
}

static int ck(cudaError_t e, const char *what)
{
    if (e != cudaSuccess) {
        fprintf(stderr, "ns_bench: %s: %s\n", what, cudaGetErrorString(e));
        return -1;
    }
    return 0;
}

__global__ void k_fill_bf16(uint16_t *p, size_t n, uint64_t seed)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ull ^ seed;
        x ^= x >> 31;
        x *= 0xbf58476d1ce4e5b9ull;
        x ^= x >> 29;
        const float v = (float)((double)(x >> 11) / 9007199254740992.0 * 2.0 - 1.0);
        p[i] = bf16_from_f32(v);
    }
}

#define NS_BENCH_VARIANTS 3 /* plain, symmetric in 2 block columns, in 4 */
#define NS_BENCH_EXTRAS   3 /* gram; standard + aol; gram + aol */

/* The extra columns: algorithm, precondition, table, steps, name. */
static const struct {
    int algorithm, precondition, table, steps;
    const char *name;
} extras[NS_BENCH_EXTRAS] = {
    {NS_ALGO_GRAM, NS_PRECOND_FROBENIUS, NS_TABLE_QUINTIC, 5, "gram"},
    {NS_ALGO_STANDARD, NS_PRECOND_AOL, NS_TABLE_AOL, 4, "aol"},
    {NS_ALGO_GRAM, NS_PRECOND_AOL, NS_TABLE_AOL, 4, "gram+aol"},
};

struct cuda_case {
    int64_t batch, m, n;
    double ns_s[NS_BENCH_VARIANTS], gemm_s;
    int block[NS_BENCH_VARIANTS]; /* rows per block; 0: plain */
    int ex_on[NS_BENCH_EXTRAS];   /* which extras run */
    double ex_s[NS_BENCH_EXTRAS];
};

/* The share of a symmetric m x m product the driver computes with `block` rows per block column
 * (0: the plain variant, the whole product): sum over block columns [r0, r1) of (m - r0)(r1 - r0),
 * over m^2. */
static double sym_share(int64_t m, int block)
{
    if (block <= 0 || block >= m)
        return 1.0;
    double s = 0.0;
    for (int64_t r0 = 0; r0 < m; r0 += block)
        s += (double)(m - r0) * (double)(r0 + block < m ? block : m - r0);
    return s / ((double)m * (double)m);
}

/* FLOPs of symmetric variant v (0: plain) and of extra e on c's shape, one matrix */
static double variant_flops(const struct cuda_case *c, int v)
{
    const int64_t m = c->m < c->n ? c->m : c->n, n = c->m < c->n ? c->n : c->m;
    return ns_flops_count((double)m, (double)n, 5, 0, 0u, sym_share(m, c->block[v]));
}
static double extra_flops(const struct cuda_case *c, int e)
{
    const int64_t m = c->m < c->n ? c->m : c->n, n = c->m < c->n ? c->n : c->m;
    float co[NS_TABLE_MAX_STEPS][3];
    ns_coeffs_fill(extras[e].table, extras[e].steps, NULL, co);
    const int gram = extras[e].algorithm == NS_ALGO_GRAM;
    return ns_flops_count(
        (double)m, (double)n, extras[e].steps, gram,
        gram ? ns_coeffs_gram_restarts((const float(*)[3])co, extras[e].steps, m, n) : 0u, 1.0);
}

/* Rows per block for k block columns of an m-row working matrix: ceil(m / k) rounded up to 64. */
static int block_for(int64_t m, int k)
{
    const int64_t b = ((m + k - 1) / k + 63) / 64 * 64;
    return (int)(b < m ? b : m);
}

static int run_case(const struct kernel_ops *ops, const struct device_ops *dev,
                    const struct kernel_ctx *ctx, cublasHandle_t h, struct cuda_case *c, int reps)
{
    const int64_t rows = c->m, cols = c->n; /* as given: a tall shape runs on its transpose */
    const int64_t m = rows < cols ? rows : cols, n = rows < cols ? cols : rows;
    const size_t count = (size_t)(c->batch * rows * cols);
    const size_t wsb = ops->ns_workspace_bytes(rows, cols, c->batch);
    uint16_t *u = (uint16_t *)dev->alloc(count * 2);
    uint16_t *gb = (uint16_t *)dev->alloc((size_t)(c->batch * m * m) * 2);
    uint16_t *gx = (uint16_t *)dev->alloc((size_t)(c->batch * m * n) * 2);
    uint16_t *gc = (uint16_t *)dev->alloc((size_t)(c->batch * m * n) * 2);
    struct ns_workspace ws = {(float *)dev->alloc(wsb), wsb / sizeof(float), NULL};
    float coeffs[NS_TABLE_MAX_STEPS][3];
    cudaEvent_t e0, e1;
    double *ns_t =
        (double *)malloc(sizeof(double) * (size_t)reps * (NS_BENCH_VARIANTS + NS_BENCH_EXTRAS));
    float ex_coeffs[NS_BENCH_EXTRAS][NS_TABLE_MAX_STEPS][3];
    double *gm_t = (double *)malloc(sizeof(double) * (size_t)reps);
    int rc = -1;

    ns_coeffs_fill(NS_TABLE_QUINTIC, 5, NULL, coeffs);
    for (int e = 0; e < NS_BENCH_EXTRAS; e++)
        ns_coeffs_fill(extras[e].table, extras[e].steps, NULL, ex_coeffs[e]);
    if (u == NULL || gb == NULL || gx == NULL || gc == NULL || ws.buf == NULL || ns_t == NULL ||
        gm_t == NULL) {
        fprintf(stderr, "ns_bench: %lldx%lldx%lld: out of device memory\n", (long long)c->batch,
                (long long)rows, (long long)cols);
        goto out;
    }
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    k_fill_bf16<<<1024, 256>>>(u, count, 1);
    k_fill_bf16<<<1024, 256>>>(gb, (size_t)(c->batch * m * m), 2);
    k_fill_bf16<<<1024, 256>>>(gx, (size_t)(c->batch * m * n), 3);
    c->block[0] = 0;
    c->block[1] = block_for(m, 2);
    c->block[2] = block_for(m, 4);
    {
        struct ns_args a = {c->batch,
                            rows,
                            cols,
                            rows > cols,
                            u,
                            KDT_BF16,
                            u,
                            KDT_BF16,
                            (const float(*)[3])coeffs,
                            5,
                            1.0f,
                            1e-8f,
                            NS_VARIANT_PLAIN,
                            KDT_BF16,
                            0};
        const float one = 1.0f, zero = 0.0f;
        for (int r = -1; r < reps; r++) { /* r = -1: warm-up (cuBLAS heuristics, clocks) */
            float ms = 0;
            for (int v = 0; v < NS_BENCH_VARIANTS; v++) {
                a.variant = c->block[v] > 0 ? NS_VARIANT_SYMMETRIC : NS_VARIANT_PLAIN;
                a.block = c->block[v];
                cudaEventRecord(e0, 0);
                if (ops->newton_schulz(ctx, &a, &ws) != 0) {
                    fprintf(stderr, "ns_bench: Newton-Schulz refused (block %d)\n", c->block[v]);
                    goto out_ev;
                }
                cudaEventRecord(e1, 0);
                if (ck(cudaEventSynchronize(e1), "Newton-Schulz") != 0)
                    goto out_ev;
                cudaEventElapsedTime(&ms, e0, e1);
                if (r >= 0)
                    ns_t[(size_t)v * (size_t)reps + (size_t)r] = ms * 1e-3;
            }
            for (int e = 0; e < NS_BENCH_EXTRAS; e++) {
                if (!c->ex_on[e])
                    continue;
                struct ns_args x = a;
                x.variant = NS_VARIANT_PLAIN;
                x.block = 0;
                x.coeffs = (const float(*)[3])ex_coeffs[e];
                x.steps = extras[e].steps;
                x.algorithm = extras[e].algorithm;
                x.precondition = extras[e].precondition;
                cudaEventRecord(e0, 0);
                if (ops->newton_schulz(ctx, &x, &ws) != 0) {
                    fprintf(stderr, "ns_bench: Newton-Schulz refused (%s)\n", extras[e].name);
                    goto out_ev;
                }
                cudaEventRecord(e1, 0);
                if (ck(cudaEventSynchronize(e1), extras[e].name) != 0)
                    goto out_ev;
                cudaEventElapsedTime(&ms, e0, e1);
                if (r >= 0)
                    ns_t[(size_t)(NS_BENCH_VARIANTS + e) * (size_t)reps + (size_t)r] = ms * 1e-3;
            }
            /* the limit: Yc (n x m) = Xc (n x m) Bc (m x m), as the driver's largest product */
            cudaEventRecord(e0, 0);
            if (cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, (int)n, (int)m, (int)m,
                                           &one, gx, CUDA_R_16BF, (int)n, m * n, gb, CUDA_R_16BF,
                                           (int)m, m * m, &zero, gc, CUDA_R_16BF, (int)n, m * n,
                                           (int)c->batch, CUBLAS_COMPUTE_32F,
                                           CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
                fprintf(stderr, "ns_bench: cuBLAS GEMM failed\n");
                goto out_ev;
            }
            cudaEventRecord(e1, 0);
            if (ck(cudaEventSynchronize(e1), "GEMM") != 0)
                goto out_ev;
            cudaEventElapsedTime(&ms, e0, e1);
            if (r >= 0)
                gm_t[r] = ms * 1e-3;
        }
    }
    for (int v = 0; v < NS_BENCH_VARIANTS; v++)
        c->ns_s[v] = bench_median(ns_t + (size_t)v * (size_t)reps, reps);
    for (int e = 0; e < NS_BENCH_EXTRAS; e++)
        c->ex_s[e] = c->ex_on[e]
                         ? bench_median(ns_t + (size_t)(NS_BENCH_VARIANTS + e) * (size_t)reps, reps)
                         : 0.0;
    c->gemm_s = bench_median(gm_t, reps);
    rc = 0;
out_ev:
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
out:
    dev->free(u);
    dev->free(gb);
    dev->free(gx);
    dev->free(gc);
    dev->free(ws.buf);
    free(ns_t);
    free(gm_t);
    return rc;
}

/* Issue 7's shapes: 4096^2, a GLM-4.5-Air expert (1408 x 4096) alone and as a batch of 32, and
 * a tall 12288 x 4096 (run on its transpose). */
static const int64_t default_shapes[][3] = {
    {1, 4096, 4096}, {1, 1408, 4096}, {32, 1408, 4096}, {1, 12288, 4096}};

int ns_bench_cuda(const int64_t (*shapes)[3], int nshapes, int reps, int json, int algos,
                  int preconds)
{
    /* the extras whose algorithm and preconditioning were both asked for */
    int ex_on[NS_BENCH_EXTRAS], any = 0;
    for (int e = 0; e < NS_BENCH_EXTRAS; e++) {
        ex_on[e] = (algos & (extras[e].algorithm == NS_ALGO_GRAM ? 2 : 1)) &&
                   (preconds & (extras[e].precondition == NS_PRECOND_AOL ? 2 : 1));
        any |= ex_on[e];
    }
    const struct kernel_ops *ops = kernel_ops_cuda();
    const struct device_ops *dops = device_ops_cuda();
    struct kernel_ctx ctx = {0, NULL, NULL};
    struct cuda_case cases[64];
    cudaDeviceProp prop;
    cublasHandle_t h;
    int dev = 0;

    if (cuda_probe_device_count() == 0) {
        fprintf(stderr, "ns_bench: --backend cuda: no CUDA device visible\n");
        return 77;
    }
    if (shapes == NULL || nshapes == 0) {
        shapes = default_shapes;
        nshapes = (int)(sizeof default_shapes / sizeof default_shapes[0]);
    }
    if (nshapes > 64)
        nshapes = 64;
    if (dops->backend_create(-1, NULL, &ctx.backend) != SHARDOPT_OK) {
        fprintf(stderr, "ns_bench: %s\n", shardopt_last_error());
        return 1;
    }
    cudaGetDevice(&dev);
    cudaGetDeviceProperties(&prop, dev);
    cublasCreate(&h);
    for (int i = 0; i < nshapes; i++) {
        memset(&cases[i], 0, sizeof cases[i]);
        cases[i].batch = shapes[i][0];
        cases[i].m = shapes[i][1];
        cases[i].n = shapes[i][2];
        memcpy(cases[i].ex_on, ex_on, sizeof ex_on);
        if (run_case(ops, dops, &ctx, h, &cases[i], reps) != 0)
            return 1;
        fprintf(stderr, "  measured %lldx%lldx%lld\n", (long long)cases[i].batch,
                (long long)cases[i].m, (long long)cases[i].n);
    }
    if (json)
        printf("{\"backend\": \"cuda\", \"device\": \"%s\", \"ns_steps\": 5, \"reps\": %d, "
               "\"shapes\": [",
               prop.name, reps);
    else
        printf("Newton-Schulz on %s (bf16, fp32 accumulation, 5 quintic steps), limit: cuBLAS "
               "bf16 GEMM of the largest product, same run, medians of %d reps\n\n"
               "symmetric: the symmetric variant in 2 and in 4 block columns (rows per block in "
               "brackets), its rate counted with the plain variant's FLOPs; speedup: over the "
               "plain NS ms, measured (and the speedup the FLOP counts allow)\n\n"
               "| batch x rows x cols | NS ms | NS TFLOP/s | GEMM TFLOP/s | NS / GEMM | "
               "symmetric/2 / GEMM | speedup (count) | symmetric/4 / GEMM | speedup (count) |\n"
               "|---|---|---|---|---|---|---|---|---|\n",
               prop.name, reps);
    for (int i = 0; i < nshapes; i++) {
        const struct cuda_case *c = &cases[i];
        const double m = (double)(c->m < c->n ? c->m : c->n),
                     n = (double)(c->m < c->n ? c->n : c->m);
        /* 4m^2n + 2m^3 per iteration, as ns_flops_per_iter (not in kernels-only builds) */
        const double flops = (4 * m * m * n + 2 * m * m * m) * 5 * (double)c->batch;
        const double f_plain = variant_flops(c, 0); /* the same count, one matrix */
        double ns_tf[NS_BENCH_VARIANTS];
        for (int v = 0; v < NS_BENCH_VARIANTS; v++)
            ns_tf[v] = flops / c->ns_s[v] * 1e-12;
        const double gm_tf = 2.0 * m * m * n * (double)c->batch / c->gemm_s * 1e-12;
        if (json)
            printf("%s{\"batch\": %lld, \"rows\": %lld, \"cols\": %lld, \"ns_seconds\": %.6e, "
                   "\"ns_tflops\": %.2f, \"gemm_seconds\": %.6e, \"gemm_tflops\": %.2f, "
                   "\"ratio\": %.3f, \"symmetric\": [{\"block\": %d, \"ns_seconds\": %.6e, "
                   "\"ratio\": %.3f, \"speedup\": %.3f, \"count_speedup\": %.3f}, {\"block\": "
                   "%d, \"ns_seconds\": %.6e, \"ratio\": %.3f, \"speedup\": %.3f, "
                   "\"count_speedup\": %.3f}]",
                   i ? ", " : "", (long long)c->batch, (long long)c->m, (long long)c->n, c->ns_s[0],
                   ns_tf[0], c->gemm_s, gm_tf, ns_tf[0] / gm_tf, c->block[1], c->ns_s[1],
                   ns_tf[1] / gm_tf, c->ns_s[0] / c->ns_s[1], f_plain / variant_flops(c, 1),
                   c->block[2], c->ns_s[2], ns_tf[2] / gm_tf, c->ns_s[0] / c->ns_s[2],
                   f_plain / variant_flops(c, 2));
        if (json && any) {
            printf(", \"algorithms\": [");
            for (int e = 0, k = 0; e < NS_BENCH_EXTRAS; e++)
                if (c->ex_on[e])
                    printf("%s{\"name\": \"%s\", \"steps\": %d, \"ns_seconds\": %.6e, "
                           "\"speedup\": %.3f, \"count_speedup\": %.3f}",
                           k++ ? ", " : "", extras[e].name, extras[e].steps, c->ex_s[e],
                           c->ns_s[0] / c->ex_s[e], f_plain / extra_flops(c, e));
            printf("]");
        }
        if (json)
            printf("}");
        else
            printf("| %lldx%lldx%lld | %.3f | %.1f | %.1f | %.2f | %.2f (%d) | %.2f (%.2f) | %.2f "
                   "(%d) | %.2f (%.2f) |\n",
                   (long long)c->batch, (long long)c->m, (long long)c->n, c->ns_s[0] * 1e3,
                   ns_tf[0], gm_tf, ns_tf[0] / gm_tf, ns_tf[1] / gm_tf, c->block[1],
                   c->ns_s[0] / c->ns_s[1], f_plain / variant_flops(c, 1), ns_tf[2] / gm_tf,
                   c->block[2], c->ns_s[0] / c->ns_s[2], f_plain / variant_flops(c, 2));
    }
    if (!json && any) {
        printf("\nGram Newton-Schulz (quintic, 5 steps) and AOL (aol table, 4 steps), plain "
               "products, same run: ms (speedup over the standard plain NS ms above, and the "
               "speedup the FLOP counts allow)\n\n"
               "| batch x rows x cols |");
        for (int e = 0; e < NS_BENCH_EXTRAS; e++)
            if (ex_on[e])
                printf(" %s |", extras[e].name);
        printf("\n|---|");
        for (int e = 0; e < NS_BENCH_EXTRAS; e++)
            if (ex_on[e])
                printf("---|");
        printf("\n");
        for (int i = 0; i < nshapes; i++) {
            const struct cuda_case *c = &cases[i];
            printf("| %lldx%lldx%lld |", (long long)c->batch, (long long)c->m, (long long)c->n);
            for (int e = 0; e < NS_BENCH_EXTRAS; e++)
                if (c->ex_on[e])
                    printf(" %.3f (%.2fx, count %.2fx) |", c->ex_s[e] * 1e3,
                           c->ns_s[0] / c->ex_s[e], variant_flops(c, 0) / extra_flops(c, e));
            printf("\n");
        }
    }
    if (json)
        printf("]}\n");
    cublasDestroy(h);
    dops->backend_destroy(ctx.backend);
    return 0;
}

/* ns_floor: how far apart valid fp32 implementations of standard Newton-Schulz (quintic, 5
 * steps, Frobenius scaling) already are, beside how far Gram Newton-Schulz is from them (issue 23:
 * Gram within 1e-5 relative Frobenius of standard). On low-rank inputs the output's components
 * in the input's null space are rounding noise that each step multiplies by up to a = 3.44, so the
 * floor is set by the summation order of the products, not by the algorithm.
 *
 *   ns_floor [--seeds S] [--kind rank1|rank4|rank16|cond|all] [--shape MxN]... [--cores A,B]
 *            [--cases]
 *
 * Every case (kind, m x n wide, seed) runs in this process: the reference kernel (double
 * accumulation, kernels = ref), OpenBLAS plain and symmetric at 1 and at 2 BLAS threads, standard
 * and Gram; and in a child per --cores entry (default Haswell,Sandybridge: FMA AVX2, and AVX
 * without FMA; this process runs OpenBLAS's own choice), started with OPENBLAS_CORETYPE set and
 * --emit (the child's mode), OpenBLAS plain and symmetric at 1 thread, standard and Gram, sent
 * back over a pipe (the child draws the same inputs: no BLAS in the drawing). Against an fp64
 * iteration (dgemm). Per kind and shape, median / max over the seeds of: each named pair of
 * standard outputs, the largest difference between any two standard outputs ("std-std"; "in-proc"
 * among the reference, plain and symmetric at 1 thread), the largest between Gram and standard on
 * the same kernel ("gram-std"), the largest of any standard (Gram) output from fp64. --cases
 * prints every case too, with each standard output's distance from fp64.
 * Inputs are those of tests/unit/test_ns_gram.c: U diag(sv) V^T with sv = 1/(i+1) for i < rank,
 * else 0, or log-uniform over [1e-4, 1] (cond). */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/bench_util.h"
#include "kernels/blas_threads.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/ns_coeffs.h"
#include "kernels/ops.h"
#include "tests/ns_singular.h"

#define MAX_SHAPES 64
#define MAX_SEEDS  16
#define MAX_CORES  4
#define STEPS      5

enum { RANK1, RANK4, RANK16, COND, N_KIND };
static const char *const kind_names[N_KIND] = {"rank1", "rank4", "rank16", "cond"};

/* outputs of one case: in-process ones, then 4 per child core */
enum {
    O_PLAIN,
    O_SYM,
    O_REF,
    O_PLAIN2, /* 2 BLAS threads */
    O_SYM2,
    O_GPLAIN,
    O_GSYM,
    O_GREF,
    O_GPLAIN2,
    O_GSYM2,
    O_LOCAL
};
#define O_CORE(c, k) (O_LOCAL + 4 * (c) + (k)) /* k: 0 plain, 1 sym, 2 gram plain, 3 gram sym */
#define MAX_OUT      (O_LOCAL + 4 * MAX_CORES)

/* the columns: pairs of outputs (a against b), or a summary */
enum {
    C_SYM,
    C_REF,
    C_THR,
    C_CORE0,
    C_CORE1,
    C_CORES,
    C_STDSTD,
    C_LOCAL,
    C_GRAM,
    C_S64,
    C_G64,
    N_COL
};
static const char *const col_names[N_COL] = {"sym/pl",    "ref/pl",   "2thr/1",   "core0/def",
                                             "core1/def", "core0/1",  "std-std",  "in-proc",
                                             "gram-std",  "std-fp64", "gram-fp64"};

struct opts {
    int seeds, kinds[N_KIND], n_shapes, shapes[MAX_SHAPES][2], n_cores, cases, emit;
    char cores[MAX_CORES][32];
};

static float *make_input(int kind, int m, int n, uint64_t seed)
{
    const int rank = kind == RANK1 ? 1 : kind == RANK4 ? 4 : 16;
    double *sv = malloc(sizeof(double) * (size_t)m);
    float *x = malloc(sizeof(float) * (size_t)m * (size_t)n);
    for (int i = 0; i < m; i++)
        sv[i] = kind == COND ? pow(1e-4, (double)i / (double)(m > 1 ? m - 1 : 1))
                             : (i < rank ? 1.0 / (double)(i + 1) : 0.0);
    matrix_with_singular_values(x, m, n, sv, seed);
    free(sv);
    return x;
}

static void run_ns(int ref, int variant, int algorithm, int m, int n, const float (*c)[3],
                   float norm_scale, const float *in, float *out)
{
    struct ns_args a = {.batch = 1,
                        .rows = m,
                        .cols = n,
                        .in = in,
                        .in_dtype = KDT_F32,
                        .out = out,
                        .out_dtype = KDT_F32,
                        .coeffs = c,
                        .steps = STEPS,
                        .norm_scale = norm_scale,
                        .eps = 1e-8f,
                        .variant = variant,
                        .compute = KDT_F32,
                        .algorithm = algorithm,
                        .precondition = NS_PRECOND_FROBENIUS};
    const struct kernel_ctx ctx = {.threads = 1, .stream = NULL};
    struct ns_workspace ws = {.floats = ns_workspace_floats(m, n)};
    ws.buf = cpu_alloc(ws.floats * sizeof(float));
    const int rc = ws.buf == NULL ? -3
                   : ref          ? ns_ref_newton_schulz(&ctx, &a, &ws)
                                  : ns_blas_newton_schulz(&ctx, &a, &ws);
    cpu_free(ws.buf);
    if (rc != 0) {
        fprintf(stderr, "ns_floor: Newton-Schulz failed (%d) at %dx%d\n", rc, m, n);
        exit(1);
    }
}

/* the fp64 iteration (tests/ns_fp64.h's, products by dgemm) */
static void fp64_ns(const float *in, int m, int n, const float (*c)[3], double norm_scale,
                    double *x)
{
    double *y = malloc(sizeof(double) * (size_t)m * (size_t)n);
    double *A = malloc(sizeof(double) * (size_t)m * (size_t)m);
    double *B = malloc(sizeof(double) * (size_t)m * (size_t)m);
    double ss = 0.0;
    for (size_t i = 0; i < (size_t)m * (size_t)n; i++)
        ss += (double)in[i] * in[i];
    const double inv = 1.0 / (sqrt(ss) * norm_scale + 1e-8);
    for (size_t i = 0; i < (size_t)m * (size_t)n; i++)
        x[i] = in[i] * inv;
    for (int s = 0; s < STEPS; s++) {
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, m, n, 1.0, x, n, x, n, 0.0, A, m);
        memcpy(B, A, sizeof(double) * (size_t)m * (size_t)m);
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, m, m, c[s][2], A, m, A, m,
                    c[s][1], B, m);
        for (int i = 0; i < m; i++)
            B[i * m + i] += c[s][0];
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, m, 1.0, B, m, x, n, 0.0, y, n);
        memcpy(x, y, sizeof(double) * (size_t)m * (size_t)n);
    }
    free(y);
    free(A);
    free(B);
}

static double rel(const float *a, const float *b, size_t count)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < count; i++) {
        const double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return sqrt(num / den);
}

static double rel64(const float *a, const double *r, size_t count)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < count; i++) {
        const double d = (double)a[i] - r[i];
        num += d * d;
        den += r[i] * r[i];
    }
    return sqrt(num / den);
}

static int parse_args(int argc, char **argv, struct opts *o)
{
    static const int def[][2] = {{64, 200},   {64, 512},   {64, 2048},  {96, 200},   {96, 512},
                                 {96, 2048},  {128, 256},  {128, 512},  {128, 2048}, {256, 512},
                                 {256, 1024}, {256, 2048}, {512, 1024}, {512, 2048}};
    memset(o, 0, sizeof *o);
    o->seeds = 3;
    for (int k = 0; k < N_KIND; k++)
        o->kinds[k] = 1;
    strcpy(o->cores[0], "Haswell");
    strcpy(o->cores[1], "Sandybridge");
    o->n_cores = 2;
    int kinds_given = 0, cores_given = 0;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--cases")) {
            o->cases = 1;
        } else if (!strcmp(argv[i], "--emit")) {
            o->emit = 1;
        } else if (!strcmp(argv[i], "--seeds") && v) {
            o->seeds = atoi(v), i++;
            if (o->seeds < 1 || o->seeds > MAX_SEEDS)
                return -1;
        } else if (!strcmp(argv[i], "--kind") && v) {
            if (!kinds_given)
                memset(o->kinds, 0, sizeof o->kinds);
            kinds_given = 1;
            int found = 0;
            for (int k = 0; k < N_KIND; k++)
                if (!strcmp(v, kind_names[k]) || !strcmp(v, "all"))
                    o->kinds[k] = 1, found = 1;
            if (!found)
                return -1;
            i++;
        } else if (!strcmp(argv[i], "--shape") && v && o->n_shapes < MAX_SHAPES) {
            int m, n;
            if (sscanf(v, "%dx%d", &m, &n) != 2 || m < 1 || n < m)
                return -1;
            o->shapes[o->n_shapes][0] = m, o->shapes[o->n_shapes][1] = n, o->n_shapes++, i++;
        } else if (!strcmp(argv[i], "--cores") && v) {
            if (!cores_given)
                o->n_cores = 0;
            cores_given = 1;
            char buf[256];
            snprintf(buf, sizeof buf, "%s", v);
            for (char *t = strtok(buf, ","); t && o->n_cores < MAX_CORES; t = strtok(NULL, ","))
                snprintf(o->cores[o->n_cores++], 32, "%s", t);
            i++;
        } else {
            return -1;
        }
    }
    if (o->n_shapes == 0) {
        o->n_shapes = (int)(sizeof def / sizeof def[0]);
        memcpy(o->shapes, def, sizeof def);
    }
    return 0;
}

/* the 4 outputs a child core gives for one case */
static void emit_case(const float *in, int m, int n, const float (*c)[3], float ns, float *buf)
{
    const size_t count = (size_t)m * (size_t)n;
    run_ns(0, NS_VARIANT_PLAIN, NS_ALGO_STANDARD, m, n, c, ns, in, buf);
    run_ns(0, NS_VARIANT_SYMMETRIC, NS_ALGO_STANDARD, m, n, c, ns, in, buf + count);
    run_ns(0, NS_VARIANT_PLAIN, NS_ALGO_GRAM, m, n, c, ns, in, buf + 2 * count);
    run_ns(0, NS_VARIANT_SYMMETRIC, NS_ALGO_GRAM, m, n, c, ns, in, buf + 3 * count);
}

/* the arguments a child needs to draw the same cases, in a shell command */
static void child_command(const struct opts *o, const char *core, char *cmd, size_t size)
{
    char self[4096];
    const ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) {
        fprintf(stderr, "ns_floor: cannot find this program's path\n");
        exit(1);
    }
    self[len] = '\0';
    size_t at = (size_t)snprintf(cmd, size,
                                 "OPENBLAS_CORETYPE=%s OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 "
                                 "'%s' --emit --seeds %d",
                                 core, self, o->seeds);
    for (int k = 0; k < N_KIND; k++)
        if (o->kinds[k])
            at += (size_t)snprintf(cmd + at, size - at, " --kind %s", kind_names[k]);
    for (int s = 0; s < o->n_shapes; s++)
        at += (size_t)snprintf(cmd + at, size - at, " --shape %dx%d", o->shapes[s][0],
                               o->shapes[s][1]);
}

static void read_exact(FILE *f, void *p, size_t bytes, const char *core)
{
    if (fread(p, 1, bytes, f) != bytes) {
        fprintf(stderr, "ns_floor: the %s child ended early\n", core);
        exit(1);
    }
}

/* the columns of one case from its outputs */
static void columns(float *const *o, const double *r64, size_t count, int n_cores, double *col)
{
    col[C_SYM] = rel(o[O_SYM], o[O_PLAIN], count);
    col[C_REF] = rel(o[O_REF], o[O_PLAIN], count);
    col[C_THR] = fmax(rel(o[O_PLAIN2], o[O_PLAIN], count), rel(o[O_SYM2], o[O_SYM], count));
    col[C_CORE0] = n_cores > 0 ? rel(o[O_CORE(0, 0)], o[O_PLAIN], count) : NAN;
    col[C_CORE1] = n_cores > 1 ? rel(o[O_CORE(1, 0)], o[O_PLAIN], count) : NAN;
    col[C_CORES] = n_cores > 1 ? rel(o[O_CORE(0, 0)], o[O_CORE(1, 0)], count) : NAN;
    /* every standard output, and the Gram one on the same kernel for each */
    int std[MAX_OUT], gram[MAX_OUT], ns = 0;
    const int local_std[] = {O_PLAIN, O_SYM, O_REF, O_PLAIN2, O_SYM2};
    const int local_gram[] = {O_GPLAIN, O_GSYM, O_GREF, O_GPLAIN2, O_GSYM2};
    for (int i = 0; i < 5; i++)
        std[ns] = local_std[i], gram[ns++] = local_gram[i];
    for (int cidx = 0; cidx < n_cores; cidx++)
        for (int k = 0; k < 2; k++)
            std[ns] = O_CORE(cidx, k), gram[ns++] = O_CORE(cidx, k + 2);
    col[C_STDSTD] = col[C_LOCAL] = col[C_GRAM] = col[C_S64] = col[C_G64] = 0.0;
    for (int i = 0; i < ns; i++) {
        for (int j = i + 1; j < ns; j++) {
            const double d = rel(o[std[i]], o[std[j]], count);
            col[C_STDSTD] = fmax(col[C_STDSTD], d);
            if (std[i] <= O_REF && std[j] <= O_REF) /* what one process sees at one thread */
                col[C_LOCAL] = fmax(col[C_LOCAL], d);
        }
        col[C_GRAM] = fmax(col[C_GRAM], rel(o[gram[i]], o[std[i]], count));
        col[C_S64] = fmax(col[C_S64], rel64(o[std[i]], r64, count));
        col[C_G64] = fmax(col[C_G64], rel64(o[gram[i]], r64, count));
    }
}

int main(int argc, char **argv)
{
    struct opts o;
    if (parse_args(argc, argv, &o) != 0) {
        fprintf(stderr, "usage: ns_floor [--seeds S] [--kind rank1|rank4|rank16|cond|all]... "
                        "[--shape MxN]... [--cores A,B] [--cases]\n");
        return 2;
    }
    float c[STEPS][3];
    ns_coeffs_fill(NS_TABLE_QUINTIC, STEPS, NULL, c);
    const float norm_scale = (float)ns_coeffs_default_norm_scale(NS_TABLE_QUINTIC);
    blas_threads_set(1);

    FILE *child[MAX_CORES] = {0};
    if (o.emit) {
        printf("core %s\n", blas_threads_core());
        fflush(stdout);
    } else {
        for (int k = 0; k < o.n_cores; k++) {
            char cmd[8192], line[128] = "";
            child_command(&o, o.cores[k], cmd, sizeof cmd);
            child[k] = popen(cmd, "r");
            if (child[k] == NULL || fgets(line, sizeof line, child[k]) == NULL) {
                fprintf(stderr, "ns_floor: could not start the %s child\n", o.cores[k]);
                return 1;
            }
            line[strcspn(line, "\n")] = '\0';
            printf("# child %d: OPENBLAS_CORETYPE=%s runs %s\n", k, o.cores[k], line + 5);
        }
        printf("# this process: %s; quintic %d steps; relative Frobenius, median/max over %d "
               "seeds\n# core0 = %s, core1 = %s; def = this process's core\n",
               blas_threads_core(), STEPS, o.seeds, o.n_cores > 0 ? o.cores[0] : "-",
               o.n_cores > 1 ? o.cores[1] : "-");
        printf("%-6s %4s %5s", "kind", "m", "n");
        for (int j = 0; j < N_COL; j++)
            printf("   %17s", col_names[j]);
        printf("\n");
    }

    for (int kind = 0; kind < N_KIND; kind++) {
        if (!o.kinds[kind])
            continue;
        for (int s = 0; s < o.n_shapes; s++) {
            const int m = o.shapes[s][0], n = o.shapes[s][1];
            const size_t count = (size_t)m * (size_t)n;
            double cols[N_COL][MAX_SEEDS];
            for (int seed = 0; seed < o.seeds; seed++) {
                float *in = make_input(kind, m, n, 1000u * (uint64_t)kind + 17u * (uint64_t)seed);
                float *buf = malloc(sizeof(float) * count * MAX_OUT), *out[MAX_OUT];
                for (int i = 0; i < MAX_OUT; i++)
                    out[i] = buf + (size_t)i * count;
                if (o.emit) {
                    emit_case(in, m, n, (const float(*)[3])c, norm_scale, buf);
                    fwrite(buf, sizeof(float), 4 * count, stdout);
                    fflush(stdout);
                    free(in);
                    free(buf);
                    continue;
                }
                for (int ref = 0; ref <= 1; ref++)
                    for (int algo = NS_ALGO_STANDARD; algo <= NS_ALGO_GRAM; algo++)
                        for (int v = NS_VARIANT_PLAIN; v <= (ref ? 0 : NS_VARIANT_SYMMETRIC); v++)
                            run_ns(ref, v, algo, m, n, (const float(*)[3])c, norm_scale, in,
                                   out[(algo ? O_GPLAIN : O_PLAIN) + (ref ? 2 : v)]);
                blas_threads_set(2);
                for (int algo = NS_ALGO_STANDARD; algo <= NS_ALGO_GRAM; algo++)
                    for (int v = NS_VARIANT_PLAIN; v <= NS_VARIANT_SYMMETRIC; v++)
                        run_ns(0, v, algo, m, n, (const float(*)[3])c, norm_scale, in,
                               out[(algo ? O_GPLAIN2 : O_PLAIN2) + v]);
                blas_threads_set(1);
                for (int k = 0; k < o.n_cores; k++)
                    read_exact(child[k], out[O_CORE(k, 0)], sizeof(float) * 4 * count, o.cores[k]);
                double *r64 = malloc(sizeof(double) * count), col[N_COL];
                fp64_ns(in, m, n, (const float(*)[3])c, norm_scale, r64);
                columns(out, r64, count, o.n_cores, col);
                for (int j = 0; j < N_COL; j++)
                    cols[j][seed] = col[j];
                if (o.cases) {
                    printf("case %-6s %4d %5d seed %d", kind_names[kind], m, n, seed);
                    for (int j = 0; j < N_COL; j++)
                        printf(" %s %.3g", col_names[j], col[j]);
                    printf(
                        " gram-std/std-std %.3g gram-std/in-proc %.3g; fp64: plain %.3g sym %.3g "
                        "ref %.3g",
                        col[C_GRAM] / col[C_STDSTD], col[C_GRAM] / col[C_LOCAL],
                        rel64(out[O_PLAIN], r64, count), rel64(out[O_SYM], r64, count),
                        rel64(out[O_REF], r64, count));
                    for (int k = 0; k < o.n_cores; k++)
                        printf(" %s %.3g", o.cores[k], rel64(out[O_CORE(k, 0)], r64, count));
                    printf("\n");
                }
                free(r64);
                free(in);
                free(buf);
            }
            if (o.emit)
                continue;
            printf("%-6s %4d %5d", kind_names[kind], m, n);
            for (int j = 0; j < N_COL; j++) {
                double mx = cols[j][0];
                for (int i = 1; i < o.seeds; i++)
                    mx = fmax(mx, cols[j][i]);
                printf("   %7.2e/%7.2e", bench_median(cols[j], o.seeds), mx);
            }
            printf("\n");
            fflush(stdout);
        }
    }
    for (int k = 0; k < o.n_cores; k++)
        if (child[k] != NULL && pclose(child[k]) != 0)
            fprintf(stderr, "ns_floor: the %s child failed\n", o.cores[k]);
    return 0;
}

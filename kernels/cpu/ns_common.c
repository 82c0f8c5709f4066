#include "ns_common.h"

#include <math.h>
#include <string.h>

#include "../ns_coeffs.h"
#include "../ns_shape.h"
#include "cpu_kernels.h"

/* Edge of the tiles the transposing load and store go through: 64x64 fp32 (16 KiB) fits L1. */
#define NS_TILE 64

size_t ns_workspace_floats(int64_t rows, int64_t cols)
{
    size_t m = (size_t)(rows < cols ? rows : cols);
    size_t n = (size_t)(rows < cols ? cols : rows);
    /* X, Y, A, B (standard); Gram's R, Z, Q, T take two m x m more than A, B */
    return ns_xyab_elems((int64_t)m, (int64_t)n) + 2 * m * m;
}

double ns_flops_per_iter(int64_t rows, int64_t cols)
{
    return ns_iter_flops((double)(rows < cols ? rows : cols), (double)(rows < cols ? cols : rows));
}

double ns_flops_total_for(int64_t rows, int64_t cols, const float (*coeffs)[3], int steps,
                          int algorithm, int symmetric, int compute)
{
    const double m = (double)(rows < cols ? rows : cols);
    const double n = (double)(rows < cols ? cols : rows);
    const int gram = algorithm == NS_ALGO_GRAM;
    return ns_flops_count(m, n, steps, gram,
                          gram ? ns_coeffs_gram_restarts_for(coeffs, steps, rows, cols, compute)
                               : 0u,
                          symmetric ? 0.5 : 1.0);
}

double ns_flops_total(int64_t rows, int64_t cols, const float (*coeffs)[3], int steps,
                      int algorithm, int symmetric)
{
    return ns_flops_total_for(rows, cols, coeffs, steps, algorithm, symmetric, KDT_BF16);
}

void ns_sym_blocks_for(int64_t rows, int64_t cols, int variant, int block, int compute,
                       struct ns_sym_blocks *b)
{
    const int64_t m = rows < cols ? rows : cols;
    if (variant != NS_VARIANT_SYMMETRIC)
        *b = (struct ns_sym_blocks){m, m, m};
    else if (compute == KDT_BF16)
        *b = (struct ns_sym_blocks){block, block, block};
    else
        *b = (struct ns_sym_blocks){1, 1, NS_SYMMUL_BLOCK};
}

/* Entries of the upper block rows of an m x m product formed in block rows of `block` rows: q
 * whole blocks, row block i computing m - i * block columns, then the r = m - q * block rows
 * left, r columns each (block 1: m (m + 1) / 2; block >= m: m^2). */
static double ns_sym_entries(double m, int64_t block)
{
    if (block <= 0 || (double)block >= m)
        return m * m;
    const double bk = (double)block, q = floor(m / bk), r = m - q * bk;
    return bk * q * m - bk * bk * q * (q - 1.0) / 2.0 + r * r;
}

double ns_flops_performed(int64_t rows, int64_t cols, int steps, int algorithm, uint32_t restarts,
                          const struct ns_sym_blocks *b)
{
    const double m = (double)(rows < cols ? rows : cols);
    const double n = (double)(rows < cols ? cols : rows);
    const double xxt = 2.0 * n * ns_sym_entries(m, b != NULL ? b->gram : 0); /* X X^T */
    const double rr = 2.0 * m * ns_sym_entries(m, b != NULL ? b->poly : 0);  /* A A, R R */
    const double zrz = 2.0 * m * ns_sym_entries(m, b != NULL ? b->symmul : 0);

    if (algorithm != NS_ALGO_GRAM)
        return steps * (xxt + rr + 2.0 * m * m * n); /* and Y = B X */
    double f = 0.0;
    for (int lo = 0, hi; lo < steps; lo = hi) { /* segments between restarts (bit k: before k) */
        for (hi = lo + 1; hi < steps && !(restarts >> hi & 1u); hi++) {
        }
        f += xxt + 2.0 * m * m * n; /* G, and X <- Q X at the segment's end */
        for (int s = lo; s < hi; s++)
            f += rr + (s > lo ? 2.0 * m * m * m : 0.0)         /* Z Q, whole */
                 + (s + 1 < hi ? 2.0 * m * m * m + zrz : 0.0); /* Z R whole, then (Z R) Z */
    }
    return f;
}

int ns_gram_guard_ok(const void *x, int dt, int64_t m, int64_t n, const struct ns_args *a)
{
    return ns_coeffs_output_norm_ok(a->coeffs, a->steps, a->norm_scale, m,
                                    cpu_sumsq(NULL, x, dt, (size_t)(m * n)));
}

void ns_aol_scale(int64_t m, int64_t n, double eps, float *x, float *A, double *d)
{
    for (int64_t i = 0; i < m; i++) {
        double s = 0.0;
        for (int64_t j = 0; j < m; j++)
            s += fabs((double)A[i * m + j]);
        d[i] = 1.0 / sqrt(s + eps);
    }
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < m; i++) {
        for (int64_t j = 0; j < n; j++)
            x[i * n + j] = (float)(x[i * n + j] * d[i]);
        for (int64_t j = 0; j < m; j++)
            A[i * m + j] = (float)(A[i * m + j] * (d[i] * d[j]));
    }
}

static void ns_load_scaled(const void *in, int dt, size_t base, size_t count, double inv, float *x)
{
    if (dt == KDT_F32) {
        const float *p = (const float *)in + base;
        for (size_t i = 0; i < count; i++)
            x[i] = (float)(p[i] * inv);
    } else {
        const uint16_t *p = (const uint16_t *)in + base;
        for (size_t i = 0; i < count; i++)
            x[i] = (float)(f32_from_bf16(p[i]) * inv);
    }
}

/* x (cols x rows) <- scaled transpose of the stored rows x cols matrix, one tile at a time:
 * rows of the input are read along their length into the tile, columns of the tile are written
 * out as rows of x. For a 4096 x 1408 fp32 matrix, load + store took 76 ms element by element
 * (a tenth of the symmetric Newton-Schulz call) and take 15 ms through tiles. */
static void ns_load_scaled_transposed(const struct ns_args *a, size_t base, double inv, float *x)
{
    float tile[NS_TILE][NS_TILE];
    const int64_t rows = a->rows, cols = a->cols;

    for (int64_t r0 = 0; r0 < rows; r0 += NS_TILE) {
        const int64_t r1 = r0 + NS_TILE < rows ? r0 + NS_TILE : rows;
        for (int64_t c0 = 0; c0 < cols; c0 += NS_TILE) {
            const int64_t c1 = c0 + NS_TILE < cols ? c0 + NS_TILE : cols;
            for (int64_t r = r0; r < r1; r++)
                for (int64_t c = c0; c < c1; c++)
                    tile[c - c0][r - r0] =
                        (float)(kload(a->in, a->in_dtype, base + (size_t)(r * cols + c)) * inv);
            for (int64_t c = c0; c < c1; c++)
                memcpy(x + c * rows + r0, tile[c - c0], sizeof(float) * (size_t)(r1 - r0));
        }
    }
}

void ns_load_normalized(const struct ns_args *a, int64_t k, float *x)
{
    const size_t count = (size_t)(a->rows * a->cols);
    const size_t es = kdtype_size(a->in_dtype);
    /* the shared sum of squares: a fixed order of double lanes, independent of threads */
    const double ss =
        cpu_sumsq(NULL, (const char *)a->in + (size_t)k * count * es, a->in_dtype, count);
    ns_load_with_inv(a, k, 1.0 / (sqrt(ss) * (double)a->norm_scale + (double)a->eps), x);
}

void ns_load_with_inv(const struct ns_args *a, int64_t k, double inv, float *x)
{
    const size_t count = (size_t)(a->rows * a->cols);
    const size_t base = (size_t)k * count;

    if (a->transpose)
        ns_load_scaled_transposed(a, base, inv, x);
    else
        ns_load_scaled(a->in, a->in_dtype, base, count, inv, x);
}

static void ns_store_row(void *out, int dt, size_t i, const float *v, size_t count)
{
    if (dt == KDT_BF16) {
        uint16_t *p = (uint16_t *)out + i;
        for (size_t j = 0; j < count; j++)
            p[j] = bf16_from_f32(v[j]);
    } else {
        memcpy((float *)out + i, v, sizeof(float) * count);
    }
}

/* The stored rows x cols matrix <- transpose of x (cols x rows), through tiles as the load. */
static void ns_store_transposed(const struct ns_args *a, size_t base, const float *x)
{
    float tile[NS_TILE][NS_TILE];
    const int64_t rows = a->rows, cols = a->cols;

    for (int64_t r0 = 0; r0 < rows; r0 += NS_TILE) {
        const int64_t r1 = r0 + NS_TILE < rows ? r0 + NS_TILE : rows;
        for (int64_t c0 = 0; c0 < cols; c0 += NS_TILE) {
            const int64_t c1 = c0 + NS_TILE < cols ? c0 + NS_TILE : cols;
            for (int64_t c = c0; c < c1; c++)
                for (int64_t r = r0; r < r1; r++)
                    tile[r - r0][c - c0] = x[c * rows + r];
            for (int64_t r = r0; r < r1; r++)
                ns_store_row(a->out, a->out_dtype, base + (size_t)(r * cols + c0), tile[r - r0],
                             (size_t)(c1 - c0));
        }
    }
}

/* Lower triangle <- transpose of the upper one, for elements of type T. Each tile goes through a
 * buffer so that both the reads and the writes run along rows: a direct strided copy walks a
 * column at a stride of m elements, which for m = 2048 fp32 lands every line in the same L1 set
 * (4.4 ms per mirror at m = 2048, against 2.1 ms buffered). Tile rows write disjoint lower rows,
 * so threads split them. One body, instantiated per element type: a version on memcpy of `es`
 * bytes made the bf16 symmetric Newton-Schulz 4 % slower at 1024^2. */
#define NS_MIRROR_UPPER(name, T)                                                                   \
    static void name(T *S, int64_t m)                                                              \
    {                                                                                              \
        _Pragma("omp parallel for schedule(dynamic, 1)") for (int64_t i0 = 0; i0 < m;              \
                                                              i0 += NS_TILE)                       \
        {                                                                                          \
            T tile[NS_TILE][NS_TILE];                                                              \
            const int64_t i1 = i0 + NS_TILE < m ? i0 + NS_TILE : m;                                \
            for (int64_t j0 = 0; j0 <= i0; j0 += NS_TILE) {                                        \
                const int64_t j1 = j0 + NS_TILE < m ? j0 + NS_TILE : m;                            \
                for (int64_t j = j0; j < j1; j++) /* upper entries only: lower ones are stale */   \
                    for (int64_t i = j + 1 > i0 ? j + 1 : i0; i < i1; i++)                         \
                        tile[i - i0][j - j0] = S[j * m + i];                                       \
                for (int64_t i = i0; i < i1; i++)                                                  \
                    for (int64_t j = j0; j < j1 && j < i; j++)                                     \
                        S[i * m + j] = tile[i - i0][j - j0];                                       \
            }                                                                                      \
        }                                                                                          \
    }

NS_MIRROR_UPPER(mirror_upper_16, uint16_t)
NS_MIRROR_UPPER(mirror_upper_32, uint32_t)

void ns_mirror_upper(void *S, int64_t m, size_t es)
{
    if (es == 2)
        mirror_upper_16(S, m);
    else
        mirror_upper_32(S, m); /* fp32 moved as its bits */
}

void ns_store_output(const struct ns_args *a, int64_t k, const float *x)
{
    const size_t count = (size_t)(a->rows * a->cols);
    const size_t base = (size_t)k * count;

    if (a->transpose)
        ns_store_transposed(a, base, x);
    else
        ns_store_row(a->out, a->out_dtype, base, x, count);
}

int ns_run_batch(const struct kernel_ctx *ctx, const struct ns_args *a,
                 const struct ns_workspace *ws, ns_iter_fn iter)
{
    int64_t m, n;

    ns_work_shape(a, &m, &n);
    if (m > n || ws->floats < ns_workspace_floats(a->rows, a->cols))
        return -1;
    for (int64_t k = 0; k < a->batch; k++) {
        float *x = ws->buf;
        float *y = x + m * n;
        float *A = y + m * n;
        float *B = A + m * m;

        ns_load_normalized(a, k, x);
        for (int it = 0; it < a->steps; it++) {
            iter(ctx, m, n, a->coeffs[it], x, y, A, B);
            float *tmp = x;
            x = y;
            y = tmp;
        }
        ns_store_output(a, k, x);
    }
    return 0;
}

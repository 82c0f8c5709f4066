/* The CUDA backend's Newton-Schulz driver (kernels/cuda/ns_driver.h) run with host stand-ins
 * for cuBLAS and the CUDA kernels (ns_driver_host.cu): every shape class (square, wide, tall
 * through the transpose, odd sizes, a single row), batches, in-place, both dtypes in and out,
 * against the fp64 oracle within the bf16 tolerance of the GPU tests (relative Frobenius
 * <= 1.5e-2); batches split over a small workspace give the same bits; the workspace and
 * orientation contracts are enforced. What this cannot check is cuBLAS itself and the CUDA
 * kernels: tests/gpu/test_cuda_kernels.c does, where a GPU is present. */
#include "kernels/ns_coeffs.h"
#include "kernels/ops.h"
#include "ns_fp64.h"
#include "ns_test_util.h"
#include "test.h"

int ns_driver_host_run(const struct ns_args *a, void *ws, size_t ws_bytes, int *gemms,
                       int *mirrors);
size_t ns_driver_host_ws_bytes(int64_t rows, int64_t cols, int64_t batch);

/* The larger error, NaN winning: a NaN result must fail the check, not vanish in a max. */
static double worse(double a, double b) { return a != a || b != b ? NAN : a > b ? a : b; }

/* Whether every bf16 m x m matrix of the batch equals its transpose bit for bit. */
static int all_symmetric(const uint16_t *a, int64_t m, int64_t batch)
{
    for (int64_t z = 0; z < batch; z++)
        for (int64_t r = 0; r < m; r++)
            for (int64_t c = r + 1; c < m; c++)
                if (a[z * m * m + r * m + c] != a[z * m * m + c * m + r])
                    return 0;
    return 1;
}

/* One case: the driver against ns_fp64 matrix by matrix; returns the worst error. block > 0:
 * the symmetric variant with that many rows per block. The workspace starts as bf16 NaNs, so a
 * product that reads what no earlier step wrote fails the comparison. */
static double check_case_v(int64_t batch, int64_t rows, int64_t cols, int transpose, int in_dt,
                           int out_dt, int table, int steps, int64_t block)
{
    const struct coeffs t = coeffs_of(table, steps);
    const size_t one = (size_t)(rows * cols), count = (size_t)batch * one;
    double *u = malloc(sizeof(double) * count), *ref = malloc(sizeof(double) * one);
    void *in = ns_input(count, in_dt, (uint64_t)(rows * 131 + cols * 7 + batch), u);
    void *out = malloc(count * kdtype_size(out_dt));
    const size_t wsb = ns_driver_host_ws_bytes(rows, cols, batch);
    void *ws = malloc(wsb);
    struct ns_args a = ns_args_of(batch, rows, cols, &t, in, in_dt, out, out_dt);
    const int64_t m = rows < cols ? rows : cols, n = rows < cols ? cols : rows;
    const int64_t blocks = block > 0 ? (m + block - 1) / block : 1;
    int gemms = 0, mirrors = 0;
    double worst = 0;

    a.transpose = transpose;
    if (block > 0) {
        a.variant = NS_VARIANT_SYMMETRIC;
        a.block = (int)block;
    }
    memset(ws, 0xff, wsb);
    EXPECT_EQ_INT(ns_driver_host_run(&a, ws, wsb, &gemms, &mirrors), 0);
    /* the whole batch in one pass: 3 batched products a step, or one per block column for
     * X X^T and for A A; the two mirrors only when there is more than one block column */
    EXPECT_EQ_INT(gemms, (int)(steps * (blocks > 1 ? 2 * blocks + 1 : 3)));
    EXPECT_EQ_INT(mirrors, blocks > 1 ? 2 * steps : 0);
    if (blocks > 1) { /* the last step's A and B, mirrored: exactly symmetric */
        /* regions on 256-byte boundaries (ns_driver.h): X, Y, A, B */
        const size_t rxy = ((size_t)(batch * m * n) * 2 + 255) & ~(size_t)255,
                     rab = ((size_t)(batch * m * m) * 2 + 255) & ~(size_t)255;
        const uint16_t *A = (const uint16_t *)((const char *)ws + 2 * rxy);
        EXPECT_TRUE(all_symmetric(A, m, batch));
        EXPECT_TRUE(all_symmetric((const uint16_t *)((const char *)A + rab), m, batch));
    }
    for (int64_t k = 0; k < batch; k++) {
        ns_fp64(u + k * one, rows, cols, transpose, (const float(*)[3])t.c, t.steps, t.norm_scale,
                1e-8, ref);
        const double e =
            ns_rel_frobenius((const char *)out + k * one * kdtype_size(out_dt), out_dt, ref, one);
        worst = worse(worst, e);
    }
    if (!(worst <= 1.5e-2))
        fprintf(stderr, "  batch %lld, %lld x %lld: relative Frobenius error %.3e\n",
                (long long)batch, (long long)rows, (long long)cols, worst);
    EXPECT_TRUE(worst <= 1.5e-2);
    free(u);
    free(ref);
    free(in);
    free(out);
    free(ws);
    return worst;
}

static double check_case_t(int64_t batch, int64_t rows, int64_t cols, int transpose, int in_dt,
                           int out_dt, int table, int steps)
{
    return check_case_v(batch, rows, cols, transpose, in_dt, out_dt, table, steps, 0);
}

static double check_case(int64_t batch, int64_t rows, int64_t cols, int in_dt, int out_dt,
                         int table, int steps)
{
    return check_case_t(batch, rows, cols, rows > cols, in_dt, out_dt, table, steps);
}

TEST(ns_driver_matches_fp64_every_shape_class)
{
    double worst = 0, e;
    /* square, wide, tall (transposed), odd, one row; quintic (the default, the table the
     * tolerance is stated for) and polar_express */
    e = check_case(1, 32, 32, KDT_F32, KDT_F32, NS_TABLE_QUINTIC, 5);
    worst = worse(worst, e);
    e = check_case(3, 24, 40, KDT_BF16, KDT_BF16, NS_TABLE_QUINTIC, 5);
    worst = worse(worst, e);
    e = check_case(2, 40, 24, KDT_BF16, KDT_F32, NS_TABLE_QUINTIC, 5);
    worst = worse(worst, e);
    e = check_case(2, 7, 13, KDT_F32, KDT_BF16, NS_TABLE_QUINTIC, 5);
    worst = worse(worst, e);
    e = check_case(1, 1, 33, KDT_F32, KDT_F32, NS_TABLE_QUINTIC, 5);
    worst = worse(worst, e);
    e = check_case(1, 50, 3, KDT_BF16, KDT_BF16, NS_TABLE_POLAR_EXPRESS, 8);
    worst = worse(worst, e);
    /* a square matrix registered transposed works on its transpose (sharding/layout.c) */
    e = check_case_t(2, 24, 24, 1, KDT_F32, KDT_F32, NS_TABLE_QUINTIC, 5);
    worst = worse(worst, e);
    printf("  worst relative Frobenius error vs fp64: %.3e\n", worst);
}

/* The symmetric variant (block lower triangles of A and B, mirrored): within the same bound of
 * fp64 for even and uneven block columns, a block of one row, wide and tall shapes, batches;
 * a block as large as m runs the plain products. */
TEST(ns_driver_symmetric_variant_matches_fp64)
{
    double worst = 0, e;
    e = check_case_v(1, 32, 32, 0, KDT_F32, KDT_F32, NS_TABLE_QUINTIC, 5, 8);
    worst = worse(worst, e);
    e = check_case_v(3, 24, 40, 0, KDT_BF16, KDT_BF16, NS_TABLE_QUINTIC, 5, 10); /* 10, 10, 4 */
    worst = worse(worst, e);
    e = check_case_v(2, 40, 24, 1, KDT_BF16, KDT_F32, NS_TABLE_QUINTIC, 5, 7);
    worst = worse(worst, e);
    e = check_case_v(1, 13, 29, 0, KDT_F32, KDT_F32, NS_TABLE_POLAR_EXPRESS, 8, 1);
    worst = worse(worst, e);
    e = check_case_v(2, 24, 24, 1, KDT_F32, KDT_F32, NS_TABLE_QUINTIC, 5, 12);
    worst = worse(worst, e);
    e = check_case_v(1, 16, 48, 0, KDT_F32, KDT_F32, NS_TABLE_QUINTIC, 5, 16); /* one block */
    worst = worse(worst, e);
    printf("  worst relative Frobenius error vs fp64: %.3e\n", worst);
}

/* A workspace for one matrix runs a batch of 3 in three passes with the same bits; in == out
 * works; a workspace too small for one matrix, or a transpose flag that disagrees with the
 * shape, is refused. */
TEST(ns_driver_chunks_in_place_and_refusals)
{
    const struct coeffs t = coeffs_of(NS_TABLE_QUINTIC, 5);
    const int64_t batch = 3, rows = 20, cols = 36;
    const size_t count = (size_t)(batch * rows * cols);
    double *u = malloc(sizeof(double) * count);
    float *in = ns_input(count, KDT_F32, 11, u);
    float *full = malloc(count * sizeof(float)), *split = malloc(count * sizeof(float));
    float *inplace = malloc(count * sizeof(float));
    const size_t big = ns_driver_host_ws_bytes(rows, cols, batch);
    const size_t small = ns_driver_host_ws_bytes(rows, cols, 1);
    void *ws = malloc(big);
    int gemms = 0;

    struct ns_args a = ns_args_of(batch, rows, cols, &t, in, KDT_F32, full, KDT_F32);
    EXPECT_EQ_INT(ns_driver_host_run(&a, ws, big, &gemms, NULL), 0);
    EXPECT_EQ_INT(gemms, 3 * 5);
    a.out = split;
    EXPECT_EQ_INT(ns_driver_host_run(&a, ws, small, &gemms, NULL), 0);
    EXPECT_EQ_INT(gemms, 3 * 3 * 5); /* three passes of one matrix */
    EXPECT_EQ_INT(memcmp(full, split, count * sizeof(float)), 0);
    memcpy(inplace, in, count * sizeof(float));
    a.in = inplace;
    a.out = inplace;
    EXPECT_EQ_INT(ns_driver_host_run(&a, ws, big, NULL, NULL), 0);
    EXPECT_EQ_INT(memcmp(full, inplace, count * sizeof(float)), 0);

    a.in = in;
    a.out = split;
    EXPECT_EQ_INT(ns_driver_host_run(&a, ws, small - 1, NULL, NULL), -1);
    a.transpose = 1; /* 20 x 36 is wide: working on its transpose would be the wrong side */
    EXPECT_EQ_INT(ns_driver_host_run(&a, ws, big, NULL, NULL), -1);
    a.transpose = 0;
    a.variant = 7; /* no such variant */
    EXPECT_EQ_INT(ns_driver_host_run(&a, ws, big, NULL, NULL), -1);
    free(u);
    free(in);
    free(full);
    free(split);
    free(inplace);
    free(ws);
}

/* ---- the cuBLASLt plan cache over a real model's products ----
 * One rank's Newton-Schulz calls in a glm45-air step (bench/presets/glm45-air.json, ep 8: 16
 * experts of each stack per rank, run as one batch), layer after layer, through the driver's
 * products and ns_cuda.cu's plan keys (lt_key_make on the products' workspace addresses). */
#include "kernels/cuda/lt_plan_cache.h"
int ns_driver_host_plans(const struct ns_args *a, void *ws, size_t ws_bytes, struct lt_slots *t,
                         int shapes_only);

struct glm_matrix {
    int64_t rows, cols, batch;
};

/* Per MoE layer: q, k, v, o; the router; the shared expert's gate, up, down; the expert
 * stacks' gate, up, down. The first (dense) layer has the dense MLP in place of the last seven. */
static const struct glm_matrix glm_moe_layer[] = {
    {12288, 4096, 1}, {1024, 4096, 1},  {1024, 4096, 1}, {4096, 12288, 1},
    {128, 4096, 1},   {1408, 4096, 1},  {1408, 4096, 1}, {4096, 1408, 1},
    {1408, 4096, 16}, {1408, 4096, 16}, {4096, 1408, 16}};
static const struct glm_matrix glm_dense_layer[] = {
    {12288, 4096, 1}, {1024, 4096, 1},  {1024, 4096, 1}, {4096, 12288, 1},
    {10944, 4096, 1}, {10944, 4096, 1}, {4096, 10944, 1}};

/* One step: 46 layers, the first dense; every matrix's Newton-Schulz through the plan table. */
static void glm_step(int variant, struct lt_slots *t, void *ws, size_t ws_bytes, int shapes_only)
{
    static const float coeffs[5][3] = {{3.4445f, -4.7750f, 2.0315f},
                                       {3.4445f, -4.7750f, 2.0315f},
                                       {3.4445f, -4.7750f, 2.0315f},
                                       {3.4445f, -4.7750f, 2.0315f},
                                       {3.4445f, -4.7750f, 2.0315f}};
    const int nmoe = (int)(sizeof glm_moe_layer / sizeof *glm_moe_layer),
              ndense = (int)(sizeof glm_dense_layer / sizeof *glm_dense_layer);
    for (int layer = 0; layer < 46; layer++)
        for (int i = 0; i < (layer == 0 ? ndense : nmoe); i++) {
            const struct glm_matrix *g = layer == 0 ? &glm_dense_layer[i] : &glm_moe_layer[i];
            const int64_t m = g->rows < g->cols ? g->rows : g->cols;
            struct ns_args a = {0};
            a.batch = g->batch;
            a.rows = g->rows;
            a.cols = g->cols;
            a.transpose = g->rows > g->cols;
            a.in_dtype = a.out_dtype = KDT_BF16;
            a.coeffs = coeffs;
            a.steps = 5;
            /* the symmetric variant's blocks as the CPU's bf16 table has them
             * (ns_variant_table.c); under 384 rows the plain variant */
            a.variant = m < 384 ? NS_VARIANT_PLAIN : variant;
            a.block = m > 1024 ? 256 : 128;
            EXPECT_EQ_INT(ns_driver_host_plans(&a, ws, ws_bytes, t, shapes_only), 0);
        }
}

/* Every product's plan is built once, in the first step: one per distinct product (X and Y,
 * which swap each iteration, share a key), and every step's products fit the table, so the
 * later steps build none (an LRU table smaller than a step's products misses every time). */
TEST(lt_plans_of_a_glm45_air_step_are_built_once)
{
    static struct lt_slots t, shapes; /* zeroed: empty */
    const int nmoe = (int)(sizeof glm_moe_layer / sizeof *glm_moe_layer),
              ndense = (int)(sizeof glm_dense_layer / sizeof *glm_dense_layer);
    /* one workspace for every call, sized for the largest, at a cudaMalloc-like address */
    size_t ws_bytes = 0;
    for (int i = 0; i < nmoe + ndense; i++) {
        const struct glm_matrix *g = i < nmoe ? &glm_moe_layer[i] : &glm_dense_layer[i - nmoe];
        const size_t b = ns_driver_host_ws_bytes(g->rows, g->cols, g->batch);
        ws_bytes = b > ws_bytes ? b : ws_bytes;
    }
    void *ws = (void *)(uintptr_t)0x7f0000000000ull;

    for (int variant = NS_VARIANT_PLAIN; variant <= NS_VARIANT_SYMMETRIC; variant++) {
        memset(&t, 0, sizeof t);
        memset(&shapes, 0, sizeof shapes);
        glm_step(variant, &shapes, ws, ws_bytes, 1); /* the distinct products, by shape */
        glm_step(variant, &t, ws, ws_bytes, 0);
        const uint64_t hits = t.hits;
        printf("  %s variant: %llu distinct products in a step, %llu plans built (%d slots)\n",
               variant == NS_VARIANT_PLAIN ? "plain" : "symmetric",
               (unsigned long long)shapes.misses, (unsigned long long)t.misses, LT_PLAN_SLOTS);
        EXPECT_EQ_INT((int)t.misses, (int)shapes.misses);
        EXPECT_TRUE(t.misses <= LT_PLAN_SLOTS);
        glm_step(variant, &t, ws, ws_bytes, 0);
        glm_step(variant, &t, ws, ws_bytes, 0);
        EXPECT_EQ_INT((int)t.misses, (int)shapes.misses); /* steps 2 and 3 built nothing */
        EXPECT_TRUE(t.hits > hits);
    }
}

/* Shapes whose matrices are not a multiple of 256 bytes (the tiny preset's 176 x 64 MLP and
 * 32 x 64 experts, odd sizes): X and Y, which swap every iteration, sit at addresses of
 * different alignment unless the driver starts each region on a 256-byte boundary, and then
 * every product that reads X or writes Y had two plans, one per parity of the iteration. */
TEST(lt_plans_do_not_alternate_between_x_and_y)
{
    static struct lt_slots t, shapes;
    static const float coeffs[5][3] = {{3.4445f, -4.7750f, 2.0315f},
                                       {3.4445f, -4.7750f, 2.0315f},
                                       {3.4445f, -4.7750f, 2.0315f},
                                       {3.4445f, -4.7750f, 2.0315f},
                                       {3.4445f, -4.7750f, 2.0315f}};
    const struct glm_matrix odd[] = {{176, 64, 1},  {64, 176, 1},    {32, 64, 3},
                                     {100, 300, 1}, {1000, 1500, 1}, {390, 777, 2}};
    void *ws = (void *)(uintptr_t)0x7f0000000000ull;
    for (int variant = NS_VARIANT_PLAIN; variant <= NS_VARIANT_SYMMETRIC; variant++)
        for (int i = 0; i < (int)(sizeof odd / sizeof *odd); i++) {
            const struct glm_matrix *g = &odd[i];
            struct ns_args a = {0};
            a.batch = g->batch;
            a.rows = g->rows;
            a.cols = g->cols;
            a.transpose = g->rows > g->cols;
            a.in_dtype = a.out_dtype = KDT_BF16;
            a.coeffs = coeffs;
            a.steps = 5;
            a.variant = variant;
            a.block = 128;
            const size_t wsb = ns_driver_host_ws_bytes(g->rows, g->cols, g->batch);
            EXPECT_EQ_INT(ns_driver_host_plans(&a, ws, wsb, &shapes, 1), 0);
            EXPECT_EQ_INT(ns_driver_host_plans(&a, ws, wsb, &t, 0), 0);
            EXPECT_EQ_INT((int)t.misses, (int)shapes.misses);
        }
}

/* The CUDA backend's cuBLASLt plan cache over a real model's products, through the Newton-Schulz
 * driver's host stand-in (ns_driver_host.cu; linked into test_ns_driver, whose other cases are
 * tests/unit/test_ns_driver.c). One rank's Newton-Schulz calls in a glm45-air step
 * (bench/presets/glm45-air.json, ep 8: 16 experts of each stack per rank, run as one batch), layer
 * after layer, through the driver's products and ns_cuda.cu's plan keys (lt_key_make on the
 * products' workspace addresses). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/lt_plan_cache.h"
#include "kernels/ops.h"
#include "test.h"

size_t ns_driver_host_ws_bytes(int64_t rows, int64_t cols, int64_t batch);
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

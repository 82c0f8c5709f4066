/* Helpers the Newton-Schulz tests share: a coefficient table in use, inputs whose stored values
 * the fp64 oracle sees exactly, and the relative Frobenius error against it. */
#ifndef SHARDOPT_TEST_NS_TEST_UTIL_H
#define SHARDOPT_TEST_NS_TEST_UTIL_H

#include <math.h>
#include <stdlib.h>

#include "kernels/ns_coeffs.h"
#include "kernels/ops.h"
#include "test.h"

struct coeffs {
    float c[NS_TABLE_MAX_STEPS][3];
    int steps;
    float norm_scale;
};

static inline struct coeffs coeffs_of(int table, int steps)
{
    struct coeffs t = {.steps = steps, .norm_scale = (float)ns_coeffs_default_norm_scale(table)};
    ns_coeffs_fill(table, steps, NULL, t.c);
    return t;
}

/* A user's table (ns_coeffs = custom): jordan's triple 5 times, then two steps of the classic
 * quintic (15/8, -10/8, 3/8), which pull jordan's band [0.7, 1.2] in to 1. */
static inline struct coeffs custom_table(void)
{
    static const double c[7][3] = {
        {3.4445, -4.7750, 2.0315}, {3.4445, -4.7750, 2.0315}, {3.4445, -4.7750, 2.0315},
        {3.4445, -4.7750, 2.0315}, {3.4445, -4.7750, 2.0315}, {1.875, -1.25, 0.375},
        {1.875, -1.25, 0.375},
    };
    struct coeffs t = {.steps = 7, .norm_scale = 1.0f};
    ns_coeffs_fill(NS_TABLE_CUSTOM, 7, c, t.c);
    return t;
}

/* A batch of rows x cols matrices through table t, on the wide side (transpose = rows > cols),
 * plain variant, eps 1e-8, bf16 products; callers change what their case needs. */
static inline struct ns_args ns_args_of(int64_t batch, int64_t rows, int64_t cols,
                                        const struct coeffs *t, const void *in, int in_dt,
                                        void *out, int out_dt)
{
    return (struct ns_args){.batch = batch,
                            .rows = rows,
                            .cols = cols,
                            .transpose = rows > cols,
                            .in = in,
                            .in_dtype = in_dt,
                            .out = out,
                            .out_dtype = out_dt,
                            .coeffs = (const float(*)[3])t->c,
                            .steps = t->steps,
                            .norm_scale = t->norm_scale,
                            .eps = 1e-8f,
                            .variant = NS_VARIANT_PLAIN,
                            .compute = KDT_BF16};
}

/* count values uniform in (-1, 1) stored as dt; u64 (may be NULL) gets the stored values. */
static inline void *ns_input(size_t count, int dt, uint64_t seed, double *u64)
{
    void *p = malloc(count * kdtype_size(dt));
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < count; i++) {
        const float v = (float)test_rand(&s);
        if (dt == KDT_BF16)
            ((uint16_t *)p)[i] = bf16_from_f32(v);
        else
            ((float *)p)[i] = v;
        if (u64 != NULL)
            u64[i] = kload(p, dt, i);
    }
    return p;
}

/* |x - ref|_F / |ref|_F for count elements of x (dtype dt). */
static inline double ns_rel_frobenius(const void *x, int dt, const double *ref, size_t count)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < count; i++) {
        const double d = kload(x, dt, i) - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    return sqrt(num / den);
}

#endif

/* Helpers the Newton-Schulz tests share: a coefficient table in use, inputs whose stored values
 * the fp64 oracle sees exactly, and the relative Frobenius error against it. */
#ifndef SHARDOPT_TEST_NS_TEST_UTIL_H
#define SHARDOPT_TEST_NS_TEST_UTIL_H

#include <math.h>
#include <stdlib.h>

#include "kernels/ns_coeffs.h"
#include "kernels/ops.h"
#include "ns_singular.h"
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

/* A coefficient table as the tests name one: a table, its steps and its preconditioning. */
struct ns_table_case {
    int table, steps, precondition;
    const char *name;
};

/* Every table at the step counts the docs state bounds for, and a user's (custom_table): the
 * Gram tests' list (test_ns_gram for fp32, test_ns_driver for the driver's bf16). */
static const struct ns_table_case ns_every_table[] = {
    {NS_TABLE_QUINTIC, 5, NS_PRECOND_FROBENIUS, "quintic"},
    {NS_TABLE_JORDAN, 5, NS_PRECOND_FROBENIUS, "jordan"},
    {NS_TABLE_POLAR_EXPRESS, 8, NS_PRECOND_FROBENIUS, "polar_express"},
    {NS_TABLE_POLAR_EXPRESS, 5, NS_PRECOND_FROBENIUS, "polar_express 5"},
    {NS_TABLE_AOL, 4, NS_PRECOND_AOL, "aol"},
    {NS_TABLE_CUSTOM, 7, NS_PRECOND_FROBENIUS, "custom"},
};

/* The tables bf16 Gram diverged with on small wide matrices of spread spectra before its
 * restarts (test_xcheck's finds; spread_spectrum_matrix): the CPU bf16 path (test_ns_bf16) and
 * the CUDA driver (test_ns_driver) are held to one bound on the same list. */
static const struct ns_table_case ns_spread_tables[] = {
    {NS_TABLE_QUINTIC, 5, NS_PRECOND_FROBENIUS, "quintic"},
    {NS_TABLE_JORDAN, 5, NS_PRECOND_FROBENIUS, "jordan"},
    {NS_TABLE_POLAR_EXPRESS, 5, NS_PRECOND_FROBENIUS, "polar_express 5"},
    {NS_TABLE_POLAR_EXPRESS, 6, NS_PRECOND_FROBENIUS, "polar_express 6"},
    {NS_TABLE_POLAR_EXPRESS, 8, NS_PRECOND_FROBENIUS, "polar_express"},
    {NS_TABLE_AOL, 4, NS_PRECOND_AOL, "aol"},
    {NS_TABLE_QUINTIC, 5, NS_PRECOND_AOL, "quintic + aol"},
};

/* The coefficients of a case: custom_table() for NS_TABLE_CUSTOM, else the library's table. */
static inline struct coeffs ns_case_coeffs(const struct ns_table_case *c)
{
    return c->table == NS_TABLE_CUSTOM ? custom_table() : coeffs_of(c->table, c->steps);
}

/* dst <- an R x C matrix (row-major; a tall one as the transpose of a wide one) whose singular
 * values are 1, 1e-4 and the rest log-uniform between them, drawn from *s; its singular vectors
 * from seed *s + salt taken after the draws. sv (min(R, C) doubles) and w (R * C floats) are
 * scratch. */
static inline void spread_spectrum_matrix(float *dst, int64_t R, int64_t C, uint64_t *s,
                                          uint64_t salt, double *sv, float *w)
{
    const int64_t m = R < C ? R : C, n = R + C - m;
    for (int64_t i = 0; i < m; i++)
        sv[i] = i == 0 ? 1.0 : i == 1 ? 1e-4 : pow(1e-4, 0.5 * (test_rand(s) + 1.0));
    matrix_with_singular_values(w, (int)m, (int)n, sv, *s + salt);
    for (int64_t r = 0; r < R; r++)
        for (int64_t q = 0; q < C; q++)
            dst[r * C + q] = R <= C ? w[r * C + q] : w[q * R + r];
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

/* The fp64 reference of test_xcheck: Muon and AdamW on whole global tensors, written from
 * docs/design.md (Update rules) and docs/config.md (Update rules, the coefficient tables), with
 * none of the library's code. Storage roundings the docs promise (momentum, exp_avg and
 * exp_avg_sq, U and O in comm_dtype, bf16 parameters) are applied to nearest; everything between
 * them is double. Newton-Schulz is the standard iteration in double: Gram and AOL's reuse of the
 * first XX^T are the same polynomial in exact arithmetic (docs/design.md, Gram Newton-Schulz). */
#ifndef SHARDOPT_TEST_XCHECK_REF_H
#define SHARDOPT_TEST_XCHECK_REF_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ns_fp64.h"
#include "shardopt.h"

/* The tables of docs/config.md; aol's values from kernels/ns_coeffs.c (data, not code). */
static const double xref_quintic[5][3] = {{4.0848, -6.8946, 2.9270},
                                          {3.9505, -6.3029, 2.6377},
                                          {3.7418, -5.5913, 2.3037},
                                          {2.8769, -3.1427, 1.2046},
                                          {2.8366, -3.0525, 1.2012}};
static const double xref_jordan[1][3] = {{3.4445, -4.7750, 2.0315}};
static const double xref_polar[8][3] = {
    {8.2051604140, -22.9019349871, 16.4607249102}, {4.0663951599, -2.8611540868, 0.5183995227},
    {3.9095949044, -2.8233517350, 0.5250369769},   {3.2855640172, -2.4153019596, 0.4852940655},
    {2.2778732871, -1.6198217653, 0.3984807870},   {1.8725756513, -1.2307042575, 0.3585161621},
    {1.8564371098, -1.2132392819, 0.3567997894},   {1.875, -1.25, 0.375}};
static const double xref_aol[4][3] = {{4.5999, -8.2316, 3.7445},
                                      {4.1835, -6.0801, 2.2557},
                                      {4.1682, -5.7314, 2.0656},
                                      {2.8417, -2.9995, 0.9546}};

static inline double xref_bf16(double x)
{
    float f = (float)x;
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}

static inline double xref_round(double x, shardopt_dtype_t dt)
{
    return dt == SHARDOPT_DTYPE_BF16 ? xref_bf16(x) : (double)(float)x;
}

/* The (a, b, c) of step i: coefficients pass to the kernels as fp32 (docs/config.md). */
static inline void xref_coeffs(const shardopt_config_t *c, int i, double abc[3])
{
    const double *t;
    switch (c->ns_coeffs) {
    case SHARDOPT_NS_JORDAN: t = xref_jordan[0]; break;
    case SHARDOPT_NS_POLAR_EXPRESS: t = xref_polar[i]; break;
    case SHARDOPT_NS_AOL: t = xref_aol[i < 4 ? i : 3]; break;
    case SHARDOPT_NS_CUSTOM: t = c->ns_custom_coeffs[i]; break;
    default: t = xref_quintic[i < 5 ? i : 4]; break;
    }
    for (int j = 0; j < 3; j++)
        abc[j] = (float)t[j];
}

/* s in X = U / (|U|_F s + eps): the config's, or the table's own (docs/config.md). */
static inline double xref_norm_scale(const shardopt_config_t *c)
{
    return c->ns_norm_scale > 0                        ? c->ns_norm_scale
           : c->ns_coeffs == SHARDOPT_NS_POLAR_EXPRESS ? 1.01
                                                       : 1.0;
}

/* Newton-Schulz of the m x n matrix u (row-major, the true orientation), in place: the tests'
 * fp64 oracle (tests/ns_fp64.h) on the transpose of a tall matrix, with the config's table and
 * norm scale resolved as docs/config.md says. It reads all of u before it writes. */
static inline void xref_ns_at(const shardopt_config_t *c, int64_t m, int64_t n, double *u, double h,
                              double hb)
{
    float(*t)[3] = malloc(sizeof(float[3]) * (size_t)(c->ns_steps > 0 ? c->ns_steps : 1));
    for (int it = 0; it < c->ns_steps; it++) {
        double abc[3];
        xref_coeffs(c, it, abc);
        /* h: step 0 on (1 + h) X, after either scaling; hb: every step's B = b A + c A^2 times
         * (1 + hb) */
        for (int j = 0; j < 3; j++)
            t[it][j] = (float)(abc[j] * (it == 0 ? pow(1 + h, 2 * j + 1) : 1) * (j ? 1 + hb : 1));
    }
    const double s = xref_norm_scale(c);
    ns_fp64_pre(u, m, n, m > n, (const float(*)[3])t, c->ns_steps, s, c->ns_eps,
                c->ns_precondition == SHARDOPT_NS_PRECONDITION_AOL, u);
    free(t);
}

static inline void xref_ns(const shardopt_config_t *c, int64_t m, int64_t n, double *u)
{
    xref_ns_at(c, m, n, u, 0, 0);
}

static inline double xref_lr_scale(shardopt_lr_scale_t ls, double a, double b)
{
    switch (ls) {
    case SHARDOPT_LR_SCALE_SPECTRAL_NORM: return sqrt(a / b);
    case SHARDOPT_LR_SCALE_JORDAN: return sqrt(fmax(1.0, a / b));
    case SHARDOPT_LR_SCALE_NONE: return 1.0;
    default: return 0.2 * sqrt(fmax(a, b));
    }
}

/* One tensor's reference state. */
struct xref_tensor {
    int ndim, muon, transposed;
    int64_t shape[3], numel;
    shardopt_dtype_t dtype;
    double lr_mult, wd_mult;
    double *w, *m, *v; /* m: Muon momentum or exp_avg */
    /* the magnitude of m's terms (beta1 |m| + (1 - beta1) |g|, mu |M| + |G|, absolute values
     * carried as m is): an fp32 or bf16 recurrence's error scales with it, not with m, which
     * cancellation can make far smaller; NULL: not kept */
    double *ma;
    /* the magnitude of the weight's changes, summed over the steps: |W lr wd| + |the update| per
     * step. Weight decay and the update may cancel, leaving W - W0 far below what was rounded
     * along the way; NULL: not kept */
    double *ua;
    uint64_t step;
    /* > 0: also run each matrix's Newton-Schulz on X (1 +- sens_of_scale), X after its scaling
     * (Frobenius or aol, which would undo a change of s), and with every step's B = b A + c A^2
     * times (1 +- sens_of_scale), and keep in sens the largest relative Frobenius change of its
     * output over the steps: how much a relative perturbation of that size (a bf16 rounding of X
     * or of B is up to 2^-8) moves the result. The composed polynomial amplifies the first by its
     * derivative at the singular values; the second by |B| / |a + B| where a step cancels (at
     * sigma = 1 quintic's and the aol table's first steps keep 0.117 and 0.113 of terms near 4) */
    double sens_of_scale, sens;
    /* 1: also run each matrix's Newton-Schulz on its input with every element moved by one bf16
     * ulp of its own, up or down (signs from a fixed hash), and keep the output's relative change
     * in sens when larger: what a stochastically rounded momentum (up to an ulp from the nearest
     * rounding the reference takes, a different direction in every element) does. Scaling X
     * leaves the singular vectors alone; this moves them, by |dU| / (s_i + s_j) between singular
     * values s_i, s_j, which a square matrix with a small singular value makes large (test_xcheck
     * seed 400317 of test_xcheck_nccl: a 13 x 13 expert 0.189 off, sens from scaling 0.0069) */
    int sens_of_ulp;
};

/* One step of every tensor; g[p] the global gradients (already in the grad dtype), `lr`,
 * `adamw_lr`, `wd_arg` as in shardopt_step_args_t, `max_norm` clipping; c->momentum is the
 * step's mu (args.momentum). `skip` (NULL: none): the tensors without a gradient this step
 * (skip_missing_grads: unchanged, step count included, and out of the norm). */
static inline void xref_step(const shardopt_config_t *c, int np, struct xref_tensor *t,
                             double *const *g, double lr, double adamw_lr, double wd_arg,
                             double max_norm, const unsigned char *skip)
{
    double norm = 0;
    for (int p = 0; p < np; p++)
        for (int64_t i = 0; i < t[p].numel && !(skip != NULL && skip[p]); i++)
            norm += g[p][i] * g[p][i];
    norm = sqrt(norm);
    const double gs = max_norm > 0 && norm > max_norm ? (float)(max_norm / (norm + 1e-6)) : 1.0;
    for (int p = 0; p < np; p++) {
        struct xref_tensor *x = &t[p];
        if (skip != NULL && skip[p])
            continue;
        x->step++;
        if (!x->muon) {
            const double l = (adamw_lr >= 0 ? adamw_lr : lr) * x->lr_mult;
            const double wd = (x->ndim == 1 && !c->weight_decay_1d)
                                  ? 0.0
                                  : (wd_arg >= 0 ? wd_arg : c->adamw_weight_decay) * x->wd_mult;
            const double b1 = c->adamw_beta1, b2 = c->adamw_beta2, tt = (double)x->step;
            for (int64_t i = 0; i < x->numel; i++) {
                const double gi = g[p][i] * gs;
                x->m[i] = xref_round(b1 * x->m[i] + (1 - b1) * gi, c->adam_state_dtype);
                if (x->ma != NULL)
                    x->ma[i] = b1 * x->ma[i] + (1 - b1) * fabs(gi);
                x->v[i] = xref_round(b2 * x->v[i] + (1 - b2) * gi * gi, c->adam_v_dtype);
                const double upd = l / (1 - pow(b1, tt)) * x->m[i] /
                                   (sqrt(x->v[i]) / sqrt(1 - pow(b2, tt)) + c->adamw_eps);
                if (x->ua != NULL)
                    x->ua[i] += fabs(x->w[i] * l * wd) + fabs(upd);
                x->w[i] = xref_round(x->w[i] * (1 - l * wd) - upd, x->dtype);
            }
            continue;
        }
        const double l = lr * x->lr_mult;
        const double wd = (wd_arg >= 0 ? wd_arg : c->weight_decay) * x->wd_mult;
        const int rd = x->ndim - 2;
        const int64_t rows = x->shape[rd], cols = x->shape[rd + 1], per = rows * cols;
        const int64_t E = x->ndim == 3 ? x->shape[0] : 1;
        /* true [A, B] = [out, in] */
        const int64_t A = x->transposed ? cols : rows, B = x->transposed ? rows : cols;
        const double scale = xref_lr_scale(c->lr_scale, (double)A, (double)B);
        double *u = malloc(sizeof(double) * (size_t)per), *o = malloc(sizeof(double) * (size_t)per);
        double *o2 = malloc(sizeof(double) * (size_t)per),
               *o3 = malloc(sizeof(double) * (size_t)per);
        for (int64_t e = 0; e < E; e++) {
            double *M = x->m + e * per, *W = x->w + e * per;
            double *Ma = x->ma != NULL ? x->ma + e * per : NULL;
            const double *G = g[p] + e * per;
            for (int64_t i = 0; i < per; i++) {
                M[i] = xref_round(c->momentum * M[i] + G[i] * gs, c->momentum_dtype);
                if (Ma != NULL)
                    Ma[i] = c->momentum * Ma[i] + fabs(G[i] * gs);
                u[i] =
                    xref_round(c->nesterov ? G[i] * gs + c->momentum * M[i] : M[i], c->comm_dtype);
            }
            /* the true orientation: the transpose of a stored [in, out] matrix */
            for (int64_t i = 0; i < rows; i++)
                for (int64_t j = 0; j < cols; j++)
                    o[x->transposed ? j * rows + i : i * cols + j] = u[i * cols + j];
            if (x->sens_of_scale > 0 || x->sens_of_ulp)
                memcpy(o2, o, sizeof(double) * (size_t)per);
            xref_ns(c, A, B, o);
            for (int v = 0; v < 4 && x->sens_of_scale > 0; v++) {
                const double h = (v & 1 ? 1 : -1) * x->sens_of_scale;
                memcpy(o3, o2, sizeof(double) * (size_t)per);
                xref_ns_at(c, A, B, o3, v < 2 ? h : 0, v < 2 ? 0 : h);
                double dn = 0, on = 0;
                for (int64_t i = 0; i < per; i++) {
                    dn += (o3[i] - o[i]) * (o3[i] - o[i]);
                    on += o[i] * o[i];
                }
                if (on > 0 && sqrt(dn / on) > x->sens)
                    x->sens = sqrt(dn / on);
            }
            if (x->sens_of_ulp) {
                uint64_t hs = 0x9E3779B97F4A7C15ull * (uint64_t)(e + 1) + x->step;
                for (int64_t i = 0; i < per; i++) {
                    hs = hs * 6364136223846793005ull + 1442695040888963407ull;
                    const double a = fabs(o2[i]);
                    /* below fp32's normal range a bf16 ulp is 2^-133 whatever the value (a
                     * subnormal momentum, test_xcheck seed 453262: 1e-39 gradients, which
                     * ns_eps = FLT_MIN leaves an O(1) update; the relative ulp there gave sens
                     * 0.0084, the stochastic rounding 0.475) */
                    const double ulp = a > 0 ? fmax(ldexp(1.0, ilogb(a) - 7), 0x1p-133) : 0;
                    o3[i] = o2[i] + (hs >> 63 ? ulp : -ulp);
                }
                xref_ns(c, A, B, o3);
                double dn = 0, on = 0;
                for (int64_t i = 0; i < per; i++) {
                    dn += (o3[i] - o[i]) * (o3[i] - o[i]);
                    on += o[i] * o[i];
                }
                if (on > 0 && sqrt(dn / on) > x->sens)
                    x->sens = sqrt(dn / on);
            }
            for (int64_t i = 0; i < rows; i++)
                for (int64_t j = 0; j < cols; j++)
                    u[i * cols + j] = o[x->transposed ? j * rows + i : i * cols + j];
            for (int64_t i = 0; i < per; i++) {
                const double o_i = xref_round(u[i], c->comm_dtype);
                if (x->ua != NULL)
                    x->ua[e * per + i] += fabs(W[i] * l * wd) + fabs(l * scale * o_i);
                W[i] = xref_round(W[i] * (1 - l * wd) - l * scale * o_i, x->dtype);
            }
        }
        free(u);
        free(o);
        free(o2);
        free(o3);
    }
}

#endif

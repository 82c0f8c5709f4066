/* The fp64 Newton-Schulz oracle the tests share: the iteration of docs/design.md (Update rules)
 * with every product and the normalisation in double, no rounding in between. */
#ifndef SHARDOPT_TEST_NS_FP64_H
#define SHARDOPT_TEST_NS_FP64_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

/* out[i nq + j] = (c0 ? a c0[i nq + j] : 0.0) + sum_t p[i k + t] q[j k + t], t ascending, for the
 * np rows of p and the nq rows of q (k long); upper: only j >= i (and the rest of a tile), for a
 * symmetric result the caller mirrors. Formed in tiles of 2 x 4 (independent sums, so that no
 * single chain of additions limits the speed, each row read from cache for several): every
 * element is still the one sum, in the one order, the naive loop forms, so the result is bitwise
 * the naive loop's; it only runs faster (test_xcheck's large shapes). Not inlined: a caller's
 * constant shapes made GCC warn of overflowing iterations in the remainder loops it never runs. */
static __attribute__((noinline, unused)) void ns_fp64_dots(const double *p, int64_t np,
                                                           const double *q, int64_t nq, int64_t k,
                                                           int upper, const double *c0, double a,
                                                           double *out)
{
    int64_t i = 0;
    for (; i + 2 <= np; i += 2) {
        const double *p0 = p + i * k, *p1 = p0 + k;
        int64_t j = upper ? i : 0;
        for (; j + 4 <= nq; j += 4) {
            const double *q0 = q + j * k, *q1 = q0 + k, *q2 = q1 + k, *q3 = q2 + k;
            double *o0 = out + i * nq + j, *o1 = o0 + nq;
            double a00 = 0.0, a01 = 0.0, a02 = 0.0, a03 = 0.0;
            double a10 = 0.0, a11 = 0.0, a12 = 0.0, a13 = 0.0;
            if (c0 != NULL) {
                const double *c = c0 + i * nq + j;
                a00 = a * c[0];
                a01 = a * c[1];
                a02 = a * c[2];
                a03 = a * c[3];
                a10 = a * c[nq];
                a11 = a * c[nq + 1];
                a12 = a * c[nq + 2];
                a13 = a * c[nq + 3];
            }
            for (int64_t t = 0; t < k; t++) {
                const double x0 = p0[t], x1 = p1[t];
                a00 += x0 * q0[t];
                a01 += x0 * q1[t];
                a02 += x0 * q2[t];
                a03 += x0 * q3[t];
                a10 += x1 * q0[t];
                a11 += x1 * q1[t];
                a12 += x1 * q2[t];
                a13 += x1 * q3[t];
            }
            o0[0] = a00;
            o0[1] = a01;
            o0[2] = a02;
            o0[3] = a03;
            o1[0] = a10;
            o1[1] = a11;
            o1[2] = a12;
            o1[3] = a13;
        }
        for (; j < nq; j++)
            for (int64_t r = i; r < i + 2; r++) {
                double acc = c0 != NULL ? a * c0[r * nq + j] : 0.0;
                for (int64_t t = 0; t < k; t++)
                    acc += p[r * k + t] * q[j * k + t];
                out[r * nq + j] = acc;
            }
    }
    for (; i < np; i++) /* the last row of an odd np */
        for (int64_t j = upper ? i : 0; j < nq; j++) {
            double acc = c0 != NULL ? a * c0[i * nq + j] : 0.0;
            for (int64_t t = 0; t < k; t++)
                acc += p[i * k + t] * q[j * k + t];
            out[i * nq + j] = acc;
        }
}

/* out = p p^T for the m rows of p, k long: a symmetric product, the upper triangle mirrored (a
 * product of two rows is the same in either order, bit for bit). */
static inline void ns_fp64_rows_dot(const double *p, int64_t m, int64_t k, double *out)
{
    ns_fp64_dots(p, m, p, m, k, 1, NULL, 0.0, out);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = i + 1; j < m; j++)
            out[j * m + i] = out[i * m + j];
}

/* y = a x + B x (x m x n, B m x m): each element a x_ij first, then + B_ik x_kj for k ascending,
 * as dot products of B's rows with the columns of x (xt: m n doubles of scratch for x^T). */
static inline void ns_fp64_update(const double *B, const double *x, int64_t m, int64_t n, double a,
                                  double *xt, double *y)
{
    for (int64_t k = 0; k < m; k++)
        for (int64_t j = 0; j < n; j++)
            xt[j * m + k] = x[k * n + j];
    ns_fp64_dots(B, m, xt, n, m, 0, x, a, y);
}

/* o <- NS(u) for a rows x cols row-major matrix. Works on u^T when work_t (the caller decides:
 * tall matrices, or a transposed square one). X = u / (|u|_F * norm_scale + eps); with aol then
 * X_i <- d_i X_i, d_i = (sum_j |(X X^T)_ij| + eps)^(-1/2) (ns_precondition = aol, kernels/ops.h);
 * then per step A = X X^T, B = b A + c A A, X = a X + B X. Gram Newton-Schulz is this iteration
 * in exact arithmetic, so this is its oracle too. A = X X^T is symmetric bit for bit (each
 * element is the same sum of the same products), so A A is formed as dot products of A's rows. */
static inline void ns_fp64_pre(const double *u, int64_t rows, int64_t cols, int work_t,
                               const float (*coeffs)[3], int steps, double norm_scale, double eps,
                               int aol, double *o)
{
    const int64_t m = work_t ? cols : rows, n = work_t ? rows : cols;
    double *x = malloc(sizeof(double) * (size_t)(m * n));
    double *y = malloc(sizeof(double) * (size_t)(m * n));
    double *A = malloc(sizeof(double) * (size_t)(m * m));
    double *B = malloc(sizeof(double) * (size_t)(m * m));
    double *xt = malloc(sizeof(double) * (size_t)(m * n));
    double ss = 0.0;

    for (int64_t i = 0; i < rows * cols; i++)
        ss += u[i] * u[i];
    const double inv = 1.0 / (sqrt(ss) * norm_scale + eps);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            x[work_t ? c * n + r : r * n + c] = u[r * cols + c] * inv;
    if (aol) {
        ns_fp64_rows_dot(x, m, n, A);
        for (int64_t i = 0; i < m; i++) {
            double s = 0.0;
            for (int64_t j = 0; j < m; j++)
                s += fabs(A[i * m + j]);
            B[i] = 1.0 / sqrt(s + eps); /* B is free until the first step */
        }
        for (int64_t i = 0; i < m; i++)
            for (int64_t k = 0; k < n; k++)
                x[i * n + k] *= B[i];
    }

    for (int s = 0; s < steps; s++) {
        const double a = coeffs[s][0], b = coeffs[s][1], cc = coeffs[s][2];
        ns_fp64_rows_dot(x, m, n, A);
        ns_fp64_rows_dot(A, m, m, B); /* A A, A symmetric */
        for (int64_t i = 0; i < m * m; i++)
            B[i] = b * A[i] + cc * B[i];
        ns_fp64_update(B, x, m, n, a, xt, y);
        double *tmp = x;
        x = y;
        y = tmp;
    }
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            o[r * cols + c] = x[work_t ? c * n + r : r * n + c];
    free(x);
    free(y);
    free(A);
    free(B);
    free(xt);
}

static inline void ns_fp64(const double *u, int64_t rows, int64_t cols, int work_t,
                           const float (*coeffs)[3], int steps, double norm_scale, double eps,
                           double *o)
{
    ns_fp64_pre(u, rows, cols, work_t, coeffs, steps, norm_scale, eps, 0, o);
}

#endif

/* The fp64 Newton-Schulz oracle the tests share: the iteration of docs/design.md (Update rules)
 * with every product and the normalisation in double, no rounding in between. */
#ifndef SHARDOPT_TEST_NS_FP64_H
#define SHARDOPT_TEST_NS_FP64_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

/* o <- NS(u) for a rows x cols row-major matrix. Works on u^T when work_t (the caller decides:
 * tall matrices, or a transposed square one). X = u / (|u|_F * norm_scale + eps); with aol then
 * X_i <- d_i X_i, d_i = (sum_j |(X X^T)_ij| + eps)^(-1/2) (ns_precondition = aol, kernels/ops.h);
 * then per step A = X X^T, B = b A + c A A, X = a X + B X. Gram Newton-Schulz is this iteration
 * in exact arithmetic, so this is its oracle too. */
static inline void ns_fp64_pre(const double *u, int64_t rows, int64_t cols, int work_t,
                               const float (*coeffs)[3], int steps, double norm_scale, double eps,
                               int aol, double *o)
{
    const int64_t m = work_t ? cols : rows, n = work_t ? rows : cols;
    double *x = malloc(sizeof(double) * (size_t)(m * n));
    double *y = malloc(sizeof(double) * (size_t)(m * n));
    double *A = malloc(sizeof(double) * (size_t)(m * m));
    double *B = malloc(sizeof(double) * (size_t)(m * m));
    double ss = 0.0;

    for (int64_t i = 0; i < rows * cols; i++)
        ss += u[i] * u[i];
    const double inv = 1.0 / (sqrt(ss) * norm_scale + eps);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            x[work_t ? c * n + r : r * n + c] = u[r * cols + c] * inv;
    if (aol)
        for (int64_t i = 0; i < m; i++) {
            double s = 0.0;
            for (int64_t j = 0; j < m; j++) {
                double acc = 0.0;
                for (int64_t k = 0; k < n; k++)
                    acc += x[i * n + k] * x[j * n + k];
                s += fabs(acc);
            }
            B[i] = 1.0 / sqrt(s + eps); /* B is free until the first step */
        }
    for (int64_t i = 0; aol && i < m; i++)
        for (int64_t k = 0; k < n; k++)
            x[i * n + k] *= B[i];

    for (int s = 0; s < steps; s++) {
        const double a = coeffs[s][0], b = coeffs[s][1], cc = coeffs[s][2];
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < m; j++) {
                double acc = 0.0;
                for (int64_t k = 0; k < n; k++)
                    acc += x[i * n + k] * x[j * n + k];
                A[i * m + j] = acc;
            }
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < m; j++) {
                double acc = 0.0;
                for (int64_t k = 0; k < m; k++)
                    acc += A[i * m + k] * A[k * m + j];
                B[i * m + j] = b * A[i * m + j] + cc * acc;
            }
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                double acc = a * x[i * n + j];
                for (int64_t k = 0; k < m; k++)
                    acc += B[i * m + k] * x[k * n + j];
                y[i * n + j] = acc;
            }
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
}

static inline void ns_fp64(const double *u, int64_t rows, int64_t cols, int work_t,
                           const float (*coeffs)[3], int steps, double norm_scale, double eps,
                           double *o)
{
    ns_fp64_pre(u, rows, cols, work_t, coeffs, steps, norm_scale, eps, 0, o);
}

#endif

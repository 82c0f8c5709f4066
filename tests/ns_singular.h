/* Singular values for the orthogonalization tests: the range of a matrix's singular values
 * from the eigenvalues of X X^T (cyclic Jacobi, in double). */
#ifndef SHARDOPT_TEST_NS_SINGULAR_H
#define SHARDOPT_TEST_NS_SINGULAR_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

/* Cyclic Jacobi on a symmetric n x n matrix (destroyed); the diagonal ends as the eigenvalues. */
static inline void jacobi_eigenvalues(double *S, int n, double *eig)
{
    for (int sweep = 0; sweep < 60; sweep++) {
        double off = 0.0, diag = 0.0;
        for (int p = 0; p < n; p++)
            for (int q = 0; q < n; q++)
                if (p != q)
                    off += S[p * n + q] * S[p * n + q];
                else
                    diag += S[p * n + p] * S[p * n + p];
        if (off <= 1e-26 * diag)
            break;
        for (int p = 0; p < n - 1; p++)
            for (int q = p + 1; q < n; q++) {
                const double apq = S[p * n + q];
                if (apq == 0.0)
                    continue;
                const double theta = (S[q * n + q] - S[p * n + p]) / (2.0 * apq);
                const double tt =
                    (theta >= 0 ? 1.0 : -1.0) / (fabs(theta) + sqrt(theta * theta + 1.0));
                const double c = 1.0 / sqrt(tt * tt + 1.0), sn = tt * c;
                for (int k = 0; k < n; k++) { /* columns p, q */
                    const double kp = S[k * n + p], kq = S[k * n + q];
                    S[k * n + p] = c * kp - sn * kq;
                    S[k * n + q] = sn * kp + c * kq;
                }
                for (int k = 0; k < n; k++) { /* rows p, q */
                    const double pk = S[p * n + k], qk = S[q * n + k];
                    S[p * n + k] = c * pk - sn * qk;
                    S[q * n + k] = sn * pk + c * qk;
                }
            }
    }
    for (int i = 0; i < n; i++)
        eig[i] = S[i * n + i];
}

/* Smallest and largest singular value of the m x n (m <= n) row-major matrix x, times `scale`. */
static inline void singular_range(const float *x, int m, int n, double scale, double *smin,
                                  double *smax)
{
    double *G = malloc(sizeof(double) * (size_t)m * (size_t)m);
    double *eig = malloc(sizeof(double) * (size_t)m);

    for (int i = 0; i < m; i++)
        for (int j = 0; j < m; j++) {
            double acc = 0.0;
            for (int k = 0; k < n; k++)
                acc += (double)x[i * n + k] * (double)x[j * n + k];
            G[i * m + j] = acc * scale * scale;
        }
    jacobi_eigenvalues(G, m, eig);
    *smin = INFINITY;
    *smax = 0.0;
    for (int i = 0; i < m; i++) {
        const double sv = sqrt(eig[i] > 0.0 ? eig[i] : 0.0);
        *smin = sv < *smin ? sv : *smin;
        *smax = sv > *smax ? sv : *smax;
    }
    free(G);
    free(eig);
}

/* Orthonormal rows: q (k x n, k <= n) from uniform random rows by modified Gram-Schmidt,
 * twice over (in double), seeded. */
static inline void orthonormal_rows(double *q, int k, int n, uint64_t seed)
{
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 7;
    for (int i = 0; i < k * n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        q[i] = (double)(s >> 11) / 9007199254740992.0 - 0.5;
    }
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < k; i++) {
            for (int j = 0; j < i; j++) {
                double d = 0.0;
                for (int t = 0; t < n; t++)
                    d += q[i * n + t] * q[j * n + t];
                for (int t = 0; t < n; t++)
                    q[i * n + t] -= d * q[j * n + t];
            }
            double nn = 0.0;
            for (int t = 0; t < n; t++)
                nn += q[i * n + t] * q[i * n + t];
            for (int t = 0; t < n; t++)
                q[i * n + t] /= sqrt(nn);
        }
}

/* x (m x n, m <= n, row-major, fp32) <- U diag(sv) V^T with random orthonormal U (m x m) and V^T
 * (m x n): a matrix whose singular values are sv[0..m) (up to fp32 rounding). */
static inline void matrix_with_singular_values(float *x, int m, int n, const double *sv,
                                               uint64_t seed)
{
    double *u = malloc(sizeof(double) * (size_t)m * (size_t)m);
    double *v = malloc(sizeof(double) * (size_t)m * (size_t)n);
    orthonormal_rows(u, m, m, seed);
    orthonormal_rows(v, m, n, seed + 1000);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double acc = 0.0;
            for (int t = 0; t < m; t++)
                acc += u[i * m + t] * sv[t] * v[t * n + j];
            x[i * n + j] = (float)acc;
        }
    free(u);
    free(v);
}

#endif

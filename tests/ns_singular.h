/* Singular values for the orthogonalization tests: the range of a matrix's singular values
 * from the eigenvalues of X X^T (cyclic Jacobi, in double). */
#ifndef SHARDOPT_TEST_NS_SINGULAR_H
#define SHARDOPT_TEST_NS_SINGULAR_H

#include <math.h>
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

#endif

/* Helpers the benchmarks share. */
#ifndef BENCH_UTIL_H
#define BENCH_UTIL_H

/* Median of v[0..n) (sorts v in place). */
static inline double bench_median(double *v, int n)
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#endif

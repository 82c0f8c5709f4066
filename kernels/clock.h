/* Wall time for phase timings and benchmarks: one monotonic clock for every layer. */
#ifndef KERNELS_CLOCK_H
#define KERNELS_CLOCK_H

#include <time.h>

static inline double monotonic_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif

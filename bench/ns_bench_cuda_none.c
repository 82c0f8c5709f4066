/* Built without CUDA: ns_bench --backend cuda says so. */
#include <stdio.h>

#include "bench/ns_bench_cuda.h"

int ns_bench_cuda(const int64_t (*shapes)[3], int nshapes, int reps, int json, int algos,
                  int preconds)
{
    (void)shapes, (void)nshapes, (void)reps, (void)json, (void)algos, (void)preconds;
    fprintf(stderr, "ns_bench: --backend cuda: this build has no CUDA backend\n");
    return 77;
}

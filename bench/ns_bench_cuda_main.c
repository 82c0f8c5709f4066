/* ns_bench_cuda: ns_bench --backend cuda on its own, for builds of the kernels layer alone
 * (SHARDOPT_GPU_KERNELS_ONLY: a GPU machine without MPI, OpenBLAS or oneDNN).
 *   ns_bench_cuda [--json] [--reps R] [--shape BxMxN]... */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/ns_bench_cuda.h"

int main(int argc, char **argv)
{
    int64_t shapes[64][3];
    int n = 0, reps = 10, json = 0;

    for (int i = 1; i < argc; i++) {
        long long b, m, c;
        char tail;
        if (strcmp(argv[i], "--json") == 0) {
            json = 1;
        } else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc && atoi(argv[i + 1]) > 0) {
            reps = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--shape") == 0 && i + 1 < argc && n < 64 &&
                   sscanf(argv[i + 1], "%lldx%lldx%lld%c", &b, &m, &c, &tail) == 3 && b > 0 &&
                   m > 0 && c > 0) {
            shapes[n][0] = b, shapes[n][1] = m, shapes[n][2] = c;
            n++;
            i++;
        } else {
            fprintf(stderr, "usage: ns_bench_cuda [--json] [--reps R] [--shape BxMxN]...\n");
            return 2;
        }
    }
    return ns_bench_cuda(n ? (const int64_t(*)[3])shapes : NULL, n, reps, json);
}

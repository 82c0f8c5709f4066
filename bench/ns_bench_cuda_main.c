/* ns_bench_cuda: ns_bench --backend cuda on its own, for builds of the kernels layer alone
 * (SHARDOPT_GPU_KERNELS_ONLY: a GPU machine without MPI, OpenBLAS or oneDNN).
 *   ns_bench_cuda [--json] [--reps R] [--algorithm standard|gram|all]
 *                 [--precondition frobenius|aol|all] [--shape BxMxN]...
 * --algorithm / --precondition add Gram and AOL columns (ns_bench_cuda.h); default none. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/ns_bench_cuda.h"

int main(int argc, char **argv)
{
    int64_t shapes[64][3];
    int n = 0, reps = 10, json = 0, algos = 1, preconds = 1;

    for (int i = 1; i < argc; i++) {
        long long b, m, c;
        char tail;
        if (strcmp(argv[i], "--json") == 0) {
            json = 1;
        } else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc && atoi(argv[i + 1]) > 0) {
            reps = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--algorithm") == 0 && i + 1 < argc &&
                   (strcmp(argv[i + 1], "standard") == 0 || strcmp(argv[i + 1], "gram") == 0 ||
                    strcmp(argv[i + 1], "all") == 0)) {
            i++;
            algos = strcmp(argv[i], "standard") == 0 ? 1 : strcmp(argv[i], "gram") == 0 ? 2 : 3;
        } else if (strcmp(argv[i], "--precondition") == 0 && i + 1 < argc &&
                   (strcmp(argv[i + 1], "frobenius") == 0 || strcmp(argv[i + 1], "aol") == 0 ||
                    strcmp(argv[i + 1], "all") == 0)) {
            i++;
            preconds = strcmp(argv[i], "frobenius") == 0 ? 1 : strcmp(argv[i], "aol") == 0 ? 2 : 3;
        } else if (strcmp(argv[i], "--shape") == 0 && i + 1 < argc && n < 64 &&
                   sscanf(argv[i + 1], "%lldx%lldx%lld%c", &b, &m, &c, &tail) == 3 && b > 0 &&
                   m > 0 && c > 0) {
            shapes[n][0] = b, shapes[n][1] = m, shapes[n][2] = c;
            n++;
            i++;
        } else {
            fprintf(stderr, "usage: ns_bench_cuda [--json] [--reps R] [--algorithm "
                            "standard|gram|all] [--precondition frobenius|aol|all] "
                            "[--shape BxMxN]...\n");
            return 2;
        }
    }
    return ns_bench_cuda(n ? (const int64_t(*)[3])shapes : NULL, n, reps, json, algos, preconds);
}

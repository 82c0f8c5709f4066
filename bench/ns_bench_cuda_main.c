/* ns_bench_cuda: ns_bench --backend cuda on its own, for builds of the kernels layer alone
 * (SHARDOPT_GPU_KERNELS_ONLY: a GPU machine without MPI, OpenBLAS or oneDNN).
 *   ns_bench_cuda [--json] [--reps R] [--algorithm standard|gram|all]
 *                 [--precondition frobenius|aol|all] [--shape BxMxN]...
 * --algorithm / --precondition add Gram and AOL columns (ns_bench_cuda.h); default none. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/ns_bench_cuda.h"
#include "tools/cli_num.h"

static const char usage[] = "usage: ns_bench_cuda [--json] [--reps R] [--algorithm "
                            "standard|gram|all] [--precondition frobenius|aol|all] "
                            "[--shape BxMxN]...\n";

int main(int argc, char **argv)
{
    int64_t shapes[64][3];
    int n = 0, reps = 10, json = 0, algos = 1, preconds = 1;

    cli_stdout_at_exit("ns_bench_cuda");
    if (cli_argv_refused(argc, argv, "ns_bench_cuda", 1))
        return 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--json") == 0) {
            json = 1;
            continue;
        }
        /* each value whole and in range (atoi ran "10x" as 10; sscanf's %lld wrapped past 2^63
         * and took " 4x4x4"), and each shape's buffers within memory */
        const char *accepted = NULL;
        if (strcmp(a, "--reps") == 0) {
            if (v == NULL || cli_parse_int_in(v, 1, 1000, &reps) != 0)
                accepted = "an integer in 1..1000";
        } else if (strcmp(a, "--algorithm") == 0) {
            algos = v == NULL                ? 0
                    : !strcmp(v, "standard") ? 1
                    : !strcmp(v, "gram")     ? 2
                    : !strcmp(v, "all")      ? 3
                                             : 0;
            if (algos == 0)
                accepted = "standard, gram or all";
        } else if (strcmp(a, "--precondition") == 0) {
            preconds = v == NULL                 ? 0
                       : !strcmp(v, "frobenius") ? 1
                       : !strcmp(v, "aol")       ? 2
                       : !strcmp(v, "all")       ? 3
                                                 : 0;
            if (preconds == 0)
                accepted = "frobenius, aol or all";
        } else if (strcmp(a, "--shape") == 0) {
            long long d[3];
            char part[3][24];
            const char *x1 = v != NULL ? strchr(v, 'x') : NULL,
                       *x2 = x1 != NULL ? strchr(x1 + 1, 'x') : NULL;
            const int ok = n < 64 && x2 != NULL && (size_t)(x1 - v) < 24 &&
                           (size_t)(x2 - x1 - 1) < 24 && strlen(x2 + 1) < 24;
            if (ok) {
                snprintf(part[0], 24, "%.*s", (int)(x1 - v), v);
                snprintf(part[1], 24, "%.*s", (int)(x2 - x1 - 1), x1 + 1);
                snprintf(part[2], 24, "%s", x2 + 1);
            }
            if (!ok || cli_parse_ll_in(part[0], 1, 4096, &d[0]) != 0 ||
                cli_parse_ll_in(part[1], 1, 65536, &d[1]) != 0 ||
                cli_parse_ll_in(part[2], 1, 65536, &d[2]) != 0 ||
                !cli_mem_fits(16.0 * 4.0 * (double)d[0] * (double)d[1] * (double)d[2]))
                accepted = "BxMxN with B in 1..4096, M and N in 1..65536, within memory (at most "
                           "64 shapes)";
            else {
                shapes[n][0] = d[0], shapes[n][1] = d[1], shapes[n][2] = d[2];
                n++;
            }
        } else {
            fprintf(stderr, "ns_bench_cuda: unknown argument '%s'\n%s", a, usage);
            return 2;
        }
        if (accepted != NULL) {
            fprintf(stderr, "ns_bench_cuda: %s takes %s, not '%s'\n%s", a, accepted, v ? v : "",
                    usage);
            return 2;
        }
        i++;
    }
    return ns_bench_cuda(n ? (const int64_t(*)[3])shapes : NULL, n, reps, json, algos, preconds);
}

/* pingpong: MPI point-to-point bandwidth between ranks 0 and 1, for shardopt-plan --calibrate.
 * Messages of --mib MiB (default 16) go back and forth --reps times; prints one JSON line with
 * the median one-way GB/s (bytes / half the round trip). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_util.h"
#include "tools/cli_num.h"

int main(int argc, char **argv)
{
    int me, n, mib = 16, reps = 10;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    cli_stdout_at_exit("pingpong");
    if (cli_argv_refused(argc, argv, "pingpong", me == 0)) {
        MPI_Finalize();
        return 2;
    }
    /* each value whole and in range (atoi ran "16x" as 16; --mib 2^31 shifted past memory);
     * every rank parses the same argv, so every rank refuses together */
    const char *bad = NULL, *badv = "";
    for (int i = 1; i < argc && bad == NULL; i += 2) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int *t = !strcmp(argv[i], "--mib") ? &mib : !strcmp(argv[i], "--reps") ? &reps : NULL;
        if (t == NULL || v == NULL || cli_parse_int_in(v, 1, t == &mib ? 4096 : 1000, t) != 0) {
            bad = argv[i];
            badv = v != NULL ? v : "";
        }
    }
    if (bad != NULL || n < 2) {
        if (me == 0 && bad != NULL && strcmp(bad, "--mib") != 0 && strcmp(bad, "--reps") != 0)
            fprintf(stderr, "pingpong: unknown argument '%s'\n", bad);
        else if (me == 0 && bad != NULL)
            fprintf(stderr, "pingpong: %s takes an integer in 1..%d, not '%s'\n", bad,
                    strcmp(bad, "--mib") == 0 ? 4096 : 1000, badv);
        else if (me == 0)
            fprintf(stderr, "pingpong: needs 2 ranks, not %d\n", n);
        MPI_Finalize();
        return 2;
    }
    const size_t bytes = (size_t)mib << 20;
    char *buf = calloc(bytes, 1);
    double t[1000];
    for (int r = -1; r < reps; r++) { /* r = -1: warm-up */
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        if (me == 0) {
            MPI_Send(buf, (int)bytes, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
            MPI_Recv(buf, (int)bytes, MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else if (me == 1) {
            MPI_Recv(buf, (int)bytes, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(buf, (int)bytes, MPI_BYTE, 0, 0, MPI_COMM_WORLD);
        }
        if (r >= 0)
            t[r] = (MPI_Wtime() - t0) / 2;
    }
    if (me == 0)
        printf("{\"bench\": \"pingpong\", \"mib\": %d, \"reps\": %d, \"gbps\": %.3f}\n", mib, reps,
               (double)bytes / bench_median(t, reps) / 1e9);
    free(buf);
    MPI_Finalize();
    return 0;
}

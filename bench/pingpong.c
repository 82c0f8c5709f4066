/* pingpong: MPI point-to-point bandwidth between ranks 0 and 1, for shardopt-plan --calibrate.
 * Messages of --mib MiB (default 16) go back and forth --reps times; prints one JSON line with
 * the median one-way GB/s (bytes / half the round trip). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_util.h"

int main(int argc, char **argv)
{
    int me, n, mib = 16, reps = 10;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--mib"))
            mib = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps"))
            reps = atoi(argv[i + 1]);
    }
    if (n < 2 || mib < 1 || reps < 1 || reps > 1000) {
        if (me == 0)
            fprintf(stderr, "pingpong: needs 2 ranks, --mib >= 1, --reps 1..1000\n");
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

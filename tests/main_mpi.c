/* main() for tests that create runtimes: MPI initialised around the tests; only rank 0 reports
 * passing tests, every rank reports failures. Exit: 1 if any rank failed, 77 if every rank
 * skipped, else 0. */
#include <mpi.h>

int test_main(int argc, char **argv);
extern int test_quiet;

int main(int argc, char **argv)
{
    int rank, rc, failed, all_skipped;

#ifdef SHARDOPT_TEST_MPI_SERIALIZED
    /* the test calls the library from a second thread while the first waits for it */
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
#else
    MPI_Init(&argc, &argv);
#endif
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    test_quiet = rank != 0;
    rc = test_main(argc, argv);
    failed = rc != 0 && rc != 77;
    all_skipped = rc == 77;
    MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &all_skipped, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Finalize();
    return failed ? 1 : all_skipped ? 77 : 0;
}

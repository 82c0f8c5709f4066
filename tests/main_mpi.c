/* main() for tests that create runtimes: MPI initialised around the tests. */
#include <mpi.h>

int test_main(int argc, char **argv);

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rc = test_main(argc, argv);
    MPI_Finalize();
    return rc;
}

/* main() for tests that do not use MPI. */
int test_main(int argc, char **argv);

int main(int argc, char **argv) { return test_main(argc, argv); }

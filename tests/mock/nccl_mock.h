/* Fault injection into the mock NCCL (nccl_mock.c), for tests/mpi/test_nccl_mock. */
#ifndef TESTS_MOCK_NCCL_MOCK_H
#define TESTS_MOCK_NCCL_MOCK_H

enum nccl_mock_fault {
    NCCL_MOCK_NONE = 0,
    NCCL_MOCK_FAIL_GROUP, /* the next ncclGroupEnd returns ncclSystemError, posting nothing */
    NCCL_MOCK_STUCK,      /* the next ncclGroupEnd posts nothing and its communicator stays
                             ncclInProgress for good (a peer that never turns up) */
    NCCL_MOCK_FAIL_INIT,  /* the next ncclCommInitRankConfig reports ncclSystemError later,
                             through ncclCommGetAsyncError */
};

void nccl_mock_inject(enum nccl_mock_fault f);

/* Operations posted (send + recv) and communicators aborted, since the start. */
long nccl_mock_posted(void);
int nccl_mock_aborted(void);

#endif

/* Fault injection into the mock NCCL (nccl_mock.c), for tests/mpi/test_nccl_mock. */
#ifndef TESTS_MOCK_NCCL_MOCK_H
#define TESTS_MOCK_NCCL_MOCK_H

#include <mpi.h>

enum nccl_mock_fault {
    NCCL_MOCK_NONE = 0,
    NCCL_MOCK_FAIL_GROUP,      /* the next ncclGroupEnd returns ncclSystemError, posting nothing */
    NCCL_MOCK_STUCK,           /* the next ncclGroupEnd posts nothing and its communicator stays
                                  ncclInProgress for good (a peer that never turns up) */
    NCCL_MOCK_FAIL_INIT,       /* the next ncclCommInitRankConfig reports ncclSystemError later,
                                  through ncclCommGetAsyncError */
    NCCL_MOCK_STUCK_ALLREDUCE, /* NCCL_MOCK_STUCK for the next ncclGroupEnd that posts an
                                  all-reduce (a team member stuck in its Gram all-reduce) */
};

void nccl_mock_inject(enum nccl_mock_fault f);
/* The same, NCCL_MOCK_STUCK_ALLREDUCE past the next `skip` groups that post an all-reduce (a
 * team later in the step: an expert team after the dense group's) */
void nccl_mock_inject_after(enum nccl_mock_fault f, long skip);

/* seconds > 0: cudaStreamWaitEvent stops waiting after that long and returns (the data may not
 * have come). On a GPU the stream waits and the host goes on to the step's drain, which times
 * out; here the host is the stream, so a test with a stuck peer needs this to get there. */
void nccl_mock_waits_give_up(double seconds);

/* Operations posted (send + recv + all-reduce) and communicators aborted, since the start. */
long nccl_mock_posted(void);

/* ncclAllReduce calls posted, and the elements they summed, since the start. */
long nccl_mock_allreduces(void);
double nccl_mock_allreduce_elems(void);
/* of which ncclBfloat16 ones, and ncclFloat64 ones (the sharded strategy's norm) */
long nccl_mock_allreduces_bf16(void);
long nccl_mock_allreduces_f64(void);
int nccl_mock_aborted(void);

/* A kernel launch of the caller's that failed: left as the thread's last error, as CUDA does. */
void nccl_mock_fail_launch(void);

/* cudaEventQuery calls that answered "not ready", since the start. */
long nccl_mock_not_ready(void);

/* Calls that reached a communicator after ncclCommAbort had freed it (the mock keeps aborted
 * communicators' memory to count them instead of crashing). */
long nccl_mock_after_abort(void);

#endif

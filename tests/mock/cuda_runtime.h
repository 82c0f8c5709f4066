/* A stand-in for the CUDA runtime's header, for tests/mpi/test_nccl_mock only: the few stream
 * and event calls runtime/comm_nccl.c makes, implemented by nccl_mock.c on the host. A stream
 * holds the MPI requests of the mock NCCL operations queued on it; an event recorded on a stream
 * is complete when the requests queued before it are; a stream that waits on an event executes
 * nothing, so the wait is only recorded. No GPU, no CUDA library. */
#ifndef TESTS_MOCK_CUDA_RUNTIME_H
#define TESTS_MOCK_CUDA_RUNTIME_H

typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorNotReady = 600,
} cudaError_t;

typedef struct mock_stream *cudaStream_t;
typedef struct mock_event *cudaEvent_t;

#define cudaStreamNonBlocking  0x01
#define cudaEventDisableTiming 0x02

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags);
const char *cudaGetErrorString(cudaError_t e);

#endif

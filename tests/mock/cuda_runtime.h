/* A stand-in for the CUDA runtime's header, for runtime/comm/comm_nccl.c built against the mock
 * NCCL (nccl.h here; test_nccl_mock, test_device_sim_nccl): the few stream and event calls it
 * makes, implemented by nccl_mock.c on the host. A stream holds the MPI requests of the mock NCCL
 * operations queued on it; an event recorded on a stream is complete when the requests queued
 * before it are. Work "on" the caller's compute stream runs on the host at once (the simulated
 * device of test_device_sim), so a stream that waits on an event waits on the host until the
 * event is complete. No GPU, no CUDA library. */
#ifndef TESTS_MOCK_CUDA_RUNTIME_H
#define TESTS_MOCK_CUDA_RUNTIME_H

/* renamed: a CUDA build links the real cudart beside this */
#define cudaStreamCreateWithFlags mock_cudaStreamCreateWithFlags
#define cudaStreamDestroy         mock_cudaStreamDestroy
#define cudaEventCreateWithFlags  mock_cudaEventCreateWithFlags
#define cudaEventDestroy          mock_cudaEventDestroy
#define cudaEventRecord           mock_cudaEventRecord
#define cudaEventQuery            mock_cudaEventQuery
#define cudaStreamWaitEvent       mock_cudaStreamWaitEvent
#define cudaGetErrorString        mock_cudaGetErrorString
#define cudaGetLastError          mock_cudaGetLastError
#define cudaPeekAtLastError       mock_cudaPeekAtLastError

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
/* As the CUDA runtime: the last error of this thread, cleared by reading it. A "not ready" from
 * cudaEventQuery is left there too (as the real runtime leaves it), so that code polling an
 * event must clear it before anything reads the last error as a failed launch. */
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);

#endif

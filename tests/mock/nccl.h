/* A stand-in for NCCL's header, for runtime/comm/comm_nccl.c in test_nccl_mock and
 * test_device_sim_nccl: the calls it makes, with NCCL's non-blocking communicator semantics,
 * implemented by nccl_mock.c over MPI (one MPI communicator per mock communicator, host memory).
 * Faults are injected through nccl_mock.h. */
#ifndef TESTS_MOCK_NCCL_H
#define TESTS_MOCK_NCCL_H

#include <stddef.h>

#include "cuda_runtime.h"

/* renamed: a CUDA build links the real NCCL beside this */
#define ncclGetUniqueId        mock_ncclGetUniqueId
#define ncclCommInitRankConfig mock_ncclCommInitRankConfig
#define ncclCommGetAsyncError  mock_ncclCommGetAsyncError
#define ncclCommAbort          mock_ncclCommAbort
#define ncclCommDestroy        mock_ncclCommDestroy
#define ncclGroupStart         mock_ncclGroupStart
#define ncclGroupEnd           mock_ncclGroupEnd
#define ncclSend               mock_ncclSend
#define ncclRecv               mock_ncclRecv
#define ncclAllReduce          mock_ncclAllReduce
#define ncclGetErrorString     mock_ncclGetErrorString

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
} ncclResult_t;

typedef enum { ncclUint8 = 1, ncclFloat32 = 7, ncclFloat64 = 8, ncclBfloat16 = 9 } ncclDataType_t;

typedef enum { ncclSum = 0 } ncclRedOp_t;

typedef struct {
    char internal[128];
} ncclUniqueId;

typedef struct mock_comm *ncclComm_t;

typedef struct {
    int blocking;
} ncclConfig_t;

#define NCCL_CONFIG_INITIALIZER                                                                    \
    {                                                                                              \
        1                                                                                          \
    }

ncclResult_t ncclGetUniqueId(ncclUniqueId *id);
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *config);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);
ncclResult_t ncclSend(const void *buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t ncclRecv(void *buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream);
/* fp32 and bf16 sums only (the Newton-Schulz teams' Gram matrices): an MPI_Iallreduce of the
 * communicator's MPI communicator, queued on the stream like a send; sendbuff == recvbuff is in
 * place. bf16 as NCCL sums it: each pair of values added in fp32 and rounded once to bf16 (an
 * MPI_Op on MPI_UINT16_T), in MPI's order of the members, not NCCL's */
ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
const char *ncclGetErrorString(ncclResult_t r);

#endif

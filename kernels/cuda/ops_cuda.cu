/* The CUDA tables: the kernel table (elementwise kernels of elementwise.cu, cuBLAS
 * Newton-Schulz of ns_cuda.cu) and the device table (stream-ordered copies and fills, plain
 * cudaMalloc memory (never managed), pinned host memory, copy lanes, timing marks, the
 * per-runtime backend state). Every entry queues on kernel_ctx.stream; sync waits for it and
 * reports a failed launch or copy. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda_internal.h"

extern "C" {
#include "base/status.h"
#include "cuda_probe.h"
}
#include "base/mem.h"

static void *cuda_alloc(size_t bytes)
{
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky-free error so the next call is not blamed */
        return NULL;
    }
    return p;
}

static void cuda_free(void *p)
{
    if (p != NULL)
        cudaFree(p);
}

static void cuda_copy(const struct kernel_ctx *ctx, void *dst, const void *src, size_t bytes)
{
    if (bytes > 0)
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cuda_stream(ctx));
}

/* Lanes: the backend's streams; lane 0 is ctx's compute stream. */
static void cuda_copy_on(const struct kernel_ctx *ctx, int lane, void *dst, const void *src,
                         size_t bytes)
{
    struct cuda_backend *b = cuda_be(ctx);
    if (bytes > 0)
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault,
                        lane == 0 || b == NULL ? cuda_stream(ctx) : b->lane[lane]);
}

static void cuda_lane_record(const struct kernel_ctx *ctx, int lane, int tag)
{
    struct cuda_backend *b = cuda_be(ctx);
    if (b == NULL)
        return;
    cudaEventRecord(b->lane_event[lane][tag], lane == 0 ? cuda_stream(ctx) : b->lane[lane]);
}

/* cudaStreamWaitEvent waits for the event's latest record as of this call; an event never
 * recorded is complete, so a slot's first copy-in waits for nothing. */
static void cuda_lane_wait(const struct kernel_ctx *ctx, int waiter, int signaler, int tag)
{
    struct cuda_backend *b = cuda_be(ctx);
    if (b == NULL || waiter == signaler)
        return;
    cudaStreamWaitEvent(waiter == 0 ? cuda_stream(ctx) : b->lane[waiter],
                        b->lane_event[signaler][tag], 0);
}

/* Asking is a cheap host call; setting only when it differs keeps the thread's context as is
 * in the usual case (one thread, init's device). */
static int cuda_device_enter(const struct kernel_ctx *ctx)
{
    struct cuda_backend *b = cuda_be(ctx);
    int cur = -1;
    if (b == NULL)
        return 0;
    if (cudaGetDevice(&cur) == cudaSuccess && cur == b->device)
        return 0;
    if (cudaSetDevice(b->device) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    return 0;
}

static void cuda_copy2d(const struct kernel_ctx *ctx, void *dst, size_t dpitch, const void *src,
                        size_t spitch, size_t width, size_t rows)
{
    if (width > 0 && rows > 0)
        cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDefault,
                          cuda_stream(ctx));
}

static void cuda_fill(const struct kernel_ctx *ctx, void *dst, int byte, size_t bytes)
{
    if (bytes > 0)
        cudaMemsetAsync(dst, byte, bytes, cuda_stream(ctx));
}

static int cuda_sync(const struct kernel_ctx *ctx)
{
    if (cudaStreamSynchronize(cuda_stream(ctx)) != cudaSuccess)
        return -1;
    return cudaGetLastError() == cudaSuccess ? 0 : -1;
}

extern "C" shardopt_status_t cuda_backend_create(int device, void **stream,
                                                 struct cuda_backend **out)
{
    struct cuda_backend *b = (struct cuda_backend *)mem_calloc(1, sizeof(*b));
    cudaError_t e = cudaSuccess;
    const char *what = "";

    *out = NULL;
    if (b == NULL)
        return status_set(SHARDOPT_ERR_OUT_OF_MEMORY,
                          "CUDA backend: out of memory allocating %zu bytes for its state",
                          sizeof(*b));
    if (device < 0) {
        what = "cudaGetDevice";
        e = cudaGetDevice(&b->device);
    } else {
        what = "cudaSetDevice";
        b->device = device;
        e = cudaSetDevice(device);
    }
    if (e == cudaSuccess) {
        what = "cudaMalloc (reduction buffer)";
        e = cudaMalloc((void **)&b->d_partial,
                       sizeof(double) * (CUDA_SUMSQ_BLOCKS + CUDA_SUMSQ_RESULTS));
    }
    if (e == cudaSuccess) {
        what = "cudaMallocHost";
        e = cudaMallocHost((void **)&b->h_result, sizeof(double) * CUDA_SUMSQ_RESULTS);
    }
    if (e == cudaSuccess) {
        what = "cudaStreamCreate";
        e = cudaStreamCreate(&b->stream);
    }
    if (e == cudaSuccess) {
        what = "cudaEventCreate";
        e = cudaEventCreateWithFlags(&b->caller_ready, cudaEventDisableTiming);
        if (e == cudaSuccess)
            e = cudaEventCreateWithFlags(&b->done, cudaEventDisableTiming);
    }
    b->lane[0] = b->stream;
    for (int l = 1; e == cudaSuccess && l < KERNEL_LANES; l++) {
        what = "cudaStreamCreateWithFlags (copy lane)";
        e = cudaStreamCreateWithFlags(&b->lane[l], cudaStreamNonBlocking);
    }
    for (int l = 0; e == cudaSuccess && l < KERNEL_LANES; l++)
        for (int t = 0; e == cudaSuccess && t < KERNEL_LANE_TAGS; t++) {
            what = "cudaEventCreate (lanes)";
            e = cudaEventCreateWithFlags(&b->lane_event[l][t], cudaEventDisableTiming);
        }
    if (e != cudaSuccess) {
        status_set(SHARDOPT_ERR_DEVICE, "CUDA backend: %s failed on device %d: %s", what, b->device,
                   cudaGetErrorString(e));
        cudaGetLastError();
        cuda_backend_destroy(b);
        return SHARDOPT_ERR_DEVICE;
    }
    cublasStatus_t bs = cublasCreate(&b->blas);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        status_set(SHARDOPT_ERR_DEVICE, "CUDA backend: cublasCreate failed on device %d: %s",
                   b->device, cublasGetStatusString(bs));
        b->blas = NULL;
        cuda_backend_destroy(b);
        return SHARDOPT_ERR_DEVICE;
    }
    bs = cublasLtCreate(&b->lt);
    if (bs != CUBLAS_STATUS_SUCCESS || cudaMalloc(&b->lt_ws, CUDA_LT_WORKSPACE) != cudaSuccess) {
        status_set(SHARDOPT_ERR_DEVICE,
                   "CUDA backend: cublasLtCreate or its %u MiB workspace failed on device %d",
                   CUDA_LT_WORKSPACE >> 20, b->device);
        if (bs != CUBLAS_STATUS_SUCCESS)
            b->lt = NULL;
        cudaGetLastError();
        cuda_backend_destroy(b);
        return SHARDOPT_ERR_DEVICE;
    }
    if (stream != NULL)
        *stream = b->stream;
    *out = b;
    return SHARDOPT_OK;
}

extern "C" void cuda_backend_destroy(struct cuda_backend *b)
{
    if (b == NULL)
        return;
    if (b->blas != NULL)
        cublasDestroy(b->blas);
    cuda_lt_plans_destroy(b);
    if (b->lt != NULL)
        cublasLtDestroy(b->lt);
    if (b->lt_ws != NULL)
        cudaFree(b->lt_ws);
    if (b->caller_ready != NULL)
        cudaEventDestroy(b->caller_ready);
    if (b->done != NULL)
        cudaEventDestroy(b->done);
    for (int l = 0; l < KERNEL_LANES; l++)
        for (int t = 0; t < KERNEL_LANE_TAGS; t++)
            if (b->lane_event[l][t] != NULL)
                cudaEventDestroy(b->lane_event[l][t]);
    for (int l = 1; l < KERNEL_LANES; l++)
        if (b->lane[l] != NULL)
            cudaStreamDestroy(b->lane[l]);
    if (b->stream != NULL)
        cudaStreamDestroy(b->stream);
    for (int i = 0; i < b->nmarks; i++)
        cudaEventDestroy(b->marks[i]);
    free(b->marks);
    cudaFree(b->d_partial);
    cudaFreeHost(b->h_result);
    free(b);
}

/* Timing events are made in blocks as the marks are first used: a step needs a few per bucket
 * and per staged chunk, the same ones every step. */
static int cuda_mark(const struct kernel_ctx *ctx, int lane, int id)
{
    struct cuda_backend *b = cuda_be(ctx);
    if (b == NULL || id < 0 || id >= KERNEL_MAX_MARKS || lane < 0 || lane >= KERNEL_LANES)
        return -1;
    if (id >= b->nmarks) {
        int want = (id / 256 + 1) * 256;
        cudaEvent_t *m = (cudaEvent_t *)mem_realloc(b->marks, sizeof *m * (size_t)want);
        if (m == NULL)
            return -1;
        b->marks = m;
        while (b->nmarks < want) {
            if (cudaEventCreate(&b->marks[b->nmarks]) != cudaSuccess) {
                cudaGetLastError();
                return -1;
            }
            b->nmarks++;
        }
    }
    return cudaEventRecord(b->marks[id], lane == 0 ? cuda_stream(ctx) : b->lane[lane]) ==
                   cudaSuccess
               ? 0
               : -1;
}

static int cuda_pointer_kind(const struct kernel_ctx *ctx, const void *p, int dev[2])
{
    struct cuda_backend *b = cuda_be(ctx);
    cudaPointerAttributes a;
    dev[0] = -1;
    dev[1] = b != NULL ? b->device : -1;
    if (b == NULL || cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError();
        return KERNEL_PTR_UNKNOWN;
    }
    switch (a.type) {
    case cudaMemoryTypeUnregistered:
    case cudaMemoryTypeHost: return KERNEL_PTR_HOST;
    case cudaMemoryTypeManaged: return KERNEL_PTR_MANAGED;
    case cudaMemoryTypeDevice:
        dev[0] = a.device;
        return a.device == b->device ? KERNEL_PTR_DEVICE : KERNEL_PTR_OTHER;
    }
    return KERNEL_PTR_UNKNOWN;
}

static double cuda_mark_seconds(const struct kernel_ctx *ctx, int a, int c)
{
    struct cuda_backend *b = cuda_be(ctx);
    float ms = 0;
    if (b == NULL || a < 0 || c < 0 || a >= b->nmarks || c >= b->nmarks ||
        cudaEventSynchronize(b->marks[a]) != cudaSuccess ||
        cudaEventSynchronize(b->marks[c]) != cudaSuccess ||
        cudaEventElapsedTime(&ms, b->marks[a], b->marks[c]) != cudaSuccess) {
        cudaGetLastError();
        return NAN;
    }
    return ms * 1e-3;
}

static int cuda_mark_done(const struct kernel_ctx *ctx, int id)
{
    struct cuda_backend *b = cuda_be(ctx);
    if (b == NULL || id < 0 || id >= b->nmarks)
        return -1;
    const cudaError_t pending = cudaPeekAtLastError(), e = cudaEventQuery(b->marks[id]);
    if (e == cudaSuccess)
        return 1;
    /* "not ready" is not an error of the next call's; an error that was pending before the
     * query is not ours to clear */
    if (pending == cudaSuccess)
        cudaGetLastError();
    return e == cudaErrorNotReady ? 0 : -1;
}

static shardopt_status_t backend_create(int device, void **stream, void **backend)
{
    struct cuda_backend *b = NULL;
    const shardopt_status_t status = cuda_backend_create(device, stream, &b);
    *backend = b;
    return status;
}

static void *host_alloc(size_t bytes)
{
    void *p = NULL;
    if (cudaMallocHost(&p, bytes ? bytes : 1) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return p;
}

static void host_free(void *p)
{
    if (p != NULL)
        cudaFreeHost(p);
}

static int host_register(void *p, size_t bytes)
{
    if (cudaHostRegister(p, bytes ? bytes : 1, cudaHostRegisterDefault) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    return 0;
}

static void host_unregister(void *p)
{
    if (p != NULL && cudaHostUnregister(p) != cudaSuccess)
        cudaGetLastError();
}

static int device_pci_bus_id(int device, char *buf, size_t len)
{
    if (device < 0 && cudaGetDevice(&device) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    if (cudaDeviceGetPCIBusId(buf, (int)len, device) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    return 0;
}

static shardopt_status_t fail(cudaError_t e, const char *what)
{
    return status_set(SHARDOPT_ERR_DEVICE, "%s: %s", what, cudaGetErrorString(e));
}

/* The trainer's work so far (its backward wrote the gradients) comes before the step's. */
static shardopt_status_t stream_begin(const struct kernel_ctx *ctx, void *caller)
{
    struct cuda_backend *b = cuda_be(ctx);
    cudaError_t e;
    /* an error the caller's own earlier calls left on this thread is not the step's: the
     * launches of the step are checked against a clean slate (sumsq_many, stream_end) */
    (void)cudaGetLastError();
    if (caller == NULL)
        return SHARDOPT_OK; /* the step's caller has finished its work on the host's word */
    if ((e = cudaEventRecord(b->caller_ready, (cudaStream_t)caller)) != cudaSuccess)
        return fail(e, "cudaEventRecord on the caller's stream");
    if ((e = cudaStreamWaitEvent(b->stream, b->caller_ready, 0)) != cudaSuccess)
        return fail(e, "cudaStreamWaitEvent");
    return SHARDOPT_OK;
}

/* The trainer's next forward reads the parameters after the step wrote them. */
static shardopt_status_t stream_end(const struct kernel_ctx *ctx, void *caller)
{
    struct cuda_backend *b = cuda_be(ctx);
    cudaError_t e;
    if (caller == NULL) {
        if ((e = cudaStreamSynchronize(b->stream)) != cudaSuccess)
            return fail(e, "the step's kernels");
    } else {
        if ((e = cudaEventRecord(b->done, b->stream)) != cudaSuccess)
            return fail(e, "cudaEventRecord");
        if ((e = cudaStreamWaitEvent((cudaStream_t)caller, b->done, 0)) != cudaSuccess)
            return fail(e, "cudaStreamWaitEvent on the caller's stream");
    }
    if ((e = cudaGetLastError()) != cudaSuccess)
        return fail(e, "a kernel launch of the step");
    return SHARDOPT_OK;
}

static void backend_destroy(void *b) { cuda_backend_destroy((struct cuda_backend *)b); }

static struct kernel_ops cuda_ops_make(void)
{
    struct kernel_ops o = {};
    o.name = "cuda";
    o.momentum = cuda_momentum;
    o.adamw = cuda_adamw;
    o.apply = cuda_apply;
    o.momentum_many = cuda_momentum_many;
    o.adamw_many = cuda_adamw_many;
    o.apply_many = cuda_apply_many;
    o.newton_schulz = cuda_newton_schulz;
    /* sharded Newton-Schulz: fp32 (cuBLAS sgemm), teams' blocks and ns_strategy's pieces; bf16
     * teams (cublasGemmEx, bf16 storage, fp32 accumulation) */
    cuda_ns_shard_fill(&o);
    o.sumsq = cuda_sumsq;
    o.sumsq_many = cuda_sumsq_many;
    o.ns_workspace_bytes = cuda_ns_workspace_bytes;
    return o;
}

static struct device_ops cuda_device_make(void)
{
    struct device_ops d = {};
    d.name = "cuda";
    d.caps = DEVICE_CAP_DEVICE_MEMORY | DEVICE_CAP_HOST_PINNED | DEVICE_CAP_HOST_REGISTER |
             DEVICE_CAP_COPY_LANES | DEVICE_CAP_STREAMS | DEVICE_CAP_MARKS | DEVICE_CAP_BACKEND |
             DEVICE_CAP_POINTER_KIND | DEVICE_CAP_THREAD_DEVICE;
    d.copy = cuda_copy;
    d.copy2d = cuda_copy2d;
    d.fill = cuda_fill;
    d.alloc = cuda_alloc;
    d.free = cuda_free;
    d.sync = cuda_sync;
    d.copy_on = cuda_copy_on;
    d.lane_record = cuda_lane_record;
    d.lane_wait = cuda_lane_wait;
    d.backend_create = backend_create;
    d.backend_destroy = backend_destroy;
    d.device_count = cuda_probe_device_count;
    d.device_pci_bus_id = device_pci_bus_id;
    d.host_alloc = host_alloc;
    d.host_free = host_free;
    d.host_register = host_register;
    d.host_unregister = host_unregister;
    d.stream_begin = stream_begin;
    d.stream_end = stream_end;
    d.mark = cuda_mark;
    d.mark_seconds = cuda_mark_seconds;
    d.mark_done = cuda_mark_done;
    d.pointer_kind = cuda_pointer_kind;
    d.device_enter = cuda_device_enter;
    return d;
}

static const struct kernel_ops cuda_ops = cuda_ops_make();
static const struct device_ops cuda_device = cuda_device_make();

extern "C" const struct kernel_ops *kernel_ops_cuda(void) { return &cuda_ops; }

extern "C" const struct device_ops *device_ops_cuda(void) { return &cuda_device; }

extern "C" int cuda_probe_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

extern "C" int cuda_probe_copy(void *dst_dev, const void *src_host, void *back_host, size_t bytes)
{
    if (cudaMemcpy(dst_dev, src_host, bytes, cudaMemcpyHostToDevice) != cudaSuccess)
        return -1;
    if (cudaMemcpy(back_host, dst_dev, bytes, cudaMemcpyDeviceToHost) != cudaSuccess)
        return -1;
    return 0;
}

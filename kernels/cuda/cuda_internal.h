/* Shared by the CUDA backend's translation units (C++ only). */
#ifndef KERNELS_CUDA_CUDA_INTERNAL_H
#define KERNELS_CUDA_CUDA_INTERNAL_H

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

extern "C" {
#include "../device.h"
#include "../ops.h"
#include "cuda_backend.h"
#include "lt_plan_cache.h"
}

/* Blocks of the deterministic sum of squares: a fixed count, so the order of additions depends
 * on n only. */
#define CUDA_SUMSQ_BLOCKS  256
#define CUDA_SUMSQ_THREADS 256
/* cuBLASLt workspace: what its heuristics ask for on Hopper for large bf16 products. */
#define CUDA_LT_WORKSPACE (32u << 20)
/* Results of one sumsq_many round trip (more tensors take more rounds). */
#define CUDA_SUMSQ_RESULTS 1024

/* A cached cuBLASLt product (lt_plan_cache.h): ok = 0 when the heuristic found no algorithm,
 * remembered so that the fallback is taken without asking again. */
struct lt_plan {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
    int ok;
};

struct cuda_backend {
    int device;
    cublasHandle_t blas;
    cublasLtHandle_t lt; /* Newton-Schulz products that read C apart from where D goes */
    void *lt_ws;         /* its workspace, CUDA_LT_WORKSPACE bytes */
    struct lt_slots lt_slots;
    struct lt_plan lt_plans[LT_PLAN_SLOTS];
    cudaStream_t stream; /* the runtime's: blocking, so legacy-stream work orders with it */
    cudaEvent_t caller_ready, done;  /* step ordering with a trainer's stream */
    cudaStream_t lane[KERNEL_LANES]; /* [0] = stream; copy-in and copy-out streams */
    cudaEvent_t lane_event[KERNEL_LANES][KERNEL_LANE_TAGS];
    double *d_partial;  /* [CUDA_SUMSQ_BLOCKS + CUDA_SUMSQ_RESULTS]: block sums, then totals */
    double *h_result;   /* pinned [CUDA_SUMSQ_RESULTS]: the totals on their way to the host */
    cudaEvent_t *marks; /* [nmarks] timing events for device_ops.mark, made as first used */
    int nmarks;
};

static inline cudaStream_t cuda_stream(const struct kernel_ctx *ctx)
{
    return (cudaStream_t)(ctx != NULL ? ctx->stream : NULL);
}

static inline struct cuda_backend *cuda_be(const struct kernel_ctx *ctx)
{
    return ctx != NULL ? (struct cuda_backend *)ctx->backend : NULL;
}

/* The block's values summed in a fixed tree order (blockDim.x a power of two, sh one double per
 * thread); thread 0 writes the sum to *out. Deterministic: the same order every launch. */
static __device__ __forceinline__ void block_reduce(double *sh, double v, double *out)
{
    sh[threadIdx.x] = v;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s)
            sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        *out = sh[0];
}

/* Blocks for a grid-stride pass over `work` items of `threads` each. */
static inline unsigned cuda_blocks(size_t work, unsigned threads)
{
    size_t b = (work + threads - 1) / threads;
    return (unsigned)(b == 0 ? 1 : b > 8192 ? 8192 : b);
}

void cuda_momentum(const struct kernel_ctx *ctx, const struct momentum_args *a);
void cuda_adamw(const struct kernel_ctx *ctx, const struct adamw_args *a);
void cuda_apply(const struct kernel_ctx *ctx, const struct apply_args *a);
void cuda_momentum_many(const struct kernel_ctx *ctx, const struct momentum_args *a, int count);
void cuda_adamw_many(const struct kernel_ctx *ctx, const struct adamw_args *a, int count);
void cuda_apply_many(const struct kernel_ctx *ctx, const struct apply_args *a, int count);
double cuda_sumsq(const struct kernel_ctx *ctx, const void *x, int dt, size_t n);
void cuda_sumsq_many(const struct kernel_ctx *ctx, const void *const *x, const int *dt,
                     const size_t *n, int count, double *out);
int cuda_newton_schulz(const struct kernel_ctx *ctx, const struct ns_args *a,
                       const struct ns_workspace *ws);
size_t cuda_ns_workspace_bytes(int64_t rows, int64_t cols, int64_t batch);
/* out <- in * scale (rows x cols row-major, one matrix), out the same or (transpose) its
 * transpose, each value formed as (float)((double)v * scale), on stream s: the tile kernel of
 * the gathered path's load and store (ns_cuda.cu), for the sharded pieces' (ns_shard_cuda.cu) */
void cuda_ns_tile(cudaStream_t s, const void *in, int in_dt, void *out, int out_dt, int64_t rows,
                  int64_t cols, int transpose, double scale);
/* the sharded Newton-Schulz entries (ns_shard_cuda.cu) into a table being made */
void cuda_ns_shard_fill(struct kernel_ops *o);
void cuda_lt_plans_destroy(struct cuda_backend *b);

#endif

/* Elementwise kernels of the CUDA backend: the rules of kernels/elem_rules.h, so the results
 * match the CPU reference bit for bit (the build passes -fmad=false; division and sqrt are the
 * IEEE ones nvcc uses by default). Each thread takes 8 consecutive elements: one vector load per
 * buffer (16 bytes of bf16, two float4 of fp32) when every buffer is 16-byte aligned, and at
 * most two Philox calls for their random bits. One launch serves many calls (a bucket). */
#include <math.h>

#include "cuda_internal.h"

extern "C" {
#include "../elem_rules.h"
#include "ew_batch_take.h"
}

#define EW_THREADS 256

struct vec8 {
    float v[8];
};

template <bool VEC>
__device__ __forceinline__ void load8(const void *p, int dt, size_t i0, size_t n, vec8 &x)
{
    if (VEC && i0 + 8 <= n) {
        if (dt == KDT_F32) {
            const float4 a = ((const float4 *)p)[i0 / 4], b = ((const float4 *)p)[i0 / 4 + 1];
            x.v[0] = a.x, x.v[1] = a.y, x.v[2] = a.z, x.v[3] = a.w;
            x.v[4] = b.x, x.v[5] = b.y, x.v[6] = b.z, x.v[7] = b.w;
        } else {
            const uint4 q = ((const uint4 *)p)[i0 / 8];
            const uint32_t w[4] = {q.x, q.y, q.z, q.w};
            for (int j = 0; j < 4; j++) {
                x.v[2 * j] = f32_from_bf16((uint16_t)(w[j] & 0xffffu));
                x.v[2 * j + 1] = f32_from_bf16((uint16_t)(w[j] >> 16));
            }
        }
        return;
    }
    for (int j = 0; j < 8; j++)
        x.v[j] = i0 + j < n ? kload(p, dt, i0 + j) : 0.0f;
}

/* Stores round to nearest: exact for values that kround already rounded. */
template <bool VEC>
__device__ __forceinline__ void store8(void *p, int dt, size_t i0, size_t n, const vec8 &x)
{
    if (VEC && i0 + 8 <= n) {
        if (dt == KDT_F32) {
            ((float4 *)p)[i0 / 4] = make_float4(x.v[0], x.v[1], x.v[2], x.v[3]);
            ((float4 *)p)[i0 / 4 + 1] = make_float4(x.v[4], x.v[5], x.v[6], x.v[7]);
        } else {
            uint32_t w[4];
            for (int j = 0; j < 4; j++)
                w[j] = (uint32_t)bf16_from_f32(x.v[2 * j]) |
                       ((uint32_t)bf16_from_f32(x.v[2 * j + 1]) << 16);
            ((uint4 *)p)[i0 / 8] = make_uint4(w[0], w[1], w[2], w[3]);
        }
        return;
    }
    for (int j = 0; j < 8 && i0 + j < n; j++)
        kstore_value(p, dt, i0 + j, x.v[j]);
}

static bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* One thread's 8 elements [i0, i0 + 8) of one call, for each op. */
template <bool VEC>
__device__ __forceinline__ void momentum8(const struct momentum_args &a, size_t i0)
{
    const bool sr = a.mom_rounding == KROUND_STOCHASTIC;
    vec8 g, m, u;
    struct rng_cursor rc;
    rng_cursor_init(&rc, &a.rng);
    load8<VEC>(a.grad, a.grad_dtype, i0, a.n, g);
    load8<VEC>(a.mom, a.mom_dtype, i0, a.n, m);
    for (int j = 0; j < 8; j++) {
        const uint16_t r =
            sr && i0 + j < a.n ? rng_cursor_bits(&rc, elem_index_global(&a.idx, i0 + j)) : 0;
        rule_momentum(&a, g.v[j], m.v[j], r, &m.v[j], &u.v[j]);
    }
    store8<VEC>(a.mom, a.mom_dtype, i0, a.n, m);
    store8<VEC>(a.out, a.out_dtype, i0, a.n, u);
}

template <bool VEC> __device__ __forceinline__ void adamw8(const struct adamw_args &a, size_t i0)
{
    const bool sr = adamw_stochastic(&a);
    vec8 g, m, v, w;
    struct rng_cursor rc, rm, rv;
    rng_cursor_init(&rc, &a.rng);
    rng_cursor_init(&rm, &a.rng_m);
    rng_cursor_init(&rv, &a.rng_v);
    load8<VEC>(a.grad, a.grad_dtype, i0, a.n, g);
    load8<VEC>(a.exp_avg, a.m_dtype, i0, a.n, m);
    load8<VEC>(a.exp_avg_sq, a.v_dtype, i0, a.n, v);
    load8<VEC>(a.param, a.param_dtype, i0, a.n, w);
    for (int j = 0; j < 8; j++) {
        uint16_t bp = 0, bm = 0, bv = 0;
        if (sr && i0 + j < a.n) {
            const uint64_t gi = elem_index_global(&a.idx, i0 + j);
            bp = rng_cursor_bits(&rc, gi);
            bm = rng_cursor_bits(&rm, gi);
            bv = rng_cursor_bits(&rv, gi);
        }
        w.v[j] = rule_adamw(&a, g.v[j], &m.v[j], &v.v[j], w.v[j], bm, bv, bp);
    }
    store8<VEC>(a.exp_avg, a.m_dtype, i0, a.n, m);
    store8<VEC>(a.exp_avg_sq, a.v_dtype, i0, a.n, v);
    store8<VEC>(a.param, a.param_dtype, i0, a.n, w);
}

template <bool VEC> __device__ __forceinline__ void apply8(const struct apply_args &a, size_t i0)
{
    const bool sr = a.param_rounding == KROUND_STOCHASTIC;
    vec8 o, w;
    struct rng_cursor rc;
    rng_cursor_init(&rc, &a.rng);
    load8<VEC>(a.update, a.update_dtype, i0, a.n, o);
    load8<VEC>(a.param, a.param_dtype, i0, a.n, w);
    for (int j = 0; j < 8; j++) {
        const uint16_t r =
            sr && i0 + j < a.n ? rng_cursor_bits(&rc, elem_index_global(&a.idx, i0 + j)) : 0;
        w.v[j] = rule_apply(&a, o.v[j], w.v[j], r);
    }
    store8<VEC>(a.param, a.param_dtype, i0, a.n, w);
}

static __device__ __forceinline__ void run8(const struct momentum_args &a, bool vec, size_t i0)
{
    vec ? momentum8<true>(a, i0) : momentum8<false>(a, i0);
}
static __device__ __forceinline__ void run8(const struct adamw_args &a, bool vec, size_t i0)
{
    vec ? adamw8<true>(a, i0) : adamw8<false>(a, i0);
}
static __device__ __forceinline__ void run8(const struct apply_args &a, bool vec, size_t i0)
{
    vec ? apply8<true>(a, i0) : apply8<false>(a, i0);
}

/* Up to EW_BATCH calls of one op in one launch (a bucket's pieces, all AdamW tensors), passed by
 * value as the kernel's parameter (CUDA >= 12.1 allows 32 KiB): no device buffer, nothing to
 * copy first. Groups of 8 elements are numbered across the calls; first[j] is call j's first. */
#define EW_BATCH 48

template <class A> struct ew_batch {
    int count;
    unsigned long long first[EW_BATCH + 1];
    unsigned char vec[EW_BATCH]; /* every buffer of call j 16-byte aligned */
    A a[EW_BATCH];
};

static_assert(sizeof(ew_batch<adamw_args>) <= 32764 && sizeof(ew_batch<momentum_args>) <= 32764 &&
                  sizeof(ew_batch<apply_args>) <= 32764,
              "a batch must fit the kernel parameter space (32764 bytes since CUDA 12.1)");

template <class A> __global__ void k_batch(const __grid_constant__ ew_batch<A> b)
{
    const unsigned long long total = b.first[b.count];
    for (unsigned long long g = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         g < total; g += (unsigned long long)gridDim.x * blockDim.x) {
        int lo = 0, hi = b.count - 1; /* the call whose groups hold g */
        while (lo < hi) {
            const int mid = (lo + hi + 1) / 2;
            if (b.first[mid] <= g)
                lo = mid;
            else
                hi = mid - 1;
        }
        run8(b.a[lo], b.vec[lo] != 0, (size_t)(g - b.first[lo]) * 8);
    }
}

static bool aligned_all(const struct momentum_args &a)
{
    return aligned16(a.grad) && aligned16(a.mom) && aligned16(a.out);
}
static bool aligned_all(const struct adamw_args &a)
{
    return aligned16(a.grad) && aligned16(a.exp_avg) && aligned16(a.exp_avg_sq) &&
           aligned16(a.param);
}
static bool aligned_all(const struct apply_args &a)
{
    return aligned16(a.update) && aligned16(a.param);
}

template <class A> static void launch_many(const struct kernel_ctx *ctx, const A *a, int count)
{
    ew_batch<A> b;
    int take[EW_BATCH];
    for (int j = 0; j < count;) { /* one cursor over the entries (ew_batch_take.h) */
        const int k = ew_batch_take(&a[0].n, sizeof *a, count, &j, EW_BATCH, take);
        b.count = 0;
        b.first[0] = 0;
        for (int t = 0; t < k; t++) {
            const A &e = a[take[t]];
            b.a[b.count] = e;
            b.vec[b.count] = aligned_all(e);
            b.first[b.count + 1] = b.first[b.count] + (e.n + 7) / 8;
            b.count++;
        }
        if (b.count > 0)
            k_batch<A>
                <<<cuda_blocks(b.first[b.count], EW_THREADS), EW_THREADS, 0, cuda_stream(ctx)>>>(b);
    }
}

void cuda_momentum_many(const struct kernel_ctx *ctx, const struct momentum_args *a, int count)
{
    launch_many(ctx, a, count);
}

void cuda_adamw_many(const struct kernel_ctx *ctx, const struct adamw_args *a, int count)
{
    launch_many(ctx, a, count);
}

void cuda_apply_many(const struct kernel_ctx *ctx, const struct apply_args *a, int count)
{
    launch_many(ctx, a, count);
}

void cuda_momentum(const struct kernel_ctx *ctx, const struct momentum_args *a)
{
    launch_many(ctx, a, 1);
}

void cuda_adamw(const struct kernel_ctx *ctx, const struct adamw_args *a)
{
    launch_many(ctx, a, 1);
}

void cuda_apply(const struct kernel_ctx *ctx, const struct apply_args *a)
{
    launch_many(ctx, a, 1);
}

/* Sum of squares in double: a fixed grid, each thread a fixed set of elements, tree reductions
 * in a fixed order. The same bits for the same input every time (not the CPU's bits: another
 * order of additions). */
__global__ void k_sumsq_partial(const void *x, int dt, size_t n, double *partial)
{
    __shared__ double sh[CUDA_SUMSQ_THREADS];
    double acc = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const double v = kload(x, dt, i);
        acc += v * v;
    }
    block_reduce(sh, acc, &partial[blockIdx.x]);
}

__global__ void k_sumsq_final(const double *partial, double *out)
{
    __shared__ double sh[CUDA_SUMSQ_THREADS];
    double acc = 0;
    for (unsigned i = threadIdx.x; i < CUDA_SUMSQ_BLOCKS; i += blockDim.x)
        acc += partial[i];
    block_reduce(sh, acc, out);
}

/* One round trip for many tensors: each tensor's two kernels leave its total in the result
 * buffer (the block sums are reused in stream order), one copy brings them all up. */
void cuda_sumsq_many(const struct kernel_ctx *ctx, const void *const *x, const int *dt,
                     const size_t *n, int count, double *out)
{
    struct cuda_backend *be = cuda_be(ctx);
    cudaStream_t s = cuda_stream(ctx);
    for (int i0 = 0; i0 < count; i0 += CUDA_SUMSQ_RESULTS) {
        const int m = count - i0 < CUDA_SUMSQ_RESULTS ? count - i0 : CUDA_SUMSQ_RESULTS;
        double *res = be != NULL ? be->d_partial + CUDA_SUMSQ_BLOCKS : NULL;
        int ok = be != NULL;
        for (int i = 0; ok && i < m; i++) {
            if (n[i0 + i] == 0) {
                ok = cudaMemsetAsync(res + i, 0, sizeof(double), s) == cudaSuccess;
                continue;
            }
            k_sumsq_partial<<<CUDA_SUMSQ_BLOCKS, CUDA_SUMSQ_THREADS, 0, s>>>(
                x[i0 + i], dt[i0 + i], n[i0 + i], be->d_partial);
            k_sumsq_final<<<1, CUDA_SUMSQ_THREADS, 0, s>>>(be->d_partial, res + i);
            /* a launch that failed (no kernel image for this GPU, say) leaves the result
             * unwritten, and the synchronisation below would not say so */
            ok = cudaPeekAtLastError() == cudaSuccess;
        }
        ok = ok &&
             cudaMemcpyAsync(be->h_result, res, sizeof(double) * (size_t)m, cudaMemcpyDeviceToHost,
                             s) == cudaSuccess &&
             cudaStreamSynchronize(s) == cudaSuccess;
        for (int i = 0; i < m; i++)
            /* a failure (or no backend state: a caller error) reads as a non-finite norm */
            out[i0 + i] = ok ? be->h_result[i] : NAN;
    }
}

/* One tensor: a round trip of its own. */
double cuda_sumsq(const struct kernel_ctx *ctx, const void *x, int dt, size_t n)
{
    double r = 0.0;
    if (n > 0)
        cuda_sumsq_many(ctx, &x, &dt, &n, 1, &r);
    return r;
}

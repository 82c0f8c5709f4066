/* Entry points of the CPU kernel variants, assembled into tables by kernels/cpu/tables.c. */
#ifndef KERNELS_CPU_KERNELS_H
#define KERNELS_CPU_KERNELS_H

#include "../device.h"
#include "../ops.h"

/* Portable C: the reference, and the elementwise path of the portable table. */
void ref_momentum(const struct kernel_ctx *ctx, const struct momentum_args *a);
void ref_adamw(const struct kernel_ctx *ctx, const struct adamw_args *a);
void ref_apply(const struct kernel_ctx *ctx, const struct apply_args *a);
int ns_ref_newton_schulz(const struct kernel_ctx *ctx, const struct ns_args *a,
                         const struct ns_workspace *ws);

/* OpenBLAS Newton-Schulz (plain and symmetric variants). */
int ns_blas_newton_schulz(const struct kernel_ctx *ctx, const struct ns_args *a,
                          const struct ns_workspace *ws);

/* AVX-512 elementwise kernels; bit-identical to the ref_ ones. */
int cpu_avx512_supported(void);
void avx512_momentum(const struct kernel_ctx *ctx, const struct momentum_args *a);
void avx512_adamw(const struct kernel_ctx *ctx, const struct adamw_args *a);
void avx512_apply(const struct kernel_ctx *ctx, const struct apply_args *a);

/* AVX2 + FMA elementwise kernels, for CPUs without AVX-512; bit-identical to the ref_ ones. */
int cpu_avx2_supported(void);
void avx2_momentum(const struct kernel_ctx *ctx, const struct momentum_args *a);
void avx2_adamw(const struct kernel_ctx *ctx, const struct adamw_args *a);
void avx2_apply(const struct kernel_ctx *ctx, const struct apply_args *a);

void ns_shard_load(const struct kernel_ctx *ctx, const struct ns_args *a, double inv, float *x);
void ns_shard_store(const struct kernel_ctx *ctx, const struct ns_args *a, const float *x);
void ns_shard_gram_ref(const struct kernel_ctx *ctx, const float *x, int64_t m, int64_t n,
                       float *g);
void ns_shard_update_ref(const struct kernel_ctx *ctx, const float *g, const float c[3],
                         const float *x, int64_t m, int64_t n, float *B, float *y);
void ns_shard_gram_blas(const struct kernel_ctx *ctx, const float *x, int64_t m, int64_t n,
                        float *g);
void ns_shard_update_blas(const struct kernel_ctx *ctx, const float *g, const float c[3],
                          const float *x, int64_t m, int64_t n, float *B, float *y);

void cpu_copy2d(const struct kernel_ctx *ctx, void *dst, size_t dpitch, const void *src,
                size_t spitch, size_t width, size_t rows);
double cpu_sumsq(const struct kernel_ctx *ctx, const void *x, int dt, size_t n);

void cpu_copy(const struct kernel_ctx *ctx, void *dst, const void *src, size_t bytes);
void cpu_fill(const struct kernel_ctx *ctx, void *dst, int byte, size_t bytes);

int cpu_sync(const struct kernel_ctx *ctx);
size_t cpu_ns_workspace_bytes(int64_t rows, int64_t cols, int64_t batch);

void *cpu_alloc(size_t bytes);
void cpu_free(void *p);

#endif

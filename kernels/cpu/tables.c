/* The CPU kernel tables, the choice among them, and the CPU's device table (host memory). */
#include <stdlib.h>

#include "base/mem.h"
#include "cpu_kernels.h"

void *cpu_alloc(size_t bytes)
{
    /* 64-byte alignment: whole cache lines, aligned AVX-512 loads */
    return mem_aligned_alloc(64, bytes ? bytes : 64);
}

void cpu_free(void *p) { free(p); }

int cpu_sync(const struct kernel_ctx *ctx)
{
    (void)ctx;
    return 0;
}

size_t cpu_ns_workspace_bytes(int64_t rows, int64_t cols, int64_t batch)
{
    (void)batch;
    return ns_workspace_floats(rows, cols) * sizeof(float);
}

/* What every CPU table shares: the deterministic sum of squares, the sharded Newton-Schulz
 * load/store; the tables differ in elementwise and NS kernels. */
#define CPU_TABLE_COMMON                                                                           \
    .ns_shard_load = ns_shard_load, .ns_shard_store = ns_shard_store, .sumsq = cpu_sumsq,          \
    .ns_workspace_bytes = cpu_ns_workspace_bytes

/* The host is the device: memory the host touches, copies that are done when they return. It
 * claims no capability: no pinning, lanes, streams, marks or device to choose. */
static const struct device_ops cpu_device = {
    .name = "cpu",
    .caps = 0,
    .copy = cpu_copy,
    .copy2d = cpu_copy2d,
    .fill = cpu_fill,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .sync = cpu_sync,
};

const struct device_ops *device_ops_cpu(void) { return &cpu_device; }

static const struct kernel_ops cpu_ref = {
    .name = "cpu-ref",
    .momentum = ref_momentum,
    .adamw = ref_adamw,
    .apply = ref_apply,
    .newton_schulz = ns_ref_newton_schulz,
    .ns_shard_gram = ns_shard_gram_ref,
    .ns_shard_update = ns_shard_update_ref,
    CPU_TABLE_COMMON,
};

static const struct kernel_ops cpu_portable = {
    .name = "cpu-portable",
    .momentum = ref_momentum,
    .adamw = ref_adamw,
    .apply = ref_apply,
    .newton_schulz = ns_blas_newton_schulz,
    .ns_shard_gram = ns_shard_gram_blas,
    .ns_shard_update = ns_shard_update_blas,
    CPU_TABLE_COMMON,
};

#ifdef SHARDOPT_HAVE_AVX512_KERNELS
static const struct kernel_ops cpu_avx512 = {
    .name = "cpu-avx512",
    .momentum = avx512_momentum,
    .adamw = avx512_adamw,
    .apply = avx512_apply,
    .newton_schulz = ns_blas_newton_schulz,
    .ns_shard_gram = ns_shard_gram_blas,
    .ns_shard_update = ns_shard_update_blas,
    CPU_TABLE_COMMON,
};
#endif

#ifdef SHARDOPT_HAVE_AVX2_KERNELS
static const struct kernel_ops cpu_avx2 = {
    .name = "cpu-avx2",
    .momentum = avx2_momentum,
    .adamw = avx2_adamw,
    .apply = avx2_apply,
    .newton_schulz = ns_blas_newton_schulz,
    .ns_shard_gram = ns_shard_gram_blas,
    .ns_shard_update = ns_shard_update_blas,
    CPU_TABLE_COMMON,
};
#endif

const struct kernel_ops *kernel_ops_cpu_ref(void) { return &cpu_ref; }

const struct kernel_ops *kernel_ops_cpu_portable(void) { return &cpu_portable; }

const struct kernel_ops *kernel_ops_cpu_avx512(void)
{
#ifdef SHARDOPT_HAVE_AVX512_KERNELS
    return cpu_avx512_supported() ? &cpu_avx512 : NULL;
#else
    return NULL;
#endif
}

const struct kernel_ops *kernel_ops_cpu_avx2(void)
{
#ifdef SHARDOPT_HAVE_AVX2_KERNELS
    return cpu_avx2_supported() ? &cpu_avx2 : NULL;
#else
    return NULL;
#endif
}

const struct kernel_ops *kernel_ops_cpu_best(void)
{
    const struct kernel_ops *ops = kernel_ops_cpu_avx512();
    if (ops == NULL)
        ops = kernel_ops_cpu_avx2();
    return ops != NULL ? ops : &cpu_portable;
}

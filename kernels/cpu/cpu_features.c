#include "cpu_kernels.h"

/* The AVX-512 kernels use F, BW (16-bit lanes), VL and DQ. */
int cpu_avx512_supported(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#else
    return 0;
#endif
}

/* The AVX2 kernels use AVX2 and FMA. Checked here, in a file built without -mavx2, so that the
 * check itself runs on any x86-64. */
int cpu_avx2_supported(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}

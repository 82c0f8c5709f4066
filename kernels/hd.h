/* KHD marks a small inline function that both backends run: the C compiler sees a plain
 * function, nvcc a __host__ __device__ one. The update rules and the rounding are written once
 * this way, so the CPU reference and the CUDA kernels cannot drift apart. */
#ifndef KERNELS_HD_H
#define KERNELS_HD_H

#ifdef __CUDACC__
#define KHD __host__ __device__
#else
#define KHD
#endif

#endif

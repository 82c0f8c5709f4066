/* ns_bench --backend cuda (ns_bench_cuda.cu; a stub without CUDA). */
#ifndef BENCH_NS_BENCH_CUDA_H
#define BENCH_NS_BENCH_CUDA_H

#include <stdint.h>

/* shapes: {batch, rows, cols}; NULL or none: issue 7's shapes. Returns the exit code: 0, 1
 * (failure), 77 (no device/no CUDA). */
int ns_bench_cuda(const int64_t (*shapes)[3], int nshapes, int reps, int json);

#endif

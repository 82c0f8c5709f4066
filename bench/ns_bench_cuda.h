/* ns_bench --backend cuda (ns_bench_cuda.cu; a stub without CUDA). */
#ifndef BENCH_NS_BENCH_CUDA_H
#define BENCH_NS_BENCH_CUDA_H

#include <stdint.h>

/* shapes: {batch, rows, cols}; NULL or none: issue 7's shapes. algos (bit 0 standard, bit 1
 * gram) and preconds (bit 0 frobenius, bit 1 aol) add Gram and AOL columns beside the standard
 * ones (1, 1: none). Returns the exit code: 0, 1 (failure), 77 (no device/no CUDA). */
int ns_bench_cuda(const int64_t (*shapes)[3], int nshapes, int reps, int json, int algos,
                  int preconds);

#endif

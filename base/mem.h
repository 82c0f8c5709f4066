/* The library's one allocator: every host allocation of runtime/, sharding/, offload/ and
 * kernels/ goes through these, so that an allocation failure anywhere can be provoked in a test
 * (SHARDOPT_FAULT=alloc:<n>, docs/reliability.md) and reported with the bytes asked for.
 *
 * A base service like status and log: lower layers may include it. It is plain libc (no MPI, no
 * files, no environment): base/fault.c parses SHARDOPT_FAULT and arms it through
 * mem_fault_arm, so the one parser of that variable stays where the other sites are checked.
 * What these return is released with free(). State: one process-wide allocation counter and
 * target (fault injection, atomics) and, per thread, the size of the last failed request. */
#ifndef BASE_MEM_H
#define BASE_MEM_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" { /* kernels/cuda/ops_cuda.cu */
#endif

/* As malloc, calloc, realloc, strdup; on failure NULL with errno ENOMEM, *p kept by realloc. */
void *mem_malloc(size_t bytes);
void *mem_calloc(size_t n, size_t size);
void *mem_realloc(void *p, size_t bytes);
char *mem_strdup(const char *s);
/* As posix_memalign (align a power of two, a multiple of sizeof(void *)), returning the memory. */
void *mem_aligned_alloc(size_t align, size_t bytes);

/* bytes rounded up to a multiple of align (a power of two) in *out: 1, or 0 with *out untouched
 * when that multiple is past SIZE_MAX. The one rounding of sizes and offsets to an alignment:
 * a hand-written (bytes + 63) & ~63 wraps to a small size near SIZE_MAX, and a caller that
 * sizes an allocation with it writes past what it allocated; a caller refuses on 0, naming
 * what it was sizing. */
int mem_align_up(size_t bytes, size_t align, size_t *out);

/* For memory from another allocator (hwloc): 1 when this request of `bytes` is the one to fail,
 * counted as one allocation like the others. */
int mem_fault(size_t bytes);

/* The n-th allocation from now fails (once); n = 0 disarms. */
void mem_fault_arm(long n);

/* Allocations counted so far in this process (successful or not): tests size their injection
 * loops with it. */
unsigned long mem_count(void);

/* The size of this thread's last failed request since mem_failed_clear() (0: none). For failures
 * inside another library that allocates through us (cJSON), whose requests we do not see. */
size_t mem_failed_bytes(void);
void mem_failed_clear(void);

#ifdef __cplusplus
}
#endif

#endif

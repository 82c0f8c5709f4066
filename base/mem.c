#include "mem.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Allocations so far, and the count at which one fails (0: none). One atomic add per
 * allocation: the step allocates nothing, so this costs nothing where it matters. */
static atomic_ulong mem_counter;
static atomic_ulong mem_target;
static _Thread_local size_t mem_failed;

static int mem_fails(size_t bytes)
{
    const unsigned long k = atomic_fetch_add_explicit(&mem_counter, 1, memory_order_relaxed) + 1;
    const unsigned long target = atomic_load_explicit(&mem_target, memory_order_relaxed);
    if (target == 0 || k != target)
        return 0;
    mem_failed = bytes;
    errno = ENOMEM;
    return 1;
}

/* A real failure: remembered like an injected one. */
static void *mem_check(void *p, size_t bytes)
{
    if (p == NULL) {
        mem_failed = bytes;
        errno = ENOMEM;
    }
    return p;
}

void *mem_malloc(size_t bytes) { return mem_fails(bytes) ? NULL : mem_check(malloc(bytes), bytes); }

void *mem_calloc(size_t n, size_t size)
{
    size_t bytes;
    if (__builtin_mul_overflow(n, size, &bytes))
        bytes = SIZE_MAX;
    return mem_fails(bytes) ? NULL : mem_check(calloc(n, size), bytes);
}

void *mem_realloc(void *p, size_t bytes)
{
    return mem_fails(bytes) ? NULL : mem_check(realloc(p, bytes), bytes);
}

char *mem_strdup(const char *s)
{
    const size_t bytes = strlen(s) + 1;
    char *d = mem_malloc(bytes);
    if (d != NULL)
        memcpy(d, s, bytes);
    return d;
}

void *mem_aligned_alloc(size_t align, size_t bytes)
{
    void *p = NULL;
    if (mem_fails(bytes))
        return NULL;
    if (posix_memalign(&p, align, bytes) != 0)
        p = NULL;
    return mem_check(p, bytes);
}

int mem_align_up(size_t bytes, size_t align, size_t *out)
{
    if (bytes > SIZE_MAX - (align - 1))
        return 0;
    *out = (bytes + (align - 1)) & ~(align - 1);
    return 1;
}

int mem_fault(size_t bytes) { return mem_fails(bytes); }

void mem_fault_arm(long n)
{
    const unsigned long now = atomic_load(&mem_counter);
    atomic_store(&mem_target, n > 0 ? now + (unsigned long)n : 0);
}

unsigned long mem_count(void) { return atomic_load(&mem_counter); }

size_t mem_failed_bytes(void) { return mem_failed; }

void mem_failed_clear(void) { mem_failed = 0; }

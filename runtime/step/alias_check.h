/* Parameter buffers that share memory: two parameters registered on one data buffer (a tied
 * weight registered twice, a pointer copied by mistake) are updated twice per step, and a data
 * buffer that is also a gradient (its own or another parameter's) is written while the step reads
 * it; either gives a step that returns OK with wrong values. The step refuses both before it
 * writes anything. Gradients may share memory with each other: they are only read. Where host
 * kernels write the data, a data buffer in a mapping the process cannot write (/proc/self/maps)
 * is refused too: the step's first write was a SIGSEGV. */
#ifndef RUNTIME_STEP_ALIAS_CHECK_H
#define RUNTIME_STEP_ALIAS_CHECK_H

#include <stdint.h>

#include "runtime/runtime.h"

/* One buffer: [lo, hi) bytes of parameter `param`'s data (grad = 0) or gradient (grad = 1). */
struct alias_span {
    uintptr_t lo, hi;
    int param, grad;
};

/* This rank's check (the step agrees on the outcome): OK, or ERR_INVALID_ARGUMENT naming both
 * parameters, both buffers and their byte ranges. Sorts rt->alias (2 x nparams spans, allocated at
 * commit) only when a pointer changed since the last accepted check: O(parameters) otherwise. */
shardopt_status_t alias_check(shardopt_runtime_t rt);

/* 1 where [p, p + bytes) is not wholly memory this process may write (perms and path then name
 * the mapping in the way: "none" and "no mapping" for a gap), else 0 (also where it cannot be
 * told). For a buffer the library fills with memcpy (shardopt_param_get_state): a read-only
 * destination was a SIGSEGV there. Asks the kernel to write one byte of each page back onto
 * itself (process_vm_writev, which honours the protections and fails with EFAULT instead of a
 * signal): a few system calls, where reading /proc/self/maps took a millisecond in a process
 * that has torch loaded; the maps are read only to name a refused mapping, or where that call
 * is not allowed. */
int host_span_unwritable(const void *p, size_t bytes, char perms[8], char *path, size_t len);

#endif

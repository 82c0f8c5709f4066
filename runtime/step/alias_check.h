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

/* One buffer: [lo, hi) bytes of parameter `param`'s data (grad = 0) or gradient (grad = 1). lo and
 * hi first: mem_writable_first_read_only (base/mem_writable.h) reads the spans so. */
struct alias_span {
    uintptr_t lo, hi;
    int param, grad;
};

/* This rank's check (the step agrees on the outcome): OK, or ERR_INVALID_ARGUMENT naming both
 * parameters, both buffers and their byte ranges. Sorts rt->alias (2 x nparams spans, allocated at
 * commit) only when a pointer changed since the last accepted check: O(parameters) otherwise. */
shardopt_status_t alias_check(shardopt_runtime_t rt);

#endif

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
 * parameters, both buffers and their byte ranges; then alias_check_peers' check (below). Sorts
 * rt->alias (2 x nparams spans, allocated at commit) only when a pointer changed since the last
 * accepted check: O(parameters) otherwise. */
shardopt_status_t alias_check(shardopt_runtime_t rt);

/* Runtimes of one process whose parameters share memory (two optimizers over one model, a
 * param group's runtime over another's memory): each one's step checks only its own buffers, so
 * both update that memory, once each per step, and return OK. Each live runtime of the process
 * that stepped (the live list, runtime/live_list.h) keeps the data spans of its last step and a
 * sequence number.
 * Its check (in alias_check, at the step's validation): OK on a runtime's first step (a new
 * optimizer replacing an old one that is left alive is allowed), otherwise ERR_INVALID_ARGUMENT
 * naming both parameters where another runtime stepped memory this runtime's data overlaps since
 * this runtime's last step (both in use: that memory updated twice per step). O(1) with one
 * runtime; a look at each other live runtime, a merge of the sorted spans per runtime that stepped
 * since, and a sort of this runtime's data spans when one moved. alias_check_peers_stepped: after
 * a step that updated; alias_check_peers_leave: at commit_release and finalize, before the spans
 * and names are freed. Thread-safe (the live list's mutex). */
void alias_check_peers_stepped(shardopt_runtime_t rt);
void alias_check_peers_leave(shardopt_runtime_t rt);

#endif

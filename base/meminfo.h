/* How much host memory this process may still take: what commit compares the optimizer state
 * and buffers it is about to allocate with, so that a registration too large for the machine is
 * refused with the bytes instead of an OOM kill while the state is zeroed (Linux overcommits:
 * malloc of more than the machine has returns memory, and touching it kills the process). A base
 * service: files under /proc and /sys, the environment through base/env.c; no MPI. */
#ifndef BASE_MEMINFO_H
#define BASE_MEMINFO_H

#include <stddef.h>
#include <stdint.h>

/* The figure and where it came from. */
enum meminfo_kind {
    MEMINFO_KNOWN = 0, /* *bytes holds it; what names its source */
    MEMINFO_UNKNOWN,   /* nothing readable says (not Linux): no limit known */
    MEMINFO_BAD_HOOK,  /* SHARDOPT_MEM_AVAILABLE set to something that is not a byte count:
                          what holds the refusal, naming the variable and the value */
};

/* Bytes available: SHARDOPT_MEM_AVAILABLE (decimal digits: a test stands in a small machine
 * with it) when set, else the smallest of /proc/meminfo's MemAvailable and, under a cgroup v2
 * memory limit, memory.max less memory.current; else sysconf's available pages. `what` (len
 * bytes) names the source, e.g. "MemAvailable in /proc/meminfo". */
enum meminfo_kind meminfo_host_available(uint64_t *bytes, char *what, size_t len);

#endif

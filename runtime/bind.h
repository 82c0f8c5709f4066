/* Where this rank's threads should run (bind = auto): a pure decision over an hwloc topology, so
 * that it can be tested on synthetic machines, and its application at init. */
#ifndef RUNTIME_BIND_H
#define RUNTIME_BIND_H

#include <hwloc.h>

enum bind_action {
    BIND_KEEP = 0,    /* the launcher already bound this process: leave it */
    BIND_SET = 1,     /* bind to cpuset */
    BIND_OVERSUB = 2, /* more local ranks than cores: do not bind (and warn) */
};

struct bind_decision {
    enum bind_action action;
    hwloc_bitmap_t cpuset; /* SET: where to bind; KEEP: the current binding (owned) */
    int threads;           /* cores in that cpuset: the BLAS/OpenMP thread count to use */
    char why[200];
};

/* Decide for local rank `local_rank` of `local_size` ranks on this node, given the process's
 * current binding and, with CUDA, the cpuset local to its GPU (NULL otherwise). Returns 0, or -1
 * when out of memory. Free d->cpuset with hwloc_bitmap_free. */
int bind_decide(hwloc_topology_t topo, hwloc_const_cpuset_t current, int local_rank, int local_size,
                hwloc_const_cpuset_t gpu_cpuset, struct bind_decision *d);

/* Cores (or, without core objects, PUs) of topo that intersect set. */
int bind_count_cores(hwloc_topology_t topo, hwloc_const_cpuset_t set);

#endif

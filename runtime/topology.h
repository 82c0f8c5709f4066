/* The machine as hwloc sees it, loaded once at init: this rank's cpuset and NUMA nodes (logged),
 * optional binding (bind = auto), and the nodeset the host store allocates on. */
#ifndef RUNTIME_TOPOLOGY_H
#define RUNTIME_TOPOLOGY_H

#include <hwloc.h>

#include "shardopt.h"

struct topology {
    hwloc_topology_t topo;  /* NULL when hwloc could not load one (then nothing binds) */
    hwloc_bitmap_t cpuset;  /* where this process runs (after binding) */
    hwloc_bitmap_t nodeset; /* its NUMA nodes */
    int threads;            /* bind = auto: threads for that cpuset; 0 otherwise */
};

/* Load and log; with bind = auto, decide and bind (collective over `local`, a communicator of
 * the runtime's ranks, split by node inside). */
shardopt_status_t topology_init(struct topology *t, const shardopt_config_t *cfg, MPI_Comm local,
                                int rank);

void topology_free(struct topology *t);

#endif

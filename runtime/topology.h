/* The machine as hwloc sees it, loaded once at init: this rank's cpuset and NUMA nodes (logged),
 * optional binding (bind = auto), and the nodeset the host store allocates on. */
#ifndef RUNTIME_TOPOLOGY_H
#define RUNTIME_TOPOLOGY_H

#include <hwloc.h>

#include "runtime/comm/groups.h"
#include "shardopt.h"

struct topology {
    hwloc_topology_t topo;     /* NULL when hwloc could not load one (then nothing binds) */
    hwloc_bitmap_t cpuset;     /* where this process runs (after binding) */
    hwloc_bitmap_t nodeset;    /* its NUMA nodes */
    int threads;               /* bind = auto: threads for that cpuset; 0 otherwise */
    hwloc_bitmap_t gpu_cpuset; /* the cores local to this rank's GPU; NULL when unknown */
};

/* Load and log; with bind = auto, decide and bind (collective over `local`, a communicator of
 * the runtime's ranks, split by node inside under g's deadline). gpu_busid: the PCI bus id of
 * this rank's GPU ("0000:3b:00.0"), or NULL: bind = auto then binds to the GPU's local cores. */
shardopt_status_t topology_init(struct topology *t, const shardopt_config_t *cfg,
                                const struct groups *g, MPI_Comm local, const char *gpu_busid);

/* The cores local to the PCI device busid as Linux lists them (<sysfs_root>/bus/pci/devices/
 * <busid>/local_cpulist; sysfs_root is normally "/sys"). 0, or -1 when not readable. */
int topology_pci_cpuset(const char *sysfs_root, const char *busid, hwloc_bitmap_t out);

void topology_free(struct topology *t);

#endif

/* Host memory for optimizer state with offload: NUMA-local to this rank (hwloc_alloc_membind on
 * its nodes; pinned too once the CUDA backend registers it), bounded by host_store_limit. */
#ifndef OFFLOAD_HOST_STORE_H
#define OFFLOAD_HOST_STORE_H

#include <hwloc.h>
#include <stddef.h>
#include <stdint.h>

#include "shardopt_status.h"

/* bytes of memory bound to `nodes` (plain memory when topo is NULL or binding is refused: a
 * performance matter, not a correctness one) in *out. limit > 0 refuses larger requests.
 * SHARDOPT_ERR_OUT_OF_MEMORY, for the limit as for the memory, with the message (the bytes asked
 * for, and the limit) recorded by status_set and *out NULL. */
shardopt_status_t host_store_alloc(hwloc_topology_t topo, hwloc_const_nodeset_t nodes, size_t bytes,
                                   uint64_t limit, void **out);

void host_store_free(hwloc_topology_t topo, void *p, size_t bytes);

#endif

#include "host_store.h"

#include <stdlib.h>

#include "base/mem.h"
#include "base/status.h"

shardopt_status_t host_store_alloc(hwloc_topology_t topo, hwloc_const_nodeset_t nodes, size_t bytes,
                                   uint64_t limit, void **out)
{
    void *p = NULL;

    *out = NULL;
    if (limit > 0 && bytes > limit)
        return status_set(
            SHARDOPT_ERR_OUT_OF_MEMORY,
            "host store: %zu bytes of optimizer state asked for, host_store_limit is %llu", bytes,
            (unsigned long long)limit);
    const size_t n = bytes ? bytes : 1;
    if (topo == NULL) {
        p = mem_aligned_alloc(4096, n);
    } else if (!mem_fault(n)) { /* hwloc's memory: the fault counter sees the request */
        if (nodes != NULL && !hwloc_bitmap_iszero(nodes))
            p = hwloc_alloc_membind(topo, n, nodes, HWLOC_MEMBIND_BIND, HWLOC_MEMBIND_BYNODESET);
        if (p == NULL)
            p = hwloc_alloc(topo, n); /* binding refused: still page-aligned */
    }
    if (p == NULL)
        return status_set(SHARDOPT_ERR_OUT_OF_MEMORY,
                          "host store: out of memory allocating %zu bytes", n);
    *out = p;
    return SHARDOPT_OK;
}

void host_store_free(hwloc_topology_t topo, void *p, size_t bytes)
{
    if (p == NULL)
        return;
    if (topo != NULL)
        hwloc_free(topo, p, bytes ? bytes : 1);
    else
        free(p);
}

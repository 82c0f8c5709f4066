#include "runtime/bind.h"

#include <stdio.h>

int bind_count_cores(hwloc_topology_t topo, hwloc_const_cpuset_t set)
{
    hwloc_obj_type_t type =
        hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE) > 0 ? HWLOC_OBJ_CORE : HWLOC_OBJ_PU;
    int n = 0, total = hwloc_get_nbobjs_by_type(topo, type);
    for (int i = 0; i < total; i++)
        n += hwloc_bitmap_intersects(hwloc_get_obj_by_type(topo, type, i)->cpuset, set);
    return n;
}

int bind_decide(hwloc_topology_t topo, hwloc_const_cpuset_t current, int local_rank, int local_size,
                hwloc_const_cpuset_t gpu_cpuset, struct bind_decision *d)
{
    hwloc_const_cpuset_t allowed = hwloc_topology_get_allowed_cpuset(topo);

    d->cpuset = hwloc_bitmap_alloc();
    if (d->cpuset == NULL)
        return -1;
    /* a launcher's binding (mpirun --bind-to, taskset, Slurm) is the user's choice */
    if (!hwloc_bitmap_iszero(current) && !hwloc_bitmap_isincluded(allowed, current)) {
        hwloc_bitmap_copy(d->cpuset, current);
        d->action = BIND_KEEP;
        d->threads = bind_count_cores(topo, current);
        snprintf(d->why, sizeof d->why, "already bound by the launcher");
        return 0;
    }
    if (gpu_cpuset != NULL && !hwloc_bitmap_iszero(gpu_cpuset)) {
        hwloc_bitmap_copy(d->cpuset, gpu_cpuset);
        d->action = BIND_SET;
        d->threads = bind_count_cores(topo, gpu_cpuset);
        snprintf(d->why, sizeof d->why, "the cores local to this rank's GPU");
        return 0;
    }
    hwloc_obj_type_t type =
        hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE) > 0 ? HWLOC_OBJ_CORE : HWLOC_OBJ_PU;
    const int cores = hwloc_get_nbobjs_by_type(topo, type);
    if (local_size > cores) {
        hwloc_bitmap_copy(d->cpuset, allowed);
        d->action = BIND_OVERSUB;
        d->threads = 1;
        snprintf(d->why, sizeof d->why,
                 "%d ranks on this node share %d cores: oversubscribed, not binding", local_size,
                 cores);
        return 0;
    }
    /* contiguous blocks in topology order: a block stays inside one NUMA node and package
     * whenever the node's cores divide evenly among its ranks */
    const int per = cores / local_size;
    hwloc_bitmap_zero(d->cpuset);
    for (int i = local_rank * per; i < (local_rank + 1) * per; i++)
        hwloc_bitmap_or(d->cpuset, d->cpuset, hwloc_get_obj_by_type(topo, type, i)->cpuset);
    d->action = BIND_SET;
    d->threads = per;
    snprintf(d->why, sizeof d->why, "cores %d-%d of %d for local rank %d of %d", local_rank * per,
             (local_rank + 1) * per - 1, cores, local_rank, local_size);
    return 0;
}

#include "runtime/topology.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/status.h"
#include "runtime/bind.h"
#include "runtime/comm/comm_wait.h"

static void topology_log(const struct topology *t, int rank, const char *what,
                         const char *gpu_busid)
{
    char *cpus = NULL, *nodes = NULL, *gpu = NULL;
    if (!log_enabled(LOG_INFO))
        return;
    hwloc_bitmap_list_asprintf(&cpus, t->cpuset);
    hwloc_bitmap_list_asprintf(&nodes, t->nodeset);
    if (t->gpu_cpuset != NULL)
        hwloc_bitmap_list_asprintf(&gpu, t->gpu_cpuset);
    log_info("topology: rank %d runs on PUs %s, NUMA node(s) %s (%s); GPU %s local cpuset: %s",
             rank, cpus ? cpus : "?", nodes ? nodes : "?", what, gpu_busid ? gpu_busid : "-",
             gpu         ? gpu
             : gpu_busid ? "unknown (sysfs)"
                         : "n/a (CPU backend)");
    free(cpus);
    free(nodes);
    free(gpu);
}

int topology_pci_cpuset(const char *sysfs_root, const char *busid, hwloc_bitmap_t out)
{
    char path[512], id[64], line[4096];
    size_t n = 0;
    /* CUDA writes the bus id in upper case, sysfs names it in lower case */
    for (; busid[n] != '\0' && n + 1 < sizeof id; n++)
        id[n] = (char)tolower((unsigned char)busid[n]);
    id[n] = '\0';
    snprintf(path, sizeof path, "%s/bus/pci/devices/%s/local_cpulist", sysfs_root, id);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    const int ok = fgets(line, sizeof line, f) != NULL;
    fclose(f);
    if (!ok)
        return -1;
    line[strcspn(line, "\n")] = '\0';
    if (hwloc_bitmap_list_sscanf(out, line) != 0 || hwloc_bitmap_iszero(out))
        return -1;
    return 0;
}

shardopt_status_t topology_init(struct topology *t, const shardopt_config_t *cfg,
                                const struct groups *g, MPI_Comm local, const char *gpu_busid)
{
    const char *what = "bind = none: left as the process was";

    t->topo = NULL;
    t->threads = 0;
    t->gpu_cpuset = NULL;
    if (gpu_busid != NULL) {
        t->gpu_cpuset = hwloc_bitmap_alloc();
        if (t->gpu_cpuset != NULL && topology_pci_cpuset("/sys", gpu_busid, t->gpu_cpuset) != 0) {
            hwloc_bitmap_free(t->gpu_cpuset);
            t->gpu_cpuset = NULL;
        }
    }
    t->cpuset = hwloc_bitmap_alloc();
    t->nodeset = hwloc_bitmap_alloc();
    if (t->cpuset == NULL || t->nodeset == NULL)
        return log_fail(SHARDOPT_ERR_OUT_OF_MEMORY, "init: hwloc bitmaps");
    if (hwloc_topology_init(&t->topo) != 0 || hwloc_topology_load(t->topo) != 0) {
        if (t->topo != NULL)
            hwloc_topology_destroy(t->topo);
        t->topo = NULL;
        log_warn("init: hwloc could not load the topology: no binding, host memory not NUMA-bound");
    } else if (hwloc_get_cpubind(t->topo, t->cpuset, HWLOC_CPUBIND_PROCESS) != 0) {
        hwloc_bitmap_copy(t->cpuset, hwloc_topology_get_allowed_cpuset(t->topo));
    }

    /* bind = auto: the node's ranks of this runtime decide together (collective on `local`) */
    if (cfg->bind == SHARDOPT_BIND_AUTO) {
        MPI_Comm node;
        int local_rank = 0, local_size = 1;
        const char *was = comm_phase_now();
        comm_phase("init: splitting the ranks by node (bind = auto)", -1);
        /* on failure (a fault), the rank decides alone, as the node's only one */
        if (comm_split_node(g, local, 0, &node, "node's group") == MPI_SUCCESS) {
            MPI_Comm_rank(node, &local_rank);
            MPI_Comm_size(node, &local_size);
            MPI_Comm_free(&node);
        }
        comm_phase(was, -1);
        struct bind_decision d;
        if (t->topo != NULL &&
            bind_decide(t->topo, t->cpuset, local_rank, local_size, t->gpu_cpuset, &d) == 0) {
            if (d.action == BIND_SET &&
                hwloc_set_cpubind(t->topo, d.cpuset, HWLOC_CPUBIND_PROCESS) != 0)
                log_warn("init: binding to %s failed; running unbound", d.why);
            else if (d.action == BIND_SET)
                hwloc_bitmap_copy(t->cpuset, d.cpuset);
            if (d.action == BIND_OVERSUB)
                log_warn("init: %s", d.why);
            t->threads = d.threads;
            what = d.why;
            hwloc_bitmap_free(d.cpuset);
        }
    }
    if (t->topo != NULL)
        hwloc_cpuset_to_nodeset(t->topo, t->cpuset, t->nodeset);
    topology_log(t, g->me.rank, what, gpu_busid);
    return SHARDOPT_OK;
}

void topology_free(struct topology *t)
{
    hwloc_bitmap_free(t->cpuset);
    hwloc_bitmap_free(t->nodeset);
    hwloc_bitmap_free(t->gpu_cpuset);
    t->gpu_cpuset = NULL;
    if (t->topo != NULL)
        hwloc_topology_destroy(t->topo);
    t->topo = NULL;
    t->cpuset = t->nodeset = NULL;
}

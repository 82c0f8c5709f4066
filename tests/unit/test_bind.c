/* The bind decision on synthetic machines (no binding is applied here), and the GPU-local cores
 * read from sysfs. */
#include <stdlib.h>

#include "runtime/bind.h"
#include "runtime/topology.h"
#include "test.h"

static hwloc_topology_t synthetic(const char *desc)
{
    hwloc_topology_t t;
    hwloc_topology_init(&t);
    if (hwloc_topology_set_synthetic(t, desc) != 0 || hwloc_topology_load(t) != 0) {
        fprintf(stderr, "synthetic topology '%s' refused\n", desc);
        exit(1);
    }
    return t;
}

TEST(two_packages_two_numa_eight_cores_four_ranks)
{
    hwloc_topology_t t = synthetic("package:2 numa:2 core:8 pu:1");
    hwloc_bitmap_t all = hwloc_bitmap_dup(hwloc_topology_get_allowed_cpuset(t));
    hwloc_bitmap_t seen = hwloc_bitmap_alloc();
    EXPECT_EQ_INT(hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE), 4);
    for (int r = 0; r < 4; r++) {
        struct bind_decision d;
        ASSERT_EQ_INT(bind_decide(t, all, r, 4, NULL, &d), 0);
        EXPECT_EQ_INT(d.action, BIND_SET);
        EXPECT_EQ_INT(d.threads, 8);
        EXPECT_EQ_INT(hwloc_bitmap_weight(d.cpuset), 8);
        /* inside exactly one NUMA node, and disjoint from the other ranks */
        int in = 0;
        for (int n = 0; n < 4; n++)
            in += hwloc_bitmap_isincluded(d.cpuset,
                                          hwloc_get_obj_by_type(t, HWLOC_OBJ_NUMANODE, n)->cpuset);
        EXPECT_EQ_INT(in, 1);
        EXPECT_TRUE(!hwloc_bitmap_intersects(d.cpuset, seen));
        hwloc_bitmap_or(seen, seen, d.cpuset);
        hwloc_bitmap_free(d.cpuset);
    }
    EXPECT_TRUE(hwloc_bitmap_isequal(seen, all));
    hwloc_bitmap_free(seen);
    hwloc_bitmap_free(all);
    hwloc_topology_destroy(t);
}

TEST(eight_ranks_on_two_cores_do_not_bind)
{
    hwloc_topology_t t = synthetic("numa:1 core:2 pu:1");
    hwloc_bitmap_t all = hwloc_bitmap_dup(hwloc_topology_get_allowed_cpuset(t));
    struct bind_decision d;
    ASSERT_EQ_INT(bind_decide(t, all, 5, 8, NULL, &d), 0);
    EXPECT_EQ_INT(d.action, BIND_OVERSUB);
    EXPECT_EQ_INT(d.threads, 1);
    EXPECT_STR_CONTAINS(d.why, "8 ranks on this node share 2 cores");
    hwloc_bitmap_free(d.cpuset);
    hwloc_bitmap_free(all);
    hwloc_topology_destroy(t);
}

TEST(an_already_bound_process_is_left_alone)
{
    hwloc_topology_t t = synthetic("package:2 numa:2 core:8 pu:2");
    hwloc_bitmap_t bound = hwloc_bitmap_dup(hwloc_get_obj_by_type(t, HWLOC_OBJ_CORE, 13)->cpuset);
    hwloc_bitmap_or(bound, bound, hwloc_get_obj_by_type(t, HWLOC_OBJ_CORE, 14)->cpuset);
    struct bind_decision d;
    ASSERT_EQ_INT(bind_decide(t, bound, 0, 4, NULL, &d), 0);
    EXPECT_EQ_INT(d.action, BIND_KEEP);
    EXPECT_TRUE(hwloc_bitmap_isequal(d.cpuset, bound));
    EXPECT_EQ_INT(d.threads, 2); /* two cores, four PUs */
    hwloc_bitmap_free(d.cpuset);
    hwloc_bitmap_free(bound);
    hwloc_topology_destroy(t);
}

TEST(a_gpu_cpuset_wins_when_not_bound)
{
    hwloc_topology_t t = synthetic("package:2 numa:2 core:8 pu:1");
    hwloc_bitmap_t all = hwloc_bitmap_dup(hwloc_topology_get_allowed_cpuset(t));
    hwloc_const_cpuset_t gpu = hwloc_get_obj_by_type(t, HWLOC_OBJ_NUMANODE, 2)->cpuset;
    struct bind_decision d;
    ASSERT_EQ_INT(bind_decide(t, all, 1, 4, gpu, &d), 0);
    EXPECT_EQ_INT(d.action, BIND_SET);
    EXPECT_TRUE(hwloc_bitmap_isequal(d.cpuset, gpu));
    EXPECT_EQ_INT(d.threads, 8);
    hwloc_bitmap_free(d.cpuset);
    hwloc_bitmap_free(all);
    hwloc_topology_destroy(t);
}

/* The GPU's local cores come from sysfs (topology_pci_cpuset), found by CUDA's upper-case bus id
 * under its lower-case sysfs name; an unreadable or empty list is "unknown", never "no cores". */
TEST(gpu_local_cores_read_from_sysfs)
{
    char root[] = "/tmp/shardopt_sysfs_XXXXXX", path[256];
    ASSERT_TRUE(mkdtemp(root) != NULL);
    snprintf(path, sizeof path,
             "mkdir -p '%s/bus/pci/devices/0000:3b:00.0' "
             "'%s/bus/pci/devices/0000:5e:00.0'",
             root, root);
    ASSERT_EQ_INT(system(path), 0);
    snprintf(path, sizeof path, "%s/bus/pci/devices/0000:3b:00.0/local_cpulist", root);
    FILE *f = fopen(path, "w");
    ASSERT_TRUE(f != NULL);
    fputs("0-3,8-11\n", f);
    fclose(f);
    snprintf(path, sizeof path, "%s/bus/pci/devices/0000:5e:00.0/local_cpulist", root);
    f = fopen(path, "w");
    ASSERT_TRUE(f != NULL);
    fclose(f); /* empty */

    hwloc_bitmap_t set = hwloc_bitmap_alloc(), want = hwloc_bitmap_alloc();
    hwloc_bitmap_list_sscanf(want, "0-3,8-11");
    EXPECT_EQ_INT(topology_pci_cpuset(root, "0000:3B:00.0", set), 0);
    EXPECT_TRUE(hwloc_bitmap_isequal(set, want));
    EXPECT_EQ_INT(topology_pci_cpuset(root, "0000:5E:00.0", set), -1);
    EXPECT_EQ_INT(topology_pci_cpuset(root, "0000:99:00.0", set), -1);
    hwloc_bitmap_free(set);
    hwloc_bitmap_free(want);
    snprintf(path, sizeof path, "rm -rf '%s'", root);
    EXPECT_EQ_INT(system(path), 0);
}

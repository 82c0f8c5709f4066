#include "runtime/cpu_kinds.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "base/status.h"
#include "kernels/blas_threads.h"
#include "kernels/cpu/ns_bf16.h"

#define KIND_LEN 112

void cpu_kinds_of(const struct shardopt_runtime *rt, char *buf, size_t len)
{
    buf[0] = '\0';
    if (device_has(rt->dev, DEVICE_CAP_DEVICE_MEMORY))
        return; /* the device runs the step: its kernels' bits are the device's */
    int n = snprintf(buf, len, "%s", rt->ops->name);
    if (!rt_ns_on_device(rt) && n >= 0 && (size_t)n < len)
        n += snprintf(buf + n, len - (size_t)n, ", OpenBLAS %s", blas_threads_core());
    if (!rt_ns_on_device(rt) && rt->ns_compute == KDT_BF16 && n >= 0 && (size_t)n < len)
        snprintf(buf + n, len - (size_t)n, ", bf16 %s", ns_bf16_native() ? "native" : "emulated");
}

/* FNV-1a-64 of the text: equal kinds, equal words */
static uint64_t kind_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s != '\0'; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

shardopt_status_t cpu_kinds_agree(shardopt_runtime_t rt, int *mixed)
{
    const struct groups *g = &rt->groups;
    char mine[KIND_LEN];
    if (mixed != NULL)
        *mixed = 0;
    cpu_kinds_of(rt, mine, sizeof mine);
    if (mine[0] == '\0') /* the config (agreed) puts every rank's step on the device */
        return SHARDOPT_OK;
    const uint64_t h = kind_hash(mine);
    uint64_t v[2] = {h, ~h}; /* MIN of both: the smallest and the largest hash */
    if (groups_allreduce(g, v, 2, MPI_UINT64_T, MPI_MIN) != MPI_SUCCESS)
        return groups_agree(g, log_fail(SHARDOPT_ERR_COMM, "init: CPU kind all-reduce failed"),
                            "init");
    if (v[0] == ~v[1])
        return SHARDOPT_OK;
    /* they differ: the lowest rank of each end, and both texts (equal hashes, equal bytes: the
     * MAX of the bytes is that text) */
    int who[2] = {h == v[0] ? groups_rank(g) : INT_MAX, h == ~v[1] ? groups_rank(g) : INT_MAX};
    unsigned char text[2][KIND_LEN];
    memset(text, 0, sizeof text);
    if (h == v[0])
        memcpy(text[0], mine, strlen(mine));
    if (h == ~v[1])
        memcpy(text[1], mine, strlen(mine));
    if (groups_allreduce(g, who, 2, MPI_INT, MPI_MIN) != MPI_SUCCESS ||
        groups_allreduce(g, text, 2 * KIND_LEN, MPI_UNSIGNED_CHAR, MPI_MAX) != MPI_SUCCESS)
        return groups_agree(g, log_fail(SHARDOPT_ERR_COMM, "init: CPU kind all-reduce failed"),
                            "init");
    text[0][KIND_LEN - 1] = text[1][KIND_LEN - 1] = '\0';
    if (mixed != NULL)
        *mixed = 1;
    const int lo = who[0] < who[1] ? 0 : 1;
    if (groups_rank(g) == 0)
        log_warn("init: the ranks run different kinds of CPU kernels: rank %d has %s, rank %d "
                 "has %s%s; bits are per kind of CPU (Newton-Schulz's BLAS sums in another "
                 "order), so results agree across layouts to rounding only, not bitwise%s "
                 "(docs/design.md, Determinism)",
                 who[lo], (const char *)text[lo], who[1 - lo], (const char *)text[1 - lo],
                 " (maybe other ranks and kinds too)",
                 g->mesh.dp_replicate > 1 && !rt->cfg.replica_split
                     ? ", and replicas whose owners differ in kind drift apart "
                       "(replica_check_every fails)"
                     : "");
    return SHARDOPT_OK;
}

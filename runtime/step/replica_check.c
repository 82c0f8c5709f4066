#include "runtime/step/replica_check.h"

#include <stdio.h>
#include <string.h>

#include "base/crc32c.h"
#include "base/log.h"
#include "base/status.h"
#include "runtime/comm/comm_wait.h"
#include "runtime/runtime.h"

static uint32_t shard_crc(struct shardopt_runtime *rt, const struct shardopt_param *p)
{
    const size_t bytes = (size_t)p->layout.local_numel * kdtype_size(p->param_dtype);
    if (!rt_on_device(rt))
        return crc32c_update(0, p->data, bytes);
    uint32_t crc = 0; /* device memory: through the host buffer, a chunk at a time */
    for (size_t off = 0; off < bytes; off += REPLICA_CHECK_CHUNK) {
        const size_t n = bytes - off < REPLICA_CHECK_CHUNK ? bytes - off : REPLICA_CHECK_CHUNK;
        rt->dev->copy(&rt->kctx, rt->drift_host, (const char *)p->data + off, n);
        if (rt->dev->sync(&rt->kctx) != 0)
            return ~crc; /* a failed copy reads as a difference, and is reported as one */
        crc = crc32c_update(crc, rt->drift_host, n);
    }
    return crc;
}

/* The members' CRCs of parameter i over comm, as text for the message. */
static void members_text(const struct groups *g, uint32_t crc, MPI_Comm comm, const char *who,
                         char *out, size_t len)
{
    int size = 1, o = 0;
    uint32_t all[16];
    MPI_Comm_size(comm, &size);
    if (size > 16) {
        snprintf(out, len, "%d members (too many to list)", size);
        return;
    }
    comm_allgather(g, comm, &crc, 1, MPI_UINT32_T, all, "CRC all-gather");
    out[0] = '\0';
    for (int r = 0; r < size && o < (int)len; r++)
        o += snprintf(out + o, len - (size_t)o, "%s%s %d 0x%08x", r ? ", " : "", who, r, all[r]);
}

shardopt_status_t replica_check(struct shardopt_runtime *rt)
{
    const int n = rt->nparams;
    uint32_t *dense_lo = rt->drift, *dense_hi = rt->drift + n, *rep_lo = rt->drift + 2 * n,
             *rep_hi = rt->drift + 3 * n;
    for (int i = 0; i < n; i++) {
        const struct shardopt_param *p = rt->params[i];
        rep_lo[i] = rep_hi[i] = shard_crc(rt, p);
        /* only replicated tensors are the same across the dense group: others compare as 0 */
        dense_lo[i] = dense_hi[i] = p->placement == SHARDOPT_PLACEMENT_REPLICATED ? rep_lo[i] : 0;
    }
    comm_allreduce(&rt->groups, rt->groups.dense, MPI_IN_PLACE, dense_lo, n, MPI_UINT32_T, MPI_MIN,
                   "CRC all-reduce");
    comm_allreduce(&rt->groups, rt->groups.dense, MPI_IN_PLACE, dense_hi, n, MPI_UINT32_T, MPI_MAX,
                   "CRC all-reduce");
    comm_allreduce(&rt->groups, rt->groups.rep, MPI_IN_PLACE, rep_lo, n, MPI_UINT32_T, MPI_MIN,
                   "CRC all-reduce");
    comm_allreduce(&rt->groups, rt->groups.rep, MPI_IN_PLACE, rep_hi, n, MPI_UINT32_T, MPI_MAX,
                   "CRC all-reduce");
    /* every rank saw the same minima and maxima of its groups; the first difference anywhere
     * decides, agreed over both groups so that all ranks name the same parameter */
    int first[2] = {n, n};
    for (int i = 0; i < n && first[0] == n; i++)
        if (rep_lo[i] != rep_hi[i])
            first[0] = i;
    for (int i = 0; i < n && first[1] == n; i++)
        if (dense_lo[i] != dense_hi[i])
            first[1] = i;
    groups_allreduce(&rt->groups, first, 2, MPI_INT, MPI_MIN);
    if (first[0] == n && first[1] == n)
        return SHARDOPT_OK;
    const int in_rep = first[0] <= first[1];
    const int i = in_rep ? first[0] : first[1];
    char who[1024];
    /* the members' values in this rank's own group (collective over it) */
    members_text(&rt->groups, shard_crc(rt, rt->params[i]),
                 in_rep ? rt->groups.rep : rt->groups.dense, in_rep ? "replica" : "dense rank", who,
                 sizeof who);
    const int mine_differs = in_rep ? rep_lo[i] != rep_hi[i] : dense_lo[i] != dense_hi[i];
    if (!mine_differs) /* the difference is in another rank's group */
        strncat(who, "; equal in this rank's group, another differs", sizeof who - strlen(who) - 1);
    return log_fail(
        SHARDOPT_ERR_MISMATCH,
        "step %llu: replica check: parameter '%s' differs across the %s after the "
        "update (CRC-32C of the shard: %s); the replicas no longer train the same model",
        (unsigned long long)rt->counters.steps, rt->params[i]->name,
        in_rep ? "replicate group" : "dense group (a replicated tensor)", who);
}

#include "mesh.h"

shardopt_status_t mesh_init(struct mesh *m, int world, int dp_replicate, int dp_shard, int cp,
                            int ep)
{
    if (world < 1 || dp_replicate < 1 || cp < 1 || ep < 1 || (dp_shard < 1 && dp_shard != -1))
        return status_set(
            SHARDOPT_ERR_INVALID_ARGUMENT,
            "layout dp_replicate %d, dp_shard %d, cp %d, ep %d: every size must be >= 1 "
            "(dp_shard may be -1: the rest)",
            dp_replicate, dp_shard, cp, ep);
    if (dp_shard == -1) {
        /* in 64 bits: the config allows each up to 2^20, and 2^16 x 2^16 is 0 in an int */
        const long rc = (long)dp_replicate * cp;
        if (world % rc != 0)
            return status_set(
                SHARDOPT_ERR_INVALID_ARGUMENT,
                "layout: %d ranks cannot be split as dp_replicate %d x cp %d x dp_shard "
                "(the rest): %d is not a multiple of %ld",
                world, dp_replicate, cp, world, rc);
        dp_shard = (int)(world / rc);
    }
    if ((long)dp_replicate * dp_shard * cp != world)
        return status_set(
            SHARDOPT_ERR_INVALID_ARGUMENT,
            "layout: dp_replicate %d x dp_shard %d x cp %d = %ld ranks, but the communicator "
            "has %d",
            dp_replicate, dp_shard, cp, (long)dp_replicate * dp_shard * cp, world);
    const int dense = dp_shard * cp;
    if (dense % ep != 0)
        return status_set(
            SHARDOPT_ERR_INVALID_ARGUMENT,
            "layout: ep %d must divide dp_shard x cp = %d x %d = %d (EP borrows CP and part "
            "of dp_shard)",
            ep, dp_shard, cp, dense);
    if (ep > 1 && ep % cp != 0)
        return status_set(SHARDOPT_ERR_INVALID_ARGUMENT,
                          "layout: ep %d with cp %d: when ep > 1, cp must divide ep", ep, cp);
    m->world = world;
    m->dp_replicate = dp_replicate;
    m->dp_shard = dp_shard;
    m->cp = cp;
    m->ep = ep;
    m->dense = dense;
    return SHARDOPT_OK;
}

void mesh_coords(const struct mesh *m, int rank, struct mesh_coords *c)
{
    c->rank = rank;
    c->rep = rank / m->dense;
    c->d = rank % m->dense;
    c->shard = c->d / m->cp;
    c->cp_index = c->d % m->cp;
    c->ep_block = c->d / m->ep;
    c->ep_rank = c->d % m->ep;
    c->xs_rank = c->d / m->ep;
}

struct mesh_split mesh_split(const struct mesh *m, const struct mesh_coords *c, enum mesh_group g)
{
    switch (g) {
    case MESH_DENSE: return (struct mesh_split){c->rep, c->d};
    /* EP: the replica's consecutive blocks of ep dense ranks */
    case MESH_EP: return (struct mesh_split){c->rep * (m->dense / m->ep) + c->ep_block, c->ep_rank};
    /* expert shard: the replica's dense ranks of one EP rank */
    case MESH_XS: return (struct mesh_split){c->rep * m->ep + c->ep_rank, c->xs_rank};
    default: return (struct mesh_split){c->d, c->rep}; /* replicate: one dense rank's replicas */
    }
}

/* The process mesh: ranks as coordinates over [dp_replicate, dp_shard, cp] (row-major, the order
 * of a PyTorch DeviceMesh over those names) and the groups built from them (docs/design.md, Process
 * groups). Pure arithmetic: no MPI. */
#ifndef SHARDING_MESH_H
#define SHARDING_MESH_H

#include <stddef.h>

#include "base/status.h"

struct mesh {
    int world;
    int dp_replicate, dp_shard, cp, ep;
    int dense; /* dp_shard * cp: ranks of one replica */
};

/* A rank's place in the mesh and its rank inside each group. */
struct mesh_coords {
    int rank;
    int rep;      /* replica index = rank in the replicate group */
    int shard;    /* dp_shard index */
    int cp_index; /* cp index */
    int d;        /* shard * cp + cp_index = rank in the dense shard group */
    int ep_block; /* d / ep: which EP group of the replica */
    int ep_rank;  /* d % ep: rank in the EP group, and which expert shard group */
    int xs_rank;  /* d / ep: rank in the expert shard group */
};

/* Resolve and check a layout for `world` ranks; dp_shard = -1 takes the rest. Returns
 * SHARDOPT_OK, or SHARDOPT_ERR_INVALID_ARGUMENT with a message giving the numbers recorded as the
 * last error (status_set: the caller adds its context and logs it). */
shardopt_status_t mesh_init(struct mesh *m, int world, int dp_replicate, int dp_shard, int cp,
                            int ep);

void mesh_coords(const struct mesh *m, int rank, struct mesh_coords *c);

enum mesh_group { MESH_DENSE, MESH_EP, MESH_XS, MESH_REP, MESH_GROUPS };

/* A rank's group as an MPI_Comm_split over all ranks takes it: the members are the ranks of the
 * same colour, and the key is the rank's place among them (0 .. size - 1). The one encoding of
 * membership: runtime/comm/groups.c splits with it, and the tests read memberships from it. */
struct mesh_split {
    int color, key;
};
struct mesh_split mesh_split(const struct mesh *m, const struct mesh_coords *c, enum mesh_group g);

/* Sizes of the expert shard group and the EP group. */
static inline int mesh_xs_size(const struct mesh *m) { return m->dense / m->ep; }

#endif

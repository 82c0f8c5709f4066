/* replica_check_every: replicas must hold the same parameters after every step (the same
 * gradients, the same update, bit for bit); a replica that drifted (a flipped bit, a trainer that
 * fed one replica other gradients) is found by comparing a CRC-32C of every parameter shard. */
#ifndef SHARDOPT_RUNTIME_REPLICA_CHECK_H
#define SHARDOPT_RUNTIME_REPLICA_CHECK_H

#include "shardopt.h"

/* Bytes of the host buffer device-resident parameters are checksummed through. */
#define REPLICA_CHECK_CHUNK ((size_t)4 << 20)

struct shardopt_runtime;

/* Collective over the runtime. Replicated tensors are compared across every rank, the others
 * across the replicate group. SHARDOPT_OK, or SHARDOPT_ERR_MISMATCH on every rank naming the
 * first parameter that differs (in registration order), the group and each member's CRC. */
shardopt_status_t replica_check(struct shardopt_runtime *rt);

#endif

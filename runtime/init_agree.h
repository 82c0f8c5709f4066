/* Init's collective checks: every rank fails init in the same call, and every rank runs with
 * the same config. */
#ifndef RUNTIME_INIT_AGREE_H
#define RUNTIME_INIT_AGREE_H

#include "groups.h"

/* Before the groups exist: the worst status of the local checks (config, kernels) over comm a,
 * then comm b (MPI_COMM_NULL: none), with the lowest world rank's message, prefixed with that
 * rank. A rank that fails alone would otherwise leave the others splitting communicators without
 * it. Local (no communication) when MPI is not initialised. */
shardopt_status_t init_agree(MPI_Comm a, MPI_Comm b, shardopt_status_t mine, const char *who);

/* Collective: SHARDOPT_ERR_MISMATCH on every rank when a config key differs between ranks,
 * naming the key, rank 0's value and the lowest other rank's. Thread placement (num_threads,
 * bind) is a per-node choice and may differ. */
shardopt_status_t config_agree(const struct groups *g, const shardopt_config_t *cfg,
                               const char *who);

#endif

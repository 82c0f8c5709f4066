/* Init's check that every rank runs with the same config. */
#ifndef RUNTIME_CONFIG_AGREE_H
#define RUNTIME_CONFIG_AGREE_H

#include "runtime/comm/groups.h"

/* Collective: SHARDOPT_ERR_MISMATCH on every rank when a config key differs between ranks,
 * naming the key, rank 0's value and the lowest other rank's. Thread placement (num_threads,
 * bind) is a per-node choice and may differ. */
shardopt_status_t config_agree(const struct groups *g, const shardopt_config_t *cfg,
                               const char *who);

#endif

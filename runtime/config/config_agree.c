#include "runtime/config/config_agree.h"

#include <stdio.h>
#include <string.h>

#include "base/crc32c.h"
#include "base/status.h"
#include "runtime/config/config_keys.h"

static int key_is_local(const char *name)
{
    return strcmp(name, "num_threads") == 0 || strcmp(name, "bind") == 0;
}

shardopt_status_t config_agree(const struct groups *g, const shardopt_config_t *cfg,
                               const char *who)
{
    enum { MAX_KEYS = 64 };
    uint32_t lo[MAX_KEYS] = {0}, hi[MAX_KEYS] = {0};
    char val[1024];
    const int n = (int)(config_key_count < MAX_KEYS ? config_key_count : MAX_KEYS);

    /* one CRC per key: the minimum and the maximum over all ranks differ where a value does */
    for (int i = 0; i < n; i++) {
        if (key_is_local(config_keys[i].name))
            continue;
        config_key_format(&config_keys[i], cfg, val, sizeof val);
        lo[i] = hi[i] = crc32c_update(0, val, strlen(val));
    }
    if (groups_allreduce(g, lo, n, MPI_UINT32_T, MPI_MIN) != MPI_SUCCESS ||
        groups_allreduce(g, hi, n, MPI_UINT32_T, MPI_MAX) != MPI_SUCCESS)
        return groups_agree(g, log_fail(SHARDOPT_ERR_COMM, "%s: config all-reduce failed", who),
                            who);
    int k = 0;
    while (k < n && lo[k] == hi[k])
        k++;
    if (k == n)
        return SHARDOPT_OK;
    /* rank 0's value of the first key that differs; each rank holding another says so */
    char ref[sizeof val];
    config_key_format(&config_keys[k], cfg, val, sizeof val);
    memcpy(ref, val, sizeof ref);
    groups_bcast(g, ref, (int)sizeof ref, MPI_CHAR);
    shardopt_status_t mine = SHARDOPT_OK;
    if (strcmp(ref, val) != 0)
        mine = log_fail(SHARDOPT_ERR_MISMATCH,
                        "%s: config %s differs between ranks: rank 0 has %s, rank %d has %s (every "
                        "rank must pass the same config)",
                        who, config_keys[k].name, ref, g->me.rank, val);
    return groups_agree(g, mine, who);
}

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

/* Keys compared per pair of all-reduces. The keys are taken in batches of it, every one of the
 * table's: a fixed array of 64 CRCs with the count clamped to it left every key past the 64th
 * uncompared, silently (54 keys today), had the table grown past it. */
enum { AGREE_BATCH = 64 };

/* The index of the first key from `first` (a batch) whose value differs between ranks, or -1;
 * -2 where an all-reduce failed. Collective: every rank runs the same batches. */
static int first_differing(const struct groups *g, const shardopt_config_t *cfg, size_t first)
{
    uint32_t lo[AGREE_BATCH] = {0}, hi[AGREE_BATCH] = {0};
    char val[CONFIG_TEXT_MAX];
    const size_t left = config_key_count - first;
    const int n = (int)(left < AGREE_BATCH ? left : AGREE_BATCH);
    /* one CRC per key: the minimum and the maximum over all ranks differ where a value does */
    for (int i = 0; i < n; i++) {
        const struct config_key *k = &config_keys[first + (size_t)i];
        if (key_is_local(k->name))
            continue;
        config_key_format(k, cfg, val, sizeof val);
        lo[i] = hi[i] = crc32c_update(0, val, strlen(val));
    }
    if (groups_allreduce(g, lo, n, MPI_UINT32_T, MPI_MIN) != MPI_SUCCESS ||
        groups_allreduce(g, hi, n, MPI_UINT32_T, MPI_MAX) != MPI_SUCCESS)
        return -2;
    for (int i = 0; i < n; i++)
        if (lo[i] != hi[i])
            return (int)first + i;
    return -1;
}

shardopt_status_t config_agree(const struct groups *g, const shardopt_config_t *cfg,
                               const char *who)
{
    char val[CONFIG_TEXT_MAX];
    int k = -1;
    for (size_t first = 0; first < config_key_count && k == -1; first += AGREE_BATCH)
        k = first_differing(g, cfg, first);
    if (k == -2)
        return groups_agree(g, log_fail(SHARDOPT_ERR_COMM, "%s: config all-reduce failed", who),
                            who);
    if (k < 0)
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

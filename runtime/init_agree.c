#include "init_agree.h"

#include <stdio.h>
#include <string.h>

#include "config_keys.h"
#include "crc32c.h"
#include "status.h"

shardopt_status_t init_agree(MPI_Comm a, MPI_Comm b, shardopt_status_t mine, const char *who)
{
    int ready = 0, finalized = 0, world_rank = 0;
    MPI_Initialized(&ready);
    MPI_Finalized(&finalized);
    if (!ready || finalized || a == MPI_COMM_NULL)
        return mine;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm comms[2] = {a, b};
    int pair[2] = {(int)mine, world_rank};
    for (int i = 0; i < 2; i++)
        if (comms[i] != MPI_COMM_NULL)
            MPI_Allreduce(MPI_IN_PLACE, pair, 1, MPI_2INT, MPI_MINLOC, comms[i]);
    if (pair[0] == SHARDOPT_OK)
        return SHARDOPT_OK;
    /* the chosen rank's message reaches every rank: only it contributes non-zero bytes */
    char msg[512];
    memset(msg, 0, sizeof msg);
    if (pair[1] == world_rank)
        snprintf(msg, sizeof msg, "%s", shardopt_last_error());
    for (int i = 0; i < 2; i++)
        if (comms[i] != MPI_COMM_NULL)
            MPI_Allreduce(MPI_IN_PLACE, msg, sizeof msg, MPI_BYTE, MPI_BOR, comms[i]);
    msg[sizeof msg - 1] = '\0';
    if (pair[1] == world_rank)
        return mine; /* logged where it happened */
    return log_fail((shardopt_status_t)pair[0], "%s: rank %d failed: %s", who, pair[1], msg);
}

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

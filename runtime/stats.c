/* Stats: counters the step measured, plus what follows from the committed parameter set. */
#include <string.h>

#include "runtime.h"
#include "status.h"

shardopt_status_t shardopt_get_stats(shardopt_runtime_t rt, shardopt_stats_t *stats)
{
    shardopt_stats_t s = SHARDOPT_STATS_INIT;
    const struct step_counters *k;

    if (rt == NULL || stats == NULL)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "get_stats: NULL %s",
                        rt == NULL ? "runtime" : "stats");
    if (stats->version < 1 || stats->size < offsetof(shardopt_stats_t, kernels) + 32)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "get_stats: stats version %u / size %zu: initialise with "
                        "SHARDOPT_STATS_INIT",
                        stats->version, stats->size);

    for (int i = 0; i < rt->nparams; i++) {
        const struct shardopt_param *p = rt->params[i];
        const uint64_t n = (uint64_t)p->layout.local_numel;
        if (p->algo == SHARDOPT_ALGO_ADAMW) {
            s.num_adamw++;
            s.bytes_adam_m += n * sizeof(float);
            s.bytes_adam_v += n * sizeof(float);
            continue;
        }
        s.num_muon++;
        s.bytes_momentum += n * kdtype_size(rt->cfg.momentum_dtype);
        if (rt->committed) {
            s.muon_matrices += p->mv.batch;
            s.ns_symmetric += p->ns_variant == NS_VARIANT_SYMMETRIC ? p->mv.batch : 0;
        }
    }
    k = &rt->counters;
    s.num_params = rt->nparams;
    s.bytes_workspace = rt->bytes_workspace;
    s.steps = k->steps;
    s.ns_flops_last = k->ns_flops_last;
    s.seconds_last = k->seconds_last;
    s.seconds_total = k->seconds_total;
    s.seconds_adamw_last = k->seconds_adamw_last;
    s.seconds_momentum_last = k->seconds_momentum_last;
    s.seconds_ns_last = k->seconds_ns_last;
    s.seconds_apply_last = k->seconds_apply_last;
    snprintf(s.kernels, sizeof s.kernels, "%s", rt->ops->name);
    const struct groups *g = &rt->groups;
    s.rank = g->me.rank;
    s.world = g->mesh.world;
    s.replica = g->me.rep;
    s.dp_replicate = g->mesh.dp_replicate;
    s.dense_rank = g->me.d;
    s.dense_size = g->mesh.dense;
    s.ep_rank = g->me.ep_rank;
    s.ep_size = g->mesh.ep;
    s.expert_shard_rank = g->me.xs_rank;
    s.expert_shard_size = mesh_xs_size(&g->mesh);

    size_t size = stats->size < sizeof s ? stats->size : sizeof s;
    s.size = size;
    memcpy(stats, &s, size);
    return SHARDOPT_OK;
}

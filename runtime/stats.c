/* Stats: counters the step measured, plus what follows from the committed parameter set. */
#include <math.h>
#include <string.h>

#include "base/status.h"
#include "runtime/live.h"
#include "runtime/runtime.h"

static struct phase_times phases_now(const struct shardopt_runtime *rt)
{
    const struct step_counters *k = &rt->counters;
    return (struct phase_times){.prepass = k->seconds_prepass_last,
                                .adamw = k->seconds_adamw_last,
                                .momentum = k->seconds_momentum_last,
                                .exchange1 = k->seconds_exchange1_last,
                                .ns = k->seconds_ns_last,
                                .exchange2 = k->seconds_exchange2_last,
                                .apply = k->seconds_apply_last,
                                .ns_sharded = k->seconds_ns_sharded_last,
                                .copy_exposed = rt->stage.seconds_copy,
                                .copy_busy = rt->stage.seconds_copy_busy};
}

void stats_phases_settle(struct shardopt_runtime *rt)
{
    timeline_resolve(&rt->timeline);
    rt->phases_prev = phases_now(rt);
}

shardopt_status_t shardopt_get_stats(shardopt_runtime_t rt, shardopt_stats_t *stats)
{
    shardopt_stats_t s = SHARDOPT_STATS_INIT;
    const struct step_counters *k;

    if (rt == NULL || stats == NULL)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "get_stats: NULL %s",
                        rt == NULL ? "runtime" : "stats");
    if (!live_has(rt)) /* finalized: its memory is not read */
        return live_refuse("get_stats", rt);
    /* as for every versioned struct: a version newer than this library (or garbage) is refused,
     * not read as the current layout */
    if (stats->version < 1 || stats->version > SHARDOPT_STATS_VERSION ||
        stats->size < offsetof(shardopt_stats_t, kernels) + 32)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "get_stats: stats.version = %u / stats.size = %zu: accepted version "
                        "1..%d (initialise with SHARDOPT_STATS_INIT)",
                        stats->version, stats->size, SHARDOPT_STATS_VERSION);

    /* the timing events are queried on init's device, whichever thread asks */
    const shardopt_status_t entered = rt_device_enter(rt, "get_stats");
    if (entered != SHARDOPT_OK)
        return entered;
    /* a device's phase times: the last step's marks when the device has passed them, read now
     * that they are needed; else the step before's, kept at the last step's start. Never a wait:
     * a trainer that reads the stats after every step keeps its host ahead of the device */
    int current = 1;
    if (timeline_pending(&rt->timeline)) {
        if (timeline_ready(&rt->timeline))
            timeline_resolve(&rt->timeline);
        else
            current = 0;
    }
    const struct phase_times ph = current ? phases_now(rt) : rt->phases_prev;
    for (int i = 0; i < rt->nparams; i++) {
        const struct shardopt_param *p = rt->params[i];
        const uint64_t n = (uint64_t)p->layout.local_numel;
        if (p->algo == SHARDOPT_ALGO_ADAMW) {
            s.num_adamw++;
            s.bytes_adam_m += n * kdtype_size(rt->cfg.adam_state_dtype);
            s.bytes_adam_v += n * kdtype_size(rt->cfg.adam_v_dtype);
            continue;
        }
        s.num_muon++;
        s.bytes_momentum += n * kdtype_size(rt->cfg.momentum_dtype);
    }
    for (int i = 0; i < rt->nparams; i++)
        if (rt->committed && rt->params[i]->ns_sharded)
            s.ns_sharded_matrices +=
                rt->params[i]->layout.ndim == 3 ? rt->params[i]->layout.len[0] : 1;
    /* matrices this rank orthogonalizes */
    for (int g = 0; rt->committed && g < GROUP_KINDS; g++) {
        const struct group_plan *P = &rt->gx[g].plan;
        for (int w = 0; w < P->nowned; w++) {
            if (P->owned[w].team > 1) { /* a team's matrix counts once, on its lead */
                s.muon_matrices += P->owned[w].team_j == 0;
                continue;
            }
            s.muon_matrices++;
            s.ns_symmetric += rt->params[P->owned[w].param]->ns_variant == NS_VARIANT_SYMMETRIC;
        }
    }
    k = &rt->counters;
    s.num_params = rt->nparams;
    s.bytes_workspace = rt->bytes_workspace;
    s.steps = k->steps;
    s.ns_flops_last = k->ns_flops_last;
    s.seconds_ns_sharded_last = ph.ns_sharded;
    s.seconds_last = k->seconds_last;
    s.seconds_total = k->seconds_total;
    s.seconds_adamw_last = ph.adamw;
    s.seconds_momentum_last = ph.momentum;
    s.seconds_ns_last = ph.ns;
    s.seconds_apply_last = ph.apply;
    s.seconds_prepass_last = ph.prepass;
    s.seconds_exchange1_last = ph.exchange1;
    s.seconds_exchange2_last = ph.exchange2;
    s.phases_current = current;
    s.grad_norm_last = k->grad_norm_last;
    s.steps_skipped = k->skipped;
    s.last_step_skipped = k->last_skipped;
    snprintf(s.nonfinite_params, sizeof s.nonfinite_params, "%s", k->nonfinite_last);
    s.nonfinite_elements_last = k->nonfinite_elements_last;
    s.bytes_sent_dense = k->bytes_sent[GROUP_DENSE];
    s.bytes_recv_dense = k->bytes_recv[GROUP_DENSE];
    s.bytes_sent_expert = k->bytes_sent[GROUP_EXPERT];
    s.bytes_recv_expert = k->bytes_recv[GROUP_EXPERT];
    s.bytes_ns_allreduce_last = (uint64_t)llround(k->bytes_ns_allreduce);
    s.load_kept_tensors = rt->load_kept;
    s.load_unused_params = rt->load_unused;
    s.ns_gram_fallbacks = k->ns_gram_fallbacks;

    s.offload = (int)rt->cfg.offload;
    s.bytes_host_store = rt->store.host ? rt->store.bytes : 0;
    const struct staging *sg = &rt->stage;
    s.bytes_h2d_momentum = sg->in[STAGE_MOMENTUM];
    s.bytes_d2h_momentum = sg->out[STAGE_MOMENTUM];
    s.bytes_h2d_adam_m = sg->in[STAGE_EXP_AVG];
    s.bytes_d2h_adam_m = sg->out[STAGE_EXP_AVG];
    s.bytes_h2d_adam_v = sg->in[STAGE_EXP_AVG_SQ];
    s.bytes_d2h_adam_v = sg->out[STAGE_EXP_AVG_SQ];
    s.bytes_h2d_ns = sg->in[STAGE_NS_U];
    s.bytes_d2h_ns = sg->out[STAGE_NS_O];
    s.staging_slot_bytes = sg->slot_bytes;
    s.staging_peak_bytes_last = sg->peak;
    s.seconds_copy_exposed_last = ph.copy_exposed;
    /* device timeline: copy-lane time the compute stream did not wait for; the CPU's copies are
     * synchronous */
    s.seconds_copy_hidden_last =
        ph.copy_busy > ph.copy_exposed ? ph.copy_busy - ph.copy_exposed : 0.0;
    s.ns_compute = rt->ns_compute == KDT_BF16 ? SHARDOPT_NS_COMPUTE_BF16 : SHARDOPT_NS_COMPUTE_FP32;

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

/* The member of `kind`'s group that owns param's first matrix there, as a runtime rank, and how
 * many of its matrices this rank owns; -1 when the group's plan does not hold it. */
static int ns_owner(const struct shardopt_runtime *rt, const struct shardopt_param *p, int *here)
{
    const enum group_kind kind = p->placement == SHARDOPT_PLACEMENT_REPLICATED ? GROUP_LOCAL
                                 : p->placement == SHARDOPT_PLACEMENT_DENSE    ? GROUP_DENSE
                                                                               : GROUP_EXPERT;
    const struct group_plan *P = &rt->gx[kind].plan;
    int base = 0;
    *here = 0;
    for (int w = 0; w < P->nowned; w++)
        *here += P->owned[w].param == p->index && P->owned[w].team_j == 0;
    if (p->algo != SHARDOPT_ALGO_MUON || p->ns_sharded)
        return -1;
    /* the plan's matrices run over its parameters in registration order (commit.c's filter),
     * each with its EP rank's experts (a stack) or one */
    for (int i = 0; i < p->index; i++) {
        const struct shardopt_param *q = rt->params[i];
        if (q->algo == SHARDOPT_ALGO_MUON && q->placement == p->placement && !q->ns_sharded)
            base += q->layout.ndim == 3 ? (int)q->layout.win_len : 1;
    }
    if (kind == GROUP_LOCAL || base >= P->nmatrices)
        return kind == GROUP_LOCAL ? rt->groups.me.rank : -1;
    return rt->group_ranks[kind] != NULL ? rt->group_ranks[kind][P->owner[base]] : -1;
}

shardopt_status_t shardopt_param_get_stats(shardopt_param_t param, shardopt_param_stats_t *stats)
{
    if (param == NULL || stats == NULL)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "param_get_stats: NULL %s",
                        param == NULL ? "param" : "stats");
    const shardopt_status_t live = live_param_check(param, "param_get_stats");
    if (live != SHARDOPT_OK)
        return live;
    if (stats->version < 1 || stats->version > SHARDOPT_PARAM_STATS_VERSION ||
        stats->size < sizeof(shardopt_param_stats_t))
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "param_get_stats '%s': stats.version = %u / stats.size = %zu: accepted "
                        "version 1..%d (initialise with SHARDOPT_PARAM_STATS_INIT)",
                        param->name, stats->version, stats->size, SHARDOPT_PARAM_STATS_VERSION);
    const struct shardopt_runtime *rt = param->rt;
    if (!rt->committed)
        return log_fail(SHARDOPT_ERR_STATE,
                        "param_get_stats '%s': runtime not committed (call shardopt_commit)",
                        param->name);
    shardopt_param_stats_t s = SHARDOPT_PARAM_STATS_INIT;
    s.grad_norm = param->grad_norm_last;
    s.update_rms = param->update_rms_last;
    s.ns_owner_rank = ns_owner(rt, param, &s.ns_matrices_here);
    *stats = s;
    return SHARDOPT_OK;
}

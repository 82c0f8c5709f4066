#include "runtime/step/offload_exec.h"

#include <string.h>

#include "base/fault.h"
#include "base/log.h"
#include "base/mem.h"
#include "offload/host_store.h"

static size_t state_es(shardopt_runtime_t rt, shardopt_algo_t algo, int seg)
{
    if (algo == SHARDOPT_ALGO_MUON)
        return seg == 0 ? kdtype_size(rt->cfg.momentum_dtype) : 0;
    return kdtype_size(seg == 0 ? rt->cfg.adam_state_dtype : rt->cfg.adam_v_dtype);
}

static void *state_at(shardopt_runtime_t rt, const struct shardopt_param *p, int seg, size_t off)
{
    size_t base = p->algo == SHARDOPT_ALGO_MUON ? p->off_momentum
                  : seg == 0                    ? p->off_exp_avg
                                                : p->off_exp_avg_sq;
    return (char *)state_store_ptr(&rt->store, base) + off * state_es(rt, p->algo, seg);
}

/* How many of the rem elements from local element s one chunk takes, at most cap: a chunk must
 * start a run of the element-index map or lie inside one (elem_index_map_at). */
static size_t chunk_len(const struct elem_index_map *m, size_t s, size_t rem, size_t cap)
{
    const size_t run = m->run > 0 ? (size_t)m->run : rem;
    if (s % run != 0) {
        size_t left = run - s % run;
        left = left < rem ? left : rem;
        return left < cap ? left : cap;
    }
    if (rem <= cap)
        return rem;
    return cap >= run ? cap / run * run : cap;
}

struct stream_iter {
    shardopt_runtime_t rt;
    shardopt_algo_t algo;
    state_range_fn get;
    void *get_arg;
    state_kernel_fn kernel;
    const void *kernel_arg;
    size_t cap;  /* elements per chunk */
    int i;       /* current range */
    size_t done; /* of its elements */
    struct state_range r;
    int have;
};

static int stream_next(void *arg, struct stream_chunk *c)
{
    struct stream_iter *it = arg;
    shardopt_runtime_t rt = it->rt;

    for (;;) {
        if (!it->have) {
            if (!it->get(it->get_arg, it->i, &it->r))
                return 0;
            it->have = 1;
            it->done = 0;
        }
        if (it->done < it->r.n)
            break;
        it->have = 0;
        it->i++;
    }
    const size_t s = it->r.off + it->done;
    const size_t len = chunk_len(&it->r.p->index_map, s, it->r.n - it->done, it->cap);
    memset(c, 0, sizeof *c);
    c->nseg = it->algo == SHARDOPT_ALGO_MUON ? 1 : 2;
    for (int k = 0; k < c->nseg; k++) {
        c->host[k] = state_at(rt, it->r.p, k, s);
        c->bytes[k] = len * state_es(rt, it->algo, k);
        c->kind[k] = it->algo == SHARDOPT_ALGO_MUON ? STAGE_MOMENTUM
                     : k == 0                       ? STAGE_EXP_AVG
                                                    : STAGE_EXP_AVG_SQ;
    }
    c->tag = it->r.p;
    c->off = s;
    c->n = len;
    c->out =
        it->r.out != NULL ? (char *)it->r.out + it->done * kdtype_size(rt->cfg.comm_dtype) : NULL;
    it->done += len;
    return 1;
}

static void stream_kernel(void *arg, const struct stream_chunk *c, void *const dev[2])
{
    const struct stream_iter *it = arg;
    const struct state_range r = {.p = c->tag, .off = c->off, .n = c->n, .out = c->out};
    it->kernel(it->rt, &r, dev[0], dev[1], it->kernel_arg);
}

void offload_state_run(shardopt_runtime_t rt, shardopt_algo_t algo, state_range_fn get,
                       void *get_arg, state_kernel_fn kernel, const void *kernel_arg)
{
    if (rt->cfg.offload != SHARDOPT_OFFLOAD_OPTIMIZER) {
        struct state_range r;
        for (int i = 0; get(get_arg, i, &r); i++)
            if (r.n > 0)
                kernel(rt, &r, state_at(rt, r.p, 0, r.off),
                       algo == SHARDOPT_ALGO_ADAMW ? state_at(rt, r.p, 1, r.off) : NULL,
                       kernel_arg);
        return;
    }
    struct stream_iter it = {
        .rt = rt,
        .algo = algo,
        .get = get,
        .get_arg = get_arg,
        .kernel = kernel,
        .kernel_arg = kernel_arg,
        .cap = staging_chunk_elems(&rt->stage, state_es(rt, algo, 0), state_es(rt, algo, 1)),
    };
    staging_stream(&rt->stage, stream_next, stream_kernel, &it);
}

void *offload_ns_in(shardopt_runtime_t rt, void *dev, const void *host, size_t bytes)
{
    if (rt->cfg.offload != SHARDOPT_OFFLOAD_CPU)
        return (void *)host;
    staging_copy(&rt->stage, dev, host, bytes, STAGE_NS_U, 1);
    return dev;
}

shardopt_status_t offload_ns_out(shardopt_runtime_t rt, void *host, const void *dev, size_t bytes)
{
    if (host == dev)
        return SHARDOPT_OK;
    staging_copy(&rt->stage, host, dev, bytes, STAGE_NS_O, 0);
    /* the host reads it next (a device stream finishes first); a failure was ignored, and the
     * host sent or applied what the buffer held */
    if (rt->ns_dev != rt->dev && (fault_hit("copy") || rt->ns_dev->sync(&rt->kctx) != 0)) {
        memset(host, 0, bytes);
        return log_fail(SHARDOPT_ERR_DEVICE,
                        "step: rank %d: Newton-Schulz on the device, or copying its results to "
                        "the host, failed (%s); they count as a zero update",
                        rt->groups.me.rank, rt->ns_dev->name);
    }
    return SHARDOPT_OK;
}

void offload_prepare(shardopt_runtime_t rt)
{
    if (rt->cfg.offload != SHARDOPT_OFFLOAD_NONE)
        state_store_use_host(&rt->store, rt->topo.topo, rt->topo.nodeset, rt->cfg.host_store_limit);
}

size_t offload_alloc(shardopt_runtime_t rt, size_t ns_elems, size_t sh_elems, size_t *failed)
{
    const size_t es = kdtype_size(rt->cfg.comm_dtype);
    size_t slot = 0, bytes = 0;

    if (rt->cfg.offload == SHARDOPT_OFFLOAD_OPTIMIZER) {
        /* a bucket's worth (bucket_bytes 0, one matrix per bucket: the largest tensor's state),
         * but no more than the whole state, and room for two segments */
        size_t want = (size_t)rt->cfg.bucket_bytes;
        for (int i = 0; want == 0 && i < rt->nparams; i++) {
            const struct shardopt_param *p = rt->params[i];
            const size_t n = (size_t)p->layout.local_numel;
            const size_t b = n * (state_es(rt, p->algo, 0) + state_es(rt, p->algo, 1)) + 64;
            slot = b > slot ? b : slot;
        }
        want = want > 0 ? want : slot;
        slot = want < rt->store.bytes ? want : rt->store.bytes;
        slot = slot < 4 * STAGING_ALIGN ? 4 * STAGING_ALIGN : slot;
        /* a whole number of alignments: the second segment starts at one (staging.c); past
         * SIZE_MAX (a state store that saturated) refused as the slots' bytes */
        if (!mem_align_up(slot, STAGING_ALIGN, &slot)) {
            *failed = slot;
            return (size_t)-1;
        }
    }
    /* the slots and the Newton-Schulz copies belong to where Newton-Schulz runs */
    if (staging_init(&rt->stage, rt->ns_dev, &rt->kctx, slot, rt->cfg.debug_poison_staging) !=
        SHARDOPT_OK) {
        *failed = slot;
        return (size_t)-1;
    }
    rt->stage.tl = &rt->timeline;
    bytes += STAGING_SLOTS * slot;
    if (rt->cfg.offload == SHARDOPT_OFFLOAD_CPU) {
        rt->dev_ns = rt->ns_dev->alloc(ns_elems * es + 1);
        rt->dev_sh_u = rt->dev_ns != NULL ? rt->ns_dev->alloc(sh_elems * es + 1) : NULL;
        if (rt->dev_ns == NULL || rt->dev_sh_u == NULL) {
            *failed = rt->dev_ns == NULL ? ns_elems * es + 1 : sh_elems * es + 1;
            return (size_t)-1;
        }
        bytes += (ns_elems + sh_elems) * es;
    }
    return bytes;
}

void offload_release(shardopt_runtime_t rt)
{
    staging_free(&rt->stage);
    if (rt->dev_ns != NULL)
        rt->ns_dev->free(rt->dev_ns);
    if (rt->dev_sh_u != NULL)
        rt->ns_dev->free(rt->dev_sh_u);
    rt->dev_ns = rt->dev_sh_u = NULL;
}

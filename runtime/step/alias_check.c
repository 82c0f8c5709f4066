/* Buffers of the step that share memory (alias_check.h). */
#include "runtime/step/alias_check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/mem_writable.h"
#include "base/status.h"
#include "runtime/live_list.h"

static int by_lo(const void *a, const void *b)
{
    const struct alias_span *x = a, *y = b;
    return (x->lo > y->lo) - (x->lo < y->lo);
}

static shardopt_status_t refuse(shardopt_runtime_t rt, const struct alias_span *a,
                                const struct alias_span *b)
{
    /* name the parameter registered first first: the message does not depend on addresses */
    if (a->param > b->param || (a->param == b->param && a->grad > b->grad)) {
        const struct alias_span *t = a;
        a = b;
        b = t;
    }
    const char *what = a->grad || b->grad ? "the step would write a buffer it reads"
                                          : "the step would update that memory twice";
    return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                    "step: rank %d: the %s of parameter '%s' [%p, +%zu bytes) and the %s of "
                    "parameter '%s' [%p, +%zu bytes) share memory: %s (register a tied weight "
                    "once; give each parameter its own data and gradient buffers); nothing was "
                    "updated",
                    rt->groups.me.rank, a->grad ? "grad" : "data", rt->params[a->param]->name,
                    (void *)a->lo, (size_t)(a->hi - a->lo), b->grad ? "grad" : "data",
                    rt->params[b->param]->name, (void *)b->lo, (size_t)(b->hi - b->lo), what);
}

/* The data spans among rt->alias[0, n) (sorted) against the maps; call names the caller and
 * what it writes ("the step updates it in place", "a load with ckpt_weights writes it") */
static shardopt_status_t read_only_check(shardopt_runtime_t rt, int n, const char *call,
                                         const char *writes, const char *nothing)
{
    int m = 0;
    for (int j = 0; j < n; j++) /* the data spans, in order: the step writes those */
        if (!rt->alias[j].grad)
            rt->alias[m++] = rt->alias[j];
    char perms[8] = "none", path[256] = "no mapping";
    const int bad =
        mem_writable_first_read_only(rt->alias, m, sizeof *rt->alias, perms, path, sizeof path);
    if (bad < 0)
        return SHARDOPT_OK;
    const struct alias_span *s = &rt->alias[bad];
    return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                    "%s: rank %d: the data of parameter '%s' [%p, +%zu bytes) lies in memory "
                    "this process cannot write (%s, %s): %s (a read-only mmap: "
                    "np.load(mmap_mode='r') through torch.from_numpy, weights mapped PROT_READ); "
                    "pass writable memory; %s",
                    call, rt->groups.me.rank, rt->params[s->param]->name, (void *)s->lo,
                    (size_t)(s->hi - s->lo), perms, path, writes, nothing);
}

static shardopt_status_t own_check(shardopt_runtime_t rt)
{
    int changed = 0, data_changed = 0, n = 0;
    for (int i = 0; i < rt->nparams && !data_changed; i++) {
        data_changed = rt->params[i]->data != rt->params[i]->alias_data;
        changed = changed || data_changed || rt->params[i]->grad != rt->params[i]->alias_grad;
    }
    if (!changed || rt->alias == NULL)
        return SHARDOPT_OK;
    for (int i = 0; i < rt->nparams; i++) {
        const struct shardopt_param *p = rt->params[i];
        const size_t count = (size_t)p->layout.local_numel;
        if (count == 0)
            continue;
        if (p->data != NULL)
            rt->alias[n++] = (struct alias_span){
                (uintptr_t)p->data, (uintptr_t)p->data + count * kdtype_size(p->param_dtype), i, 0};
        if (p->grad != NULL)
            rt->alias[n++] = (struct alias_span){
                (uintptr_t)p->grad, (uintptr_t)p->grad + count * kdtype_size(p->grad_dtype), i, 1};
    }
    qsort(rt->alias, (size_t)n, sizeof *rt->alias, by_lo);
    /* A sweep in address order against the span that reaches furthest so far: a data span that
     * overlaps anything overlaps that one, or is it and overlaps the next span; two gradients
     * overlapping is allowed (both are only read) */
    int far = -1;
    for (int j = 0; j < n; j++) {
        const struct alias_span *s = &rt->alias[j];
        if (far >= 0 && s->lo < rt->alias[far].hi && !(s->grad && rt->alias[far].grad))
            return refuse(rt, &rt->alias[far], s);
        if (far < 0 || s->hi > rt->alias[far].hi)
            far = j;
    }
    /* host kernels write the data where it is (device memory, the CUDA backend's or the
     * simulated device's, is no host mapping to check); read when a data pointer moved, not for
     * the new gradient buffers of every step */
    if (data_changed && !rt_on_device(rt)) {
        const shardopt_status_t st =
            read_only_check(rt, n, "step", "the step updates it in place", "nothing was updated");
        if (st != SHARDOPT_OK)
            return st;
    }
    for (int i = 0; i < rt->nparams; i++) {
        rt->params[i]->alias_data = rt->params[i]->data;
        rt->params[i]->alias_grad = rt->params[i]->grad;
    }
    rt->peer_dirty = rt->peer_dirty || data_changed;
    return SHARDOPT_OK;
}

static shardopt_status_t alias_check_peers(shardopt_runtime_t rt);

shardopt_status_t alias_check(shardopt_runtime_t rt)
{
    const shardopt_status_t st = own_check(rt);
    return st == SHARDOPT_OK ? alias_check_peers(rt) : st;
}

/* The runtimes of this process that stepped are the live ones (live_list.h) with peer_listed
 * set; they, their spans and the sequence number of the last step change under the live list's
 * lock, which a finalize takes its runtime out under before freeing it. */
static uint64_t peers_seq;

/* rt's data spans now, sorted, into out[0, n): n */
static int data_spans(shardopt_runtime_t rt, struct alias_span *out)
{
    int n = 0;
    for (int i = 0; i < rt->nparams; i++) {
        const struct shardopt_param *p = rt->params[i];
        const size_t count = (size_t)p->layout.local_numel;
        if (count > 0 && p->data != NULL)
            out[n++] = (struct alias_span){
                (uintptr_t)p->data, (uintptr_t)p->data + count * kdtype_size(p->param_dtype), i, 0};
    }
    qsort(out, (size_t)n, sizeof *out, by_lo);
    return n;
}

static shardopt_status_t alias_check_peers(shardopt_runtime_t rt)
{
    /* a first step is not checked: a new optimizer made over the model of an old one left
     * alive (load_state_dict(old.state_dict()), then only the new one steps) is no error */
    if (rt->peer_spans == NULL || rt->peer_seq == 0)
        return SHARDOPT_OK;
    shardopt_status_t st = SHARDOPT_OK;
    live_lock();
    const struct alias_span *mine = rt->peer_spans;
    int nmine = rt->npeer_spans, built = 0;
    for (const struct shardopt_runtime *b = live_first(); b != NULL && st == SHARDOPT_OK;
         b = b->live_next) {
        /* not stepped since its commit, or not since this one's last step */
        if (b == rt || !b->peer_listed || b->peer_seq <= rt->peer_seq)
            continue;
        if (rt->peer_dirty && !built) { /* a data pointer moved since: its spans now */
            nmine = data_spans(rt, rt->alias);
            mine = rt->alias;
            built = 1;
        }
        /* both sorted, neither overlapping itself (alias_check refuses that): a merge */
        for (int i = 0, j = 0; i < nmine && j < b->npeer_spans;) {
            const struct alias_span *x = &mine[i], *y = &b->peer_spans[j];
            if (x->lo < y->hi && y->lo < x->hi) {
                st = log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                              "step: rank %d: the data of parameter '%s' [%p, +%zu bytes) and "
                              "the data of parameter '%s' [%p, +%zu bytes) of another runtime of "
                              "this process (another optimizer over the same model, or another "
                              "param group's), which stepped it after this runtime's last step, "
                              "share memory: stepping both updates that memory twice per step; "
                              "step one runtime per memory (finalize the other, or give each its "
                              "own parameters); nothing was updated",
                              rt->groups.me.rank, rt->params[x->param]->name, (void *)x->lo,
                              (size_t)(x->hi - x->lo), b->params[y->param]->name, (void *)y->lo,
                              (size_t)(y->hi - y->lo));
                break;
            }
            if (x->hi <= y->hi)
                i++;
            else
                j++;
        }
    }
    live_unlock();
    return st;
}

void alias_check_peers_stepped(shardopt_runtime_t rt)
{
    if (rt->peer_spans == NULL)
        return;
    live_lock();
    if (rt->peer_dirty) {
        rt->npeer_spans = data_spans(rt, rt->peer_spans);
        rt->peer_dirty = 0;
    }
    rt->peer_seq = ++peers_seq;
    rt->peer_listed = 1;
    live_unlock();
}

void alias_check_peers_leave(shardopt_runtime_t rt)
{
    live_lock(); /* no walk reads its spans or names from here on */
    rt->peer_listed = 0;
    live_unlock();
}

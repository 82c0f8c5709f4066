/* Buffers of the step that share memory (alias_check.h). */
#define _GNU_SOURCE /* process_vm_writev */
#include "runtime/step/alias_check.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "base/log.h"
#include "base/status.h"

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

/* The data spans (sorted by lo) against /proc/self/maps (in address order too): the first span
 * not wholly inside mappings this process may write, or -1 (also where the maps cannot be read:
 * no check then). A host step writing a PROT_READ mapping (np.load(mmap_mode='r') handed to
 * torch.from_numpy, weights mapped read-only) died of SIGSEGV inside the step. */
static int read_only_span(const struct alias_span *sp, int n, char *perms, char *path, size_t len)
{
    FILE *f = fopen("/proc/self/maps", "re");
    if (f == NULL)
        return -1;
    char line[512];
    int j = 0, bad = -1;
    uintptr_t covered = 0; /* the span's bytes below this lie in writable mappings */
    while (j < n && bad < 0 && fgets(line, sizeof line, f) != NULL) {
        const int whole = strchr(line, '\n') != NULL;
        unsigned long lo, hi;
        char pm[8] = "", name[256] = "";
        if (sscanf(line, "%lx-%lx %7s %*s %*s %*s %255s", &lo, &hi, pm, name) < 3)
            lo = hi = 0;
        for (int c; !whole && (c = fgetc(f)) != EOF && c != '\n';)
            ;                                           /* the rest of a long path */
        for (; j < n && bad < 0 && sp[j].hi <= lo; j++) /* a gap before this mapping */
            if (covered < sp[j].hi)
                bad = j;
        for (; j < n && bad < 0 && sp[j].lo < hi; j++) {
            if (covered < sp[j].lo)
                covered = sp[j].lo;
            if (covered < lo || pm[1] != 'w') {
                bad = j;
                if (covered >= lo) { /* else a gap: the defaults say no mapping */
                    snprintf(perms, 8, "%s", pm);
                    snprintf(path, len, "%s", name[0] ? name : "anonymous");
                }
                break;
            }
            covered = hi;
            if (sp[j].hi > hi)
                break; /* it goes on into the next mapping */
        }
    }
    if (bad < 0 && j < n && covered < sp[j].hi)
        bad = j; /* past the last mapping */
    fclose(f);
    return bad;
}

static shardopt_status_t read_only_check(shardopt_runtime_t rt, int n)
{
    int m = 0;
    for (int j = 0; j < n; j++) /* the data spans, in order: the step writes those */
        if (!rt->alias[j].grad)
            rt->alias[m++] = rt->alias[j];
    char perms[8] = "none", path[256] = "no mapping";
    const int bad = read_only_span(rt->alias, m, perms, path, sizeof path);
    if (bad < 0)
        return SHARDOPT_OK;
    const struct alias_span *s = &rt->alias[bad];
    return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                    "step: rank %d: the data of parameter '%s' [%p, +%zu bytes) lies in memory "
                    "this process cannot write (%s, %s): the step updates it in place (a "
                    "read-only mmap: np.load(mmap_mode='r') through torch.from_numpy, weights "
                    "mapped PROT_READ); pass writable memory; nothing was updated",
                    rt->groups.me.rank, rt->params[s->param]->name, (void *)s->lo,
                    (size_t)(s->hi - s->lo), perms, path);
}

shardopt_status_t alias_check(shardopt_runtime_t rt)
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
        const shardopt_status_t st = read_only_check(rt, n);
        if (st != SHARDOPT_OK)
            return st;
    }
    for (int i = 0; i < rt->nparams; i++) {
        rt->params[i]->alias_data = rt->params[i]->data;
        rt->params[i]->alias_grad = rt->params[i]->grad;
    }
    return SHARDOPT_OK;
}

/* 1: a page of [p, p + bytes) refused the kernel's write; 0: every page took it; -1: the call is
 * not available (ENOSYS, or EPERM under a seccomp filter) or failed otherwise: no answer */
static int probe_pages(uintptr_t lo, uintptr_t hi)
{
    enum { BATCH = 256 };
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    struct iovec iov[BATCH];
    const pid_t self = getpid();
    for (uintptr_t a = lo; a < hi;) {
        int k = 0;
        for (; k < BATCH && a < hi; k++, a = (a / page + 1) * page)
            iov[k] = (struct iovec){(void *)a, 1};
        errno = 0;
        /* each byte is written onto itself: the caller's buffer keeps its values */
        const ssize_t n = process_vm_writev(self, iov, (unsigned long)k, iov, (unsigned long)k, 0);
        if (n == k)
            continue;
        return n >= 0 || errno == EFAULT ? 1 : -1;
    }
    return 0;
}

int host_span_unwritable(const void *p, size_t bytes, char perms[8], char *path, size_t len)
{
    if (bytes == 0)
        return 0;
    const uintptr_t lo = (uintptr_t)p;
    const uintptr_t hi = bytes > UINTPTR_MAX - lo ? UINTPTR_MAX : lo + bytes;
    const int probe = probe_pages(lo, hi);
    if (probe == 0)
        return 0;
    snprintf(perms, 8, "none");
    snprintf(path, len, "no mapping");
    const struct alias_span span = {lo, hi, 0, 0};
    const int maps = read_only_span(&span, 1, perms, path, len);
    /* the kernel refused a write the maps allow (a mapping changed in between): still refused */
    return probe == 1 || maps >= 0;
}

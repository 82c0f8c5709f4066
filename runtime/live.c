/* The live runtimes of this process (live.h, live_list.h): a list through live_next under one
 * mutex, which alias_check.c's walk over the runtimes that stepped shares. */
#include "runtime/live.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "runtime/live_list.h"

static pthread_mutex_t list_lock = PTHREAD_MUTEX_INITIALIZER;
static struct shardopt_runtime *live_head;
/* finalized runtimes' shells, newest first, through live_next (live_retire) */
static struct shardopt_runtime *retired_head;

void live_lock(void) { pthread_mutex_lock(&list_lock); }

void live_unlock(void) { pthread_mutex_unlock(&list_lock); }

struct shardopt_runtime *live_first(void) { return live_head; }

void live_add(struct shardopt_runtime *rt)
{
    live_lock();
    rt->live_next = live_head;
    live_head = rt;
    live_unlock();
}

void live_remove(struct shardopt_runtime *rt)
{
    live_lock();
    for (struct shardopt_runtime **at = &live_head; *at != NULL; at = &(*at)->live_next)
        if (*at == rt) {
            *at = rt->live_next;
            break;
        }
    live_unlock();
}

/* with the lock held */
static int listed(const struct shardopt_runtime *rt)
{
    for (const struct shardopt_runtime *r = live_head; r != NULL; r = r->live_next)
        if (r == rt)
            return 1;
    return 0;
}

int live_has(const struct shardopt_runtime *rt)
{
    live_lock();
    const int found = listed(rt);
    live_unlock();
    return found;
}

shardopt_status_t live_refuse(const char *call, const struct shardopt_runtime *rt)
{
    return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                    "%s: runtime %p is not a live runtime of this process (finalized already, or "
                    "never made by shardopt_init): a handle must not be used after "
                    "shardopt_finalize; nothing was done",
                    call, (const void *)rt);
}

/* with the lock held: live_claim's outcome for rt, listed or not */
static int claim_locked(struct shardopt_runtime *rt, int is_listed, const char *call,
                        const char **running)
{
    *running = NULL;
    if (!is_listed)
        return 0;
    return atomic_compare_exchange_strong(&rt->busy, running, call) ? 1 : -1;
}

int live_claim(struct shardopt_runtime *rt, const char *call, const char **running)
{
    live_lock();
    const int got = claim_locked(rt, listed(rt), call, running);
    live_unlock();
    return got;
}

shardopt_status_t live_busy(const char *call, const char *name, const char *running)
{
    return log_fail(SHARDOPT_ERR_STATE,
                    "%s%s%s%s: shardopt_%s is running on this runtime in another thread: calls on "
                    "one runtime must not overlap (docs/api.md, Threads); nothing was done",
                    call, name != NULL ? " '" : "", name != NULL ? name : "",
                    name != NULL ? "'" : "", running);
}

/* with live_lock held: the parameter's runtime and, when it is not live, its name */
static int param_listed(const struct shardopt_param *p, char *name, size_t size)
{
    if (listed(p->rt))
        return 1;
    snprintf(name, size, "%s", p->name != NULL ? p->name : "");
    return 0;
}

/* a parameter handle whose runtime was finalized: nothing read but its shell */
static shardopt_status_t param_refuse(const char *call, const char *name,
                                      const struct shardopt_param *p)
{
    return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                    "%s '%s': parameter %p belongs to runtime %p, which is not live (finalized "
                    "already): a parameter handle must not be used after shardopt_finalize of its "
                    "runtime; nothing was done",
                    call, name, (const void *)p, (const void *)p->rt);
}

shardopt_status_t live_param_claim(const struct shardopt_param *p, const char *call)
{
    char name[256]; /* names are at most 244 bytes (register) */
    const char *running;
    if (p == NULL)
        return SHARDOPT_OK;
    live_lock();
    const int got = claim_locked(p->rt, param_listed(p, name, sizeof name), call, &running);
    if (got == -1)
        snprintf(name, sizeof name, "%s", p->name);
    live_unlock();
    if (got == 0)
        return param_refuse(call, name, p);
    return got == 1 ? SHARDOPT_OK : live_busy(call, name, running);
}

shardopt_status_t live_param_check(const struct shardopt_param *p, const char *call)
{
    char name[256];
    if (p == NULL)
        return SHARDOPT_OK;
    live_lock();
    const int found = param_listed(p, name, sizeof name);
    live_unlock();
    return found ? SHARDOPT_OK : param_refuse(call, name, p);
}

/* a shell's memory, as retire left it */
static void shell_free(struct shardopt_runtime *rt)
{
    for (int i = 0; i < rt->nparams; i++) {
        free(rt->params[i]->name);
        free(rt->params[i]);
    }
    free(rt->params);
    free(rt);
}

void live_retire(struct shardopt_runtime *rt)
{
    size_t bytes = sizeof *rt + (size_t)rt->nparams * sizeof *rt->params;
    for (int i = 0; i < rt->nparams; i++)
        bytes += sizeof *rt->params[i] +
                 (rt->params[i]->name != NULL ? strlen(rt->params[i]->name) + 1 : 0);
    rt->shell_bytes = bytes;
    live_lock();
    rt->live_next = retired_head;
    retired_head = rt;
    /* the oldest go past the bounds; cut the list after the last one kept (the newest always) */
    struct shardopt_runtime *last = rt;
    size_t kept_bytes = rt->shell_bytes;
    int kept = 1;
    while (last->live_next != NULL && kept < LIVE_RETIRED_MAX &&
           kept_bytes + last->live_next->shell_bytes <= LIVE_RETIRED_BYTES) {
        last = last->live_next;
        kept_bytes += last->shell_bytes;
        kept++;
    }
    struct shardopt_runtime *evict = last->live_next;
    last->live_next = NULL;
    live_unlock();
    while (evict != NULL) {
        struct shardopt_runtime *next = evict->live_next;
        shell_free(evict);
        evict = next;
    }
}

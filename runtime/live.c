/* The live runtimes of this process (live.h, live_list.h): a list through live_next under one
 * mutex, which alias_check.c's walk over the runtimes that stepped shares. */
#include "runtime/live.h"

#include <pthread.h>

#include "base/status.h"
#include "runtime/live_list.h"

static pthread_mutex_t list_lock = PTHREAD_MUTEX_INITIALIZER;
static struct shardopt_runtime *live_head;

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

int live_claim(struct shardopt_runtime *rt, const char *call, const char **running)
{
    live_lock();
    int got = 0;
    *running = NULL;
    if (listed(rt))
        got = atomic_compare_exchange_strong(&rt->busy, running, call) ? 1 : -1;
    live_unlock();
    return got;
}

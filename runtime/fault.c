/* Env params like the log's: read once, then only counted. */
#include "fault.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mem.h"

static pthread_once_t fault_once = PTHREAD_ONCE_INIT;
static char fault_site[64];
static long fault_n, fault_count;
static int fault_kill;
static pthread_mutex_t fault_lock = PTHREAD_MUTEX_INITIALIZER;
static int fault_json_hooked;

/* The allocation site lives in mem.c (a counter every layer's allocations pass): armed from
 * here. cJSON's allocations join it only while it is armed: its hooks are process-wide, and a
 * program that also uses cJSON must not find its own hooks replaced because it loaded us. Ours
 * are malloc and free but for the injected failure, so memory crosses the switch either way. */
static void fault_alloc_arm(long n)
{
    static cJSON_Hooks hooks = {mem_malloc, free};
    mem_fault_arm(n);
    if (n > 0 && !fault_json_hooked)
        cJSON_InitHooks(&hooks);
    else if (n == 0 && fault_json_hooked)
        cJSON_InitHooks(NULL); /* cJSON's defaults again */
    fault_json_hooked = n > 0;
}

static void fault_parse(const char *v)
{
    fault_n = fault_count = 0;
    fault_kill = 0;
    fault_site[0] = '\0';
    fault_alloc_arm(0);
    if (v == NULL || *v == '\0')
        return;
    if (strncmp(v, "kill@", 5) == 0) {
        fault_kill = 1;
        v += 5;
    }
    const char *colon = strrchr(v, ':');
    if (colon == NULL || (size_t)(colon - v) >= sizeof fault_site || atol(colon + 1) < 1) {
        fprintf(stderr,
                "[shardopt] error: SHARDOPT_FAULT='%s': accepted [kill@]<site>:<n>, n >= 1; "
                "ignored\n",
                v);
        return;
    }
    memcpy(fault_site, v, (size_t)(colon - v));
    fault_site[colon - v] = '\0';
    fault_n = atol(colon + 1);
    if (strcmp(fault_site, "alloc") == 0 && fault_kill) {
        fprintf(stderr,
                "[shardopt] error: SHARDOPT_FAULT='kill@%s': alloc fails, never kills; "
                "ignored\n",
                v);
        fault_n = 0;
        fault_site[0] = '\0';
    } else if (strcmp(fault_site, "alloc") == 0) {
        fault_alloc_arm(fault_n);
    }
}

static void fault_setup(void) { fault_parse(getenv("SHARDOPT_FAULT")); }

/* At load, not at the first fault_hit: alloc:<n> counts from the library's first allocation. */
__attribute__((constructor)) static void fault_load(void)
{
    pthread_once(&fault_once, fault_setup);
}

void fault_arm(const char *spec)
{
    pthread_once(&fault_once, fault_setup);
    pthread_mutex_lock(&fault_lock);
    fault_parse(spec);
    pthread_mutex_unlock(&fault_lock);
}

int fault_hit(const char *site)
{
    int hit = 0;
    pthread_once(&fault_once, fault_setup);
    if (fault_n == 0 || strcmp(site, fault_site) != 0)
        return 0;
    pthread_mutex_lock(&fault_lock);
    hit = ++fault_count == fault_n;
    pthread_mutex_unlock(&fault_lock);
    if (hit && fault_kill)
        raise(SIGKILL);
    if (hit)
        errno = EIO; /* the caller reports it like the failure it stands for */
    return hit;
}

/* Env params like the log's: read once, then only counted. */
#include "fault.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "env.h"
#include "log.h"
#include "mem.h"

static pthread_once_t fault_once = PTHREAD_ONCE_INIT;
static char fault_site[64];
static long fault_n, fault_count;
static int fault_kill, fault_hang, fault_errno = EIO;
static int fault_only_rank = -1, fault_my_rank = -1;
static int fault_alloc_rank = -1; /* the rank fault_set_rank last armed alloc:<n> for */
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

/* Every site a fault_hit call names (fault_sites.sh checks the sources against this list), and
 * alloc (mem.c). */
static const char *const fault_sites[] = {
    "alloc",       "ckpt.write",   "ckpt.fsync",       "ckpt.index",
    "ckpt.rename", "ckpt.lock",    "ckpt.latest",      "ckpt.prune",
    "ckpt.read",   "step.prepass", "step.prepass.rep", "step.exchange",
    "step.ns",     "step.ns.copy", "step.ns.gather",   "copy",
    "init.split",  "init.dup",     "nccl.id"};
#define FAULT_SITES_TEXT                                                                           \
    "alloc, ckpt.write, ckpt.fsync, ckpt.index, ckpt.rename, ckpt.lock, ckpt.latest, ckpt.prune, " \
    "ckpt.read, step.prepass, step.prepass.rep, step.exchange, step.ns, step.ns.copy, "            \
    "step.ns.gather, copy, init.split, init.dup, nccl.id"

static int fault_site_known(const char *site)
{
    for (size_t i = 0; i < sizeof fault_sites / sizeof fault_sites[0]; i++)
        if (strcmp(site, fault_sites[i]) == 0)
            return 1;
    return 0;
}

static void fault_parse(const char *v)
{
    fault_n = fault_count = 0;
    fault_kill = fault_hang = 0;
    fault_site[0] = '\0';
    fault_alloc_arm(0);
    if (v == NULL || *v == '\0')
        return;
    const char *whole = v; /* what the refusal shows: the value as set, its prefix too */
    if (strncmp(v, "kill@", 5) == 0) {
        fault_kill = 1;
        v += 5;
    } else if (strncmp(v, "hang@", 5) == 0) {
        fault_hang = 1;
        v += 5;
    }
    /* <site>:<n>[:<errno>]: the error a failing call reports, EIO unless named */
    static const struct {
        const char *name;
        int value;
    } errnos[] = {
        {"EIO", EIO}, {"ENOSPC", ENOSPC}, {"EDQUOT", EDQUOT}, {"EROFS", EROFS}, {"ENOLCK", ENOLCK}};
    /* <n> in decimal digits only, within long: strtol took " 1" and "+1", and saturated
     * "99999999999999999999" to a count no run reaches, a fault armed that never fires */
    const char *colon = strchr(v, ':');
    char *end = NULL;
    const int digits = colon != NULL && colon[1] >= '0' && colon[1] <= '9';
    errno = 0;
    const long n = digits ? strtol(colon + 1, &end, 10) : 0;
    const int too_big = errno == ERANGE;
    int err = end != NULL && *end == '\0' ? EIO : 0;
    for (size_t i = 0;
         err == 0 && end != NULL && *end == ':' && i < sizeof errnos / sizeof errnos[0]; i++)
        if (strcmp(end + 1, errnos[i].name) == 0)
            err = errnos[i].value;
    if (colon == NULL || colon == v || (size_t)(colon - v) >= sizeof fault_site || n < 1 ||
        !digits || too_big || err == 0) {
        char shown[256]; /* escaped, as every logged message is (log_defang) */
        log_escape(shown, sizeof shown, whole, strlen(whole));
        fprintf(
            stderr,
            "[shardopt] error: SHARDOPT_FAULT='%s': accepted [kill@|hang@]<site>:<n>[:<errno>], "
            "a site, n from 1 in decimal digits, errno EIO (default), ENOSPC, EDQUOT, EROFS or "
            "ENOLCK; ignored\n",
            shown);
        return;
    }
    memcpy(fault_site, v, (size_t)(colon - v));
    fault_site[colon - v] = '\0';
    if (!fault_site_known(fault_site)) {
        /* a misspelled site armed a fault no call reaches: the test then passed untested */
        char shown[256], site[160];
        log_escape(shown, sizeof shown, whole, strlen(whole));
        log_escape(site, sizeof site, fault_site, strlen(fault_site));
        fprintf(stderr,
                "[shardopt] error: SHARDOPT_FAULT='%s': '%s' is no fault site (the sites: %s); "
                "ignored\n",
                shown, site, FAULT_SITES_TEXT);
        fault_site[0] = '\0';
        return;
    }
    fault_n = n;
    fault_errno = err;
    if (strcmp(fault_site, "alloc") == 0 && (fault_kill || fault_hang)) {
        fprintf(stderr,
                "[shardopt] error: SHARDOPT_FAULT='%s@%s': alloc fails, never kills or hangs; "
                "ignored\n",
                fault_kill ? "kill" : "hang", v);
        fault_n = 0;
        fault_site[0] = '\0';
    } else if (strcmp(fault_site, "alloc") == 0 && fault_only_rank < 0) {
        fault_alloc_arm(fault_n);
    } /* else: armed by fault_set_rank on that rank, counting from init */
}

static void fault_setup(void)
{
    const char *r = env_get("SHARDOPT_FAULT_RANK");
    fault_only_rank = -1;
    if (r != NULL && *r != '\0') {
        /* atoi took "abc" (and a typo like "l") as rank 0, "-3" as every rank, and overflowed
         * past INT_MAX: the fault then struck ranks the test did not name */
        char *end = NULL, shown[96];
        errno = 0;
        const long v = strtol(r, &end, 10);
        if (errno != 0 || end == r || *end != '\0' || v < 0 || v > INT_MAX || r[0] < '0' ||
            r[0] > '9') {
            log_escape(shown, sizeof shown, r, strlen(r));
            fprintf(stderr,
                    "[shardopt] error: SHARDOPT_FAULT_RANK='%s': accepted a rank, 0 or more in "
                    "decimal digits; SHARDOPT_FAULT ignored\n",
                    shown);
            return; /* nothing armed: a fault on the wrong ranks would fail another test */
        }
        fault_only_rank = (int)v;
    }
    fault_parse(env_get("SHARDOPT_FAULT"));
}

void fault_set_rank(int rank)
{
    pthread_once(&fault_once, fault_setup);
    pthread_mutex_lock(&fault_lock);
    /* alloc:<n> on one rank only: the rank is known from init on, so it counts from there */
    if (fault_only_rank >= 0 && fault_only_rank == rank && fault_alloc_rank != rank &&
        fault_n > 0 && strcmp(fault_site, "alloc") == 0)
        fault_alloc_arm(fault_n);
    fault_alloc_rank = fault_my_rank = rank;
    pthread_mutex_unlock(&fault_lock);
}

void fault_note_rank(int rank)
{
    pthread_once(&fault_once, fault_setup);
    pthread_mutex_lock(&fault_lock);
    fault_my_rank = rank;
    pthread_mutex_unlock(&fault_lock);
}

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
    if (fault_n == 0 || strcmp(site, fault_site) != 0 ||
        (fault_only_rank >= 0 && fault_only_rank != fault_my_rank))
        return 0;
    pthread_mutex_lock(&fault_lock);
    hit = ++fault_count == fault_n;
    pthread_mutex_unlock(&fault_lock);
    if (hit && fault_kill)
        raise(SIGKILL);
    if (hit && fault_hang) {
        fprintf(stderr, "[shardopt] SHARDOPT_FAULT: rank %d hangs at %s (call %ld)\n",
                fault_my_rank, site, fault_n);
        for (;;)
            pause(); /* until a signal ends the process: the launcher's, after MPI_Abort */
    }
    if (hit)
        errno = fault_errno; /* the caller reports it like the failure it stands for */
    return hit;
}

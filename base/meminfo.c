#include "meminfo.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "env.h"

/* A whole decimal count: digits only, no sign, no blank, no junk, below 2^64. */
static int digits_u64(const char *s, uint64_t *out)
{
    uint64_t v = 0;
    if (s == NULL || *s == '\0')
        return -1;
    for (; *s != '\0'; s++) {
        if (*s < '0' || *s > '9' || v > (UINT64_MAX - (uint64_t)(*s - '0')) / 10)
            return -1;
        v = v * 10 + (uint64_t)(*s - '0');
    }
    *out = v;
    return 0;
}

/* The first line of a small file, without its newline; -1 when unreadable. */
static int first_line(const char *path, char *buf, size_t len)
{
    FILE *f = fopen(path, "re");
    if (f == NULL)
        return -1;
    const int ok = fgets(buf, (int)len, f) != NULL;
    fclose(f);
    if (!ok)
        return -1;
    buf[strcspn(buf, "\n")] = '\0';
    return 0;
}

/* MemAvailable in bytes; -1 when absent (kernels before 3.14) or unreadable. */
static int proc_available(uint64_t *out)
{
    char line[256];
    int found = -1;
    FILE *f = fopen("/proc/meminfo", "re");
    if (f == NULL)
        return -1;
    while (found != 0 && fgets(line, sizeof line, f) != NULL) {
        unsigned long long kb = 0;
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1 && kb <= UINT64_MAX / 1024) {
            *out = (uint64_t)kb * 1024;
            found = 0;
        }
    }
    fclose(f);
    return found;
}

/* Room left under this process's cgroup v2 limit; -1 without one ("max") or unreadable. */
static int cgroup_available(uint64_t *out)
{
    char max[64], cur[64];
    uint64_t m, c;
    if (first_line("/sys/fs/cgroup/memory.max", max, sizeof max) != 0 || digits_u64(max, &m) != 0 ||
        first_line("/sys/fs/cgroup/memory.current", cur, sizeof cur) != 0 ||
        digits_u64(cur, &c) != 0)
        return -1;
    *out = m > c ? m - c : 0;
    return 0;
}

enum meminfo_kind meminfo_host_available(uint64_t *bytes, char *what, size_t len)
{
    const char *hook = env_get("SHARDOPT_MEM_AVAILABLE");
    uint64_t v = 0, c = 0;

    if (hook != NULL) {
        if (digits_u64(hook, &v) != 0) {
            snprintf(what, len,
                     "SHARDOPT_MEM_AVAILABLE = '%.64s': accepted a byte count in decimal digits",
                     hook);
            for (char *p = what; *p != '\0'; p++) /* the value is shown, never its controls */
                if ((unsigned char)*p < 0x20 || *p == 0x7f)
                    *p = '?';
            return MEMINFO_BAD_HOOK;
        }
        *bytes = v;
        snprintf(what, len, "SHARDOPT_MEM_AVAILABLE");
        return MEMINFO_KNOWN;
    }
    const int have_proc = proc_available(&v) == 0;
    const int have_cg = cgroup_available(&c) == 0;
    if (have_cg && (!have_proc || c < v)) {
        *bytes = c;
        snprintf(what, len, "the cgroup's memory.max less memory.current");
        return MEMINFO_KNOWN;
    }
    if (have_proc) {
        *bytes = v;
        snprintf(what, len, "MemAvailable in /proc/meminfo");
        return MEMINFO_KNOWN;
    }
    const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0) {
        *bytes = (uint64_t)pages * (uint64_t)page;
        snprintf(what, len, "sysconf's available pages");
        return MEMINFO_KNOWN;
    }
    return MEMINFO_UNKNOWN;
}

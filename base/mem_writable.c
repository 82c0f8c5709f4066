/* Memory this process may write (mem_writable.h). */
#define _GNU_SOURCE /* process_vm_writev */
#include "base/mem_writable.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

/* what each element of mem_writable_first_read_only's spans starts with */
struct span {
    uintptr_t lo, hi;
};

#define SPAN(j) ((const struct span *)((const char *)spans + stride * (size_t)(j)))

/* The spans against /proc/self/maps, both in address order (mem_writable.h). A host step
 * writing a PROT_READ mapping (np.load(mmap_mode='r') handed to torch.from_numpy, weights mapped
 * read-only) died of SIGSEGV inside the step. */
int mem_writable_first_read_only(const void *spans, int n, size_t stride, char perms[8], char *path,
                                 size_t len)
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
            ;                                              /* the rest of a long path */
        for (; j < n && bad < 0 && SPAN(j)->hi <= lo; j++) /* a gap before this mapping */
            if (covered < SPAN(j)->hi)
                bad = j;
        for (; j < n && bad < 0 && SPAN(j)->lo < hi; j++) {
            if (covered < SPAN(j)->lo)
                covered = SPAN(j)->lo;
            if (covered < lo || pm[1] != 'w') {
                bad = j;
                if (covered >= lo) { /* else a gap: the defaults say no mapping */
                    snprintf(perms, 8, "%s", pm);
                    snprintf(path, len, "%s", name[0] ? name : "anonymous");
                }
                break;
            }
            covered = hi;
            if (SPAN(j)->hi > hi)
                break; /* it goes on into the next mapping */
        }
    }
    if (bad < 0 && j < n && covered < SPAN(j)->hi)
        bad = j; /* past the last mapping */
    fclose(f);
    return bad;
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

int mem_writable_refused(const void *p, size_t bytes, char perms[8], char *path, size_t len)
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
    const struct span one = {lo, hi};
    const int maps = mem_writable_first_read_only(&one, 1, sizeof one, perms, path, len);
    /* the kernel refused a write the maps allow (a mapping changed in between): still refused */
    return probe == 1 || maps >= 0;
}

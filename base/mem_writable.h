/* Whether memory the library is about to write is memory this process may write: a write into a
 * read-only mapping (weights mapped PROT_READ, numpy's mmap_mode='r' through torch.from_numpy) is
 * a SIGSEGV, which no caller can recover from, where a refusal names the buffer. */
#ifndef BASE_MEM_WRITABLE_H
#define BASE_MEM_WRITABLE_H

#include <stddef.h>
#include <stdint.h>

/* spans: n elements of `stride` bytes each starting with two uintptr_t, lo and hi ([lo, hi)),
 * sorted by lo. The index of the first span not wholly inside mappings this process may write
 * (/proc/self/maps, one read for all of them), or -1, also where the maps cannot be read (no
 * check then). perms and path name the mapping in the way ("none" and "no mapping" for a gap are
 * the caller's defaults). */
int mem_writable_first_read_only(const void *spans, int n, size_t stride, char perms[8], char *path,
                                 size_t len);

/* 1 where [p, p + bytes) is not wholly memory this process may write (perms and path then name
 * the mapping in the way: "none" and "no mapping" for a gap), else 0 (also where it cannot be
 * told). Asks the kernel to write one byte of each page back onto itself (process_vm_writev,
 * which honours the protections and fails with EFAULT instead of a signal): a few system calls
 * for one buffer, where reading /proc/self/maps took a millisecond in a process that has torch
 * loaded; the maps are read only to name a refused mapping, or where that call is not allowed. */
int mem_writable_refused(const void *p, size_t bytes, char perms[8], char *path, size_t len);

#endif

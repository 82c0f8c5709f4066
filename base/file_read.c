#include "base/file_read.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/mem.h"

const char *file_read_kind(unsigned mode)
{
    switch (mode & S_IFMT) {
    case S_IFIFO: return "a FIFO";
    case S_IFDIR: return "a directory";
    case S_IFCHR: return "a character device";
    case S_IFBLK: return "a block device";
    case S_IFSOCK: return "a socket";
    case S_IFLNK: return "a symbolic link";
    case S_IFREG: return "a regular file";
    default: return "not a file of a known kind";
    }
}

static int fail(struct file_read_error *e, enum file_read_fault fault, int err)
{
    e->fault = fault;
    e->err = err;
    if (fault == FILE_READ_OPEN || fault == FILE_READ_IO)
        snprintf(e->why, sizeof e->why, "%s", strerror(err));
    return -1;
}

int file_read_open(const char *path, uint64_t max, uint64_t *size, struct file_read_error *e)
{
    struct stat st;
    memset(e, 0, sizeof *e);
    *size = 0;
    /* O_NONBLOCK: a FIFO opens without waiting for a writer, a device without waiting for a
     * carrier; the kind is checked before anything is read */
    const int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0)
        return fail(e, FILE_READ_OPEN, errno);
    if (fstat(fd, &st) != 0) {
        const int err = errno;
        close(fd);
        return fail(e, FILE_READ_IO, err);
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        fail(e, FILE_READ_KIND, 0);
        snprintf(e->why, sizeof e->why, "is %s, expected a regular file",
                 file_read_kind((unsigned)st.st_mode));
        return -1;
    }
    e->size = (uint64_t)st.st_size;
    if (max > 0 && (uint64_t)st.st_size > max) {
        close(fd);
        fail(e, FILE_READ_SIZE, 0);
        snprintf(e->why, sizeof e->why, "is %llu bytes, more than the %llu read",
                 (unsigned long long)st.st_size, (unsigned long long)max);
        return -1;
    }
    /* a regular file: reads block as usual again (O_NONBLOCK means nothing to most filesystems
     * for regular files, but some network ones honour it) */
    const int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
        const int err = errno;
        close(fd);
        return fail(e, FILE_READ_IO, err);
    }
    *size = (uint64_t)st.st_size;
    return fd;
}

int file_read_text(const char *path, uint64_t max, char **text, size_t *len,
                   struct file_read_error *e)
{
    uint64_t size;
    *text = NULL;
    *len = 0;
    const int fd = file_read_open(path, max, &size, e);
    if (fd < 0)
        return -1;
    char *buf = mem_malloc((size_t)size + 1);
    if (buf == NULL) {
        close(fd);
        fail(e, FILE_READ_MEMORY, ENOMEM);
        e->size = size + 1;
        snprintf(e->why, sizeof e->why, "out of memory allocating %llu bytes for its text",
                 (unsigned long long)size + 1);
        return -1;
    }
    /* the size fstat gave, not more: a file that grows while read is read as it was; one that
     * shrinks is a read error (EIO: what was there is gone) */
    size_t n = 0;
    while (n < size) {
        const ssize_t r = read(fd, buf + n, (size_t)size - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            const int err = r < 0 ? errno : EIO;
            close(fd);
            free(buf);
            fail(e, FILE_READ_IO, err);
            if (r == 0)
                snprintf(e->why, sizeof e->why, "read %zu of its %llu bytes: it shrank", n,
                         (unsigned long long)size);
            return -1;
        }
        n += (size_t)r;
    }
    close(fd);
    buf[n] = '\0';
    *text = buf;
    *len = n;
    return 0;
}

/* An output file a tool is told to write (compare_driver manifest OUT, shardopt-plan --calibrate
 * OUT, moe_train --save DIR/model.bin): fopen(path, "w") of a FIFO no process reads waits for a
 * reader for good. Here the path is opened without waiting (a FIFO without a reader is refused
 * at once, ENXIO); a regular file is truncated as "w" would; a FIFO with a reader, /dev/null or a
 * terminal is written as before. */
#ifndef TOOLS_CLI_FILE_H
#define TOOLS_CLI_FILE_H

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

/* The stream for writing, or NULL with errno set. */
static inline FILE *cli_fopen_write(const char *path)
{
    struct stat st;
    int err = 0;
    const int fd = open(path, O_WRONLY | O_CREAT | O_NONBLOCK | O_CLOEXEC, 0644);
    if (fd < 0)
        return NULL;
    const int fl = fcntl(fd, F_GETFL);
    if (fstat(fd, &st) != 0 || (S_ISREG(st.st_mode) && ftruncate(fd, 0) != 0) || fl < 0 ||
        fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0)
        err = errno;
    FILE *f = err == 0 ? fdopen(fd, "w") : NULL;
    if (f == NULL) {
        err = err ? err : errno;
        close(fd);
        errno = err;
    }
    return f;
}

/* 0 where cli_fopen_write could open path now without waiting (a missing file included), else
 * -1 with errno set: a tool about to spend minutes before it writes (shardopt-plan --calibrate)
 * refuses first. Nothing is created or truncated. */
static inline int cli_check_write(const char *path)
{
    const int fd = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? 0 : -1;
    close(fd);
    return 0;
}

#endif

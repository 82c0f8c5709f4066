/* The one way the library opens a file it reads (checkpoint indexes, integrity records, latest,
 * rank files, config files): a name in a directory someone else can write to may be a FIFO, a
 * directory, a device or a link loop instead of the file a save or a user wrote. open(2) of a FIFO
 * for reading waits for a writer for good and a device may never end a read, so every loader
 * opens with O_NONBLOCK (a FIFO opens at once), checks with fstat that what it opened is a regular
 * file, and only then clears O_NONBLOCK and reads. Links are followed (docs/checkpoint.md: a read
 * changes nothing, and DIR itself may be one); a loop is open's ELOOP. A base service: no MPI, no
 * runtime; the caller phrases the refusal (its call, its rank, its status). */
#ifndef BASE_FILE_READ_H
#define BASE_FILE_READ_H

#include <stddef.h>
#include <stdint.h>

/* Why a file was not opened or read. */
enum file_read_fault {
    FILE_READ_OK = 0,
    FILE_READ_OPEN,   /* open(2) failed: err is its errno (ENOENT: absent) */
    FILE_READ_KIND,   /* not a regular file: why says what it is */
    FILE_READ_SIZE,   /* larger than the caller's limit */
    FILE_READ_IO,     /* fstat, fcntl or read failed: err */
    FILE_READ_MEMORY, /* file_read_text: no memory for its text */
};

struct file_read_error {
    enum file_read_fault fault;
    int err;       /* errno, for OPEN and IO */
    uint64_t size; /* the file's size (SIZE, MEMORY) */
    char why[160]; /* "is a FIFO, expected a regular file", "No such file or directory", ... */
};

/* Open path read-only (O_CLOEXEC), a regular file of at most max bytes (max 0: no limit): the
 * descriptor, blocking again, and its size in *size; or -1 with *e filled. */
int file_read_open(const char *path, uint64_t max, uint64_t *size, struct file_read_error *e);

/* The whole of a regular file of at most max bytes, NUL after it (a NUL inside is the caller's to
 * refuse): *text (free() it) and *len; 0, or -1 with *e filled and *text NULL. */
int file_read_text(const char *path, uint64_t max, char **text, size_t *len,
                   struct file_read_error *e);

/* What st_mode is, as the refusal says it: "a FIFO", "a directory", "a character device", ... */
const char *file_read_kind(unsigned mode);

#endif

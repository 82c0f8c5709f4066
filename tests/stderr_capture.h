/* A test reads what the library logged: stderr sent to a file around the calls, then the file's
 * text (the public API has no log callback). */
#ifndef TESTS_STDERR_CAPTURE_H
#define TESTS_STDERR_CAPTURE_H

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* stderr goes to `path` (truncated) from here; returns what stderr_back restores */
static inline int stderr_to(const char *path)
{
    fflush(stderr);
    int saved = dup(2), fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
    dup2(fd, 2);
    close(fd);
    return saved;
}

static inline void stderr_back(int saved)
{
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
}

/* The file's text (at most 64 KiB), "" when absent; the caller frees. */
static inline char *text_of(const char *path)
{
    char *t = calloc(65537, 1);
    FILE *f = fopen(path, "rb");
    if (f != NULL) {
        size_t n = fread(t, 1, 65536, f);
        t[n] = '\0';
        fclose(f);
    }
    return t;
}

#endif

/* A checkpoint directory's own files, apart from the checkpoints' contents (docs/checkpoint.md):
 * the writer's lock (DIR/.lock), removing a tree without following links, a crashed save's
 * leftovers and stale step, pruning to keep_last, and DIR/latest, which a save replaces and a load
 * reads. */
#include "runtime/checkpoint/checkpoint_dir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/fault.h"
#include "base/file_read.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/status.h"
#include "runtime/checkpoint/checkpoint.h"

/* A name a save gives ("step-%08llu"): 8 digits, or more without a leading zero once the step
 * passes 99999999 (a checkpoint's step goes up to 9e15). Only 8 were taken: from step 1e8 on,
 * keep_last neither counted nor pruned the new directories, and the disk filled. */
static int name_is_step(const char *s)
{
    const size_t n = strlen(s);
    if (strncmp(s, "step-", 5) != 0 || n < 13 || n > 5 + 16 || (n > 13 && s[5] == '0'))
        return 0;
    for (size_t i = 5; i < n; i++)
        if (s[i] < '0' || s[i] > '9')
            return 0;
    return 1;
}

/* Step order: fewer digits first, then the digits (names of one length sort as numbers). */
static int by_step(const void *a, const void *b)
{
    const char *x = *(char *const *)a, *y = *(char *const *)b;
    const size_t nx = strlen(x), ny = strlen(y);
    return nx != ny ? (nx < ny ? -1 : 1) : strcmp(x, y);
}

/* What a directory entry is, its links not followed: 'd' a directory, 'l' a symbolic link, 'o'
 * anything else, 0 none (or not readable). */
static int entry_kind(int dfd, const char *name)
{
    struct stat st;
    if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0)
        return 0;
    return S_ISDIR(st.st_mode) ? 'd' : S_ISLNK(st.st_mode) ? 'l' : 'o';
}

static const char *kind_words(int kind)
{
    return kind == 'l' ? "a symbolic link" : "not a directory";
}

/* Deeper than any directory a save makes (it makes one level): what lies below is not ours. */
#define TREE_DEPTH_MAX 8

/* Empty the directory open as dfd (closed here). Each entry is looked at without following
 * links and removed relative to the directory it is in, never by a path: a symbolic link anywhere
 * inside is removed as a link and what it points to stays, and a directory renamed or replaced by
 * a link meanwhile is not entered. A subdirectory on another filesystem (a mount) stays. */
static void tree_empty(int dfd, dev_t dev, int depth)
{
    DIR *d = fdopendir(dfd);
    struct dirent *e;
    if (d == NULL) {
        close(dfd);
        return;
    }
    while ((e = readdir(d)) != NULL) {
        struct stat st;
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0 ||
            fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
            continue;
        if (!S_ISDIR(st.st_mode)) {
            unlinkat(dirfd(d), e->d_name, 0);
        } else if (depth < TREE_DEPTH_MAX && st.st_dev == dev) {
            int sub = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (sub >= 0) {
                tree_empty(sub, dev, depth + 1);
                unlinkat(dirfd(d), e->d_name, AT_REMOVEDIR);
            }
        }
    }
    closedir(d);
}

/* Remove the directory `name` of dfd and what it holds (tree_empty). Anything but a directory,
 * a symbolic link to one included, is left: -1 (errno ELOOP or ENOTDIR). */
int ckpt_dir_tree_remove(int dfd, const char *name)
{
    struct stat st;
    int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return -1;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return -1;
    }
    tree_empty(fd, st.st_dev, 0);
    return unlinkat(dfd, name, AT_REMOVEDIR);
}

/* A directory stream of dfd's directory that owns its own descriptor. */
static DIR *dir_stream(int dfd)
{
    int fd = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (d == NULL && fd >= 0)
        close(fd);
    return d;
}

/* Does DIR/latest name step_name? Looser than a load (trailing CR, LF, blanks or NULs ignored):
 * a latest that a load refuses for its line ending still means that step, which must not be
 * replaced. Read through a link, as a load reads it: a read changes nothing. */
static int latest_names(int dfd, const char *step_name)
{
    char buf[64];
    const size_t len = strlen(step_name);
    struct stat st;
    int fd = openat(dfd, "latest", O_RDONLY | O_NONBLOCK | O_CLOEXEC); /* a FIFO never blocks */
    if (fd < 0)
        return 0;
    ssize_t n = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? read(fd, buf, sizeof buf) : -1;
    close(fd);
    if (n < (ssize_t)len || memcmp(buf, step_name, len) != 0)
        return 0;
    for (ssize_t i = (ssize_t)len; i < n; i++)
        if (buf[i] != '\n' && buf[i] != '\r' && buf[i] != ' ' && buf[i] != '\t' && buf[i] != '\0')
            return 0;
    return 1;
}

/* One writer per directory. Rank 0 holds an exclusive flock on DIR/.lock from before it clears
 * anything until the save returns (the kernel drops it when the process dies), and records who it
 * is there for the writers it turns away. flock, not fcntl locks: those are the process's, so a
 * second runtime in the same process would be let in, and closing any descriptor of the file
 * would drop them. The file is never removed: a writer that opened the old one and a writer that
 * created a new one would both hold "the" lock. */
/* flock's answers for a filesystem that has no locks to give (Lustre mounted without -o flock,
 * some NFS setups): not another writer, and not a reason to refuse every save of a job whose only
 * filesystem it is. */
static int lock_unsupported(int err)
{
    return err == ENOLCK || err == ENOSYS || err == EOPNOTSUPP || err == ENOTSUP;
}

/* *lock_fd is -1 after OK when the filesystem has no flock: the save goes on unguarded (warned
 * once per process), and the caller then clears no leftovers, which may be a live writer's. */
shardopt_status_t ckpt_dir_lock_take(int dfd, const char *dir, int *lock_fd)
{
    char who[512], shown[600], host[256] = "", when[32] = "";
    struct stat st;
    int fd = openat(dfd, ".lock", O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
    if (fd < 0)
        return log_fail(SHARDOPT_ERR_IO, "save: %s/.lock: %s%s", dir, strerror(errno),
                        errno == ELOOP ? " (a symbolic link; the lock file is shardopt's own plain "
                                         "file: remove the link)"
                                       : "");
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return log_fail(SHARDOPT_ERR_IO,
                        "save: %s/.lock: not a plain file (the lock file is shardopt's own: remove "
                        "what is there)",
                        dir);
    }
    *lock_fd = -1;
    while (fault_hit("ckpt.lock") || flock(fd, LOCK_EX | LOCK_NB) != 0) {
        const int err = errno;
        if (err == EINTR)
            continue;
        if (lock_unsupported(err)) {
            static int warned;
            close(fd);
            if (!warned++)
                log_warn("save: %s/.lock: flock: %s: this filesystem gives no locks, so one "
                         "writer per directory is not enforced here and temporary directories "
                         "of other saves (.tmp-step-*) are left in place; mount it with locking "
                         "(Lustre: -o flock) to have both",
                         dir, strerror(err));
            return SHARDOPT_OK;
        }
        ssize_t n = err == EWOULDBLOCK ? pread(fd, who, sizeof who, 0) : -1;
        close(fd);
        if (err != EWOULDBLOCK)
            return log_fail(
                SHARDOPT_ERR_IO,
                "save: %s/.lock: flock: %s (a save holds this lock so that one job at a "
                "time writes into %s)",
                dir, strerror(err), dir);
        while (n > 0 && who[n - 1] == '\n')
            n--;
        return log_fail(SHARDOPT_ERR_IO,
                        "save: %s: another writer is saving into this directory (%s/.lock is held "
                        "by %s): one writer per directory; nothing was written and the "
                        "checkpoints there are untouched; save again when it is done, or elsewhere",
                        dir, dir,
                        n > 0 ? log_escape(shown, sizeof shown, who, (size_t)n)
                              : "a writer that has not recorded itself yet");
    }
    time_t now = time(NULL);
    struct tm tm;
    if (gethostname(host, sizeof host - 1) != 0)
        snprintf(host, sizeof host, "?");
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &tm));
    const int len =
        snprintf(who, sizeof who, "host %s pid %ld since %s\n", host, (long)getpid(), when);
    if (ftruncate(fd, 0) != 0 || pwrite(fd, who, (size_t)len, 0) != len)
        log_warn("save: %s/.lock: recording this writer failed (%s); the lock is held all the same",
                 dir, strerror(errno));
    *lock_fd = fd;
    return SHARDOPT_OK;
}

void ckpt_dir_lock_release(int fd)
{
    if (fd < 0)
        return;
    /* the holder's record is for writers turned away while it holds the lock */
    if (ftruncate(fd, 0) != 0)
        log_debug("save: clearing the lock file's record: %s", strerror(errno));
    close(fd); /* drops the flock */
}

/* Temporary directories of saves that crashed: never published, never read. Called only with the
 * lock held: a live writer's temporary directory is its save in progress. */
void ckpt_dir_leftovers_clear(int dfd, const char *dir)
{
    DIR *d = dir_stream(dfd);
    struct dirent *e;
    char shown[300];
    if (d == NULL)
        return;
    while ((e = readdir(d)) != NULL)
        if (strncmp(e->d_name, ".tmp-step-", 10) == 0) {
            const int kind = entry_kind(dfd, e->d_name);
            if (kind == 'd')
                ckpt_dir_tree_remove(dfd, e->d_name);
            else if (kind != 0)
                log_warn("save: %s/%s is %s, not a temporary directory a save made: left in place",
                         dir, log_escape(shown, sizeof shown, e->d_name, strlen(e->d_name)),
                         kind_words(kind));
        }
    closedir(d);
}

shardopt_status_t ckpt_dir_not_a_step(int dfd, const char *dir)
{
    if (entry_kind(dfd, "index.json") == 0)
        return SHARDOPT_OK;
    return log_fail(SHARDOPT_ERR_IO,
                    "save: %s holds index.json, as a step directory does: a load of %s would "
                    "read that index, never the step this save publishes; save into the "
                    "checkpoint directory above it, or remove the stray index.json",
                    dir, dir);
}

/* DIR/step-N of the step being saved, before the save: absent; or a crashed save's complete but
 * never published step, removed; or the checkpoint latest names, or something shardopt did not
 * make (a link, a file), which stay and fail the save. */
shardopt_status_t ckpt_dir_stale_step_clear(int dfd, const char *dir, const char *step_name,
                                            unsigned long long step)
{
    const int kind = entry_kind(dfd, step_name);
    if (kind == 0)
        return SHARDOPT_OK;
    if (kind != 'd')
        return log_fail(SHARDOPT_ERR_IO,
                        "save: %s/%s is %s, not a step directory a save made: left in place; "
                        "remove it or save elsewhere",
                        dir, step_name, kind_words(kind));
    if (latest_names(dfd, step_name))
        return log_fail(SHARDOPT_ERR_STATE,
                        "save: %s/%s is the latest checkpoint (step %llu): saving the same step "
                        "again would replace it; save elsewhere",
                        dir, step_name, step);
    if (ckpt_dir_tree_remove(dfd, step_name) != 0)
        return log_fail(SHARDOPT_ERR_IO,
                        "save: %s/%s: removing this unpublished step (a crashed save's) failed: %s",
                        dir, step_name, strerror(errno));
    return SHARDOPT_OK;
}

/* Keep keep_last step directories: the one just published (which latest names) and the
 * highest-numbered others; only ever after latest moved. The new step is kept whatever its
 * number: a run that went back to an earlier step saves below the ones already there. A failure
 * here leaves extra checkpoints behind: worth a warning, not a failed save. A step-N that is not
 * a directory (a link to one elsewhere, say) is not one a save made: left, named, not counted. */
void ckpt_dir_steps_prune(int dfd, const char *dir, int keep_last, const char *published)
{
    DIR *d;
    struct dirent *e;
    char **names = NULL;
    int n = 0, cap = 0, oom = 0;

    if (keep_last <= 0 || (d = dir_stream(dfd)) == NULL)
        return;
    while ((e = readdir(d)) != NULL)
        if (name_is_step(e->d_name) && strcmp(e->d_name, published) != 0) {
            const int kind = entry_kind(dfd, e->d_name);
            if (kind != 'd') {
                if (kind != 0)
                    log_warn("save: pruning %s: %s/%s is %s, not a step directory a save made: "
                             "left in place",
                             dir, dir, e->d_name, kind_words(kind));
                continue;
            }
            if (n == cap) {
                char **nn = mem_realloc(names, sizeof(char *) * (size_t)(cap ? 2 * cap : 16));
                if (nn == NULL) {
                    oom = 1;
                    break;
                }
                names = nn;
                cap = cap ? 2 * cap : 16;
            }
            if ((names[n] = mem_strdup(e->d_name)) == NULL) {
                oom = 1;
                break;
            }
            n++;
        }
    /* out of memory: the steps not listed stay; pruning among those listed still never removes
     * one of the keep_last highest, which all rank above the ones it removes */
    if (oom)
        log_warn("save: pruning %s: out of memory allocating %zu bytes for the list of steps; "
                 "some older steps are left in place",
                 dir, mem_failed_bytes());
    closedir(d);
    if (n > 0)
        qsort(names, (size_t)n, sizeof(char *), by_step);
    for (int i = 0; i < n - (keep_last - 1); i++) {
        if (fault_hit("ckpt.prune"))
            log_warn("save: pruning %s/%s: injected fault; left in place", dir, names[i]);
        else if (ckpt_dir_tree_remove(dfd, names[i]) != 0)
            log_warn("save: pruning %s/%s: %s; left in place", dir, names[i], strerror(errno));
    }
    for (int i = 0; i < n; i++)
        free(names[i]);
    free(names);
    fsync(dfd);
}

/* DIR/latest replaced by a file naming step_name. Whatever fails (the fault site ckpt.latest
 * counts: 1 before the write, 2 the write, 3 the fsync, 4 the rename), .latest.tmp is removed. */
shardopt_status_t ckpt_dir_latest_replace(int dfd, const char *dir, const char *step_name,
                                          const char *final)
{
    char line[64];
    const char *what = "create";
    snprintf(line, sizeof line, "%s\n", step_name);
    unlinkat(dfd, ".latest.tmp", 0); /* a crashed save's; a link is removed as a link */
    int fd = openat(dfd, ".latest.tmp", O_CREAT | O_EXCL | O_WRONLY | O_NOFOLLOW | O_CLOEXEC, 0644);
    int ok = fd >= 0, err = errno;
    if (ok) {
        what = "write";
        ok =
            !fault_hit("ckpt.latest") && ckpt_write_all(fd, line, strlen(line), "ckpt.latest") == 0;
    }
    if (ok) {
        what = "fsync";
        ok = !fault_hit("ckpt.latest") && fsync(fd) == 0;
    }
    err = errno;
    if (fd >= 0 && close(fd) != 0 && ok) {
        what = "close";
        ok = 0;
        err = errno;
    }
    if (ok) {
        what = "rename over latest";
        ok = !fault_hit("ckpt.latest") && renameat(dfd, ".latest.tmp", dfd, "latest") == 0;
        err = errno;
    }
    if (!ok && fd < 0 && err == EEXIST)
        /* what the unlink above could not remove (a directory): not a crashed save's file, and
         * not ours to empty; "removed" would be untrue, and every later save fails alike */
        return log_fail(SHARDOPT_ERR_IO,
                        "save: %s/.latest.tmp: create: %s (not a file a save left: a directory "
                        "or something unlink cannot remove; remove it, then save again; the new "
                        "step directory %s is complete but latest still names the previous one)",
                        dir, strerror(err), final);
    if (!ok) {
        unlinkat(dfd, ".latest.tmp", 0);
        return log_fail(SHARDOPT_ERR_IO,
                        "save: %s/.latest.tmp: %s: %s (removed; the new step directory %s is "
                        "complete but latest still names the previous one)",
                        dir, what, strerror(err), final);
    }
    if (fsync(dfd) != 0)
        return log_fail(SHARDOPT_ERR_IO,
                        "save: %s: fsync after replacing latest: %s (latest names %s, which may "
                        "not survive a crash of the machine)",
                        dir, strerror(errno), step_name);
    return SHARDOPT_OK;
}

/* DIR/latest: exactly what a save writes, a plain name and one '\n' (the '\n' may be missing).
 * Anything else is refused, its bytes shown escaped: a CR (a file edited on Windows) or a NUL
 * printed raw would hide itself in the message, and a name cut at the first line end or NUL would
 * follow a file that does not say what it seems to. */
shardopt_status_t ckpt_dir_latest_read(const char *dir, const char *path, char *name,
                                       size_t name_len)
{
    char buf[512], shown[2100];
    size_t n = 0;
    uint64_t size;
    struct file_read_error e;
    /* a FIFO named latest must not stop the load until someone writes to it */
    int fd = file_read_open(path, 0, &size, &e);
    if (fd < 0 && e.fault == FILE_READ_OPEN)
        return log_fail(SHARDOPT_ERR_IO, "load: %s: neither index.json nor latest (%s)", dir,
                        e.why);
    if (fd < 0 && e.fault == FILE_READ_KIND)
        return log_fail(SHARDOPT_ERR_CORRUPT, "load: %s: %s (a save writes latest as one)", path,
                        e.why);
    if (fd < 0)
        return ckpt_file_refused("load", path, &e);
    while (n < sizeof buf) {
        ssize_t r = read(fd, buf + n, sizeof buf - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            const int err = errno;
            close(fd);
            return log_fail(SHARDOPT_ERR_IO, "load: %s: read failed: %s", path, strerror(err));
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    close(fd);
    if (n == sizeof buf)
        return log_fail(SHARDOPT_ERR_CORRUPT,
                        "load: %s: %zu bytes or more, not a step directory name ('%s')", path,
                        sizeof buf, log_escape(shown, 80, buf, 64));
    const size_t len = n > 0 && buf[n - 1] == '\n' ? n - 1 : n;
    buf[len] = '\0';
    if (len >= name_len || memchr(buf, '\0', len) != NULL || !ckpt_name_is_plain(buf))
        return log_fail(SHARDOPT_ERR_CORRUPT,
                        "load: %s: '%s' is not a step directory name (accepted: a name without '/' "
                        "or control characters, then at most one '\\n'%s)",
                        path, log_escape(shown, sizeof shown, buf, len),
                        len > 0 && buf[len - 1] == '\r' ? "; this line ends in \\r, as Windows "
                                                          "writes it: remove the \\r"
                                                        : "");
    /* a save only ever writes a step directory's name ("step-%08llu"); any other plain name
     * ("vm", "best") is a hand edit or a planted file, and following it would load whatever
     * directory it names as if it were the latest save */
    if (!name_is_step(buf))
        return log_fail(SHARDOPT_ERR_CORRUPT,
                        "load: %s: '%s' is not a step directory name (accepted: step-NNNNNNNN, "
                        "as a save writes it, then at most one '\\n')",
                        path, log_escape(shown, sizeof shown, buf, len));
    memcpy(name, buf, len + 1);
    return SHARDOPT_OK;
}

/* The only mutable globals of the library besides the tests' hooks (fault injection in
 * base/fault.c, the allocation counter of SHARDOPT_FAULT=alloc:<n> in base/mem.c,
 * ns_coeffs_gram_restarts_force in kernels/ns_coeffs.c) and per-thread state (the last error,
 * base/status.c; the phase and bucket a wait names, runtime/comm/comm_wait.c): the log sink and
 * level, set once under a pthread_once and by init. */
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "env.h"

static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static int log_level = LOG_WARN;
static FILE *log_stream;
static int log_rank = -1;
static char log_host[64];
static char log_env_problem[256];   /* why the logging env vars were refused; "" if they were not */
static char log_file_pattern[1024]; /* SHARDOPT_LOG_FILE with %r: opened once the rank is known */
static char log_file_path[1024];    /* the file log_stream writes, when it is not stderr */

static const char *const level_names[] = {"error", "warn", "info", "debug"};

/* Expand %h, %p, %r in the SHARDOPT_LOG_FILE pattern. Returns 0 when the path did not fit
 * (out then holds its start). */
static int log_path_expand(const char *pattern, char *out, size_t len)
{
    size_t o = 0;
    const char *p = pattern;
    for (; *p != '\0' && o + 1 < len; p++) {
        if (p[0] == '%' && p[1] != '\0') {
            char tmp[64] = "";
            switch (p[1]) {
            case 'h': snprintf(tmp, sizeof tmp, "%s", log_host); break;
            case 'p': snprintf(tmp, sizeof tmp, "%ld", (long)getpid()); break;
            case 'r': snprintf(tmp, sizeof tmp, "%d", log_rank); break;
            default: snprintf(tmp, sizeof tmp, "%%%c", p[1]); break;
            }
            p++;
            const char *t = tmp;
            for (; *t != '\0' && o + 1 < len; t++)
                out[o++] = *t;
            if (*t != '\0')
                break; /* the expansion did not fit */
        } else {
            out[o++] = *p;
        }
    }
    out[o] = '\0';
    return *p == '\0';
}

/* Before the log exists: one line on stderr, the variable's text escaped as every logged
 * message is (log_defang): a control byte in it must not reach a terminal raw. */
static void log_env_warn(const char *value, const char *why)
{
    char shown[256];
    log_escape(shown, sizeof shown, value, strlen(value));
    fprintf(stderr, "[shardopt] warn: SHARDOPT_LOG_FILE '%s': %s, logging to stderr\n", shown, why);
}

static void log_open(const char *pattern)
{
    char path[1024];
    /* a cut path would name another file than the one asked for, silently */
    if (!log_path_expand(pattern, path, sizeof path)) {
        char why[96];
        snprintf(why, sizeof why, "the path is longer than %zu bytes once expanded",
                 sizeof path - 1);
        log_env_warn(pattern, why);
        return;
    }
    /* O_NONBLOCK: a FIFO nobody reads made fopen wait for a reader for good, at the first
     * message (init hung); now it fails at once (ENXIO). Writes block again once it is open. */
    const int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_NONBLOCK | O_CLOEXEC, 0644);
    FILE *f = NULL;
    if (fd >= 0 && fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) == 0)
        f = fdopen(fd, "a");
    if (f != NULL) {
        log_stream = f;
        snprintf(log_file_path, sizeof log_file_path, "%s", path);
        return;
    }
    char why[160];
    snprintf(why, sizeof why, "cannot open (%s%s)", strerror(errno),
             errno == ENXIO ? ": a FIFO no process reads" : "");
    if (fd >= 0)
        close(fd);
    log_env_warn(path, why);
}

static void log_setup(void)
{
    const char *lvl = env_get("SHARDOPT_LOG_LEVEL");
    const char *file = env_get("SHARDOPT_LOG_FILE");
    int bad_level = 0;

    gethostname(log_host, sizeof log_host - 1);
    log_stream = stderr;
    if (lvl != NULL && *lvl != '\0') {
        int found = 0;
        for (int i = 0; i < 4; i++)
            if (strcmp(lvl, level_names[i]) == 0) {
                log_level = i;
                found = 1;
            }
        bad_level = !found;
    }
    if (file != NULL && strlen(file) >= sizeof log_file_pattern)
        /* cut, it would lose its %r or name another file */
        log_env_warn(file, "longer than 1023 bytes");
    else if (file != NULL && *file != '\0' && strstr(file, "%r") != NULL)
        /* the rank is placed by init: every rank would open the same "-1" file before that
         * (the file opens in log_set_rank; until then messages go to stderr) */
        snprintf(log_file_pattern, sizeof log_file_pattern, "%s", file);
    else if (file != NULL && *file != '\0')
        log_open(file);
    /* A message cannot fail the call that logs it: init reports the problem (log_env_check). */
    if (bad_level)
        snprintf(log_env_problem, sizeof log_env_problem,
                 "SHARDOPT_LOG_LEVEL = '%.64s': accepted error, warn, info, debug", lvl);
}

const char *log_env_check(void)
{
    pthread_once(&log_once, log_setup);
    return log_env_problem[0] != '\0' ? log_env_problem : NULL;
}

int log_enabled(enum log_level level)
{
    pthread_once(&log_once, log_setup);
    return (int)level <= log_level;
}

void log_set_rank(int rank)
{
    pthread_once(&log_once, log_setup);
    pthread_mutex_lock(&log_lock);
    log_rank = rank;
    if (log_file_pattern[0] != '\0' && rank >= 0) {
        log_open(log_file_pattern); /* the first runtime's rank names the file for good */
        log_file_pattern[0] = '\0';
    }
    pthread_mutex_unlock(&log_lock);
}

void log_msg(enum log_level level, const char *fmt, ...)
{
    va_list ap;
    char msg[2048];

    if (!log_enabled(level))
        return;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    log_defang(msg, sizeof msg);
    pthread_mutex_lock(&log_lock);
    /* a log file that stops taking lines (a full disk, /dev/full) lost every message after it,
     * the errors too, without a word: the first failed line says so on stderr, and the log goes
     * on there, this line first */
    for (int tries = 0; tries < 2; tries++) {
        int failed;
        if (log_rank >= 0)
            failed = fprintf(log_stream, "[shardopt %s:%ld r%d] %s: %s\n", log_host, (long)getpid(),
                             log_rank, level_names[level], msg) < 0;
        else
            failed = fprintf(log_stream, "[shardopt %s:%ld] %s: %s\n", log_host, (long)getpid(),
                             level_names[level], msg) < 0;
        failed = fflush(log_stream) != 0 || failed;
        if (!failed || log_stream == stderr)
            break;
        const int err = errno;
        char why[160];
        snprintf(why, sizeof why, "writing failed (%s)", strerror(err));
        fclose(log_stream); /* what it held is lost either way */
        log_stream = stderr;
        log_env_warn(log_file_path, why);
    }
    pthread_mutex_unlock(&log_lock);
}

/* Length of the valid UTF-8 sequence at p (of n bytes left) that is not a C1 control, else 0. */
static size_t utf8_len(const unsigned char *p, size_t n)
{
    size_t len = p[0] >= 0xc2 && p[0] <= 0xdf   ? 2
                 : p[0] >= 0xe0 && p[0] <= 0xef ? 3
                 : p[0] >= 0xf0 && p[0] <= 0xf4 ? 4
                                                : 0;
    if (len == 0 || len > n)
        return 0;
    for (size_t i = 1; i < len; i++)
        if ((p[i] & 0xc0) != 0x80)
            return 0;
    if ((p[0] == 0xc2 && p[1] < 0xa0) || (p[0] == 0xe0 && p[1] < 0xa0) ||
        (p[0] == 0xed && p[1] >= 0xa0) || (p[0] == 0xf0 && p[1] < 0x90) ||
        (p[0] == 0xf4 && p[1] >= 0x90))
        return 0; /* C1 control, overlong, surrogate, past U+10FFFF */
    return len;
}

const char *log_escape(char *out, size_t outlen, const void *text, size_t n)
{
    const unsigned char *s = text;
    size_t o = 0;
    if (outlen == 0)
        return out;
    for (size_t i = 0; i < n;) {
        char e[8];
        size_t el = utf8_len(s + i, n - i), take = el ? el : 1;
        if (el > 0)
            memcpy(e, s + i, el);
        else if (s[i] == '\\')
            el = (size_t)snprintf(e, sizeof e, "\\\\");
        else if (s[i] == '\n' || s[i] == '\r' || s[i] == '\t')
            el = (size_t)snprintf(e, sizeof e, "\\%c",
                                  s[i] == '\n'   ? 'n'
                                  : s[i] == '\r' ? 'r'
                                                 : 't');
        else if (s[i] < 0x20 || s[i] >= 0x7f)
            el = (size_t)snprintf(e, sizeof e, "\\x%02x", s[i]);
        else
            e[0] = (char)s[i], el = 1;
        /* room for this piece and, unless it is the last, for "..." */
        if (o + el + (i + take < n ? 3 : 0) >= outlen) {
            if (outlen > 4) {
                while (o + 3 >= outlen)
                    o--;
                memcpy(out + o, "...", 3);
                o += 3;
            }
            break;
        }
        memcpy(out + o, e, el);
        o += el;
        i += take;
    }
    out[o < outlen ? o : outlen - 1] = '\0';
    return out;
}

/* Is the byte at s[i] (of n) printable as it is: ASCII that is no control, or the start of a
 * UTF-8 sequence that is no C1 control? Returns its length then, else 0. */
static size_t printable_len(const unsigned char *s, size_t i, size_t n)
{
    if (s[i] < 0x80)
        return s[i] >= 0x20 && s[i] != 0x7f ? 1 : 0;
    return utf8_len(s + i, n - i);
}

void log_defang(char *buf, size_t cap)
{
    const size_t n = strlen(buf);
    size_t i = 0, take;
    while (i < n && (take = printable_len((const unsigned char *)buf, i, n)) > 0)
        i += take; /* the usual message needs nothing: no copy */
    if (i == n || cap == 0)
        return;
    unsigned char tmp[2048];
    const size_t len = n < sizeof tmp ? n : sizeof tmp;
    memcpy(tmp, buf, len);
    size_t o = 0;
    for (i = 0; i < len; i += take) {
        char e[8];
        size_t el = take = printable_len(tmp, i, len);
        if (el > 0)
            memcpy(e, tmp + i, el);
        else if (tmp[i] == '\n' || tmp[i] == '\r' || tmp[i] == '\t')
            el = (size_t)snprintf(e, sizeof e, "\\%c",
                                  tmp[i] == '\n'   ? 'n'
                                  : tmp[i] == '\r' ? 'r'
                                                   : 't');
        else
            el = (size_t)snprintf(e, sizeof e, "\\x%02x", tmp[i]);
        take = take > 0 ? take : 1;
        if (o + el + 1 > cap) { /* cut, with "..." where it fits */
            o = cap >= 4 ? cap - 4 : 0;
            while (o > 0 && (buf[o] & 0xc0) == 0x80) /* not inside a UTF-8 sequence */
                o--;
            memcpy(buf + o, "...", cap >= 4 ? 3 : 0);
            o += cap >= 4 ? 3 : 0;
            break;
        }
        memcpy(buf + o, e, el);
        o += el;
    }
    buf[o] = '\0';
}

/* Logging, NCCL-style: SHARDOPT_LOG_LEVEL = error|warn|info|debug (default warn),
 * SHARDOPT_LOG_FILE = path with %h (host), %p (pid), %r (rank); default stderr. Both are read
 * once, at the first message. */
#ifndef BASE_LOG_H
#define BASE_LOG_H

#include <stddef.h>

enum log_level { LOG_ERROR = 0, LOG_WARN = 1, LOG_INFO = 2, LOG_DEBUG = 3 };

void log_msg(enum log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Whether a message at level would be written (to skip building expensive ones). */
int log_enabled(enum log_level level);

/* NULL when SHARDOPT_LOG_LEVEL is valid (or unset), else a message naming it. */
const char *log_env_check(void);

/* The rank shown in messages and in %r; set by init (-1 until then). */
void log_set_rank(int rank);

/* Text read from a file (or a name read from a directory) made fit for a message: bytes 0x00-0x1f
 * and 0x7f as \r, \n, \t or \xNN, a backslash as \\, bytes that are not valid UTF-8 (and C1
 * controls) as \xNN; cut with "..." when out (of outlen > 4) is too small. Returns out. A '\r'
 * printed raw moves the terminal back over the message and hides what was wrong. */
const char *log_escape(char *out, size_t outlen, const void *text, size_t n);

/* Rewrite the message in buf (cap bytes) so that it holds no control byte and no byte that is
 * not UTF-8: each becomes its escape (\r, \n, \t, \xNN), cut to cap with "..." if it grows.
 * Backslashes are left as they are (a log_escape'd part stays readable). Every message the
 * library records or logs goes through it: text read from a file or a variable may hold anything,
 * and a CR or an escape sequence printed raw hides or rewrites what the reader sees. */
void log_defang(char *buf, size_t cap);

#define log_warn(...)  log_msg(LOG_WARN, __VA_ARGS__)
#define log_info(...)  log_msg(LOG_INFO, __VA_ARGS__)
#define log_debug(...) log_msg(LOG_DEBUG, __VA_ARGS__)

#endif

/* Strict numbers for every command-line tool, with MPI or without (tools/cli.h adds the MPI
 * way out): the whole argument, inside the range the option accepts, or a refusal that the
 * caller turns into one line naming the option, the value and the range.
 *
 * Why ranges and not just "a number": atoi and unchecked strtol let "12abc" run as 12,
 * "99999999999" wrap to a negative int, and a value that parses but is absurd (--steps 2^31,
 * a width of 2^30) reach calloc or a loop that never ends. Each option's range is where the
 * tool still makes sense; what a combination of options would allocate is checked against the
 * machine's memory (cli_mem_fits) before anything is allocated. */
#ifndef TOOLS_CLI_NUM_H
#define TOOLS_CLI_NUM_H

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* An argument holding a control byte (a newline, a CR, an escape sequence) is refused before any
 * is parsed: every tool names a refused argument in its one-line message, and the byte printed
 * raw splits that line or rewrites the terminal (ESC [2J clears it) over what was wrong. 1, and
 * with print a line on stderr naming the argument, the byte and the argument escaped (at most 200
 * bytes of it); 0 when every argument is plain. MPI tools print on rank 0 only. */
static inline int cli_argv_refused(int argc, char **argv, const char *prog, int print)
{
    for (int i = 1; i < argc; i++)
        for (const unsigned char *c = (const unsigned char *)argv[i]; *c != '\0'; c++) {
            if (*c >= 0x20 && *c != 0x7f)
                continue;
            if (print) {
                fprintf(stderr,
                        "%s: argument %d holds the control byte \\x%02x at byte %d, refused: '",
                        prog, i, *c, (int)(c - (const unsigned char *)argv[i]));
                const unsigned char *d = (const unsigned char *)argv[i];
                for (int k = 0; d[k] != '\0' && k < 200; k++)
                    if (d[k] < 0x20 || d[k] == 0x7f || d[k] == '\\')
                        fprintf(stderr, "\\x%02x", d[k]);
                    else
                        fputc(d[k], stderr);
                fputs("'\n", stderr);
            }
            return 1;
        }
    return 0;
}

/* A decimal integer spelled out in full: an optional '-' then digits, nothing else (strtol
 * alone also takes " 5", "+5" and "0x10" with base 0). */
static inline int cli_num_is_decimal(const char *s)
{
    if (s == NULL)
        return 0;
    if (*s == '-')
        s++;
    if (*s < '0' || *s > '9')
        return 0;
    while (*s >= '0' && *s <= '9')
        s++;
    return *s == '\0';
}

/* The whole of s as a decimal integer in [lo, hi]: 0, or -1. */
static inline int cli_parse_ll_in(const char *s, long long lo, long long hi, long long *out)
{
    if (!cli_num_is_decimal(s))
        return -1;
    errno = 0;
    const long long v = strtoll(s, NULL, 10);
    if (errno == ERANGE || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

static inline int cli_parse_int_in(const char *s, int lo, int hi, int *out)
{
    long long v;
    if (cli_parse_ll_in(s, lo, hi, &v) != 0)
        return -1;
    *out = (int)v;
    return 0;
}

/* The whole of s as a finite number in [lo, hi] (NaN, inf, "1e999" and "2x" refused): 0, -1. */
static inline int cli_parse_double_in(const char *s, double lo, double hi, double *out)
{
    char *end;
    if (s == NULL || *s == '\0' || *s == ' ' || *s == '\t' || *s == '\n')
        return -1;
    errno = 0;
    const double v = strtod(s, &end);
    if (*end != '\0' || errno == ERANGE || !isfinite(v) || !(v >= lo && v <= hi))
        return -1;
    *out = v;
    return 0;
}

/* "a,b,c": each item a decimal integer in [lo, hi], at least one and at most cap of them, no
 * empty item. The count, or -1. */
static inline int cli_parse_list_in(const char *s, long long lo, long long hi, long long *out,
                                    int cap)
{
    int n = 0;
    char item[32];
    if (s == NULL || *s == '\0')
        return -1;
    for (;;) {
        size_t k = 0;
        while (s[k] != '\0' && s[k] != ',')
            k++;
        if (k == 0 || k >= sizeof item || n == cap)
            return -1;
        for (size_t j = 0; j < k; j++)
            item[j] = s[j];
        item[k] = '\0';
        if (cli_parse_ll_in(item, lo, hi, &out[n]) != 0)
            return -1;
        n++;
        if (s[k] == '\0')
            return n;
        s += k + 1;
    }
}

/* The memory this process may have, in bytes: the machine's, or less under an address-space
 * limit (ulimit -v); 0 when neither can be read. */
static inline double cli_mem_total(void)
{
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    double total = pages > 0 && page > 0 ? (double)pages * (double)page : 0;
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        (total == 0 || (double)rl.rlim_cur < total))
        total = (double)rl.rlim_cur;
    return total;
}

/* Whether bytes (worked out in double, so that a product of options cannot wrap) fit in the
 * memory this process may have; when nothing says, up to 1 TiB. */
static inline int cli_mem_fits(double bytes)
{
    const double total = cli_mem_total();
    return isfinite(bytes) && bytes >= 0 && bytes <= (total > 0 ? total : 1099511627776.0);
}

/* The program named by cli_stdout_at_exit's line. */
static const char *cli_stdout_prog;

/* At exit: the buffered tail of stdout reaches the file only here, so a full disk, /dev/full or a
 * closed stdout lost what the tool printed (a plan, a --json document) while exit 0 said it was
 * written. A line on stderr and exit 1 then. */
static inline void cli_stdout_check(void)
{
    const char *why = NULL;
    errno = 0;
    if (fflush(stdout) != 0)
        why = strerror(errno);
    else if (ferror(stdout))
        why = "an earlier write to it failed";
    if (why == NULL)
        return;
    fprintf(stderr, "%s: writing standard output failed (%s): the output is lost or cut\n",
            cli_stdout_prog, why);
    fflush(stderr);
    _exit(1);
}

/* Every tool calls this first: its stdout is checked when it exits (cli_stdout_check). */
static inline void cli_stdout_at_exit(const char *prog)
{
    cli_stdout_prog = prog;
    atexit(cli_stdout_check);
}

#endif

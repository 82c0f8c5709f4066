/* Command-line handling shared by the MPI programs (examples/moe_train, examples/moe_demo,
 * bench/step_bench, bench/ckpt_bench): --help, strict numbers, and one way out on a bad
 * argument.
 *
 * Every rank parses the same argv, so every rank reaches the same verdict: cli_exit prints on
 * rank 0 only and every rank finalizes MPI and exits with the same code. No MPI_Abort, whose
 * banner would bury the one line that says what was wrong. */
#ifndef TOOLS_CLI_H
#define TOOLS_CLI_H

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* code 0 (--help): the usage on stdout. Otherwise "prog: <message>" and where the options are
 * listed, on stderr. Then MPI_Finalize and exit(code) on every rank. */
static inline void cli_exit(int rank, const char *prog, const char *usage, int code,
                            const char *fmt, ...)
{
    if (rank == 0) {
        FILE *f = code == 0 ? stdout : stderr;
        if (fmt != NULL) {
            va_list ap;
            va_start(ap, fmt);
            fprintf(f, "%s: ", prog);
            vfprintf(f, fmt, ap);
            fputc('\n', f);
            va_end(ap);
        }
        if (code == 0)
            fputs(usage, f);
        else
            fprintf(f, "%s: `%s --help` lists the options\n", prog, prog);
        fflush(f);
    }
    MPI_Finalize();
    exit(code);
}

static inline int cli_is_help(const char *a)
{
    return strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0;
}

/* The whole of s as a decimal int: 0, or -1 for "10x", "", " 5", "1e3" or out of int's range
 * (atoi takes the first two as 10 and 0 without a word). */
static inline int cli_parse_int(const char *s, int *out)
{
    char *end;
    if (s == NULL || *s == '\0' || *s == ' ' || *s == '\t')
        return -1;
    errno = 0;
    const long v = strtol(s, &end, 10);
    if (*end != '\0' || errno == ERANGE || v < INT_MIN || v > INT_MAX)
        return -1;
    *out = (int)v;
    return 0;
}

/* The whole of s as a finite double: 0 or -1. */
static inline int cli_parse_double(const char *s, double *out)
{
    char *end;
    if (s == NULL || *s == '\0' || *s == ' ' || *s == '\t')
        return -1;
    errno = 0;
    const double v = strtod(s, &end);
    if (*end != '\0' || errno == ERANGE || !isfinite(v))
        return -1;
    *out = v;
    return 0;
}

#endif

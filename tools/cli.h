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

#include "tools/cli_num.h"

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
    return cli_parse_int_in(s, INT_MIN, INT_MAX, out);
}

/* The whole of s as a finite double: 0 or -1. */
static inline int cli_parse_double(const char *s, double *out)
{
    return cli_parse_double_in(s, -HUGE_VAL, HUGE_VAL, out);
}

/* An integer option of a program's struct of options: its name, the range it accepts and
 * where the int lies in the struct (offsetof). */
struct cli_int_spec {
    const char *name;
    int lo, hi;
    size_t off;
};

/* The spec among specs[0..n) that option a names, or NULL. */
static inline const struct cli_int_spec *cli_int_spec_find(const struct cli_int_spec *specs,
                                                           size_t n, const char *a)
{
    for (size_t k = 0; k < n; k++)
        if (strcmp(a, specs[k].name) == 0)
            return &specs[k];
    return NULL;
}

/* Option a's value v as an int in [lo, hi] into *out, or the run ends with exit 2 and
 * "a takes an integer in lo..hi, not 'v'". */
static inline void cli_int_opt(int rank, const char *prog, const char *usage, const char *a,
                               const char *v, int lo, int hi, int *out)
{
    if (cli_parse_int_in(v, lo, hi, out) != 0)
        cli_exit(rank, prog, usage, 2, "%s takes an integer in %d..%d, not '%s'", a, lo, hi, v);
}

/* The same for a finite number in [lo, hi]. */
static inline void cli_double_opt(int rank, const char *prog, const char *usage, const char *a,
                                  const char *v, double lo, double hi, double *out)
{
    if (cli_parse_double_in(v, lo, hi, out) != 0)
        cli_exit(rank, prog, usage, 2, "%s takes a number in %g..%g, not '%s'", a, lo, hi, v);
}

/* What the options ask this rank to allocate, against the machine's memory, before any of it
 * is allocated: over it, exit 2 naming what asked for it. */
static inline void cli_mem_check(int rank, const char *prog, const char *usage, const char *what,
                                 double bytes)
{
    if (!cli_mem_fits(bytes))
        cli_exit(rank, prog, usage, 2,
                 "%s needs about %.3g GiB per rank, more than the %.3g GiB this process may have",
                 what, bytes / 1073741824.0, cli_mem_total() / 1073741824.0);
}

#endif

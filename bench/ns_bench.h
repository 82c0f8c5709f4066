/* ns_bench's options and results (ns_bench.c measures, ns_bench_report.c prints them). */
#ifndef BENCH_NS_BENCH_H
#define BENCH_NS_BENCH_H

#include <stdint.h>

#define BENCH_STEPS     5
#define BENCH_AOL_STEPS 4
/* what bench_sample runs: the two standard variants, the limit, then issue 23's */
enum { W_PLAIN, W_SYM, W_LIMIT, W_GRAM, W_SYM_AOL, W_GRAM_AOL, W_COUNT };
#define BENCH_MAX_SHAPES 32

struct bench_opts {
    int json;
    int bf16; /* --compute bf16 */
    int torch;
    int threads;
    int reps;
    int cuda;         /* --backend cuda */
    int algos;        /* bit 0 standard, bit 1 gram (--algorithm) */
    int preconds;     /* bit 0 frobenius, bit 1 aol (--precondition) */
    int extras_asked; /* --algorithm or --precondition given (--backend cuda adds none unasked) */
    int nshapes;
    int64_t shape[BENCH_MAX_SHAPES][2];
    int64_t batch[BENCH_MAX_SHAPES]; /* --backend cuda only */
};

struct bench_result {
    int64_t m, n;
    int block;                      /* bf16 symmetric: rows per block row */
    double plain_s, sym_s, sgemm_s; /* medians, seconds per call (sgemm_s: the limit) */
    double max_abs_diff;            /* between the two variants' outputs */
    double var_s[W_COUNT];          /* medians of issue 23's variants; 0 when not run */
    double var_diff[W_COUNT];       /* their max |difference| from the symmetric output */
    int var_variant;                /* the plain/symmetric products they ran with */
    double torch_s;                 /* PyTorch bf16 Newton-Schulz; 0 when not run */
    double
        guard_s; /* the Gram result guard's pass over one m x n result (kernels/cpu/ns_common.h,
                    ns_gram_guard_ok) on fp32, as both computes check it; 0 when gram did not run */
};

/* Whether variant w runs under --algorithm / --precondition. */
int ns_bench_wants(const struct bench_opts *o, int w);

/* The results of o->nshapes shapes as the table (with issue 23's variants after it) or as JSON. */
void ns_bench_report_table(const struct bench_opts *o, const struct bench_result *res);
void ns_bench_report_json(const struct bench_opts *o, const struct bench_result *res);

#endif

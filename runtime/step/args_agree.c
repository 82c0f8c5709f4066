/* The step's arguments agreed across ranks (args_agree.h). */
#include "runtime/step/args_agree.h"

#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "base/status.h"
#include "kernels/rng.h"
#include "runtime/comm/comm_wait.h"

/* What the message calls each slot; the step's argument and how it was resolved. */
static const char *const slot_names[ARGS_AGREE_N] = {
    [ARGS_AGREE_LR] = "args.lr",
    [ARGS_AGREE_ADAMW_LR] = "args.adamw_lr (in effect: a negative value is lr)",
    [ARGS_AGREE_MUON_WD] = "args.weight_decay (Muon's, in effect: a negative value is the "
                           "config's weight_decay)",
    [ARGS_AGREE_ADAMW_WD] = "args.weight_decay (AdamW's, in effect: a negative value is the "
                            "config's adamw_weight_decay)",
    [ARGS_AGREE_MOMENTUM] = "args.momentum (in effect: a negative value is the config's momentum)",
    [ARGS_AGREE_ADAMW_BETA1] = "args.adamw_beta1 (in effect: a negative value is the config's "
                               "adamw_beta1)",
    [ARGS_AGREE_ADAMW_BETA2] = "args.adamw_beta2 (in effect: a negative value is the config's "
                               "adamw_beta2)",
    [ARGS_AGREE_ADAMW_EPS] = "args.adamw_eps (in effect: a negative value is the config's "
                             "adamw_eps)",
    [ARGS_AGREE_MAX_GRAD_NORM] = "args.max_grad_norm (in effect: <= 0 is no clipping)",
    [ARGS_AGREE_SKIP_MISSING] = "args.skip_missing_grads",
    [ARGS_AGREE_STEPS] = "the runtime's step counter (stats.steps)",
};

/* Parameters' step counts per slow-path all-reduce: a fixed array on the stack (the step
 * allocates nothing). */
#define ARGS_AGREE_CHUNK 64

/* +0 and -0 are one value to the update: one digest */
static uint64_t bits_of(double v)
{
    uint64_t u;
    if (v == 0)
        v = 0;
    memcpy(&u, &v, sizeof u);
    return u;
}

/* Each word chained through a bijection (h <- splitmix64(h ^ w)): for fixed other words the
 * digest is a bijection of any one word, so any one differing word changes it */
static uint64_t mix(uint64_t h, uint64_t w) { return rng_splitmix64(h ^ w); }

uint64_t args_agree_digest(shardopt_runtime_t rt, const double vals[ARGS_AGREE_N])
{
    /* the step's tag first: a rank in another collective call (groups_agree_call) differs */
    uint64_t h = mix(0x53484152444F5054ull, groups_call_tag("step"));
    for (int i = 0; i < ARGS_AGREE_N; i++)
        h = mix(h, bits_of(vals[i]));
    for (int i = 0; i < rt->nparams; i++)
        h = mix(h, rt->params[i]->step);
    return h;
}

/* The shortest text that reads back as v (%.15g, else %.17g): 0.001, not 0.0010000000000000000208,
 * and two values that differ in the last bit never print alike. */
static void fmt_exact(char *out, size_t len, double v)
{
    snprintf(out, len, "%.15g", v);
    double back = 0;
    if (sscanf(out, "%lf", &back) != 1 || back != v)
        snprintf(out, len, "%.17g", v);
}

struct dbl_int {
    double v;
    int rank;
};

/* lo[i] and hi[i]: the smallest and largest of v[i] over every rank, each with the lowest rank
 * holding it (MINLOC and MAXLOC over the dense group, then the replicate group). */
static shardopt_status_t min_max(shardopt_runtime_t rt, const double *v, int n, struct dbl_int *lo,
                                 struct dbl_int *hi)
{
    for (int i = 0; i < n; i++) {
        lo[i] = hi[i] = (struct dbl_int){v[i] == 0 ? 0.0 : v[i], rt->groups.me.rank};
    }
    if (groups_allreduce(&rt->groups, lo, n, MPI_DOUBLE_INT, MPI_MINLOC) != MPI_SUCCESS ||
        groups_allreduce(&rt->groups, hi, n, MPI_DOUBLE_INT, MPI_MAXLOC) != MPI_SUCCESS)
        return log_fail(SHARDOPT_ERR_COMM,
                        "step: rank %d: the all-reduce that compares the step's arguments "
                        "across ranks failed",
                        rt->groups.me.rank);
    return SHARDOPT_OK;
}

static shardopt_status_t differs(const char *what, const char *advice, const struct dbl_int *lo,
                                 const struct dbl_int *hi)
{
    char a[40], b[40];
    fmt_exact(a, sizeof a, lo->v);
    fmt_exact(b, sizeof b, hi->v);
    return log_fail(SHARDOPT_ERR_MISMATCH,
                    "step: %s differs between ranks: rank %d has %s, rank %d has %s (%s); "
                    "nothing was updated",
                    what, lo->rank, a, hi->rank, b, advice);
}

shardopt_status_t args_agree_find(shardopt_runtime_t rt, const double vals[ARGS_AGREE_N])
{
    struct dbl_int lo[ARGS_AGREE_CHUNK], hi[ARGS_AGREE_CHUNK];
    double v[ARGS_AGREE_CHUNK];
    comm_phase("step: finding the argument that differs between ranks", -1);
    /* first whether every rank is in the step at all (the others run the same check) */
    shardopt_status_t st = groups_calls_check(&rt->groups, "step");
    if (st != SHARDOPT_OK)
        return st;
    st = min_max(rt, vals, ARGS_AGREE_N, lo, hi);
    if (st != SHARDOPT_OK)
        return st;
    for (int i = 0; i < ARGS_AGREE_N; i++)
        if (lo[i].v != hi[i].v)
            return differs(slot_names[i],
                           i == ARGS_AGREE_STEPS ? "a runtime that missed or repeated a step, or "
                                                   "loaded another checkpoint"
                                                 : "every rank must pass the same step arguments",
                           &lo[i], &hi[i]);
    /* every rank has the same parameters (commit checked), so the same number of rounds */
    for (int base = 0; base < rt->nparams; base += ARGS_AGREE_CHUNK) {
        const int n = rt->nparams - base < ARGS_AGREE_CHUNK ? rt->nparams - base : ARGS_AGREE_CHUNK;
        for (int i = 0; i < n; i++)
            v[i] = (double)rt->params[base + i]->step; /* below 2^53: exact */
        st = min_max(rt, v, n, lo, hi);
        if (st != SHARDOPT_OK)
            return st;
        for (int i = 0; i < n; i++)
            if (lo[i].v != hi[i].v) {
                char what[320];
                snprintf(what, sizeof what, "the step count of parameter '%s'",
                         rt->params[base + i]->name);
                return differs(what,
                               "shardopt_param_set_step must set the same count on every rank",
                               &lo[i], &hi[i]);
            }
    }
    /* the digests differed, so some word did: not reached */
    return log_fail(SHARDOPT_ERR_INTERNAL,
                    "step: the digests of the step's arguments differ between ranks but no "
                    "argument does");
}

shardopt_status_t args_agree_struct_check(const shardopt_step_args_t *args)
{
    /* each version's fields end at ends[version]: a shorter struct (filled by hand, copied short)
     * had them read as the config's without a word (adamw_eps = 1e-300 dropped) */
    static const size_t ends[] = {0, offsetof(shardopt_step_args_t, stream) + sizeof(void *),
                                  offsetof(shardopt_step_args_t, skip_missing_grads) + sizeof(int),
                                  offsetof(shardopt_step_args_t, momentum) + sizeof(double),
                                  offsetof(shardopt_step_args_t, adamw_eps) + sizeof(double)};
    _Static_assert(sizeof ends / sizeof ends[0] == SHARDOPT_STEP_ARGS_VERSION + 1, "an end each");
    const int known = args->version >= 1 && args->version <= SHARDOPT_STEP_ARGS_VERSION;
    if (!known)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "step: args version %u / size %zu: accepted versions 1 to %d, %zu bytes; "
                        "initialise with SHARDOPT_STEP_ARGS_INIT; nothing was updated",
                        args->version, args->size, SHARDOPT_STEP_ARGS_VERSION, ends[1]);
    if (args->size < ends[args->version])
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "step: args version %u / size %zu: a struct of that version is at least "
                        "%zu bytes; initialise with SHARDOPT_STEP_ARGS_INIT; nothing was updated",
                        args->version, args->size, ends[args->version]);
    return SHARDOPT_OK;
}

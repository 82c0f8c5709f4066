#include "runtime/commit_check.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"
#include "base/status.h"
#include "runtime/comm/comm_wait.h"

/* What must agree across ranks, per parameter. */
struct param_record {
    uint64_t name_hash;
    int32_t ndim, param_dtype, grad_dtype, placement, algo, transposed, shard_dim, pad;
    int64_t shape[3];
    double lr_mult, wd_mult;
};

enum {
    F_NAME,
    F_NDIM,
    F_SHAPE,
    F_PARAM_DTYPE,
    F_GRAD_DTYPE,
    F_PLACEMENT,
    F_ALGO,
    F_TRANSPOSED,
    F_SHARD_DIM,
    F_LR_MULT,
    F_WD_MULT,
    F_COUNT
};
static const char *const field_names[F_COUNT] = {"name",       "ndim",      "shape",  "param_dtype",
                                                 "grad_dtype", "placement", "algo",   "transposed",
                                                 "shard_dim",  "lr_mult",   "wd_mult"};

static void record_make(const struct shardopt_param *p, struct param_record *r)
{
    memset(r, 0, sizeof *r);
    r->name_hash = p->name_hash;
    r->ndim = p->layout.ndim;
    r->param_dtype = p->param_dtype;
    r->grad_dtype = p->grad_dtype;
    r->placement = p->placement;
    r->algo = p->algo;
    r->transposed = p->transposed;
    r->shard_dim = p->layout.shard_dim;
    memcpy(r->shape, p->layout.shape, sizeof r->shape);
    r->lr_mult = p->lr_mult;
    r->wd_mult = p->wd_mult;
}

/* First field where a and b differ, or -1. */
static int record_diff(const struct param_record *a, const struct param_record *b)
{
    if (a->name_hash != b->name_hash)
        return F_NAME;
    if (a->ndim != b->ndim)
        return F_NDIM;
    if (memcmp(a->shape, b->shape, sizeof a->shape) != 0)
        return F_SHAPE;
    if (a->param_dtype != b->param_dtype)
        return F_PARAM_DTYPE;
    if (a->grad_dtype != b->grad_dtype)
        return F_GRAD_DTYPE;
    if (a->placement != b->placement)
        return F_PLACEMENT;
    if (a->algo != b->algo)
        return F_ALGO;
    if (a->transposed != b->transposed)
        return F_TRANSPOSED;
    if (a->shard_dim != b->shard_dim)
        return F_SHARD_DIM;
    if (a->lr_mult != b->lr_mult)
        return F_LR_MULT;
    if (a->wd_mult != b->wd_mult)
        return F_WD_MULT;
    return -1;
}

static void record_field_text(const struct param_record *r, int f, char *out, size_t len)
{
    switch (f) {
    case F_NAME: snprintf(out, len, "name hash %016llx", (unsigned long long)r->name_hash); break;
    case F_NDIM: snprintf(out, len, "%d", r->ndim); break;
    case F_SHAPE: /* as registered: ndim dims, not the padded three */
        if (r->ndim == 1)
            snprintf(out, len, "[%lld]", (long long)r->shape[0]);
        else if (r->ndim == 2)
            snprintf(out, len, "[%lld, %lld]", (long long)r->shape[0], (long long)r->shape[1]);
        else
            snprintf(out, len, "[%lld, %lld, %lld]", (long long)r->shape[0], (long long)r->shape[1],
                     (long long)r->shape[2]);
        break;
    /* by name, as the descriptor's enums are written: "param_dtype: this rank has 1, rank 0
     * has 0" made the reader look the numbers up in shardopt.h */
    case F_PARAM_DTYPE: snprintf(out, len, "%s", shardopt_dtype_name(r->param_dtype)); break;
    case F_GRAD_DTYPE: snprintf(out, len, "%s", shardopt_dtype_name(r->grad_dtype)); break;
    case F_PLACEMENT: snprintf(out, len, "%s", shardopt_placement_name(r->placement)); break;
    case F_ALGO: snprintf(out, len, "%s", shardopt_algo_name(r->algo)); break;
    case F_TRANSPOSED: snprintf(out, len, "%d", r->transposed); break;
    case F_SHARD_DIM: snprintf(out, len, "%d", r->shard_dim); break;
    /* every digit a double holds: multipliers apart in their last bits (0.1 on one rank,
     * 1.0 / 10 * 1.0000000000000002 on another) printed alike with %g */
    case F_LR_MULT: snprintf(out, len, "%.17g", r->lr_mult); break;
    default: snprintf(out, len, "%.17g", r->wd_mult); break;
    }
}

/* Two-stage MINLOC: the smallest value over all ranks and the lowest rank holding it. */
static void minloc_all(const struct groups *g, int *value, int *rank)
{
    int pair[2] = {*value, g->me.rank};
    groups_allreduce(g, pair, 1, MPI_2INT, MPI_MINLOC);
    *value = pair[0];
    *rank = pair[1];
}

/* A rank whose registration failed fails commit on every rank, with the reason of the lowest
 * such rank (its first failed register) in the one message every rank returns. */
static shardopt_status_t check_register_failures(shardopt_runtime_t rt)
{
    shardopt_status_t mine =
        rt->register_failures == 0
            ? SHARDOPT_OK
            : log_fail(SHARDOPT_ERR_MISMATCH,
                       "commit: rank %d: %d parameter(s) failed to register on this rank; the "
                       "first: %s",
                       rt->groups.me.rank, rt->register_failures, rt->register_error);
    return groups_agree(&rt->groups, mine, "commit");
}

static shardopt_status_t check_counts(shardopt_runtime_t rt)
{
    const struct groups *g = &rt->groups;
    int lo = rt->nparams, lo_rank, hi = -rt->nparams, hi_rank;
    minloc_all(g, &lo, &lo_rank);
    minloc_all(g, &hi, &hi_rank);
    if (lo == -hi)
        return SHARDOPT_OK;
    return log_fail(SHARDOPT_ERR_MISMATCH,
                    "commit: rank %d registered %d parameters but rank %d registered %d: every "
                    "rank must register the same parameters in the same order",
                    lo_rank, lo, hi_rank, -hi);
}

static shardopt_status_t check_records(shardopt_runtime_t rt)
{
    const struct groups *g = &rt->groups;
    const int n = rt->nparams;
    const size_t bytes = sizeof(struct param_record) * (size_t)(n ? n : 1);
    struct param_record *ref = mem_malloc(bytes), mine, mine_rec;
    int code = INT_MAX, first_rank, nbad;
    char name0[256] = "", v0[96], vme[96];

    shardopt_status_t status =
        ref != NULL ? SHARDOPT_OK
                    : log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                               "commit: rank %d: out of memory allocating %zu bytes for the "
                               "parameter records",
                               g->me.rank, bytes);
    status = groups_agree(g, status, "commit");
    if (status != SHARDOPT_OK) {
        free(ref);
        return status;
    }
    for (int i = 0; i < n; i++)
        record_make(rt->params[i], &ref[i]);
    groups_bcast(g, ref, (int)(sizeof(*ref) * (size_t)n), MPI_BYTE);
    for (int i = 0; i < n && code == INT_MAX; i++) {
        record_make(rt->params[i], &mine);
        int f = record_diff(&ref[i], &mine);
        if (f >= 0)
            code = i * F_COUNT + f;
    }
    nbad = code != INT_MAX;
    int my_code = code;
    groups_allreduce(g, &nbad, 1, MPI_INT, MPI_SUM);
    minloc_all(g, &code, &first_rank);
    if (code == INT_MAX) {
        free(ref);
        return SHARDOPT_OK;
    }
    const int pi = code / F_COUNT, f = code % F_COUNT;
    if (g->me.rank == 0)
        snprintf(name0, sizeof name0, "%s", rt->params[pi]->name);
    groups_bcast(g, name0, sizeof name0, MPI_CHAR);
    record_field_text(&ref[pi], f, v0, sizeof v0);
    /* the first rank that differs words the message; agreement gives every rank its text */
    shardopt_status_t verdict = SHARDOPT_OK;
    if (my_code == code && first_rank == g->me.rank) {
        record_make(rt->params[pi], &mine_rec);
        record_field_text(&mine_rec, f, vme, sizeof vme);
        verdict = log_fail(SHARDOPT_ERR_MISMATCH,
                           "commit: rank %d: parameter #%d '%s' differs in %s: this rank has %s "
                           "('%.40s'), rank 0 has %s (%d more rank(s) differ)",
                           first_rank, pi, name0, field_names[f], vme, rt->params[pi]->name, v0,
                           nbad - 1);
    }
    free(ref);
    return groups_agree(g, verdict, "commit");
}

/* The shard table of the group `comm` for the parameters of placement `want` (the others it
 * never describes). Each member says, per parameter, whether it holds the torch.chunk piece of
 * its index, in one all-reduce (AND) of a byte per parameter: where all do, the layout determines
 * every slice and nothing is gathered; the others' slices are all-gathered into the table's
 * columns. Collective; on failure t holds nothing. */
static shardopt_status_t table_gather(shardopt_runtime_t rt, MPI_Comm comm,
                                      shardopt_placement_t want, struct shard_table *t)
{
    const int n = rt->nparams;
    int members, me;
    size_t bytes = (size_t)(n ? n : 1);
    unsigned char *chunk = mem_malloc(bytes);
    struct plan_slice *mine = NULL;
    shardopt_status_t status = SHARDOPT_OK;

    MPI_Comm_size(comm, &members);
    MPI_Comm_rank(comm, &me);
    memset(t, 0, sizeof *t);
    if (chunk == NULL)
        status = log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                          "commit: rank %d: out of memory allocating %zu bytes for the shard "
                          "table",
                          rt->groups.me.rank, bytes);
    status = groups_agree(&rt->groups, status, "commit");
    if (status != SHARDOPT_OK) {
        free(chunk); /* another rank failed: this one's byte per parameter goes too */
        return status;
    }
    for (int i = 0; i < n; i++) {
        const struct shardopt_param *p = rt->params[i];
        chunk[i] = p->placement != want || shard_table_is_chunk(&p->layout, members, me);
    }
    comm_allreduce(&rt->groups, comm, MPI_IN_PLACE, chunk, n, MPI_UNSIGNED_CHAR, MPI_BAND,
                   "all-reduce of regular shards");
    const int ok = shard_table_init(t, members, me, n, chunk, &bytes) == 0;
    if (ok && t->ncols > 0) {
        bytes = sizeof(*mine) * (size_t)t->ncols;
        mine = mem_malloc(bytes);
    }
    free(chunk);
    if (!ok || (t->ncols > 0 && mine == NULL))
        status = log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                          "commit: rank %d: out of memory allocating %zu bytes for the shard "
                          "table",
                          rt->groups.me.rank, bytes);
    status = groups_agree(&rt->groups, status, "commit");
    if (status != SHARDOPT_OK) {
        free(mine);
        shard_table_free(t);
        return status;
    }
    /* every member agreed the same columns: the all-gather's counts match */
    for (int i = 0; i < n; i++)
        if (t->col[i] >= 0) {
            const struct layout *l = &rt->params[i]->layout;
            mine[t->col[i]] = (struct plan_slice){l->lo[l->shard_dim], l->len[l->shard_dim]};
        }
    if (t->ncols > 0)
        comm_allgather(&rt->groups, comm, mine, (int)(sizeof(*mine) * (size_t)t->ncols), MPI_BYTE,
                       t->slices, "all-gather of shard slices");
    comm_allgather(&rt->groups, comm, &rt->groups.me.rank, 1, MPI_INT, t->ranks,
                   "all-gather of ranks");
    free(mine);
    return SHARDOPT_OK;
}

struct slice {
    int64_t lo, len;
    int rank;
};

static int slice_by_lo(const void *a, const void *b)
{
    const struct slice *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo ? 1 : x->rank - y->rank;
}

/* Do the members' slices along shard_dim tile [lo, lo + n) exactly (empty slices anywhere)?
 * Describes the first fault in why. Returns 1 when they do, 0 when not, -1 out of memory. */
static int tiles(const struct shard_table *t, int p, int64_t lo, int64_t n, int64_t origin,
                 char *why, size_t len)
{
    struct slice *s = mem_malloc(sizeof(*s) * (size_t)t->members);
    int k = 0, ok = 1;
    int64_t at = lo;

    if (s == NULL) {
        snprintf(why, len, "out of memory allocating %zu bytes for the slices",
                 sizeof(*s) * (size_t)t->members);
        return -1;
    }
    for (int i = 0; i < t->members; i++) {
        const struct plan_slice *b = &t->slices[(size_t)i * (size_t)t->ncols + (size_t)t->col[p]];
        if (b->len > 0)
            s[k++] = (struct slice){b->lo, b->len, t->ranks[i]};
    }
    qsort(s, (size_t)k, sizeof *s, slice_by_lo);
    for (int i = 0; i < k && ok; i++) {
        if (s[i].lo != at) {
            if (s[i].lo > at)
                snprintf(why, len, "[%lld, %lld) is held by no rank", (long long)(at - origin),
                         (long long)(s[i].lo - origin));
            else
                snprintf(why, len, "rank %d's [%lld, %lld) overlaps the slices before it",
                         s[i].rank, (long long)(s[i].lo - origin),
                         (long long)(s[i].lo + s[i].len - origin));
            ok = 0;
        }
        at = s[i].lo + s[i].len;
    }
    if (ok && at != lo + n) {
        snprintf(why, len, "[%lld, %lld) is held by no rank", (long long)(at - origin),
                 (long long)(lo + n - origin));
        ok = 0;
    }
    free(s);
    return ok;
}

/* "ranks 1, 3" for a group's members in rank order (the first 8, then how many more). */
static void group_ranks_text(const struct shard_table *t, char *out, size_t len)
{
    size_t o = 0;
    int *r = mem_malloc(sizeof(int) * (size_t)t->members);
    if (r == NULL) {
        snprintf(out, len, "%d ranks", t->members);
        return;
    }
    memcpy(r, t->ranks, sizeof(int) * (size_t)t->members);
    for (int i = 1; i < t->members; i++) /* insertion sort: groups are small */
        for (int j = i; j > 0 && r[j - 1] > r[j]; j--) {
            int x = r[j];
            r[j] = r[j - 1];
            r[j - 1] = x;
        }
    out[0] = '\0';
    for (int i = 0; i < t->members && i < 8 && o < len; i++)
        o += (size_t)snprintf(out + o, len - o, "%s%d", i ? ", " : "ranks ", r[i]);
    if (t->members > 8 && o < len)
        snprintf(out + o, len - o, " and %d more", t->members - 8);
    free(r);
}

static shardopt_status_t check_tiling(shardopt_runtime_t rt, const struct shard_table *dense,
                                      const struct shard_table *xs)
{
    const struct groups *g = &rt->groups;
    int bad = INT_MAX, bad_rank, rc = 1;
    char why[160] = "";

    for (int i = 0; i < rt->nparams && bad == INT_MAX; i++) {
        const struct shardopt_param *p = rt->params[i];
        const struct shard_table *t = p->placement == SHARDOPT_PLACEMENT_EXPERT ? xs : dense;
        int64_t lo, n;
        if (p->placement == SHARDOPT_PLACEMENT_REPLICATED || t->col[i] < 0)
            continue; /* whole on every rank: checked at register; or torch.chunk pieces on every
                         member (agreed at table_gather), which tile by construction */
        layout_tile_range(&p->layout, &lo, &n);
        rc = tiles(t, i, lo, n, lo, why, sizeof why);
        if (rc != 1)
            bad = i;
    }
    /* out of memory is not a mismatch: it fails commit as what it is, first */
    shardopt_status_t status = rc >= 0
                                   ? SHARDOPT_OK
                                   : log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                                              "commit: rank %d: checking the shards of '%s': %s",
                                              g->me.rank, rt->params[bad]->name, why);
    status = groups_agree(g, status, "commit");
    if (status != SHARDOPT_OK)
        return status;
    int my_bad = bad;
    minloc_all(g, &bad, &bad_rank);
    if (bad == INT_MAX)
        return SHARDOPT_OK;
    /* Only a rank of a group that does not tile knows that group's range and slices (another
     * group's expert window differs): the lowest such rank words the message, in the
     * coordinates the trainer registered (an expert stack's dim 0 counts from this EP rank's
     * first expert), and agreement hands its text to every rank. */
    shardopt_status_t mine = SHARDOPT_OK;
    if (my_bad == bad) {
        const struct shardopt_param *p = rt->params[bad];
        const int expert = p->placement == SHARDOPT_PLACEMENT_EXPERT;
        const struct layout *l = &p->layout;
        char members[96], group[160];
        int64_t lo, n;
        layout_tile_range(l, &lo, &n);
        group_ranks_text(expert ? xs : dense, members, sizeof members);
        if (expert)
            snprintf(group, sizeof group, "the expert shard group of EP rank %d (%s)",
                     g->me.ep_rank, members);
        else
            snprintf(group, sizeof group, "the dense shard group (%s)", members);
        if (expert && l->shard_dim == 0)
            mine = log_fail(SHARDOPT_ERR_MISMATCH,
                            "commit: rank %d: the shards of '%s' along dim 0 do not tile [0, %lld) "
                            "over %s: %s (offsets along dim 0 count from this EP rank's first "
                            "expert: EP rank %d holds experts [%lld, %lld) of %lld, which its "
                            "group registers as [0, %lld))",
                            g->me.rank, p->name, (long long)n, group, why, g->me.ep_rank,
                            (long long)l->win_lo, (long long)(l->win_lo + l->win_len),
                            (long long)l->shape[0], (long long)l->win_len);
        else
            mine = log_fail(SHARDOPT_ERR_MISMATCH,
                            "commit: rank %d: the shards of '%s' along dim %d do not tile [%lld, "
                            "%lld) over %s: %s",
                            g->me.rank, p->name, l->shard_dim, (long long)lo, (long long)(lo + n),
                            group, why);
    }
    (void)bad_rank;
    return groups_agree(g, mine, "commit");
}

shardopt_status_t commit_check(shardopt_runtime_t rt, struct shard_table *dense,
                               struct shard_table *xs)
{
    shardopt_status_t status;

    status = check_register_failures(rt);
    if (status == SHARDOPT_OK)
        status = check_counts(rt);
    if (status == SHARDOPT_OK)
        status = check_records(rt);
    if (status != SHARDOPT_OK)
        return status;
    status = table_gather(rt, rt->groups.dense, SHARDOPT_PLACEMENT_DENSE, dense);
    if (status != SHARDOPT_OK)
        return status;
    status = table_gather(rt, rt->groups.xs, SHARDOPT_PLACEMENT_EXPERT, xs);
    if (status == SHARDOPT_OK)
        status = check_tiling(rt, dense, xs);
    if (status != SHARDOPT_OK) {
        shard_table_free(dense);
        shard_table_free(xs);
    }
    return status;
}

shardopt_status_t commit_mpi_agree(shardopt_runtime_t rt, int rc, const char *fmt, ...)
{
    shardopt_status_t status = SHARDOPT_OK;
    if (rc != MPI_SUCCESS) {
        char what[256];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(what, sizeof what, fmt, ap);
        va_end(ap);
        status = log_fail(SHARDOPT_ERR_COMM, "commit: rank %d: %s failed (MPI error %d)",
                          rt->groups.me.rank, what, rc);
    }
    return groups_agree(&rt->groups, status, "commit");
}

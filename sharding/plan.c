#include "plan.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"
#include "plan_mat.h"

double plan_ns_cost(int64_t rows, int64_t cols)
{
    double m = (double)(rows < cols ? rows : cols), n = (double)(rows < cols ? cols : rows);
    return 4.0 * m * m * n + 2.0 * m * m * m;
}

double plan_ns_block_cost(double m, double n, int narrow_ok)
{
    if (n <= 0)
        return 0.0;
    return narrow_ok && n < m ? 6.0 * m * m * n : 4.0 * m * m * n + 2.0 * m * m * m;
}

/* Entries of the upper block rows of an m x m product in block rows of `block` rows (as
 * kernels/cpu/ns_common.c's ns_sym_entries). */
static double plan_sym_entries(double m, int64_t block)
{
    if (block <= 0 || (double)block >= m)
        return m * m;
    const double bk = (double)block, q = floor(m / bk), r = m - q * bk;
    return bk * q * m - bk * bk * q * (q - 1.0) / 2.0 + r * r;
}

double plan_ns_flops_blocked(int64_t rows, int64_t cols, int steps, int gram, uint32_t restarts,
                             const struct plan_ns_blocks *b)
{
    const double m = (double)(rows < cols ? rows : cols), n = (double)(rows < cols ? cols : rows);
    const double xxt = 2.0 * n * plan_sym_entries(m, b != NULL ? b->gram : 0);
    const double rr = 2.0 * m * plan_sym_entries(m, b != NULL ? b->poly : 0);
    const double zrz = 2.0 * m * plan_sym_entries(m, b != NULL ? b->symmul : 0);
    if (!gram)
        return steps * (xxt + rr + 2.0 * m * m * n);
    double f = 0.0;
    for (int lo = 0, hi; lo < steps; lo = hi) { /* segments between restarts (bit k: before k) */
        for (hi = lo + 1; hi < steps && !(restarts >> hi & 1u); hi++) {
        }
        f += xxt + 2.0 * m * m * n;   /* G = X X^T and X <- Q X */
        for (int s = lo; s < hi; s++) /* R R, Z Q, Z R and (Z R) Z */
            f += rr + (s > lo ? 2.0 * m * m * m : 0.0) + (s + 1 < hi ? 2.0 * m * m * m + zrz : 0.0);
    }
    return f;
}

double plan_ns_flops(int64_t rows, int64_t cols, int steps, int gram, uint32_t restarts)
{
    return plan_ns_flops_blocked(rows, cols, steps, gram, restarts, NULL);
}

/* plan_build's scratch over the group's members, one set for the whole plan (buckets keep only
 * their lists): per-member counts of the bucket being laid out, the members touched (to list and
 * clear them), and the cursors. */
struct scratch {
    int *acnt, *bcnt; /* [members], zero between buckets */
    int *atch, *btch; /* [members]: the members with a non-zero count, na / nb of them */
    size_t *cursor;   /* [members] */
};

static int by_int(const void *a, const void *b)
{
    const int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* Add cnt elements for member s to one side; s joins that side's list on its first block. */
static int side_add(int *counts, int *touched, int *n, int s, int64_t cnt)
{
    if (cnt > (int64_t)INT_MAX - counts[s])
        return -1; /* before the int wraps (past 2^32 it would look small again) */
    if (counts[s] == 0)
        touched[(*n)++] = s;
    counts[s] += (int)cnt;
    return 0;
}

/* The touched members of one side, in member order, into *out (displacements packed in that
 * order), counts cleared for the next bucket; *elems: their total. */
static int side_list(int *counts, int *touched, int n, struct plan_blocks *out, size_t *elems)
{
    qsort(touched, (size_t)n, sizeof(int), by_int);
    int *mem = mem_malloc(sizeof(int) * 3 * (size_t)(n ? n : 1));
    size_t total = 0;
    int rc = 0;
    if (mem == NULL)
        rc = -1;
    for (int j = 0; j < n; j++) {
        const int s = touched[j];
        if (rc == 0 && (size_t)counts[s] > (size_t)INT_MAX - total)
            rc = -2;
        if (rc == 0) {
            mem[j] = s;
            mem[n + j] = counts[s];
            mem[2 * n + j] = (int)total;
            total += (size_t)counts[s];
        }
        counts[s] = 0;
    }
    if (rc != 0) {
        free(mem);
        return rc;
    }
    *out = (struct plan_blocks){.n = n, .peer = mem, .count = mem + n, .displ = mem + 2 * n};
    *elems = total;
    return 0;
}

int plan_team_block(int64_t rows, int64_t cols, int ns_transpose, int k, int j, int64_t *lo,
                    int64_t *hi)
{
    /* square: the true orientation's columns (a team with aol scales the working matrix's rows,
     * which must be the gathered path's; on the stored ones a transposed square matrix was 0.18
     * off, fp32, test_xcheck seed 9085) */
    const int on_rows = rows != cols ? rows > cols : ns_transpose != 0;
    const int64_t L = on_rows ? rows : cols, c = (L + k - 1) / k;
    *lo = c * j < L ? c * j : L;
    *hi = *lo + c < L ? *lo + c : L;
    return on_rows;
}

/* A rectangle of a matrix, rows [r0, r1) x cols [c0, c1). */
struct rect {
    int64_t r0, r1, c0, c1;
};

/* Member i's piece of matrix m inside block j of its team of k: *in (matrix coordinates), its
 * whole piece *pc and that piece's offset in i's shard; returns the block's element count. */
static int64_t team_piece(const struct mat *m, int k, int j, int i, struct rect *in,
                          struct rect *pc, int64_t *off)
{
    int64_t lo, hi;
    if (plan_piece_of(m, i, &pc->r0, &pc->r1, &pc->c0, &pc->c1, off) == 0)
        return 0;
    *in = *pc;
    if (plan_team_block(m->rows, m->cols, m->p->ns_transpose, k, j, &lo, &hi)) {
        in->r0 = in->r0 > lo ? in->r0 : lo;
        in->r1 = in->r1 < hi ? in->r1 : hi;
    } else {
        in->c0 = in->c0 > lo ? in->c0 : lo;
        in->c1 = in->c1 < hi ? in->c1 : hi;
    }
    return in->r1 > in->r0 && in->c1 > in->c0 ? (in->r1 - in->r0) * (in->c1 - in->c0) : 0;
}

/* My index in matrix m's team, or -1; 0 when I own it alone. */
static int my_share(const struct group_plan *P, int m, int me)
{
    if (P->team[m] < 2)
        return P->owner[m] == me ? 0 : -1;
    for (int j = 0; j < P->team[m]; j++)
        if (P->team_of[(size_t)m * (size_t)P->team_cap + (size_t)j] == me)
            return j;
    return -1;
}

/* The contiguous runs of my shard that carry my part of block j of team matrix m: one when
 * the block takes whole rows of my piece, else one per row. Written to out (n of them at most,
 * buf advanced from *cursor) when out is not NULL; returns how many. */
static int team_runs(const struct mat *m, int k, int j, int me, struct plan_piece *out,
                     size_t *cursor)
{
    struct rect in, pc;
    int64_t off;
    if (team_piece(m, k, j, me, &in, &pc, &off) == 0)
        return 0;
    const int64_t w = pc.c1 - pc.c0, iw = in.c1 - in.c0;
    const int whole_rows = in.c0 == pc.c0 && in.c1 == pc.c1;
    const int n = whole_rows ? 1 : (int)(in.r1 - in.r0);
    for (int r = 0; out != NULL && r < n; r++) {
        const int64_t row = in.r0 - pc.r0 + r;
        out[r] = (struct plan_piece){.param = m->p->param,
                                     .k = m->k,
                                     .local_off = off + row * w + (in.c0 - pc.c0),
                                     .count = whole_rows ? (in.r1 - in.r0) * w : iw,
                                     .buf = *cursor};
        *cursor += (size_t)out[r].count;
    }
    return n;
}

/* Lay out bucket [m_lo, m_hi): my pieces in A by owner (a team matrix's: by the member whose
 * block they fall in), my matrices' (or blocks') pieces in B by holder. */
static int bucket_build(struct group_plan *P, const struct plan_cfg *cfg, const struct mat *mats,
                        int m_lo, int m_hi, struct plan_bucket *b, struct scratch *w, char *err,
                        size_t errlen)
{
    const int me = cfg->me, members = cfg->members;
    int64_t r0, r1, c0, c1, off, cnt;
    size_t slot = 0, *cursor = w->cursor;
    int na = 0, nb = 0, rc = 0;
    struct rect in, pc;

    b->piece_lo = P->npieces;
    b->owned_lo = P->nowned;
    /* NS slots (a team member: its block's), and which of my pieces skip the exchange */
    for (int m = m_lo; m < m_hi; m++) {
        const int j = my_share(P, m, me), k = P->team[m];
        if (j < 0)
            continue;
        int64_t lo = 0, hi = 0, rows = mats[m].rows, cols = mats[m].cols;
        int on_rows = 0;
        if (k > 1) {
            on_rows = plan_team_block(rows, cols, mats[m].p->ns_transpose, k, j, &lo, &hi);
            rows = on_rows ? hi - lo : rows;
            cols = on_rows ? cols : hi - lo;
        }
        P->owned[P->nowned++] =
            (struct plan_owned){.param = mats[m].p->param,
                                .k = mats[m].k,
                                .rows = rows,
                                .cols = cols,
                                .cost = k > 1 ? plan_ns_team_block_cost(mats[m].rows, mats[m].cols,
                                                                        k, j, !cfg->team_bf16)
                                              : mats[m].cost,
                                .slot = slot,
                                .team = k,
                                .team_j = j,
                                .team_rows = on_rows,
                                .mat = m};
        slot += (size_t)(rows * cols);
    }
    b->owned_hi = P->nowned;
    b->ns_elems = slot;
    if (cfg->replicas > 1 && slot > (size_t)INT_MAX) {
        snprintf(err, errlen,
                 "a bucket's Newton-Schulz slots hold %zu elements, more than one MPI count "
                 "(2^31 - 1) for the replica_split all-gather: lower bucket_bytes",
                 slot);
        return -2;
    }

    /* A: counts per owner (team member); B: counts per holder of my matrices (blocks) */
    for (int m = m_lo; rc == 0 && m < m_hi; m++) {
        const int k = P->team[m];
        if (k > 1) {
            for (int j = 0; rc == 0 && j < k; j++) {
                cnt = team_piece(&mats[m], k, j, me, &in, &pc, &off);
                if (cnt > 0)
                    rc = side_add(w->acnt, w->atch, &na,
                                  P->team_of[(size_t)m * (size_t)P->team_cap + (size_t)j], cnt);
            }
            continue;
        }
        cnt = plan_piece_of(&mats[m], me, &r0, &r1, &c0, &c1, &off);
        int direct = P->owner[m] == me && cnt == mats[m].rows * mats[m].cols;
        if (cnt > 0 && !direct)
            rc = side_add(w->acnt, w->atch, &na, P->owner[m], cnt);
    }
    for (int m = m_lo; rc == 0 && m < m_hi; m++) {
        const int j = my_share(P, m, me), k = P->team[m];
        if (j < 0)
            continue;
        for (int s = 0; rc == 0 && s < members; s++) {
            cnt = k > 1 ? team_piece(&mats[m], k, j, s, &in, &pc, &off)
                        : plan_piece_count(&mats[m], s);
            int direct = k == 1 && s == me && cnt == mats[m].rows * mats[m].cols;
            if (cnt > 0 && !direct)
                rc = side_add(w->bcnt, w->btch, &nb, s, cnt);
        }
    }
    if (rc != 0) /* the plan fails: its scratch is not used again */
        goto too_large;
    rc = side_list(w->acnt, w->atch, na, &b->a, &b->a_elems);
    int rc2 = side_list(w->bcnt, w->btch, nb, &b->b, &b->b_elems);
    if (rc == -1 || rc2 == -1) {
        snprintf(err, errlen, "out of memory allocating %zu bytes for a bucket's blocks",
                 sizeof(int) * 3 * (size_t)(na + nb));
        return -1;
    }
    if (rc != 0 || rc2 != 0)
        goto too_large;

    /* my pieces, in matrix order (a team matrix's: block by block, row runs in row order, as
     * the block's member unpacks them) */
    for (int j = 0; j < b->a.n; j++)
        cursor[b->a.peer[j]] = (size_t)b->a.displ[j];
    int o = b->owned_lo; /* my next NS slot's entry */
    for (int m = m_lo; m < m_hi; m++) {
        const int owner = P->owner[m], k = P->team[m];
        const size_t this_slot = o < b->owned_hi ? P->owned[o].slot : 0;
        o += my_share(P, m, me) >= 0;
        if (k > 1) {
            for (int j = 0; j < k; j++) {
                const int t = P->team_of[(size_t)m * (size_t)P->team_cap + (size_t)j];
                P->npieces += team_runs(&mats[m], k, j, me, &P->pieces[P->npieces], &cursor[t]);
            }
            continue;
        }
        cnt = plan_piece_of(&mats[m], me, &r0, &r1, &c0, &c1, &off);
        if (cnt == 0)
            continue;
        int direct = owner == me && cnt == mats[m].rows * mats[m].cols;
        P->pieces[P->npieces++] = (struct plan_piece){.param = mats[m].p->param,
                                                      .k = mats[m].k,
                                                      .local_off = off,
                                                      .count = cnt,
                                                      .direct = direct,
                                                      .buf = direct ? this_slot : cursor[owner]};
        if (!direct)
            cursor[owner] += (size_t)cnt;
    }
    b->piece_hi = P->npieces;

    /* pieces arriving for my matrices (blocks), grouped per matrix for the unpack; a block's
     * rectangles relative to the block */
    for (int j = 0; j < b->b.n; j++)
        cursor[b->b.peer[j]] = (size_t)b->b.displ[j];
    for (int o = b->owned_lo; o < b->owned_hi; o++) {
        struct plan_owned *ow = &P->owned[o];
        const struct mat *m = &mats[ow->mat];
        int64_t lo = 0, hi = 0;
        if (ow->team > 1)
            plan_team_block(m->rows, m->cols, m->p->ns_transpose, ow->team, ow->team_j, &lo, &hi);
        ow->in_lo = P->nincoming;
        for (int s = 0; s < members; s++) {
            if (ow->team > 1) {
                cnt = team_piece(m, ow->team, ow->team_j, s, &in, &pc, &off);
                in.r0 -= ow->team_rows ? lo : 0;
                in.r1 -= ow->team_rows ? lo : 0;
                in.c0 -= ow->team_rows ? 0 : lo;
                in.c1 -= ow->team_rows ? 0 : lo;
            } else {
                cnt = plan_piece_of(m, s, &in.r0, &in.r1, &in.c0, &in.c1, &off);
                if (s == me && cnt == m->rows * m->cols)
                    continue; /* direct */
            }
            if (cnt == 0)
                continue;
            P->incoming[P->nincoming++] = (struct plan_incoming){
                .src = s, .r0 = in.r0, .r1 = in.r1, .c0 = in.c0, .c1 = in.c1, .buf = cursor[s]};
            cursor[s] += (size_t)cnt;
        }
        ow->in_hi = P->nincoming;
    }
    return 0;

too_large:
    snprintf(err, errlen,
             "a bucket moves more than 2^31 - 1 elements to or from one member in one MPI call: "
             "lower bucket_bytes");
    return -2;
}

void plan_replica_range(const struct group_plan *p, const struct plan_bucket *b, int replicas,
                        int r, int *lo, int *hi, size_t *slot_lo, size_t *slot_hi)
{
    double total = 0, acc = 0;
    int l = b->owned_hi, h = b->owned_hi;

    for (int w = b->owned_lo; w < b->owned_hi; w++)
        total += p->owned[w].cost;
    /* a matrix goes to the replica whose share of the cumulative cost holds its midpoint: the
     * replica index never decreases along the list, so each replica gets a contiguous run */
    for (int w = b->owned_lo; w < b->owned_hi; w++) {
        const double c = p->owned[w].cost;
        int idx = (int)((acc + 0.5 * c) * replicas / total);
        idx = idx < replicas ? idx : replicas - 1;
        if (idx >= r && l == b->owned_hi)
            l = w;
        if (idx > r) {
            h = w;
            break;
        }
        acc += c;
    }
    *lo = l < h ? l : h;
    *hi = h;
    *slot_lo = *lo < b->owned_hi ? p->owned[*lo].slot : b->ns_elems;
    *slot_hi = h < b->owned_hi ? p->owned[h].slot : b->ns_elems;
}

void plan_free(struct group_plan *p)
{
    for (int b = 0; b < p->nbuckets; b++) {
        free(p->buckets[b].a.peer);
        free(p->buckets[b].b.peer);
    }
    free(p->buckets);
    free(p->owner);
    free(p->load);
    free(p->cost);
    free(p->team_load);
    free(p->team);
    free(p->team_of);
    free(p->work);
    free(p->team_comm);
    free(p->pieces);
    free(p->owned);
    free(p->incoming);
    memset(p, 0, sizeof *p);
}

/* The NS cost per iteration of each of p's matrices: plan_ns_cost, or Gram's FLOPs */
static double mat_cost(const struct plan_cfg *cfg, const struct plan_param *p)
{
    const int64_t rows = p->shape[p->ndim - 2], cols = p->shape[p->ndim - 1];
    const int steps = cfg->ns_steps > 0 ? cfg->ns_steps : 5;
    return p->ns_gram ? plan_ns_flops(rows, cols, steps, 1, p->ns_restarts) / steps
                      : plan_ns_cost(rows, cols);
}

shardopt_status_t plan_build(const struct plan_cfg *cfg, const struct plan_param *params,
                             int nparams, struct group_plan *out)
{
    struct group_plan P = {.members = cfg->members, .me = cfg->me};
    struct mat *mats = NULL;
    struct scratch w = {0};
    size_t bytes_asked = 0;
    int n = 0, nb = 0, rc;
    int64_t max_pieces = 0, max_in = 0; /* up to matrices x members: past an int */
    char err[256] = "";
    const size_t errlen = sizeof err;

    /* counted in 64 bits: an expert stack of 2^40 experts truncated to 0 matrices as an int,
     * and the loop below wrote 2^40 of them into one (a segfault at commit) */
    int64_t total = 0;
    int widest = 0;
    for (int p = 0; p < nparams; p++) {
        total += params[p].k_count;
        widest = params[p].k_count > params[widest].k_count ? p : widest;
    }
    if (total > PLAN_MAX_MATRICES) {
        snprintf(
            err, errlen,
            "%lld Newton-Schulz matrices in one group (each expert of a stack is one; "
            "parameter %d in registration order has %lld): a plan holds at most 2^30 (register "
            "smaller stacks, or algo = adamw for them)",
            (long long)total, nparams > 0 ? params[widest].param : -1,
            nparams > 0 ? (long long)params[widest].k_count : 0ll);
        return status_set(SHARDOPT_ERR_UNSUPPORTED, "%s", err);
    }
    n = (int)total;
    mats = mem_malloc(sizeof(*mats) * (size_t)(n ? n : 1));
    w.cursor = mem_malloc(sizeof(size_t) * (size_t)cfg->members);
    w.acnt = mem_calloc((size_t)cfg->members * 4, sizeof(int));
    if (w.acnt != NULL) {
        w.bcnt = w.acnt + cfg->members;
        w.atch = w.acnt + 2 * (size_t)cfg->members;
        w.btch = w.acnt + 3 * (size_t)cfg->members;
    }
    P.owner = mem_malloc(sizeof(int) * (size_t)(n ? n : 1));
    P.load = mem_calloc((size_t)cfg->members, sizeof(double));
    P.cost = mem_malloc(sizeof(double) * (size_t)(n ? n : 1));
    P.work = mem_calloc((size_t)cfg->members, sizeof(double));
    P.team_comm = mem_calloc((size_t)cfg->members, sizeof(double));
    P.team = mem_malloc(sizeof(int) * (size_t)(n ? n : 1));
    P.team_cap = cfg->team_cap > 1 ? cfg->team_cap : 1;
    P.team_cap = P.team_cap < PLAN_TEAM_MAX ? P.team_cap : PLAN_TEAM_MAX;
    P.team_of =
        P.team_cap > 1 ? mem_malloc(sizeof(int) * (size_t)(n ? n : 1) * (size_t)P.team_cap) : NULL;
    /* only with teams: without, 8 B x members the union plan never reads */
    P.team_load = P.team_cap > 1 ? mem_calloc((size_t)cfg->members, sizeof(double)) : NULL;
    bytes_asked = (sizeof(*mats) + sizeof(double) + sizeof(int) * (size_t)(1 + P.team_cap)) *
                      (size_t)(n ? n : 1) +
                  (sizeof(size_t) + 4 * sizeof(int) + 4 * sizeof(double)) * (size_t)cfg->members;
    if (mats == NULL || w.cursor == NULL || w.acnt == NULL || P.owner == NULL || P.load == NULL ||
        P.cost == NULL || (P.team_cap > 1 && P.team_load == NULL) || P.work == NULL ||
        P.team_comm == NULL || P.team == NULL || (P.team_cap > 1 && P.team_of == NULL))
        goto err_oom;
    n = 0;
    for (int p = 0; p < nparams; p++) {
        const struct plan_param *pp = &params[p];
        for (int64_t k = pp->k_lo; k < pp->k_lo + pp->k_count; k++) {
            struct mat *m = &mats[n++];
            m->p = pp;
            m->k = k;
            m->rows = pp->shape[pp->ndim - 2];
            m->cols = pp->shape[pp->ndim - 1];
            m->cost = P.cost[n - 1] = mat_cost(cfg, pp);
        }
    }
    P.nmatrices = n;
    bytes_asked = sizeof(int) * (size_t)(n ? n : 1);
    if (plan_owners_pick(cfg, mats, n, &P) != 0)
        goto err_oom;
    for (int m = 0; m < n; m++) /* the team blocks' load, as plan_charge counts it */
        for (int u = 0; P.team[m] > 1 && u < P.team[m]; u++) {
            double flops, ar;
            plan_team_member_load(cfg, &mats[m], P.team[m], u, &flops, &ar);
            P.team_load[P.team_of[(size_t)m * (size_t)P.team_cap + (size_t)u]] += flops + ar;
        }

    /* upper bounds for the lists: one piece of mine per matrix, one incoming per holder */
    for (int m = 0; m < n; m++) {
        if (P.team[m] > 1) { /* a team matrix: my row runs per block; a block's holders */
            for (int j = 0; j < P.team[m]; j++)
                max_pieces += team_runs(&mats[m], P.team[m], j, cfg->me, NULL, NULL);
            if (my_share(&P, m, cfg->me) >= 0)
                max_in += cfg->members;
            continue;
        }
        if (plan_piece_count(&mats[m], cfg->me) > 0)
            max_pieces++;
        if (P.owner[m] == cfg->me)
            for (int s = 0; s < cfg->members; s++)
                max_in += plan_piece_count(&mats[m], s) > 0;
    }
    if (max_pieces > INT_MAX || max_in > INT_MAX) {
        rc = -2;
        snprintf(err, errlen,
                 "%lld pieces and %lld incoming blocks for %d matrices over %d ranks: a plan "
                 "holds at most 2^31 - 1 of each (register smaller stacks)",
                 (long long)max_pieces, (long long)max_in, n, cfg->members);
        goto err_free;
    }
    P.pieces = mem_malloc(sizeof(*P.pieces) * (size_t)(max_pieces ? max_pieces : 1));
    P.incoming = mem_malloc(sizeof(*P.incoming) * (size_t)(max_in ? max_in : 1));
    P.owned = mem_malloc(sizeof(*P.owned) * (size_t)(n ? n : 1));
    P.buckets = mem_calloc((size_t)(n ? n : 1), sizeof(*P.buckets));
    bytes_asked = sizeof(*P.pieces) * (size_t)(max_pieces ? max_pieces : 1) +
                  sizeof(*P.incoming) * (size_t)(max_in ? max_in : 1) +
                  (sizeof(*P.owned) + sizeof(*P.buckets)) * (size_t)(n ? n : 1);
    if (P.pieces == NULL || P.incoming == NULL || P.owned == NULL || P.buckets == NULL)
        goto err_oom;

    for (int lo = 0; lo < n;) {
        size_t bytes = 0;
        int hi = lo;
        while (hi < n && (hi == lo || bytes < cfg->bucket_bytes)) {
            bytes += (size_t)(mats[hi].rows * mats[hi].cols) * cfg->esize;
            hi++;
        }
        struct plan_bucket *b = &P.buckets[nb++];
        P.nbuckets = nb;
        rc = bucket_build(&P, cfg, mats, lo, hi, b, &w, err, errlen);
        if (rc != 0)
            goto err_free;
        if (b->a_elems > P.max_a)
            P.max_a = b->a_elems;
        if (b->b_elems > P.max_b)
            P.max_b = b->b_elems;
        if (b->ns_elems > P.max_ns)
            P.max_ns = b->ns_elems;
        /* A's blocks go out in #1 and come back in #2, B's come in and go back: each side
         * counts once each way */
        for (int j = 0; j < b->a.n; j++)
            if (b->a.peer[j] != cfg->me) {
                P.bytes_sent += (uint64_t)b->a.count[j] * cfg->esize;
                P.bytes_recv += (uint64_t)b->a.count[j] * cfg->esize;
            }
        for (int j = 0; j < b->b.n; j++)
            if (b->b.peer[j] != cfg->me) {
                P.bytes_sent += (uint64_t)b->b.count[j] * cfg->esize;
                P.bytes_recv += (uint64_t)b->b.count[j] * cfg->esize;
            }
        lo = hi;
    }
    free(mats);
    free(w.cursor);
    free(w.acnt);
    *out = P;
    return SHARDOPT_OK;

err_oom:
    rc = -1;
    snprintf(err, errlen,
             "out of memory allocating %zu bytes for the plan of %d matrices over %d "
             "ranks",
             bytes_asked, n, cfg->members);
err_free:
    free(mats);
    free(w.cursor);
    free(w.acnt);
    plan_free(&P);
    return status_set(rc == -1 ? SHARDOPT_ERR_OUT_OF_MEMORY : SHARDOPT_ERR_UNSUPPORTED, "%s", err);
}

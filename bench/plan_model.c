/* shardopt-plan's model of a step (bench/shardopt_plan.c says what it predicts and the formulas):
 * each group's owners from the runtime's own planner (sharding/plan.c) and what each member then
 * computes and sends, and the prediction for one layout (the machine file's reader:
 * plan_machine.c). */
#include "bench/plan_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/preset.h"
#include "bench/preset_shards.h"
#include "kernels/dtype.h"
#include "kernels/ns_coeffs.h"
#include "kernels/ns_shape.h"
#include "kernels/ns_variant.h"
#include "kernels/ops.h"
#include "runtime/classify.h"
#include "runtime/config/config_cost.h"
#include "sharding/ns_strategy.h"
#include "sharding/plan.h"
#include "shardopt.h"

void plan_model_die(const char *msg)
{
    fprintf(stderr, "shardopt-plan: %s\n", msg);
    exit(2);
}

/* Member i's box of tensor t in its group: exactly what preset_shards_register registers
 * (an expert stack in EP rank 0's coordinates). */
static void box_of(const struct preset_tensor *t, int members, int i, int ep, int xdim,
                   struct plan_box *b)
{
    struct preset_shard s;
    preset_shard_of(t, ep, members, i, xdim, &s);
    memcpy(b->lo, s.lo, sizeof b->lo);
    memcpy(b->len, s.len, sizeof b->len);
}

static double box_numel(const struct plan_box *b)
{
    return (double)(b->len[0] * b->len[1] * b->len[2]);
}

/* Elements of member m's box of a matrix inside block j of k along the long side. */
static double block_overlap(const struct plan_param *q, int64_t k, int m, int j, int team)
{
    const struct plan_box *b = &q->boxes[m];
    const int rd = q->ndim - 2;
    if (q->ndim == 3 && (k < b->lo[0] || k >= b->lo[0] + b->len[0]))
        return 0;
    const int ld = q->shape[rd] > q->shape[rd + 1] ? rd : rd + 1; /* the long side */
    const int64_t L = q->shape[ld], c = (L + team - 1) / team;
    const int64_t lo = c * j < L ? c * j : L, hi = lo + c < L ? lo + c : L;
    const int64_t a = b->lo[ld] > lo ? b->lo[ld] : lo;
    const int64_t e = b->lo[ld] + b->len[ld] < hi ? b->lo[ld] + b->len[ld] : hi;
    return e > a ? (double)(e - a) * (double)b->len[ld == rd ? rd + 1 : rd] : 0.0;
}

/* FLOPs per step of one rows x cols matrix's Newton-Schulz as the kernels --ns-compute names
 * perform it: the device's products whole (runtime/commit.c runs its plain variant), the CPU's
 * symmetric ones in the blocks of the variant the committed per-shape table picks (runtime/commit.c
 * param_plan, kernels/ns_variant.h), counted by sharding/plan.c's copy of the runtime's count. */

/* Where Gram restarts (0 for standard) on one rows x cols matrix in the kernels --ns-compute
 * names, from the table and the shape, as runtime/commit.c's gram_restarts takes it (device:
 * bf16's, the CUDA driver's); the plan's costs and every count here follow it. */
static uint32_t gram_restarts(const struct opts *o, int64_t rows, int64_t cols, int gram)
{
    float coeffs[NS_TABLE_MAX_STEPS][3];
    if (!gram || ns_coeffs_fill(o->ns_table, o->ns_steps, NULL, coeffs) != 0)
        return 0u;
    return ns_coeffs_gram_restarts_for((const float(*)[3])coeffs, o->ns_steps, rows, cols,
                                       o->ns_compute < 0 ? KDT_BF16 : o->ns_compute);
}

/* The blocks (*b; returns b, or NULL: whole) and Gram restarts (*restarts) of the kernels
 * --ns-compute names for one rows x cols matrix, as runtime/commit.c takes them. */
static const struct plan_ns_blocks *kernel_blocks(const struct opts *o, int64_t rows, int64_t cols,
                                                  int gram, struct plan_ns_blocks *b,
                                                  uint32_t *restarts)
{
    struct ns_sym_blocks kb;
    int block = 0;
    *restarts = gram_restarts(o, rows, cols, gram);
    if (o->ns_compute < 0)
        return NULL;
    const int variant = o->ns_compute == KDT_BF16 ? ns_bf16_variant_for_shape(rows, cols, &block)
                                                  : ns_variant_for_shape(rows, cols);
    ns_sym_blocks_for(rows, cols, variant, block, o->ns_compute, &kb);
    *b = (struct plan_ns_blocks){kb.gram, kb.poly, kb.symmul};
    return b;
}

static double performed_flops(const struct opts *o, int64_t rows, int64_t cols, int gram)
{
    struct plan_ns_blocks b;
    uint32_t restarts;
    const struct plan_ns_blocks *bp = kernel_blocks(o, rows, cols, gram, &b, &restarts);
    return plan_ns_flops_blocked(rows, cols, o->ns_steps, gram, restarts, bp);
}

/* ns_algorithm = auto for one matrix, as runtime/commit.c resolves it: the committed rule on the
 * shape and the table's restarts */
static int auto_gram(const struct opts *o, int64_t rows, int64_t cols)
{
    float coeffs[NS_TABLE_MAX_STEPS][3];
    if (ns_coeffs_fill(o->ns_table, o->ns_steps, NULL, coeffs) != 0)
        return 0;
    return ns_algorithm_for_shape(rows, cols, o->ns_compute < 0 ? KDT_BF16 : o->ns_compute,
                                  (const float(*)[3])coeffs, o->ns_steps) == NS_ALGO_GRAM;
}

void plan_model_group_cost(const struct preset *p, const char *const *skip, int expert, int members,
                           int ep, int xdim, const struct opts *o, const struct plan_cfg *extra,
                           struct group_out *out)
{
    struct plan_param *pp = calloc((size_t)p->n + 1, sizeof *pp);
    struct plan_box *boxes = calloc((size_t)p->n * (size_t)members + 1, sizeof *boxes);
    int np = 0;
    if (pp == NULL || boxes == NULL)
        plan_model_die("out of memory");
    for (int i = 0; i < p->n; i++) {
        const struct preset_tensor *t = &p->t[i];
        if (t->expert != expert || skip[i] != NULL)
            continue;
        struct plan_box *b = &boxes[(size_t)np * (size_t)members];
        for (int m = 0; m < members; m++)
            box_of(t, members, m, ep, xdim, &b[m]);
        pp[np] = (struct plan_param){.param = i,
                                     .ndim = t->ndim,
                                     .k_lo = 0,
                                     .k_count = t->ndim == 3 ? t->shape[0] / ep : 1,
                                     .boxes = b};
        memcpy(pp[np].shape, t->shape, sizeof pp[np].shape);
        if (t->ndim == 3)
            pp[np].shape[0] = t->shape[0] / ep; /* EP rank 0's stack */
        const int64_t rows = t->shape[t->ndim - 2], cols = t->shape[t->ndim - 1];
        pp[np].ns_gram = o->ns_algo == 1 || (o->ns_algo == 2 && auto_gram(o, rows, cols));
        pp[np].ns_restarts = gram_restarts(o, rows, cols, pp[np].ns_gram);
        np++;
    }
    /* --ns-strategy, decided per tensor as commit's sharded_choose does at --cost-rates or a
     * device's default rates (sharded entries run the same fp32 forms there: ns_shard_cuda.cu).
     * A sharded tensor leaves the plan (no owner, no exchange); each member holding columns of one
     * of its matrices runs the sharded standard iteration on them in fp32 (bf16 or not), every
     * product whole, ns_shard_iter_flops(m, n_j, 1) per step (4m^2 n_j + 2m^3, or 6m^2 n_j for
     * n_j < m: runtime/step/ns_sharded.c); a member holding none counts nothing. */
    if (o->ns_strategy != NS_MODE_GATHER) {
        double total = 0;
        for (int q = 0; q < np; q++) {
            const int rd = pp[q].ndim - 2;
            const int64_t rows = pp[q].shape[rd], cols = pp[q].shape[rd + 1];
            total += (pp[q].ns_gram ? plan_ns_flops(rows, cols, o->ns_steps, 1, pp[q].ns_restarts) /
                                          o->ns_steps
                                    : plan_ns_cost(rows, cols)) *
                     (double)pp[q].k_count;
        }
        int kept = 0;
        for (int q = 0; q < np; q++) {
            const int rd = pp[q].ndim - 2;
            const int64_t rows = pp[q].shape[rd], cols = pp[q].shape[rd + 1];
            struct ns_strategy_in in = {
                .ndim = pp[q].ndim,
                .ns_transpose = rows > cols, /* square: as stored (presets: not transposed) */
                .shard_dim = expert ? xdim : 0,
                .boxes = pp[q].boxes,
                .members = members,
                .steps = o->ns_steps,
                .esize = COMM_ES,
                .group_mean_cost = total / members,
                .gflops = o->cost_gflops > 0 ? o->cost_gflops : COST_DEVICE_GFLOPS,
                .gbps = o->cost_gflops > 0 ? o->cost_gbps : COST_DEVICE_GBPS,
                .gram = pp[q].ns_gram};
            memcpy(in.shape, pp[q].shape, sizeof in.shape);
            struct plan_ns_blocks kb;
            in.blocks = kernel_blocks(o, rows, cols, in.gram, &kb, &in.restarts);
            if (!ns_strategy_choose(&in, o->ns_strategy)) {
                pp[kept++] = pp[q];
                continue;
            }
            const int ld = rows > cols ? rd : rd + 1; /* the long side, the one sharded */
            const double m = (double)(rows < cols ? rows : cols);
            out->whole += plan_ns_cost(rows, cols) * (double)pp[q].k_count;
            for (int mb = 0; mb < members; mb++) {
                const double n = (double)pp[q].boxes[mb].len[ld];
                const double f = ns_shard_iter_flops(m, n, 1) * o->ns_steps * (double)pp[q].k_count;
                out->real[mb] += f;
                out->sharded[mb] += f;
                /* every member joins each iteration's Gram all-reduce, columns or not */
                out->tbytes[mb] += o->ns_steps * 4.0 *
                                   plan_team_allreduce_elems(rows, cols, members) *
                                   (double)pp[q].k_count;
            }
        }
        np = kept;
    }
    struct plan_cfg cfg = *extra;
    cfg.members = members;
    cfg.me = 0;
    cfg.bucket_bytes = 128u << 20;
    cfg.esize = COMM_ES;
    cfg.ns_steps = o->ns_steps;
    struct group_plan P;
    if (np > 0 && plan_build(&cfg, pp, np, &P) != SHARDOPT_OK)
        plan_model_die(shardopt_last_error());
    if (np > 0) {
        for (int m = 0; m < members; m++) {
            out->flops[m] += P.load[m];
            if (out->tcomm != NULL)
                out->tcomm[m] += P.team_comm[m];
        }
        out->nteams += P.nteams;
        out->nmoved += P.nmoved;
        /* bytes by the plan's owners: a holder sends its fraction f of a matrix in exchange #1,
         * its owner sends the rest (1 - f) back in #2 (tests/unit/test_plan.c checks this
         * formula against the plan's own counts). A team's member j gathers block j of the long
         * side: each holder sends it what it holds of that block, and it sends that back. */
        int mi = 0;
        for (int q = 0; q < np; q++) {
            const int rd = pp[q].ndim - 2;
            const double whole = (double)(pp[q].shape[rd] * pp[q].shape[rd + 1]);
            for (int64_t k = 0; k < pp[q].k_count; k++, mi++) {
                const int team = P.team[mi];
                const double real =
                    performed_flops(o, pp[q].shape[rd], pp[q].shape[rd + 1], pp[q].ns_gram);
                out->whole += pp[q].ns_gram ? plan_ns_flops(pp[q].shape[rd], pp[q].shape[rd + 1],
                                                            o->ns_steps, 1, pp[q].ns_restarts) /
                                                  o->ns_steps
                                            : plan_ns_cost(pp[q].shape[rd], pp[q].shape[rd + 1]);
                if (team > 1) {
                    const int *tm = &P.team_of[(size_t)mi * (size_t)P.team_cap];
                    const double ar =
                        o->ns_steps * plan_team_elem_bytes(extra->team_bf16) *
                        plan_team_allreduce_elems(pp[q].shape[rd], pp[q].shape[rd + 1], team);
                    out->kmax = team > out->kmax ? team : out->kmax;
                    for (int i = 0; i < 6; i++)
                        out->by_size[i] += team == 2 << i;
                    /* a team runs the sharded standard iteration, every product whole, each
                     * member's update in its block's form (narrow: no A^2) in fp32, always
                     * with A^2 in bf16 (plan_cfg.team_bf16) */
                    for (int j = 0; j < team; j++) {
                        out->real[tm[j]] +=
                            plan_ns_team_block_cost(pp[q].shape[rd], pp[q].shape[rd + 1], team, j,
                                                    !extra->team_bf16) *
                            o->ns_steps;
                        out->tbytes[tm[j]] += ar;
                        out->owned[tm[j]] += whole / team * COMM_ES;
                        for (int m = 0; m < members; m++) {
                            const double e = block_overlap(&pp[q], k, m, j, team);
                            if (m != tm[j]) {
                                out->bytes[m] += e * COMM_ES;     /* #1 */
                                out->bytes[tm[j]] += e * COMM_ES; /* #2 */
                            }
                        }
                    }
                    continue;
                }
                for (int m = 0; m < members; m++) {
                    const struct plan_box *b = &pp[q].boxes[m];
                    const int held = pp[q].ndim == 2 || (k >= b->lo[0] && k < b->lo[0] + b->len[0]);
                    const double f = held ? (double)(b->len[rd] * b->len[rd + 1]) / whole : 0.0;
                    out->bytes[m] += (P.owner[mi] == m ? 1.0 - f : f) * whole * COMM_ES;
                    out->owned[m] += P.owner[mi] == m ? whole * COMM_ES : 0.0;
                }
                out->real[P.owner[mi]] += real;
            }
        }
        if (out->plan != NULL) /* handed over: the union plan's (plan_model_union.c) */
            *out->plan = P;
        else
            plan_free(&P);
    } else if (out->plan != NULL) {
        memset(out->plan, 0, sizeof *out->plan);
    }
    free(pp);
    free(boxes);
}

/* The largest of a[0..n), 0 when none is positive */
static double max_of(const double *a, int n)
{
    double m = 0;
    for (int i = 0; i < n; i++)
        m = a[i] > m ? a[i] : m;
    return m;
}

/* `times` groups' teams planned as x into r's counts (and r->xteams where expert) */
static void count_teams(const struct group_out *x, int times, int expert, struct prediction *r)
{
    r->nteams += times * x->nteams;
    r->xteams += expert ? times * x->nteams : 0;
    for (int i = 0; i < 6; i++)
        r->team_sizes[i] += times * x->by_size[i];
    r->team_max = x->kmax > r->team_max ? x->kmax : r->team_max;
}

/* The cost model (shardopt_plan.c's header) of the plans dg (dense group) and xg (expert groups,
 * dense member d's) into r's dense_bytes, expert_bytes, t_ns, t_comm, h2d_bytes, t_elem, step;
 * elem and state: each member's elementwise and state bytes, whatever the owners. */
static void model_step(const struct opts *o, const struct machine *mc, int world,
                       const struct group_out *dg, const struct group_out *xg, const double *elem,
                       const double *state, struct prediction *r)
{
    const double rate = mc->gemm_tflops * 1e12 * mc->ns_fraction;
    const double bw = (r->dense_internode ? mc->inter_gbps : mc->intra_gbps) * 1e9;
    const double maxelem = max_of(elem, r->dense), maxstate = max_of(state, r->dense);
    double tns = 0, maxowned = 0;
    for (int d = 0; d < r->dense; d++) {
        /* time on the whole-product count, the basis of the machine's rate (a GPU forms every
         * product whole; --calibrate's ns_bench rates each variant on whole products); a team's
         * all-reduces stall its Newton-Schulz: they count in t_ns */
        const double t =
            ((dg->flops[d] + xg->flops[d]) * o->ns_steps + dg->sharded[d] + xg->sharded[d]) / rate +
            (dg->tbytes[d] + xg->tbytes[d]) / (mc->intra_gbps * 1e9);
        tns = t > tns ? t : tns;
        const double ow = dg->owned[d] + xg->owned[d];
        maxowned = ow > maxowned ? ow : maxowned;
    }
    r->dense_bytes = max_of(dg->bytes, r->dense), r->expert_bytes = max_of(xg->bytes, r->dense);
    r->t_ns = tns;
    r->t_comm = (r->dense_bytes + r->expert_bytes) / bw;
    if (!strcmp(o->offload, "optimizer")) {
        r->h2d_bytes = maxstate;
        const double copy = maxstate / (mc->host_link_gbps * 1e9);
        const double hbm = maxelem / (mc->hbm_gbps * 1e9);
        r->t_elem = copy > hbm ? copy : hbm;
    } else if (!strcmp(o->offload, "cpu")) {
        /* Newton-Schulz input and output of the owned matrices cross the host link */
        r->h2d_bytes = maxowned;
        r->t_elem = maxelem / (mc->host_mem_gbps * 1e9) + maxowned / (mc->host_link_gbps * 1e9);
    } else {
        r->t_elem = maxelem / (mc->hbm_gbps * 1e9);
    }
    if (mc->slots > 0 && world > mc->slots) { /* ranks take turns on the cores */
        r->t_ns *= (double)world / mc->slots;
        r->t_elem *= (double)world / mc->slots;
    }
    r->step = r->t_elem + (r->t_ns > r->t_comm ? r->t_ns : r->t_comm);
}

int plan_model_predict(const struct opts *o, const struct preset *p, const struct machine *mc,
                       int world, struct prediction *r, char *err, size_t errlen)
{
    memset(r, 0, sizeof *r);
    r->world = world;
    r->rep = o->rep;
    r->cp = o->cp;
    r->ep = o->ep;
    if (world % (o->rep * o->cp) != 0) {
        snprintf(err, errlen, "world %d is not a multiple of dp_replicate %d x cp %d", world,
                 o->rep, o->cp);
        return -1;
    }
    r->shard = o->shard > 0 ? o->shard : world / (o->rep * o->cp);
    r->dense = r->shard * o->cp;
    if (o->rep * r->dense != world) {
        snprintf(err, errlen, "dp_replicate %d x dp_shard %d x cp %d != world %d", o->rep, r->shard,
                 o->cp, world);
        return -1;
    }
    if (r->dense % o->ep != 0 || (o->ep > 1 && o->ep % o->cp != 0)) {
        snprintf(err, errlen, "ep %d must divide dp_shard x cp = %d (and be a multiple of cp %d)",
                 o->ep, r->dense, o->cp);
        return -1;
    }
    r->xs = r->dense / o->ep;
    const char **skip = calloc((size_t)p->n + 1, sizeof *skip); /* non-NULL: AdamW */
    const size_t D = (size_t)r->dense, X = (size_t)r->xs;
    /* per dense member d: its dense work, its expert work (group d % ep, member d / ep) */
    double *dflops = calloc(D, sizeof(double)), *dbytes = calloc(D, sizeof(double));
    double *downed = calloc(D, sizeof(double)), *dtb = calloc(D, sizeof(double));
    double *dtc = calloc(D, sizeof(double));
    double *xflops = calloc(D, sizeof(double)), *xbytes = calloc(D, sizeof(double));
    double *xowned = calloc(D, sizeof(double)), *xtb = calloc(D, sizeof(double));
    double *dreal = calloc(D, sizeof(double)), *xreal = calloc(D, sizeof(double));
    double *dsh = calloc(D, sizeof(double)), *xsh = calloc(D, sizeof(double));
    double *g_r = calloc(X, sizeof(double)), *g_s = calloc(X, sizeof(double));
    double *g_f = calloc(X, sizeof(double)), *g_b = calloc(X, sizeof(double));
    double *g_o = calloc(X, sizeof(double)), *g_t = calloc(X, sizeof(double));
    double *base = calloc(D > X ? D : X, sizeof(double)), *g_c = calloc(X, sizeof(double));
    double *state = calloc(D, sizeof(double)), *mom = calloc(D, sizeof(double));
    double *elem = calloc(D, sizeof(double)), *xafter = calloc(D, sizeof(double));
    double *xbase = calloc(D, sizeof(double)); /* each dense member's expert load, before moves */
    double *xtc = calloc(D, sizeof(double));
    /* the joint plans, for the union's (plan_model_union.c): the dense group's, and each expert
     * group's (all EP rank 0's plan, or with moves each its own) */
    struct group_plan jd = {0}, *jx = calloc((size_t)o->ep, sizeof *jx);
    const struct group_plan **jxp = calloc((size_t)o->ep, sizeof *jxp);
    if (xbase == NULL || xtc == NULL || jx == NULL || jxp == NULL || skip == NULL ||
        dflops == NULL || dbytes == NULL || downed == NULL || dtb == NULL || dtc == NULL ||
        xflops == NULL || xbytes == NULL || xowned == NULL || xtb == NULL || g_f == NULL ||
        g_b == NULL || g_o == NULL || g_t == NULL || base == NULL || state == NULL || mom == NULL ||
        elem == NULL || dreal == NULL || xreal == NULL || g_r == NULL || dsh == NULL ||
        xsh == NULL || g_s == NULL || g_c == NULL || !xafter)
        plan_model_die("out of memory");
    for (int i = 0; i < p->n; i++) {
        const struct preset_tensor *t = &p->t[i];
        if (t->expert && t->shape[0] % o->ep != 0) {
            snprintf(err, errlen, "%s: %lld experts do not split over ep %d", t->name,
                     (long long)t->shape[0], o->ep);
            return -1;
        }
        const int muon =
            classify_auto_is_muon(t->name, t->ndim, t->shape, SHARDOPT_DEFAULT_ADAMW_PATTERNS);
        skip[i] = muon ? NULL : "adamw";
        /* state and elementwise bytes of every rank of the dense group */
        for (int d = 0; d < r->dense; d++) {
            struct plan_box b;
            if (t->expert)
                box_of(t, r->xs, d / o->ep, o->ep, o->xdim, &b);
            else
                box_of(t, r->dense, d, o->ep, o->xdim, &b);
            const double n = box_numel(&b);
            state[d] += n * (muon ? o->mom_es : 2.0 * o->adam_es);
            mom[d] += muon ? n * o->mom_es : 0.0;
            /* fp32 grad read, param read + write; Muon: momentum read + write, U out, O in;
             * AdamW: both moments read + write */
            elem[d] +=
                n * (muon ? 4 + 8 + 2.0 * o->mom_es + 2 * COMM_ES : 4 + 8 + 4.0 * o->adam_es);
        }
    }
    /* Joint planning, as commit does it (runtime/commit.c): the expert groups first, on their
     * own; then the dense group on top of each member's expert load. Planner-only (--moves,
     * --teams): whole experts may then move to members the dense plan left light, and heavy
     * dense matrices go to teams inside a node. Every expert group has EP rank 0's shapes. */
    r->dense_internode = r->dense > mc->gpus_per_node;
    const double rate = mc->gemm_tflops * 1e12 * mc->ns_fraction;
    const double bw = (r->dense_internode ? mc->inter_gbps : mc->intra_gbps) * 1e9;
    struct group_out xo1 = {.flops = g_f,
                            .bytes = g_b,
                            .owned = g_o,
                            .tbytes = g_t,
                            .tcomm = g_c,
                            .real = g_r,
                            .sharded = g_s,
                            .kmax = 1,
                            .plan = &jx[0]};
    /* expert teams too, in a node (their members are ep ranks apart: none with ep >= a node) */
    const int xnode = plan_model_expert_node_members(mc, r->dense, o->ep);
    struct plan_cfg xcfg1 = {0};
    plan_model_teams_cfg(o, mc, r->xs, xnode, 1, &xcfg1);
    /* the moves' element cost (commit's moves_elem_cost), for the expert teams' group-wide choice
     * and the dense group's team sizes below */
    const double elem_cost = o->cost_gflops > 0
                                 ? (double)COMM_ES * o->cost_gflops / (o->cost_gbps * o->ns_steps)
                                 : COMM_ES * rate / (bw * o->ns_steps);
    xcfg1.team_guard_cost = elem_cost; /* the expert teams' choice counts the exchange */
    plan_model_group_cost(p, skip, 1, r->xs, o->ep, o->xdim, o, &xcfg1, &xo1);
    struct plan_cfg dcfg = {0};
    for (int d = 0; d < r->dense; d++)
        xbase[d] = g_f[d / o->ep] + g_c[d / o->ep]; /* its all-reduces too, as commit's */
    dcfg.base_load = o->joint ? xbase : NULL;
    plan_model_teams_cfg(o, mc, r->dense, mc->gpus_per_node, 0, &dcfg);
    /* the team sizes count the exchange too, on top of the busiest expert member's bytes, at the
     * moves' element cost (commit's first dense plan with teams; sharding/plan.h, refine_cost) */
    dcfg.refine_cost = elem_cost;
    dcfg.refine_comm = elem_cost * (round(max_of(g_b, r->xs)) / COMM_ES);
    struct group_out dout = {.flops = dflops,
                             .bytes = dbytes,
                             .owned = downed,
                             .tbytes = dtb,
                             .tcomm = dtc,
                             .real = dreal,
                             .sharded = dsh,
                             .kmax = 1};
    const struct group_out dense_fresh = dout;
    dout.plan = &jd;
    plan_model_group_cost(p, skip, 0, r->dense, o->ep, o->xdim, o, &dcfg, &dout);
    struct group_out xout = {0};
    xout.kmax = 1;
    /* the busiest dense member's exchange bytes, as commit all-reduces the plan's integer count
     * (rounded: the sum here is in doubles) */
    const double dense_max = round(max_of(dbytes, r->dense));
    if (o->moves) {
        for (int e = 0; e < o->ep; e++) {
            struct plan_cfg xcfg = {0};
            plan_model_teams_cfg(o, mc, r->xs, xnode, 1, &xcfg);
            for (int j = 0; j < r->xs; j++) { /* the dense plan's load, all-reduces included,
                                                  as commit all-gathers it (expert_replan) */
                const int d = j * o->ep + e;
                base[j] = dflops[d] + dtc[d];
            }
            double *const gs[] = {g_f, g_b, g_o, g_t, g_r, g_s, g_c};
            for (size_t a = 0; a < sizeof gs / sizeof *gs; a++)
                memset(gs[a], 0, X * sizeof(double));
            xcfg.base_load = base;
            /* as commit computes it (runtime/commit.c, expert_replan) from --cost-rates */
            xcfg.move_cost = elem_cost;
            xcfg.base_comm = xcfg.move_cost * (dense_max / COMM_ES);
            xcfg.team_guard_cost = elem_cost;
            struct group_out xo = {.flops = g_f,
                                   .bytes = g_b,
                                   .owned = g_o,
                                   .tbytes = g_t,
                                   .tcomm = g_c,
                                   .real = g_r,
                                   .sharded = g_s,
                                   .kmax = 1,
                                   .plan = &jx[e]};
            plan_free(&jx[e]); /* e = 0: EP rank 0's first plan, replaced */
            plan_model_group_cost(p, skip, 1, r->xs, o->ep, o->xdim, o, &xcfg, &xo);
            xout.nmoved += xo.nmoved;
            count_teams(&xo, 1, 1, r);
            xout.whole = xo.whole;
            for (int j = 0; j < r->xs; j++) {
                const int d = j * o->ep + e;
                xflops[d] = g_f[j];
                xtc[d] = g_c[j];
                xafter[d] = g_f[j] + g_c[j]; /* the refine load: all-reduces too (dense_refine) */
                xbytes[d] = g_b[j];
                xowned[d] = g_o[j];
                xtb[d] = g_t[j];
                xreal[d] = g_r[j];
                xsh[d] = g_s[j];
            }
        }
        /* the dense group placed again on the experts' load after their moves, its exchange
         * counted on top of the busiest expert member's (commit's dense_refine; sharding/plan.h,
         * refine_load): kept where its latest finish is earlier */
        const double xmax = max_of(xbytes, r->dense);
        dcfg.refine_load = xafter;
        dcfg.refine_cost = elem_cost;
        dcfg.refine_comm = dcfg.refine_cost * (round(xmax) / COMM_ES);
        double *const dense_arrays[] = {dflops, dbytes, downed, dtb, dtc, dreal, dsh};
        for (size_t a = 0; a < sizeof dense_arrays / sizeof *dense_arrays; a++)
            memset(dense_arrays[a], 0, D * sizeof(double));
        dout = dense_fresh;
        plan_free(&jd);
        dout.plan = &jd;
        plan_model_group_cost(p, skip, 0, r->dense, o->ep, o->xdim, o, &dcfg, &dout);
    } else {
        xout = xo1;
        count_teams(&xo1, o->ep, 1, r); /* every expert group plans EP rank 0's shapes alike */
        for (int d = 0; d < r->dense; d++) {
            xflops[d] = g_f[d / o->ep];
            xtc[d] = g_c[d / o->ep];
            xbytes[d] = g_b[d / o->ep];
            xowned[d] = g_o[d / o->ep];
            xtb[d] = g_t[d / o->ep];
            xreal[d] = g_r[d / o->ep];
            xsh[d] = g_s[d / o->ep];
        }
    }
    count_teams(&dout, 1, 0, r);
    r->nmoved = xout.nmoved;
    r->union_plan = -1;
    for (int e = 0; e < o->ep; e++)
        jxp[e] = &jx[o->moves ? e : 0];
    struct group_out xj = {.flops = xflops,
                           .bytes = xbytes,
                           .owned = xowned,
                           .tbytes = xtb,
                           .tcomm = xtc,
                           .real = xreal,
                           .sharded = xsh};
    model_step(o, mc, world, &dout, &xj, elem, state, r);
    r->joint_step = r->step; /* the joint plan's, before the union's may replace it */
    if (o->joint)
        plan_model_union(o, p, skip, r, elem_cost, &dcfg, &xcfg1, &jd, jxp, &dout, &xj);
    plan_free(&jd);
    for (int e = 0; e < o->ep; e++)
        plan_free(&jx[e]);
    free(jx);
    free(jxp);
    double sum = 0;
    /* each group's own balance: max over its members / their mean (1 when it owns nothing), in
     * the FLOPs the kernels perform */
    const double dmax = max_of(dreal, r->dense), xmax = max_of(xreal, r->dense);
    double dsum = 0, xsum = 0;
    for (int d = 0; d < r->dense; d++)
        dsum += dreal[d], xsum += xreal[d];
    r->dense_imbalance = dsum > 0 ? dmax / (dsum / r->dense) : 1.0;
    r->expert_imbalance = xsum > 0 ? xmax / (xsum / r->dense) : 1.0;
    for (int d = 0; d < r->dense; d++) {
        const double f = dreal[d] + xreal[d]; /* per step, as the runtime counts them */
        r->flops_max = f > r->flops_max ? f : r->flops_max;
        sum += f;
        /* what the runtime counts in bytes_ns_allreduce_last: both groups' Gram all-reduces */
        r->team_bytes = dtb[d] + xtb[d] > r->team_bytes ? dtb[d] + xtb[d] : r->team_bytes;
        if (state[d] > r->state_bytes) {
            r->state_bytes = state[d];
            r->mom_bytes = mom[d];
            r->adam_bytes = state[d] - mom[d];
        }
    }
    r->flops_mean = sum / r->dense;
    r->t_perfect = (dout.whole + o->ep * xout.whole) * o->ns_steps / r->dense / rate;
    model_step(o, mc, world, &dout, &xj, elem, state, r); /* the kept plan's */
    free(skip);
    double *const arrays[] = {dflops, dbytes, downed, dtb,  dtc, xflops, xbytes, xowned, xtb,
                              dreal,  xreal,  g_r,    dsh,  xsh, g_s,    g_f,    g_b,    g_o,
                              g_t,    base,   state,  elem, mom, xbase,  g_c,    xafter, xtc};
    for (size_t a = 0; a < sizeof arrays / sizeof *arrays; a++)
        free(arrays[a]);
    return 0;
}

/* shardopt-plan: what a layout costs, for any world size, without MPI or GPUs.
 *
 *   shardopt-plan --preset NAME [--layers L] [--width-div D] [--experts-div D]
 *       (--world W | --nodes N) [--gpus-per-node G] [--dp-replicate R] [--dp-shard S] [--cp C]
 *       [--ep E] [--expert-shard-dim 0|1|2] [--momentum-dtype fp32|bf16]
 *       [--adam-dtype fp32|bf16] [--offload none|optimizer|cpu] [--machine FILE]
 *       [--sweep N1,N2,...] [--ns-algorithm standard|gram|auto]
 *       [--ns-precondition frobenius|aol] [--no-joint] [--moves] [--cost-rates G,B]
 *       [--teams K|node] [--team-frac F]
 *       [--json]
 *   shardopt-plan --calibrate OUT.json [--threads T]
 *
 * The tensors of a preset are sharded as bench/preset_shards.c registers them (dense tensors in
 * torch.chunk pieces along dim 0 over the dense shard group; expert stacks split over EP, then
 * chunked along --expert-shard-dim over the expert shard group) and classified as the runtime
 * does (runtime/classify.c). The Newton-Schulz owners come from the runtime's own planner
 * (sharding/plan.c), so owned FLOPs and exchange bytes are what a run of that layout would do.
 * Per rank: owned NS FLOPs (max and mean over the ranks), bytes sent per step in each group
 * (received is the same), optimizer state bytes, host<->device bytes with offload, and a
 * predicted step time from the rates of a machine file (bench/machines/h200.json by default):
 *
 *   t_ns   = max over ranks of NS FLOPs / (gemm_bf16_tflops * ns_gemm_fraction)
 *   t_comm = dense bytes / (intra or inter-node rate) + expert bytes / (same), per direction
 *   t_elem = bytes the elementwise kernels read and write / hbm_gbps (fp32 params and grads)
 *            (offload = optimizer: the larger of that and state bytes / host_link_gbps;
 *             offload = cpu: the same bytes / host_mem_gbps, plus NS input and output over
 *             host_link_gbps)
 *   step   = t_elem + max(t_ns, t_comm)   (exchanges overlap Newton-Schulz in the pipeline)
 *   t_ns includes, per rank, its teams' Gram all-reduces over intra_node_gbps (they stall the
 *   iteration); "over perfect" divides by every matrix's Newton-Schulz once, spread evenly over
 *   the ranks at the same rate.
 *
 * Owners are planned jointly, as commit does: the expert shard groups first, then the dense group
 * on top of each member's expert load (--no-joint: each group alone, the plan of before issue
 * 22). --moves lets whole experts leave their holder for members the dense plan left light when
 * the model says it pays (each element moved costs its bytes at the expert group's link rate
 * against the NS rate; --cost-rates G,B: at commit's cost_gemm_gflops G and cost_net_gbps B
 * instead, as config expert_moves = 1 plans them). Planned only, not yet what the runtime
 * runs: --teams K lets a
 * dense matrix heavier than --team-frac (default 0.5) of the mean load be orthogonalized by a
 * team of up to K ranks of one node (node: the machine's gpus_per_node; sharding/plan.h); the
 * table's last columns count them, --json gives "team_sizes" {k: matrices}.
 *
 * A group lies inside a node when the dense shard group does (ranks are row-major over
 * [dp_replicate, dp_shard, cp], so the dense group is a contiguous block of ranks).
 * --sweep repeats the prediction for each node count, keeping cp and ep (dp_shard = the rest).
 * --ns-algorithm counts each matrix's Newton-Schulz as that algorithm does (sharding/plan.c's
 * plan_ns_flops, every product whole; auto: the bf16 table of kernels/ns_variant.h) and plans
 * owners on that cost, as commit does; --ns-precondition aol counts the aol table's 4 steps.
 * The default (standard, 5 steps) is what the runtime runs by default. The CUDA backend runs Gram
 * (ns_algorithm = gram) and AOL with whole products, as counted here, but its auto stays
 * standard until measured on a GPU: for a GPU machine, --ns-algorithm auto predicts what gram
 * would do there. Neither has run on a GPU yet.
 *
 * --calibrate writes a machine file for this machine, measured now: the Newton-Schulz rate of
 * ns_bench (bf16 where the CPU multiplies bf16 natively, as ns_compute = auto does; 512 x 1536,
 * T threads) as the "GEMM" rate with fraction 1, elementwise_bench's STREAM triad for every
 * memory rate, and pingpong's MPI bandwidth between two ranks for both link rates; "cores"
 * slots of T threads, so that more ranks than slots share them (a CPU run oversubscribed).
 *
 * One file, over 600 lines: a command-line tool whose options, model of the step and printing
 * (text and --json) are one program; the planning itself is the runtime's (sharding/plan.c). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/preset.h"
#include "bench/preset_shards.h"
#include "kernels/cpu/ns_bf16.h"
#include "kernels/ns_variant.h"
#include "runtime/classify.h"
#include "sharding/plan.h"
#include "shardopt.h"

#define NS_STEPS 5
#define COMM_ES  2 /* bf16 Newton-Schulz input and output (comm_dtype default) */

struct machine {
    char name[64];
    double gemm_tflops, ns_fraction, hbm_gbps, intra_gbps, inter_gbps, host_link_gbps,
        host_mem_gbps;
    int gpus_per_node;
    int slots; /* > 0: ranks that run at full rate at once (calibrated CPU: cores / threads) */
};

struct opts {
    const char *preset, *machine, *sweep, *calibrate;
    int threads;
    struct preset_scale scale;
    int world, nodes, gpn, rep, shard, cp, ep, xdim, json;
    int mom_es, adam_es;
    const char *offload;
    int ns_algo;  /* 0 standard, 1 gram, 2 auto (kernels/ns_variant.h's table, bf16) */
    int ns_steps; /* 5, or 4 with --ns-precondition aol (the aol table) */
    int joint;    /* the dense owners balanced on top of the expert loads (commit does) */
    int moves;    /* planner only: whole experts may move to light members */
    int teams;    /* planner only: largest Newton-Schulz team (1: none, as commit plans) */
    double team_frac;
    double cost_gflops, cost_gbps; /* --cost-rates: the runtime's cost_gemm_gflops and
                                      cost_net_gbps for --moves instead of the machine's */
};

/* What one layout does, per rank. */
struct prediction {
    int world, rep, shard, cp, ep, dense, xs;
    double flops_max, flops_mean;             /* NS FLOPs per step */
    double dense_imbalance, expert_imbalance; /* owned NS FLOPs max/mean in each group */
    double dense_bytes, expert_bytes;         /* sent per step by the busiest rank, each group */
    double state_bytes;                       /* max over ranks */
    double mom_bytes, adam_bytes;             /* that rank's state by kind */
    double h2d_bytes;                         /* per step, = d2h */
    double t_ns, t_comm, t_elem, step;        /* seconds */
    double t_perfect;  /* every matrix's NS once, spread evenly over the ranks */
    double team_bytes; /* sent per step in team all-reduces by the busiest rank */
    int dense_internode, nteams, team_max, nmoved;
    int team_sizes[6]; /* dense matrices with a team of 2, 4, ..., 64 */
};

static void die(const char *msg)
{
    fprintf(stderr, "shardopt-plan: %s\n", msg);
    exit(2);
}

static int parse_int(const char *s, int lo, int hi, const char *what)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "shardopt-plan: %s = '%s': accepted %d..%d\n", what, s, lo, hi);
        exit(2);
    }
    return (int)v;
}

static double json_rate(const cJSON *root, const char *key, const char *path)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!cJSON_IsNumber(v) || !(v->valuedouble > 0)) {
        fprintf(stderr, "shardopt-plan: machine file %s: \"%s\" must be a number > 0\n", path, key);
        exit(2);
    }
    return v->valuedouble;
}

static void machine_load(const char *path, struct machine *m)
{
    char *text = NULL;
    if (preset_file_read(path, &text) != 0) {
        fprintf(stderr, "shardopt-plan: machine file %s: cannot read\n", path);
        exit(2);
    }
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsObject(root)) {
        fprintf(stderr, "shardopt-plan: machine file %s: not a JSON object\n", path);
        exit(2);
    }
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(root, "name");
    snprintf(m->name, sizeof m->name, "%s", cJSON_IsString(nm) ? nm->valuestring : path);
    m->gemm_tflops = json_rate(root, "gemm_bf16_tflops", path);
    m->ns_fraction = json_rate(root, "ns_gemm_fraction", path);
    m->hbm_gbps = json_rate(root, "hbm_gbps", path);
    m->intra_gbps = json_rate(root, "intra_node_gbps", path);
    m->inter_gbps = json_rate(root, "inter_node_gbps", path);
    m->host_link_gbps = json_rate(root, "host_link_gbps", path);
    m->host_mem_gbps = json_rate(root, "host_mem_gbps", path);
    m->gpus_per_node = (int)json_rate(root, "gpus_per_node", path);
    const cJSON *sl = cJSON_GetObjectItemCaseSensitive(root, "slots");
    m->slots = cJSON_IsNumber(sl) ? (int)sl->valuedouble : 0;
    cJSON_Delete(root);
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

/* What one group's plan gives each member (arrays indexed by member, added to). */
struct group_out {
    double *flops;  /* owned NS FLOPs per iteration (a team member: its share) */
    double *bytes;  /* sent per step in the group's exchanges */
    double *owned;  /* bytes of the matrices it orthogonalizes (a team member: its block) */
    double *tbytes; /* sent per step in its teams' Gram all-reduces (fp32) */
    double whole;   /* NS FLOPs per iteration of the group's matrices, each orthogonalized once */
    int nteams, nmoved, kmax;
    int by_size[7]; /* teams of 2^(i+1) members, i < 6 (PLAN_TEAM_MAX = 64) */
};

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

/* Plan one group (dense tensors or EP rank 0's experts) with the joint settings in `extra`
 * (base loads, moves, teams; sharding/plan.h) and add what each member does to `out`. */
static void group_cost(const struct preset *p, const char *const *skip, int expert, int members,
                       int ep, int xdim, const struct opts *o, const struct plan_cfg *extra,
                       struct group_out *out)
{
    struct plan_param *pp = calloc((size_t)p->n + 1, sizeof *pp);
    struct plan_box *boxes = calloc((size_t)p->n * (size_t)members + 1, sizeof *boxes);
    int np = 0;
    if (pp == NULL || boxes == NULL)
        die("out of memory");
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
        pp[np].ns_gram =
            o->ns_algo == 1 ||
            (o->ns_algo == 2 && ns_algorithm_for_shape(rows, cols, KDT_BF16) == NS_ALGO_GRAM);
        np++;
    }
    struct plan_cfg cfg = *extra;
    cfg.members = members;
    cfg.me = 0;
    cfg.bucket_bytes = 128u << 20;
    cfg.esize = COMM_ES;
    cfg.ns_steps = o->ns_steps;
    struct group_plan P;
    if (np > 0 && plan_build(&cfg, pp, np, &P) != SHARDOPT_OK)
        die(shardopt_last_error());
    if (np > 0) {
        for (int m = 0; m < members; m++)
            out->flops[m] += P.load[m];
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
                out->whole += pp[q].ns_gram ? plan_ns_flops(pp[q].shape[rd], pp[q].shape[rd + 1],
                                                            o->ns_steps, 1) /
                                                  o->ns_steps
                                            : plan_ns_cost(pp[q].shape[rd], pp[q].shape[rd + 1]);
                if (team > 1) {
                    const int *tm = &P.team_of[(size_t)mi * (size_t)P.team_cap];
                    const double ar =
                        o->ns_steps * 4.0 *
                        plan_team_allreduce_elems(pp[q].shape[rd], pp[q].shape[rd + 1], team);
                    out->kmax = team > out->kmax ? team : out->kmax;
                    for (int i = 0; i < 6; i++)
                        out->by_size[i] += team == 2 << i;
                    for (int j = 0; j < team; j++) {
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
            }
        }
        plan_free(&P);
    }
    free(pp);
    free(boxes);
}

static int predict(const struct opts *o, const struct preset *p, const struct machine *mc,
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
    double *xflops = calloc(D, sizeof(double)), *xbytes = calloc(D, sizeof(double));
    double *xowned = calloc(D, sizeof(double)), *xtb = calloc(D, sizeof(double));
    double *g_f = calloc(X, sizeof(double)), *g_b = calloc(X, sizeof(double));
    double *g_o = calloc(X, sizeof(double)), *g_t = calloc(X, sizeof(double));
    double *base = calloc(D > X ? D : X, sizeof(double));
    double *state = calloc(D, sizeof(double)), *mom = calloc(D, sizeof(double));
    double *elem = calloc(D, sizeof(double));
    if (skip == NULL || dflops == NULL || dbytes == NULL || downed == NULL || dtb == NULL ||
        xflops == NULL || xbytes == NULL || xowned == NULL || xtb == NULL || g_f == NULL ||
        g_b == NULL || g_o == NULL || g_t == NULL || base == NULL || state == NULL || mom == NULL ||
        elem == NULL)
        die("out of memory");
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
    const double bw_node = mc->intra_gbps * 1e9;
    struct group_out xo1 = {.flops = g_f, .bytes = g_b, .owned = g_o, .tbytes = g_t, .kmax = 1};
    struct plan_cfg none = {0};
    group_cost(p, skip, 1, r->xs, o->ep, o->xdim, o, &none, &xo1);
    struct plan_cfg dcfg = {0};
    for (int d = 0; d < r->dense; d++)
        base[d] = g_f[d / o->ep];
    dcfg.base_load = o->joint ? base : NULL;
    dcfg.team_cap = o->teams > 0 ? o->teams : mc->gpus_per_node; /* node: one node's ranks */
    dcfg.node_members = r->dense < mc->gpus_per_node ? r->dense : mc->gpus_per_node;
    dcfg.team_frac = o->team_frac;
    dcfg.allreduce_cost = 4.0 * rate / bw_node;
    struct group_out dout = {
        .flops = dflops, .bytes = dbytes, .owned = downed, .tbytes = dtb, .kmax = 1};
    group_cost(p, skip, 0, r->dense, o->ep, o->xdim, o, &dcfg, &dout);
    struct group_out xout = {0};
    xout.kmax = 1;
    if (o->moves) {
        for (int e = 0; e < o->ep; e++) {
            struct plan_cfg xcfg = {0};
            for (int j = 0; j < r->xs; j++) { /* the dense plan's load, all-reduces included */
                const int d = j * o->ep + e;
                base[j] = dflops[d] + dtb[d] / o->ns_steps / bw_node * rate;
            }
            memset(g_f, 0, X * sizeof(double));
            memset(g_b, 0, X * sizeof(double));
            memset(g_o, 0, X * sizeof(double));
            memset(g_t, 0, X * sizeof(double));
            xcfg.base_load = base;
            /* as commit computes it (runtime/commit.c, expert_replan) from --cost-rates */
            xcfg.move_cost = o->cost_gflops > 0
                                 ? (double)COMM_ES * o->cost_gflops / (o->cost_gbps * o->ns_steps)
                                 : COMM_ES * rate / (bw * o->ns_steps);
            struct group_out xo = {
                .flops = g_f, .bytes = g_b, .owned = g_o, .tbytes = g_t, .kmax = 1};
            group_cost(p, skip, 1, r->xs, o->ep, o->xdim, o, &xcfg, &xo);
            xout.nmoved += xo.nmoved;
            xout.whole = xo.whole;
            for (int j = 0; j < r->xs; j++) {
                const int d = j * o->ep + e;
                xflops[d] = g_f[j];
                xbytes[d] = g_b[j];
                xowned[d] = g_o[j];
                xtb[d] = g_t[j];
            }
        }
    } else {
        xout = xo1;
        for (int d = 0; d < r->dense; d++) {
            xflops[d] = g_f[d / o->ep];
            xbytes[d] = g_b[d / o->ep];
            xowned[d] = g_o[d / o->ep];
            xtb[d] = g_t[d / o->ep];
        }
    }
    r->nteams = dout.nteams;
    memcpy(r->team_sizes, dout.by_size, sizeof r->team_sizes);
    r->team_max = dout.kmax;
    r->nmoved = xout.nmoved;
    double sum = 0, maxelem = 0, maxowned = 0, tns = 0;
    /* each group's own balance: max over its members / their mean (1 when it owns nothing) */
    double dmax = 0, dsum = 0, xmax = 0, xsum = 0;
    for (int d = 0; d < r->dense; d++) {
        dmax = dflops[d] > dmax ? dflops[d] : dmax;
        dsum += dflops[d];
        xmax = xflops[d] > xmax ? xflops[d] : xmax;
        xsum += xflops[d];
    }
    r->dense_imbalance = dsum > 0 ? dmax / (dsum / r->dense) : 1.0;
    r->expert_imbalance = xsum > 0 ? xmax / (xsum / r->dense) : 1.0;
    for (int d = 0; d < r->dense; d++) {
        const double f = (dflops[d] + xflops[d]) * o->ns_steps; /* load: per step */
        r->flops_max = f > r->flops_max ? f : r->flops_max;
        sum += f;
        /* a team's all-reduces stall its Newton-Schulz: they count in t_ns */
        const double t = f / rate + (dtb[d] + xtb[d]) / bw_node;
        tns = t > tns ? t : tns;
        r->team_bytes = dtb[d] > r->team_bytes ? dtb[d] : r->team_bytes;
        r->dense_bytes = dbytes[d] > r->dense_bytes ? dbytes[d] : r->dense_bytes;
        r->expert_bytes = xbytes[d] > r->expert_bytes ? xbytes[d] : r->expert_bytes;
        if (state[d] > r->state_bytes) {
            r->state_bytes = state[d];
            r->mom_bytes = mom[d];
            r->adam_bytes = state[d] - mom[d];
        }
        maxelem = elem[d] > maxelem ? elem[d] : maxelem;
        const double ow = downed[d] + xowned[d];
        maxowned = ow > maxowned ? ow : maxowned;
    }
    r->flops_mean = sum / r->dense;
    r->t_perfect = (dout.whole + o->ep * xout.whole) * o->ns_steps / r->dense / rate;

    /* the cost model (header comment) */
    r->t_ns = tns;
    r->t_comm = (r->dense_bytes + r->expert_bytes) / bw;
    if (!strcmp(o->offload, "optimizer")) {
        r->h2d_bytes = r->state_bytes;
        const double copy = r->state_bytes / (mc->host_link_gbps * 1e9);
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
    free(skip);
    free(dflops);
    free(dbytes);
    free(downed);
    free(dtb);
    free(xflops);
    free(xbytes);
    free(xowned);
    free(xtb);
    free(g_f);
    free(g_b);
    free(g_o);
    free(g_t);
    free(base);
    free(state);
    free(elem);
    free(mom);
    return 0;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: shardopt-plan --preset NAME (--world W | --nodes N) [--gpus-per-node G]\n"
            "       [--dp-replicate R] [--dp-shard S] [--cp C] [--ep E] [--expert-shard-dim D]\n"
            "       [--momentum-dtype fp32|bf16] [--adam-dtype fp32|bf16]\n"
            "       [--offload none|optimizer|cpu] [--machine FILE] [--sweep N1,N2,...] [--json]\n"
            "       [--layers L] [--width-div D] [--experts-div D]\n"
            "       [--ns-algorithm standard|gram|auto] [--ns-precondition frobenius|aol]\n"
            "       [--no-joint] [--moves] [--cost-rates GFLOPS,GBPS] [--teams K|node]\n"
            "       [--team-frac F]\n");
    exit(2);
}

static void opts_parse(int argc, char **argv, struct opts *o)
{
    memset(o, 0, sizeof *o);
    o->machine = SHARDOPT_MACHINE_DIR "/h200.json";
    o->rep = o->cp = o->ep = 1;
    o->shard = -1;
    o->mom_es = o->adam_es = 4;
    o->offload = "none";
    o->ns_steps = NS_STEPS;
    o->joint = 1;
    o->teams = 1;
    o->scale = (struct preset_scale){0, 1, 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--json") || !strcmp(a, "--no-joint") || !strcmp(a, "--moves")) {
            *(a[2] == 'j' ? &o->json : a[2] == 'n' ? &o->joint : &o->moves) = a[2] != 'n';
            continue;
        }
        if (v == NULL)
            usage();
        i++;
        if (!strcmp(a, "--preset"))
            o->preset = v;
        else if (!strcmp(a, "--calibrate"))
            o->calibrate = v;
        else if (!strcmp(a, "--threads"))
            o->threads = parse_int(v, 1, 1024, "--threads");
        else if (!strcmp(a, "--machine"))
            o->machine = v;
        else if (!strcmp(a, "--sweep"))
            o->sweep = v;
        else if (!strcmp(a, "--offload")) {
            if (strcmp(v, "none") && strcmp(v, "optimizer") && strcmp(v, "cpu"))
                die("--offload takes none, optimizer or cpu");
            o->offload = v;
        } else if (!strcmp(a, "--momentum-dtype") || !strcmp(a, "--adam-dtype")) {
            if (strcmp(v, "fp32") && strcmp(v, "bf16"))
                die("dtypes are fp32 or bf16");
            *(a[2] == 'm' ? &o->mom_es : &o->adam_es) = strcmp(v, "bf16") ? 4 : 2;
        } else if (!strcmp(a, "--world"))
            o->world = parse_int(v, 1, 1 << 20, "--world");
        else if (!strcmp(a, "--nodes"))
            o->nodes = parse_int(v, 1, 1 << 16, "--nodes");
        else if (!strcmp(a, "--gpus-per-node"))
            o->gpn = parse_int(v, 1, 1024, "--gpus-per-node");
        else if (!strcmp(a, "--dp-replicate"))
            o->rep = parse_int(v, 1, 1 << 20, "--dp-replicate");
        else if (!strcmp(a, "--dp-shard"))
            o->shard = parse_int(v, -1, 1 << 20, "--dp-shard");
        else if (!strcmp(a, "--cp"))
            o->cp = parse_int(v, 1, 1 << 20, "--cp");
        else if (!strcmp(a, "--ep"))
            o->ep = parse_int(v, 1, 1 << 20, "--ep");
        else if (!strcmp(a, "--expert-shard-dim"))
            o->xdim = parse_int(v, 0, 2, "--expert-shard-dim");
        else if (!strcmp(a, "--ns-algorithm")) {
            if (v == NULL || (strcmp(v, "standard") && strcmp(v, "gram") && strcmp(v, "auto")))
                die("--ns-algorithm takes standard, gram or auto");
            o->ns_algo = !strcmp(v, "gram") ? 1 : !strcmp(v, "auto") ? 2 : 0;
        } else if (!strcmp(a, "--ns-precondition")) {
            if (v == NULL || (strcmp(v, "frobenius") && strcmp(v, "aol")))
                die("--ns-precondition takes frobenius or aol");
            o->ns_steps = !strcmp(v, "aol") ? 4 : NS_STEPS;
        } else if (!strcmp(a, "--teams")) {
            o->teams = !strcmp(v, "node") ? 0 : parse_int(v, 1, PLAN_TEAM_MAX, "--teams");
            if (o->teams & (o->teams - 1))
                die("--teams takes a power of two");
        } else if (!strcmp(a, "--cost-rates")) {
            char *end;
            o->cost_gflops = strtod(v, &end);
            o->cost_gbps = *end == ',' ? strtod(end + 1, &end) : 0;
            if (*end != '\0' || !(o->cost_gflops > 0 && o->cost_gbps > 0))
                die("--cost-rates takes GFLOPS,GBPS (both > 0): commit's cost_gemm_gflops and "
                    "cost_net_gbps");
        } else if (!strcmp(a, "--team-frac")) {
            char *end;
            o->team_frac = strtod(v, &end);
            if (*end != '\0' || !(o->team_frac > 0 && o->team_frac <= 1))
                die("--team-frac takes a number in (0, 1]");
        } else if (!strcmp(a, "--layers"))
            o->scale.layers = parse_int(v, 1, 1 << 16, "--layers");
        else if (!strcmp(a, "--width-div"))
            o->scale.width_div = parse_int(v, 1, 1 << 16, "--width-div");
        else if (!strcmp(a, "--experts-div"))
            o->scale.experts_div = parse_int(v, 1, 1 << 16, "--experts-div");
        else
            usage();
    }
    if (o->calibrate == NULL &&
        (o->preset == NULL || (o->world == 0 && o->nodes == 0 && o->sweep == NULL)))
        usage();
}

static void print_row(const struct prediction *r)
{
    printf("| %d | %d x %d x %d, ep %d | %.3f | %.4f (%.3f / %.3f) | %.1f | %.1f | %.2f | %.1f | "
           "%.2f | %.2f | %.2f | **%.2f** | %d (%d) / %d | %.2f / %.2f |\n",
           r->world, r->rep, r->shard, r->cp, r->ep, r->flops_max / 1e12,
           r->flops_max / r->flops_mean, r->dense_imbalance, r->expert_imbalance,
           r->dense_bytes / 1048576.0, r->expert_bytes / 1048576.0, r->state_bytes / 1073741824.0,
           r->h2d_bytes / 1048576.0, r->t_ns * 1e3, r->t_comm * 1e3, r->t_elem * 1e3, r->step * 1e3,
           r->nteams, r->team_max, r->nmoved, r->t_ns / r->t_perfect, r->step / r->t_perfect);
}

static void print_json(const struct prediction *r, int first)
{
    printf("%s{\"world\": %d, \"dp_replicate\": %d, \"dp_shard\": %d, \"cp\": %d, \"ep\": %d, "
           "\"ns_flops_max\": %.6e, \"ns_flops_max_over_mean\": %.6f, "
           "\"ns_max_over_mean_dense_group\": %.6f, \"ns_max_over_mean_expert_group\": %.6f, "
           "\"dense_bytes\": %.0f, "
           "\"expert_bytes\": %.0f, \"state_bytes\": %.0f, \"momentum_bytes\": %.0f, "
           "\"adam_bytes\": %.0f, \"h2d_bytes\": %.0f, "
           "\"dense_group_internode\": %s, \"t_ns\": %.6e, \"t_comm\": %.6e, \"t_elem\": %.6e, "
           "\"step\": %.6e, \"ns_teams\": %d, \"team_size_max\": %d, \"team_bytes\": %.0f, "
           "\"experts_moved\": %d, \"t_perfect\": %.6e, \"team_sizes\": {",
           first ? "" : ", ", r->world, r->rep, r->shard, r->cp, r->ep, r->flops_max,
           r->flops_max / r->flops_mean, r->dense_imbalance, r->expert_imbalance, r->dense_bytes,
           r->expert_bytes, r->state_bytes, r->mom_bytes, r->adam_bytes, r->h2d_bytes,
           r->dense_internode ? "true" : "false", r->t_ns, r->t_comm, r->t_elem, r->step, r->nteams,
           r->team_max, r->team_bytes, r->nmoved, r->t_perfect);
    for (int i = 0, first_k = 1; i < 6; i++)
        if (r->team_sizes[i] > 0) {
            printf("%s\"%d\": %d", first_k ? "" : ", ", 2 << i, r->team_sizes[i]);
            first_k = 0;
        }
    printf("}}");
}

/* Run a command, parse the last line of its output that starts with '{' (or the whole output
 * when it is one JSON document). */
static cJSON *run_json(const char *cmd)
{
    char *out = NULL;
    size_t len = 0, cap = 0;
    char buf[4096];
    FILE *f = popen(cmd, "r");
    if (f == NULL)
        return NULL;
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0) {
        if (len + got + 1 > cap) {
            cap = (len + got + 1) * 2;
            char *n = realloc(out, cap);
            if (n == NULL) {
                free(out);
                pclose(f);
                return NULL;
            }
            out = n;
        }
        memcpy(out + len, buf, got);
        len += got;
    }
    const int rc = pclose(f);
    if (out == NULL || rc != 0) {
        free(out);
        return NULL;
    }
    out[len] = '\0';
    cJSON *j = cJSON_Parse(out);
    for (char *s = out + len; j == NULL && s > out; s--) /* the last {...} line */
        if (*s == '{' && (s == out || s[-1] == '\n'))
            j = cJSON_Parse(s);
    free(out);
    return j;
}

static double num_at(const cJSON *o, const char *a, const char *b)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, a);
    if (b != NULL)
        x = cJSON_GetObjectItemCaseSensitive(x, b);
    return cJSON_IsNumber(x) ? x->valuedouble : 0;
}

static int calibrate(const struct opts *o)
{
    const int threads = o->threads > 0 ? o->threads : 1;
    const int bf16 = ns_bf16_native();
    char cmd[2048];
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);

    fprintf(stderr, "shardopt-plan: calibrating (Newton-Schulz, triad, MPI ping-pong)...\n");
    snprintf(cmd, sizeof cmd,
             "'%s/ns_bench' --json --threads %d --reps 5 --compute %s --shape 512x1536 2>/dev/null",
             SHARDOPT_BENCH_BIN_DIR, threads, bf16 ? "bf16" : "fp32");
    cJSON *ns = run_json(cmd);
    const cJSON *nr = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(ns, "results"), 0);
    const double ns_gflops = num_at(nr, "plain", "gflops");
    snprintf(cmd, sizeof cmd,
             "OMP_NUM_THREADS=%d '%s/elementwise_bench' --json --mib 64 --reps 5 2>/dev/null",
             threads, SHARDOPT_BENCH_BIN_DIR);
    cJSON *ew = run_json(cmd);
    const double triad = num_at(
        cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(ew, "results"), 0), "gbps", NULL);
    snprintf(cmd, sizeof cmd,
             "'%s' -n 2 --oversubscribe '%s/pingpong' --mib 16 --reps 10 2>/dev/null",
             SHARDOPT_MPIEXEC, SHARDOPT_BENCH_BIN_DIR);
    cJSON *pp = run_json(cmd);
    const double link = num_at(pp, "gbps", NULL);
    cJSON_Delete(ns);
    cJSON_Delete(ew);
    cJSON_Delete(pp);
    if (!(ns_gflops > 0 && triad > 0 && link > 0)) {
        fprintf(stderr,
                "shardopt-plan: calibration failed (Newton-Schulz %.1f GFLOP/s, triad %.1f "
                "GB/s, ping-pong %.1f GB/s): are ns_bench, elementwise_bench and pingpong "
                "built in %s?\n",
                ns_gflops, triad, link, SHARDOPT_BENCH_BIN_DIR);
        return 1;
    }
    FILE *f = fopen(o->calibrate, "w");
    if (f == NULL) {
        fprintf(stderr, "shardopt-plan: cannot write %s\n", o->calibrate);
        return 1;
    }
    const char *src = "measured by shardopt-plan --calibrate on this machine";
    fprintf(
        f,
        "{\n  \"name\": \"calibrated\",\n  \"about\": \"%ld cores, %d thread(s) per rank\",\n"
        "  \"gemm_bf16_tflops\": %.6f,\n  \"gemm_bf16_tflops_source\": \"%s: ns_bench "
        "Newton-Schulz (%s, 512x1536, plain) %.1f GFLOP/s\",\n  \"ns_gemm_fraction\": 1,\n"
        "  \"hbm_gbps\": %.3f,\n  \"hbm_gbps_source\": \"%s: STREAM triad\",\n"
        "  \"intra_node_gbps\": %.3f,\n  \"intra_node_gbps_source\": \"%s: MPI ping-pong\",\n"
        "  \"inter_node_gbps\": %.3f,\n  \"host_link_gbps\": %.3f,\n  \"host_mem_gbps\": %.3f,\n"
        "  \"gpus_per_node\": %ld,\n  \"slots\": %ld\n}\n",
        cores, threads, ns_gflops / 1e3, src, bf16 ? "bf16" : "fp32", ns_gflops, triad, src, link,
        src, link, triad, triad, cores, cores / threads > 0 ? cores / threads : 1);
    fclose(f);
    printf("shardopt-plan: %s: Newton-Schulz %.1f GFLOP/s (%s), triad %.1f GB/s, MPI %.1f GB/s, "
           "%ld cores\n",
           o->calibrate, ns_gflops, bf16 ? "bf16" : "fp32", triad, link, cores);
    return 0;
}

int main(int argc, char **argv)
{
    struct opts o;
    struct preset p;
    struct machine mc;
    char err[512];
    int worlds[256], nw = 0;

    opts_parse(argc, argv, &o);
    if (o.calibrate != NULL)
        return calibrate(&o);
    machine_load(o.machine, &mc);
    if (o.gpn == 0)
        o.gpn = mc.gpus_per_node;
    mc.gpus_per_node = o.gpn;
    if (preset_load(o.preset, SHARDOPT_PRESET_DIR, &o.scale, &p, err, sizeof err) != 0)
        die(err);
    if (o.sweep != NULL) {
        for (const char *s = o.sweep; *s && nw < 256;) {
            char *end;
            long n = strtol(s, &end, 10);
            if (end == s || n < 1)
                die("--sweep takes node counts separated by commas");
            worlds[nw++] = (int)n * o.gpn;
            s = *end == ',' ? end + 1 : end;
        }
    } else {
        worlds[nw++] = o.world > 0 ? o.world : o.nodes * o.gpn;
    }
    if (o.json)
        printf("{\"preset\": \"%s\", \"parameters\": %lld, \"machine\": \"%s\", \"offload\": "
               "\"%s\", \"momentum_bytes\": %d, \"adam_bytes\": %d, \"gpus_per_node\": %d, "
               "\"layouts\": [",
               p.name, (long long)p.total, mc.name, o.offload, o.mom_es, o.adam_es, o.gpn);
    else
        printf("shardopt-plan: preset %s (%.3f B parameters), machine %s (%d GPUs/node, bf16 "
               "GEMM %.0f TFLOP/s x %.2f for NS, HBM %.0f GB/s, links %.0f/%.0f GB/s), offload "
               "%s, momentum %s, AdamW moments %s; per rank, max over ranks\n\n"
               "| ranks | replicate x shard x cp | NS TFLOP/step | NS max/mean (dense / expert "
               "group) | dense MiB sent "
               "| expert MiB sent | state GiB | host->device MiB | t_ns ms | t_comm ms | t_elem "
               "ms | step ms | NS teams (largest) / experts moved | t_ns / step over perfect |\n"
               "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
               p.name, (double)p.total / 1e9, mc.name, o.gpn, mc.gemm_tflops, mc.ns_fraction,
               mc.hbm_gbps, mc.intra_gbps, mc.inter_gbps, o.offload,
               o.mom_es == 2 ? "bf16" : "fp32", o.adam_es == 2 ? "bf16" : "fp32");
    for (int i = 0; i < nw; i++) {
        struct prediction r;
        if (predict(&o, &p, &mc, worlds[i], &r, err, sizeof err) != 0) {
            fprintf(stderr, "shardopt-plan: %d ranks: %s\n", worlds[i], err);
            preset_free(&p);
            return 2;
        }
        if (o.json)
            print_json(&r, i == 0);
        else
            print_row(&r);
    }
    if (o.json)
        printf("]}\n");
    preset_free(&p);
    return 0;
}

/* plan-world-sim: commit's shard tables and exchange plans of a few sampled ranks of a large
 * world, without MPI.
 *
 *   plan-world-sim [--preset NAME] [--ep E] --worlds W1,W2,... [--ranks R1,R2,...]
 *                  [--bucket-bytes B] [--max-growth F]
 *
 * --bucket-bytes takes config bucket_bytes' values, 0 (one matrix per bucket) included.
 *
 * For each world W (dp_replicate 1, cp 1: the dense shard group is all W ranks, the expert shard
 * groups W / E) and each sampled dense rank d (default: 0, W/2, W-1), every tensor is laid out as
 * preset_shards registers it (bench/preset_shards.h: shardopt_shard_range's torch.chunk pieces),
 * and the library's own code runs as commit runs it: the shard tables of the dense and the
 * expert shard group (sharding/shard_table.c, as runtime/commit_check.c builds them; the
 * all-reduce that agrees which parameters are torch.chunk on every member is simulated by
 * asking every member's layout), then the planner (runtime/commit.c, group_plan_build): the
 * expert group of d (member d / E) first, then the dense group (member d) on top of the expert
 * loads, each reading members' slices through the tables (shard_table_plan_param); then the
 * union plan's step (runtime/commit_union.c: what it gathers, LPT over the union of both groups,
 * and this rank's two plans for the union's owners, while the joint plans are still kept).
 * Printed per rank, measured (heap in use after less before, mallinfo2): the bytes the two
 * shard tables keep (and how many parameters needed a gathered column) and the bytes the two
 * plans keep; the planner's input (its parameter list, this rank's boxes and the dense group's
 * per-member expert loads, commit's xload), by size; the wall time of the tables and of the two
 * plan_build calls on this core; the union step's heap at its peak (its scratch and two plans)
 * and wall time; and the process's peak RSS so far (it includes the program and
 * the preset, printed first).
 *
 * --max-growth F: exit 1 when the plans and shard tables of the last world keep more than F
 * times the bytes of those of the first (largest over the sampled ranks; tests/CMakeLists.txt,
 * plan_world_sim_growth and commit_world_sim_growth: no array over all members per bucket, no
 * table over all parameters x members). No time or absolute size is checked. */
#define _GNU_SOURCE
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "bench/preset.h"
#include "bench/preset_shards.h"
#include "runtime/classify.h"
#include "sharding/layout.h"
#include "sharding/plan.h"
#include "sharding/plan_union.h"
#include "sharding/shard_table.h"
#include "shardopt.h"
#include "tools/cli_num.h"

#define COMM_ES 2 /* bf16 (comm_dtype default) */

static void die(const char *msg)
{
    fprintf(stderr, "plan-world-sim: %s\n", msg);
    exit(2);
}

static size_t heap_in_use(void)
{
    const struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Option a's comma list of integers in [lo, hi] (at most cap), or the run ends naming it. */
static int parse_list(const char *a, const char *s, long lo, long hi, long *out, int cap)
{
    long long v[64];
    const int n = cli_parse_list_in(s, lo, hi, v, cap < 64 ? cap : 64);
    if (n < 0) {
        fprintf(stderr,
                "plan-world-sim: %s takes 1 to %d integers in %ld..%ld separated by commas, not "
                "'%s'\n",
                a, cap, lo, hi, s);
        exit(2);
    }
    for (int i = 0; i < n; i++)
        out[i] = (long)v[i];
    return n;
}

static void bad_value(const char *a, const char *v, const char *accepted)
{
    fprintf(stderr, "plan-world-sim: %s takes %s, not '%s'\n", a, accepted, v);
    exit(2);
}

/* Dense rank d's layout of tensor t as preset_shards registers it (shardopt_shard_range's
 * torch.chunk pieces), in the runtime's coordinates (sharding/layout.h): member `member` of a
 * group of `members`, an expert stack in the window of EP rank ep_rank. */
static void layout_of(const struct preset_tensor *t, int ep, int members, int member, int ep_rank,
                      struct layout *l)
{
    struct preset_shard s;
    const int64_t win = t->expert ? t->shape[0] / ep : t->shape[0];
    preset_shard_of(t, ep, members, member, 0, &s);
    if (layout_init(l, t->ndim, t->shape, s.dim, s.offset, s.length, t->expert ? ep_rank * win : 0,
                    win) != SHARDOPT_OK)
        die(shardopt_last_error());
}

/* Commit's shard table of one group (expert 0/1) of `members`, this rank member `me`, as
 * runtime/commit_check.c builds it: the all-reduce that agrees which parameters every member
 * registered as torch.chunk pieces is simulated by asking each member's layout in turn (time
 * not counted); then the same shard_table_init. Nothing is gathered for an agreed parameter. */
static void table_of(const struct preset *p, int expert, int members, int me, int ep, int ep_rank,
                     struct shard_table *t, double *seconds)
{
    unsigned char *chunk = malloc((size_t)p->n + 1);
    size_t bytes;
    if (chunk == NULL)
        die("out of memory");
    for (int i = 0; i < p->n; i++) {
        const struct preset_tensor *x = &p->t[i];
        chunk[i] = 1;
        for (int m = 0; m < members && chunk[i] && x->expert == expert; m++) {
            struct layout l;
            layout_of(x, ep, members, m, ep_rank, &l);
            chunk[i] = (unsigned char)shard_table_is_chunk(&l, members, m);
        }
    }
    const double t0 = now();
    if (shard_table_init(t, members, me, p->n, chunk, &bytes) != 0)
        die("out of memory for a shard table");
    *seconds += now() - t0;
    free(chunk);
}

/* The planner's input for one group kind, as commit's group_plan_build gives it
 * (shard_table_plan_param over this rank's layouts and the group's table); returns the number
 * of parameters. */
static int group_input(const struct preset *p, const int *muon, int expert,
                       const struct shard_table *t, const struct layout *mine,
                       struct plan_param *pp, struct plan_box *tmpl)
{
    int np = 0;
    for (int i = 0; i < p->n; i++) {
        if (!muon[i] || p->t[i].expert != expert)
            continue;
        pp[np] = (struct plan_param){.param = i};
        shard_table_plan_param(t, i, &mine[i], &tmpl[np], &pp[np]);
        np++;
    }
    return np;
}

struct sample {
    size_t plan_bytes, table_bytes, input_bytes;
    size_t union_bytes; /* the union step's scratch and its two plans, while the joint ones stay */
    double seconds, table_seconds, union_seconds;
    int dense_buckets, expert_buckets, columns;
};

/* The union plan as commit computes it once the joint plans stand (runtime/commit_union.c):
 * what it gathers (3 ints per dense member, the all-gather's counts and displacements, every
 * matrix's cost: every expert group has EP rank 0's shapes), LPT over the union of both groups
 * (sharding/plan_union.c), and this rank's plans of both groups for those owners, measured with
 * the joint plans still kept, as commit holds both until it picks one. */
static void union_step(int world, int ep, int d, const struct plan_cfg *xc,
                       const struct plan_cfg *dc, const struct group_plan *XP,
                       const struct group_plan *DP, struct plan_param *pp, struct plan_box *tmpl,
                       const struct preset *p, const int *muon, const struct shard_table *X,
                       const struct shard_table *D, const struct layout *mine, struct sample *out)
{
    const int nd = DP->nmatrices, nx = XP->nmatrices;
    const int64_t n = nd + (int64_t)ep * nx;
    const size_t h0 = heap_in_use();
    const double t0 = now();
    int *info = malloc(sizeof(int) * 5 * (size_t)world);
    double *cost = malloc(sizeof(double) * (size_t)(n + 1)),
           *load = malloc(sizeof(double) * (size_t)world);
    int *group = malloc(sizeof(int) * (size_t)(n + 1)),
        *owner = malloc(sizeof(int) * (size_t)(n + 1));
    int *xowner = malloc(sizeof(int) * (size_t)(nx + 1));
    if (info == NULL || cost == NULL || load == NULL || group == NULL || owner == NULL ||
        xowner == NULL)
        die("out of memory");
    for (int i = 0; i < world; i++) /* what commit gathers: EP rank, expert shard rank, count */
        info[3 * i] = i % ep, info[3 * i + 1] = i / ep, info[3 * i + 2] = nx;
    plan_union_costs(DP, cost); /* commit's list (no teams here: every matrix placed) */
    for (int m = 0; m < nd; m++)
        group[m] = -1;
    for (int e = 0; e < ep; e++) { /* every expert group has EP rank 0's shapes */
        plan_union_costs(XP, cost + nd + (int64_t)e * nx);
        for (int m = 0; m < nx; m++)
            group[nd + (int64_t)e * nx + m] = e;
    }
    if (plan_union_owners(cost, group, n, world, NULL, ep, NULL, owner, load) != 0)
        die("out of memory planning the union");
    struct group_plan UX = {0}, UD = {0};
    struct plan_cfg uc = *dc;
    uc.base_load = NULL;
    uc.fixed_owner = owner;
    int np = group_input(p, muon, 0, D, mine, pp, tmpl);
    if (np > 0 && plan_build(&uc, pp, np, &UD) != SHARDOPT_OK)
        die(shardopt_last_error());
    for (int m = 0; m < nx; m++)
        xowner[m] = owner[nd + (int64_t)(d % ep) * nx + m] / ep;
    uc = *xc;
    uc.fixed_owner = xowner;
    np = group_input(p, muon, 1, X, mine, pp, tmpl);
    if (np > 0 && plan_build(&uc, pp, np, &UX) != SHARDOPT_OK)
        die(shardopt_last_error());
    out->union_seconds = now() - t0;
    out->union_bytes = heap_in_use() - h0;
    plan_free(&UX);
    plan_free(&UD);
    free(info);
    free(cost);
    free(load);
    free(group);
    free(owner);
    free(xowner);
}

/* Dense rank d of world W as commit handles it: its shard tables, then its expert group's plan,
 * then the dense group's. */
static void plan_rank(const struct preset *p, const int *muon, int world, int ep, int d,
                      size_t bucket_bytes, struct sample *out)
{
    const int xs = world / ep;
    struct plan_param *pp = calloc((size_t)p->n + 1, sizeof *pp);
    struct plan_box *tmpl = calloc((size_t)p->n + 1, sizeof *tmpl);
    struct layout *mine = calloc((size_t)p->n + 1, sizeof *mine);
    struct shard_table D, X;
    struct group_plan XP = {0}, DP = {0};
    double *base = calloc((size_t)world, sizeof(double)); /* commit's dense xload */
    if (pp == NULL || tmpl == NULL || mine == NULL || base == NULL)
        die("out of memory");
    memset(out, 0, sizeof *out);
    out->input_bytes = (sizeof *pp + sizeof *tmpl) * (size_t)p->n + sizeof(double) * (size_t)world;
    for (int i = 0; i < p->n; i++)
        layout_of(&p->t[i], ep, p->t[i].expert ? xs : world, p->t[i].expert ? d / ep : d, d % ep,
                  &mine[i]);

    size_t h0 = heap_in_use();
    table_of(p, 0, world, d, ep, d % ep, &D, &out->table_seconds);
    table_of(p, 1, xs, d / ep, ep, d % ep, &X, &out->table_seconds);
    out->table_bytes = heap_in_use() - h0;
    out->columns = D.ncols + X.ncols;

    int np = group_input(p, muon, 1, &X, mine, pp, tmpl);
    struct plan_cfg xc = {.members = xs,
                          .me = d / ep,
                          .bucket_bytes = bucket_bytes,
                          .esize = COMM_ES,
                          .replicas = 1,
                          .team_cap = 1};
    h0 = heap_in_use();
    double t0 = now();
    if (np > 0 && plan_build(&xc, pp, np, &XP) != SHARDOPT_OK)
        die(shardopt_last_error());
    out->seconds = now() - t0;
    out->plan_bytes = heap_in_use() - h0;
    out->expert_buckets = XP.nbuckets;
    /* every expert group has the same shapes: dense member j carries expert member j / ep's
     * load (commit gathers it, runtime/commit.c expert_loads) */
    for (int j = 0; j < world && np > 0; j++)
        base[j] = XP.load[j / ep];

    np = group_input(p, muon, 0, &D, mine, pp, tmpl);
    struct plan_cfg dc = {.members = world,
                          .me = d,
                          .bucket_bytes = bucket_bytes,
                          .esize = COMM_ES,
                          .replicas = 1,
                          .base_load = base,
                          .team_cap = 1};
    h0 = heap_in_use();
    t0 = now();
    if (np > 0 && plan_build(&dc, pp, np, &DP) != SHARDOPT_OK)
        die(shardopt_last_error());
    out->seconds += now() - t0;
    out->plan_bytes += heap_in_use() - h0;
    out->dense_buckets = DP.nbuckets;
    union_step(world, ep, d, &xc, &dc, &XP, &DP, pp, tmpl, p, muon, &X, &D, mine, out);
    plan_free(&XP);
    plan_free(&DP);
    shard_table_free(&D);
    shard_table_free(&X);
    free(base);
    free(pp);
    free(tmpl);
    free(mine);
}

int main(int argc, char **argv)
{
    const char *preset = "glm45-air";
    long worlds[64], ranks[64];
    int nw = 0, nr = 0, ep = 8;
    size_t bucket_bytes = 128u << 20;
    double max_growth = 0;
    char err[512];

    static const char use[] =
        "usage: plan-world-sim [--preset NAME] [--ep E] --worlds W1,... [--ranks R1,...] "
        "[--bucket-bytes B] [--max-growth F]";
    cli_stdout_at_exit("plan-world-sim");
    if (cli_argv_refused(argc, argv, "plan-world-sim", 1))
        return 2;
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long long bb;
        if (strcmp(a, "--preset") && strcmp(a, "--ep") && strcmp(a, "--worlds") &&
            strcmp(a, "--ranks") && strcmp(a, "--bucket-bytes") && strcmp(a, "--max-growth")) {
            fprintf(stderr, "plan-world-sim: unknown argument '%s'\n%s\n", a, use);
            exit(2);
        }
        if (v == NULL) {
            fprintf(stderr, "plan-world-sim: %s needs a value\n%s\n", a, use);
            exit(2);
        }
        if (!strcmp(a, "--preset"))
            preset = v;
        else if (!strcmp(a, "--ep")) {
            if (cli_parse_int_in(v, 1, 1 << 20, &ep) != 0)
                bad_value(a, v, "an integer in 1..1048576");
        } else if (!strcmp(a, "--worlds"))
            nw = parse_list(a, v, 1, 1 << 20, worlds, 64);
        else if (!strcmp(a, "--ranks"))
            nr = parse_list(a, v, 0, (1 << 20) - 1, ranks, 64);
        else if (!strcmp(a, "--bucket-bytes")) {
            if (cli_parse_ll_in(v, 0, 1ll << 40, &bb) != 0)
                bad_value(a, v, "an integer in 0..2^40");
            bucket_bytes = (size_t)bb;
        } else if (cli_parse_double_in(v, 0, 1e6, &max_growth) != 0)
            bad_value(a, v, "a number in 0..1e6");
    }
    if (nw == 0 || ep < 1)
        die("--worlds is required (and --ep at least 1)");
    struct preset p;
    struct preset_scale scale = {0, 1, 1};
    if (preset_load(preset, SHARDOPT_PRESET_DIR, &scale, &p, err, sizeof err) != 0)
        die(err);
    int *muon = calloc((size_t)p.n + 1, sizeof(int));
    if (muon == NULL)
        die("out of memory");
    int nmuon = 0;
    for (int i = 0; i < p.n; i++) {
        const struct preset_tensor *t = &p.t[i];
        muon[i] =
            classify_auto_is_muon(t->name, t->ndim, t->shape, SHARDOPT_DEFAULT_ADAMW_PATTERNS);
        nmuon += muon[i];
    }
    struct rusage ru0;
    getrusage(RUSAGE_SELF, &ru0); /* the program and the preset, before any planning */
    printf("plan-world-sim: preset %s (%d tensors, %d Muon), ep %d, bucket_bytes %zu; peak RSS "
           "before planning %.1f MiB; per sampled rank\n\n| ranks | rank | buckets dense/expert | "
           "plan MiB kept | shard tables MiB kept (gathered columns) | planner input MiB | "
           "tables ms | plan s | union MiB | union s | peak RSS MiB |\n"
           "|---|---|---|---|---|---|---|---|---|---|---|\n",
           p.name, p.n, nmuon, ep, bucket_bytes, ru0.ru_maxrss / 1024.0);
    size_t first = 0, last = 0;
    for (int w = 0; w < nw; w++) {
        const int world = (int)worlds[w];
        long sample[64];
        int ns = nr;
        if (world < ep || world % ep != 0)
            die("each world must be a multiple of --ep");
        if (nr > 0)
            memcpy(sample, ranks, sizeof(long) * (size_t)nr);
        else {
            sample[0] = 0;
            sample[1] = world / 2;
            sample[2] = world - 1;
            ns = 3;
        }
        size_t worst = 0;
        for (int s = 0; s < ns; s++) {
            if (sample[s] >= world)
                continue;
            struct sample r;
            plan_rank(&p, muon, world, ep, (int)sample[s], bucket_bytes, &r);
            struct rusage ru;
            getrusage(RUSAGE_SELF, &ru);
            printf(
                "| %d | %ld | %d/%d | %.3f | %.3f (%d) | %.3f | %.3f | %.3f | %.3f | %.3f | %.1f "
                "|\n",
                world, sample[s], r.dense_buckets, r.expert_buckets, r.plan_bytes / 1048576.0,
                r.table_bytes / 1048576.0, r.columns, r.input_bytes / 1048576.0, r.table_seconds,
                r.seconds, r.union_bytes / 1048576.0, r.union_seconds, ru.ru_maxrss / 1024.0);
            const size_t kept = r.plan_bytes + r.table_bytes;
            worst = kept > worst ? kept : worst;
        }
        if (w == 0)
            first = worst;
        last = worst;
    }
    preset_free(&p);
    free(muon);
    if (max_growth > 0 && nw > 1) {
        const double g = (double)last / (double)(first ? first : 1);
        printf("\nplans + shard tables kept, %ld ranks over %ld ranks: %.2fx (at most %.2fx)\n",
               worlds[nw - 1], worlds[0], g, max_growth);
        if (g > max_growth) {
            fprintf(stderr,
                    "plan-world-sim: the plans and shard tables of %ld ranks keep %zu bytes, %.2fx "
                    "the %zu of %ld ranks (at most %.2fx): they grow with the world\n",
                    worlds[nw - 1], last, g, first, worlds[0], max_growth);
            return 1;
        }
    }
    return 0;
}

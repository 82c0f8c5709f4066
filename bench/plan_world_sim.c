/* plan-world-sim: the exchange plan of a few sampled ranks of a large world, without MPI.
 *
 *   plan-world-sim [--preset NAME] [--ep E] --worlds W1,W2,... [--ranks R1,R2,...]
 *                  [--bucket-bytes B] [--max-growth F]
 *
 * For each world W (dp_replicate 1, cp 1: the dense shard group is all W ranks, the expert shard
 * groups W / E) and each sampled dense rank d (default: 0, W/2, W-1), the planner runs as commit
 * runs it (runtime/commit.c, group_plan_build): the expert group of d (member d / E) first, then
 * the dense group (member d) on top of the expert loads, every member's slice along the shard
 * dim synthesized from the layout the way preset_shards registers it (bench/preset_shards.h)
 * into a table the planner reads in place, as commit's shard tables (runtime/commit_check.h).
 * Printed per rank: the bytes the two plans keep (heap in use after plan_build less before,
 * mallinfo2), the planner's input (16 B x Muon parameters x members), the bytes of commit's shard
 * tables for that layout (16 B x all parameters x members of both groups), the wall time of the
 * two plan_build calls on this core, and the process's peak RSS so far.
 *
 * --max-growth F: exit 1 when the largest plan of the last world keeps more than F times the
 * bytes of the largest plan of the first (tests/CMakeLists.txt, plan_world_sim_growth: a plan
 * must not keep arrays over all members per bucket). No time or absolute size is checked. */
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
#include "sharding/plan.h"
#include "shardopt.h"

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

static int parse_list(const char *s, long *out, int cap)
{
    int n = 0;
    while (*s && n < cap) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 0)
            die("lists take non-negative integers separated by commas");
        out[n++] = v;
        s = *end == ',' ? end + 1 : end;
    }
    return n;
}

/* The planner's input for one group kind (expert 0/1) of `members` as commit gives it: a table
 * of each member's slice along the shard dim, [members][parameters] (runtime/commit_check.h),
 * read in place with a template box (this rank's); returns the number of parameters, *slices
 * and *tmpl to free. */
static int group_input(const struct preset *p, const int *muon, int expert, int members, int ep,
                       int me, struct plan_param *pp, struct plan_slice **slices,
                       struct plan_box **tmpl)
{
    int np = 0, n = 0;
    for (int i = 0; i < p->n; i++)
        n += muon[i] && p->t[i].expert == expert;
    *slices = malloc(sizeof(**slices) * (size_t)members * (size_t)(n ? n : 1));
    *tmpl = malloc(sizeof(**tmpl) * (size_t)(n ? n : 1));
    if (*slices == NULL || *tmpl == NULL)
        die("out of memory for the planner's input");
    for (int i = 0; i < p->n; i++) {
        const struct preset_tensor *t = &p->t[i];
        if (!muon[i] || t->expert != expert)
            continue;
        struct preset_shard s;
        for (int m = 0; m < members; m++) {
            preset_shard_of(t, ep, members, m, 0, &s);
            (*slices)[(size_t)m * (size_t)n + (size_t)np] =
                (struct plan_slice){s.lo[s.dim], s.len[s.dim]};
        }
        preset_shard_of(t, ep, members, me, 0, &s);
        memcpy((*tmpl)[np].lo, s.lo, sizeof s.lo);
        memcpy((*tmpl)[np].len, s.len, sizeof s.len);
        pp[np] = (struct plan_param){.param = i,
                                     .ndim = t->ndim,
                                     .tmpl = &(*tmpl)[np],
                                     .slice_dim = s.dim,
                                     .slices = &(*slices)[np],
                                     .box_stride = (size_t)n};
        memcpy(pp[np].shape, t->shape, sizeof pp[np].shape);
        if (t->ndim == 3)
            pp[np].shape[0] = t->shape[0] / ep; /* the EP rank's stack */
        pp[np].k_lo = 0;
        pp[np].k_count = t->ndim == 3 ? pp[np].shape[0] : 1;
        np++;
    }
    return np;
}

struct sample {
    size_t plan_bytes, input_bytes;
    double seconds;
    int dense_buckets, expert_buckets;
};

/* Plan dense rank d of world W as commit does: its expert group, then the dense group. */
static void plan_rank(const struct preset *p, const int *muon, int world, int ep, int d,
                      size_t bucket_bytes, struct sample *out)
{
    const int xs = world / ep;
    struct plan_param *pp = calloc((size_t)p->n + 1, sizeof *pp);
    struct plan_slice *xb, *db;
    struct plan_box *xt, *dt;
    struct group_plan X = {0}, D = {0};
    double *base = calloc((size_t)world, sizeof(double));
    if (pp == NULL || base == NULL)
        die("out of memory");
    memset(out, 0, sizeof *out);

    int np = group_input(p, muon, 1, xs, ep, d / ep, pp, &xb, &xt);
    out->input_bytes = sizeof(*xb) * (size_t)xs * (size_t)np;
    struct plan_cfg xc = {.members = xs,
                          .me = d / ep,
                          .bucket_bytes = bucket_bytes,
                          .esize = COMM_ES,
                          .replicas = 1,
                          .team_cap = 1};
    size_t h0 = heap_in_use();
    double t0 = now();
    if (np > 0 && plan_build(&xc, pp, np, &X) != SHARDOPT_OK)
        die(shardopt_last_error());
    out->seconds = now() - t0;
    out->plan_bytes = heap_in_use() - h0;
    out->expert_buckets = X.nbuckets;
    /* every expert group has the same shapes: dense member j carries expert member j / ep's
     * load (commit gathers it, runtime/commit.c expert_loads) */
    for (int j = 0; j < world && np > 0; j++)
        base[j] = X.load[j / ep];
    free(xb);
    free(xt);

    np = group_input(p, muon, 0, world, ep, d, pp, &db, &dt);
    out->input_bytes += sizeof(*db) * (size_t)world * (size_t)np;
    struct plan_cfg dc = {.members = world,
                          .me = d,
                          .bucket_bytes = bucket_bytes,
                          .esize = COMM_ES,
                          .replicas = 1,
                          .base_load = base,
                          .team_cap = 1};
    h0 = heap_in_use();
    t0 = now();
    if (np > 0 && plan_build(&dc, pp, np, &D) != SHARDOPT_OK)
        die(shardopt_last_error());
    out->seconds += now() - t0;
    out->plan_bytes += heap_in_use() - h0;
    out->dense_buckets = D.nbuckets;
    free(db);
    free(dt);
    plan_free(&X);
    plan_free(&D);
    free(base);
    free(pp);
}

int main(int argc, char **argv)
{
    const char *preset = "glm45-air";
    long worlds[64], ranks[64];
    int nw = 0, nr = 0, ep = 8;
    size_t bucket_bytes = 128u << 20;
    double max_growth = 0;
    char err[512];

    for (int i = 1; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if (!strcmp(a, "--preset"))
            preset = v;
        else if (!strcmp(a, "--ep"))
            ep = atoi(v);
        else if (!strcmp(a, "--worlds"))
            nw = parse_list(v, worlds, 64);
        else if (!strcmp(a, "--ranks"))
            nr = parse_list(v, ranks, 64);
        else if (!strcmp(a, "--bucket-bytes"))
            bucket_bytes = (size_t)strtoull(v, NULL, 10);
        else if (!strcmp(a, "--max-growth"))
            max_growth = atof(v);
        else
            die("usage: plan-world-sim [--preset NAME] [--ep E] --worlds W1,... [--ranks R1,...] "
                "[--bucket-bytes B] [--max-growth F]");
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
           "plan MiB kept | planner input MiB | "
           "shard tables MiB | plan s | peak RSS MiB |\n|---|---|---|---|---|---|---|---|\n",
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
            /* commit's shard tables: every parameter's box of every member of each group */
            const double tables =
                (double)sizeof(struct plan_slice) * (double)p.n * (double)(world + world / ep);
            printf("| %d | %ld | %d/%d | %.3f | %.1f | %.1f | %.3f | %.1f |\n", world, sample[s],
                   r.dense_buckets, r.expert_buckets, r.plan_bytes / 1048576.0,
                   r.input_bytes / 1048576.0, tables / 1048576.0, r.seconds, ru.ru_maxrss / 1024.0);
            worst = r.plan_bytes > worst ? r.plan_bytes : worst;
        }
        if (w == 0)
            first = worst;
        last = worst;
    }
    preset_free(&p);
    free(muon);
    if (max_growth > 0 && nw > 1) {
        const double g = (double)last / (double)(first ? first : 1);
        printf("\nplan bytes, %ld ranks over %ld ranks: %.2fx (at most %.2fx)\n", worlds[nw - 1],
               worlds[0], g, max_growth);
        if (g > max_growth) {
            fprintf(stderr,
                    "plan-world-sim: the plan of %ld ranks keeps %zu bytes, %.2fx the %zu of %ld "
                    "ranks (at most %.2fx): it grows with the world\n",
                    worlds[nw - 1], last, g, first, worlds[0], max_growth);
            return 1;
        }
    }
    return 0;
}

/* shardopt-plan: what a layout costs, for any world size, without MPI or GPUs.
 *
 *   shardopt-plan --preset NAME [--layers L] [--width-div D] [--experts-div D]
 *       (--world W | --nodes N) [--gpus-per-node G] [--dp-replicate R] [--dp-shard S] [--cp C]
 *       [--ep E] [--expert-shard-dim 0|1|2] [--momentum-dtype fp32|bf16]
 *       [--adam-dtype fp32|bf16] [--offload none|optimizer|cpu] [--machine FILE]
 *       [--sweep N1,N2,...] [--ns-algorithm standard|gram|auto]
 *       [--ns-precondition frobenius|aol] [--ns-compute device|fp32|bf16]
 *       [--ns-strategy gather|sharded|auto] [--no-joint] [--moves] [--cost-rates G,B]
 *       [--teams K|node] [--team-frac F]
 *       [--json]
 *   shardopt-plan --calibrate OUT.json [--threads T]
 * Each option is taken once (a repeated one is refused, naming it).
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
 * 22). --moves lets expert matrices leave their owner for members the dense plan left light when
 * the model says it pays (each element an owner change adds to a member's exchange costs its
 * bytes at the expert group's link rate against the NS rate, on top of the busiest dense
 * member's bytes; --cost-rates G,B: at commit's cost_gemm_gflops G and cost_net_gbps B instead,
 * as config expert_moves = 1 plans them); the dense group is then placed again on the experts'
 * load after their moves, its exchange counted at the same rate on top of the busiest expert
 * member's bytes, and kept where it finishes earlier (sharding/plan.h, refine_load; commit does
 * the same). --teams K lets a dense matrix heavier than
 * --team-frac (default 0.5) of the mean load be orthogonalized by a team of up to K ranks of one
 * node (node: the machine's gpus_per_node; sharding/plan.h), as config ns_team_cap = K and
 * ns_team_frac run it; a team's all-reduce is costed at intra_node_gbps, or with --cost-rates
 * at B, as commit costs it, in the dtype the runtime's teams iterate in: bf16 for --ns-compute
 * device and bf16 (half the bytes of fp32's; every member forms A^2), fp32 for fp32
 * (plan_model_team_cfg). Expert shard groups team as commit plans them: inside a node (their
 * members are ep ranks apart) and only where the group's latest member finishes earlier
 * (plan_cfg.team_guard). The table's last columns count both groups' teams, --json gives
 * "team_sizes" {k: matrices} and "expert_ns_teams" (of ns_teams, the expert groups').
 * Then, as commit does (runtime/commit_union.c), LPT over the union of both groups' matrices, one
 * owner each, replaces the joint plan where it finishes first in the cost model (the later of
 * the busiest rank's Newton-Schulz work and, at the moves' element cost, the busiest dense
 * sender's exchange elements plus the busiest expert sender's, as t_comm adds them;
 * plan_model_union.c): --json's "union_plan" (1: kept, 0: the joint plan kept; absent with
 * --no-joint), "joint_finish" and "union_finish" (each plan's finish, in the planner's cost
 * units, NS FLOPs per iteration) and "joint_step" (the joint plan's step; "step" is the kept
 * plan's, never later at the machine's rates). With the machine's rates the element cost is the
 * machine's, so a run (commit at cost_gemm_gflops / cost_net_gbps) may keep the other plan:
 * --cost-rates G,B predicts the run's choice. The table marks a layout where the union plan is
 * kept with ", union" after its teams and moves (0 (1) / 0, union).
 *
 * A group lies inside a node when the dense shard group does (ranks are row-major over
 * [dp_replicate, dp_shard, cp], so the dense group is a contiguous block of ranks).
 * --sweep repeats the prediction for each node count, keeping cp and ep (dp_shard = the rest).
 * --ns-algorithm counts each matrix's Newton-Schulz as that algorithm does (sharding/plan.c's
 * plan_ns_flops, every product whole, Gram restarting where the --ns-compute kernels do; auto:
 * kernels/ns_variant.h's rule in that dtype, bf16's for device) and plans
 * owners on that cost, as commit does; --ns-precondition aol counts the aol table's 4 steps.
 * The default (standard, 5 steps) is what the runtime runs by default. The CUDA backend runs Gram
 * (ns_algorithm = gram) and AOL with whole products, as counted here, but its auto stays
 * standard until measured on a GPU: for a GPU machine, --ns-algorithm auto predicts what gram
 * would do there. Neither has run on a GPU yet.
 *
 * The NS FLOPs are those the kernels perform, counted as the runtime counts them in
 * ns_flops_last (docs/design.md, "Counting Newton-Schulz FLOPs"; sharding/plan.c's
 * plan_ns_flops_blocked): --ns-compute device (the default: a GPU, whose plain variant forms
 * every product whole), or fp32 / bf16 for the CPU kernels of that ns_compute, whose symmetric
 * products cost what the committed per-shape variant table (kernels/ns_variant.h) makes them
 * form. --ns-strategy sharded|auto (the CPU and the device alike: sharded Newton-Schulz is fp32
 * on both) keeps the matrices commit would keep sharded out of the owners'
 * plan and counts each holder's columns (auto's cost model at --cost-rates, or the config's
 * defaults). tests/mpi/plan_vs_runtime.sh checks the counts against runs. Owners are still balanced
 * on the whole-product cost (plan_ns_cost), as commit balances them.
 *
 * --calibrate writes a machine file for this machine, measured now: the Newton-Schulz rate of
 * ns_bench (bf16 where the CPU multiplies bf16 natively, as ns_compute = auto does; 512 x 1536,
 * T threads) as the "GEMM" rate with fraction 1, elementwise_bench's STREAM triad for every
 * memory rate, and pingpong's MPI bandwidth between two ranks for both link rates; "cores"
 * slots of T threads, so that more ranks than slots share them (a CPU run oversubscribed).
 * The model (the machine file, each group's plan and cost, the prediction) is
 * bench/plan_model.c; this file is the tool: options, printing (text and --json), --calibrate. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/plan_model.h"
#include "bench/plan_union.h"
#include "bench/preset.h"
#include "kernels/cpu/ns_bf16.h"
#include "kernels/dtype.h"
#include "kernels/ns_coeffs.h"
#include "kernels/ns_variant.h"
#include "sharding/ns_strategy.h"
#include "sharding/plan.h"
#include "shardopt.h"
#include "tools/cli_file.h"
#include "tools/cli_num.h"

static int parse_int(const char *s, int lo, int hi, const char *what)
{
    int v;
    if (cli_parse_int_in(s, lo, hi, &v) != 0) {
        fprintf(stderr, "shardopt-plan: %s takes an integer in %d..%d, not '%s'\n", what, lo, hi,
                s);
        exit(2);
    }
    return v;
}

/* Option a's value v is not one it takes: one line naming both and what it accepts. */
static void bad(const char *a, const char *v, const char *accepted)
{
    fprintf(stderr, "shardopt-plan: %s takes %s, not '%s'\n", a, accepted, v);
    exit(2);
}

/* what: the one line that says why (NULL: only the usage), before the usage. */
static void usage(const char *what, const char *arg)
{
    if (what != NULL)
        fprintf(stderr, "shardopt-plan: %s '%s'\n", what, arg);
    fprintf(stderr,
            "usage: shardopt-plan --preset NAME (--world W | --nodes N) [--gpus-per-node G]\n"
            "       [--dp-replicate R] [--dp-shard S] [--cp C] [--ep E] [--expert-shard-dim D]\n"
            "       [--momentum-dtype fp32|bf16] [--adam-dtype fp32|bf16]\n"
            "       [--offload none|optimizer|cpu] [--machine FILE] [--sweep N1,N2,...] [--json]\n"
            "       [--layers L] [--width-div D] [--experts-div D]\n"
            "       [--ns-algorithm standard|gram|auto] [--ns-precondition frobenius|aol]\n"
            "       [--ns-compute device|fp32|bf16] [--ns-strategy gather|sharded|auto]\n"
            "       [--no-joint] [--moves] [--cost-rates GFLOPS,GBPS] [--teams K|node]\n"
            "       [--team-frac F]\n");
    exit(2);
}

static int is_option(const char *a)
{
    static const char *const known[] = {"--preset",
                                        "--calibrate",
                                        "--threads",
                                        "--machine",
                                        "--sweep",
                                        "--offload",
                                        "--momentum-dtype",
                                        "--adam-dtype",
                                        "--world",
                                        "--nodes",
                                        "--gpus-per-node",
                                        "--dp-replicate",
                                        "--dp-shard",
                                        "--cp",
                                        "--ep",
                                        "--expert-shard-dim",
                                        "--ns-algorithm",
                                        "--ns-strategy",
                                        "--ns-compute",
                                        "--ns-precondition",
                                        "--teams",
                                        "--cost-rates",
                                        "--team-frac",
                                        "--layers",
                                        "--width-div",
                                        "--experts-div"};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (!strcmp(a, known[i]))
            return 1;
    return 0;
}

/* Option a given a second time: refused naming it (none is repeatable: a later value silently
 * replaced an earlier one, so --world 8 ... --world 16 planned 16 ranks without a word). */
static void once(const char **seen, int *n, const char *a)
{
    for (int i = 0; i < *n; i++)
        if (!strcmp(seen[i], a)) {
            fprintf(stderr, "shardopt-plan: %s is given twice: each option is taken once\n", a);
            exit(2);
        }
    seen[(*n)++] = a;
}

static void opts_parse(int argc, char **argv, struct opts *o)
{
    const char *seen[64]; /* every option at most once: fewer than the known ones */
    int nseen = 0;
    memset(o, 0, sizeof *o);
    o->machine = SHARDOPT_MACHINE_DIR "/h200.json";
    o->rep = o->cp = o->ep = 1;
    o->shard = -1;
    o->mom_es = o->adam_es = 4;
    o->offload = "none";
    o->ns_steps = NS_STEPS;
    o->ns_table = NS_TABLE_QUINTIC;
    o->ns_compute = -1;
    o->joint = 1;
    o->teams = 1;
    o->scale = (struct preset_scale){0, 1, 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--json") || !strcmp(a, "--no-joint") || !strcmp(a, "--moves")) {
            *(a[2] == 'j' ? &o->json : a[2] == 'n' ? &o->joint : &o->moves) = a[2] != 'n';
            once(seen, &nseen, a);
            continue;
        }
        if (v == NULL)
            usage(is_option(a) ? "a value is missing after" : "unknown argument", a);
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
                bad(a, v, "none, optimizer or cpu");
            o->offload = v;
        } else if (!strcmp(a, "--momentum-dtype") || !strcmp(a, "--adam-dtype")) {
            if (strcmp(v, "fp32") && strcmp(v, "bf16"))
                bad(a, v, "fp32 or bf16");
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
                bad(a, v, "standard, gram or auto");
            o->ns_algo = !strcmp(v, "gram") ? 1 : !strcmp(v, "auto") ? 2 : 0;
        } else if (!strcmp(a, "--ns-strategy")) {
            if (v == NULL || (strcmp(v, "gather") && strcmp(v, "sharded") && strcmp(v, "auto")))
                bad(a, v, "gather, sharded or auto");
            o->ns_strategy = !strcmp(v, "sharded") ? NS_MODE_SHARDED
                             : !strcmp(v, "auto")  ? NS_MODE_AUTO
                                                   : NS_MODE_GATHER;
        } else if (!strcmp(a, "--ns-compute")) {
            if (v == NULL || (strcmp(v, "device") && strcmp(v, "fp32") && strcmp(v, "bf16")))
                bad(a, v, "device, fp32 or bf16");
            o->ns_compute = !strcmp(v, "fp32") ? KDT_F32 : !strcmp(v, "bf16") ? KDT_BF16 : -1;
        } else if (!strcmp(a, "--ns-precondition")) {
            if (v == NULL || (strcmp(v, "frobenius") && strcmp(v, "aol")))
                bad(a, v, "frobenius or aol");
            o->ns_steps = !strcmp(v, "aol") ? 4 : NS_STEPS;
            o->ns_table = !strcmp(v, "aol") ? NS_TABLE_AOL : NS_TABLE_QUINTIC;
        } else if (!strcmp(a, "--teams")) {
            o->teams = !strcmp(v, "node") ? 0 : parse_int(v, 1, PLAN_TEAM_MAX, "--teams");
            if (o->teams & (o->teams - 1))
                bad(a, v, "node or a power of two");
        } else if (!strcmp(a, "--cost-rates")) {
            /* two finite rates in (0, 1e9], what config_keys.c accepts for the two keys: the
             * tool plans as commit would, so a rate commit takes is one it takes (strtod took
             * "inf" and ignored what a second comma left) */
            char g[64];
            const char *comma = strchr(v, ',');
            const size_t k = comma != NULL ? (size_t)(comma - v) : 0;
            if (comma == NULL || k >= sizeof g)
                bad(a, v,
                    "GFLOPS,GBPS (both in (0, 1e9]): commit's cost_gemm_gflops and "
                    "cost_net_gbps");
            memcpy(g, v, k);
            g[k] = '\0';
            if (cli_parse_double_in(g, 0, 1e9, &o->cost_gflops) != 0 ||
                cli_parse_double_in(comma + 1, 0, 1e9, &o->cost_gbps) != 0 ||
                !(o->cost_gflops > 0 && o->cost_gbps > 0))
                bad(a, v,
                    "GFLOPS,GBPS (both in (0, 1e9]): commit's cost_gemm_gflops and "
                    "cost_net_gbps");
        } else if (!strcmp(a, "--team-frac")) {
            if (cli_parse_double_in(v, 1e-9, 1, &o->team_frac) != 0)
                bad(a, v, "a number in (0, 1]");
        } else if (!strcmp(a, "--layers"))
            o->scale.layers = parse_int(v, 1, 1 << 16, "--layers");
        else if (!strcmp(a, "--width-div"))
            o->scale.width_div = parse_int(v, 1, 1 << 16, "--width-div");
        else if (!strcmp(a, "--experts-div"))
            o->scale.experts_div = parse_int(v, 1, 1 << 16, "--experts-div");
        else
            usage("unknown argument", a);
        once(seen, &nseen, a); /* after its value's check: a bad value is named first */
    }
    if (o->calibrate == NULL && o->preset == NULL)
        usage("--preset is required", "");
    if (o->calibrate == NULL && o->world == 0 && o->nodes == 0 && o->sweep == NULL)
        usage("one of --world, --nodes and --sweep is required", "");
}

static void print_row(const struct prediction *r)
{
    printf("| %d | %d x %d x %d, ep %d | %.3f | %.4f (%.3f / %.3f) | %.1f | %.1f | %.2f | %.1f | "
           "%.2f | %.2f | %.2f | **%.2f** | %d (%d) / %d%s | %.2f / %.2f |\n",
           r->world, r->rep, r->shard, r->cp, r->ep, r->flops_max / 1e12,
           r->flops_max / r->flops_mean, r->dense_imbalance, r->expert_imbalance,
           r->dense_bytes / 1048576.0, r->expert_bytes / 1048576.0, r->state_bytes / 1073741824.0,
           r->h2d_bytes / 1048576.0, r->t_ns * 1e3, r->t_comm * 1e3, r->t_elem * 1e3, r->step * 1e3,
           r->nteams, r->team_max, r->nmoved, r->union_plan == 1 ? ", union" : "",
           r->t_ns / r->t_perfect, r->step / r->t_perfect);
}

static void print_json(const struct prediction *r, int first)
{
    printf("%s{\"world\": %d, \"dp_replicate\": %d, \"dp_shard\": %d, \"cp\": %d, \"ep\": %d, "
           "\"ns_flops_max\": %.17g, \"ns_flops_mean\": %.17g, \"ns_flops_max_over_mean\": %.6f, "
           "\"ns_max_over_mean_dense_group\": %.6f, \"ns_max_over_mean_expert_group\": %.6f, "
           "\"dense_bytes\": %.0f, "
           "\"expert_bytes\": %.0f, \"state_bytes\": %.0f, \"momentum_bytes\": %.0f, "
           "\"adam_bytes\": %.0f, \"h2d_bytes\": %.0f, "
           "\"dense_group_internode\": %s, \"t_ns\": %.6e, \"t_comm\": %.6e, \"t_elem\": %.6e, "
           "\"step\": %.6e, \"ns_teams\": %d, \"team_size_max\": %d, \"team_bytes\": %.0f, "
           "\"experts_moved\": %d, \"expert_ns_teams\": %d, \"t_perfect\": %.6e, "
           "\"team_sizes\": {",
           first ? "" : ", ", r->world, r->rep, r->shard, r->cp, r->ep, r->flops_max, r->flops_mean,
           r->flops_max / r->flops_mean, r->dense_imbalance, r->expert_imbalance, r->dense_bytes,
           r->expert_bytes, r->state_bytes, r->mom_bytes, r->adam_bytes, r->h2d_bytes,
           r->dense_internode ? "true" : "false", r->t_ns, r->t_comm, r->t_elem, r->step, r->nteams,
           r->team_max, r->team_bytes, r->nmoved, r->xteams, r->t_perfect);
    for (int i = 0, first_k = 1; i < 6; i++)
        if (r->team_sizes[i] > 0) {
            printf("%s\"%d\": %d", first_k ? "" : ", ", 2 << i, r->team_sizes[i]);
            first_k = 0;
        }
    printf("}");
    if (r->union_plan >= 0) /* the planner's cost units: NS FLOPs per iteration */
        printf(", \"union_plan\": %d, \"joint_finish\": %.17g, \"union_finish\": %.17g, "
               "\"joint_step\": %.6e",
               r->union_plan, r->joint_finish, r->union_finish, r->joint_step);
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

    if (cli_check_write(o->calibrate) != 0) { /* before minutes of calibration, not after */
        fprintf(stderr, "shardopt-plan: --calibrate %s: cannot write it: %s\n", o->calibrate,
                strerror(errno));
        return 1;
    }
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
    FILE *f = cli_fopen_write(o->calibrate); /* a FIFO without a reader: refused at once */
    if (f == NULL) {
        fprintf(stderr, "shardopt-plan: --calibrate %s: cannot write it: %s\n", o->calibrate,
                strerror(errno));
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

    cli_stdout_at_exit("shardopt-plan");
    if (cli_argv_refused(argc, argv, "shardopt-plan", 1))
        return 2;
    opts_parse(argc, argv, &o);
    if (o.ns_strategy != NS_MODE_GATHER && o.ns_steps != NS_STEPS) /* config_check_all's rule */
        plan_model_die("--ns-strategy sharded or auto with --ns-precondition aol: the runtime "
                       "refuses it (aol runs on gathered matrices only); use --ns-strategy gather");
    if (o.calibrate != NULL)
        return calibrate(&o);
    plan_model_machine_load(o.machine, &mc);
    if (o.gpn == 0)
        o.gpn = mc.gpus_per_node;
    mc.gpus_per_node = o.gpn;
    if (preset_load(o.preset, SHARDOPT_PRESET_DIR, &o.scale, &p, err, sizeof err) != 0)
        plan_model_die(err);
    /* a world is at most 2^20 ranks, as --world takes (node counts times --gpus-per-node or
     * the machine's would pass it, and wrap int) */
    if (o.sweep != NULL) {
        long long n[256];
        nw = cli_parse_list_in(o.sweep, 1, (1 << 20) / o.gpn, n, 256);
        if (nw < 0) {
            fprintf(stderr,
                    "shardopt-plan: --sweep takes 1 to 256 node counts in 1..%d (%d GPUs per "
                    "node, at most 2^20 ranks) separated by commas, not '%s'\n",
                    (1 << 20) / o.gpn, o.gpn, o.sweep);
            exit(2);
        }
        for (int i = 0; i < nw; i++)
            worlds[i] = (int)n[i] * o.gpn;
    } else {
        if (o.world == 0 && (long long)o.nodes * o.gpn > (1 << 20)) {
            fprintf(stderr,
                    "shardopt-plan: --nodes %d x %d GPUs per node passes 2^20 ranks (what --world "
                    "takes)\n",
                    o.nodes, o.gpn);
            exit(2);
        }
        worlds[nw++] = o.world > 0 ? o.world : o.nodes * o.gpn;
    }
    /* every layout is predicted before a byte is printed: a layout refused part-way through a
     * sweep (ep 32 at 16 GPUs) left half a JSON document on stdout with exit 2; now stdout is
     * empty on a refusal, and whole otherwise */
    struct prediction *rs = calloc((size_t)nw, sizeof *rs);
    if (rs == NULL)
        plan_model_die("out of memory");
    for (int i = 0; i < nw; i++) {
        /* a box per tensor and member of a group (at most the world), the planner's tables beside
         * them: a large preset at 2^20 ranks asks for tens of GiB, refused by name, not tried */
        const double need = 2.0 * (double)p.n * (double)worlds[i] * (double)sizeof(struct plan_box);
        if (!cli_mem_fits(need)) {
            fprintf(stderr,
                    "shardopt-plan: %d ranks: planning %d tensors over a group of up to %d needs "
                    "about %.3g GiB, more than the %.3g GiB this process may have: fewer ranks "
                    "(--world, --nodes, --sweep) or --layers\n",
                    worlds[i], p.n, worlds[i], need / 1073741824.0, cli_mem_total() / 1073741824.0);
            free(rs);
            preset_free(&p);
            return 2;
        }
        if (plan_model_predict(&o, &p, &mc, worlds[i], &rs[i], err, sizeof err) != 0) {
            fprintf(stderr, "shardopt-plan: %d ranks: %s\n", worlds[i], err);
            free(rs);
            preset_free(&p);
            return 2;
        }
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
        if (o.json) {
            print_json(&rs[i], i == 0);
            plan_union_json(&o, &p, &mc,
                            &rs[i]); /* LPT over both groups, the joint plan's baseline */
            printf("}");
        } else
            print_row(&rs[i]);
    }
    if (o.json)
        printf("]}\n");
    free(rs);
    preset_free(&p);
    return 0;
}

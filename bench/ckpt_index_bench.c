/* ckpt_index_bench: one rank's checkpoint index load (format_version 4) in a simulated world of
 * any size, without MPI, files or the state itself (bench/ckpt_index_sim.h): the index.json and
 * the writers' indexes a save of a preset on W ranks writes are synthesized from the layout, and
 * the runtime's own index code loads them for sampled ranks.
 *
 *   ckpt_index_bench [options]      (--help lists them)
 *
 * Each world runs in a child process of its own, so that its peak RSS (getrusage) is its own:
 * the preset, the program and the index work of the sampled ranks one after another. Printed per
 * world: the records the whole world holds (what a version-3 index held, parsed whole on every
 * rank), and for the sampled ranks the most writers' indexes read, records kept, heap peak (glibc's
 * count of bytes in use, above what was in use before) and wall time of the index work, on the
 * layout that saved and on a world a quarter the size. For docs/scaling.md. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/ckpt_index_sim.h"
#include "tools/cli_num.h"

static const char usage[] =
    "usage: ckpt_index_bench [options]\n"
    "  --preset NAME     model preset in bench/presets (glm45-air)\n"
    "  --worlds A,B,...  simulated world sizes (1024,4096,16384)\n"
    "  --ep E            expert-parallel ranks of every world (8)\n"
    "  --v2 A,B,...      also parse the index of format_version 2 (every writer's records in\n"
    "                    index.json, as every rank did before version 4) at these world sizes\n"
    "                    (none: about 1.2 KiB of heap per record)\n"
    "  --save A,B,...    the save side at these world sizes: rank 0's and three writers' heap and\n"
    "                    time for the index (real files under /tmp; none by default)\n"
    "  --help, -h        this text\n";

/* Resident bytes now (/proc/self/statm), MiB: what the child starts with. */
static double rss_now(void)
{
    long pages = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f != NULL) {
        if (fscanf(f, "%ld %ld", &pages, &resident) != 2)
            resident = 0;
        fclose(f);
    }
    return (double)resident * (double)sysconf(_SC_PAGESIZE) / 1048576.0;
}

static void v2_run(const struct preset *p, int world, int ep)
{
    const struct ckpt_sim saved = {p, world, ep, 1};
    struct ckpt_sim_result r;
    const double before = rss_now();
    if (ckpt_sim_load_v2(&saved, &r) != SHARDOPT_OK) {
        fprintf(stderr, "ckpt_index_bench: version 2, world %d: %s\n", world,
                shardopt_last_error());
        exit(1);
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("%6d  %6s  %9lld  %7s  %8lld  %9.1f  %9.1f  %9.1f  %8.3f   (format_version 2)\n", world,
           "any", (long long)r.records, "-", (long long)r.shards, (double)r.heap_peak / 1048576.0,
           before, (double)ru.ru_maxrss / 1024.0, r.seconds);
    fflush(stdout);
}

static void world_run(const struct preset *p, int world, int ep)
{
    const struct ckpt_sim saved = {p, world, ep, 1}, quarter = {p, world / 4, ep, 1};
    const int ranks[3] = {0, world / 2 + 1, world - 1};
    const double before = rss_now();
    for (int c = 0; c < 2; c++) {
        const struct ckpt_sim *loading = c == 0 ? &saved : &quarter;
        struct ckpt_sim_result most = {0};
        double secs = 0;
        for (int i = 0; i < 3; i++) {
            struct ckpt_sim_result r;
            const int rank = ranks[i] * loading->world / world;
            if (ckpt_sim_load_rank(&saved, loading, rank, &r) != SHARDOPT_OK) {
                fprintf(stderr, "ckpt_index_bench: world %d: rank %d: %s\n", world, rank,
                        shardopt_last_error());
                exit(1);
            }
            most.records = r.records;
            most.heap_peak = r.heap_peak > most.heap_peak ? r.heap_peak : most.heap_peak;
            most.writers_read =
                r.writers_read > most.writers_read ? r.writers_read : most.writers_read;
            most.shards = r.shards > most.shards ? r.shards : most.shards;
            secs = r.seconds > secs ? r.seconds : secs;
        }
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        printf("%6d  %6d  %9lld  %7d  %8lld  %9.2f  %9.1f  %9.1f  %8.3f\n", world, loading->world,
               (long long)most.records, most.writers_read, (long long)most.shards,
               (double)most.heap_peak / 1048576.0, before, (double)ru.ru_maxrss / 1024.0, secs);
        fflush(stdout);
    }
}

/* The save side (ckpt_sim_save): three sampled writers' indexes and rank 0's part, real files
 * under /tmp. */
static void save_run(const struct preset *p, int world, int ep)
{
    const struct ckpt_sim s = {p, world, ep, 1};
    struct ckpt_sim_save_result r;
    char scratch[128];
    snprintf(scratch, sizeof scratch, "/tmp/ckpt_index_bench_save_%d", (int)getpid());
    if (ckpt_sim_save(&s, scratch, &r) != SHARDOPT_OK) {
        fprintf(stderr, "ckpt_index_bench: save, world %d: %s\n", world, shardopt_last_error());
        exit(1);
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("%6d  %9.2f  %9.3f  %9lld  %9.2f  %9.3f  %9.1f  %9.1f  %9.1f\n", world,
           (double)r.rank0_heap / 1048576.0, r.rank0_seconds, (long long)r.writer_records,
           (double)r.writer_heap / 1048576.0, r.writer_seconds, (double)r.index_bytes / 1024.0,
           (double)r.writer_bytes / 1024.0, (double)ru.ru_maxrss / 1024.0);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    const char *name = "glm45-air";
    char worlds[256] = "1024,4096,16384", v2[256] = "", save[256] = "", err[256];
    int ep = 8;
    cli_stdout_at_exit("ckpt_index_bench");
    if (cli_argv_refused(argc, argv, "ckpt_index_bench", 1))
        return 2;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(usage, stdout);
            return 0;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "ckpt_index_bench: %s: unknown, or its value missing\n%s", argv[i],
                    usage);
            return 2;
        }
        if (strcmp(argv[i], "--preset") == 0)
            name = argv[++i];
        else if (strcmp(argv[i], "--worlds") == 0)
            snprintf(worlds, sizeof worlds, "%s", argv[++i]);
        else if (strcmp(argv[i], "--v2") == 0)
            snprintf(v2, sizeof v2, "%s", argv[++i]);
        else if (strcmp(argv[i], "--save") == 0)
            snprintf(save, sizeof save, "%s", argv[++i]);
        else if (strcmp(argv[i], "--ep") == 0) {
            if (cli_parse_int_in(argv[++i], 1, 1 << 20, &ep) != 0) {
                fprintf(stderr, "ckpt_index_bench: --ep takes an integer in 1..1048576, not '%s'\n",
                        argv[i]);
                return 2;
            }
        } else {
            fprintf(stderr, "ckpt_index_bench: %s: unknown option\n%s", argv[i], usage);
            return 2;
        }
    }
    struct preset p;
    struct preset_scale sc = {0, 1, 1};
    if (preset_load(name, SHARDOPT_PRESET_DIR, &sc, &p, err, sizeof err) != 0) {
        fprintf(stderr, "ckpt_index_bench: %s\n", err);
        return 2;
    }
    printf("ckpt_index_bench: %s (%d tensors), ep %d; per world, the most of 3 sampled ranks\n",
           name, p.n, ep);
    printf(
        " saved  loaded    records  writers  records  heap peak  RSS start   peak RSS      time\n"
        "  on W    on N   in world     read     kept        MiB        MiB        MiB         s\n");
    fflush(stdout);
    for (int pass = 0; pass < 3; pass++) {
        char *list = pass == 0 ? worlds : pass == 1 ? v2 : save;
        if (pass == 2 && save[0] != '\0')
            printf("\nsave: rank 0 (sizes gather, files checked, index.json built, written, "
                   "published) and the most of 3 sampled writers (records, their index)\n"
                   " ranks  rank0 heap  rank0 time    writer  writer heap  writer time  "
                   "index.json  writer index   peak RSS\n"
                   "              MiB          s   records        MiB           s        KiB "
                   "        KiB        MiB\n");
        fflush(stdout); /* before the children fork: printed once */
        for (char *tok = strtok(list, ","); tok != NULL; tok = strtok(NULL, ",")) {
            int world = 0; /* whole, in range: atoi ran "1024x" as 1024 */
            if (cli_parse_int_in(tok, 1, 1 << 24, &world) != 0 || world < 4 * ep ||
                world % (4 * ep) != 0) {
                fprintf(stderr,
                        "ckpt_index_bench: world '%s': takes an integer in 1..16777216, a multiple "
                        "of 4 x ep (%d)\n",
                        tok, 4 * ep);
                preset_free(&p);
                return 2;
            }
            const pid_t pid = fork();
            if (pid == 0) {
                if (pass == 0)
                    world_run(&p, world, ep);
                else if (pass == 1)
                    v2_run(&p, world, ep);
                else
                    save_run(&p, world, ep);
                _exit(0);
            }
            int st = 0;
            if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
                fprintf(stderr, "ckpt_index_bench: world %d failed\n", world);
                preset_free(&p);
                return 1;
            }
        }
    }
    preset_free(&p);
    return 0;
}

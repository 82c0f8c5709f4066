/* ckpt_bench: checkpoint save and load throughput against a plain sequential write and read of
 * the same bytes to the same directory, measured in the same run.
 *
 *   mpirun -n N ckpt_bench [options]      (--help lists them with their defaults)
 *
 * Each rank's state (after one step, so it is not zero) is saved with shardopt_save and loaded
 * back with shardopt_load on the same layout; the peer is every rank writing the same number of
 * bytes to one file with write() + fsync() (what a save must do at least) and reading them back
 * with pread(), once into a buffer it has used before and once into freshly allocated memory
 * (a load must fill new memory: the state may change only after every rank verified every
 * block, and on this kind of VM first-touch page faults make fresh memory several times slower
 * to fill). GB/s = bytes of all ranks / the slowest rank's time; medians over reps. Every timed
 * phase starts after sync() and a barrier, so one phase's writeback does not land in the next
 * one's fsync. Reads come from the page cache when it holds the files (dropping it needs
 * privileges this tool does not assume), for shardopt and the peers alike. */
/* sync(2) is not in strict POSIX.1-2008 */
#define _DEFAULT_SOURCE
#define _XOPEN_SOURCE 700 /* nftw */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench/bench_util.h"
#include "bench/preset.h"
#include "bench/preset_shards.h"
#include "runtime/runtime.h"
#include "tools/cli.h"

static const char usage[] = "usage: mpirun -n N ckpt_bench [options]\n"
                            "  --preset NAME        model preset in bench/presets (glm45-air)\n"
                            "  --layers L           layers of the preset kept (2)\n"
                            "  --width-div D        hidden and expert widths divided by D (8)\n"
                            "  --experts-div D      experts per layer divided by D (4)\n"
                            "  --ep E               expert-parallel ranks (1)\n"
                            "  --momentum-dtype fp32|bf16\n"
                            "                       Muon momentum dtype (fp32)\n"
                            "  --dir PATH           where the checkpoints and the plain files go\n"
                            "                       (/tmp/shardopt_ckpt_bench)\n"
                            "  --reps R             repetitions, median reported (5)\n"
                            "  --json               one JSON object instead of the table\n"
                            "  --help, -h           this text\n";

static int me, world;

/* Flush everything dirty, then start together. */
static double start_together(void)
{
    sync();
    MPI_Barrier(MPI_COMM_WORLD);
    return MPI_Wtime();
}

/* The slowest rank's time since t0. */
static double timed_max(double t0)
{
    double t = MPI_Wtime() - t0;
    MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return t;
}

static void plain_write(const char *path, const void *buf, size_t n)
{
    int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    const char *p = buf;
    while (fd >= 0 && n > 0) {
        ssize_t w = write(fd, p, n < (16u << 20) ? n : (16u << 20));
        if (w <= 0)
            break;
        p += w;
        n -= (size_t)w;
    }
    if (fd < 0 || fsync(fd) != 0 || close(fd) != 0)
        fprintf(stderr, "ckpt_bench: plain write %s failed\n", path);
}

static void plain_read(const char *path, void *buf, size_t n)
{
    int fd = open(path, O_RDONLY);
    size_t at = 0;
    while (fd >= 0 && at < n) {
        ssize_t r =
            pread(fd, (char *)buf + at, n - at < (16u << 20) ? n - at : (16u << 20), (off_t)at);
        if (r <= 0)
            break;
        at += (size_t)r;
    }
    if (fd < 0 || at != n)
        fprintf(stderr, "ckpt_bench: plain read %s failed\n", path);
    if (fd >= 0)
        close(fd);
}

/* rm -rf, without a shell: --dir went into system("rm -rf '<dir>/repN' && mkdir -p ...") between
 * quotes, so a dir holding a quote ("/tmp/x' '/home") removed what followed it */
static int rm_entry(const char *path, const struct stat *st, int type, struct FTW *f)
{
    (void)st;
    (void)f;
    return type == FTW_DP ? rmdir(path) : unlink(path);
}

static void tree_remove(const char *path)
{
    struct stat st;
    if (lstat(path, &st) == 0 && nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
        fprintf(stderr, "ckpt_bench: cannot remove %s: %s\n", path, strerror(errno));
}

/* mkdir -p */
static int dirs_make(const char *path)
{
    char p[4096];
    snprintf(p, sizeof p, "%s", path);
    for (char *c = p + 1; *c != '\0'; c++)
        if (*c == '/') {
            *c = '\0';
            if (mkdir(p, 0755) != 0 && errno != EEXIST)
                return -1;
            *c = '/';
        }
    if (mkdir(p, 0755) != 0 && errno != EEXIST)
        return -1;
    struct stat st; /* EEXIST: what is there must be a directory (/dev/null is not) */
    if (stat(p, &st) != 0 || !S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    struct preset_scale scale = {2, 8, 4};
    const char *preset = "glm45-air", *dir = "/tmp/shardopt_ckpt_bench", *mom = "fp32";
    int ep = 1, reps = 5, json = 0;
    char err[256], path[8800];

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    cli_stdout_at_exit("ckpt_bench");
    if (cli_argv_refused(argc, argv, "ckpt_bench", me == 0)) {
        MPI_Finalize();
        return 2;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int *iv = !strcmp(a, "--layers")        ? &scale.layers
                  : !strcmp(a, "--width-div")   ? &scale.width_div
                  : !strcmp(a, "--experts-div") ? &scale.experts_div
                  : !strcmp(a, "--ep")          ? &ep
                  : !strcmp(a, "--reps")        ? &reps
                                                : NULL;
        /* --reps past 10^5 would run for days; the rest past 2^16 ask for more than any preset */
        const int hi = iv == &reps ? 100000 : 1 << 16;
        const char **sv = !strcmp(a, "--preset")           ? &preset
                          : !strcmp(a, "--dir")            ? &dir
                          : !strcmp(a, "--momentum-dtype") ? &mom
                                                           : NULL;
        if (cli_is_help(a))
            cli_exit(me, "ckpt_bench", usage, 0, NULL);
        else if (!strcmp(a, "--json"))
            json = 1;
        else if (iv == NULL && sv == NULL)
            cli_exit(me, "ckpt_bench", usage, 2, "unknown argument '%s'", a);
        else if (v == NULL)
            cli_exit(me, "ckpt_bench", usage, 2, "%s needs a value", a);
        else if (iv != NULL)
            cli_int_opt(me, "ckpt_bench", usage, a, v, 1, hi, iv);
        else if (sv != NULL)
            *sv = v;
        i += iv != NULL || sv != NULL;
    }
    if (strcmp(mom, "fp32") != 0 && strcmp(mom, "bf16") != 0)
        cli_exit(me, "ckpt_bench", usage, 2, "--momentum-dtype takes fp32 or bf16, not '%s'", mom);
    /* --dir before anything is timed: one that cannot be made (a file, a FIFO, below one) ends
     * every rank here, not in a save per rep */
    int dir_ok = 1;
    if (me == 0 && (dir[0] == '\0' || dirs_make(dir) != 0))
        dir_ok = -(dir[0] == '\0' ? EINVAL : errno);
    MPI_Bcast(&dir_ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (dir_ok != 1)
        cli_exit(me, "ckpt_bench", usage, 2, "--dir '%s': cannot make it: %s", dir,
                 strerror(-dir_ok));
    struct preset p;
    if (preset_load(preset, SHARDOPT_PRESET_DIR, &scale, &p, err, sizeof err) != 0)
        cli_exit(me, "ckpt_bench", usage, 2, "%s", err);
    /* a rank's share of the parameters, gradients and optimizer state (fp32, momentum and two
     * AdamW moments at most): --layers and the dividers can ask for more than the machine has */
    cli_mem_check(me, "ckpt_bench", usage,
                  "the preset as scaled (--preset, --layers, --width-div, --experts-div)",
                  20.0 * (double)p.total / world);
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    cfg.ep = ep;
    cfg.momentum_dtype = !strcmp(mom, "bf16") ? SHARDOPT_DTYPE_BF16 : SHARDOPT_DTYPE_FP32;
    shardopt_runtime_t rt;
    struct preset_shards ps;
    shardopt_step_args_t args = SHARDOPT_STEP_ARGS_INIT;
    args.lr = 1e-4;
    if (shardopt_init(MPI_COMM_WORLD, &cfg, &rt) != SHARDOPT_OK) {
        /* agreed on every rank (--ep the ranks cannot make): a clean exit, not MPI_Abort */
        if (me == 0)
            fprintf(stderr, "ckpt_bench: %s\n", shardopt_last_error());
        preset_free(&p);
        MPI_Finalize();
        return 1;
    }
    if (preset_shards_register(rt, &p, 0, 7 + (uint64_t)me, NULL, &ps) != SHARDOPT_OK ||
        shardopt_step(rt, &args) != SHARDOPT_OK) {
        fprintf(stderr, "ckpt_bench: %s\n", shardopt_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    const size_t mine = rt->store.bytes;
    unsigned long long total = mine;
    MPI_Allreduce(MPI_IN_PLACE, &total, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    void *scratch = malloc(mine + 1);
    double *ts = malloc(sizeof(double) * 5 * (size_t)reps);

    for (int r = 0; r < reps; r++) {
        char sub[4096];
        snprintf(sub, sizeof sub, "%s/rep%d", dir, r);
        if (me == 0) {
            tree_remove(sub);
            if (dirs_make(sub) != 0)
                fprintf(stderr, "ckpt_bench: cannot prepare %s: %s\n", sub, strerror(errno));
        }
        double t0 = start_together();
        if (shardopt_save(rt, sub) != SHARDOPT_OK)
            fprintf(stderr, "ckpt_bench: save: %s\n", shardopt_last_error());
        ts[5 * r + 0] = timed_max(t0);
        t0 = start_together();
        if (shardopt_load(rt, sub) != SHARDOPT_OK)
            fprintf(stderr, "ckpt_bench: load: %s\n", shardopt_last_error());
        ts[5 * r + 1] = timed_max(t0);
        snprintf(path, sizeof path, "%s/plain-%05d.bin", sub, me);
        t0 = start_together();
        plain_write(path, rt->store.base, mine);
        ts[5 * r + 2] = timed_max(t0);
        t0 = start_together();
        plain_read(path, scratch, mine);
        ts[5 * r + 3] = timed_max(t0);
        t0 = start_together();
        void *fresh = malloc(mine + 1);
        plain_read(path, fresh, mine);
        ts[5 * r + 4] = timed_max(t0);
        free(fresh);
        if (me == 0)
            tree_remove(sub);
    }
    double col[5][64];
    for (int c = 0; c < 5; c++)
        for (int r = 0; r < reps && r < 64; r++)
            col[c][r] = ts[5 * r + c];
    const int n = reps < 64 ? reps : 64;
    const double save_s = bench_median(col[0], n), load_s = bench_median(col[1], n);
    const double write_s = bench_median(col[2], n), read_s = bench_median(col[3], n);
    const double fresh_s = bench_median(col[4], n);
    const double gb = (double)total / 1e9;
    if (me == 0) {
        printf("ckpt_bench: preset %s (%lld params), %d ranks, momentum %s, state %.1f MiB in "
               "all, median of %d reps, dir %s\n\n",
               p.name, (long long)p.total, world, mom, (double)total / 1048576.0, reps, dir);
        printf("| operation | seconds | GB/s | peer | peer GB/s | ratio |\n"
               "|---|---|---|---|---|---|\n");
        printf("| save | %.4f | %.3f | plain write + fsync | %.3f | %.2f |\n", save_s, gb / save_s,
               gb / write_s, write_s / save_s);
        printf("| load | %.4f | %.3f | plain read, reused buffer | %.3f | %.2f |\n", load_s,
               gb / load_s, gb / read_s, read_s / load_s);
        printf("| load | %.4f | %.3f | plain read, fresh memory | %.3f | %.2f |\n", load_s,
               gb / load_s, gb / fresh_s, fresh_s / load_s);
        if (json)
            printf(
                "\n{\"preset\": \"%s\", \"ranks\": %d, \"momentum\": \"%s\", \"bytes\": %llu, "
                "\"save_s\": %.6f, \"load_s\": %.6f, \"plain_write_s\": %.6f, \"plain_read_s\": "
                "%.6f, \"plain_read_fresh_s\": %.6f, \"save_ratio\": %.4f, \"load_ratio\": %.4f, "
                "\"load_ratio_fresh\": %.4f}\n",
                p.name, world, mom, total, save_s, load_s, write_s, read_s, fresh_s,
                write_s / save_s, read_s / load_s, fresh_s / load_s);
    }
    free(scratch);
    free(ts);
    shardopt_finalize(rt);
    preset_shards_free(&ps);
    preset_free(&p);
    MPI_Finalize();
    return 0;
}

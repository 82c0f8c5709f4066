/* compare_driver: shardopt's half of bench/compare_torch.py, on one process (the public API
 * only, as a trainer would call it).
 *
 *   compare_driver manifest --preset NAME [--layers L] [--width-div D] [--experts-div D] OUT.json
 *       the preset's tensors as registered (name, shape, the algorithm the runtime gave it)
 *   compare_driver run DIR [--threads T] [--ns-algorithm standard|gram|auto]
 *       DIR/manifest.json as written above, plus "steps", "lr", "weight_decay" added by the
 *       script; DIR/params.bin (every tensor's fp32 values in manifest order) and
 *       DIR/grads_<k>.bin for k = 0 .. steps-1. Runs the steps with dion-comparable settings
 *       matched to torch.optim.Muon (jordan coefficients, Nesterov, lr scale 0.2*sqrt(max(A,B))
 *       = torch's "match_rms_adamw"), writes DIR/shardopt_params.bin and prints one JSON line
 *       with the median step time. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_util.h"
#include "bench/preset.h"
#include "shardopt.h"
#include "tools/cli_file.h"
#include "tools/cli_num.h"

/* One process (MPI_COMM_SELF): one line and exit 2, without MPI_Abort's banner. */
static void die(const char *what, const char *detail)
{
    fprintf(stderr, "compare_driver: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
    MPI_Finalize();
    exit(2);
}

/* Option a's value v as an integer in [lo, hi], or a line naming both and the range. */
static int int_opt(const char *a, const char *v, int lo, int hi)
{
    int x;
    char msg[256];
    if (cli_parse_int_in(v, lo, hi, &x) != 0) {
        snprintf(msg, sizeof msg, "takes an integer in %d..%d, not '%s'", lo, hi, v);
        die(a, msg);
    }
    return x;
}

/* manifest.json's number at key: present, finite, in [lo, hi], or the run ends naming it. */
static double manifest_num(const cJSON *root, const char *key, double lo, double hi,
                           const char *path)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    char msg[512];
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi)) {
        snprintf(msg, sizeof msg, "\"%s\" must be a number in %g..%g", key, lo, hi);
        die(path, msg);
    }
    return v->valuedouble;
}

static shardopt_runtime_t runtime_new(int threads, const char *ns_algorithm)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_runtime_t rt;
    cfg.ns_coeffs = SHARDOPT_NS_JORDAN; /* torch.optim.Muon's constant (a, b, c) */
    cfg.nesterov = 1;
    cfg.momentum = 0.95;
    cfg.lr_scale = SHARDOPT_LR_SCALE_RMS_NORM;
    cfg.num_threads = threads;
    if (ns_algorithm != NULL &&
        shardopt_config_set(&cfg, "ns_algorithm", ns_algorithm) != SHARDOPT_OK)
        die("--ns-algorithm", shardopt_last_error());
    if (shardopt_init(MPI_COMM_SELF, &cfg, &rt) != SHARDOPT_OK)
        die("init", shardopt_last_error());
    return rt;
}

static int64_t numel(const int64_t *shape, int ndim)
{
    int64_t n = 1;
    for (int d = 0; d < ndim; d++)
        n *= shape[d];
    return n;
}

/* Register t (data and grad pointers may change later); returns the handle. */
static shardopt_param_t reg(shardopt_runtime_t rt, const char *name, int ndim, const int64_t *shape,
                            int expert, void *w, void *g)
{
    shardopt_param_desc_t d = SHARDOPT_PARAM_DESC_INIT;
    shardopt_param_t h;
    d.name = name;
    d.ndim = ndim;
    memcpy(d.shape, shape, sizeof(int64_t) * (size_t)ndim);
    d.placement = expert ? SHARDOPT_PLACEMENT_EXPERT : SHARDOPT_PLACEMENT_DENSE;
    d.data = w;
    d.grad = g;
    if (shardopt_register(rt, &d, &h) != SHARDOPT_OK)
        die("register", shardopt_last_error());
    return h;
}

static int cmd_manifest(int argc, char **argv)
{
    struct preset_scale sc = {0, 1, 1};
    const char *name = NULL, *out = NULL;
    char err[256];
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int *iv = !strcmp(a, "--layers")        ? &sc.layers
                  : !strcmp(a, "--width-div")   ? &sc.width_div
                  : !strcmp(a, "--experts-div") ? &sc.experts_div
                                                : NULL;
        if (iv != NULL || !strcmp(a, "--preset")) {
            if (v == NULL)
                die(a, "needs a value");
            if (iv != NULL)
                *iv = int_opt(a, v, iv == &sc.layers ? 0 : 1, 1 << 16); /* layers 0: all */
            else
                name = v;
            i++;
        } else if (a[0] == '-' || out != NULL) {
            die("unknown or second argument", a);
        } else {
            out = a;
        }
    }
    struct preset p;
    if (name == NULL || out == NULL)
        die("usage", "manifest --preset NAME [--layers L] [--width-div D] [--experts-div D] OUT");
    if (preset_load(name, SHARDOPT_PRESET_DIR, &sc, &p, err, sizeof err) != 0)
        die("preset", err);
    shardopt_runtime_t rt = runtime_new(1, NULL);
    cJSON *root = cJSON_CreateObject(), *ts = cJSON_AddArrayToObject(root, "tensors");
    cJSON_AddStringToObject(root, "preset", p.name);
    for (int i = 0; i < p.n; i++) {
        static float one[1];
        const struct preset_tensor *t = &p.t[i];
        shardopt_param_t h = reg(rt, t->name, t->ndim, t->shape, t->expert, one, NULL);
        shardopt_algo_t algo;
        shardopt_param_get_algo(h, &algo);
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "name", t->name);
        cJSON *sh = cJSON_AddArrayToObject(e, "shape");
        for (int d = 0; d < t->ndim; d++)
            cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t->shape[d]));
        cJSON_AddBoolToObject(e, "expert", t->expert);
        cJSON_AddStringToObject(e, "algo", algo == SHARDOPT_ALGO_MUON ? "muon" : "adamw");
        cJSON_AddItemToArray(ts, e);
    }
    char *text = cJSON_PrintUnformatted(root);
    FILE *f = cli_fopen_write(out); /* a FIFO without a reader: refused, not waited on */
    const int open_errno = f == NULL ? errno : 0;
    int bad = f == NULL || text == NULL || fputs(text, f) < 0;
    bad |= f != NULL && fclose(f) != 0;
    /* released before die(): its exit left them to LeakSanitizer (seen at -O1) */
    free(text);
    cJSON_Delete(root);
    shardopt_finalize(rt);
    preset_free(&p);
    if (bad)
        die(out, open_errno != 0 ? strerror(open_errno) : "cannot write it");
    return 0;
}

static void read_all(const char *path, void *buf, size_t bytes)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL || fread(buf, 1, bytes, f) != bytes)
        die("reading", path);
    fclose(f);
}

static int cmd_run(int argc, char **argv)
{
    const char *dir = NULL;
    int threads = 0;
    const char *ns_algorithm = NULL;
    char path[4096];
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--threads") || !strcmp(a, "--ns-algorithm")) {
            if (v == NULL)
                die(a, "needs a value");
            if (a[2] == 't')
                threads = int_opt(a, v, 0, 1024);
            else
                ns_algorithm = v;
            i++;
        } else if (a[0] == '-' || dir != NULL) {
            die("unknown or second argument", a);
        } else {
            dir = a;
        }
    }
    if (dir == NULL)
        die("usage", "run DIR [--threads T] [--ns-algorithm standard|gram|auto]");
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    /* the script writes manifest.json, but it is a file: every field is checked before it is
     * used (a missing key was a NULL dereference, a fourth dim wrote past shape[3]), and it is
     * strict JSON (a key twice took the first "steps" without a word) */
    char err[4400];
    cJSON *root = NULL;
    if (preset_json_read(path, "reading:", &root, err, sizeof err) != 0)
        die(err, NULL);
    const cJSON *ts = cJSON_GetObjectItemCaseSensitive(root, "tensors"), *e;
    if (!cJSON_IsArray(ts))
        die(path, "not JSON with a \"tensors\" array");
    const int steps = (int)manifest_num(root, "steps", 0, 1000000, path);
    const double lr = manifest_num(root, "lr", 0, 1e6, path);
    const double wd = manifest_num(root, "weight_decay", 0, 1e6, path);
    if (steps != manifest_num(root, "steps", 0, 1000000, path))
        die(path, "\"steps\" must be a whole number");
    const int n = cJSON_GetArraySize(ts);
    int64_t total = 0, *off = calloc((size_t)n + 1, sizeof(int64_t));
    shardopt_runtime_t rt = runtime_new(threads, ns_algorithm);
    shardopt_param_t *h = calloc((size_t)n + 1, sizeof *h);
    if (off == NULL || h == NULL)
        die("out of memory", NULL);
    int i = 0;
    cJSON_ArrayForEach(e, ts)
    {
        int64_t shape[3] = {1, 1, 1};
        const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape"), *d;
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name");
        int nd = 0;
        char msg[160];
        snprintf(msg, sizeof msg,
                 "tensor %d needs a \"name\" and a \"shape\" of 1 to 3 whole numbers in 1..2^40 "
                 "(2^40 elements in all)",
                 i);
        if (!cJSON_IsString(nm) || !cJSON_IsArray(sh) || cJSON_GetArraySize(sh) < 1 ||
            cJSON_GetArraySize(sh) > 3)
            die(path, msg);
        cJSON_ArrayForEach(d, sh)
        {
            const double x = cJSON_IsNumber(d) ? d->valuedouble : -1;
            if (!(x >= 1 && x <= 1099511627776.0) || x != (double)(int64_t)x)
                die(path, msg);
            shape[nd++] = (int64_t)x;
        }
        const int64_t k = numel(shape, nd);
        if (k > ((int64_t)1 << 40) || total > ((int64_t)1 << 40))
            die(path, msg);
        off[i] = total;
        total += k;
        h[i] = reg(rt, nm->valuestring, nd, shape,
                   cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "expert")), &off[i], NULL);
        i++;
    }
    if (!cli_mem_fits(8.0 * (double)total))
        die(path, "its tensors need more memory than this process may have");
    float *w = malloc(sizeof(float) * (size_t)total), *g = malloc(sizeof(float) * (size_t)total);
    if (w == NULL || g == NULL)
        die("out of memory", NULL);
    snprintf(path, sizeof path, "%s/params.bin", dir);
    read_all(path, w, sizeof(float) * (size_t)total);
    for (i = 0; i < n; i++)
        shardopt_param_set_pointers(h[i], w + off[i], g + off[i]);
    if (shardopt_commit(rt) != SHARDOPT_OK)
        die("commit", shardopt_last_error());
    double *t = calloc((size_t)steps + 1, sizeof(double));
    for (int s = 0; s < steps; s++) {
        snprintf(path, sizeof path, "%s/grads_%d.bin", dir, s);
        read_all(path, g, sizeof(float) * (size_t)total);
        shardopt_step_args_t a = SHARDOPT_STEP_ARGS_INIT;
        a.lr = lr;
        a.weight_decay = wd;
        if (shardopt_step(rt, &a) != SHARDOPT_OK)
            die("step", shardopt_last_error());
        shardopt_stats_t st = SHARDOPT_STATS_INIT;
        shardopt_get_stats(rt, &st);
        t[s] = st.seconds_last;
    }
    snprintf(path, sizeof path, "%s/shardopt_params.bin", dir);
    FILE *f = cli_fopen_write(path);
    if (f == NULL || fwrite(w, sizeof(float), (size_t)total, f) != (size_t)total || fclose(f) != 0)
        die("writing", path);
    shardopt_stats_t st = SHARDOPT_STATS_INIT;
    shardopt_get_stats(rt, &st);
    printf(
        "{\"steps\": %d, \"median_step_s\": %.6f, \"ns_compute\": \"%s\", \"kernels\": \"%s\"}\n",
        steps, bench_median(t, steps), st.ns_compute == SHARDOPT_NS_COMPUTE_BF16 ? "bf16" : "fp32",
        st.kernels);
    shardopt_finalize(rt);
    cJSON_Delete(root);
    free(w);
    free(g);
    free(t);
    free(h);
    free(off);
    return 0;
}

int main(int argc, char **argv)
{
    int rc = 2;
    MPI_Init(&argc, &argv);
    cli_stdout_at_exit("compare_driver");
    if (cli_argv_refused(argc, argv, "compare_driver", 1)) {
        MPI_Finalize();
        return 2;
    }
    if (argc >= 2 && !strcmp(argv[1], "manifest"))
        rc = cmd_manifest(argc - 2, argv + 2);
    else if (argc >= 2 && !strcmp(argv[1], "run"))
        rc = cmd_run(argc - 2, argv + 2);
    else
        fprintf(stderr, "compare_driver: the first argument is manifest or run, not '%s'\n",
                argc >= 2 ? argv[1] : "");
    MPI_Finalize();
    return rc;
}

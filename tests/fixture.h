/* Small helpers for tests that build a runtime on one process. */
#ifndef SHARDOPT_TEST_FIXTURE_H
#define SHARDOPT_TEST_FIXTURE_H

#include <dirent.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shardopt.h"
#include "test.h"

static inline shardopt_runtime_t fixture_runtime_on(MPI_Comm comm, const shardopt_config_t *cfg)
{
    shardopt_runtime_t rt = NULL;
    if (shardopt_init(comm, cfg, &rt) != SHARDOPT_OK) {
        fprintf(stderr, "init failed: %s\n", shardopt_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    return rt;
}

/* Remove a directory tree the test made (checkpoints). */
static inline void fixture_rmtree(const char *path)
{
    DIR *d = opendir(path);
    struct dirent *e;
    char p[1024];
    struct stat st;

    if (d == NULL) {
        unlink(path);
        return;
    }
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if (snprintf(p, sizeof p, "%s/%s", path, e->d_name) >= (int)sizeof p)
            continue; /* longer than any path a test makes */
        if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode))
            fixture_rmtree(p);
        else
            unlink(p);
    }
    closedir(d);
    rmdir(path);
}

/* A runtime on this process alone. */
static inline shardopt_runtime_t fixture_runtime(const shardopt_config_t *cfg)
{
    return fixture_runtime_on(MPI_COMM_SELF, cfg);
}

/* A config whose Muon step is W -= lr * O with O the Newton-Schulz output of this step's gradient
 * alone (momentum 0, no weight decay, no lr scaling, an fp32 exchange, fp32 Newton-Schulz), one
 * thread and no SHARDOPT_* variables: what a test compares with an oracle run on the gradient
 * itself. Callers set the Newton-Schulz keys they test. */
static inline shardopt_config_t fixture_bare_muon_config(void)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    cfg.apply_env = 0;
    cfg.num_threads = 1;
    cfg.ns_compute = SHARDOPT_NS_COMPUTE_FP32;
    cfg.comm_dtype = SHARDOPT_DTYPE_FP32;
    cfg.momentum = 0;
    cfg.weight_decay = 0;
    cfg.lr_scale = SHARDOPT_LR_SCALE_NONE;
    return cfg;
}

static inline shardopt_param_desc_t fixture_desc(const char *name, int ndim, int64_t d0, int64_t d1,
                                                 int64_t d2, void *data, const void *grad)
{
    shardopt_param_desc_t d = SHARDOPT_PARAM_DESC_INIT;
    d.name = name;
    d.ndim = ndim;
    d.shape[0] = d0;
    d.shape[1] = d1;
    d.shape[2] = d2;
    d.data = data;
    d.grad = grad;
    return d;
}

#endif

/* What test_ckpt_hostile.c and test_ckpt_hostile_save.c share: the config they run, and
 * clearing and reading the directories they damage. */
#ifndef SHARDOPT_TEST_CKPT_HOSTILE_H
#define SHARDOPT_TEST_CKPT_HOSTILE_H

#include "model_run.h"

__attribute__((unused)) static shardopt_config_t cfg_of(int bf16)
{
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    cfg.num_threads = 1;
    if (bf16)
        cfg.momentum_dtype = SHARDOPT_DTYPE_BF16;
    return cfg;
}

__attribute__((unused)) static void dir_clear(const char *dir)
{
    if (me == 0) {
        char cmd[4200];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd) != 0)
            fprintf(stderr, "cannot clear %s\n", dir);
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

/* A directory of this run's own (rank 0 makes it with mkdtemp, every rank gets its name): fixed
 * /tmp names collided between concurrent runs (checkouts, ctest -j). dir_clear removes it. */
__attribute__((unused)) static void scratch_dir(char *dir, size_t n, const char *tag)
{
    if (me == 0) {
        snprintf(dir, n, "/tmp/shardopt_%s_XXXXXX", tag);
        if (mkdtemp(dir) == NULL) {
            perror("mkdtemp");
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    MPI_Bcast(dir, (int)n, MPI_CHAR, 0, MPI_COMM_WORLD);
}

__attribute__((unused)) static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)n + 1);
    if (fread(text, 1, (size_t)n, f) != (size_t)n)
        fprintf(stderr, "read of %s failed\n", path);
    text[n] = '\0';
    fclose(f);
    *len = (size_t)n;
    return text;
}

__attribute__((unused)) static void put(const char *path, const char *bytes, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(bytes, 1, n, f) != n)
        fprintf(stderr, "write of %s failed\n", path);
    if (f != NULL)
        fclose(f);
}

#endif

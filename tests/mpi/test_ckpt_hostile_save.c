/* Saves a hostile neighbour or a broken cluster gets in the way of, beside test_ckpt_hostile.c's
 * tampered loads: a FIFO or a hard link planted in the save's temporary directory fails the save
 * at once (the FIFO's open waited for a reader for good, the link's target was truncated), a
 * directory under a regular file is refused, and where this process may mount (root in a
 * container that allows it) a full filesystem and a read-only one fail the save with the
 * previous checkpoint loadable; a checkpoint directory holding a step's index.json beside latest
 * is refused by the save and the load alike. Layout: dp_shard over the world (2). */
#include <dirent.h>
#include <errno.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_hostile.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/checkpoint_index.h"

static const char *plant_dir;
static int plant_done;

/* The save's temporary directory under plant_dir (rank 0 made it before any writer runs). */
static int tmp_dir_find(char *out, size_t n)
{
    DIR *d = opendir(plant_dir);
    struct dirent *e;
    int found = 0;
    while (d != NULL && (e = readdir(d)) != NULL)
        if (strncmp(e->d_name, ".tmp-step-", 10) == 0) {
            snprintf(out, n, "%s/%s", plant_dir, e->d_name);
            found = 1;
        }
    if (d != NULL)
        closedir(d);
    return found;
}

/* a FIFO where this writer's index is about to be created (no process reads it) */
static void plant_writer_index_fifo(void)
{
    char tmp[4200], p[4300];
    if (plant_done || !tmp_dir_find(tmp, sizeof tmp))
        return;
    plant_done = 1;
    snprintf(p, sizeof p, "%s/rank-%05d.index.json", tmp, me);
    if (mkfifo(p, 0644) != 0)
        fprintf(stderr, "mkfifo %s: %s\n", p, strerror(errno));
}

/* a FIFO where rank 0 is about to write index.json */
static void plant_index_fifo(const char *tmp)
{
    char p[4300];
    snprintf(p, sizeof p, "%s/index.json", tmp);
    if (mkfifo(p, 0644) != 0)
        fprintf(stderr, "mkfifo %s: %s\n", p, strerror(errno));
}

/* a hard link to the previous step's index.json where rank 0 is about to write index.json */
static void plant_index_link(const char *tmp)
{
    char p[4300], prev[4300];
    snprintf(p, sizeof p, "%s/index.json", tmp);
    snprintf(prev, sizeof prev, "%s/step-00000003/index.json", plant_dir);
    if (link(prev, p) != 0)
        fprintf(stderr, "link %s: %s\n", p, strerror(errno));
}

static void expect_previous_loads(struct run *d, const char *dir)
{
    char p[4200];
    snprintf(p, sizeof p, "%s/latest", dir);
    size_t n;
    char *latest = me == 0 ? slurp(p, &n) : NULL;
    if (me == 0)
        EXPECT_TRUE(latest != NULL && strncmp(latest, "step-00000003", 13) == 0);
    free(latest);
    EXPECT_EQ_INT(shardopt_load(d->rt, dir), SHARDOPT_OK);
    if (me == 0) { /* no temporary directory left behind */
        const char *saved = plant_dir;
        plant_dir = dir;
        EXPECT_TRUE(!tmp_dir_find(p, sizeof p));
        plant_dir = saved;
    }
}

TEST(a_fifo_or_link_planted_in_the_temporary_directory_fails_the_save_at_once)
{
    setup();
    char dir[64];
    scratch_dir(dir, sizeof dir, "ckpt_hostile_fifo");
    struct run d = {0};
    dir_clear(dir);
    run_setup(&d, MPI_COMM_WORLD, cfg_of(0), 0);
    run_steps(&d, 1, 3);
    if (shardopt_save(d.rt, dir) != SHARDOPT_OK) {
        EXPECT_STR_CONTAINS(shardopt_last_error(), "(the first save succeeds)");
        run_free(&d);
        return;
    }
    run_steps(&d, 4, 4);
    alarm(120); /* a blocking open waits for a reader for good: fail rather than hang */
    /* a writer's index (rank 1's: the message reaches every rank) */
    plant_dir = dir;
    plant_done = 0;
    if (me == world - 1)
        ckpt_index_test_probe = plant_writer_index_fifo;
    EXPECT_EQ_INT(shardopt_save(d.rt, dir), SHARDOPT_ERR_IO);
    ckpt_index_test_probe = NULL;
    EXPECT_STR_CONTAINS(shardopt_last_error(),
                        ".index.json: File exists (put there after the save");
    expect_previous_loads(&d, dir);
    /* the top-level index, written by rank 0 once the writers are done */
    run_steps(&d, 4, 4);
    if (me == 0)
        ckpt_test_before_publish = plant_index_fifo;
    EXPECT_EQ_INT(shardopt_save(d.rt, dir), SHARDOPT_ERR_IO);
    ckpt_test_before_publish = NULL;
    EXPECT_STR_CONTAINS(shardopt_last_error(),
                        "/index.json: File exists (put there after the save");
    expect_previous_loads(&d, dir);
    /* a hard link to the previous step's index.json: truncated and rewritten with the new
     * step's text (O_TRUNC), the save then published, and the previous step no longer loaded */
    run_steps(&d, 4, 4);
    if (me == 0)
        ckpt_test_before_publish = plant_index_link;
    EXPECT_EQ_INT(shardopt_save(d.rt, dir), SHARDOPT_ERR_IO);
    ckpt_test_before_publish = NULL;
    EXPECT_STR_CONTAINS(shardopt_last_error(), "/index.json: File exists");
    expect_previous_loads(&d, dir);
    alarm(0);
    run_free(&d);
    dir_clear(dir);
}

/* A path through a regular file (ENOTDIR): refused on every rank, nothing created. */
TEST(a_save_under_a_regular_file_is_refused_on_every_rank)
{
    setup();
    char dir[64], file[96], under[128];
    struct run d = {0};
    scratch_dir(dir, sizeof dir, "ckpt_hostile_file");
    snprintf(file, sizeof file, "%s/file", dir);
    snprintf(under, sizeof under, "%s/ckpt", file);
    if (me == 0)
        put(file, "x", 1);
    MPI_Barrier(MPI_COMM_WORLD);
    run_setup(&d, MPI_COMM_WORLD, cfg_of(0), 0);
    run_steps(&d, 1, 1);
    EXPECT_EQ_INT(shardopt_save(d.rt, under), SHARDOPT_ERR_IO);
    EXPECT_STR_CONTAINS(shardopt_last_error(), under);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "Not a directory");
    EXPECT_EQ_INT(shardopt_load(d.rt, under), SHARDOPT_ERR_IO);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "Not a directory");
    EXPECT_EQ_INT(run_steps(&d, 2, 2), SHARDOPT_OK);
    run_free(&d);
    MPI_Barrier(MPI_COMM_WORLD);
    dir_clear(dir);
}

/* Copies every file of DIR/step-00000003 into DIR (remove: removes those copies); the count. */
static int stray_copies(const char *dir, int remove)
{
    char p[4300], q[4300];
    int count = 0;
    size_t n;
    snprintf(p, sizeof p, "%s/step-00000003", dir);
    DIR *d = opendir(p);
    for (struct dirent *e; d != NULL && (e = readdir(d)) != NULL;) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(p, sizeof p, "%s/step-00000003/%s", dir, e->d_name);
        snprintf(q, sizeof q, "%s/%s", dir, e->d_name);
        char *bytes = remove ? NULL : slurp(p, &n);
        if (remove)
            unlink(q);
        else if (bytes != NULL)
            put(q, bytes, n);
        free(bytes);
        count++;
    }
    if (d != NULL)
        closedir(d);
    return count;
}

/* A checkpoint directory that holds index.json beside latest: a step's files copied up into
 * it (here step 3's, so that index loads). A load took DIR for a step directory and loaded
 * that stale step 3, silently, where latest named step 4; a save into DIR published a step no
 * load of DIR would read. Both refused on every rank, the state unchanged; with the stray files
 * gone the save and the load go on. */
TEST(a_checkpoint_directory_holding_a_step_index_is_refused_by_save_and_load)
{
    setup();
    char dir[64] = "/tmp/shardopt_stray_index_XXXXXX", p[4300];
    struct run d = {0};
    unsigned char *before, *after;
    size_t nb, na;
    if (me == 0 && mkdtemp(dir) == NULL)
        fprintf(stderr, "mkdtemp: %s\n", strerror(errno));
    MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    run_setup(&d, MPI_COMM_WORLD, cfg_of(0), 0);
    run_steps(&d, 1, 3);
    EXPECT_EQ_INT(shardopt_save(d.rt, dir), SHARDOPT_OK);
    run_steps(&d, 4, 4);
    EXPECT_EQ_INT(shardopt_save(d.rt, dir), SHARDOPT_OK);
    if (me == 0) /* every file of step 3 (its index, records and rank files), copied up */
        EXPECT_EQ_INT(stray_copies(dir, 0), 2 + 3 * world); /* one writer a rank */
    MPI_Barrier(MPI_COMM_WORLD);
    run_steps(&d, 5, 5);
    snapshot(&d, &before, &nb);
    EXPECT_EQ_INT(shardopt_load(d.rt, dir), SHARDOPT_ERR_CORRUPT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "holds both index.json (as a step directory does) "
                                               "and latest");
    EXPECT_STR_CONTAINS(shardopt_last_error(), dir);
    snapshot(&d, &after, &na);
    EXPECT_TRUE(na == nb && memcmp(before, after, nb) == 0);
    free(after);
    EXPECT_EQ_INT(shardopt_save(d.rt, dir), SHARDOPT_ERR_IO);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "holds index.json, as a step directory does");
    snprintf(p, sizeof p, "%s/step-00000005", dir);
    EXPECT_TRUE(access(p, F_OK) != 0); /* nothing published */
    if (me == 0)
        stray_copies(dir, 1);
    MPI_Barrier(MPI_COMM_WORLD);
    EXPECT_EQ_INT(shardopt_save(d.rt, dir), SHARDOPT_OK);
    run_steps(&d, 6, 6);
    EXPECT_EQ_INT(shardopt_load(d.rt, dir), SHARDOPT_OK); /* step 5's, as latest names */
    shardopt_stats_t st = SHARDOPT_STATS_INIT;
    EXPECT_EQ_INT(shardopt_get_stats(d.rt, &st), SHARDOPT_OK);
    EXPECT_EQ_INT(st.steps, 5);
    free(before);
    run_free(&d);
    dir_clear(dir);
}

static void full_and_read_only(const char *mnt);

/* Rank 0 alone, on a tmpfs of its own (mounted on a directory mkdtemp made, unmounted and
 * removed at the end): too small for a second save (ENOSPC), then remounted read-only (EROFS, which
 * stops root where chmod does not). A note and nothing more where this process may not mount. */
TEST(a_full_or_read_only_filesystem_fails_the_save_and_keeps_the_previous)
{
    setup();
    char mnt[64] = "/tmp/shardopt_ckpt_hostile_mnt_XXXXXX";
    int can = 0, err = 0;
    if (me == 0) {
        if (mkdtemp(mnt) == NULL)
            perror("mkdtemp");
        can = mount("tmpfs", mnt, "tmpfs", MS_NOSUID | MS_NODEV, "size=96k") == 0;
        err = errno;
        if (!can)
            fprintf(stderr,
                    "note: cannot mount a tmpfs at %s (%s): the full and read-only "
                    "filesystem probes did not run\n",
                    mnt, strerror(err));
    }
    if (me == 0 && !can)
        EXPECT_TRUE(err == EPERM || err == EACCES || err == ENODEV); /* not allowed here */
    if (me == 0 && can) {
        full_and_read_only(mnt);
        umount2(mnt, MNT_DETACH);
    }
    if (me == 0)
        rmdir(mnt);
    /* every rank learns whether rank 0's probe passed (a rank that checked nothing fails) */
    int failures = test_failures;
    MPI_Bcast(&failures, 1, MPI_INT, 0, MPI_COMM_WORLD);
    EXPECT_EQ_INT(failures, 0);
}

static void full_and_read_only(const char *mnt)
{
    struct run d = {0};
    run_setup(&d, MPI_COMM_SELF, cfg_of(0), 0);
    run_steps(&d, 1, 3);
    if (shardopt_save(d.rt, mnt) != SHARDOPT_OK) {
        EXPECT_STR_CONTAINS(shardopt_last_error(), "(the first save succeeds)");
        run_free(&d);
        return;
    }
    run_steps(&d, 4, 4);
    unsigned char *before, *after;
    size_t nb, na;
    snapshot(&d, &before, &nb);
    EXPECT_EQ_INT(shardopt_save(d.rt, mnt), SHARDOPT_ERR_IO);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "No space left on device");
    snapshot(&d, &after, &na);
    EXPECT_TRUE(na == nb && memcmp(before, after, nb) == 0);
    free(after);
    EXPECT_TRUE(mount(NULL, mnt, NULL, MS_REMOUNT | MS_RDONLY, NULL) == 0);
    EXPECT_EQ_INT(shardopt_save(d.rt, mnt), SHARDOPT_ERR_IO);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "Read-only file system");
    EXPECT_STR_CONTAINS(shardopt_last_error(), mnt);
    snapshot(&d, &after, &na);
    EXPECT_TRUE(na == nb && memcmp(before, after, nb) == 0);
    /* the previous checkpoint loads from the read-only filesystem, and the run steps on */
    EXPECT_EQ_INT(shardopt_load(d.rt, mnt), SHARDOPT_OK);
    EXPECT_EQ_INT(run_steps(&d, 4, 4), SHARDOPT_OK);
    free(before);
    free(after);
    run_free(&d);
}

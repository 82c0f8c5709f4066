/* The model on SHARDOPT_TEST_LAYOUT with comm_timeout_s = SHARDOPT_TEST_TIMEOUT, driven by
 * hang_driver.sh through a rank that stops making progress (SHARDOPT_FAULT=hang@...):
 *   step  N  : N steps (the fault, from the environment, fires on its own)
 *   save  DIR: 2 steps, save DIR (complete), then `hang@<SHARDOPT_TEST_HANG_SITE>:1` armed on
 *              runtime rank SHARDOPT_TEST_HANG_RANK, 2 more steps and a second save
 *   load  DIR: load DIR's latest checkpoint and print the steps it holds
 *   init  -  : rank SHARDOPT_TEST_HANG_RANK never reaches init (stuck before it, as a rank still
 *              loading its data); the others must not wait in init's first agreement for ever.
 *              Without SHARDOPT_TEST_HANG_RANK: init, register and commit, for a fault in init
 *              from the environment (hang@init.split)
 *   groups - : init_from_groups with a trainer's dense shard and replicate groups (the EP and
 *              expert shard groups derived), for hang@init.dup from the environment
 *   nccl  -  : (hang_run_nccl: the runtime over the mock NCCL) init, then the NCCL communicators
 *              as init makes them on a device, for hang@nccl.id from the environment
 * Prints "finished" only when the run ends by itself: the driver requires that it does not. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/fault.h"
#include "model_run.h"

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    setup();
    if (argc < 3) {
        fprintf(stderr,
                "usage: hang_run step N | save DIR | load DIR | init - | groups - | nccl -\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    const char *mode = argv[1], *t = getenv("SHARDOPT_TEST_TIMEOUT");
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    cfg.num_threads = 1;
    cfg.comm_timeout_s = t != NULL ? atof(t) : 10;
    const char *late = getenv("SHARDOPT_TEST_HANG_RANK");
    if (strcmp(mode, "init") == 0 && late != NULL && atoi(late) == me) {
        fprintf(stderr, "hang_run: rank %d stays out of init\n", me);
        for (;;) /* until the others' MPI_Abort ends the job */
            sleep(1);
    }
    if (strcmp(mode, "groups") == 0) { /* the trainer's groups from the layout */
        const int dense = world / L_rep;
        shardopt_groups_t grp = SHARDOPT_GROUPS_INIT;
        MPI_Comm_split(MPI_COMM_WORLD, me / dense, me, &grp.dense_shard);
        MPI_Comm_split(MPI_COMM_WORLD, me % dense, me, &grp.replicate);
        shardopt_runtime_t rt = NULL;
        shardopt_status_t st = shardopt_init_from_groups(&grp, &cfg, &rt);
        if (me == 0)
            printf("hang_run: finished (%s)\n", shardopt_status_string(st));
        shardopt_finalize(rt);
        MPI_Comm_free(&grp.dense_shard);
        MPI_Comm_free(&grp.replicate);
        MPI_Finalize();
        return st == SHARDOPT_OK ? 0 : 1;
    }
#ifdef SHARDOPT_TEST_NCCL_MOCK
    if (strcmp(mode, "nccl") == 0) { /* init, then its NCCL communicators (test_device_sim's way) */
        cfg.dp_replicate = L_rep;
        cfg.dp_shard = L_shard;
        cfg.cp = L_cp;
        cfg.ep = L_ep;
        shardopt_runtime_t rt = fixture_runtime_on(MPI_COMM_WORLD, &cfg);
        shardopt_status_t st = rt_nccl_create(rt);
        if (me == 0)
            printf("hang_run: finished (%s)\n", shardopt_status_string(st));
        shardopt_finalize(rt);
        MPI_Finalize();
        return st == SHARDOPT_OK ? 0 : 1;
    }
#endif
    struct run r = {0};
    shardopt_status_t st = run_setup(&r, MPI_COMM_WORLD, cfg, 0);
    if (st == SHARDOPT_OK && strcmp(mode, "step") == 0) {
        st = run_steps(&r, 1, atoi(argv[2]));
    } else if (st == SHARDOPT_OK && strcmp(mode, "save") == 0) {
        st = run_steps(&r, 1, 2);
        if (st == SHARDOPT_OK)
            st = shardopt_save(r.rt, argv[2]);
        if (me == 0)
            printf("hang_run: saved step 2 (%s)\n", shardopt_status_string(st));
        const char *site = getenv("SHARDOPT_TEST_HANG_SITE"),
                   *who = getenv("SHARDOPT_TEST_HANG_RANK");
        char spec[96];
        snprintf(spec, sizeof spec, "hang@%s:1", site != NULL ? site : "ckpt.write");
        if (who != NULL && atoi(who) == me)
            fault_arm(spec);
        if (st == SHARDOPT_OK)
            st = run_steps(&r, 3, 4);
        if (st == SHARDOPT_OK)
            st = shardopt_save(r.rt, argv[2]);
    } else if (st == SHARDOPT_OK && strcmp(mode, "load") == 0) {
        st = shardopt_load(r.rt, argv[2]);
        shardopt_stats_t s = SHARDOPT_STATS_INIT;
        shardopt_get_stats(r.rt, &s);
        if (me == 0)
            printf("hang_run: loaded (%s), checkpoint step %llu\n", shardopt_status_string(st),
                   (unsigned long long)s.steps);
    }
    if (me == 0)
        printf("hang_run: finished (%s)\n", shardopt_status_string(st));
    run_free(&r);
    MPI_Finalize();
    return st == SHARDOPT_OK ? 0 : 1;
}

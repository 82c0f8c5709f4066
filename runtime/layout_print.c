/* shardopt_layout_print: every rank's coordinates and group ranks, printed by rank 0. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"
#include "base/status.h"
#include "runtime/comm/comm_wait.h"
#include "runtime/runtime.h"

#define LINE 160

static shardopt_status_t layout_print_run(shardopt_runtime_t rt, FILE *stream)
{
    char line[LINE];
    char *dense_lines = NULL, *all = NULL;
    const struct groups *g;
    int ok = 1;

    if (rt == NULL)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "layout_print: NULL runtime");
    if (rt_mpi_live("layout_print") != SHARDOPT_OK)
        return SHARDOPT_ERR_STATE;
    g = &rt->groups;
    /* the call's opening agreement: a rank in another collective call is found here */
    const shardopt_status_t opened = groups_agree_call(g, SHARDOPT_OK, "layout_print");
    if (opened != SHARDOPT_OK)
        return opened;
    memset(line, 0, sizeof line);
    snprintf(line, sizeof line,
             "rank %4d: replica %d, dp_shard %d, cp %d | dense %d/%d, ep %d/%d, expert shard "
             "%d/%d, replicate %d/%d",
             g->me.rank, g->me.rep, g->me.shard, g->me.cp_index, g->me.d, g->mesh.dense,
             g->me.ep_rank, g->mesh.ep, g->me.xs_rank, mesh_xs_size(&g->mesh), g->me.rep,
             g->mesh.dp_replicate);
    /* lines gather to dense rank 0 of each replica, then to replica 0: rank order. Every rank
     * learns first whether the gatherers have room: a gather into NULL would crash */
    size_t bytes = 0;
    if (g->me.d == 0)
        ok = (dense_lines = mem_malloc(bytes = (size_t)g->mesh.dense * LINE)) != NULL;
    if (g->me.rank == 0 && ok)
        ok = (all = mem_malloc(bytes = (size_t)g->mesh.world * LINE)) != NULL;
    const shardopt_status_t status =
        groups_agree(g,
                     ok ? SHARDOPT_OK
                        : log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                                   "layout_print: rank %d: out of memory allocating %zu bytes "
                                   "for the lines",
                                   g->me.rank, bytes),
                     "layout_print");
    if (status != SHARDOPT_OK) {
        free(all);
        free(dense_lines);
        return status;
    }
    comm_phase("layout_print", -1);
    comm_gather(g, g->dense, line, LINE, MPI_CHAR, dense_lines, 0, "gather of lines");
    if (g->me.d == 0)
        comm_gather(g, g->rep, dense_lines, LINE * g->mesh.dense, MPI_CHAR, all, 0,
                    "gather of lines");
    /* a stream that cannot take the text (a full disk, /dev/full, a stream opened for reading)
     * returned OK with the output lost: rank 0 checks each write and the flush, and every rank
     * returns what it found */
    shardopt_status_t wrote = SHARDOPT_OK;
    if (g->me.rank == 0) {
        if (stream == NULL)
            stream = stdout;
        int failed = fprintf(stream,
                             "shardopt layout: %d ranks = dp_replicate %d x dp_shard %d x cp %d, "
                             "ep %d\n",
                             g->mesh.world, g->mesh.dp_replicate, g->mesh.dp_shard, g->mesh.cp,
                             g->mesh.ep) < 0;
        for (int r = 0; r < g->mesh.world && !failed; r++)
            failed = fprintf(stream, "  %s\n", all + (size_t)r * LINE) < 0;
        failed = failed || fflush(stream) != 0;
        if (failed)
            wrote = log_fail(SHARDOPT_ERR_IO,
                             "layout_print: rank 0: writing to the stream failed (%s): the "
                             "layout is lost or cut; nothing else was done",
                             strerror(errno));
    }
    free(all);
    free(dense_lines);
    return groups_agree(g, wrote, "layout_print");
}

shardopt_status_t shardopt_layout_print(shardopt_runtime_t rt, FILE *stream)
{
    /* its collectives on the runtime's communicators while another thread's call runs its own
     * on them would be erroneous MPI (they must be ordered): refused, as the other calls are */
    const shardopt_status_t claimed = rt_claim(rt, "layout_print");
    if (claimed != SHARDOPT_OK)
        return claimed;
    const shardopt_status_t status = layout_print_run(rt, stream);
    rt_release(rt);
    return status;
}

/* Sharded Newton-Schulz's driver (ns_sharded.h): the sharded strategy's matrices and the teams'
 * blocks through the iterations of ns_sharded_iter.c, and the Muon phase's agreement. */
#include "runtime/step/ns_sharded.h"

#include <stdint.h>

#include "base/status.h"
#include "kernels/clock.h"
#include "kernels/dtype.h"
#include "runtime/step/ns_sharded_sum.h"
#include "runtime/step/offload_exec.h"

/* One matrix k of a sharded parameter, this rank's piece at element `off` of its shard, its
 * all-reduces over comm by MPI, or over nccl (the group's NCCL communicator) when not NULL. */
static shardopt_status_t matrix_run(shardopt_runtime_t rt, struct shardopt_param *p, MPI_Comm comm,
                                    struct nccl_group *nccl, size_t off,
                                    const struct muon_scalars *s)
{
    const shardopt_config_t *c = &rt->cfg;
    const size_t count = (size_t)(p->sh_rows * p->sh_cols);
    struct ns_args piece = {.batch = 1,
                            .rows = p->sh_rows,
                            .cols = p->sh_cols,
                            .transpose = p->mv.ns_transpose,
                            .in = rt->sh_u,
                            .in_dtype = c->comm_dtype,
                            .out = rt->sh_u,
                            .out_dtype = c->comm_dtype,
                            .steps = c->ns_steps,
                            .norm_scale = rt->ns_norm_scale,
                            .eps = (float)c->ns_eps};

    if (count > 0)
        muon_momentum_range(rt, p, off, count, rt->sh_u, s->grad_scale);
    double ss = count > 0 ? rt->ops->sumsq(&rt->kctx, rt->sh_u, c->comm_dtype, count) : 0.0;
    /* offload = cpu: the iterations run on the device copy of U */
    const size_t ubytes = count * kdtype_size(c->comm_dtype);
    piece.in = piece.out = offload_ns_in(rt, rt->dev_sh_u, rt->sh_u, ubytes);
    shardopt_status_t status =
        ns_sharded_iterate(rt, p->name, comm, nccl, 1, &piece, count, p->sh_m, p->sh_n, ss);
    if (status != SHARDOPT_OK || count == 0)
        return status;
    /* after the matrix's last all-reduce: a failure here is this rank's, not applied, and
     * ns_sharded_run's agreement tells every rank */
    status = offload_ns_out(rt, rt->sh_u, piece.out, ubytes);
    if (status != SHARDOPT_OK)
        return status;

    muon_apply_range(rt, p, off, count, rt->sh_u, s);
    ew_flush(rt);
    return SHARDOPT_OK;
}

shardopt_status_t ns_sharded_block(shardopt_runtime_t rt, const struct shardopt_param *p,
                                   MPI_Comm comm, struct nccl_group *nccl, void *u, int64_t rows,
                                   int64_t cols, int on_rows)
{
    const shardopt_config_t *c = &rt->cfg;
    const size_t count = (size_t)(rows * cols);
    /* the working matrix is m x n with the blocks along n: a tall matrix's blocks are rows */
    const struct ns_args piece = {.batch = 1,
                                  .rows = rows,
                                  .cols = cols,
                                  .transpose = on_rows,
                                  .in = u,
                                  .in_dtype = c->comm_dtype,
                                  .out = u,
                                  .out_dtype = c->comm_dtype,
                                  .steps = c->ns_steps,
                                  .norm_scale = rt->ns_norm_scale,
                                  .eps = (float)c->ns_eps};
    const int64_t m = on_rows ? cols : rows, n = on_rows ? rows : cols;
    int diverged = 0; /* the bf16 result guard's answer, every member's alike */
    double ss = 0;
    shardopt_status_t status = SHARDOPT_OK;
    if (rt->team_poisoned) {
        /* a team collective of this rank failed over NCCL earlier in the step (muon_exec.c):
         * the team's first all-reduce, the norm's over MPI in both dtypes, with the failure flag
         * and no work of this rank's, so that every member returns there (the flag) and none
         * posts an NCCL all-reduce this rank would never join */
        int failed = 1;
        double inv = 0;
        status = ns_sharded_norm(rt, p->name, comm, NULL, 0.0, &failed, &inv);
    } else {
        /* u is where Newton-Schulz runs: an NS slot, or its device copy with offload = cpu */
        ss = count > 0 ? rt->ns_ops->sumsq(&rt->kctx, u, c->comm_dtype, count) : 0.0;
        /* ns_compute = bf16, on the CPU or a device with bf16 team entries (commit.c) */
        status = rt->team_compute == KDT_BF16
                     ? ns_sharded_iterate_bf16(rt, p->name, comm, nccl, &piece, count, m, n, ss,
                                               &diverged)
                     : ns_sharded_iterate(rt, p->name, comm, nccl, 0, &piece, count, m, n, ss);
    }
    if (status == SHARDOPT_OK && diverged)
        status = ns_sharded_iterate(rt, p->name, comm, nccl, 0, &piece, count, m, n, ss);
    /* failed: the pipeline goes on (its exchanges complete on every rank) with a zero update for
     * this block in place of what the iterations left, and the step fails at the agreement */
    if (status != SHARDOPT_OK && count > 0) /* u: device memory where NS runs on a device */
        rt->ns_dev->fill(&rt->kctx, u, 0, count * kdtype_size(c->comm_dtype));
    return status;
}

/* Does the Muon phase end in an agreement? Wherever a Muon matrix is orthogonalized: a member's
 * failure in sharded or team Newton-Schulz is known to its group only, and a gathered matrix's
 * owner that fails (muon_exec.c, stage_orthogonalize) knows it alone while the exchanges
 * complete on every rank. Every rank computes the same answer (commit checked the parameters are
 * the same everywhere). Before, only steps with sharded or team matrices agreed, and an owner
 * whose kernel refused returned alone while its group waited in exchange #2. */
static int ns_collective(const struct shardopt_runtime *rt)
{
    for (int i = 0; i < rt->nparams; i++)
        if (rt->params[i]->algo == SHARDOPT_ALGO_MUON)
            return 1;
    return 0;
}

shardopt_status_t ns_sharded_run(shardopt_runtime_t rt, const struct muon_scalars *s,
                                 shardopt_status_t status)
{
    double t0 = monotonic_seconds();

    int stop = 0;
    for (int i = 0; i < rt->nparams && status == SHARDOPT_OK && !stop; i++) {
        struct shardopt_param *p = rt->params[i];
        if (!p->ns_sharded || p->skip) /* skip_missing_grads: skipped on every member */
            continue;
        const int expert = p->placement == SHARDOPT_PLACEMENT_EXPERT;
        MPI_Comm comm = expert ? rt->groups.xs : rt->groups.dense;
        /* comm_backend = nccl (buffers on a device): the group's NCCL communicator, made by init
         * wherever the group has more than one rank (rt_nccl_create), carries the matrix's norm
         * and Gram all-reduces on the device; every rank runs the matrices in parameter order,
         * so every communicator's operations come in one order on the groups' one stream */
        struct nccl_group *nccl = rt->nccl[expert ? GROUP_EXPERT : GROUP_DENSE];
        const int64_t k_n = p->layout.ndim == 3 ? p->layout.len[0] : 1;
        for (int64_t k = 0; k < k_n && !stop; k++) {
            /* every member holds a piece of each of the window's experts (sharding is along a
             * matrix dim), so piece k sits at k * piece size in the local shard */
            const size_t off = (size_t)(k * p->sh_rows * p->sh_cols);
            const shardopt_status_t failed = matrix_run(rt, p, comm, nccl, off, s);
            if (failed == SHARDOPT_ERR_COMM) /* an MPI call: nothing more to agree over */
                return failed;
            /* the next matrices still run: their groups may hold other members. Not after an
             * NCCL failure (a post or drain timed out: the communicator is aborted, and a stuck
             * all-reduce may hold the groups' one stream): every later matrix would wait out
             * comm_timeout_s again; the members of its groups stop at their own drain's timeout,
             * and the agreement below tells every rank. (A team member goes on instead,
             * muon_exec.c: a team's first all-reduce is over MPI and can carry the flag, where
             * every all-reduce here is over the group's communicator, aborted on this rank.) */
            rt_ns_failed_note(rt, failed);
            stop = failed == SHARDOPT_ERR_NCCL;
        }
    }
    rt->counters.seconds_ns_sharded_last = monotonic_seconds() - t0;
    if (status == SHARDOPT_OK)
        status = rt->ns_failed;
    /* a matrix failed on some members only (its group knows, or its owner alone): every rank
     * returns the failure. With exchanges left in flight (status from muon_run) the ranks still
     * in them end the job after comm_timeout_s, as before */
    if (!ns_collective(rt))
        return status;
    /* teams or sharded matrices over NCCL: a member may come from a drain that waited
     * comm_timeout_s (a stuck peer), while the others wait here (ns_sharded_patient) */
    const struct groups patient = ns_sharded_patient(rt);
    status = groups_agree(&patient, status, "step");
    rt->ns_torn |= status != SHARDOPT_OK; /* runtime.h: every rank refuses from now on */
    return status;
}

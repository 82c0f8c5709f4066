#include "runtime/step/ns_sharded.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "base/fault.h"
#include "base/status.h"
#include "kernels/clock.h"
#include "kernels/cpu/ns_bf16.h"
#include "kernels/cpu/ns_common.h"
#include "kernels/dtype.h"
#include "kernels/ns_shape.h"
#include "runtime/comm/comm_wait.h"
#include "runtime/step/offload_exec.h"
#include "sharding/plan.h"

/* What one piece's iterations add to the counters. Bytes: what a ring all-reduce sends from
 * each member, 2(k-1)/k of the m x m Gram matrix (elements of `esize` bytes) per iteration: the
 * planner's team cost (plan_team_allreduce_elems), which plan_vs_runtime compares it with. The
 * MPI library may move the bytes otherwise; its own are not seen. A member without columns
 * (n = 0) joins the all-reduces too, but forms neither B nor Y. FLOPs: the update form the
 * kernel took (narrow_ok: the fp32 kernels' choice, kernels/ns_shape.h). */
static void count_iterations(shardopt_runtime_t rt, MPI_Comm comm, int64_t m, int64_t n,
                             size_t esize, int narrow_ok)
{
    const double steps = (double)rt->cfg.ns_steps;
    int k = 1;
    MPI_Comm_size(comm, &k);
    rt->counters.bytes_ns_allreduce += steps * (double)esize * plan_team_allreduce_elems(m, m, k);
    rt->counters.ns_flops_last += ns_shard_iter_flops((double)m, (double)n, narrow_ok) * steps;
}

/* A member's failure inside the iterations (a kernel refusing; the fault site step.ns stands in
 * for one) travels in the group's next all-reduce, one element past the sum: every member reads
 * it from the same result and stops there, the failed one having joined with zeros as a member
 * without columns does. Before, the failed member returned alone and the others waited in that
 * all-reduce until comm_timeout_s ended the job. A failure in the last update has no all-reduce
 * after it: ns_sharded_run's agreement tells the group. */
static shardopt_status_t group_failed(const char *name, int mine)
{
    return log_fail(SHARDOPT_ERR_INTERNAL,
                    "step '%s': sharded Newton-Schulz failed on %s; the matrix is not updated",
                    name, mine ? "this rank" : "another member of its group");
}

/* 1 / (|U|_F s + eps) of the whole matrix: ss, this member's squared norm, summed over comm
 * (every member, with columns or not, joins) with the failure flag. The start of both iterations
 * below. */
static shardopt_status_t norm_inverse(shardopt_runtime_t rt, const char *name, MPI_Comm comm,
                                      double ss, int failed, double *inv)
{
    double v[2] = {failed ? 0.0 : ss, failed ? 1.0 : 0.0};
    comm_phase("step: sharded Newton-Schulz", -1);
    if (comm_allreduce(&rt->groups, comm, MPI_IN_PLACE, v, 2, MPI_DOUBLE, MPI_SUM,
                       "norm all-reduce") != MPI_SUCCESS)
        return log_fail(SHARDOPT_ERR_COMM, "step '%s': sharded NS norm all-reduce failed", name);
    if (v[1] != 0)
        return group_failed(name, failed);
    *inv = 1.0 / (sqrt(v[0]) * (double)rt->ns_norm_scale + (double)rt->cfg.ns_eps);
    return SHARDOPT_OK;
}

/* With Newton-Schulz on a device (backend = cuda, or offload = cpu) X, Y, the Gram matrix and B
 * are device memory (rt->sh_x from ns_dev, the block in an NS slot): what MPI or a host kernel
 * reads crosses through rt->sh_host, after the stream's work so far (a copy, then a sync: MPI
 * reads the host buffer at once). On the CPU tables they are host memory and nothing moves. A
 * team with an NCCL communicator (exchanges over NCCL) all-reduces its Gram matrices on the
 * device instead (gram_allreduce_nccl). 0, or -1 when the device's queued work failed. */
static int dev_sync(shardopt_runtime_t rt)
{
    /* the fault site step.ns.copy stands in for a device whose copy failed (tests) */
    return fault_hit("step.ns.copy") ? -1 : rt->ns_dev->sync(&rt->kctx);
}

static int to_host(shardopt_runtime_t rt, void *host, const void *dev, size_t bytes)
{
    rt->ns_dev->copy(&rt->kctx, host, dev, bytes);
    return dev_sync(rt);
}

static shardopt_status_t copy_failed(shardopt_runtime_t rt, const char *name, const char *what)
{
    return log_fail(SHARDOPT_ERR_DEVICE, "step '%s': rank %d: copying %s to the host failed", name,
                    rt->groups.me.rank, what);
}

/* A = X X^T of this member's columns, summed over comm, with the failure flag at A[m^2] (on the
 * CPU tables B's first element, free until the update: commit_buffers.c leaves B at least m^2):
 * in place on the CPU tables, through rt->sh_host on a device (the m x m matrix down,
 * MPI_Allreduce on the host, up again stream-ordered: the next iteration's copy down waits for
 * it; sh_host holds more than m^2 + 1 floats). A copy down that failed is this member's failure,
 * told to the group like a kernel's. */
static shardopt_status_t gram_allreduce(shardopt_runtime_t rt, const char *name, MPI_Comm comm,
                                        const float *x, int64_t m, int64_t n, int failed,
                                        float *gram)
{
    const int dev = rt_ns_on_device(rt);
    const size_t bytes = sizeof(float) * (size_t)(m * m);
    float *sum = dev ? rt->sh_host : gram;

    if (!failed) {
        rt->ns_ops->ns_shard_gram(&rt->kctx, x, m, n, gram);
        if (dev && to_host(rt, sum, gram, bytes) != 0)
            failed = copy_failed(rt, name, "a sharded NS Gram matrix") != SHARDOPT_OK;
    }
    if (failed)
        memset(sum, 0, bytes);
    sum[m * m] = failed ? 1.0f : 0.0f;
    if (comm_allreduce(&rt->groups, comm, MPI_IN_PLACE, sum, (int)(m * m + 1), MPI_FLOAT, MPI_SUM,
                       "Gram all-reduce") != MPI_SUCCESS)
        return log_fail(SHARDOPT_ERR_COMM, "step '%s': sharded NS Gram all-reduce failed", name);
    if (sum[m * m] != 0)
        return group_failed(name, failed);
    if (dev)
        rt->ns_dev->copy(&rt->kctx, gram, sum, bytes);
    return SHARDOPT_OK;
}

/* gram_allreduce's work for a team with an NCCL communicator (commit_teams.c; a device, fp32):
 * the Gram matrix and the flag at A[m^2] (B's first element, as on the CPU tables) summed in
 * place on the device by ncclAllReduce, stream-ordered (comm_nccl.c: no host copy, no host
 * wait). The flag stays on the device: a failed member (the fault site; the fp32 kernels
 * cannot fail) sets its bytes to 0x01, a positive normal float, so every later sum is non-zero
 * too, as it joins every later all-reduce with zeros; iterate copies the last sum's flag to the
 * host and reads it once per matrix, after a polled wait (nccl_group_drain). */
static shardopt_status_t gram_allreduce_nccl(shardopt_runtime_t rt, const char *name,
                                             struct nccl_group *nccl, const float *x, int64_t m,
                                             int64_t n, int failed, float *gram)
{
    if (!failed)
        rt->ns_ops->ns_shard_gram(&rt->kctx, x, m, n, gram);
    else
        rt->ns_dev->fill(&rt->kctx, gram, 0, sizeof(float) * (size_t)(m * m));
    rt->ns_dev->fill(&rt->kctx, gram + m * m, failed ? 1 : 0, sizeof(float));
    const shardopt_status_t status = nccl_group_allreduce_f32(nccl, gram, (size_t)(m * m + 1));
    if (status != SHARDOPT_OK)
        return log_fail_context(status, "step '%s': team Gram all-reduce", name);
    return SHARDOPT_OK;
}

/* The end of a team matrix's iterations over NCCL: wait (polled, comm_timeout_s) for the team's
 * all-reduces, then for the copy of the last sum's flag to rt->sh_host, and read it. */
static shardopt_status_t nccl_flag(shardopt_runtime_t rt, const char *name, struct nccl_group *nccl,
                                   int failed, size_t esize)
{
    shardopt_status_t status = nccl_group_drain(nccl);
    if (status != SHARDOPT_OK)
        return log_fail_context(status, "step '%s': team Gram all-reduces", name);
    if (rt->ns_dev->sync(&rt->kctx) != 0)
        return copy_failed(rt, name, "a team's failure flag");
    /* the flag's bits, fp32 or bf16 (iterate_bf16): non-zero once any member failed */
    const int set = esize == sizeof(uint16_t) ? ((const uint16_t *)(void *)rt->sh_host)[0] != 0
                                              : rt->sh_host[0] != 0;
    return failed || set ? group_failed(name, failed) : SHARDOPT_OK;
}

/* AOL's row scales (ns_aol_scale, the host function the gathered CPU path runs) on X (m x n) and
 * the summed Gram matrix: in place on the CPU tables, d in B's room (commit_buffers.c leaves
 * it); on a device both go down to rt->sh_host (Gram, then the m doubles, then X: commit sizes
 * it so) and back, once per matrix, so the device gives the CPU's bits. A failed copy is this
 * member's alone: iterate carries it into the group's next all-reduce. */
static shardopt_status_t aol_scale(shardopt_runtime_t rt, const char *name, float *x, float *gram,
                                   float *B, int64_t m, int64_t n)
{
    const double eps = (double)rt->cfg.ns_eps;
    if (!rt_ns_on_device(rt)) {
        double *d = (double *)(void *)(((uintptr_t)B + 7u) & ~(uintptr_t)7u);
        ns_aol_scale(m, n, eps, x, gram, d);
        return SHARDOPT_OK;
    }
    float *g = rt->sh_host;
    double *d = (double *)(void *)(((uintptr_t)(g + m * m) + 7u) & ~(uintptr_t)7u);
    float *xh = (float *)(void *)(d + m);
    const size_t gb = sizeof(float) * (size_t)(m * m), xb = sizeof(float) * (size_t)(m * n);
    rt->ns_dev->copy(&rt->kctx, xh, x, xb);
    if (to_host(rt, g, gram, gb) != 0)
        return copy_failed(rt, name, "a team's block for AOL");
    ns_aol_scale(m, n, eps, xh, g, d);
    rt->ns_dev->copy(&rt->kctx, x, xh, xb);
    rt->ns_dev->copy(&rt->kctx, gram, g, gb);
    /* the host buffer is the next Gram all-reduce's: wait until both copies have read it */
    if (dev_sync(rt) != 0)
        return copy_failed(rt, name, "AOL's scaled block back");
    return SHARDOPT_OK;
}

/* MPI_SUM of bf16 values carried as MPI_UINT16_T: each pair added in fp32 and rounded once, as
 * the team's bf16 Gram matrix is summed (MPI has no bf16 type). Commutative: MPI may pair the
 * members' contributions in any order, as it may the fp32 sums. */
static void bf16_sum(void *in, void *inout, int *len, MPI_Datatype *type)
{
    const uint16_t *a = in;
    uint16_t *b = inout;
    (void)type;
    for (int i = 0; i < *len; i++)
        b[i] = bf16_from_f32(f32_from_bf16(a[i]) + f32_from_bf16(b[i]));
}

shardopt_status_t ns_sharded_bf16_op(shardopt_runtime_t rt)
{
    if (rt->have_bf16_sum)
        return SHARDOPT_OK;
    if (MPI_Op_create(bf16_sum, 1, &rt->ns_bf16_sum) != MPI_SUCCESS)
        return log_fail(SHARDOPT_ERR_COMM, "commit: rank %d: MPI_Op_create (bf16 Gram sum) failed",
                        rt->groups.me.rank);
    rt->have_bf16_sum = 1;
    return SHARDOPT_OK;
}

void ns_sharded_bf16_op_free(shardopt_runtime_t rt)
{
    if (rt->have_bf16_sum)
        MPI_Op_free(&rt->ns_bf16_sum);
    rt->have_bf16_sum = 0;
}

/* The bf16 team products (iterate_bf16): the CPU's oneDNN plans (rt->ns_ws.bf16, made at commit
 * per block shape), or with Newton-Schulz on a device the device table's bf16 entries (its plans
 * made at commit too: commit_buffers.c, device_team_plans), which give the CPU's roundings. */
static int bf16_gram(shardopt_runtime_t rt, const struct ns_bf16_shard *sp, const uint16_t *x,
                     int64_t m, int64_t n, uint16_t *A)
{
    return rt_ns_on_device(rt) ? rt->ns_ops->ns_shard_bf16_gram(&rt->kctx, x, m, n, A)
                               : ns_bf16_shard_gram(rt->ns_ws.bf16, sp, x, A);
}

static int bf16_update(shardopt_runtime_t rt, const struct ns_bf16_shard *sp, int it,
                       const uint16_t *A, const uint16_t *x, int64_t m, int64_t n, uint16_t *B,
                       uint16_t *y)
{
    return rt_ns_on_device(rt)
               ? rt->ns_ops->ns_shard_bf16_update(&rt->kctx, (const float(*)[3])rt->ns_coeffs,
                                                  rt->cfg.ns_steps, it, A, x, m, n, B, y)
               : ns_bf16_shard_update(rt->ns_ws.bf16, sp, it, A, x, B, y);
}

/* A bf16 team product that failed: 1, logged (a device's error was recorded by its table) */
static int bf16_failed(shardopt_runtime_t rt, const char *name, const char *what)
{
    (rt_ns_on_device(rt) ? log_fail_context : log_fail)(
        SHARDOPT_ERR_INTERNAL, "step '%s': bf16 team %s failed", name, what);
    return 1;
}

/* AOL on a bf16 team block with Newton-Schulz on a device: the summed Gram matrix is already on
 * the host (sh_host, from its all-reduce); the fp32 block goes down behind it (after AOL's m
 * doubles), ns_bf16_aol forms the scaled bf16 block there (the host function the CPU teams run,
 * so the bits are theirs) and both go back up. commit_buffers.c sizes sh_host for the block twice.
 * 0, or -1 when a copy failed (this member's failure, carried into the next all-reduce). */
static int aol_bf16_device(shardopt_runtime_t rt, uint16_t *Ah, const float *xf, uint16_t *x,
                           int64_t m, int64_t n)
{
    double *d = (double *)(void *)(((uintptr_t)(Ah + m * m + 1) + 7u) & ~(uintptr_t)7u);
    float *xfh = (float *)(void *)(d + m);
    uint16_t *xh = (uint16_t *)(void *)(xfh + m * n);
    if (n > 0 && to_host(rt, xfh, xf, sizeof(float) * (size_t)(m * n)) != 0)
        return -1;
    ns_bf16_aol(m, n, (double)rt->cfg.ns_eps, xfh, xh, Ah, d);
    if (n > 0)
        rt->ns_dev->copy(&rt->kctx, x, xh, sizeof(uint16_t) * (size_t)(m * n));
    return 0;
}

/* A bf16 team's Gram matrix A (this member's, formed: ok; else zeros) summed over the team with
 * the failure flag one element past it, over MPI: in place on the CPU (the flag in B's first
 * element), through the host staging `sum` on a device (A down, summed there, then the caller
 * copies it up), as MPI_UINT16_T with the CPU's user-defined sum (bf16_sum). */
static shardopt_status_t bf16_sum_mpi(shardopt_runtime_t rt, const char *name, MPI_Comm comm,
                                      int ok, int failed, uint16_t *A, uint16_t *sum, int64_t m)
{
    const size_t abytes = sizeof(uint16_t) * (size_t)(m * m);
    const int dev = rt_ns_on_device(rt);
    if (ok && !failed && dev && to_host(rt, sum, A, abytes) != 0)
        failed = copy_failed(rt, name, "a bf16 team Gram matrix") != SHARDOPT_OK;
    if (!ok || failed) { /* no columns, or failed: joins the sum with zeros */
        if (dev)         /* after a copy up from sum still queued (its result unused) */
            (void)rt->ns_dev->sync(&rt->kctx);
        memset(sum, 0, abytes);
    }
    sum[m * m] = failed ? bf16_from_f32(1.0f) : 0;
    if (comm_allreduce(&rt->groups, comm, MPI_IN_PLACE, sum, (int)(m * m + 1), MPI_UINT16_T,
                       rt->ns_bf16_sum, "Gram all-reduce") != MPI_SUCCESS)
        return log_fail(SHARDOPT_ERR_COMM, "step '%s': sharded NS Gram all-reduce failed", name);
    return sum[m * m] != 0 ? group_failed(name, failed) : SHARDOPT_OK;
}

/* The same over the team's NCCL communicator (exchanges over NCCL, commit_teams.c): summed in
 * place on the device as ncclBfloat16 (nccl_group_allreduce_bf16: NCCL adds each pair in fp32 and
 * rounds it to bf16, as bf16_sum, in its own order of the members), stream-ordered, no host copy.
 * The flag stays on the device as fp32's does (gram_allreduce_nccl): a failed member sets its
 * bytes to 0x01 (0x0101, a positive normal bf16, so every later sum is non-zero too) and joins
 * every later sum with zeros; the caller copies the last sum's flag to the host and reads it once
 * per matrix (nccl_flag). */
static shardopt_status_t bf16_sum_nccl(shardopt_runtime_t rt, const char *name,
                                       struct nccl_group *nccl, int ok, int failed, uint16_t *A,
                                       int64_t m)
{
    if (!ok || failed)
        rt->ns_dev->fill(&rt->kctx, A, 0, sizeof(uint16_t) * (size_t)(m * m));
    rt->ns_dev->fill(&rt->kctx, A + m * m, failed ? 1 : 0, sizeof(uint16_t));
    const shardopt_status_t status = nccl_group_allreduce_bf16(nccl, A, (size_t)(m * m + 1));
    if (status != SHARDOPT_OK)
        return log_fail_context(status, "step '%s': team Gram all-reduce", name);
    return SHARDOPT_OK;
}

/* iterate (below) in bf16 (ns_compute = bf16, a team's block): X_j in bf16 from the fp32 load,
 * each iteration's Gram matrix formed and all-reduced in bf16 (half the bytes; pairs summed in
 * fp32 and rounded once), the update with fp32 accumulation, as the gathered bf16 path's
 * (kernels/cpu/ns_bf16.h): oneDNN on the CPU, the device table's bf16 entries on a device, whose
 * Gram matrices go through sh_host to MPI (bf16_sum_mpi) or stay on it over NCCL (bf16_sum_nccl).
 * sh_x holds the fp32 staging (count floats), X and Y (bf16, in the next count floats), A and B
 * (bf16, in the next m^2 floats), then on the CPU AOL's m doubles. */
static shardopt_status_t iterate_bf16(shardopt_runtime_t rt, const char *name, MPI_Comm comm,
                                      struct nccl_group *nccl, const struct ns_args *piece,
                                      size_t count, int64_t m, int64_t n, double ss)
{
    const shardopt_config_t *c = &rt->cfg;
    const int dev = rt_ns_on_device(rt);
    float *xf = rt->sh_x;
    uint16_t *x = (uint16_t *)(void *)(xf + count), *y = x + count;
    uint16_t *A = (uint16_t *)(void *)(xf + 2 * count), *B = A + m * m;
    /* the host side of an MPI sum (A itself on the CPU), and of AOL on a device */
    uint16_t *sum = dev ? (uint16_t *)(void *)rt->sh_host : A;
    const size_t abytes = sizeof(uint16_t) * (size_t)(m * m);
    const struct ns_bf16_shard *sp =
        count > 0 && !dev ? ns_bf16_shard_find(rt->ns_ws.bf16, m, n,
                                               (const float(*)[3])rt->ns_coeffs, c->ns_steps)
                          : NULL;

    int failed = 0;
    if (count > 0 && !dev && sp == NULL) /* commit prepares every block this rank holds */
        failed = log_fail(SHARDOPT_ERR_INTERNAL,
                          "step '%s': rank %d: no bf16 team plan for a %lld x %lld block", name,
                          rt->groups.me.rank, (long long)m, (long long)n) != SHARDOPT_OK;
    double inv = 0;
    const shardopt_status_t scaled = norm_inverse(rt, name, comm, ss, failed, &inv);
    if (scaled != SHARDOPT_OK)
        return scaled;
    if (count > 0) {
        rt->ns_ops->ns_shard_load(&rt->kctx, piece, inv, xf);
        if (dev)
            rt->ns_ops->ns_shard_bf16_round(&rt->kctx, xf, x, count);
        else
            for (size_t i = 0; i < count; i++)
                x[i] = bf16_from_f32(xf[i]);
    }
    const int aol = c->ns_precondition == SHARDOPT_NS_PRECONDITION_AOL;
    for (int it = 0; it < c->ns_steps; it++) {
        if (count > 0 && !failed && fault_hit("step.ns"))
            failed = 1;
        else if (count > 0 && !failed && bf16_gram(rt, sp, x, m, n, A) != 0)
            failed = bf16_failed(rt, name, "Gram matrix");
        shardopt_status_t status = nccl != NULL
                                       ? bf16_sum_nccl(rt, name, nccl, count > 0, failed, A, m)
                                       : bf16_sum_mpi(rt, name, comm, count > 0, failed, A, sum, m);
        const int64_t nj = count > 0 ? n : 0;
        if (status == SHARDOPT_OK && aol && it == 0 && nccl != NULL) /* AOL reads the sum */
            status = nccl_group_drain(nccl);
        if (status != SHARDOPT_OK)
            return status;
        if (aol && it == 0 && !dev) { /* the row scales of the whole matrix's Gram matrix */
            double *d = (double *)(void *)(((uintptr_t)(B + m * m) + 7u) & ~(uintptr_t)7u);
            ns_bf16_aol(m, nj, (double)c->ns_eps, xf, x, A, d);
        } else if (aol && it == 0 &&
                   ((nccl != NULL && to_host(rt, sum, A, abytes) != 0) ||
                    aol_bf16_device(rt, sum, xf, x, m, nj) != 0)) {
            failed = copy_failed(rt, name, "a team's block for AOL") != SHARDOPT_OK;
            continue; /* told in the next all-reduce */
        } else if (aol && it == 0 && nccl != NULL) {
            rt->ns_dev->copy(&rt->kctx, A, sum, abytes); /* the scaled sum */
        }
        /* over NCCL the last sum's flag, before the update writes B over it (after AOL's use of
         * sh_host: stream-ordered) */
        if (nccl != NULL && it == c->ns_steps - 1)
            rt->ns_dev->copy(&rt->kctx, rt->sh_host, A + m * m, sizeof(uint16_t));
        if (count > 0 && !failed) {
            if (dev && nccl == NULL) /* stream-ordered, before the next copy into sum */
                rt->ns_dev->copy(&rt->kctx, A, sum, abytes);
            if (bf16_update(rt, sp, it, A, x, m, n, B, y) != 0) {
                /* told in the next all-reduce; after the last one, by ns_sharded_run's agreement */
                failed = bf16_failed(rt, name, "update");
                continue;
            }
            uint16_t *t = x;
            x = y;
            y = t;
        }
    }
    /* the bf16 update always forms A A (kernels/cpu/ns_bf16.c): no narrow form to count */
    count_iterations(rt, comm, m, count > 0 ? n : 0, sizeof(uint16_t), 0);
    if (nccl != NULL && c->ns_steps > 0) {
        const shardopt_status_t told = nccl_flag(rt, name, nccl, failed, sizeof(uint16_t));
        if (told != SHARDOPT_OK)
            return told;
    }
    if (failed)
        return SHARDOPT_ERR_INTERNAL; /* the last update: said above */
    if (count == 0)
        return SHARDOPT_OK;
    if (dev)
        rt->ns_ops->ns_shard_bf16_widen(&rt->kctx, x, xf, count);
    else
        for (size_t i = 0; i < count; i++)
            xf[i] = f32_from_bf16(x[i]);
    rt->ns_ops->ns_shard_store(&rt->kctx, piece, xf);
    return SHARDOPT_OK;
}

/* The iterations of one piece over comm: its U at piece->in (ss: its squared norm, summed here
 * over comm), X = U / (|U|_F s + eps) in fp32, per step the m x m Gram matrix of X all-reduced,
 * and O written to piece->out; count = 0: a member with none of the matrix, in every
 * all-reduce with zeros. ns_precondition = aol (teams only: config refuses it with the sharded
 * strategy): the row sums d_i of the first Gram matrix are the whole matrix's, as every member
 * holds it summed, so each scales its columns' rows by them (X's rows are the m side) and the
 * Gram matrix to D A D, which the first step uses as the gathered path does (ns_aol_scale). */
static shardopt_status_t iterate(shardopt_runtime_t rt, const char *name, MPI_Comm comm,
                                 struct nccl_group *nccl, const struct ns_args *piece, size_t count,
                                 int64_t m, int64_t n, double ss)
{
    const shardopt_config_t *c = &rt->cfg;
    float *x = rt->sh_x, *y = x + count, *gram = y + count, *B = gram + m * m;

    double inv = 0;
    const shardopt_status_t scaled = norm_inverse(rt, name, comm, ss, 0, &inv);
    if (scaled != SHARDOPT_OK)
        return scaled;
    if (count > 0)
        rt->ns_ops->ns_shard_load(&rt->kctx, piece, inv, x);
    const int aol = c->ns_precondition == SHARDOPT_NS_PRECONDITION_AOL;
    /* this member failed since the last all-reduce: told in the next one (MPI), or at the
     * matrix's end over NCCL (gram_allreduce_nccl carries it, nccl_flag reads the sum) */
    int failed = 0;
    for (int it = 0; it < c->ns_steps; it++) {
        /* the fp32 kernels cannot fail: the fault site stands in for one that does */
        failed |= count > 0 && fault_hit("step.ns");
        const int64_t nj = count > 0 ? n : 0;
        shardopt_status_t status = nccl != NULL
                                       ? gram_allreduce_nccl(rt, name, nccl, x, m, nj, failed, gram)
                                       : gram_allreduce(rt, name, comm, x, m, nj, failed, gram);
        if (status == SHARDOPT_OK && aol && it == 0) /* its host copy waits for the sum */
            status = nccl != NULL ? nccl_group_drain(nccl) : SHARDOPT_OK;
        if (status != SHARDOPT_OK)
            return status;
        /* AOL's copies failing here (a device): returning now left the other members in the
         * next Gram all-reduce until comm_timeout_s ended the job; the flag goes in it instead */
        if (aol && it == 0 && aol_scale(rt, name, x, gram, B, m, nj) != SHARDOPT_OK)
            failed = 1;
        /* the last sum's flag, before the update writes B over it; after AOL's use of sh_host */
        if (nccl != NULL && it == c->ns_steps - 1)
            rt->ns_dev->copy(&rt->kctx, rt->sh_host, gram + m * m, sizeof(float));
        if (count > 0 && !failed) {
            rt->ns_ops->ns_shard_update(&rt->kctx, gram, rt->ns_coeffs[it], x, m, n, B, y);
            float *t = x;
            x = y;
            y = t;
        }
    }
    count_iterations(rt, comm, m, count > 0 ? n : 0, sizeof(float), 1);
    if (nccl != NULL && c->ns_steps > 0) {
        const shardopt_status_t told = nccl_flag(rt, name, nccl, failed, sizeof(float));
        if (told != SHARDOPT_OK)
            return told;
    }
    if (failed) /* after the last all-reduce (ns_steps = 1): ns_sharded_run's agreement */
        return SHARDOPT_ERR_DEVICE;
    if (count == 0) /* no columns: it forms neither B nor Y, only joins the all-reduces */
        return SHARDOPT_OK;
    rt->ns_ops->ns_shard_store(&rt->kctx, piece, x);
    return SHARDOPT_OK;
}

/* One matrix k of a sharded parameter, this rank's piece at element `off` of its shard. */
static shardopt_status_t matrix_run(shardopt_runtime_t rt, struct shardopt_param *p, MPI_Comm comm,
                                    size_t off, const struct muon_scalars *s)
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
        iterate(rt, p->name, comm, NULL, &piece, count, p->sh_m, p->sh_n, ss);
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
    /* u is where Newton-Schulz runs: an NS slot, or its device copy with offload = cpu */
    const double ss = count > 0 ? rt->ns_ops->sumsq(&rt->kctx, u, c->comm_dtype, count) : 0.0;
    const int64_t m = on_rows ? cols : rows, n = on_rows ? rows : cols;
    /* ns_compute = bf16, on the CPU or a device with bf16 team entries (commit.c, teams_setup) */
    const shardopt_status_t status =
        rt->team_compute == KDT_BF16
            ? iterate_bf16(rt, p->name, comm, nccl, &piece, count, m, n, ss)
            : iterate(rt, p->name, comm, nccl, &piece, count, m, n, ss);
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

    for (int i = 0; i < rt->nparams && status == SHARDOPT_OK; i++) {
        struct shardopt_param *p = rt->params[i];
        if (!p->ns_sharded || p->skip) /* skip_missing_grads: skipped on every member */
            continue;
        MPI_Comm comm =
            p->placement == SHARDOPT_PLACEMENT_EXPERT ? rt->groups.xs : rt->groups.dense;
        const int64_t k_n = p->layout.ndim == 3 ? p->layout.len[0] : 1;
        for (int64_t k = 0; k < k_n; k++) {
            /* every member holds a piece of each of the window's experts (sharding is along a
             * matrix dim), so piece k sits at k * piece size in the local shard */
            const size_t off = (size_t)(k * p->sh_rows * p->sh_cols);
            const shardopt_status_t failed = matrix_run(rt, p, comm, off, s);
            if (failed == SHARDOPT_ERR_COMM) /* an MPI call: nothing more to agree over */
                return failed;
            /* the next matrices still run: their groups may hold other members */
            rt_ns_failed_note(rt, failed);
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
    /* teams over NCCL: a member may come from a team's drain that waited comm_timeout_s (a stuck
     * peer), while the others wait here; doubled as the step's end agreement is (step.c) */
    struct groups patient = rt->groups;
    if (rt->gx[GROUP_DENSE].set_nccl != NULL || rt->gx[GROUP_EXPERT].set_nccl != NULL)
        patient.timeout_s *= 2; /* 0 (never) stays 0 */
    status = groups_agree(&patient, status, "step");
    rt->ns_torn |= status != SHARDOPT_OK; /* runtime.h: every rank refuses from now on */
    return status;
}

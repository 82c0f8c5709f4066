/* Sharded Newton-Schulz's all-reduces (ns_sharded_sum.h): the norm, the Gram matrix in fp32 or
 * bf16 over MPI or NCCL with the failure flag, and AOL's host staging on a device. */
#include "runtime/step/ns_sharded_sum.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "base/fault.h"
#include "base/status.h"
#include "kernels/cpu/ns_bf16.h"
#include "kernels/cpu/ns_common.h"
#include "kernels/ns_shape.h"
#include "runtime/comm/comm_wait.h"
#include "runtime/step/ns_sharded.h"
#include "sharding/plan.h"

/* Bytes: what a ring all-reduce sends from each member, 2(k-1)/k of the m x m Gram matrix
 * (elements of `esize` bytes) per iteration: the planner's team cost
 * (plan_team_allreduce_elems), which plan_vs_runtime compares it with. The MPI library may move
 * the bytes otherwise; its own are not seen. A member without columns (n = 0) joins the
 * all-reduces too, but forms neither B nor Y. FLOPs: the update form the kernel took (narrow_ok:
 * the fp32 kernels' choice, kernels/ns_shape.h). */
void ns_sharded_count(shardopt_runtime_t rt, MPI_Comm comm, int64_t m, int64_t n, size_t esize,
                      int narrow_ok)
{
    const double steps = (double)rt->cfg.ns_steps;
    int k = 1;
    MPI_Comm_size(comm, &k);
    rt->counters.bytes_ns_allreduce += steps * (double)esize * plan_team_allreduce_elems(m, m, k);
    rt->counters.ns_flops_last += ns_shard_iter_flops((double)m, (double)n, narrow_ok) * steps;
}

/* As the step's end agreement allows for its drains (step.c). The teams' all-reduces need it
 * since a member whose team NCCL all-reduce failed goes on through the step (muon_exec.c): its
 * teammate comes from the drain that timed out, one comm_timeout_s after the failed member
 * reached the next team's norm all-reduce, which waited that long too, so a single deadline
 * ended the job there (MPI_Abort, comm_wait.c) as often as not. */
double ns_sharded_deadline(const struct shardopt_runtime *rt)
{
    int drains = rt->gx[GROUP_DENSE].set_nccl != NULL || rt->gx[GROUP_EXPERT].set_nccl != NULL;
    /* the sharded strategy over NCCL: only where a group has an NCCL communicator */
    const int any = rt->nccl[GROUP_DENSE] != NULL || rt->nccl[GROUP_EXPERT] != NULL;
    for (int i = 0; any && i < rt->nparams && !drains; i++)
        drains = rt->params[i]->ns_sharded &&
                 rt->nccl[rt->params[i]->placement == SHARDOPT_PLACEMENT_EXPERT ? GROUP_EXPERT
                                                                                : GROUP_DENSE];
    return drains ? 2 * rt->groups.timeout_s : rt->groups.timeout_s; /* 0 (never) stays 0 */
}

struct groups ns_sharded_patient(const struct shardopt_runtime *rt)
{
    struct groups patient = rt->groups; /* the same communicators, commit's deadline */
    patient.timeout_s = rt->ns_timeout_s;
    return patient;
}

/* A member's failure inside the iterations (a kernel refusing; the fault site step.ns stands in
 * for one) travels in the group's next all-reduce, one element past the sum: every member reads
 * it from the same result and stops there, the failed one having joined with zeros as a member
 * without columns does. Before, the failed member returned alone and the others waited in that
 * all-reduce until comm_timeout_s ended the job. A failure in the last update has no all-reduce
 * after it: ns_sharded_run's agreement tells the group. */
shardopt_status_t ns_sharded_group_failed(const char *name, int mine)
{
    return log_fail(SHARDOPT_ERR_INTERNAL,
                    "step '%s': sharded Newton-Schulz failed on %s; the matrix is not updated",
                    name, mine ? "this rank" : "another member of its group");
}

/* The norm over NCCL (the sharded strategy's group communicator, ns_sharded.c): v up to the
 * device through rt->sh_host into sh_x's first two doubles (free until the load; the device's
 * allocation is aligned for them, commit_buffers.c makes it at least 16 bytes), summed there as
 * ncclFloat64 (the two doubles MPI sums), the polled drain, and back: the host needs inv before
 * the load. A copy back that failed is this member's failure (*failed): the others go on into the
 * Gram all-reduces, which carry it. */
static shardopt_status_t norm_nccl(shardopt_runtime_t rt, const char *name, struct nccl_group *nccl,
                                   double v[2], int *failed)
{
    double *dv = (double *)(void *)rt->sh_x, *hv = (double *)(void *)rt->sh_host;
    const size_t bytes = 2 * sizeof(double);
    memcpy(hv, v, bytes);
    rt->ns_dev->copy(&rt->kctx, dv, hv, bytes);
    shardopt_status_t status = nccl_group_allreduce_f64(nccl, dv, 2);
    if (status == SHARDOPT_OK)
        status = nccl_group_drain(nccl);
    if (status != SHARDOPT_OK)
        return log_fail_context(status, "step '%s': sharded NS norm all-reduce", name);
    if (ns_sharded_to_host(rt, hv, dv, bytes) != 0) {
        *failed = ns_sharded_copy_failed(rt, name, "a sharded NS norm") != SHARDOPT_OK;
        v[0] = v[1] = 0;
        return SHARDOPT_OK;
    }
    memcpy(v, hv, bytes);
    return SHARDOPT_OK;
}

shardopt_status_t ns_sharded_norm(shardopt_runtime_t rt, const char *name, MPI_Comm comm,
                                  struct nccl_group *nccl, double ss, int *failed, double *inv)
{
    double v[2] = {*failed ? 0.0 : ss, *failed ? 1.0 : 0.0};
    const struct groups patient = ns_sharded_patient(rt);
    comm_phase("step: sharded Newton-Schulz", -1);
    if (nccl != NULL) {
        const shardopt_status_t status = norm_nccl(rt, name, nccl, v, failed);
        if (status != SHARDOPT_OK)
            return status;
    } else if (comm_allreduce(&patient, comm, MPI_IN_PLACE, v, 2, MPI_DOUBLE, MPI_SUM,
                              "norm all-reduce") != MPI_SUCCESS) {
        return log_fail(SHARDOPT_ERR_COMM, "step '%s': sharded NS norm all-reduce failed", name);
    }
    if (v[1] != 0) /* a member that failed said why already (and a poisoned one, ns_sharded.c,
                      keeps its first reason as the step's last error) */
        return *failed ? SHARDOPT_ERR_INTERNAL : ns_sharded_group_failed(name, 0);
    *inv = 1.0 / (sqrt(v[0]) * (double)rt->ns_norm_scale + (double)rt->cfg.ns_eps);
    return SHARDOPT_OK;
}

/* With Newton-Schulz on a device (backend = cuda, or offload = cpu) X, Y, the Gram matrix and B
 * are device memory (rt->sh_x from ns_dev, the block in an NS slot): what MPI or a host kernel
 * reads crosses through rt->sh_host, after the stream's work so far (a copy, then a sync: MPI
 * reads the host buffer at once). On the CPU tables they are host memory and nothing moves. A
 * group with an NCCL communicator all-reduces its Gram matrices on the device instead
 * (sum_nccl). 0, or -1 when the device's queued work failed. */
static int dev_sync(shardopt_runtime_t rt)
{
    /* the fault site step.ns.copy stands in for a device whose copy failed (tests) */
    return fault_hit("step.ns.copy") ? -1 : rt->ns_dev->sync(&rt->kctx);
}

int ns_sharded_to_host(shardopt_runtime_t rt, void *host, const void *dev, size_t bytes)
{
    rt->ns_dev->copy(&rt->kctx, host, dev, bytes);
    return dev_sync(rt);
}

shardopt_status_t ns_sharded_copy_failed(shardopt_runtime_t rt, const char *name, const char *what)
{
    return log_fail(SHARDOPT_ERR_DEVICE, "step '%s': rank %d: copying %s to the host failed", name,
                    rt->groups.me.rank, what);
}

/* The failure flag one element past a sum on the host: 1 in the element type (fp32 1.0f, bf16
 * 0x3f80), read as non-zero. Every member adds +0 or 1: the sum is non-zero once any failed. */
static void flag_put(void *at, int failed, size_t esize)
{
    if (esize == sizeof(uint16_t))
        *(uint16_t *)at = failed ? bf16_from_f32(1.0f) : 0;
    else
        *(float *)at = failed ? 1.0f : 0.0f;
}

static int flag_read(const void *at, size_t esize)
{
    return esize == sizeof(uint16_t) ? *(const uint16_t *)at != 0 : *(const float *)at != 0;
}

/* Over MPI: in place on the CPU tables, through `sum` on a device (A down, MPI_Allreduce on the
 * host, the sum up again stream-ordered: the next copy down waits for it; sh_host holds more than
 * m^2 + 1 elements). fp32 as MPI_FLOAT with MPI_SUM; bf16 as MPI_UINT16_T with the CPU's
 * user-defined sum (bf16_sum below). A copy down that failed is this member's failure, told to
 * the group like a kernel's. */
static shardopt_status_t sum_mpi(shardopt_runtime_t rt, const char *name, MPI_Comm comm, int formed,
                                 int failed, void *A, void *sum, int64_t m, size_t esize)
{
    const size_t bytes = esize * (size_t)(m * m);
    const int dev = rt_ns_on_device(rt), bf16 = esize == sizeof(uint16_t);
    if (formed && !failed && dev && ns_sharded_to_host(rt, sum, A, bytes) != 0)
        failed = ns_sharded_copy_failed(rt, name,
                                        bf16 ? "a bf16 team Gram matrix"
                                             : "a sharded NS Gram matrix") != SHARDOPT_OK;
    if (!formed || failed) { /* no columns, or failed: joins the sum with zeros */
        if (dev)             /* after a copy up from sum still queued (its result unused) */
            (void)rt->ns_dev->sync(&rt->kctx);
        memset(sum, 0, bytes);
    }
    flag_put((char *)sum + bytes, failed, esize);
    const struct groups patient = ns_sharded_patient(rt);
    if (comm_allreduce(&patient, comm, MPI_IN_PLACE, sum, (int)(m * m + 1),
                       bf16 ? MPI_UINT16_T : MPI_FLOAT, bf16 ? rt->ns_bf16_sum : MPI_SUM,
                       "Gram all-reduce") != MPI_SUCCESS)
        return log_fail(SHARDOPT_ERR_COMM, "step '%s': sharded NS Gram all-reduce failed", name);
    if (flag_read((char *)sum + bytes, esize))
        return ns_sharded_group_failed(name, failed);
    if (dev)
        rt->ns_dev->copy(&rt->kctx, A, sum, bytes);
    return SHARDOPT_OK;
}

/* Over the group's NCCL communicator: summed in place on the device by ncclAllReduce (fp32, or
 * ncclBfloat16, which adds each pair in fp32 and rounds it to bf16 as bf16_sum does, in NCCL's
 * order of the members), stream-ordered (comm_nccl.c: no host copy, no host wait). The flag stays
 * on the device: a failed member sets its bytes to 0x01 (a positive normal float, 0x0101 a
 * positive normal bf16), so every later sum is non-zero too, as it joins every later all-reduce
 * with zeros; the caller copies the last sum's flag to the host and reads it once per matrix,
 * after a polled wait (ns_sharded_flag). */
static shardopt_status_t sum_nccl(shardopt_runtime_t rt, const char *name, struct nccl_group *nccl,
                                  int formed, int failed, void *A, int64_t m, size_t esize)
{
    const size_t bytes = esize * (size_t)(m * m), count = (size_t)(m * m + 1);
    if (!formed || failed)
        rt->ns_dev->fill(&rt->kctx, A, 0, bytes);
    rt->ns_dev->fill(&rt->kctx, (char *)A + bytes, failed ? 1 : 0, esize);
    const shardopt_status_t status = esize == sizeof(uint16_t)
                                         ? nccl_group_allreduce_bf16(nccl, A, count)
                                         : nccl_group_allreduce_f32(nccl, A, count);
    if (status != SHARDOPT_OK)
        return log_fail_context(status, "step '%s': sharded NS Gram all-reduce", name);
    return SHARDOPT_OK;
}

shardopt_status_t ns_sharded_gram_sum(shardopt_runtime_t rt, const char *name, MPI_Comm comm,
                                      struct nccl_group *nccl, int formed, int failed, void *A,
                                      void *sum, int64_t m, size_t esize)
{
    return nccl != NULL ? sum_nccl(rt, name, nccl, formed, failed, A, m, esize)
                        : sum_mpi(rt, name, comm, formed, failed, A, sum, m, esize);
}

shardopt_status_t ns_sharded_flag(shardopt_runtime_t rt, const char *name, struct nccl_group *nccl,
                                  int failed, size_t esize)
{
    shardopt_status_t status = nccl_group_drain(nccl);
    if (status != SHARDOPT_OK)
        return log_fail_context(status, "step '%s': sharded NS Gram all-reduces", name);
    if (rt->ns_dev->sync(&rt->kctx) != 0)
        return ns_sharded_copy_failed(rt, name, "a sharded NS failure flag");
    return failed || flag_read(rt->sh_host, esize) ? ns_sharded_group_failed(name, failed)
                                                   : SHARDOPT_OK;
}

/* The staging in sum (commit_buffers.c sizes sh_host for it): the Gram matrix and its flag, AOL's
 * m doubles (8-byte aligned), the fp32 block, and for bf16 the bf16 block behind it. Once per
 * matrix, so the device gives the CPU's bits. */
shardopt_status_t ns_sharded_aol_device(shardopt_runtime_t rt, const char *name, void *A, void *sum,
                                        int down, const float *xf, void *x, int64_t m, int64_t n,
                                        size_t esize)
{
    const size_t bytes = esize * (size_t)(m * m), xb = sizeof(float) * (size_t)(m * n);
    double *d =
        (double *)(void *)(((uintptr_t)((char *)sum + bytes + esize) + 7u) & ~(uintptr_t)7u);
    float *xfh = (float *)(void *)(d + m);
    void *xh = esize == sizeof(float) ? (void *)xfh : (void *)(xfh + m * n);
    if (n > 0)
        rt->ns_dev->copy(&rt->kctx, xfh, xf, xb);
    if (down)
        rt->ns_dev->copy(&rt->kctx, sum, A, bytes);
    if (dev_sync(rt) != 0)
        return ns_sharded_copy_failed(rt, name, "a team's block for AOL");
    if (esize == sizeof(uint16_t))
        ns_bf16_aol(m, n, (double)rt->cfg.ns_eps, xfh, xh, sum, d);
    else
        ns_aol_scale(m, n, (double)rt->cfg.ns_eps, xfh, sum, d);
    if (n > 0)
        rt->ns_dev->copy(&rt->kctx, x, xh, esize * (size_t)(m * n));
    rt->ns_dev->copy(&rt->kctx, A, sum, bytes);
    /* the host buffer is the next Gram all-reduce's: wait until both copies have read it */
    if (dev_sync(rt) != 0)
        return ns_sharded_copy_failed(rt, name, "AOL's scaled block back");
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

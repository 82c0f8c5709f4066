/* Sharded Newton-Schulz's iterations of one piece (ns_sharded_sum.h): fp32, and bf16 for a team's
 * block with ns_compute = bf16, over the all-reduces of ns_sharded_sum.c. */
#include <stdint.h>
#include <string.h>

#include "base/fault.h"
#include "base/log.h"
#include "base/status.h"
#include "kernels/cpu/ns_bf16.h"
#include "kernels/cpu/ns_common.h"
#include "kernels/dtype.h"
#include "kernels/ns_coeffs.h"
#include "runtime/comm/comm_wait.h"
#include "runtime/step/ns_sharded_sum.h"

/* The iterations of one piece over comm: its U at piece->in (ss: its squared norm, summed here
 * over comm), X = U / (|U|_F s + eps) in fp32, per step the m x m Gram matrix of X all-reduced,
 * and O written to piece->out; count = 0: a member with none of the matrix, in every
 * all-reduce with zeros. ns_precondition = aol (teams only: config refuses it with the sharded
 * strategy): the row sums d_i of the first Gram matrix are the whole matrix's, as every member
 * holds it summed, so each scales its columns' rows by them (X's rows are the m side) and the
 * Gram matrix to D A D, which the first step uses as the gathered path does (ns_aol_scale). On
 * the CPU tables the Gram matrix is summed in place, the flag in B's first element (free until
 * the update: commit_buffers.c leaves B at least m^2) and AOL's d in B's room. */
shardopt_status_t ns_sharded_iterate(shardopt_runtime_t rt, const char *name, MPI_Comm comm,
                                     struct nccl_group *nccl, int norm_nccl,
                                     const struct ns_args *piece, size_t count, int64_t m,
                                     int64_t n, double ss)
{
    const shardopt_config_t *c = &rt->cfg;
    const int dev = rt_ns_on_device(rt);
    float *x = rt->sh_x, *y = x + count, *gram = y + count, *B = gram + m * m;
    float *sum = dev ? rt->sh_host : gram; /* the host side of an MPI sum */

    /* this member failed since the last all-reduce: told in the next one (MPI), or at the
     * matrix's end over NCCL (the sum carries it, ns_sharded_flag reads it) */
    int failed = 0;
    double inv = 0;
    const shardopt_status_t scaled =
        ns_sharded_norm(rt, name, comm, norm_nccl ? nccl : NULL, ss, &failed, &inv);
    if (scaled != SHARDOPT_OK)
        return scaled;
    if (count > 0 && !failed)
        rt->ns_ops->ns_shard_load(&rt->kctx, piece, inv, x);
    const int aol = c->ns_precondition == SHARDOPT_NS_PRECONDITION_AOL;
    for (int it = 0; it < c->ns_steps; it++) {
        /* the fp32 kernels cannot fail: the fault site stands in for one that does */
        failed |= count > 0 && fault_hit("step.ns");
        const int64_t nj = count > 0 ? n : 0;
        if (!failed) /* a member without columns forms zeros */
            rt->ns_ops->ns_shard_gram(&rt->kctx, x, m, nj, gram);
        shardopt_status_t status =
            ns_sharded_gram_sum(rt, name, comm, nccl, 1, failed, gram, sum, m, sizeof(float));
        if (status == SHARDOPT_OK && aol && it == 0 && nccl != NULL) /* AOL reads the sum */
            status = nccl_group_drain(nccl);
        if (status != SHARDOPT_OK)
            return status;
        /* AOL's copies failing here (a device): returning now left the other members in the
         * next Gram all-reduce until comm_timeout_s ended the job; the flag goes in it instead */
        if (aol && it == 0 && !dev) {
            double *d = (double *)(void *)(((uintptr_t)B + 7u) & ~(uintptr_t)7u);
            ns_aol_scale(m, nj, (double)c->ns_eps, x, gram, d);
        } else if (aol && it == 0 &&
                   ns_sharded_aol_device(rt, name, gram, sum, nccl != NULL, x, x, m, nj,
                                         sizeof(float)) != SHARDOPT_OK) {
            failed = 1;
        }
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
    ns_sharded_count(rt, comm, m, count > 0 ? n : 0, sizeof(float), 1);
    if (nccl != NULL && c->ns_steps > 0) {
        const shardopt_status_t told = ns_sharded_flag(rt, name, nccl, failed, sizeof(float));
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

/* The bf16 team products: the CPU's oneDNN plans (rt->ns_ws.bf16, made at commit per block
 * shape), or with Newton-Schulz on a device the device table's bf16 entries (its plans made at
 * commit too: commit_buffers.c, device_team_plans), which give the CPU's roundings. */
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

/* The result guard of Gram Newton-Schulz (ns_coeffs_output_norm_ok) on a bf16 team's result:
 * each member's block xf (count fp32 values, where Newton-Schulz runs), its squared norm summed
 * over comm; *ok = 0 (on every member alike) when the whole m-row result is non-finite or past
 * the bound no Newton-Schulz output can pass. ERR_COMM when the all-reduce failed.
 * Found by test_xcheck (seed 960140 of a 3-rank world): a 2 x 7 matrix in a bf16 team of 2,
 * polar_express x 7 with aol, whose smaller singular value after AOL (0.365) sits near the first
 * polynomial's maximum (1.99 at 0.38); the team's first bf16 step left it at 2.02, where the
 * second polynomial is steep, and the next steps grew it to Inf: every weight of the matrix NaN
 * and the step OK. One more all-reduce of a double per matrix and step. */
static shardopt_status_t result_guard(shardopt_runtime_t rt, const char *name, MPI_Comm comm,
                                      const float *xf, size_t count, int64_t m, int failed, int *ok)
{
    /* the failure flag beside the sum (failed: this member's iterations failed, or over NCCL
     * what it learnt at the flag's read): every member joins this all-reduce and returns here
     * alike. Before, a member that failed in its last update, or whose drain over NCCL failed,
     * returned before it while the others waited in it, and its next team's norm all-reduce met
     * theirs on the same communicator when the team had one more matrix */
    double v[2] = {failed || count == 0 ? 0.0 : rt->ns_ops->sumsq(&rt->kctx, xf, KDT_F32, count),
                   failed ? 1.0 : 0.0};
    const struct groups patient = ns_sharded_patient(rt);
    if (comm_allreduce(&patient, comm, MPI_IN_PLACE, v, 2, MPI_DOUBLE, MPI_SUM,
                       "result guard all-reduce") != MPI_SUCCESS)
        return log_fail(SHARDOPT_ERR_COMM, "step '%s': bf16 team result guard all-reduce failed",
                        name);
    if (v[1] != 0) /* this member said why already */
        return failed ? SHARDOPT_ERR_INTERNAL : ns_sharded_group_failed(name, 0);
    *ok = ns_coeffs_output_norm_ok((const float(*)[3])rt->ns_coeffs, rt->cfg.ns_steps,
                                   rt->ns_norm_scale, m, v[0]);
    int rank = 0;
    MPI_Comm_rank(comm, &rank);
    if (!*ok && rank == 0)
        log_warn("step: rank %d: bf16 team Newton-Schulz of '%s' (%lld rows) gave a result "
                 "non-finite or past the bound (squared norm %g); its team recomputes it in fp32",
                 rt->groups.me.rank, name, (long long)m, v[0]);
    return SHARDOPT_OK;
}

/* ns_sharded_iterate in bf16 (ns_compute = bf16, a team's block): X_j in bf16 from the fp32 load,
 * each iteration's Gram matrix formed and all-reduced in bf16 (half the bytes; pairs summed in
 * fp32 and rounded once), the update with fp32 accumulation, as the gathered bf16 path's
 * (kernels/cpu/ns_bf16.h): oneDNN on the CPU, the device table's bf16 entries on a device.
 * sh_x holds the fp32 staging (count floats), X and Y (bf16, in the next count floats), A and B
 * (bf16, in the next m^2 floats), then on the CPU AOL's m doubles. */
shardopt_status_t ns_sharded_iterate_bf16(shardopt_runtime_t rt, const char *name, MPI_Comm comm,
                                          struct nccl_group *nccl, const struct ns_args *piece,
                                          size_t count, int64_t m, int64_t n, double ss,
                                          int *diverged)
{
    const shardopt_config_t *c = &rt->cfg;
    const int dev = rt_ns_on_device(rt);
    float *xf = rt->sh_x;
    uint16_t *x = (uint16_t *)(void *)(xf + count), *y = x + count;
    uint16_t *A = (uint16_t *)(void *)(xf + 2 * count), *B = A + m * m;
    /* the host side of an MPI sum (A itself on the CPU), and of AOL on a device */
    uint16_t *sum = dev ? (uint16_t *)(void *)rt->sh_host : A;
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
    const shardopt_status_t scaled = ns_sharded_norm(rt, name, comm, NULL, ss, &failed, &inv);
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
        shardopt_status_t status =
            ns_sharded_gram_sum(rt, name, comm, nccl, count > 0, failed, A, sum, m, sizeof(*A));
        const int64_t nj = count > 0 ? n : 0;
        if (status == SHARDOPT_OK && aol && it == 0 && nccl != NULL) /* AOL reads the sum */
            status = nccl_group_drain(nccl);
        if (status != SHARDOPT_OK)
            return status;
        if (aol && it == 0 && !dev) { /* the row scales of the whole matrix's Gram matrix */
            double *d = (double *)(void *)(((uintptr_t)(B + m * m) + 7u) & ~(uintptr_t)7u);
            ns_bf16_aol(m, nj, (double)c->ns_eps, xf, x, A, d);
        } else if (aol && it == 0 &&
                   ns_sharded_aol_device(rt, name, A, sum, nccl != NULL, xf, x, m, nj,
                                         sizeof(*A)) != SHARDOPT_OK) {
            failed = 1;
            continue; /* told in the next all-reduce */
        }
        /* over NCCL the last sum's flag, before the update writes B over it (after AOL's use of
         * sh_host: stream-ordered) */
        if (nccl != NULL && it == c->ns_steps - 1)
            rt->ns_dev->copy(&rt->kctx, rt->sh_host, A + m * m, sizeof(uint16_t));
        if (count > 0 && !failed) {
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
    ns_sharded_count(rt, comm, m, count > 0 ? n : 0, sizeof(uint16_t), 0);
    /* over NCCL the flag's read: the team's failure (every member alike), or this member's own
     * (its drain timed out, its copy of the flag failed), which the guard's all-reduce tells */
    const shardopt_status_t told = nccl != NULL && c->ns_steps > 0
                                       ? ns_sharded_flag(rt, name, nccl, failed, sizeof(uint16_t))
                                       : SHARDOPT_OK;
    const int bad = failed || told != SHARDOPT_OK; /* failed: the last update, said above */
    if (!bad && count > 0 && dev)
        rt->ns_ops->ns_shard_bf16_widen(&rt->kctx, x, xf, count);
    for (size_t i = 0; !bad && i < count && !dev; i++)
        xf[i] = f32_from_bf16(x[i]);
    /* a diverged result goes back to ns_sharded_block, which runs the fp32 iterations (the
     * input is in place: nothing is stored yet) */
    int ok = 1;
    const shardopt_status_t guard = result_guard(rt, name, comm, xf, count, m, bad, &ok);
    if (guard == SHARDOPT_ERR_COMM || told != SHARDOPT_OK) /* an MPI call first: it stops */
        return guard == SHARDOPT_ERR_COMM ? guard : told;
    if (failed || guard != SHARDOPT_OK)
        return failed ? SHARDOPT_ERR_INTERNAL : guard;
    *diverged = !ok;
    if (!ok || count == 0)
        return SHARDOPT_OK;
    rt->ns_ops->ns_shard_store(&rt->kctx, piece, xf);
    return SHARDOPT_OK;
}

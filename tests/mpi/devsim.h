/* The simulated device of tests/mpi/test_device_sim.c, shared with tests/mpi/test_xcheck.c (its
 * devsim combos): kernel and device tables that wrap the CPU reference, on memory the host cannot
 * touch (every allocation mapped PROT_NONE, opened only while one of the table's own entries runs;
 * under SHARDOPT_TEST_NCCL_MOCK it stays open, as the mock NCCL's requests reach it), copy lanes
 * that really are asynchronous, timing marks. A test that touches the simulated memory itself opens
 * it first with sim_protect(PROT_READ | PROT_WRITE) and closes it before the library runs. The
 * includer defines _DEFAULT_SOURCE (MAP_ANONYMOUS) before its first system header. */
#ifndef SHARDOPT_TESTS_DEVSIM_H
#define SHARDOPT_TESTS_DEVSIM_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kernels/clock.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/ns_bf16.h"
#include "kernels/dtype.h"
#include "kernels/ns_coeffs.h"
#include "runtime/runtime.h"
#ifdef SHARDOPT_TEST_NCCL_MOCK
#include "tests/mock/nccl_mock.h"
#endif

/* ---- the simulated device ---- */
/* Which device is current is per thread, as in CUDA: a thread starts on device 0, the device
 * the runtime's init chose is SIM_DEVICE (the trainer made it current on its own thread before
 * init). Every allocation, kernel, copy and event issued while another device is current is
 * counted: on a GPU it would have gone to that device (or failed against init's streams). */
#define SIM_DEVICE 1
static __thread int sim_current;
static long sim_wrong_device;

static void sim_device_check(void) { sim_wrong_device += sim_current != SIM_DEVICE; }

static int sim_device_enter(const struct kernel_ctx *c)
{
    (void)c;
    sim_current = SIM_DEVICE;
    return 0;
}

#define SIM_MAX 1024
static struct {
    char *base;
    size_t len;
} sim[SIM_MAX];
static int nsim;

__attribute__((unused)) static void sim_protect(int prot)
{
    for (int i = 0; i < nsim; i++)
        if (mprotect(sim[i].base, sim[i].len, prot) != 0) {
            perror("mprotect");
            abort();
        }
}

#ifdef SHARDOPT_TEST_NCCL_MOCK
/* test_device_sim_nccl: the mock NCCL's MPI requests reach the simulated memory whenever MPI
 * progresses, so it stays open there (the MPI-exchange builds keep the protection) */
#define SIM_PROT    (PROT_READ | PROT_WRITE)
#define SIM_OPEN()  sim_device_check()
#define SIM_CLOSE() ((void)0)
#else
#define SIM_PROT    PROT_NONE
#define SIM_OPEN()  (sim_device_check(), sim_protect(PROT_READ | PROT_WRITE))
#define SIM_CLOSE() sim_protect(PROT_NONE)
#endif

static void *sim_alloc(size_t bytes)
{
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t len = (bytes + page - 1) / page * page + page;
    sim_device_check();
    if (nsim == SIM_MAX)
        return NULL;
    void *p = mmap(NULL, len, SIM_PROT, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    sim[nsim].base = p;
    sim[nsim].len = len;
    nsim++;
    return p;
}

static void sim_free(void *p)
{
    for (int i = 0; i < nsim; i++)
        if (sim[i].base == p) {
            munmap(sim[i].base, sim[i].len);
            sim[i] = sim[--nsim];
            return;
        }
}

static void sim_momentum(const struct kernel_ctx *c, const struct momentum_args *a)
{
    SIM_OPEN();
    ref_momentum(c, a);
    SIM_CLOSE();
}

static void sim_adamw(const struct kernel_ctx *c, const struct adamw_args *a)
{
    SIM_OPEN();
    ref_adamw(c, a);
    SIM_CLOSE();
}

static void sim_apply(const struct kernel_ctx *c, const struct apply_args *a)
{
    SIM_OPEN();
    ref_apply(c, a);
    SIM_CLOSE();
}

static long sim_ns_gram_aol, sim_ns_other; /* calls by algorithm (gram_and_aol_run_on_the_device) */

/* ns_compute = bf16 on the simulated device: the CPU's oneDNN plans (kernels/cpu/ns_bf16.h), held
 * here as a device would hold its own (the runtime makes none on a device), so that the device
 * gives the CPU bf16 path's bits. A gathered matrix's plan is made at its first call (the CPU
 * makes it at commit: the same primitives); the teams' at commit, by ns_shard_bf16_prepare.
 * Freed by sim_bf16_free once no runtime uses it, or at exit. */
static struct ns_bf16 *sim_bf16;

static void sim_bf16_free(void)
{
    ns_bf16_destroy(sim_bf16);
    sim_bf16 = NULL;
}

static struct ns_bf16 *sim_bf16_state(void)
{
    static int registered; /* freed at exit too, for a test that never calls sim_bf16_free */
    if (!registered)
        registered = atexit(sim_bf16_free) == 0;
    if (sim_bf16 == NULL && ns_bf16_create(&sim_bf16) != SHARDOPT_OK)
        return NULL;
    return sim_bf16;
}

static int sim_ns(const struct kernel_ctx *c, const struct ns_args *a, const struct ns_workspace *w)
{
    if (a->algorithm == NS_ALGO_GRAM && a->precondition == NS_PRECOND_AOL)
        sim_ns_gram_aol++;
    else
        sim_ns_other++;
    struct ns_workspace ws = *w;
    if (a->compute == KDT_BF16) {
        ws.bf16 = sim_bf16_state();
        if (ws.bf16 == NULL || ns_bf16_prepare(ws.bf16, a->rows, a->cols, a->variant, a->block,
                                               a->algorithm, a->coeffs, a->steps) != SHARDOPT_OK)
            return -1;
    }
    SIM_OPEN();
    int rc = ns_ref_newton_schulz(c, a, &ws);
    SIM_CLOSE();
    return rc;
}

/* Sharded Newton-Schulz (Newton-Schulz teams' blocks): the CPU reference's entries, counted
 * (sim_shard_calls) so that a test sees the teams ran on the device table */
static long sim_shard_calls;

static void sim_shard_load(const struct kernel_ctx *c, const struct ns_args *a, double inv,
                           float *x)
{
    sim_shard_calls++;
    SIM_OPEN();
    ns_shard_load(c, a, inv, x);
    SIM_CLOSE();
}

static void sim_shard_gram(const struct kernel_ctx *c, const float *x, int64_t m, int64_t n,
                           float *g)
{
    sim_shard_calls++;
    SIM_OPEN();
    ns_shard_gram_ref(c, x, m, n, g);
    SIM_CLOSE();
}

static void sim_shard_update(const struct kernel_ctx *c, const float *g, const float k[3],
                             const float *x, int64_t m, int64_t n, float *B, float *y)
{
    sim_shard_calls++;
    SIM_OPEN();
    ns_shard_update_ref(c, g, k, x, m, n, B, y);
    SIM_CLOSE();
}

static void sim_shard_store(const struct kernel_ctx *c, const struct ns_args *a, const float *x)
{
    sim_shard_calls++;
    SIM_OPEN();
    ns_shard_store(c, a, x);
    SIM_CLOSE();
}

/* bf16 teams (ns_compute = bf16): the CPU bf16 team's oneDNN plans (ns_bf16_shard_*), counted
 * (sim_shard_bf16_calls) so that a test sees the teams ran in bf16 on the device table. The plans
 * are found by shape and the coefficient table they were prepared with (a runtime has one; the
 * Gram product does not depend on it, but the plans are kept per table). */
static long sim_shard_bf16_calls;
static float sim_bf16_coeffs[NS_TABLE_MAX_STEPS][3];
static int sim_bf16_steps;

static const struct ns_bf16_shard *sim_bf16_plan(int64_t m, int64_t n)
{
    return ns_bf16_shard_find(sim_bf16, m, n, (const float(*)[3])sim_bf16_coeffs, sim_bf16_steps);
}

static int sim_shard_bf16_prepare(const struct kernel_ctx *c, int64_t m, int64_t n,
                                  const float (*k)[3], int steps)
{
    (void)c;
    struct ns_bf16 *b = sim_bf16_state();
    if (b == NULL || steps < 1 || steps > NS_TABLE_MAX_STEPS)
        return -1;
    memcpy(sim_bf16_coeffs, k, sizeof(float) * 3 * (size_t)steps);
    sim_bf16_steps = steps;
    return ns_bf16_shard_prepare(b, m, n, k, steps) == SHARDOPT_OK ? 0 : -1;
}

static int sim_shard_bf16_gram(const struct kernel_ctx *c, const uint16_t *x, int64_t m, int64_t n,
                               uint16_t *A)
{
    (void)c;
    sim_shard_bf16_calls++;
    const struct ns_bf16_shard *p = sim_bf16_plan(m, n);
    if (p == NULL)
        return -1;
    SIM_OPEN();
    const int rc = ns_bf16_shard_gram(sim_bf16, p, x, A);
    SIM_CLOSE();
    return rc;
}

static int sim_shard_bf16_update(const struct kernel_ctx *c, const float (*k)[3], int steps, int s,
                                 const uint16_t *A, const uint16_t *x, int64_t m, int64_t n,
                                 uint16_t *B, uint16_t *y)
{
    (void)c;
    sim_shard_bf16_calls++;
    const struct ns_bf16_shard *p = ns_bf16_shard_find(sim_bf16, m, n, k, steps);
    if (p == NULL)
        return -1;
    SIM_OPEN();
    const int rc = ns_bf16_shard_update(sim_bf16, p, s, A, x, B, y);
    SIM_CLOSE();
    return rc;
}

static void sim_shard_bf16_round(const struct kernel_ctx *c, const float *x, uint16_t *y, size_t n)
{
    (void)c;
    sim_shard_bf16_calls++;
    SIM_OPEN();
    for (size_t i = 0; i < n; i++)
        y[i] = bf16_from_f32(x[i]);
    SIM_CLOSE();
}

static void sim_shard_bf16_widen(const struct kernel_ctx *c, const uint16_t *x, float *y, size_t n)
{
    (void)c;
    sim_shard_bf16_calls++;
    SIM_OPEN();
    for (size_t i = 0; i < n; i++)
        y[i] = f32_from_bf16(x[i]);
    SIM_CLOSE();
}

static void sim_copy2d(const struct kernel_ctx *c, void *d, size_t dp, const void *s, size_t sp,
                       size_t w, size_t rows)
{
    SIM_OPEN();
    cpu_copy2d(c, d, dp, s, sp, w, rows);
    SIM_CLOSE();
}

static double sim_sumsq(const struct kernel_ctx *c, const void *x, int dt, size_t n)
{
    SIM_OPEN();
    double r = cpu_sumsq(c, x, dt, n);
    SIM_CLOSE();
    return r;
}

static void sim_sumsq_many(const struct kernel_ctx *c, const void *const *x, const int *dt,
                           const size_t *n, int count, double *out)
{
    for (int i = 0; i < count; i++)
        out[i] = n[i] > 0 ? sim_sumsq(c, x[i], dt[i], n[i]) : 0.0;
}

static void sim_copy(const struct kernel_ctx *c, void *d, const void *s, size_t n)
{
    SIM_OPEN();
    cpu_copy(c, d, s, n);
    SIM_CLOSE();
}

static void sim_fill(const struct kernel_ctx *c, void *d, int byte, size_t n)
{
    SIM_OPEN();
    cpu_fill(c, d, byte, n);
    SIM_CLOSE();
}

/* Batched launches: run in order, counted (launches vs calls) so the test sees batching work. */
static long sim_launches, sim_calls;

static void sim_momentum_many(const struct kernel_ctx *c, const struct momentum_args *a, int n)
{
    sim_launches++;
    sim_calls += n;
    for (int i = 0; i < n; i++)
        sim_momentum(c, &a[i]);
}

static void sim_adamw_many(const struct kernel_ctx *c, const struct adamw_args *a, int n)
{
    sim_launches++;
    sim_calls += n;
    for (int i = 0; i < n; i++)
        sim_adamw(c, &a[i]);
}

static void sim_apply_many(const struct kernel_ctx *c, const struct apply_args *a, int n)
{
    sim_launches++;
    sim_calls += n;
    for (int i = 0; i < n; i++)
        sim_apply(c, &a[i]);
}

/* Copy lanes that really are asynchronous: a copy queued on lane 1 or 2 happens only when some
 * lane waits for that lane (or at sync), so a missing wait leaves a kernel reading a slot that
 * has not arrived, or a copy-out reading one a later kernel overwrote. */
#define SIM_QUEUE 4096
static struct {
    void *dst;
    const void *src;
    size_t bytes;
    int mark; /* >= 0: a timing mark, stamped when the lane gets this far */
} simq[KERNEL_LANES][SIM_QUEUE];
static int simq_n[KERNEL_LANES];
static long sim_lane_copies, sim_lane_marks;
static double sim_mark_at[KERNEL_MAX_MARKS]; /* host time of each mark, NaN until it happened */

static long simq_done[KERNEL_LANES];                   /* entries each lane has run */
static long sim_event[KERNEL_LANES][KERNEL_LANE_TAGS]; /* lane_record: entries queued by then */

/* Run the lane's entries up to the upto-th ever queued (a wait runs no further than the record
 * it waits for: later copies stay pending, as on a device). */
static void sim_lane_run(int lane, long upto)
{
    int i = 0;
    for (; i < simq_n[lane] && simq_done[lane] < upto; i++, simq_done[lane]++)
        if (simq[lane][i].mark >= 0)
            sim_mark_at[simq[lane][i].mark] = monotonic_seconds();
        else
            sim_copy(NULL, simq[lane][i].dst, simq[lane][i].src, simq[lane][i].bytes);
    memmove(simq[lane], simq[lane] + i, sizeof simq[lane][0] * (size_t)(simq_n[lane] - i));
    simq_n[lane] -= i;
}

static void sim_lane_flush(int lane) { sim_lane_run(lane, simq_done[lane] + simq_n[lane]); }

static void sim_copy_on(const struct kernel_ctx *c, int lane, void *d, const void *s, size_t n)
{
    sim_device_check();
    if (lane == 0 || simq_n[lane] == SIM_QUEUE) {
        if (lane != 0)
            sim_lane_flush(lane); /* full: keep the lane's order */
        sim_copy(c, d, s, n);
        return;
    }
    simq[lane][simq_n[lane]].dst = d;
    simq[lane][simq_n[lane]].src = s;
    simq[lane][simq_n[lane]].bytes = n;
    simq[lane][simq_n[lane]].mark = -1;
    simq_n[lane]++;
    sim_lane_copies++;
}

/* Timing marks as a device has them: a mark on a copy lane happens when the lane runs it, after
 * the copies queued before it and before those queued after (a lane runs when flushed), so the
 * runtime's device timeline (kernels/timeline.h) runs here against host clocks. */
static int sim_mark(const struct kernel_ctx *c, int lane, int id)
{
    (void)c;
    if (id < 0 || id >= KERNEL_MAX_MARKS || lane < 0 || lane >= KERNEL_LANES)
        return -1;
    sim_device_check();
    sim_mark_at[id] = NAN;
    if (lane == 0) {
        sim_mark_at[id] = monotonic_seconds();
        return 0;
    }
    if (simq_n[lane] == SIM_QUEUE)
        sim_lane_flush(lane);
    simq[lane][simq_n[lane]].mark = id;
    simq_n[lane]++;
    sim_lane_marks++;
    return 0;
}

/* The simulated device's memory is what sim_alloc mapped. */
static int sim_pointer_kind(const struct kernel_ctx *c, const void *p, int dev[2])
{
    (void)c;
    dev[0] = -1;
    dev[1] = 0;
    for (int i = 0; i < nsim; i++)
        if ((const char *)p >= sim[i].base && (const char *)p < sim[i].base + sim[i].len) {
            dev[0] = 0;
            return KERNEL_PTR_DEVICE;
        }
    return KERNEL_PTR_HOST;
}

/* sim_hold_marks: the device is "still running the step": every mark reads as not yet
 * happened until something waits for one (mark_seconds), as a trainer's stream would leave the
 * step's work queued. sim_mark_waits counts those waits. */
static int sim_hold_marks;
static long sim_mark_waits;

static double sim_mark_seconds(const struct kernel_ctx *c, int a, int b)
{
    (void)c;
    sim_mark_waits++;
    for (int l = 1; l < KERNEL_LANES; l++) /* waiting for a mark waits for its lane */
        sim_lane_flush(l);
    return sim_mark_at[b] - sim_mark_at[a];
}

static int sim_mark_done(const struct kernel_ctx *c, int id)
{
    (void)c;
    if (id < 0 || id >= KERNEL_MAX_MARKS)
        return -1;
    return !sim_hold_marks && sim_mark_at[id] == sim_mark_at[id];
}

static void sim_lane_record(const struct kernel_ctx *c, int lane, int tag)
{
    (void)c;
    sim_device_check();
    sim_event[lane][tag] = simq_done[lane] + simq_n[lane];
}

/* Compute-stream waits on the copy-out lane: staging_join's, once per step (a wait at the end
 * of every bucket's streaming would stall the compute stream there). */
static long sim_out_joins;

static void sim_lane_wait(const struct kernel_ctx *c, int waiter, int signaler, int tag)
{
    (void)c;
    sim_device_check();
    sim_out_joins += waiter == 0 && signaler == 2;
    if (signaler != 0) /* the compute lane runs at once: nothing of it is pending */
        sim_lane_run(signaler, sim_event[signaler][tag]);
}

static int sim_sync(const struct kernel_ctx *c)
{
    (void)c;
    for (int l = 1; l < KERNEL_LANES; l++)
        sim_lane_flush(l);
    return 0;
}

static void *sim_host_alloc(size_t bytes) { return cpu_alloc(bytes); }

#ifdef SHARDOPT_TEST_NCCL_MOCK
/* Ordering with a trainer's stream: nothing to order on the host; present so that the step
 * drains its NCCL groups at its end as on CUDA. */
static shardopt_status_t sim_stream_edge(const struct kernel_ctx *c, void *caller)
{
    (void)c, (void)caller;
    return SHARDOPT_OK;
}
#endif

static const struct kernel_ops sim_ops = {
    .name = "devsim",
    .momentum = sim_momentum,
    .adamw = sim_adamw,
    .apply = sim_apply,
    .momentum_many = sim_momentum_many,
    .adamw_many = sim_adamw_many,
    .apply_many = sim_apply_many,
    .newton_schulz = sim_ns,
    .ns_shard_load = sim_shard_load,
    .ns_shard_gram = sim_shard_gram,
    .ns_shard_update = sim_shard_update,
    .ns_shard_store = sim_shard_store,
    .ns_shard_bf16_prepare = sim_shard_bf16_prepare,
    .ns_shard_bf16_gram = sim_shard_bf16_gram,
    .ns_shard_bf16_update = sim_shard_bf16_update,
    .ns_shard_bf16_round = sim_shard_bf16_round,
    .ns_shard_bf16_widen = sim_shard_bf16_widen,
    .sumsq = sim_sumsq,
    .sumsq_many = sim_sumsq_many,
    .ns_workspace_bytes = cpu_ns_workspace_bytes,
};

/* What CUDA's device table can do, but for choosing and creating a backend (there is one
 * simulated device, already current) and pinning host memory allocated elsewhere. */
static const struct device_ops sim_dev = {
    .name = "devsim",
    .caps = DEVICE_CAP_DEVICE_MEMORY | DEVICE_CAP_HOST_PINNED | DEVICE_CAP_COPY_LANES |
            DEVICE_CAP_MARKS | DEVICE_CAP_POINTER_KIND | DEVICE_CAP_THREAD_DEVICE
#ifdef SHARDOPT_TEST_NCCL_MOCK
            | DEVICE_CAP_STREAMS
#endif
    ,
    .copy = sim_copy,
    .copy2d = sim_copy2d,
    .fill = sim_fill,
    .alloc = sim_alloc,
    .free = sim_free,
    .sync = sim_sync,
    .copy_on = sim_copy_on,
    .lane_record = sim_lane_record,
    .lane_wait = sim_lane_wait,
    .host_alloc = sim_host_alloc,
    .host_free = cpu_free,
    .mark = sim_mark,
    .mark_seconds = sim_mark_seconds,
    .mark_done = sim_mark_done,
    .pointer_kind = sim_pointer_kind,
    .device_enter = sim_device_enter,
#ifdef SHARDOPT_TEST_NCCL_MOCK
    .stream_begin = sim_stream_edge,
    .stream_end = sim_stream_edge,
#endif
};

#endif

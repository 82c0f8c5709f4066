/* init and finalize: the runtime's life cycle. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "base/env.h"
#include "base/fault.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/status.h"
#include "kernels/blas_threads.h"
#include "kernels/cpu/ns_bf16.h"
#include "runtime/comm/comm_wait.h"
#include "runtime/config/config.h"
#include "runtime/config/config_agree.h"
#include "runtime/cpu_kinds.h"
#include "runtime/live.h"
#include "runtime/runtime.h"
#include "runtime/step/alias_check.h"

/* The CPU table the config's `kernels` names. */
static shardopt_status_t cpu_kernels_select(const shardopt_config_t *cfg,
                                            const struct kernel_ops **ops_p, int *no_bf16_p)
{
    const struct kernel_ops *ops = NULL;

    /* "set and not 0" took "0 " or "no" as set: the two values the switch has, else refused;
     * read here only, the value kept for ns_compute_resolve */
    const char *no_bf16 = env_get("SHARDOPT_CPU_NO_BF16");
    *no_bf16_p = no_bf16 != NULL && strcmp(no_bf16, "1") == 0;
    if (no_bf16 != NULL && no_bf16[0] != '\0' && strcmp(no_bf16, "0") != 0 && !*no_bf16_p)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "SHARDOPT_CPU_NO_BF16 = '%.64s': accepted 1 (ns_compute = auto acts as on "
                        "a CPU without native bf16), 0 or empty (it does not)",
                        no_bf16);
    /* a job over mixed CPUs, on one machine (tests): auto as on a CPU without the wider tables */
    const char *cap = env_get("SHARDOPT_CPU_KERNELS_MAX");
    if (cfg->kernels == SHARDOPT_KERNELS_AUTO && cap != NULL && strcmp(cap, "avx512") != 0 &&
        strcmp(cap, "avx2") != 0 && strcmp(cap, "portable") != 0)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "SHARDOPT_CPU_KERNELS_MAX = '%.64s': accepted avx512, avx2 or portable "
                        "(the widest table kernels = auto may take)",
                        cap);
    switch (cfg->kernels) {
    case SHARDOPT_KERNELS_AUTO:
        ops = cap == NULL || strcmp(cap, "avx512") == 0 ? kernel_ops_cpu_best()
              : strcmp(cap, "avx2") == 0 && kernel_ops_cpu_avx2() != NULL
                  ? kernel_ops_cpu_avx2()
                  : kernel_ops_cpu_portable();
        break;
    case SHARDOPT_KERNELS_REFERENCE: ops = kernel_ops_cpu_ref(); break;
    case SHARDOPT_KERNELS_PORTABLE: ops = kernel_ops_cpu_portable(); break;
    case SHARDOPT_KERNELS_AVX512:
        ops = kernel_ops_cpu_avx512();
        if (ops == NULL)
            return log_fail(
                SHARDOPT_ERR_UNSUPPORTED,
                "config kernels = avx512: this CPU (or build) lacks AVX-512 F/BW/VL/DQ; "
                "use auto or portable");
        break;
    case SHARDOPT_KERNELS_AVX2:
        ops = kernel_ops_cpu_avx2();
        if (ops == NULL)
            return log_fail(SHARDOPT_ERR_UNSUPPORTED,
                            "config kernels = avx2: this CPU (or build) lacks AVX2 and FMA; use "
                            "auto or portable");
        break;
    }
    *ops_p = ops;
    return SHARDOPT_OK;
}

/* The tables that run the step (ops, dev) and the ones that run Newton-Schulz (ns_ops, ns_dev):
 * the same, but for offload = cpu on CUDA, where the elementwise work stays on the host (CPU
 * tables) and only Newton-Schulz goes to the device. */
static shardopt_status_t kernels_select(struct shardopt_runtime *rt)
{
    const shardopt_config_t *cfg = &rt->cfg;
    const struct kernel_ops **ops_p = &rt->ops, **ns_ops_p = &rt->ns_ops;

    if (cfg->backend == SHARDOPT_BACKEND_CUDA) {
        if (kernel_ops_cuda() == NULL)
            return log_fail(SHARDOPT_ERR_UNSUPPORTED,
                            "config backend = cuda: this build has no CUDA backend (configure "
                            "with nvcc on the PATH or SHARDOPT_WITH_CUDA=ON)");
        *ns_ops_p = kernel_ops_cuda();
        rt->ns_dev = device_ops_cuda();
        if (cfg->offload == SHARDOPT_OFFLOAD_CPU) {
            rt->dev = device_ops_cpu();
            return cpu_kernels_select(cfg, ops_p, &rt->cpu_no_bf16);
        }
        if (cfg->nonfinite == SHARDOPT_NONFINITE_ZERO) /* the pre-pass recount reads host memory */
            return log_fail(SHARDOPT_ERR_UNSUPPORTED,
                            "config backend = cuda with nonfinite = zero: the CPU backend (or "
                            "offload = cpu) only for now; use skip or error");
        *ops_p = kernel_ops_cuda();
        rt->dev = device_ops_cuda();
        return SHARDOPT_OK;
    }
    shardopt_status_t status = cpu_kernels_select(cfg, ops_p, &rt->cpu_no_bf16);
    *ns_ops_p = *ops_p;
    rt->dev = rt->ns_dev = device_ops_cpu();
    return status;
}

/* The part of init shared by both entry points: checks, config, kernels. */
static shardopt_status_t runtime_create(const shardopt_config_t *cfg, shardopt_runtime_t *rt_p,
                                        const char *who)
{
    shardopt_status_t status;
    struct shardopt_runtime *rt;
    int mpi_ready = 0;

    if (cfg == NULL)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "%s: NULL cfg", who);
    MPI_Initialized(&mpi_ready);
    if (!mpi_ready)
        return log_fail(SHARDOPT_ERR_STATE, "%s: MPI is not initialised (call MPI_Init first)",
                        who);
    status = rt_mpi_live(who);
    if (status != SHARDOPT_OK)
        return status;
    if (log_env_check() != NULL)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "%s: %s", who, log_env_check());

    rt = mem_calloc(1, sizeof(*rt));
    if (rt == NULL)
        return log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                        "%s: out of memory allocating %zu bytes for the runtime", who, sizeof(*rt));
    status = config_import(cfg, &rt->cfg);
    if (status == SHARDOPT_OK)
        status = config_env_for_init(&rt->cfg, who);
    if (status == SHARDOPT_OK)
        status = config_check_all(&rt->cfg, "");
    if (status == SHARDOPT_OK)
        status = kernels_select(rt);
    if (status != SHARDOPT_OK) {
        free(rt);
        return status;
    }
    *rt_p = rt;
    return SHARDOPT_OK;
}

/* runtime_create's status, agreed over a and b (b may be MPI_COMM_NULL) before the groups are
 * built: one rank out of memory (or with a config the others accept) must not leave the rest in
 * the collectives that build them. The first wait for every rank to reach init: under this
 * rank's own comm_timeout_s (rt's config; the default when this rank refused its config), so
 * that a rank that never arrives ends the job with a message instead of a silent hang. */
static shardopt_status_t create_agree(MPI_Comm a, MPI_Comm b, shardopt_status_t mine,
                                      const struct shardopt_runtime *rt, const char *who)
{
    const shardopt_config_t defaults = SHARDOPT_CONFIG_INIT;
    int rank = 0, size = 1, rep = 0;

    if (!groups_mpi_usable() || a == MPI_COMM_NULL)
        return mine; /* refused alike everywhere, with nothing to agree over */
    MPI_Comm_rank(a, &rank);
    if (b != MPI_COMM_NULL) {
        MPI_Comm_size(a, &size);
        MPI_Comm_rank(b, &rep);
    }
    comm_phase(who, -1);
    return groups_agree_on(a, b, rep * size + rank, mine, who,
                           rt != NULL ? rt->cfg.comm_timeout_s : defaults.comm_timeout_s);
}

/* bf16 Newton-Schulz where the CPU multiplies bf16 natively (auto), or as configured.
 * masked (SHARDOPT_CPU_NO_BF16=1, as cpu_kernels_select read it) makes auto treat the CPU as one
 * without (to test the fallback). */
static int ns_compute_resolve(const shardopt_config_t *c, int rank, int masked)
{
    if (c->backend == SHARDOPT_BACKEND_CUDA) {
        if (c->ns_compute == SHARDOPT_NS_COMPUTE_FP32 && rank == 0)
            log_warn("init: ns_compute = fp32 on the CUDA backend: its Newton-Schulz is bf16 with "
                     "fp32 accumulation (cuBLAS); running bf16");
        return KDT_BF16;
    }
    const int native = ns_bf16_native() && !masked;

    if (c->ns_compute == SHARDOPT_NS_COMPUTE_FP32) {
        if (rank == 0)
            log_info("init: Newton-Schulz in fp32 (ns_compute = fp32)");
        return KDT_F32;
    }
    if (c->ns_compute == SHARDOPT_NS_COMPUTE_BF16) {
        if (!native && rank == 0)
            log_warn("init: ns_compute = bf16 on a CPU without native bf16 dot products%s: "
                     "emulated (oneDNN's AVX-512 kernels, or an fp32 sgemm on the bf16 values "
                     "where oneDNN has none), slower than fp32",
                     masked ? " (SHARDOPT_CPU_NO_BF16)" : "");
        return KDT_BF16;
    }
    /* auto: ns_compute_agree logs the choice once the ranks agree on it */
    return native ? KDT_BF16 : KDT_F32;
}

/* ns_compute = auto on the CPU: bf16 only where every rank of the runtime has native bf16. The
 * owners' plan follows the dtype (its variant tables), so ranks resolving it differently (a job
 * spread over CPUs with and without AVX512_BF16, or SHARDOPT_CPU_NO_BF16 set on some ranks only)
 * planned differently and failed their first exchange with MPI_ERR_TRUNCATE. Collective. */
static shardopt_status_t ns_compute_agree(shardopt_runtime_t rt)
{
    const struct groups *g = &rt->groups;
    if (rt->cfg.backend == SHARDOPT_BACKEND_CUDA || rt->cfg.ns_compute != SHARDOPT_NS_COMPUTE_AUTO)
        return SHARDOPT_OK;
    /* both MIN: bf16 only where every rank has it; the lowest rank without it, for the message */
    int v[2] = {rt->ns_compute == KDT_BF16, rt->ns_compute == KDT_BF16 ? INT_MAX : groups_rank(g)};
    if (groups_allreduce(g, v, 2, MPI_INT, MPI_MIN) != MPI_SUCCESS)
        return groups_agree(
            g, log_fail(SHARDOPT_ERR_COMM, "init: ns_compute agreement all-reduce failed"), "init");
    const int bf16 = v[0], lowest_without = v[1];
    if (rt->ns_compute == KDT_BF16 && !bf16)
        rt->ns_compute = KDT_F32;
    if (groups_rank(g) == 0) {
        if (bf16)
            log_info("init: Newton-Schulz in bf16 (ns_compute = auto: every rank's CPU has native "
                     "bf16 dot products)");
        else if (lowest_without == 0)
            log_info("init: Newton-Schulz in fp32 (ns_compute = auto: this CPU has no native bf16 "
                     "(AVX512_BF16, AMX-BF16) or SHARDOPT_CPU_NO_BF16 is set)");
        else
            log_warn("init: Newton-Schulz in fp32 on every rank (ns_compute = auto): rank %d (and "
                     "maybe others) has no native bf16 dot products or SHARDOPT_CPU_NO_BF16 set, "
                     "and every rank must iterate in the same dtype; set ns_compute = bf16 to "
                     "force it (emulated, slower, on the ranks without)",
                     lowest_without);
    }
    return SHARDOPT_OK;
}

/* Device backends: which device this rank uses (-1: the current one), and its PCI bus id for
 * binding (busid[0] = 0 when unknown). Collective over `local` with device = local_rank. */
static int device_choose(shardopt_runtime_t rt, MPI_Comm local, char *busid, size_t len)
{
    int device = -1, local_rank = 0;

    busid[0] = '\0';
    if (!device_has(rt->ns_dev, DEVICE_CAP_BACKEND))
        return -1;
    const int count = rt->ns_dev->device_count();
    if (rt->cfg.device == SHARDOPT_DEVICE_LOCAL_RANK) {
        MPI_Comm node;
        const char *was = comm_phase_now();
        comm_phase("init: splitting the ranks by node (device = local_rank)", -1);
        /* on failure (a fault), local rank 0: init goes on to the device's agreement */
        if (comm_split_node(&rt->groups, local, rt->groups.me.rank, &node, "node's group") ==
            MPI_SUCCESS) {
            MPI_Comm_rank(node, &local_rank);
            MPI_Comm_free(&node);
        }
        comm_phase(was, -1);
        device = count > 0 ? local_rank % count : 0;
    }
    if (count > 0 && rt->ns_dev->device_pci_bus_id(device, busid, len) != 0)
        busid[0] = '\0';
    return device;
}

shardopt_status_t rt_nccl_create(shardopt_runtime_t rt)
{
    const struct groups *g = &rt->groups;
    shardopt_status_t status = SHARDOPT_OK;
    /* the same order on every rank (rt_nccl_groups'): each communicator is made by all of its
     * members */
    const struct {
        MPI_Comm comm;
        struct nccl_group **out;
        const char *name;
    } made[] = {{g->dense, &rt->nccl[GROUP_DENSE], "dense"},
                {g->xs, &rt->nccl[GROUP_EXPERT], "expert shard"},
                {g->rep, &rt->nccl_rep, "replicate"}};
    const struct nccl_group *first = NULL; /* its stream serves every group */
    const char *was = comm_phase_now();
    comm_phase("init: NCCL communicators", -1);
    for (size_t i = 0; i < sizeof made / sizeof made[0] && status == SHARDOPT_OK; i++) {
        int size = 1;
        MPI_Comm_size(made[i].comm, &size);
        if (size > 1)
            status = nccl_group_create(g, made[i].comm, rt->kctx.stream, rt->cfg.comm_timeout_s,
                                       made[i].name, first, made[i].out);
        first = first != NULL ? first : *made[i].out;
        status = groups_agree(g, status, "init");
    }
    comm_phase(was, -1);
    return status;
}

/* The CUDA backend's state and stream on the chosen device. Collective: a failure on one rank
 * fails init on all. */
static shardopt_status_t device_start(shardopt_runtime_t rt, int device)
{
    const struct groups *g = &rt->groups;
    int count = 0;
    shardopt_status_t status = SHARDOPT_OK;

    if (!device_has(rt->ns_dev, DEVICE_CAP_BACKEND))
        return SHARDOPT_OK;
    count = rt->ns_dev->device_count();
    if (count == 0)
        status = log_fail(SHARDOPT_ERR_DEVICE,
                          "init: rank %d: backend = cuda but no CUDA device "
                          "is visible (CUDA_VISIBLE_DEVICES, driver)",
                          g->me.rank);
    if (status == SHARDOPT_OK) {
        /* out of memory for its host state, or the device's failure, as the backend says */
        status = rt->ns_dev->backend_create(device, &rt->kctx.stream, &rt->kctx.backend);
        if (status != SHARDOPT_OK)
            status = log_fail_context(status, "init: rank %d", g->me.rank);
    }
    status = groups_agree(g, status, "init");
    if (status != SHARDOPT_OK)
        return status;
    /* NCCL moves device memory only: with offload = cpu the exchange buffers are host memory
     * (the CPU table's) and travel over MPI */
    if (rt->cfg.comm_backend == SHARDOPT_COMM_NCCL && rt_on_device(rt)) {
        status = rt_nccl_create(rt);
        if (status != SHARDOPT_OK)
            return status;
    }
    log_info("init: rank %d: CUDA device %d of %d (%s), comm %s", g->me.rank, device, count,
             device >= 0 ? "node-local rank" : "the current device",
             rt->cfg.comm_backend == SHARDOPT_COMM_MPI ? "mpi via pinned host buffers" : "nccl");
    return SHARDOPT_OK;
}

static void device_stop(shardopt_runtime_t rt)
{
    struct nccl_group *made[GROUP_KINDS + 1];
    for (int i = rt_nccl_groups(rt, made) - 1; i >= 0; i--) /* sharers of the stream first */
        nccl_group_destroy(made[i]);
    memset(rt->nccl, 0, sizeof rt->nccl);
    rt->nccl_rep = NULL;
    memset(rt->xport, 0, sizeof rt->xport); /* they borrowed the groups */
    if (rt->kctx.backend != NULL)
        rt->ns_dev->backend_destroy(rt->kctx.backend);
    rt->kctx.backend = NULL;
    rt->kctx.stream = NULL;
}

/* Once the groups exist: the device, threads, coefficient tables, the state store. */
static shardopt_status_t runtime_start(shardopt_runtime_t rt, MPI_Comm local)
{
    const struct groups *g = &rt->groups;

    char busid[64];
    log_set_rank(groups_rank(g));
    fault_set_rank(groups_rank(g));
    const int device = device_choose(rt, local, busid, sizeof busid);
    topology_init(&rt->topo, &rt->cfg, g, local, busid[0] ? busid : NULL);
    /* threads: as configured, else (bind = auto) the bound cores, else as the process had */
    const int threads = rt->cfg.num_threads > 0 ? rt->cfg.num_threads : rt->topo.threads;
    rt->kctx.threads = threads;
    blas_threads_set(threads);
    config_ns_resolve(&rt->cfg, rt->ns_coeffs, &rt->ns_norm_scale);
    rt->ns_compute = ns_compute_resolve(&rt->cfg, g->me.rank, rt->cpu_no_bf16);
    shardopt_status_t agreed = ns_compute_agree(rt);
    if (agreed == SHARDOPT_OK) /* after ns_compute, which the kind names */
        agreed = cpu_kinds_agree(rt, NULL);
    if (agreed != SHARDOPT_OK)
        return agreed;
    state_store_init(&rt->store, rt->dev);
    timeline_init(&rt->timeline, rt->dev, &rt->kctx);
    if (rt->ops->momentum_many != NULL && rt->ew == NULL)
        rt->ew = mem_calloc(1, sizeof *rt->ew); /* NULL: calls run one at a time, still correct */

    if (!blas_threads_uses_openmp())
        log_warn("init: the linked OpenBLAS is not its OpenMP build: BLAS and kernel threads "
                 "compete for cores (install libopenblas-openmp-dev and rebuild)");
    log_info("init: rank %d of %d (replica %d, dense %d/%d, ep %d/%d, expert shard %d/%d), "
             "kernels %s, BLAS threads %d, momentum %s, comm %s",
             g->me.rank, g->mesh.world, g->me.rep, g->me.d, g->mesh.dense, g->me.ep_rank,
             g->mesh.ep, g->me.xs_rank, mesh_xs_size(&g->mesh), rt->ops->name, blas_threads_get(),
             rt->cfg.momentum_dtype == SHARDOPT_DTYPE_BF16 ? "bf16" : "fp32",
             rt->cfg.comm_dtype == SHARDOPT_DTYPE_BF16 ? "bf16" : "fp32");
    return device_start(rt, device);
}

/* Undo runtime_start and the groups, and free the runtime (a failed init). */
static void runtime_unstart(shardopt_runtime_t rt)
{
    free(rt->ew);
    device_stop(rt);
    groups_free(&rt->groups);
    topology_free(&rt->topo);
    free(rt);
}

/* An intercommunicator (two groups, MPI_Intercomm_create) given where a group belongs: the
 * library's collectives on it are erroneous (an MPI_IN_PLACE all-reduce) and MPI ended the job
 * with MPI_ERR_BUFFER inside init. Refused before any communication, on this rank (local, as
 * MPI_COMM_NULL is: ranks passing the same kind of communicator are refused alike). */
static shardopt_status_t intra_check(MPI_Comm c, const char *who, const char *field)
{
    int inter = 0;
    if (c == MPI_COMM_NULL || !groups_mpi_usable() ||
        MPI_Comm_test_inter(c, &inter) != MPI_SUCCESS || !inter)
        return SHARDOPT_OK;
    return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                    "%s: %s is an intercommunicator: the runtime's groups are intracommunicators "
                    "(MPI_Intercomm_merge makes one of it)",
                    who, field);
}

shardopt_status_t shardopt_init(MPI_Comm comm, const shardopt_config_t *cfg,
                                shardopt_runtime_t *rt_p)
{
    shardopt_status_t status;
    shardopt_runtime_t rt = NULL;

    if (comm == MPI_COMM_NULL)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "init: comm is MPI_COMM_NULL");
    if ((status = intra_check(comm, "init", "comm")) != SHARDOPT_OK)
        return status;
    /* a NULL rt_p on one rank joins init's first agreement like any refusal of runtime_create:
     * returning alone left the others in it until comm_timeout_s */
    status = rt_p == NULL ? log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "init: NULL rt_p")
                          : runtime_create(cfg, &rt, "init");
    status = create_agree(comm, MPI_COMM_NULL, status, rt, "init");
    if (status != SHARDOPT_OK) {
        free(rt); /* created here but refused elsewhere; NULL when refused here */
        return status;
    }
    rt->groups.timeout_s = rt->cfg.comm_timeout_s;
    status = groups_create(comm, &rt->cfg, &rt->groups);
    if (status == SHARDOPT_OK && (status = config_agree(&rt->groups, &rt->cfg, "init")) != 0)
        groups_free(&rt->groups);
    if (status != SHARDOPT_OK) {
        free(rt);
        return status;
    }
    status = runtime_start(rt, comm);
    rt->groups.world = MPI_COMM_NULL; /* the caller's: it may free it once init returns */
    if (status != SHARDOPT_OK) {
        runtime_unstart(rt);
        return status;
    }
    live_add(rt);
    *rt_p = rt;
    return SHARDOPT_OK;
}

shardopt_status_t shardopt_init_from_groups(const shardopt_groups_t *groups,
                                            const shardopt_config_t *cfg, shardopt_runtime_t *rt_p)
{
    shardopt_status_t status;
    shardopt_runtime_t rt = NULL;

    if (groups == NULL)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "init_from_groups: NULL groups");
    if (groups->version < 1 || groups->version > SHARDOPT_GROUPS_VERSION ||
        groups->size < sizeof(shardopt_groups_t))
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "init_from_groups: groups version %u / size %zu: initialise with "
                        "SHARDOPT_GROUPS_INIT",
                        groups->version, groups->size);
    const struct {
        MPI_Comm c;
        const char *field;
    } given[] = {{groups->dense_shard, "groups.dense_shard"},
                 {groups->ep, "groups.ep"},
                 {groups->expert_shard, "groups.expert_shard"},
                 {groups->replicate, "groups.replicate"}};
    for (size_t i = 0; i < sizeof given / sizeof given[0]; i++)
        if ((status = intra_check(given[i].c, "init_from_groups", given[i].field)) != SHARDOPT_OK)
            return status;
    /* a NULL rt_p on one rank joins the first agreement (shardopt_init's) */
    status = rt_p == NULL ? log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "init_from_groups: NULL rt_p")
                          : runtime_create(cfg, &rt, "init_from_groups");
    status = create_agree(groups->dense_shard, groups->replicate, status, rt, "init_from_groups");
    if (status != SHARDOPT_OK) {
        free(rt);
        return status;
    }
    rt->groups.timeout_s = rt->cfg.comm_timeout_s;
    status = groups_from_trainer(groups, &rt->groups);
    if (status == SHARDOPT_OK &&
        (status = config_agree(&rt->groups, &rt->cfg, "init_from_groups")) != 0)
        groups_free(&rt->groups);
    if (status != SHARDOPT_OK) {
        free(rt);
        return status;
    }
    /* the dense group: the only comm we have of the node's ranks */
    status = runtime_start(rt, rt->groups.dense);
    if (status != SHARDOPT_OK) {
        runtime_unstart(rt);
        return status;
    }
    live_add(rt);
    *rt_p = rt;
    return SHARDOPT_OK;
}

shardopt_status_t rt_device_enter(struct shardopt_runtime *rt, const char *what)
{
    if (!device_has(rt->ns_dev, DEVICE_CAP_THREAD_DEVICE) ||
        rt->ns_dev->device_enter(&rt->kctx) == 0)
        return SHARDOPT_OK;
    return log_fail(SHARDOPT_ERR_DEVICE,
                    "%s: rank %d: could not make init's device current on the calling thread "
                    "(cudaSetDevice failed)",
                    what, rt->groups.me.rank);
}

shardopt_status_t rt_mpi_live(const char *what)
{
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) /* any MPI call now ends the process (Open MPI aborts it) */
        return log_fail(SHARDOPT_ERR_STATE,
                        "%s: MPI is finalized (MPI_Finalize was called): a collective call cannot "
                        "run; call shardopt_finalize before MPI_Finalize",
                        what);
    return SHARDOPT_OK;
}

shardopt_status_t rt_claim(struct shardopt_runtime *rt, const char *call)
{
    const char *running = NULL;
    if (rt == NULL) /* nothing to claim: the call itself refuses it, naming what is NULL */
        return SHARDOPT_OK;
    const int got = live_claim(rt, call, &running);
    if (got == 0) /* its memory may be freed: only the pointer is shown, nothing of it read */
        return live_refuse(call, rt);
    if (got == 1)
        return SHARDOPT_OK;
    /* two threads in one runtime: the step read pointers and state the other was changing (two
     * Python threads stepping one optimizer returned OK with the weights NaN) */
    return live_busy(call, NULL, running);
}

void rt_release(struct shardopt_runtime *rt)
{
    if (rt != NULL)
        atomic_store(&rt->busy, NULL);
}

shardopt_status_t rt_open_call(struct shardopt_runtime *rt, const char *what,
                               shardopt_status_t mine)
{
    const shardopt_status_t live = rt_mpi_live(what);
    if (live != SHARDOPT_OK)
        return live;
    if (mine == SHARDOPT_OK && device_has(rt->ns_dev, DEVICE_CAP_THREAD_DEVICE))
        mine = rt_device_enter(rt, what);
    /* the call's opening agreement (groups_agree_call): a rank in another collective call is
     * found here, on every rank, instead of in mismatched collectives; so is a rank that refused
     * the call itself (a state or argument check), which returned alone before and left its
     * peers waiting here until comm_timeout_s ended the job */
    return groups_agree_call(&rt->groups, mine, what);
}

shardopt_status_t shardopt_finalize(shardopt_runtime_t rt)
{
    if (rt == NULL)
        return SHARDOPT_OK;
    /* freeing what another thread's call is using would be a use after free: refused (the
     * runtime stays; finalize it once that call returned) */
    const shardopt_status_t claimed = rt_claim(rt, "finalize");
    if (claimed != SHARDOPT_OK)
        return claimed;
    live_remove(rt); /* claimed: no other call holds it, and none can claim it from now */
    /* the device memory and streams are released on their own device whichever thread
     * finalizes; a failure here leaves nothing better to do than to go on */
    (void)rt_device_enter(rt, "finalize");
    alias_check_peers_leave(rt); /* out of the process's list before the names it reads are freed */
    if (rt->ops != NULL)
        commit_release(rt);
    device_stop(rt);
    groups_free(&rt->groups);
    topology_free(&rt->topo);
    free(rt->ew);
    timeline_free(&rt->timeline);
    /* its struct and its parameters' stay allocated a while (live.h): a handle used after this
     * is then refused, not read as freed memory or as a newer runtime at the same address */
    live_retire(rt);
    return SHARDOPT_OK;
}

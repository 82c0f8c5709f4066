/* init and finalize: the runtime's life cycle. */
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "kernels/blas_threads.h"
#include "kernels/cpu/ns_bf16.h"
#include "log.h"
#include "runtime.h"
#include "status.h"

/* kernels/ keeps its own copies of these enums so it need not see MPI; keep them in step. */
_Static_assert((int)SHARDOPT_DTYPE_BF16 == KDT_BF16 && (int)SHARDOPT_DTYPE_FP32 == KDT_F32,
               "dtype values");
_Static_assert((int)SHARDOPT_ROUNDING_STOCHASTIC == KROUND_STOCHASTIC, "rounding values");
_Static_assert((int)SHARDOPT_NS_CUSTOM == NS_TABLE_CUSTOM &&
                   (int)SHARDOPT_NS_POLAR_EXPRESS == NS_TABLE_POLAR_EXPRESS,
               "coefficient table values");

static shardopt_status_t kernels_select(const shardopt_config_t *cfg,
                                        const struct kernel_ops **ops_p)
{
    const struct kernel_ops *ops = NULL;

    if (cfg->backend == SHARDOPT_BACKEND_CUDA)
        return log_fail(SHARDOPT_ERR_UNSUPPORTED,
                        "config backend = cuda: the CUDA backend's compute kernels are not "
                        "implemented yet (this build %s); use backend = cpu",
                        kernel_ops_cuda() != NULL ? "has its memory layer only" : "has no CUDA");
    switch (cfg->kernels) {
    case SHARDOPT_KERNELS_AUTO: ops = kernel_ops_cpu_best(); break;
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
    if (log_env_check() != NULL)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "%s: %s", who, log_env_check());

    rt = calloc(1, sizeof(*rt));
    if (rt == NULL)
        return log_fail(SHARDOPT_ERR_OUT_OF_MEMORY, "%s: %zu bytes", who, sizeof(*rt));
    status = config_import(cfg, &rt->cfg);
    if (status == SHARDOPT_OK)
        status = config_check_all(&rt->cfg, "");
    if (status == SHARDOPT_OK)
        status = kernels_select(&rt->cfg, &rt->ops);
    if (status != SHARDOPT_OK) {
        free(rt);
        return status;
    }
    *rt_p = rt;
    return SHARDOPT_OK;
}

/* bf16 Newton-Schulz where the CPU multiplies bf16 natively (auto), or as configured.
 * SHARDOPT_CPU_NO_BF16=1 makes auto treat the CPU as one without (to test the fallback). */
static int ns_compute_resolve(const shardopt_config_t *c, int rank)
{
    const char *no = getenv("SHARDOPT_CPU_NO_BF16");
    const int masked = no != NULL && no[0] != '\0' && strcmp(no, "0") != 0;
    const int native = ns_bf16_native() && !masked;

    if (c->ns_compute == SHARDOPT_NS_COMPUTE_FP32) {
        if (rank == 0)
            log_info("init: Newton-Schulz in fp32 (ns_compute = fp32)");
        return KDT_F32;
    }
    if (c->ns_compute == SHARDOPT_NS_COMPUTE_BF16) {
        if (!native && rank == 0)
            log_warn("init: ns_compute = bf16 on a CPU without native bf16 dot products%s: "
                     "oneDNN emulates them, slower than fp32",
                     masked ? " (SHARDOPT_CPU_NO_BF16)" : "");
        return KDT_BF16;
    }
    if (rank == 0)
        log_info("init: Newton-Schulz in %s (ns_compute = auto: %s)", native ? "bf16" : "fp32",
                 native   ? "the CPU has native bf16 dot products"
                 : masked ? "SHARDOPT_CPU_NO_BF16 says the CPU has no native bf16"
                          : "no AVX512_BF16 or AMX-BF16 on this CPU, fp32 instead");
    return native ? KDT_BF16 : KDT_F32;
}

/* Once the groups exist: threads, coefficient tables, the state store. */
static void runtime_start(shardopt_runtime_t rt, MPI_Comm local)
{
    const struct groups *g = &rt->groups;

    log_set_rank(groups_rank(g));
    topology_init(&rt->topo, &rt->cfg, local, groups_rank(g));
    /* threads: as configured, else (bind = auto) the bound cores, else as the process had */
    const int threads = rt->cfg.num_threads > 0 ? rt->cfg.num_threads : rt->topo.threads;
    rt->kctx.threads = threads;
    kernel_blas_set_threads(threads);
    config_ns_resolve(&rt->cfg, rt->ns_coeffs, &rt->ns_norm_scale);
    rt->ns_compute = ns_compute_resolve(&rt->cfg, g->me.rank);
    state_store_init(&rt->store, rt->ops);

    if (!kernel_blas_uses_openmp())
        log_warn("init: the linked OpenBLAS is not its OpenMP build: BLAS and kernel threads "
                 "compete for cores (install libopenblas-openmp-dev and rebuild)");
    log_info("init: rank %d of %d (replica %d, dense %d/%d, ep %d/%d, expert shard %d/%d), "
             "kernels %s, BLAS threads %d, momentum %s, comm %s",
             g->me.rank, g->mesh.world, g->me.rep, g->me.d, g->mesh.dense, g->me.ep_rank,
             g->mesh.ep, g->me.xs_rank, mesh_xs_size(&g->mesh), rt->ops->name,
             kernel_blas_get_threads(),
             rt->cfg.momentum_dtype == SHARDOPT_DTYPE_BF16 ? "bf16" : "fp32",
             rt->cfg.comm_dtype == SHARDOPT_DTYPE_BF16 ? "bf16" : "fp32");
}

shardopt_status_t shardopt_init(MPI_Comm comm, const shardopt_config_t *cfg,
                                shardopt_runtime_t *rt_p)
{
    shardopt_status_t status;
    shardopt_runtime_t rt = NULL;

    if (rt_p == NULL)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "init: NULL rt_p");
    if (comm == MPI_COMM_NULL)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "init: comm is MPI_COMM_NULL");
    status = runtime_create(cfg, &rt, "init");
    if (status != SHARDOPT_OK)
        return status;
    status = groups_create(comm, &rt->cfg, &rt->groups);
    if (status != SHARDOPT_OK) {
        free(rt);
        return status;
    }
    runtime_start(rt, comm);
    *rt_p = rt;
    return SHARDOPT_OK;
}

shardopt_status_t shardopt_init_from_groups(const shardopt_groups_t *groups,
                                            const shardopt_config_t *cfg, shardopt_runtime_t *rt_p)
{
    shardopt_status_t status;
    shardopt_runtime_t rt = NULL;

    if (groups == NULL || rt_p == NULL)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "init_from_groups: NULL %s",
                        groups == NULL ? "groups" : "rt_p");
    if (groups->version < 1 || groups->version > SHARDOPT_GROUPS_VERSION ||
        groups->size < sizeof(shardopt_groups_t))
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "init_from_groups: groups version %u / size %zu: initialise with "
                        "SHARDOPT_GROUPS_INIT",
                        groups->version, groups->size);
    status = runtime_create(cfg, &rt, "init_from_groups");
    if (status != SHARDOPT_OK)
        return status;
    status = groups_from_trainer(groups, &rt->groups);
    if (status != SHARDOPT_OK) {
        free(rt);
        return status;
    }
    runtime_start(rt, rt->groups.dense); /* the only comm we have of the node's ranks */
    *rt_p = rt;
    return SHARDOPT_OK;
}

shardopt_status_t shardopt_finalize(shardopt_runtime_t rt)
{
    if (rt == NULL)
        return SHARDOPT_OK;
    for (int i = 0; i < rt->nparams; i++) {
        free(rt->params[i]->name);
        free(rt->params[i]);
    }
    free(rt->params);
    if (rt->ops != NULL)
        commit_release(rt);
    groups_free(&rt->groups);
    topology_free(&rt->topo);
    free(rt);
    return SHARDOPT_OK;
}

/* Built without CUDA: no NCCL exchanges (init refuses comm_backend = nccl before any call). */
#include "base/log.h"
#include "base/status.h"
#include "runtime/comm/comm_nccl.h"

shardopt_status_t nccl_group_create(const struct groups *gr, MPI_Comm comm, void *compute_stream,
                                    double timeout_s, const char *name,
                                    const struct nccl_group *share, struct nccl_group **out)
{
    (void)gr, (void)comm, (void)compute_stream, (void)timeout_s, (void)name, (void)share;
    *out = NULL;
    return log_fail(SHARDOPT_ERR_UNSUPPORTED, "NCCL: this build has no CUDA backend");
}

void nccl_group_destroy(struct nccl_group *g) { (void)g; }

void nccl_group_abort(struct nccl_group *g) { (void)g; }

shardopt_status_t nccl_group_exchange(struct nccl_group *g, int slot, const void *sbuf, int ns,
                                      const int *sp, const int *sc, const int *sd, void *rbuf,
                                      int nr, const int *rp, const int *rc, const int *rd,
                                      size_t es)
{
    (void)g, (void)slot, (void)sbuf, (void)ns, (void)sp, (void)sc, (void)sd, (void)rbuf, (void)nr,
        (void)rp, (void)rc, (void)rd, (void)es;
    return SHARDOPT_ERR_UNSUPPORTED;
}

shardopt_status_t nccl_group_allgatherv(struct nccl_group *g, int slot, void *buf,
                                        const int *counts, const int *displs, size_t es)
{
    (void)g, (void)slot, (void)buf, (void)counts, (void)displs, (void)es;
    return SHARDOPT_ERR_UNSUPPORTED;
}

shardopt_status_t nccl_group_allreduce_f32(struct nccl_group *g, float *buf, size_t count)
{
    (void)g, (void)buf, (void)count;
    return SHARDOPT_ERR_UNSUPPORTED;
}

shardopt_status_t nccl_group_allreduce_bf16(struct nccl_group *g, uint16_t *buf, size_t count)
{
    (void)g, (void)buf, (void)count;
    return SHARDOPT_ERR_UNSUPPORTED;
}

shardopt_status_t nccl_group_allreduce_f64(struct nccl_group *g, double *buf, size_t count)
{
    (void)g, (void)buf, (void)count;
    return SHARDOPT_ERR_UNSUPPORTED;
}

shardopt_status_t nccl_group_wait(struct nccl_group *g, int slot)
{
    (void)g, (void)slot;
    return SHARDOPT_ERR_UNSUPPORTED;
}

shardopt_status_t nccl_group_drain(struct nccl_group *g)
{
    (void)g;
    return SHARDOPT_ERR_UNSUPPORTED;
}

int nccl_group_aborted(const struct nccl_group *g)
{
    (void)g;
    return 0;
}

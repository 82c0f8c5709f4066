/* Which transport a group's exchanges take (transport.h), chosen once at init. */
#include "runtime/comm/transport.h"

#include "kernels/dtype.h"

void transport_pick(struct comm_transport *t, const struct groups *g, MPI_Comm comm,
                    const char *name, struct nccl_group *nccl, int on_device,
                    const struct device_ops *dev, struct kernel_ctx *kctx,
                    shardopt_dtype_t comm_dtype)
{
    *t = (struct comm_transport){
        .ops = nccl != NULL ? &transport_nccl_ops
               : on_device  ? &transport_mpi_mirror_ops
                            : &transport_mpi_ops,
        .groups = g,
        .comm = comm,
        .name = name,
        .nccl = nccl,
        .dev = dev,
        .kctx = kctx,
        .es = kdtype_size(comm_dtype),
        .type = comm_dtype == SHARDOPT_DTYPE_BF16 ? MPI_UINT16_T : MPI_FLOAT,
    };
}

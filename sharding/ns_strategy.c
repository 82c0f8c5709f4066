#include "ns_strategy.h"

#include <limits.h>

int ns_strategy_eligible(const struct ns_strategy_in *in)
{
    const int row_dim = in->ndim - 2, col_dim = in->ndim - 1;
    const int working_col_dim = in->ns_transpose ? row_dim : col_dim;
    int holders = 0;

    if (in->shard_dim != working_col_dim)
        return 0;
    /* the m x m Gram matrix is all-reduced in one MPI call, whose count is an int: from m =
     * 46341 on it would wrap (the gather path refuses such a matrix at commit, by its counts) */
    const int64_t m = in->shape[in->ns_transpose ? col_dim : row_dim];
    if (m > 0 && m > (int64_t)INT_MAX / m)
        return 0;
    for (int i = 0; i < in->members; i++)
        holders += in->boxes[i].len[in->shard_dim] > 0;
    return holders >= 2;
}

int ns_strategy_choose(const struct ns_strategy_in *in, int mode)
{
    if (mode == NS_MODE_GATHER || !ns_strategy_eligible(in))
        return 0;
    if (mode == NS_MODE_SHARDED)
        return 1;

    const int row_dim = in->ndim - 2, col_dim = in->ndim - 1;
    const double rows = (double)in->shape[row_dim], cols = (double)in->shape[col_dim];
    const double m = in->ns_transpose ? cols : rows, n = in->ns_transpose ? rows : cols;
    /* per step, in the planner's units as group_mean_cost is (every product whole): gathered,
     * the algorithm its shape runs (sharded: standard) */
    const double cost =
        in->gram
            ? plan_ns_flops((int64_t)rows, (int64_t)cols, in->steps, 1, in->restarts) / in->steps
            : plan_ns_cost((int64_t)rows, (int64_t)cols);
    if (cost <= in->group_mean_cost)
        return 0; /* light enough for the owners' balancing to absorb */

    int64_t biggest = 0;
    for (int i = 0; i < in->members; i++) {
        const int64_t len = in->boxes[i].len[in->shard_dim];
        biggest = len > biggest ? len : biggest;
    }
    const double flops = in->gflops * 1e9, bw = in->gbps * 1e9;
    const double bytes = rows * cols * (double)in->esize;
    const double f_owner = (double)biggest / (double)in->shape[in->shard_dim];
    /* the FLOPs each side performs, as the runtime counts them (ns_flops_last): gathered, the
     * owner's kernel with its symmetric products in the variant's blocks and Gram restarting
     * where the table does; sharded, every holder iterates its own columns in fp32 (the narrow
     * form where it has fewer than m: runtime/step/ns_sharded.c), so the widest piece, which
     * torch.chunk's uneven slices can make wider than n / holders, sets the time. Each member
     * sends 2(k-1)/k of the fp32 m x m Gram matrix per iteration, k the whole group (a member
     * without columns joins the all-reduce too). */
    const double f_gather = plan_ns_flops_blocked((int64_t)rows, (int64_t)cols, in->steps, in->gram,
                                                  in->restarts, in->blocks);
    const double f_sharded = plan_ns_block_cost(m, (double)biggest, 1) * in->steps;
    const double ar_bytes =
        in->steps * 4.0 * plan_team_allreduce_elems((int64_t)m, (int64_t)n, in->members);
    const double t_gather = f_gather / flops + 2 * (1 - f_owner) * bytes / bw;
    const double t_sharded = f_sharded / flops + ar_bytes / bw;
    return t_sharded < t_gather;
}

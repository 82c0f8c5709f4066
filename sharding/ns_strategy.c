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
    /* per step, as group_mean_cost: gathered, the algorithm its shape runs (sharded: standard) */
    const double cost = in->gram
                            ? plan_ns_flops((int64_t)rows, (int64_t)cols, in->steps, 1) / in->steps
                            : plan_ns_cost((int64_t)rows, (int64_t)cols);
    if (cost <= in->group_mean_cost)
        return 0; /* light enough for the owners' balancing to absorb */

    int64_t biggest = 0;
    int holders = 0;
    for (int i = 0; i < in->members; i++) {
        const int64_t len = in->boxes[i].len[in->shard_dim];
        holders += len > 0;
        biggest = len > biggest ? len : biggest;
    }
    const double flops = in->gflops * 1e9, bw = in->gbps * 1e9;
    const double bytes = rows * cols * (double)in->esize;
    const double f_owner = (double)biggest / (double)in->shape[in->shard_dim];
    const double t_gather = cost * in->steps / flops + 2 * (1 - f_owner) * bytes / bw;
    const double t_sharded = (4 * m * m * n / holders + 2 * m * m * m) * in->steps / flops +
                             in->steps * 2 * m * m * 4 / bw;
    return t_sharded < t_gather;
}

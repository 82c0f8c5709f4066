/* Gather or sharded Newton-Schulz for one parameter: which matrices may stay sharded, and the
 * cost model `auto` uses. Pure: the same inputs give the same answer on every rank. */
#ifndef SHARDING_NS_STRATEGY_H
#define SHARDING_NS_STRATEGY_H

#include <stddef.h>
#include <stdint.h>

#include "plan.h"

enum ns_mode { NS_MODE_GATHER = 0, NS_MODE_SHARDED = 1, NS_MODE_AUTO = 2 };

struct ns_strategy_in {
    int ndim;
    int64_t shape[3]; /* global, as stored */
    int ns_transpose; /* Newton-Schulz works on the stored matrix's transpose */
    int shard_dim;
    const struct plan_box *boxes; /* [members] */
    int members;
    int steps;
    size_t esize;           /* comm dtype */
    double group_mean_cost; /* the group's NS cost per member (all its Muon matrices) */
    double gflops, gbps;    /* rates for the cost model */
    int gram;               /* gathered, it would run Gram Newton-Schulz (plan_ns_flops) */
    /* gathered, the FLOPs its kernel would perform (plan_ns_flops_blocked): the blocks it forms
     * the symmetric products in (NULL: whole; the kernel variant's, kernels/ops.h's
     * ns_sym_blocks_for) and, gram, where it restarts (ns_coeffs_gram_restarts_for's mask in the
     * dtype it runs in; its cost against group_mean_cost, plan_ns_flops, restarts there too) */
    const struct plan_ns_blocks *blocks;
    uint32_t restarts;
};

/* 1 when the parameter's matrices may be orthogonalized sharded: split along the working
 * matrix's columns (its long side) over at least two members, and its m x m Gram matrix within
 * the int count of one MPI all-reduce (m at most 46340). */
int ns_strategy_eligible(const struct ns_strategy_in *in);

/* Gather (0) or sharded (1) under `mode`. auto chooses sharded for an eligible matrix heavier
 * than a member's mean share of the group's work (one owner could not be balanced) when the
 * model's time is lower: gather = the whole NS on one rank (the FLOPs its kernel performs) +
 * moving the others' pieces there and back; sharded = the widest holder's sharded iterations
 * (plan_ns_block_cost of its columns, the fp32 form the runtime takes) + a ring all-reduce of the
 * fp32 m x m Gram matrix per iteration. */
int ns_strategy_choose(const struct ns_strategy_in *in, int mode);

#endif

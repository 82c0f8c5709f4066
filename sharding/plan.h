/* The exchange plan of one group: which member orthogonalizes each matrix (its owner), where
 * every piece of every matrix travels, and in which buckets. Pure data, computed identically on
 * every member from the same inputs; the step executes it and allocates nothing.
 *
 * Exchange #1 sends each piece of U from its holder to the owner; exchange #2 sends the same
 * rectangle of O back. The two are mirror images: what a holder sends in #1 it receives in #2 at
 * the same offsets, so one pair of buffers serves both:
 *   A (holder side): my pieces, grouped by owner, in matrix order     #1 send, #2 receive
 *   B (owner side):  pieces of my matrices, grouped by holder         #1 receive, #2 send
 * A matrix held whole by its owner travels nowhere ("direct"). */
#ifndef SHARDING_PLAN_H
#define SHARDING_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

/* The largest team_cap: a team lies inside one node. */
#define PLAN_TEAM_MAX 64
/* Most Newton-Schulz matrices one group's plan holds (each expert of a stack is one): the plan
 * indexes them with ints, and 2^30 of them take hundreds of GiB of plan records already */
#define PLAN_MAX_MATRICES ((int64_t)1 << 30)

/* A member's part of a parameter: [lo, lo + len) per dim of the global shape. */
struct plan_box {
    int64_t lo[3], len[3];
};

/* A member's part along the one dim a parameter is sharded on: [lo, lo + len). */
struct plan_slice {
    int64_t lo, len;
};

/* One Muon parameter as a group sees it. */
struct plan_param {
    int param;             /* registration index, handed back in the plan */
    int ndim;              /* 2, or 3 for an [E, rows, cols] stack */
    int64_t shape[3];      /* global, as stored */
    int64_t k_lo, k_count; /* the matrices this group orthogonalizes (experts of its EP rank) */
    const struct plan_box *boxes; /* member i's at boxes[i * box_stride]; or NULL: */
    /* every member's box is `tmpl` but along slice_dim, where member i holds slices[i *
     * box_stride] (commit's shard tables gather only that: a layout shards one dim, docs/
     * design.md, The step, on commit); or, slices NULL, the torch.chunk piece i of `parts` of
     * [tile_lo, tile_lo + tile_len) (layout_chunk): commit computes it when every member registered
     * that, and gathers nothing (sharding/shard_table.h) */
    const struct plan_box *tmpl;
    int slice_dim;
    const struct plan_slice *slices;
    size_t box_stride; /* 0 or 1: [members]; commit passes its shard table as it is gathered
                          ([members][columns], stride columns), no copy */
    int64_t tile_lo, tile_len;
    int parts;
    int ns_gram; /* 1: its matrices run Gram Newton-Schulz (plan_ns_flops) */
    /* ns_gram: where that Gram restarts (bit k: before step k), the caller's
     * ns_coeffs_gram_restarts_for (kernels/ns_coeffs.h, which sharding/ does not see) for its
     * shape, the table and the dtype it will run in: fp32's schedule differs from bf16's (and the
     * device's) for quintic's 5 steps, and other tables differ from quintic's */
    uint32_t ns_restarts;
    /* 1: Newton-Schulz works on the transpose of the stored matrix (sharding/layout.c: a tall
     * one, and a square one registered transposed, whose true orientation is the transpose); a
     * team's blocks are then stored rows, so that they are the working matrix's columns */
    int ns_transpose;
};

struct group_plan;

struct plan_cfg {
    int members, me;
    size_t bucket_bytes; /* a bucket closes once its matrices reach this many comm-dtype bytes */
    size_t esize;        /* bytes per element in the comm dtype */
    int replicas;        /* replica_split: replicas that share each bucket's NS slots in one
                            all-gather (its counts and displacements are ints); 0 or 1: none */
    int ns_steps;        /* Newton-Schulz steps, for the cost of Gram matrices; 0: 5 */
    /* Joint planning (docs/scaling.md). All zero / NULL: each group balanced on its own, every
     * matrix held whole kept by its holder, one owner per matrix (the plan of before). */
    const double *base_load; /* [members] or NULL: NS cost per iteration each member already
                                carries from its other group; owners balance on top of it */
    double move_cost;        /* > 0: a matrix held whole may go to another member when that lowers
                                the later of the two members' NS and transfer times; the cost units
                                one element moved one way takes (NS rate / link rate in plan_ns_cost
                                units per iteration). 0: its holder keeps it. With it, any matrix
                                may change owner on the same terms, its exchange elements counted
                                for each of its holders (sharding/plan_owners.c) */
    double base_comm;        /* move_cost only: cost units every member's transfers take already
                                (the other group's busiest exchange, which the step waits for too)
                                */
    int team_cap;            /* largest Newton-Schulz team, a power of two; 0 or 1: none. A team of
                                k gathers a matrix as k blocks of its long side, block j to its
                                member j (plan_owned.team), and runs sharded Newton-Schulz */
    int node_members;        /* members per node (consecutive); a team forms inside one node */
    double team_frac;        /* a matrix heavier than team_frac x the mean load per member is
                                split over the smallest team that brings it under (or a bigger
                                one, refine_cost); 0: 0.5 */
    double allreduce_cost;   /* cost units per Gram element a team member sends in its per-
                                iteration all-reduce (the element's bytes, fp32 or bf16 as the
                                teams iterate, x NS rate / the node's link rate); set with
                                team_bf16 by plan_cfg_team_dtype */
    int team_guard;          /* 1 (the expert shard groups'): the group planned with teams of at
                                most 1, 2, 4, ... up to team_cap, the plan whose latest member
                                finishes first kept (its work, or with team_guard_cost also its
                                exchange; sharding/plan_owners_pick.c); 0:
                                each matrix's team as team_frac and its cost give it (dense) */
    double team_guard_cost;  /* team_guard: cost units per exchange element (as move_cost); > 0:
                                the plans compared by each member's finish, max(work, base_comm +
                                team_guard_cost x the exchange elements it sends), a larger cap
                                kept only when its latest finish is earlier and neither its latest
                                work nor its latest exchange is later; 0: by work only */
    int team_bf16;           /* 1: teams iterate in bf16, whose members always form A^2
                                (plan_ns_team_cost's narrow_ok 0); 0: fp32, a block narrower than
                                m updated without it */
    /* A second placement once the other group's final load is known (expert_moves: the dense
     * group after the experts moved; docs/scaling.md, issue 22). NULL / 0: none. With
     * refine_load [members] and refine_cost > 0 (not with move_cost), the owners are placed again
     * on top of refine_load, heaviest matrix first, each in the cheapest form, one owner or the
     * smallest team, that keeps every member's finish within the latest so far (else the one
     * finishing first), a member's finish being max(work, refine_comm + refine_cost x the
     * exchange elements it sends); that plan replaces the first one only when its latest finish
     * is earlier, the first one's counted on the same refine_load (plan_owners.c, refine) */
    const double *refine_load;
    /* [the group's matrices] or NULL: matrix m's one owner given (the union plan,
     * runtime/commit_union.c): no LPT, no teams, no moves, no holder keeping a matrix whole; its
     * load and work counted as the LPT's are */
    const int *fixed_owner;
    /* fixed_owner only: where fixed_owner[m] < 0, matrix m keeps the team this plan of the same
     * group gave it (team[m] members, team_of), with the same team_cap */
    const struct group_plan *fixed_teams;
    /* cost units per exchange element, as move_cost. With teams (team_cap > 1, not with
     * move_cost), refine_load or not, the first placement's team sizes count the exchange too:
     * its LPT runs again with each team sized by its members' finish, max(work, refine_comm +
     * refine_cost x the elements sent), and that plan replaces the first only when its latest
     * finish is earlier and neither its latest work nor its latest exchange is later
     * (plan_owners.c, lpt_by_finish) */
    double refine_cost;
    double refine_comm; /* cost units every member's transfers take already, as base_comm */
};

/* A piece I hold (a contiguous run of my local shard). Momentum writes U for it at `buf`
 * (elements): into buffer A, or, when direct, into the NS buffer; apply reads O from the same place
 * after exchange #2. */
struct plan_piece {
    int param;
    int64_t k;
    int64_t local_off, count; /* elements in my local shard */
    int direct;
    size_t buf;
};

/* A matrix I orthogonalize, in the NS buffer at `slot` (elements), rows x cols as stored; or,
 * in a team (team >= 2), my block of it: block team_j of the matrix's long side (plan_team_block),
 * rows x cols being the block's, which the team orthogonalizes together (sharded Newton-Schulz
 * over the team's members, group_plan.team_of[mat]). */
struct plan_owned {
    int param;
    int64_t k, rows, cols;
    double cost; /* its Newton-Schulz cost, in plan_ns_cost units (per step; a block: my block's) */
    size_t slot;
    int in_lo, in_hi; /* its pieces that arrive through B (plan.incoming) */
    int team, team_j; /* team size (1: an owner alone) and my index in the team */
    int team_rows;    /* team >= 2: the blocks are ranges of stored rows (ns_transpose), else of
                         columns; the working matrix's columns either way */
    int mat;          /* its index in matrix order */
};

/* A piece of one of my matrices arriving from `src`: B[buf ...] <-> rows [r0, r1) x cols [c0, c1).
 */
struct plan_incoming {
    int src;
    int64_t r0, r1, c0, c1;
    size_t buf;
};

/* One side of a bucket's exchange: a block for each member with a non-empty one (this member
 * too, when it owns a matrix it holds part of), in member order; block j is count[j] elements at
 * displ[j] of the buffer, to or from member peer[j]. Only the members that send or receive are
 * listed, so a plan's size and the step's loops do not grow with the group (issue 22). */
struct plan_blocks {
    int n;
    int *peer, *count, *displ; /* [n] */
};

struct plan_bucket {
    int piece_lo, piece_hi; /* my pieces */
    int owned_lo, owned_hi; /* my matrices */
    size_t a_elems, b_elems, ns_elems;
    struct plan_blocks a; /* buffer A, by owner: exchange #1 send / #2 receive */
    struct plan_blocks b; /* buffer B, by holder: exchange #1 receive / #2 send */
};

struct group_plan {
    int members, me;
    int nmatrices; /* in the group, all members */
    int *owner;    /* [nmatrices], in matrix order (params in order, then k); a team's lead */
    double *load;  /* [members]: NS FLOPs per iteration owned (a team member: its block's) */
    double *cost;  /* [nmatrices], in matrix order: each matrix's NS cost per iteration, what the
                      owners are balanced on (the union plan gathers them: commit_union.c) */
    double *team_load; /* [members] with a team_cap (else NULL): the load and all-reduce cost of
                          its team blocks alone (0: in no team), what the union plan places the
                          one-owner matrices around */
    int *team;         /* [nmatrices]: team size, 1 = owner alone */
    int *team_of;      /* [nmatrices * team_cap] (team_cap >= 2 only): team members, lead first */
    int team_cap;
    int nteams;        /* matrices with a team of 2 or more */
    int nmoved;        /* matrices the moves pass (move_cost) gave another owner */
    int refined;       /* 1: the second placement (refine_load) replaced the first */
    double *work;      /* [members]: base_load + owned load + team all-reduce cost, per iteration
                          (a team member with a block narrower than the team's widest: that
                          one's FLOPs, which it waits for, plan_ns_team_cost) */
    double *team_comm; /* [members]: the team all-reduce cost in work (allreduce_cost x the
                          elements each sends per iteration); what the other group plans around
                          with load */
    struct plan_piece *pieces;
    int npieces;
    struct plan_owned *owned;
    int nowned;
    struct plan_incoming *incoming;
    int nincoming;
    struct plan_bucket *buckets;
    int nbuckets;
    size_t max_a, max_b, max_ns;     /* elements: the largest bucket's needs */
    uint64_t bytes_sent, bytes_recv; /* per step, other members only (both exchanges) */
};

/* Build the plan. Returns SHARDOPT_OK, or with a message recorded as the last error (status_set:
 * the caller adds the rank and group and logs it) SHARDOPT_ERR_OUT_OF_MEMORY (what and the bytes)
 * or SHARDOPT_ERR_UNSUPPORTED (a bucket too large for an MPI count). On failure *out holds
 * nothing to free. */
shardopt_status_t plan_build(const struct plan_cfg *cfg, const struct plan_param *params,
                             int nparams, struct group_plan *out);

void plan_free(struct group_plan *p);

/* replica_split: replica r of `replicas` orthogonalizes the contiguous run [*lo, *hi) of a
 * bucket's owned matrices (balanced by NS cost; the same split on every replica), i.e. the NS
 * slots [*slot_lo, *slot_hi) in elements, which it then shares with the others. */
void plan_replica_range(const struct group_plan *p, const struct plan_bucket *b, int replicas,
                        int r, int *lo, int *hi, size_t *slot_lo, size_t *slot_hi);

/* The NS cost of a rows x cols matrix per iteration: 4m^2n + 2m^3, m <= n. */
double plan_ns_cost(int64_t rows, int64_t cols);

/* FLOPs of one sharded Newton-Schulz iteration on a block of n columns of an m-row working
 * matrix (a team member's, or a holder's under ns_strategy sharded), every product whole, the
 * update in the cheaper form for its shape where narrow_ok (fp32): n >= m, 4m^2n + 2m^3 (B = bA +
 * cA^2, Y = aX + BX); n < m, 6m^2n (A applied twice, Y = aX + A(bX + cAX), without the redundant
 * m^3 of A^2). narrow_ok 0 (a bf16 team, which always forms A^2): 4m^2n + 2m^3 for every n. 0
 * for n = 0. The planner's copy of kernels/ns_shape.h's ns_shard_iter_flops (test_ns_gram checks
 * that they agree). */
double plan_ns_block_cost(double m, double n, int narrow_ok);

/* Member j's NS FLOPs per iteration in a team of k that splits the long side n into k blocks
 * (plan_team_block: ceil(n/k) wide, the last ones narrower or empty) and all-reduces the m x m
 * Gram matrix (standard algorithm, as runtime/step/ns_sharded.c runs and counts it):
 * plan_ns_block_cost(m, n_j, narrow_ok), n_j its block's width. k = 1: plan_ns_cost. */
double plan_ns_team_block_cost(int64_t rows, int64_t cols, int k, int j, int narrow_ok);

/* The team's time per iteration in FLOPs: its widest block's (block 0, ceil(n/k) wide), which
 * every member waits for at each all-reduce; what the planner sizes and places teams on, and
 * charges each member's work (its load is its own block's, plan_ns_team_block_cost). */
double plan_ns_team_cost(int64_t rows, int64_t cols, int k, int narrow_ok);

/* Elements (fp32 or bf16, as the team iterates) one member sends per iteration in a ring
 * all-reduce of the team's m x m Gram matrix: 2(k-1)/k m^2 (0 for k = 1). */
double plan_team_allreduce_elems(int64_t rows, int64_t cols, int k);

/* Bytes of one Gram element a team all-reduces: 2 in a bf16 team, 4 in an fp32 one. */
double plan_team_elem_bytes(int team_bf16);

/* The team cost of cfg: team_bf16 (teams iterate in bf16) and allreduce_cost, the element's bytes
 * (plan_team_elem_bytes) x ns_rate / link_rate, the two rates in one unit pair (GFLOP/s and GB/s,
 * or FLOP/s and B/s). runtime/commit.c sets its dense group's so from its teams' dtype and
 * cost_gemm_gflops / cost_net_gbps, shardopt-plan (bench/plan_model.c) from --ns-compute and its
 * rates: one formula for the planner in both. */
void plan_cfg_team_dtype(struct plan_cfg *cfg, int team_bf16, double ns_rate, double link_rate);

/* One member's time per iteration in a team of k under cfg, in FLOPs: the team's widest block
 * (plan_ns_team_cost, in the form of cfg's dtype) plus its all-reduce (allreduce_cost x
 * plan_team_allreduce_elems); what the planner sizes, places and charges teams by. */
double plan_team_member_cost(const struct plan_cfg *cfg, int64_t rows, int64_t cols, int k);

/* Block j of a team of k over a rows x cols matrix (as stored): [*lo, *hi) of the working
 * matrix's long side, its columns: stored rows when Newton-Schulz works on the transpose
 * (ns_transpose: a tall matrix, a square one registered transposed), else stored columns; returns
 * 1 when the blocks are rows. ceil(L / k) long, the last ones shorter or empty. */
int plan_team_block(int64_t rows, int64_t cols, int ns_transpose, int k, int j, int64_t *lo,
                    int64_t *hi);

/* FLOPs of the whole Newton-Schulz of one matrix, `steps` steps, every product counted whole
 * (2 per multiply-add): standard steps * (4m^2n + 2m^3); Gram (gram = 1) restarting where
 * `restarts` says (bit k: before step k; the caller's ns_coeffs_gram_restarts_for, as for
 * plan_ns_flops_blocked), as kernels/ops.h's ns_flops_total_for counts it without halving (5
 * quintic steps: 8m^2n + 28m^3 with bf16's one restart before step 2, 12m^2n + 22m^3 with fp32's
 * before steps 1 and 3). test_ns_gram checks they agree. The planner balances owners on cost =
 * this / steps for Gram matrices, plan_ns_cost otherwise. */
double plan_ns_flops(int64_t rows, int64_t cols, int steps, int gram, uint32_t restarts);

/* Rows per block row in which the kernels form the products whose result is symmetric (X X^T,
 * A A or R R, (Z R) Z): a copy of kernels/ops.h's struct ns_sym_blocks, which the planner fills
 * from the kernels' committed per-shape variant tables (bench/plan_model.c). */
struct plan_ns_blocks {
    int64_t gram, poly, symmul;
};

/* FLOPs one matrix's Newton-Schulz performs with its symmetric products formed in the blocks b
 * (NULL: whole), Gram restarting where `restarts` says (bit k: before step k; the caller takes
 * it from kernels/ns_coeffs.h's ns_coeffs_gram_restarts_for, which sharding/ does not see):
 * a symmetric product costs 2K per entry of its
 * upper block rows. The planner's copy of kernels/ops.h's ns_flops_performed, what the runtime
 * counts (test_ns_gram checks that they agree). */
double plan_ns_flops_blocked(int64_t rows, int64_t cols, int steps, int gram, uint32_t restarts,
                             const struct plan_ns_blocks *b);

#endif

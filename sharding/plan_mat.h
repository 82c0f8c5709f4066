/* What sharding/plan.c (the exchange), sharding/plan_owners.c (who orthogonalizes each matrix)
 * and sharding/plan_teams.c (its Newton-Schulz teams) share inside the planner: a matrix of the
 * group, a member's piece of it, and the teams' sizing and accounting. */
#ifndef SHARDING_PLAN_MAT_H
#define SHARDING_PLAN_MAT_H

#include <stddef.h>
#include <stdint.h>

#include "layout.h"
#include "plan.h"

/* One matrix of the group, in matrix order. */
struct mat {
    const struct plan_param *p;
    int64_t k, rows, cols;
    double cost;
};

/* Member `i`'s box of parameter `p`: the stored one, or computed into *tmp. */
static inline const struct plan_box *plan_member_box(const struct plan_param *p, int i,
                                                     struct plan_box *tmp)
{
    const size_t at = (size_t)i * (p->box_stride > 1 ? p->box_stride : 1);
    if (p->boxes != NULL)
        return &p->boxes[at];
    *tmp = *p->tmpl;
    if (p->slices != NULL) {
        tmp->lo[p->slice_dim] = p->slices[at].lo;
        tmp->len[p->slice_dim] = p->slices[at].len;
    } else { /* the layout determines it: computed, not gathered */
        layout_chunk(p->tile_len, p->parts, i, &tmp->lo[p->slice_dim], &tmp->len[p->slice_dim]);
        tmp->lo[p->slice_dim] += p->tile_lo;
    }
    return tmp;
}

/* Member `i`'s rectangle of matrix `m`; returns its element count (0: holds none of it). */
static inline int64_t plan_piece_of(const struct mat *m, int i, int64_t *r0, int64_t *r1,
                                    int64_t *c0, int64_t *c1, int64_t *local_off)
{
    struct plan_box sliced;
    const struct plan_box *b = plan_member_box(m->p, i, &sliced);
    int rd = m->p->ndim - 2; /* the row dim */

    if (m->p->ndim == 3 && (m->k < b->lo[0] || m->k >= b->lo[0] + b->len[0]))
        return 0;
    *r0 = b->lo[rd];
    *r1 = b->lo[rd] + b->len[rd];
    *c0 = b->lo[rd + 1];
    *c1 = b->lo[rd + 1] + b->len[rd + 1];
    *local_off = m->p->ndim == 3 ? (m->k - b->lo[0]) * b->len[1] * b->len[2] : 0;
    return (*r1 - *r0) * (*c1 - *c0);
}

static inline int64_t plan_piece_count(const struct mat *m, int i)
{
    int64_t r0, r1, c0, c1, off;
    return plan_piece_of(m, i, &r0, &r1, &c0, &c1, &off);
}

/* Owners (and planned teams) of the group's n matrices into P (owner, load, work): returns 0,
 * -1 when out of memory. */
int plan_owners_assign(const struct plan_cfg *cfg, const struct mat *mats, int n,
                       struct group_plan *P);

/* Newton-Schulz teams and the placements' accounting (sharding/plan_teams.c). */

/* The team size the LPT gives a free matrix m: 1, or the smallest power of two up to team_cap
 * (and the node) whose per-member cost, all-reduce included, is under team_frac x the mean load,
 * when that is cheaper than one owner; none under it: the cheapest. */
int plan_team_size(const struct plan_cfg *cfg, int team_cap, const struct mat *m, double mean);

/* Team of k for a matrix of per-member cost per: in each node the k members with the least work
 * (ties the lower index); the node whose team would finish first (ties the lower node). Writes
 * the members, lead first (the lowest index of the team). sorted: NULL, or each node's work
 * ascending ([members], plan_node_sort), which spares the selection in every node but the one
 * chosen. */
void plan_team_place(const struct plan_cfg *cfg, const double *work, const double *sorted,
                     double per, int k, int *out);

/* Node `node`'s members' work, ascending, into sorted[its members' indices]. */
void plan_node_sort(const struct plan_cfg *cfg, const double *work, int node, double *sorted);

/* The largest team matrix m may have: team_cap, within a node and the group; 1 where its Gram
 * matrix is beyond one MPI count. */
int plan_team_limit(const struct plan_cfg *cfg, int team_cap, const struct mat *m);

/* What each member carries under one placement of the group's matrices. */
struct plan_carry {
    double *load, *team_comm; /* as group_plan's; or NULL: not kept */
    double *work;             /* the starting load + owned work, all-reduces included */
    double *comm; /* the starting transfers + refine_cost x the exchange elements sent */
};

/* Member u of matrix m's team of k: its block's Newton-Schulz work (*flops) and the team's
 * all-reduce at allreduce_cost (*ar), what plan_charge adds to its load and team_comm and
 * group_plan.team_load holds as their sum: one place, so the two never count a member apart. */
void plan_team_member_load(const struct plan_cfg *cfg, const struct mat *m, int k, int u,
                           double *flops, double *ar);

/* Matrix m owned by t[0] alone (k = 1) or by the team t[0..k), member u taking block u: add what
 * its owners then do to c, every holder's piece counted already as sent. */
void plan_charge(const struct plan_cfg *cfg, const struct mat *m, int k, const int *t,
                 struct plan_carry *c);

/* The latest finish of a placement, max over members of max(work, comm); *work and *comm (when
 * work is not NULL): the latest of each. */
double plan_latest(const struct plan_carry *c, int members, double *work, double *comm);

/* The team of k for matrix m that finishes first, counting its members' transfers; writes its
 * members, ascending, to out; returns that finish (-1: no node has k members). */
double plan_team_fit(const struct plan_cfg *cfg, const struct plan_carry *c, const struct mat *m,
                     int k, int *out);

/* The one owner of matrix m that finishes first (ties the member holding most of it, then the
 * lowest); returns that finish. */
double plan_owner_fit(const struct plan_cfg *cfg, const struct plan_carry *c, const struct mat *m,
                      int *out);

/* A placement's arrays in S, for a copy of a plan being built: owner, team and team_of ([n],
 * [n], [n * cap]) in one block, load, work and team_comm ([members] each) in another; S's other
 * fields untouched. Returns 0, -1 when out of memory (S then holds nothing to free). */
int plan_scratch_alloc(struct group_plan *S, int n, int members, int cap);

/* Frees what plan_scratch_alloc gave S (NULL: nothing) and clears those pointers. */
void plan_scratch_free(struct group_plan *S);

/* plan_owners_assign; with cfg->team_guard (and a team cap) the group planned with teams of at
 * most 1, 2, 4, ... up to the cap, the plan whose latest member's work is earliest kept
 * (plan_owners_pick.c). Returns 0, -1 when out of memory. */
int plan_owners_pick(const struct plan_cfg *cfg, const struct mat *mats, int n,
                     struct group_plan *P);

#endif

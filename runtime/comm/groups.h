/* The runtime's process groups (docs/design.md, Process groups), as MPI communicators it owns. */
#ifndef RUNTIME_GROUPS_H
#define RUNTIME_GROUPS_H

#include "sharding/mesh.h"
#include "shardopt.h"

struct groups {
    struct mesh mesh;
    struct mesh_coords me;
    int from_trainer; /* built from the trainer's communicators (mesh holds sizes only) */
    MPI_Comm dense;   /* dp_shard x cp ranks of one replica: dense matrices */
    MPI_Comm ep;      /* ranks that hold different experts */
    MPI_Comm xs;      /* expert shard group: ranks holding the same experts */
    MPI_Comm rep;     /* replicas of this rank's shards */
    double timeout_s; /* comm_timeout_s: a wait longer than this aborts the job (0: never) */
    int unsplit;      /* init's first agreement: dense is init's communicator, not yet split */
    MPI_Comm world;   /* during shardopt_init, the communicator it was given (the caller's: not
                         freed, not kept past init); else MPI_COMM_NULL. Only to name it in a
                         timeout's message: its ranks are the runtime's */
};

/* Split `comm` by the config's layout. Collective; an invalid layout fails on every rank. */
shardopt_status_t groups_create(MPI_Comm comm, const shardopt_config_t *cfg, struct groups *g);

/* Take a trainer's communicators (duplicated), check that they are consistent. Collective. */
shardopt_status_t groups_from_trainer(const shardopt_groups_t *in, struct groups *g);

void groups_free(struct groups *g);

/* 1 while MPI may be called: initialized and not finalized. Where it is not, a failed call has
 * nothing to agree over (every rank refuses alike) and communicators cannot be freed. */
int groups_mpi_usable(void);

/* Collectives over every rank of the runtime: over the dense group, then the replicate group
 * (the two together span all ranks, also when the trainer handed in its own groups). */
int groups_allreduce(const struct groups *g, void *buf, int count, MPI_Datatype type, MPI_Op op);
int groups_bcast(const struct groups *g, void *buf, int count, MPI_Datatype type);

/* Every rank returns the same status: the worst (most negative) one, and the message of the
 * lowest rank that had it, prefixed with that rank (collective). */
shardopt_status_t groups_agree(const struct groups *g, shardopt_status_t mine, const char *what);

/* groups_agree, and in the same all-reduce whether every rank passed the same digest (a hash of
 * the call's arguments): *differs is 1 on every rank when some two digests differ and the agreed
 * status is OK (0 otherwise). The caller then finds out which argument differs. */
shardopt_status_t groups_agree_digest(const struct groups *g, shardopt_status_t mine,
                                      const char *what, uint64_t digest, int *differs);

/* Every collective call of a runtime (commit, step, save, load, layout_print) opens with one
 * agreement of this shape (groups_agree_digest: three words, MAX), its digest made from the
 * call's tag (groups_call_tag; the step's mixes its arguments in), so that ranks in different
 * calls meet in the same all-reduce instead of in mismatched collectives (MPI_ERR_TRUNCATE, or a
 * hang until comm_timeout_s). When the digests differ, groups_calls_check tells a different call
 * (ERR_MISMATCH on every rank, one text naming two ranks and their calls, nothing done) from a
 * difference inside the same call (OK: the call looks further). Collective. */
uint64_t groups_call_tag(const char *call);
shardopt_status_t groups_calls_check(const struct groups *g, const char *call);

/* The opening agreement of a call other than the step: the status and the call's tag. */
shardopt_status_t groups_agree_call(const struct groups *g, shardopt_status_t mine,
                                    const char *call);

/* The same over the ranks of a and b together (b may be MPI_COMM_NULL), `rank` naming this one:
 * for init, before the groups exist, with this rank's own comm_timeout_s as the deadline (the
 * config is not yet agreed; 0: none). Returns mine when MPI is not initialised. */
shardopt_status_t groups_agree_on(MPI_Comm a, MPI_Comm b, int rank, shardopt_status_t mine,
                                  const char *what, double timeout_s);

/* t as a stand-in for groups not made yet, for comm_wait's deadline and message: a as the dense
 * group, b (may be MPI_COMM_NULL: t->unsplit) as the replicate group, `rank` this rank's number
 * in messages; no EP or expert shard group (set t->ep, t->xs to name one). */
void groups_view(struct groups *t, MPI_Comm a, MPI_Comm b, int rank, double timeout_s);

/* This rank's global index: replica * (dp_shard * cp) + dense rank. */
static inline int groups_rank(const struct groups *g) { return g->me.rank; }

#endif

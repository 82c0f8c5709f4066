/* Process groups: split from the layout, or taken from the trainer and checked. */
#include "runtime/comm/groups.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fault.h"
#include "base/mem.h"
#include "base/status.h"
#include "runtime/comm/comm_wait.h"

/* timeout_s is the caller's (set before the groups are made) and stays */
static void groups_null(struct groups *g)
{
    g->dense = g->ep = g->xs = g->rep = g->world = MPI_COMM_NULL;
}

int groups_mpi_usable(void)
{
    int ready = 0, finalized = 0;
    MPI_Initialized(&ready);
    MPI_Finalized(&finalized);
    return ready && !finalized;
}

void groups_free(struct groups *g)
{
    const int usable = groups_mpi_usable();
    MPI_Comm *c[] = {&g->dense, &g->ep, &g->xs, &g->rep};
    for (int i = 0; i < 4; i++)
        if (*c[i] != MPI_COMM_NULL && usable)
            MPI_Comm_free(c[i]);
    groups_null(g);
}

int groups_allreduce(const struct groups *g, void *buf, int count, MPI_Datatype type, MPI_Op op)
{
    int rc = comm_allreduce(g, g->dense, MPI_IN_PLACE, buf, count, type, op, "all-reduce");
    if (rc == MPI_SUCCESS)
        rc = comm_allreduce(g, g->rep, MPI_IN_PLACE, buf, count, type, op, "all-reduce");
    return rc;
}

int groups_bcast(const struct groups *g, void *buf, int count, MPI_Datatype type)
{
    /* global rank 0 is replica 0's dense rank 0: first to every replica's dense rank 0 (and the
     * rest of rank 0's replicate group), then inside each replica */
    int rc = comm_bcast(g, g->rep, buf, count, type, 0, "broadcast");
    if (rc == MPI_SUCCESS)
        rc = comm_bcast(g, g->dense, buf, count, type, 0, "broadcast");
    return rc;
}

shardopt_status_t groups_create(MPI_Comm comm, const shardopt_config_t *cfg, struct groups *g)
{
    const struct mesh_coords *c = &g->me;
    char why[1024];
    int world, rank, rc = MPI_SUCCESS;

    groups_null(g);
    g->from_trainer = 0;
    MPI_Comm_size(comm, &world);
    MPI_Comm_rank(comm, &rank);
    /* every rank sees the same numbers, so every rank fails alike without communicating */
    shardopt_status_t status =
        mesh_init(&g->mesh, world, cfg->dp_replicate, cfg->dp_shard, cfg->cp, cfg->ep);
    if (status != SHARDOPT_OK) { /* mesh.c's message, logged once with init's name */
        snprintf(why, sizeof why, "%s", shardopt_last_error());
        return log_fail(status, "init: %s", why);
    }
    mesh_coords(&g->mesh, rank, &g->me);

    /* SHARDOPT_FAULT_RANK: a fault site in the splits below must know this rank already */
    fault_note_rank(rank);
    /* one split after the other, each only once every member reached it (comm_split): a rank that
     * stops before one is named by the others, who abort instead of waiting in MPI for ever */
    const char *was = comm_phase_now();
    static const char *const names[MESH_GROUPS] = {"dense group", "expert-parallel group",
                                                   "expert shard group", "replicate group"};
    MPI_Comm *out[MESH_GROUPS] = {&g->dense, &g->ep, &g->xs, &g->rep};
    g->world = comm;
    comm_phase("init: splitting the communicator into the groups", -1);
    /* the colours and keys of sharding/mesh.c: the memberships its tests check */
    for (int k = 0; k < MESH_GROUPS && rc == MPI_SUCCESS; k++) {
        const struct mesh_split s = mesh_split(&g->mesh, c, (enum mesh_group)k);
        rc = comm_split(g, comm, s.color, s.key, out[k], names[k]);
    }
    comm_phase(was, -1);
    if (rc != MPI_SUCCESS) {
        groups_free(g);
        return log_fail(SHARDOPT_ERR_COMM,
                        "init: rank %d: MPI_Comm_split failed building the groups", rank);
    }
    return SHARDOPT_OK;
}

/* What each rank reports about itself when checking a trainer's groups. */
struct member_info {
    int dense_rank, ep_rank, ep_size, xs_rank, xs_size, rep_size;
};

/* The trainer's group, duplicated, or derived from the dense group (absent). v: the trainer's
 * groups, for the deadline and the names in a timeout's message. */
static shardopt_status_t dup_or_split(const struct groups *v, MPI_Comm given, MPI_Comm dense,
                                      int color, int key, MPI_Comm *out, const char *what)
{
    char made[64];
    snprintf(made, sizeof made, "%s group", what);
    int rc = given != MPI_COMM_NULL ? comm_dup(v, given, out, made)
                                    : comm_split(v, dense, color, key, out, made);
    if (rc != MPI_SUCCESS)
        return log_fail(SHARDOPT_ERR_COMM, "init_from_groups: cannot %s the %s group",
                        given != MPI_COMM_NULL ? "duplicate" : "derive", what);
    return SHARDOPT_OK;
}

/* The checks every rank can make alone once the dense group's member_info is gathered:
 * sizes multiply, (ep rank, expert-shard rank) pairs are unique, and the members of this rank's
 * EP and expert shard groups are the dense ranks that say so. Returns 0, or -1 (inconsistent) or
 * -2 (out of memory) with err. */
static int trainer_groups_check(const struct groups *g, const struct member_info *all, int nd,
                                char *err, size_t len)
{
    const struct member_info *me = &all[g->me.d];
    int ep_size = me->ep_size, xs_size = me->xs_size, *in_ep, *in_xs;
    MPI_Group dense_g, sub_g;
    int ok = 1;

    for (int i = 0; i < nd; i++)
        if (all[i].ep_size != ep_size || all[i].xs_size != xs_size ||
            all[i].rep_size != me->rep_size) {
            snprintf(err, len,
                     "dense rank %d reports ep %d x expert-shard %d x replicate %d, dense rank %d "
                     "reports %d x %d x %d",
                     i, all[i].ep_size, all[i].xs_size, all[i].rep_size, g->me.d, ep_size, xs_size,
                     me->rep_size);
            return -1;
        }
    if (ep_size * xs_size != nd) {
        snprintf(err, len, "ep size %d x expert-shard size %d != dense shard size %d", ep_size,
                 xs_size, nd);
        return -1;
    }
    for (int i = 0; i < nd; i++)
        for (int j = 0; j < i; j++)
            if (all[i].ep_rank == all[j].ep_rank && all[i].xs_rank == all[j].xs_rank) {
                snprintf(err, len,
                         "dense ranks %d and %d both have ep rank %d and expert-shard rank %d", j,
                         i, all[i].ep_rank, all[i].xs_rank);
                return -1;
            }
    /* members of my EP group: same expert-shard rank as mine, ep ranks 0..ep_size-1 */
    in_ep = mem_malloc(sizeof(int) * (size_t)(ep_size + xs_size) * 2);
    if (in_ep == NULL) {
        snprintf(err, len, "dense rank %d: out of memory allocating %zu bytes for the member lists",
                 g->me.d, sizeof(int) * (size_t)(ep_size + xs_size) * 2);
        return -2;
    }
    in_xs = in_ep + 2 * ep_size;
    for (int i = 0; i < ep_size; i++)
        in_ep[i] = i;
    for (int i = 0; i < xs_size; i++)
        in_xs[i] = i;
    MPI_Comm_group(g->dense, &dense_g);
    MPI_Comm_group(g->ep, &sub_g);
    MPI_Group_translate_ranks(sub_g, ep_size, in_ep, dense_g, in_ep + ep_size);
    MPI_Group_free(&sub_g);
    for (int i = 0; i < ep_size && ok; i++) {
        int d = in_ep[ep_size + i];
        ok = d != MPI_UNDEFINED && all[d].xs_rank == me->xs_rank && all[d].ep_rank == i;
        if (!ok)
            snprintf(err, len,
                     "EP group of dense rank %d: member %d is %s (expert-shard rank %d, ep rank "
                     "%d expected)",
                     g->me.d, i, d == MPI_UNDEFINED ? "not in the dense group" : "inconsistent",
                     me->xs_rank, i);
    }
    MPI_Comm_group(g->xs, &sub_g);
    MPI_Group_translate_ranks(sub_g, xs_size, in_xs, dense_g, in_xs + xs_size);
    MPI_Group_free(&sub_g);
    MPI_Group_free(&dense_g);
    for (int i = 0; i < xs_size && ok; i++) {
        int d = in_xs[xs_size + i];
        ok = d != MPI_UNDEFINED && all[d].ep_rank == me->ep_rank && all[d].xs_rank == i;
        if (!ok)
            snprintf(err, len,
                     "expert shard group of dense rank %d: member %d is %s (ep rank %d, "
                     "expert-shard rank %d expected)",
                     g->me.d, i, d == MPI_UNDEFINED ? "not in the dense group" : "inconsistent",
                     me->ep_rank, i);
    }
    free(in_ep);
    return ok ? 0 : -1;
}

shardopt_status_t groups_from_trainer(const shardopt_groups_t *in, struct groups *g)
{
    shardopt_status_t status;
    struct member_info mine, *all = NULL;
    int nd, d, ep_rank = 0, xs_rank = 0, ok, rep_d_ok;
    char err[384] = "";

    groups_null(g);
    g->from_trainer = 1;
    if (in->dense_shard == MPI_COMM_NULL)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "init_from_groups: dense_shard is MPI_COMM_NULL (it is required)");
    MPI_Comm_size(in->dense_shard, &nd);
    MPI_Comm_rank(in->dense_shard, &d);
    int rep0 = 0;
    if (in->replicate != MPI_COMM_NULL)
        MPI_Comm_rank(in->replicate, &rep0);
    /* the trainer's groups name the waits below (each under the deadline: a rank that stops
     * before a dup or split is named by the others, who abort); SHARDOPT_FAULT_RANK's sites in
     * them need this rank's number already */
    struct groups v;
    groups_view(&v, in->dense_shard, in->replicate, rep0 * nd + d, g->timeout_s);
    v.unsplit = 0; /* the trainer's dense group, not init's communicator */
    v.ep = in->ep;
    v.xs = in->expert_shard;
    fault_note_rank(v.me.rank);
    const char *was = comm_phase_now();
    comm_phase("init_from_groups: duplicating the groups", -1);
    status = dup_or_split(&v, in->dense_shard, MPI_COMM_NULL, 0, 0, &g->dense, "dense");
    if (in->ep != MPI_COMM_NULL)
        MPI_Comm_rank(in->ep, &ep_rank);
    if (in->expert_shard != MPI_COMM_NULL)
        MPI_Comm_rank(in->expert_shard, &xs_rank);
    /* absent groups: no EP puts every dense rank in an EP group of its own; a missing expert
     * shard group is everyone with the same EP rank */
    if (status == SHARDOPT_OK)
        status = dup_or_split(&v, in->ep, g->dense, in->expert_shard != MPI_COMM_NULL ? xs_rank : d,
                              d, &g->ep, "EP");
    if (status == SHARDOPT_OK)
        status = dup_or_split(&v, in->expert_shard, g->dense, in->ep != MPI_COMM_NULL ? ep_rank : 0,
                              d, &g->xs, "expert shard");
    if (status == SHARDOPT_OK)
        status = dup_or_split(&v, in->replicate, g->dense, d, 0, &g->rep, "replicate");
    comm_phase(was, -1);
    if (status != SHARDOPT_OK) {
        groups_free(g);
        return status;
    }
    mine.dense_rank = d;
    MPI_Comm_rank(g->ep, &mine.ep_rank);
    MPI_Comm_size(g->ep, &mine.ep_size);
    MPI_Comm_rank(g->xs, &mine.xs_rank);
    MPI_Comm_size(g->xs, &mine.xs_size);
    MPI_Comm_size(g->rep, &mine.rep_size);
    g->me.d = d;

    /* every member joins the gather, or none: a rank without room must not leave the others in it
     */
    all = mem_malloc(sizeof(*all) * (size_t)nd);
    int oom = all == NULL, rc = 0;
    if (oom)
        snprintf(err, sizeof err,
                 "dense rank %d: out of memory allocating %zu bytes for the members' reports", d,
                 sizeof(*all) * (size_t)nd);
    int any_oom = oom;
    comm_phase("init_from_groups: checking the groups", -1);
    comm_allreduce(g, g->dense, MPI_IN_PLACE, &any_oom, 1, MPI_INT, MPI_MAX, "all-reduce");
    ok = !any_oom;
    if (ok) {
        comm_allgather(g, g->dense, &mine, sizeof mine, MPI_BYTE, all, "all-gather of members");
        rc = trainer_groups_check(g, all, nd, err, sizeof err);
        ok = rc == 0;
        oom = rc == -2;
    }
    /* my replicas must sit at my dense rank */
    rep_d_ok = 1;
    {
        int mn = d, mx = d;
        comm_allreduce(g, g->rep, MPI_IN_PLACE, &mn, 1, MPI_INT, MPI_MIN, "all-reduce");
        comm_allreduce(g, g->rep, MPI_IN_PLACE, &mx, 1, MPI_INT, MPI_MAX, "all-reduce");
        rep_d_ok = mn == d && mx == d;
        if (!rep_d_ok && ok)
            snprintf(err, sizeof err,
                     "replicate group of dense rank %d holds dense ranks %d..%d: replicas must "
                     "hold the same shards",
                     d, mn, mx);
    }
    ok = ok && rep_d_ok;
    /* out of memory anywhere comes first: the check did not finish */
    int rep_rank = 0;
    MPI_Comm_rank(g->rep, &rep_rank);
    const int my_rank = rep_rank * nd + d;
    status = groups_agree_on(
        g->dense, g->rep, my_rank,
        oom ? log_fail(SHARDOPT_ERR_OUT_OF_MEMORY, "init_from_groups: rank %d: %s", my_rank, err)
            : SHARDOPT_OK,
        "init_from_groups", g->timeout_s);
    if (status != SHARDOPT_OK) {
        free(all);
        groups_free(g);
        return status;
    }
    int all_ok = ok;
    groups_allreduce(g, &all_ok, 1, MPI_INT, MPI_MIN);
    free(all);
    if (!all_ok) {
        groups_free(g);
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "init_from_groups: inconsistent groups: %s",
                        ok ? "another rank found a mismatch (see its log)" : err);
    }

    g->mesh.dp_replicate = mine.rep_size;
    g->mesh.dp_shard =
        nd; /* the trainer's split of the dense group into dp_shard x cp is not ours to know */
    g->mesh.cp = 1;
    g->mesh.ep = mine.ep_size;
    g->mesh.dense = nd;
    g->mesh.world = nd * mine.rep_size;
    MPI_Comm_rank(g->rep, &g->me.rep);
    g->me.rank = g->me.rep * nd + d;
    g->me.shard = d;
    g->me.cp_index = 0;
    g->me.ep_rank = mine.ep_rank;
    g->me.xs_rank = mine.xs_rank;
    g->me.ep_block = -1;
    return SHARDOPT_OK;
}

/* The agreed outcome pair = (worst status, lowest rank that had it) reaches every rank: the
 * chosen rank's message is shared and each rank returns it. */
static shardopt_status_t agree_message(const struct groups *tg, MPI_Comm a, MPI_Comm b, int rank,
                                       shardopt_status_t mine, const char *what, const int pair[2])
{
    char msg[512];

    /* the chosen rank's message reaches every rank: only it contributes non-zero bytes */
    memset(msg, 0, sizeof msg);
    if (pair[1] == rank)
        snprintf(msg, sizeof msg, "%s", shardopt_last_error());
    comm_allreduce(tg, a, MPI_IN_PLACE, msg, sizeof msg, MPI_BYTE, MPI_BOR, "error message");
    if (b != MPI_COMM_NULL)
        comm_allreduce(tg, b, MPI_IN_PLACE, msg, sizeof msg, MPI_BYTE, MPI_BOR, "error message");
    msg[sizeof msg - 1] = '\0';
    /* One text on every rank, the chosen rank included: "<what>: rank N: <its message>" (a
     * trainer that prints on rank 0 sees the failing rank's own reason). A message that already
     * starts so is passed on as it is; one that starts with "<what>: " gets the rank after that
     * word. */
    char prefix[96], agreed[sizeof msg + sizeof prefix];
    snprintf(prefix, sizeof prefix, "%s: rank %d: ", what, pair[1]);
    const size_t w = strlen(what);
    if (strncmp(msg, prefix, strlen(prefix)) == 0)
        snprintf(agreed, sizeof agreed, "%s", msg);
    else
        snprintf(agreed, sizeof agreed, "%s%s", prefix,
                 strncmp(msg, what, w) == 0 && msg[w] == ':' && msg[w + 1] == ' ' ? msg + w + 2
                                                                                  : msg);
    /* each rank logs one error per failed call: a rank that failed itself logged its own reason
     * where it found it, the others log the agreed one */
    if (mine != SHARDOPT_OK)
        return status_set((shardopt_status_t)pair[0], "%s", agreed);
    return log_fail((shardopt_status_t)pair[0], "%s", agreed);
}

static shardopt_status_t agree(const struct groups *tg, MPI_Comm a, MPI_Comm b, int rank,
                               shardopt_status_t mine, const char *what)
{
    int pair[2] = {(int)mine, rank};

    if (!groups_mpi_usable()) /* the call failed here already: no MPI to agree over */
        return mine;
    /* every rank's outcome of the call: the wait where a rank that never arrives is found */
    comm_allreduce(tg, a, MPI_IN_PLACE, pair, 1, MPI_2INT, MPI_MINLOC, "status agreement");
    if (b != MPI_COMM_NULL)
        comm_allreduce(tg, b, MPI_IN_PLACE, pair, 1, MPI_2INT, MPI_MINLOC, "status agreement");
    if (pair[0] == SHARDOPT_OK)
        return SHARDOPT_OK;
    return agree_message(tg, a, b, rank, mine, what, pair);
}

shardopt_status_t groups_agree_digest(const struct groups *g, shardopt_status_t mine,
                                      const char *what, uint64_t digest, int *differs)
{
    /* One all-reduce (MAX) of three words instead of the status agreement's MINLOC pair, so the
     * check rides on a collective the call makes anyway: the worst status with the lowest rank
     * that had it (statuses are <= 0: -status in the high half, ~rank in the low half, so MAX
     * picks the most negative status, then the lowest rank), the largest digest and the largest
     * complement (the smallest digest). The digests differ somewhere iff largest != smallest,
     * which every rank sees alike. */
    uint64_t v[3] = {((uint64_t)(uint32_t)(-(int)mine) << 32) | (uint32_t) ~(uint32_t)g->me.rank,
                     digest, ~digest};
    *differs = 0;
    if (!groups_mpi_usable()) /* the call failed here already (rt_mpi_live): no MPI to agree over */
        return mine;
    comm_allreduce(g, g->dense, MPI_IN_PLACE, v, 3, MPI_UINT64_T, MPI_MAX, "status agreement");
    if (g->rep != MPI_COMM_NULL)
        comm_allreduce(g, g->rep, MPI_IN_PLACE, v, 3, MPI_UINT64_T, MPI_MAX, "status agreement");
    const int pair[2] = {-(int)(uint32_t)(v[0] >> 32), (int)~(uint32_t)v[0]};
    if (pair[0] != SHARDOPT_OK)
        return agree_message(g, g->dense, g->rep, g->me.rank, mine, what, pair);
    *differs = v[1] != ~v[2];
    return SHARDOPT_OK;
}

void groups_view(struct groups *t, MPI_Comm a, MPI_Comm b, int rank, double timeout_s)
{
    memset(t, 0, sizeof *t);
    t->dense = a;
    t->rep = b;
    t->ep = t->xs = t->world = MPI_COMM_NULL;
    MPI_Comm_size(a, &t->mesh.dense);
    MPI_Comm_rank(a, &t->me.d);
    if (b != MPI_COMM_NULL)
        MPI_Comm_rank(b, &t->me.rep);
    t->me.rank = rank;
    t->timeout_s = timeout_s;
    t->unsplit = b == MPI_COMM_NULL;
}

shardopt_status_t groups_agree_on(MPI_Comm a, MPI_Comm b, int rank, shardopt_status_t mine,
                                  const char *what, double timeout_s)
{
    struct groups t;

    if (!groups_mpi_usable())
        return mine;
    groups_view(&t, a, b, rank, timeout_s);
    return agree(&t, a, b, rank, mine, what);
}

shardopt_status_t groups_agree(const struct groups *g, shardopt_status_t mine, const char *what)
{
    return agree(g, g->dense, g->rep, g->me.rank, mine, what);
}

uint64_t groups_call_tag(const char *call)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a-64 */
    for (const char *c = call; *c != '\0'; c++)
        h = (h ^ (unsigned char)*c) * 1099511628211ull;
    return h;
}

#define CALL_NAME 24

/* Either all-reduce of groups_calls_check failed. */
static shardopt_status_t calls_compare_failed(const struct groups *g, const char *call)
{
    return log_fail(SHARDOPT_ERR_COMM,
                    "%s: rank %d: the all-reduce comparing the ranks' calls failed", call,
                    g->me.rank);
}

shardopt_status_t groups_calls_check(const struct groups *g, const char *call)
{
    const uint64_t tag = groups_call_tag(call);
    uint64_t v[2] = {tag, ~tag}; /* MIN of both: the smallest and the largest tag */
    if (groups_allreduce(g, v, 2, MPI_UINT64_T, MPI_MIN) != MPI_SUCCESS)
        return calls_compare_failed(g, call);
    if (v[0] == ~v[1])
        return SHARDOPT_OK; /* one call everywhere: what differs is the call's to find */
    /* the lowest rank at each end and its call's name (equal tags, equal names: MAX of bytes) */
    int who[2] = {tag == v[0] ? g->me.rank : INT_MAX, tag == ~v[1] ? g->me.rank : INT_MAX};
    unsigned char name[2][CALL_NAME];
    memset(name, 0, sizeof name);
    for (int e = 0; e < 2; e++)
        if (who[e] != INT_MAX)
            snprintf((char *)name[e], CALL_NAME, "%s", call);
    if (groups_allreduce(g, who, 2, MPI_INT, MPI_MIN) != MPI_SUCCESS ||
        groups_allreduce(g, name, 2 * CALL_NAME, MPI_UNSIGNED_CHAR, MPI_MAX) != MPI_SUCCESS)
        return calls_compare_failed(g, call);
    name[0][CALL_NAME - 1] = name[1][CALL_NAME - 1] = '\0';
    const int lo = who[0] < who[1] ? 0 : 1;
    return log_fail(SHARDOPT_ERR_MISMATCH,
                    "%s: ranks are in different collective calls: rank %d in shardopt_%s, rank %d "
                    "in shardopt_%s (every rank makes the runtime's collective calls in the same "
                    "order: docs/api.md, Conventions); nothing was done",
                    call, who[lo], (const char *)name[lo], who[1 - lo], (const char *)name[1 - lo]);
}

shardopt_status_t groups_agree_call(const struct groups *g, shardopt_status_t mine,
                                    const char *call)
{
    int differ = 0;
    shardopt_status_t status = groups_agree_digest(g, mine, call, groups_call_tag(call), &differ);
    if (status == SHARDOPT_OK && differ)
        status = groups_calls_check(g, call);
    return status;
}

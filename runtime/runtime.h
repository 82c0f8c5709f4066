/* The runtime's internal state: what init, register, commit and step share. */
#ifndef RUNTIME_RUNTIME_H
#define RUNTIME_RUNTIME_H

#include <stdatomic.h>

#include "kernels/device.h"
#include "kernels/ns_coeffs.h"
#include "kernels/ops.h"
#include "kernels/timeline.h"
#include "offload/staging.h"
#include "offload/state_store.h"
#include "runtime/comm/comm_nccl.h"
#include "runtime/comm/groups.h"
#include "runtime/comm/transport.h"
#include "runtime/step/elem_batch.h"
#include "runtime/topology.h"
#include "sharding/layout.h"
#include "sharding/plan.h"
#include "shardopt.h"

struct shardopt_param {
    struct shardopt_runtime *rt;
    char *name;
    uint64_t name_hash; /* keys stochastic rounding: stable across runs and layouts */
    int index;          /* registration order */
    struct layout layout;
    struct elem_index_map index_map; /* local element -> global flat index */
    shardopt_dtype_t param_dtype, grad_dtype;
    int transposed;
    shardopt_placement_t placement;
    void *data;
    const void *grad;
    const void *checked_data, *checked_grad; /* the last pointers step_pointers accepted */
    const void *alias_data, *alias_grad;     /* the last pointers alias_check accepted */
    /* shardopt_params_set_pointers: the call (rt->set_epoch) and entry that last named this
     * parameter, so that a parameter given twice in one call is found without a search */
    uint64_t set_epoch;
    int set_entry;
    shardopt_algo_t algo; /* resolved: MUON or ADAMW */
    double lr_mult, wd_mult;

    /* Muon */
    struct matrix_view mv;
    int ns_variant;
    int ns_block;        /* bf16 symmetric variant: rows per block row */
    int ns_algorithm;    /* enum ns_algorithm for this shape (ns_algorithm = auto: the table's) */
    int ns_guard_warned; /* the Gram result guard's warning was given (muon_exec.c) */
    double lr_scale;     /* per-matrix multiplier of lr from the true shape */
    size_t off_momentum;

    /* Sharded Newton-Schulz: this rank's piece of each matrix (stored rows x cols) and its
     * working shape (sh_m rows, sh_n of the columns) */
    int ns_sharded;
    int64_t sh_rows, sh_cols, sh_m, sh_n;

    /* AdamW */
    size_t off_exp_avg, off_exp_avg_sq;

    uint64_t step; /* steps this parameter has taken (AdamW bias correction, rounding key) */
    int skip;      /* this step: no gradient on any rank (skip_missing_grads); nothing changes */

    /* shardopt_param_get_stats */
    double grad_norm_last;  /* the pre-pass's global norm of this gradient (NaN: skipped/none) */
    double update_rms_last; /* param_stats = 1: RMS of the last step's change (NaN: not kept) */
    size_t off_snapshot;    /* param_stats = 1: bytes into rt->pstat_snap */
};

/* Where Muon matrices are orthogonalized: replicated tensors on every rank itself, dense
 * tensors over the dense shard group, expert stacks over the expert shard group. */
enum group_kind { GROUP_LOCAL = 0, GROUP_DENSE = 1, GROUP_EXPERT = 2, GROUP_KINDS = 3 };

struct group_exec {
    struct group_plan plan;
    MPI_Comm comm; /* MPI_COMM_NULL for GROUP_LOCAL */
    /* Newton-Schulz teams (runtime/commit_teams.c): the distinct member sets of the plan's team
     * matrices, in matrix order; set_comm[s] is set s's communicator where this rank is one of
     * its members, else MPI_COMM_NULL */
    int nsets;
    int *set_of;        /* [plan.nmatrices]: a team matrix's set, else -1 */
    MPI_Comm *set_comm; /* [nsets] */
    /* [nsets] or NULL: with the exchanges over NCCL (rt->nccl[GROUP_DENSE]), set s's NCCL
     * communicator where this rank is a member (its Gram all-reduces stay on the device) */
    struct nccl_group **set_nccl;
};

/* The transports (rt->xport): one per group kind, then the replicate group's. */
enum { XPORT_REPLICATE = GROUP_KINDS, XPORTS = GROUP_KINDS + 1 };

#define PIPELINE_DEPTH 3

/* What the step measures; stats.c derives the rest of shardopt_stats_t from the params. */
struct step_counters {
    uint64_t steps, skipped;
    int last_skipped;
    double grad_norm_last;
    char nonfinite_last[256]; /* names of the tensors that made the last step skip or fail */
    uint64_t nonfinite_elements_last; /* nonfinite = zero: elements treated as 0, this replica */
    double ns_flops_last;
    uint64_t ns_gram_fallbacks; /* results the guard refused and recomputed (Gram as standard,
                                 * bf16 standard in fp32): all steps */
    uint64_t bytes_sent[GROUP_KINDS], bytes_recv[GROUP_KINDS]; /* last step, other ranks only */
    double bytes_ns_allreduce; /* last step: sharded and team Gram all-reduces, ring model */
    double seconds_last, seconds_total;
    double seconds_ns_sharded_last;
    double seconds_prepass_last, seconds_adamw_last, seconds_momentum_last, seconds_exchange1_last,
        seconds_ns_last, seconds_exchange2_last, seconds_apply_last;
};

/* One step's phase times as the stats report them: the counters' and staging's, kept from the
 * previous step so that get_stats can answer without waiting for a device still running the
 * last one (stats.c). */
struct phase_times {
    double prepass, adamw, momentum, exchange1, ns, exchange2, apply, ns_sharded;
    double copy_exposed, copy_busy;
};

struct shardopt_runtime {
    /* The call running on this runtime (rt_claim), NULL between calls: calls must not overlap
     * (docs/api.md, Threads), and one from a second thread is refused instead of racing */
    _Atomic(const char *) busy;
    struct shardopt_runtime *live_next; /* the live runtimes (live_list.h), or the shells */
    size_t shell_bytes;                 /* a finalized runtime's shell: its bytes (live_retire) */
    shardopt_config_t cfg;
    struct groups groups; /* our own communicators: our traffic never matches the trainer's */
    struct topology topo;
    const struct kernel_ops *ops;
    const struct device_ops *dev; /* ops' memory, copies and streams */
    /* Runs Newton-Schulz and holds its device copies: ops and dev, but for offload = cpu on CUDA
     * the CUDA tables beside the CPU ones */
    const struct kernel_ops *ns_ops;
    const struct device_ops *ns_dev;
    struct kernel_ctx kctx;
    float ns_coeffs[NS_TABLE_MAX_STEPS][3];
    int ns_compute;  /* resolved: KDT_F32 or KDT_BF16 */
    int cpu_no_bf16; /* SHARDOPT_CPU_NO_BF16=1, read once at kernel selection: auto as without */
    float ns_norm_scale;

    /* The Muon momentum of the step running: args.momentum, or the config's (set by each
     * shardopt_step before the Muon tensors; the momentum kernels read it) */
    double step_momentum;

    struct shardopt_param **params;
    int nparams, params_cap;
    uint64_t set_epoch;       /* shardopt_params_set_pointers calls so far */
    int register_failures;    /* failed shardopt_register calls: commit then fails everywhere */
    char register_error[512]; /* the first one's message */
    int committed;

    struct state_store store;
    struct group_exec gx[GROUP_KINDS];
    /* the team cap of the dense and expert shard groups' plans (commit.c, teams_setup; 1: no
     * teams) and the node size each group places its teams in (members per node, 1: none) */
    int team_cap, team_node_members, xs_team_node_members;
    int team_compute; /* the dtype teams iterate in: ns_compute's, or fp32 (teams_setup) */
    /* Tests only (test_device_sim), set between init and commit: 1 plans the expert shard
     * groups' teams matrix by matrix (plan_cfg.team_guard off), as before the group-wide choice,
     * so that a model whose expert groups gain nothing from teams still runs some */
    int xs_team_guard_off;
    /* Tests only, set between init and commit: 1 keeps the joint plan without comparing it with
     * LPT over the union (commit_union.c), as before the union plan */
    int union_off;
    /* Tests only, set between init and commit on every rank: 1 keeps LPT over the union whatever
     * the cost model says (test_xcheck: its paths on every layout, not only where it pays) */
    int union_force;
    int union_kept; /* 1: commit kept LPT over the union of both groups (commit_union.c) */
    /* the cost model's rates commit plans at: cost_gemm_gflops / cost_net_gbps, or where they
     * are 0 (the defaults) those of where Newton-Schulz runs (config_cost.h) */
    double cost_gflops, cost_gbps;
    /* Buckets in flight (docs/design.md, The step): bucket k+1 in exchange #1 and k-1 in exchange
     * #2 while k is in Newton-Schulz, so three sets of buffers, comm dtype, sized for the largest
     * bucket */
    struct bucket_buffers {
        void *a, *b, *ns;
        void *ha, *hb, *hns; /* device backends: pinned host mirrors that MPI reads and writes */
        MPI_Request *req;    /* 2 per member of the largest group: one exchange at a time */
        int *peer;           /* the member each request waits on (comm_timeout_s messages) */
    } bufs[PIPELINE_DEPTH];
    /* A step failed with exchanges in flight over MPI (muon_exec.c, muon_abandon): their requests
     * were freed unwaited, so MPI may still write the receive buffers (a and b, or ha and hb)
     * after the step returned, and a peer's message meant for the failed step would match the
     * next step's receive of the same tag. Those buffers are kept past finalize (left to MPI)
     * and every later step refuses. */
    int exchange_abandoned;
    /* This step: a sharded or team Newton-Schulz matrix failed (ns_sharded.c; its group learnt
     * it in the same all-reduce), or a gathered one on its owner (muon_exec.c). Every rank ran
     * every later collective of the step, so the failure is agreed at the Muon phase's end
     * instead of leaving peers in an all-reduce or an exchange. */
    shardopt_status_t ns_failed;
    /* This step: a team collective of this rank failed over NCCL (ERR_NCCL: its team's
     * communicator aborted, muon_exec.c). Its pipeline goes on, and each later team block of the
     * step joins its team's norm all-reduce with the failure flag and computes nothing, so that
     * every member of every later team stops at that one all-reduce (ns_sharded.c) */
    int team_poisoned;
    /* The Muon phase's MPI all-reduces' deadline (ns_sharded_deadline), set at commit: the
     * team communicators and the sharded strategy's choices it depends on are commit's */
    double ns_timeout_s;
    /* A step failed at that agreement: part of its update was written, and a matrix that failed
     * in one replica's group was applied by the other replicas (they learn of it only at the
     * agreement), so the replicas may differ. Every later step refuses, as after
     * exchange_abandoned. */
    int ns_torn;
    struct ns_workspace ns_ws;
    int *rep_counts, *rep_displs; /* [dp_replicate]: replica_split's all-gather */
    struct alias_span *alias;     /* [3 * nparams]: alias_check's scratch (the step allocates
                                     nothing), then peer_spans */
    /* alias_check_peers (alias_check.h): the data spans this runtime last stepped, sorted
     * ([npeer_spans] at alias + 2 * nparams), the process-wide number of that step (0: none
     * yet), whether a data pointer moved since, and whether the other runtimes' checks read them
     * (stepped since its commit; under live_list.h's lock) */
    struct alias_span *peer_spans;
    int npeer_spans, peer_dirty, peer_listed;
    uint64_t peer_seq;
    void *sh_u;     /* sharded Newton-Schulz: one piece's U and O, comm dtype */
    float *sh_x;    /* X, Y, Gram, B: where Newton-Schulz runs (ns_dev) */
    float *sh_host; /* NS on a device: host staging of the Gram all-reduce and AOL (pinned) */
    /* ns_compute = bf16 teams: MPI_SUM of bf16 Gram entries (MPI has no bf16 type), made at
     * commit when this rank is in a team (ns_sharded_bf16_op), freed by commit_release */
    MPI_Op ns_bf16_sum;
    int have_bf16_sum;
    struct staging stage; /* offload: staging slots (optimizer) and the copy counters */
    /* comm_backend = nccl: a communicator per group of more than one rank (NULL otherwise) */
    struct nccl_group *nccl[GROUP_KINDS], *nccl_rep;
    /* How each group's exchanges travel, chosen at commit (commit.c): [GROUP_LOCAL]
     * exchanges nothing, [XPORT_REPLICATE] is replica_split's all-gather */
    struct comm_transport xport[XPORTS];
    struct ew_pending *ew;         /* device backends: elementwise calls waiting for one launch */
    void *dev_ns, *dev_sh_u;       /* offload = cpu: device copies of NS slots and sharded U */
    double *sumsq;                 /* [nparams]: the step's gradient pre-pass */
    int *group_ranks[GROUP_KINDS]; /* commit: the runtime rank of each group member (not LOCAL) */
    void *pstat_snap;              /* param_stats = 1: every local shard before the update */
    double *pstat_sum;             /* param_stats = 1: [nparams] squared changes, all-reduced */
    const void **pre_x;            /* [nparams], device backends: the pre-pass's one batched call */
    int *pre_dt;
    size_t *pre_n;
    int *nonfinite;   /* [nparams]: NaN/Inf gradient somewhere */
    int *gradflags;   /* skip_missing_grads: [2 * nparams] a rank without / with a gradient */
    double *pre_fin;  /* nonfinite = zero: [2 * nparams] the finite sums and the zeroed counts */
    uint32_t *drift;  /* replica_check_every: [4 * nparams] checksums and their min/max */
    void *drift_host; /* device backends: a host buffer the parameters pass through */
    size_t bytes_workspace;

    struct step_counters counters;
    int64_t load_kept, load_unused; /* the last successful load's unmatched counts (stats v4) */
    /* where the phase times above are measured: host clocks on the CPU, marks on a device */
    struct timeline timeline;
    struct phase_times phases_prev; /* the step before the last one's, resolved */
};

/* At a step's start: the last step's device intervals resolved (its work precedes this step's
 * on the stream, so this waits for nothing the trainer's queued work does not already wait for)
 * and its phase times kept in phases_prev, before the counters are reset. */
void stats_phases_settle(struct shardopt_runtime *rt);

/* Device backends: make init's device current on the calling thread (device_ops.device_enter),
 * at the start of every entry point that queues device work or allocates device memory
 * (commit, step, save, load, get_stats, finalize): CUDA's current device is per thread. what
 * names the call for the message. SHARDOPT_OK, or SHARDOPT_ERR_DEVICE; not agreed (the
 * collective callers agree on it). */
shardopt_status_t rt_device_enter(struct shardopt_runtime *rt, const char *what);

/* Marks rt as running `call` (a static string) for the calls that read or write its state
 * (commit, step, save, load, layout_print, register, the pointer and state setters and getters,
 * finalize):
 * SHARDOPT_ERR_STATE, naming both calls, when another thread's call is running on it (local:
 * the racing call is refused before it reads anything); rt_release ends the claim. Both take a
 * NULL rt as nothing to claim, so the call goes on to refuse it by name. */
shardopt_status_t rt_claim(struct shardopt_runtime *rt, const char *call);
void rt_release(struct shardopt_runtime *rt);

/* SHARDOPT_ERR_STATE, naming `what`, once MPI_Finalize was called (an MPI call would end the
 * process); else OK. Collective calls check it before their first MPI call. */
shardopt_status_t rt_mpi_live(const char *what);

/* The opening agreement of commit, save and load (groups_agree_call; the step folds the same into
 * its argument agreement): mine, this rank's own refusal of the call before any communication
 * (already committed, not committed, a NULL dir; SHARDOPT_OK when none), else rt_device_enter,
 * agreed over every rank of the runtime, so that one rank's refusal fails the call on all of them
 * with its message instead of leaving them in this agreement until comm_timeout_s. Local only
 * once MPI is finalized (rt_mpi_live). Collective. */
shardopt_status_t rt_open_call(struct shardopt_runtime *rt, const char *what,
                               shardopt_status_t mine);

/* Records this step's first failure of its Muon phase (ns_failed): the exchanges and all-reduces
 * still run, and the phase's closing agreement fails the step on every rank. OK records nothing. */
static inline void rt_ns_failed_note(struct shardopt_runtime *rt, shardopt_status_t status)
{
    if (status != SHARDOPT_OK && rt->ns_failed == SHARDOPT_OK)
        rt->ns_failed = status;
}

/* State and buffers live in device memory (the CUDA backend): the host never touches them
 * directly, MPI moves them through the pinned host mirrors. */
static inline int rt_on_device(const struct shardopt_runtime *rt)
{
    return device_has(rt->dev, DEVICE_CAP_DEVICE_MEMORY);
}

/* The runtime's NCCL groups (comm_backend = nccl) in the order they were made, into out;
 * returns how many there are (0: exchanges over MPI). The first owns the stream the others
 * borrow, so they are destroyed in the reverse order. */
static inline int rt_nccl_groups(const struct shardopt_runtime *rt,
                                 struct nccl_group *out[GROUP_KINDS + 1])
{
    struct nccl_group *const all[] = {rt->nccl[GROUP_DENSE], rt->nccl[GROUP_EXPERT], rt->nccl_rep};
    int n = 0;
    for (int i = 0; i < 3; i++)
        if (all[i] != NULL)
            out[n++] = all[i];
    return n;
}

/* The Newton-Schulz teams' NCCL communicators (commit_teams.c, gx[].set_nccl): with abort set,
 * abort them all (after a failed step, as the groups'); returns whether one was aborted. */
static inline int rt_teams_nccl_aborted(struct shardopt_runtime *rt, int abort)
{
    int any = 0;
    for (int k = 0; k < GROUP_KINDS; k++)
        for (int s = 0; rt->gx[k].set_nccl != NULL && s < rt->gx[k].nsets; s++) {
            if (abort)
                nccl_group_abort(rt->gx[k].set_nccl[s]);
            any |= nccl_group_aborted(rt->gx[k].set_nccl[s]);
        }
    return any;
}

/* Make an NCCL group for each of the dense, expert shard and replicate groups that has more
 * than one member, bootstrapped over it (context.c). Collective: a failure anywhere fails
 * every rank. */
shardopt_status_t rt_nccl_create(shardopt_runtime_t rt);

/* Newton-Schulz runs on a device (the CUDA table), whatever runs the rest. */
static inline int rt_ns_on_device(const struct shardopt_runtime *rt)
{
    return device_has(rt->ns_dev, DEVICE_CAP_DEVICE_MEMORY);
}

/* Free what commit made, leaving the runtime as before commit (also used by finalize). */
void commit_release(shardopt_runtime_t rt);

#endif

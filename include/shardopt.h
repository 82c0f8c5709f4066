/*
 * shardopt: the optimizer step of large Mixture-of-Experts training jobs, across processes.
 *
 * Muon (momentum + Newton-Schulz orthogonalization) for matrices, AdamW for the rest.
 * One public header, NCCL-style: opaque handles, every call returns a status, the detail of the
 * last failure is kept per thread, config structs are versioned and start with size/version.
 * It stays one file, over 600 lines, on purpose: a trainer includes one header and has the whole
 * API, declarations and their documentation, as with nccl.h. Only the status codes and the enums
 * the kernels compute with are apart (shardopt_status.h, shardopt_types.h, included here), so that
 * the library's layers without MPI can use them without mpi.h.
 */
#ifndef SHARDOPT_H
#define SHARDOPT_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "shardopt_status.h" /* the status codes, SHARDOPT_API; no MPI */
#include "shardopt_types.h"  /* dtypes, rounding, Newton-Schulz choices; no MPI */

#ifdef __cplusplus
extern "C" {
#endif

#define SHARDOPT_VERSION_MAJOR 0
#define SHARDOPT_VERSION_MINOR 1
#define SHARDOPT_VERSION_PATCH 0
/** Single integer, comparable: major*10000 + minor*100 + patch. */
#define SHARDOPT_VERSION                                                                           \
    (SHARDOPT_VERSION_MAJOR * 10000 + SHARDOPT_VERSION_MINOR * 100 + SHARDOPT_VERSION_PATCH)

typedef enum shardopt_algo {
    SHARDOPT_ALGO_AUTO = 0, /**< Muon for matrices, AdamW for the rest (see adamw_patterns) */
    SHARDOPT_ALGO_MUON = 1,
    SHARDOPT_ALGO_ADAMW = 2,
} shardopt_algo_t;

typedef enum shardopt_placement {
    SHARDOPT_PLACEMENT_DENSE = 0,      /**< sharded over the dense shard group */
    SHARDOPT_PLACEMENT_EXPERT = 1,     /**< [E, out, in] stack split over EP, then expert shards */
    SHARDOPT_PLACEMENT_REPLICATED = 2, /**< every rank holds all of it */
} shardopt_placement_t;

/** Learning-rate scale for an [A, B] = [out, in] matrix. */
typedef enum shardopt_lr_scale {
    SHARDOPT_LR_SCALE_RMS_NORM = 0,      /**< 0.2 * sqrt(max(A, B)) (default) */
    SHARDOPT_LR_SCALE_SPECTRAL_NORM = 1, /**< sqrt(A / B) */
    SHARDOPT_LR_SCALE_JORDAN = 2,        /**< sqrt(max(1, A / B)) */
    SHARDOPT_LR_SCALE_NONE = 3,          /**< 1 */
} shardopt_lr_scale_t;

typedef enum shardopt_backend {
    SHARDOPT_BACKEND_CPU = 0,
    SHARDOPT_BACKEND_CUDA = 1,
} shardopt_backend_t;

/** How the CUDA backend moves matrices between ranks (the CPU backend always uses MPI). */
typedef enum shardopt_comm_backend {
    SHARDOPT_COMM_NCCL = 0, /**< NCCL communicators over each group (default) */
    SHARDOPT_COMM_MPI = 1,  /**< MPI through pinned host buffers: ranks may share a GPU */
} shardopt_comm_backend_t;

/** Which GPU the CUDA backend uses. */
typedef enum shardopt_device {
    SHARDOPT_DEVICE_CURRENT = 0,    /**< the device current at init: the trainer chose it */
    SHARDOPT_DEVICE_LOCAL_RANK = 1, /**< the node-local rank modulo the visible devices */
} shardopt_device_t;

/** Which CPU kernel implementations run. */
typedef enum shardopt_kernels {
    SHARDOPT_KERNELS_AUTO = 0,      /**< the best this CPU supports */
    SHARDOPT_KERNELS_REFERENCE = 1, /**< portable C, the test oracle (slow Newton-Schulz) */
    SHARDOPT_KERNELS_PORTABLE = 2,  /**< portable C elementwise + BLAS Newton-Schulz */
    SHARDOPT_KERNELS_AVX512 = 3,    /**< AVX-512 elementwise + BLAS Newton-Schulz */
    SHARDOPT_KERNELS_AVX2 = 4,      /**< AVX2+FMA elementwise + BLAS Newton-Schulz */
} shardopt_kernels_t;

/** What a step does when a gradient holds NaN or Inf on any rank (decided on all ranks alike,
 *  before anything is written). */
typedef enum shardopt_nonfinite {
    SHARDOPT_NONFINITE_SKIP = 0,  /**< skip the step: nothing changes, stats name the tensors */
    SHARDOPT_NONFINITE_ERROR = 1, /**< return SHARDOPT_ERR_NONFINITE, nothing written */
    SHARDOPT_NONFINITE_ZERO = 2,  /**< treat those elements as 0 and step; stats name the tensors
                                       and count the elements (CPU kernels only) */
} shardopt_nonfinite_t;

/** Thread placement at init. */
typedef enum shardopt_bind {
    SHARDOPT_BIND_NONE =
        0, /**< leave the process where it is (a library must not move a trainer) */
    SHARDOPT_BIND_AUTO =
        1, /**< keep a launcher's binding, else spread the node's ranks over cores */
} shardopt_bind_t;

/** Where optimizer state lives. */
typedef enum shardopt_offload {
    SHARDOPT_OFFLOAD_NONE = 0,      /**< with the parameters (device memory with CUDA) */
    SHARDOPT_OFFLOAD_OPTIMIZER = 1, /**< host store, streamed through 3 staging slots per step */
    SHARDOPT_OFFLOAD_CPU = 2,       /**< host store, elementwise work on the host; only the
                                         Newton-Schulz input and output cross to the device */
} shardopt_offload_t;

/** The arithmetic of Newton-Schulz. */
typedef enum shardopt_ns_compute {
    SHARDOPT_NS_COMPUTE_AUTO = 0, /**< bf16 where the CPU has native bf16 dot products, else fp32 */
    SHARDOPT_NS_COMPUTE_FP32 = 1, /**< fp32 products (OpenBLAS) */
    SHARDOPT_NS_COMPUTE_BF16 = 2, /**< bf16 operands, fp32 accumulation (oneDNN): dion's recipe */
} shardopt_ns_compute_t;

/** How a matrix sharded over ranks is orthogonalized. */
typedef enum shardopt_ns_strategy {
    SHARDOPT_NS_STRATEGY_GATHER = 0,  /**< whole to one owner and back (bitwise layout-invariant) */
    SHARDOPT_NS_STRATEGY_SHARDED = 1, /**< columns stay; the Gram matrix is all-reduced per step */
    SHARDOPT_NS_STRATEGY_AUTO = 2,    /**< per parameter, by a cost model */
} shardopt_ns_strategy_t;

#define SHARDOPT_NS_MAX_STEPS 16
#define SHARDOPT_PATTERNS_MAX 256

#define SHARDOPT_CONFIG_VERSION 2

/** Runtime configuration. Initialise with SHARDOPT_CONFIG_INIT, then change fields. Fields may
 *  be appended in later versions; the library reads only the first `size` bytes. Every field but
 *  apply_env has a key of the same name in JSON config files and an env var SHARDOPT_<NAME in
 *  upper case>, which shardopt_init applies on top of the struct (apply_env). */
typedef struct shardopt_config {
    size_t size;      /**< sizeof(shardopt_config_t) as the caller compiled it */
    uint32_t version; /**< SHARDOPT_CONFIG_VERSION */

    /* Muon */
    double momentum;                /**< mu, in [0, 1). Default 0.95 */
    int nesterov;                   /**< 0 or 1. Default 0 */
    double weight_decay;            /**< decoupled, uses the unscaled lr. Default 0.01 */
    shardopt_ns_coeffs_t ns_coeffs; /**< default quintic */
    int ns_steps;                   /**< default 5; 1-16 (polar_express: 5-8) */
    double ns_eps;                  /**< default 1e-8 */
    double ns_norm_scale;           /**< s in U / (|U|_F * s + eps); 0 = table default */
    double ns_custom_coeffs[SHARDOPT_NS_MAX_STEPS][3]; /**< (a, b, c) per step, for custom */
    shardopt_lr_scale_t lr_scale;                      /**< default rms_norm */

    /* AdamW */
    double adamw_beta1;        /**< default 0.9 */
    double adamw_beta2;        /**< default 0.95 */
    double adamw_eps;          /**< default 1e-8 */
    double adamw_weight_decay; /**< default 0.01 */
    /** Comma-separated name patterns sent to AdamW under algo auto: an entry matches a name that
     *  contains it, or, written `=name`, a name equal to it. */
    char adamw_patterns[SHARDOPT_PATTERNS_MAX];

    /* Storage and rounding */
    shardopt_dtype_t momentum_dtype;       /**< Muon momentum: fp32 (default) or bf16 */
    shardopt_rounding_t momentum_rounding; /**< rounding into bf16 optimizer state (all kinds) */
    shardopt_dtype_t comm_dtype;           /**< Newton-Schulz input/output: bf16 (default) */
    shardopt_rounding_t param_rounding;    /**< bf16 parameters: default nearest */
    uint64_t seed;                         /**< stochastic rounding key. Default 0 */

    /* Execution */
    shardopt_backend_t backend; /**< default cpu */
    shardopt_kernels_t kernels; /**< default auto */
    int num_threads;            /**< CPU threads for kernels and BLAS; 0 = leave as set */

    /* Layout: ranks row-major over [dp_replicate, dp_shard, cp] */
    int dp_replicate; /**< replicas holding identical shards. Default 1 */
    int dp_shard;     /**< -1 (default): the rest of the ranks */
    int cp;           /**< context-parallel size. Default 1 */
    /** expert-parallel size, default 1; divides dp_shard*cp, and cp divides it when > 1 */
    int ep;

    /** a NaN/Inf gradient anywhere: skip the step (default), fail it, or step with those
     *  elements as 0 (zero) */
    shardopt_nonfinite_t nonfinite;
    /** Muon matrices per exchange bucket, in comm-dtype bytes; default 128 MiB, 0 = one matrix
     *  per bucket */
    uint64_t bucket_bytes;
    int replica_split; /**< 1: replicas split the Newton-Schulz work and all-gather it */
    shardopt_ns_strategy_t ns_strategy; /**< gather (default), sharded, or auto (cost model) */
    /** the cost model's GEMM rate per rank, GFLOP/s (auto's, the plans commit chooses by);
     *  0 (default): 100 where Newton-Schulz runs on the CPU, 632000 on a device */
    double cost_gemm_gflops;
    /** the cost model's bandwidth per rank, GB/s; 0 (default): 25 with Newton-Schulz on the
     *  CPU, 50 on a device */
    double cost_net_gbps;
    shardopt_dtype_t adam_state_dtype; /**< AdamW first moment: fp32 (default) or bf16 */
    shardopt_dtype_t adam_v_dtype;     /**< AdamW second moment: fp32 (default) or bf16 */
    int keep_last;              /**< checkpoints: keep the newest N step directories; 0 = all */
    int load_allow_missing;     /**< load: tensors the checkpoint lacks keep their state */
    shardopt_bind_t bind;       /**< none (default) or auto */
    shardopt_offload_t offload; /**< none (default), optimizer or cpu */
    int debug_poison_staging;   /**< fill staging slots with NaN when released (debug) */
    uint64_t host_store_limit;  /**< offload: most bytes of host store; 0 = no limit */
    shardopt_ns_compute_t ns_compute;     /**< auto (default), fp32 or bf16 */
    shardopt_comm_backend_t comm_backend; /**< CUDA backend: nccl (default) or mpi */
    shardopt_device_t device;             /**< CUDA backend: current (default) or local_rank */
    /** A wait not done in this time: MPI_Abort naming the phase and peers (MPI), ERR_NCCL
     *  (NCCL). 0 = never. */
    double comm_timeout_s;
    /** Every N steps compare a CRC-32C of every parameter shard across the replicate group
     *  (replicated tensors across every rank) after the update; a difference fails that step
     *  with SHARDOPT_ERR_MISMATCH on every rank, naming the first parameter. 0 = never. */
    int replica_check_every;
    /** Every N steps, before the update, check that every parameter shard and its optimizer
     *  state (momentum; exp_avg, exp_avg_sq) hold no NaN/Inf; if one does, the step fails with
     *  SHARDOPT_ERR_NONFINITE on every rank, naming them, and nothing is written. 0 = never. */
    int check_state_every;

    /* Version 2 */
    /** 1 (SHARDOPT_CONFIG_INIT): shardopt_init and shardopt_init_from_groups overlay the
     *  SHARDOPT_<KEY> environment variables on this config, as shardopt_config_from_env does
     *  (the environment wins over the struct; an invalid value fails init on every rank).
     *  0: the environment is not read, and a config key's variable that is set is reported as
     *  ignored. Configs from shardopt_config_init (language bindings) and from a version-1 header
     *  hold 0. Not a config key. */
    int apply_env;
    /** 1: weight decay applies to 1-D tensors (norms, biases) too. 0 (default): it does not,
     *  the usual convention (a norm weight at 1.0 would otherwise shrink with no gradient). */
    int weight_decay_1d;
    /** 1: each step keeps what shardopt_param_get_stats reports beyond the gradient norm (the
     *  RMS of each parameter's update): a copy of this rank's shards before the update (their
     *  bytes, allocated at commit) and one all-reduce of a double per parameter per step. 0
     *  (default): nothing is kept. */
    int param_stats;
    /** 1: shardopt_save also writes every registered parameter (tensors named as the parameters,
     *  in their registered dtype, in the same rank files) and shardopt_load reshards them into
     *  the registered data pointers, all-or-nothing with the state (a checkpoint without
     *  weights is then refused). 0 (default): optimizer state only; a load ignores weights a
     *  checkpoint holds. */
    int ckpt_weights;
    /* Newton-Schulz arithmetic: appended, 0 = the behaviour before them */
    shardopt_ns_algorithm_t ns_algorithm;       /**< standard (default), gram or auto */
    shardopt_ns_precondition_t ns_precondition; /**< frobenius (default) or aol */
    /* Joint Newton-Schulz planning: appended, 0 = the behaviour before it */
    /** 1: a Muon expert matrix held whole by one member of an expert shard group may be
     *  orthogonalized by another member when the cost model (cost_gemm_gflops, cost_net_gbps)
     *  says moving it there and back finishes sooner than keeping it (a group with more members
     *  than its EP rank has experts leaves members idle otherwise). 0 (default): its holder
     *  keeps it. Owners only: the update is the same bits either way. */
    int expert_moves;
    /** Newton-Schulz teams: a Muon matrix of the dense group or of an expert shard group that no
     *  rank of its group holds whole and whose cost is over ns_team_frac x a rank's mean share
     *  may be orthogonalized by a team of up to ns_team_cap ranks (a power of two, at most 64,
     *  inside one node) when the cost model says it pays (an expert shard group chooses its cap
     *  for the group as a whole): each gathers a block of the matrix's long side and the team
     *  runs sharded Newton-Schulz over its members, in fp32, or in bf16 where ns_compute resolves
     *  to bf16, wherever Newton-Schulz runs (CPU or device). Results agree with one owner to
     *  rounding, not bitwise. 1 (default): one owner per matrix, as before. Ignored (a warning)
     *  with replica_split and dp_replicate > 1. */
    int ns_team_cap;
    double ns_team_frac; /**< in (0, 1]; default 0.5 */
} shardopt_config_t;

/* Embeddings (torchtitan's tok_embeddings, HF's embed_tokens; nanoGPT's wte and wpe) and output
 * heads go to AdamW under algo auto; "=name" is an exact match, so a layer's attn.output.weight
 * stays Muon. */
#define SHARDOPT_DEFAULT_ADAMW_PATTERNS "embed,lm_head,=output.weight,wte.,wpe."

/** Defaults that match the dion Muon prime-rl trains with. */
#define SHARDOPT_CONFIG_INIT                                                                       \
    {                                                                                              \
        .size = sizeof(shardopt_config_t), .version = SHARDOPT_CONFIG_VERSION, .momentum = 0.95,   \
        .nesterov = 0, .weight_decay = 0.01, .ns_coeffs = SHARDOPT_NS_QUINTIC, .ns_steps = 5,      \
        .ns_eps = 1e-8, .ns_norm_scale = 0.0, .ns_custom_coeffs = {{0}},                           \
        .lr_scale = SHARDOPT_LR_SCALE_RMS_NORM, .adamw_beta1 = 0.9, .adamw_beta2 = 0.95,           \
        .adamw_eps = 1e-8, .adamw_weight_decay = 0.01,                                             \
        .adamw_patterns = SHARDOPT_DEFAULT_ADAMW_PATTERNS, .momentum_dtype = SHARDOPT_DTYPE_FP32,  \
        .momentum_rounding = SHARDOPT_ROUNDING_NEAREST, .comm_dtype = SHARDOPT_DTYPE_BF16,         \
        .param_rounding = SHARDOPT_ROUNDING_NEAREST, .seed = 0, .backend = SHARDOPT_BACKEND_CPU,   \
        .kernels = SHARDOPT_KERNELS_AUTO, .num_threads = 0, .dp_replicate = 1, .dp_shard = -1,     \
        .cp = 1, .ep = 1, .nonfinite = SHARDOPT_NONFINITE_SKIP, .bucket_bytes = 128ull << 20,      \
        .replica_split = 0, .ns_strategy = SHARDOPT_NS_STRATEGY_GATHER, .cost_gemm_gflops = 0.0,   \
        .cost_net_gbps = 0.0, .adam_state_dtype = SHARDOPT_DTYPE_FP32,                             \
        .adam_v_dtype = SHARDOPT_DTYPE_FP32, .keep_last = 0, .load_allow_missing = 0,              \
        .bind = SHARDOPT_BIND_NONE, .offload = SHARDOPT_OFFLOAD_NONE, .debug_poison_staging = 0,   \
        .host_store_limit = 0, .ns_compute = SHARDOPT_NS_COMPUTE_AUTO,                             \
        .comm_backend = SHARDOPT_COMM_NCCL, .device = SHARDOPT_DEVICE_CURRENT,                     \
        .comm_timeout_s = 600.0, .apply_env = 1, .weight_decay_1d = 0, .param_stats = 0,           \
        .ckpt_weights = 0, .ns_team_cap = 1, .ns_team_frac = 0.5,                                  \
    }

#define SHARDOPT_PARAM_DESC_VERSION 1

/** One parameter shard as this rank holds it. */
typedef struct shardopt_param_desc {
    size_t size;      /**< sizeof(shardopt_param_desc_t) */
    uint32_t version; /**< SHARDOPT_PARAM_DESC_VERSION */
    const char *name; /**< unique; copied */
    int ndim;         /**< 1, 2 or 3 ([E, out, in] expert stack) */
    int64_t shape[3]; /**< global shape, as stored */
    shardopt_dtype_t param_dtype;
    shardopt_dtype_t grad_dtype;
    /** The matrix is stored [in, out] (some grouped-GEMM expert layouts): scaling and
     *  Newton-Schulz use its true [out, in] shape. */
    int transposed;
    shardopt_placement_t placement;
    int shard_dim;        /**< the dim this rank holds a slice of */
    int64_t shard_offset; /**< start of the slice along shard_dim */
    int64_t shard_length; /**< length of the slice; -1 = the whole dim */
    void *data;           /**< parameter shard, row-major; caller-owned */
    const void *grad;     /**< gradient shard, same layout; may be NULL until the first step */
    shardopt_algo_t algo;
    double lr_mult; /**< lr_eff = lr * lr_mult. Default 1 */
    double wd_mult; /**< wd_eff = wd * wd_mult. Default 1 */
} shardopt_param_desc_t;

#define SHARDOPT_PARAM_DESC_INIT                                                                   \
    {                                                                                              \
        .size = sizeof(shardopt_param_desc_t), .version = SHARDOPT_PARAM_DESC_VERSION,             \
        .name = NULL, .ndim = 0, .shape = {0, 0, 0}, .param_dtype = SHARDOPT_DTYPE_FP32,           \
        .grad_dtype = SHARDOPT_DTYPE_FP32, .transposed = 0, .placement = SHARDOPT_PLACEMENT_DENSE, \
        .shard_dim = 0, .shard_offset = 0, .shard_length = -1, .data = NULL, .grad = NULL,         \
        .algo = SHARDOPT_ALGO_AUTO, .lr_mult = 1.0, .wd_mult = 1.0,                                \
    }

#define SHARDOPT_STEP_ARGS_VERSION 4

typedef struct shardopt_step_args {
    size_t size;
    uint32_t version;
    double lr;            /**< learning rate, in [0, 1e6]; set it every step
                               (SHARDOPT_STEP_ARGS_INIT leaves SHARDOPT_LR_UNSET, which the step
                               refuses) */
    double adamw_lr;      /**< finite < 0: use lr for AdamW tensors too (default); else [0, 1e6] */
    double weight_decay;  /**< finite < 0: the config's (default); [0, 1e6]: this value for both
                               algos */
    void *stream;         /**< CUDA backend: the trainer's stream; ignored on the CPU */
    double max_grad_norm; /**< > 0: clip the global gradient norm to this (scale folded into
                               the kernels); <= 0 (default): no clipping */

    /* Version 2 */
    /** 1: a parameter whose grad pointer is NULL on every rank that holds elements of it is
     *  skipped exactly, as torch.optim skips a parameter whose .grad is None: its values, its
     *  optimizer state and its step count stay as they are, and it is left out of the gradient
     *  norm (clipping) and the NaN/Inf check. NULL on some of those ranks but not on others
     *  fails the step on every rank with SHARDOPT_ERR_MISMATCH naming the parameter and a rank
     *  without a gradient, nothing written. Costs one all-reduce of 2 ints per parameter. Must
     *  be the same on every rank, as every argument. 0 (default): a NULL grad pointer fails the
     *  step (SHARDOPT_ERR_INVALID_ARGUMENT). */
    int skip_missing_grads;

    /* Version 3 */
    /** Muon's momentum mu for this step, in [0, 1): a warmup or a scheduler's cycle written
     *  every step (modded-nanogpt's 0.85 -> 0.95) takes effect at once, M = mu M + g with this
     *  mu (and Nesterov's g + mu M). < 0 (default): the config's momentum. Must be the same on
     *  every rank, as every argument. */
    double momentum;

    /* Version 4 */
    /** AdamW's beta1, beta2 and eps for this step, as torch.optim.AdamW reads its group's betas
     *  and eps at every step (OneCycleLR / CyclicLR with cycle_momentum cycle beta1): the
     *  moments take this step's betas (m = beta1 m + (1 - beta1) g, v likewise) and so does
     *  the bias correction, 1 - beta^t with t this tensor's step count, exactly as torch's.
     *  < 0 (default): the config's adamw_beta1 / adamw_beta2 / adamw_eps. Otherwise betas in
     *  [0, 1) and eps in (0, 1], the config's ranges; the same on every rank, as every
     *  argument. */
    double adamw_beta1;
    double adamw_beta2;
    double adamw_eps;
} shardopt_step_args_t;

/** args.lr as SHARDOPT_STEP_ARGS_INIT leaves it: not a learning rate, refused by the step (a
 *  forgotten lr of 0 would give successful steps that change nothing). */
#define SHARDOPT_LR_UNSET (-1.0)

#define SHARDOPT_STEP_ARGS_INIT                                                                    \
    {                                                                                              \
        .size = sizeof(shardopt_step_args_t), .version = SHARDOPT_STEP_ARGS_VERSION,               \
        .lr = SHARDOPT_LR_UNSET, .adamw_lr = -1.0, .weight_decay = -1.0, .stream = NULL,           \
        .max_grad_norm = 0.0, .skip_missing_grads = 0, .momentum = -1.0, .adamw_beta1 = -1.0,      \
        .adamw_beta2 = -1.0, .adamw_eps = -1.0,                                                    \
    }

#define SHARDOPT_STATS_VERSION 5

/** Counters. Times are seconds of this rank; *_last fields describe the last step. */
typedef struct shardopt_stats {
    size_t size;
    uint32_t version;
    uint64_t steps;           /**< steps taken */
    int num_params;           /**< registered */
    int num_muon;             /**< of which Muon */
    int num_adamw;            /**< of which AdamW */
    int64_t muon_matrices;    /**< matrices this rank orthogonalizes per step (experts count
                                   one each; a Newton-Schulz team's matrix on its lead only);
                                   the job's total is the sum over the ranks of one replica
                                   (with replica_split, the replicas share them) */
    int64_t ns_symmetric;     /**< of which use the symmetric Newton-Schulz variant */
    uint64_t bytes_momentum;  /**< Muon momentum state */
    uint64_t bytes_adam_m;    /**< AdamW first moment */
    uint64_t bytes_adam_v;    /**< AdamW second moment */
    uint64_t bytes_workspace; /**< buffers allocated at commit for the step */
    double ns_flops_last;     /**< Newton-Schulz FLOPs this rank performed: 4m^2n + 2m^3 per
                                   standard iteration (m <= n), 2 FLOPs per multiply-add; a
                                   product whose result is symmetric counted at the entries the
                                   kernel forms (its upper block triangle) */
    double seconds_last;      /**< wall time of the last step */
    double seconds_total;
    double seconds_adamw_last;
    double seconds_momentum_last;
    double seconds_ns_last;
    double seconds_apply_last;
    char kernels[32]; /**< name of the kernel table in use */

    /* Where this rank sits in the layout */
    int rank, world;           /**< replica * dense_size + dense_rank; all ranks */
    int replica, dp_replicate; /**< rank in the replicate group, and its size */
    int dense_rank, dense_size;
    int ep_rank, ep_size;
    int expert_shard_rank, expert_shard_size;

    /* The last step's gradient pre-pass and traffic */
    double grad_norm_last;      /**< global gradient norm (NaN when the step was skipped) */
    uint64_t steps_skipped;     /**< steps skipped for NaN/Inf gradients */
    int last_step_skipped;      /**< 1 when the last call skipped */
    char nonfinite_params[256]; /**< the tensors that made the last step skip or fail */
    uint64_t bytes_sent_dense, bytes_recv_dense;   /**< to/from other ranks, dense shard group */
    uint64_t bytes_sent_expert, bytes_recv_expert; /**< expert shard group */
    double seconds_prepass_last, seconds_exchange1_last, seconds_exchange2_last;
    int64_t ns_sharded_matrices; /**< matrices orthogonalized sharded (this rank takes part) */
    double seconds_ns_sharded_last;

    /* Offload: the last step's host <-> device traffic, counted at the copy op */
    int offload;                                     /**< the shardopt_offload_t in use */
    uint64_t bytes_host_store;                       /**< optimizer state kept in host memory */
    uint64_t bytes_h2d_momentum, bytes_d2h_momentum; /**< offload = optimizer */
    uint64_t bytes_h2d_adam_m, bytes_d2h_adam_m;
    uint64_t bytes_h2d_adam_v, bytes_d2h_adam_v;
    uint64_t bytes_h2d_ns, bytes_d2h_ns; /**< offload = cpu: Newton-Schulz input U, output O */
    uint64_t staging_slot_bytes;         /**< each of the three staging slots */
    uint64_t staging_peak_bytes_last;    /**< most bytes held in staging at once */
    double seconds_copy_exposed_last;    /**< copy time the step waited for (CUDA: the stream's
                                              waits on the copy streams, timed with events) */
    double seconds_copy_hidden_last;     /**< copy time not waited for: 0 on the CPU backend
                                              (synchronous memcpy); CUDA: the copy streams' time
                                              minus exposed */
    int ns_compute;                      /**< the resolved shardopt_ns_compute_t: FP32 or BF16 */
    uint64_t nonfinite_elements_last;    /**< nonfinite = zero: elements treated as 0 in the last
                                              step, over all ranks of this replica; 0 when that
                                              step was skipped */

    /* Version 2 */
    int phases_current; /**< 1: the seconds_*_last phase and copy times describe the last step;
                             0: the step before it, because a device (a step given a stream)
                             has not finished the last one: get_stats never waits for it */

    /* Version 3 */
    uint64_t bytes_ns_allreduce_last; /**< the last step's Gram all-reduces of sharded and team
                                           Newton-Schulz, as bytes a ring all-reduce sends from
                                           this rank: 2(k-1)/k m^2 elements per iteration over k
                                           members, fp32 (bf16 in bf16 teams; the MPI library's
                                           own traffic is not seen); not in bytes_sent_dense */

    /* Version 4: the last shardopt_load that succeeded on this runtime (0 before one) */
    int64_t load_kept_tensors;  /**< registered tensors (state, or weights with ckpt_weights) the
                                     checkpoint lacked, kept as they were (load_allow_missing) */
    int64_t load_unused_params; /**< parameters of the checkpoint no registered one matched (not
                                     loaded: a renamed parameter shows in both counts) */

    /* Version 5 */
    uint64_t ns_gram_fallbacks; /**< Newton-Schulz results (not only Gram ones, despite the
                                     name) of matrices this rank orthogonalized whole that the
                                     result guard refused (non-finite, or a norm past what the
                                     table can output) and recomputed, over all steps: Gram
                                     results recomputed with the standard algorithm, and bf16
                                     standard results recomputed in fp32 (CPU tables). A team's
                                     recompute is not counted here (its first rank warns) */
} shardopt_stats_t;

#define SHARDOPT_STATS_INIT                                                                        \
    {                                                                                              \
        .size = sizeof(shardopt_stats_t), .version = SHARDOPT_STATS_VERSION                        \
    }

#define SHARDOPT_PARAM_STATS_VERSION 1

/** One parameter's view of the last step (shardopt_param_get_stats). */
typedef struct shardopt_param_stats {
    size_t size;          /**< sizeof(shardopt_param_stats_t) */
    uint32_t version;     /**< SHARDOPT_PARAM_STATS_VERSION */
    double grad_norm;     /**< L2 norm of the whole gradient over all ranks, before clipping (the
                               step's pre-pass computes it anyway); NaN before the first step and
                               after a skipped one */
    double update_rms;    /**< RMS over the whole tensor of the last step's change of the
                               parameter (lr and weight decay included); NaN unless param_stats =
                               1 and the parameters are host memory (CPU backend, offload = cpu) */
    int ns_owner_rank;    /**< Muon gathered whole: the runtime rank that orthogonalizes the matrix
                               (an expert stack: its EP rank's first expert; a Newton-Schulz
                               team: its lead, the team's lowest rank); -1 for AdamW and for
                               matrices orthogonalized sharded (every member takes part) */
    int ns_matrices_here; /**< matrices of this parameter this rank orthogonalizes per step (a
                               team's: on its lead) */
} shardopt_param_stats_t;

#define SHARDOPT_PARAM_STATS_INIT                                                                  \
    {                                                                                              \
        .size = sizeof(shardopt_param_stats_t), .version = SHARDOPT_PARAM_STATS_VERSION            \
    }

#define SHARDOPT_GROUPS_VERSION 1

/** Communicators a trainer already built, for shardopt_init_from_groups. MPI_COMM_NULL where
 *  absent: no EP (ep = 1), no expert shard group (derived from the dense and EP groups), no
 *  replicas (dp_replicate = 1). The dense shard group is required. */
typedef struct shardopt_groups {
    size_t size;
    uint32_t version;
    MPI_Comm dense_shard;  /**< the dp_shard x cp ranks of one replica */
    MPI_Comm expert_shard; /**< ranks holding the same experts */
    MPI_Comm ep;           /**< ranks holding different experts */
    MPI_Comm replicate;    /**< ranks holding identical shards */
} shardopt_groups_t;

#define SHARDOPT_GROUPS_INIT                                                                       \
    {                                                                                              \
        .size = sizeof(shardopt_groups_t), .version = SHARDOPT_GROUPS_VERSION,                     \
        .dense_shard = MPI_COMM_NULL, .expert_shard = MPI_COMM_NULL, .ep = MPI_COMM_NULL,          \
        .replicate = MPI_COMM_NULL,                                                                \
    }

typedef struct shardopt_runtime *shardopt_runtime_t;
typedef struct shardopt_param *shardopt_param_t;

/** Library version. Any pointer may be NULL. */
SHARDOPT_API shardopt_status_t shardopt_get_version(int *major, int *minor, int *patch);

/** Static names of enum values, as config keys spell them ("bf16", "muon", "expert", "cpu");
 *  "unknown" for a value outside the enum; never NULL. For printing stats fields (offload,
 *  ns_compute) and shardopt_param_get_algo's result. */
SHARDOPT_API const char *shardopt_dtype_name(shardopt_dtype_t v);
SHARDOPT_API const char *shardopt_algo_name(shardopt_algo_t v);
SHARDOPT_API const char *shardopt_placement_name(shardopt_placement_t v);
SHARDOPT_API const char *shardopt_offload_name(shardopt_offload_t v);
SHARDOPT_API const char *shardopt_ns_compute_name(shardopt_ns_compute_t v);
SHARDOPT_API const char *shardopt_backend_name(shardopt_backend_t v);

/** Overlay SHARDOPT_<KEY> environment variables onto cfg. An invalid value is an error naming
 *  the variable and what is accepted; cfg is then unchanged. shardopt_init does the same itself
 *  when cfg->apply_env is 1 (SHARDOPT_CONFIG_INIT): call this to see or print the result
 *  before init. */
SHARDOPT_API shardopt_status_t shardopt_config_from_env(shardopt_config_t *cfg);

/** The defaults of SHARDOPT_CONFIG_INIT written into cfg, a buffer of `size` bytes, for callers
 *  that cannot use the macro (language bindings): at most sizeof(shardopt_config_t) bytes are
 *  written, and cfg->size says how many. One difference: apply_env is 0, since a binding builds
 *  its config from its own arguments (set the field to 1 to have init read the environment). */
SHARDOPT_API shardopt_status_t shardopt_config_init(shardopt_config_t *cfg, size_t size);

/** Set one key from text, exactly as its env var SHARDOPT_<KEY> would ("momentum", "0.9");
 *  an unknown key or a value outside what is accepted leaves cfg unchanged and the error names
 *  the key, the value and what is accepted. */
SHARDOPT_API shardopt_status_t shardopt_config_set(shardopt_config_t *cfg, const char *key,
                                                   const char *value);

/** Overlay the keys of a JSON object file onto cfg. Unknown keys, wrong types and invalid values
 *  are errors naming the key; cfg is then unchanged. */
SHARDOPT_API shardopt_status_t shardopt_config_load_json(const char *path, shardopt_config_t *cfg);

/** Check every field; the error message names the field, the value and what is accepted. */
SHARDOPT_API shardopt_status_t shardopt_config_validate(const shardopt_config_t *cfg);

/** Write every key and value, one per line, to stream (stdout when NULL). */
SHARDOPT_API shardopt_status_t shardopt_config_print(const shardopt_config_t *cfg, FILE *stream);

/** Create a runtime over comm (collective): the ranks of one pipeline stage, in mesh order.
 *  The groups come from cfg's layout (dp_replicate, dp_shard, cp, ep); an invalid layout fails
 *  on every rank with the numbers in the message.
 *  @param rt_p receives the handle (set only on success) */
SHARDOPT_API shardopt_status_t shardopt_init(MPI_Comm comm, const shardopt_config_t *cfg,
                                             shardopt_runtime_t *rt_p);

/** Create a runtime over communicators the trainer built (collective over all of them). They are
 *  duplicated and checked for consistency first (sizes multiply, every rank agrees on its
 *  memberships); cfg's layout fields are ignored. */
SHARDOPT_API shardopt_status_t shardopt_init_from_groups(const shardopt_groups_t *groups,
                                                         const shardopt_config_t *cfg,
                                                         shardopt_runtime_t *rt_p);

/** Each rank's coordinates and group ranks, one line per rank in rank order, written by rank 0
 *  to stream (stdout when NULL). Collective. */
SHARDOPT_API shardopt_status_t shardopt_layout_print(shardopt_runtime_t rt, FILE *stream);

/** Register one parameter shard, before commit. Not collective; call on every rank in the same
 *  order. desc->name is copied; data and grad stay owned by the caller.
 *  @param param_p receives the handle (set only on success); valid until shardopt_finalize */
SHARDOPT_API shardopt_status_t shardopt_register(shardopt_runtime_t rt,
                                                 const shardopt_param_desc_t *desc,
                                                 shardopt_param_t *param_p);

/** Record that the caller (a language binding) refused parameter `name` itself, for `reason`
 *  (e.g. an fp16 buffer). Not collective; like a failed shardopt_register, it returns
 *  SHARDOPT_ERR_INVALID_ARGUMENT and each later shardopt_commit of this runtime fails with
 *  SHARDOPT_ERR_MISMATCH on every rank, naming the parameter and the reason. */
SHARDOPT_API shardopt_status_t shardopt_register_refused(shardopt_runtime_t rt, const char *name,
                                                         const char *reason);

/** This rank's slice of a parameter under the runtime's layout, as shardopt_register expects it:
 *  reads desc's ndim, shape, placement and shard_dim (nothing else) and gives the slice along
 *  shard_dim in torch.chunk order (ceil-sized chunks, the last ones short or empty: FSDP2's
 *  Shard(dim)). DENSE: chunk `dense_rank` of the dim over the dense shard group; EXPERT: this EP
 *  rank's E/ep experts (along dim 0), or the whole dim, in chunks over the expert shard group;
 *  REPLICATED: the whole dim. Not collective; call any time after init.
 *  @param offset receives the slice's start as shardopt_register takes it: for an EXPERT stack
 *         sharded along dim 0 it counts from this EP rank's first expert
 *  @param length receives its length (0: this rank holds none of it)
 *  @param global_offset may be NULL; receives the start in the global tensor (for an expert
 *         stack along dim 0, the EP rank's first expert plus offset) */
SHARDOPT_API shardopt_status_t shardopt_shard_range(shardopt_runtime_t rt,
                                                    const shardopt_param_desc_t *desc,
                                                    int64_t *offset, int64_t *length,
                                                    int64_t *global_offset);

/** Re-point a parameter at new data and gradient buffers of the same layout (trainers such as
 *  FSDP2 hand over new gradient tensors every step). Takes effect at the next step. */
SHARDOPT_API shardopt_status_t shardopt_param_set_pointers(shardopt_param_t param, void *data,
                                                           const void *grad);

/** shardopt_param_set_pointers for n parameters of rt in one call (a binding hands over every
 *  parameter's new gradient each step): entry i re-points params[i] at data[i] and grad[i].
 *  Every entry is checked first (as shardopt_param_set_pointers checks one, and each parameter
 *  of rt, given once); on a refusal the message names the entry and its parameter, and no
 *  pointer has changed.
 *  @param grad may be NULL: every listed parameter's gradient becomes NULL (zero_grad) */
SHARDOPT_API shardopt_status_t shardopt_params_set_pointers(shardopt_runtime_t rt, int n,
                                                            const shardopt_param_t *params,
                                                            void *const *data,
                                                            const void *const *grad);

/** The algorithm a parameter was given (AUTO resolved). */
SHARDOPT_API shardopt_status_t shardopt_param_get_algo(shardopt_param_t param,
                                                       shardopt_algo_t *algo);

/** Freeze the parameter set, allocate optimizer state (zeroed) and step buffers. Collective. */
SHARDOPT_API shardopt_status_t shardopt_commit(shardopt_runtime_t rt);

/** One optimizer step over every registered parameter. Collective. Allocates nothing. When it
 *  fails on validation (e.g. a NULL gradient) no parameter or state has been written. Every rank
 *  must pass the same arguments (stream aside) and hold the same step counts: one that differs
 *  fails the step on every rank with SHARDOPT_ERR_MISMATCH naming it, nothing written. */
SHARDOPT_API shardopt_status_t shardopt_step(shardopt_runtime_t rt,
                                             const shardopt_step_args_t *args);

/** Copy counters into stats (stats->size set by the caller, e.g. SHARDOPT_STATS_INIT). */
SHARDOPT_API shardopt_status_t shardopt_get_stats(shardopt_runtime_t rt, shardopt_stats_t *stats);

/** One parameter's gradient norm, update RMS and Newton-Schulz owner for the last step. Not
 *  collective; reads what the step kept (costs nothing unless param_stats asks the step to
 *  keep the update). Valid after commit. */
SHARDOPT_API shardopt_status_t shardopt_param_get_stats(shardopt_param_t param,
                                                        shardopt_param_stats_t *stats);

/** The optimizer state tensors of a parameter: Muon has momentum, AdamW exp_avg and
 *  exp_avg_sq (a checkpoint names them <param>.momentum, <param>.exp_avg, <param>.exp_avg_sq). */
typedef enum shardopt_state_kind {
    SHARDOPT_STATE_MOMENTUM = 0,   /**< Muon: M = sum of mu^k g (dtype momentum_dtype) */
    SHARDOPT_STATE_EXP_AVG = 1,    /**< AdamW first moment (adam_state_dtype) */
    SHARDOPT_STATE_EXP_AVG_SQ = 2, /**< AdamW second moment (adam_v_dtype) */
} shardopt_state_kind_t;

/** Static name of a state kind ("momentum", "exp_avg", "exp_avg_sq"; "unknown"). */
SHARDOPT_API const char *shardopt_state_kind_name(shardopt_state_kind_t v);

/** What shardopt_param_get_state / set_state exchange for one state tensor of a parameter: the
 *  dtype it is held in and the number of elements this rank holds (its shard's local_numel:
 *  0 where this rank holds none of the parameter). Either pointer may be NULL. A kind the
 *  parameter's algorithm does not have is SHARDOPT_ERR_INVALID_ARGUMENT naming the kinds it
 *  has. Not collective; valid after commit (SHARDOPT_ERR_STATE before). */
SHARDOPT_API shardopt_status_t shardopt_param_state_info(shardopt_param_t param,
                                                         shardopt_state_kind_t kind,
                                                         shardopt_dtype_t *dtype, int64_t *count);

/** Copy this rank's shard of one state tensor into buf: `count` elements (state_info) in the
 *  parameter's registered local layout (the element order of its data shard), in the dtype the
 *  state is held in, exactly the bytes a save writes for it. dtype must be that dtype and bytes
 *  count times its size: anything else is SHARDOPT_ERR_INVALID_ARGUMENT naming the parameter,
 *  the kind and what is held (convert in the caller), and so is (host state) a buf this
 *  process may not write (a read-only mapping), with buf unchanged. State in device memory or
 *  a host store is copied out after the runtime's queued work. Not collective; after commit. */
SHARDOPT_API shardopt_status_t shardopt_param_get_state(shardopt_param_t param,
                                                        shardopt_state_kind_t kind, void *buf,
                                                        size_t bytes, shardopt_dtype_t dtype);

/** Replace this rank's shard of one state tensor with buf (the layout, dtype and size of
 *  get_state; a different dtype is refused, nothing is converted), for the next step. Not
 *  collective: every rank sets its own shard. Where the runtime holds replicas (dp_replicate >
 *  1) or the parameter is replicated, every copy must be given the same values: the library does
 *  not compare optimizer state across copies (replica_check_every compares parameters, which
 *  then drift). Valid after commit; a refused call changes nothing. */
SHARDOPT_API shardopt_status_t shardopt_param_set_state(shardopt_param_t param,
                                                        shardopt_state_kind_t kind, const void *buf,
                                                        size_t bytes, shardopt_dtype_t dtype);

/** The steps a parameter has taken (AdamW's bias correction t - 1; for both algorithms the key
 *  of stochastic rounding), and its replacement: set the same value on every rank, below 2^53
 *  (what a checkpoint holds exactly). Not collective; valid after commit. */
SHARDOPT_API shardopt_status_t shardopt_param_get_step(shardopt_param_t param, uint64_t *step);
SHARDOPT_API shardopt_status_t shardopt_param_set_step(shardopt_param_t param, uint64_t step);

/** Save the optimizer state (collective), and the registered parameters too with ckpt_weights,
 *  as DIR/step-NNNNNNNN/ (one safetensors file per rank of replica 0, index.json and its
 *  CRC-32C record), written under a temporary name, fsynced and renamed, with one writer per
 *  directory (a lock on DIR/.lock); then DIR/latest names it (atomic replace) and steps beyond
 *  keep_last are pruned. On any failure every rank returns the error and the previous checkpoint
 *  stays as it was. */
SHARDOPT_API shardopt_status_t shardopt_save(shardopt_runtime_t rt, const char *dir);

/** Load optimizer state (collective), and the registered parameters' values too with
 *  ckpt_weights, from DIR (following DIR/latest) or a step directory, on any layout of the same
 *  model: each rank reads the blocks of the shards overlapping its own and checks their CRC32C
 *  (and the index's own record). State is restored in the configured dtypes (converted, with a
 *  warning, where the checkpoint holds another). On any refusal every rank returns the error
 *  and no state or parameter changes anywhere. */
SHARDOPT_API shardopt_status_t shardopt_load(shardopt_runtime_t rt, const char *dir);

/** Free everything the runtime owns. Accepts NULL. Valid in any state, also after an error.
 *  Afterwards rt and its shardopt_param_t handles dangle, as after free: any call with them, a
 *  second finalize included, is undefined and not detected; set the handle to NULL, which
 *  every call refuses and finalize accepts. */
SHARDOPT_API shardopt_status_t shardopt_finalize(shardopt_runtime_t rt);

#ifdef __cplusplus
}
#endif
#endif /* SHARDOPT_H */

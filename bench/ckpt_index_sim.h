/* A simulated world for the checkpoint index (format_version 4): the index.json and every
 * writer's rank-NNNNN.index.json that a save of a preset on `world` ranks would write, synthesized
 * from the layout an FSDP-style trainer gives (bench/preset_shards.h: dense tensors chunked along
 * dim 0 over the dense group, expert stacks split over EP and chunked along expert_dim), and the
 * load's own index code (runtime/checkpoint/checkpoint_index.c: ckpt_index_parse,
 * ckpt_index_select) run for one rank of a loading world against them, without MPI or files: the
 * writers' indexes are synthesized when the load asks for one. What it measures is the memory and
 * time of one rank's index work at any world size (tests/unit/test_ckpt_index_scale.c,
 * bench/ckpt_index_bench.c). */
#ifndef BENCH_CKPT_INDEX_SIM_H
#define BENCH_CKPT_INDEX_SIM_H

#include <stddef.h>
#include <stdint.h>

#include "bench/preset.h"
#include "shardopt.h"

/* A world: the preset on `world` ranks (one replica), `ep` dividing world. */
struct ckpt_sim {
    const struct preset *p;
    int world, ep, expert_dim;
};

/* What one rank's index load took. */
struct ckpt_sim_result {
    size_t heap_peak;   /* bytes of heap in use at most during the load, above what was before */
    size_t heap_kept;   /* ... and still in use once the index is ready (the records kept) */
    int writers_read;   /* writers' indexes read */
    int writers_needed; /* writers whose parts overlap the rank's (counted by brute force here) */
    int64_t shards;     /* shard records kept */
    int64_t records;    /* shard records in the whole saved world (what a version-3 index held) */
    double seconds;     /* wall time of the load's index work (the harness does not judge it) */
};

/* Load, on rank `rank` of `loading`, the index of a checkpoint saved by `saved` (the same preset):
 * index.json parsed, then the writers' indexes that rank's parts need, every record checked.
 * SHARDOPT_OK, or the index code's refusal (log_fail's message). */
shardopt_status_t ckpt_sim_load_rank(const struct ckpt_sim *saved, const struct ckpt_sim *loading,
                                     int rank, struct ckpt_sim_result *out);

/* The same for a checkpoint of format_version 2 (what saves wrote before 4): index.json holding
 * every writer's records, parsed whole (the parse every rank made, and rank 0's text at save).
 * A contrast for the harness: its memory grows with the world. */
shardopt_status_t ckpt_sim_load_v2(const struct ckpt_sim *saved, struct ckpt_sim_result *out);

#endif

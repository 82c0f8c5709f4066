/* A simulated world for the checkpoint index (format_version 4): the index.json and every
 * writer's rank-NNNNN.index.json that a save of a preset on `world` ranks would write, synthesized
 * from the layout an FSDP-style trainer gives (bench/preset_shards.h: dense tensors chunked along
 * dim 0 over the dense group, expert stacks split over EP and chunked along expert_dim), and the
 * load's own index code (runtime/checkpoint/checkpoint_index.c: ckpt_index_parse,
 * ckpt_index_select) run for one rank of a loading world against them, without MPI or files: the
 * writers' indexes are synthesized when the load asks for one. What it measures is the memory and
 * time of one rank's index work at any world size, and (ckpt_sim_save) what a save's writers and
 * rank 0 spend on the index (tests/unit/test_ckpt_index_scale.c,
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

/* What a save of the preset on s->world ranks spends on the index: three sampled writers (0,
 * W/2 + 1, W - 1) each collect their records as their rank file's writing does and write their
 * rank-NNNNN.index.json with the runtime's own code (ckpt_writer_index_write); then rank 0 does
 * what the save does there (ckpt_save_publish: the 16 bytes a writer of the sizes gather, each
 * writer's two files checked in the temporary directory, index.json built, printed and written,
 * the directory renamed, latest written). Real files, under `scratch` (created, then removed:
 * it must not exist), the other writers' files empty; no rank file data, no MPI. */
struct ckpt_sim_save_result {
    size_t rank0_heap;      /* rank 0's heap peak above what was before: sizes, tree, text */
    size_t writer_heap;     /* the most of the sampled writers': records, tree, text */
    int64_t writer_records; /* the most records a sampled writer wrote */
    int64_t writer_bytes;   /* ... and the largest rank-NNNNN.index.json */
    int64_t index_bytes;    /* index.json */
    double rank0_seconds, writer_seconds; /* wall time (the harness does not judge it) */
};
shardopt_status_t ckpt_sim_save(const struct ckpt_sim *s, const char *scratch,
                                struct ckpt_sim_save_result *out);

#endif

/* The checkpoint index (format_version 4) in a simulated world (bench/ckpt_index_sim.h): the
 * index.json and the writers' indexes a save of GLM-4.5-Air on 256 and 1,024 ranks writes,
 * synthesized from the layout, and the load's own index code run for sampled ranks against them.
 * A rank's index memory (the heap as glibc counts it: the texts, cJSON's trees, the records kept)
 * must not grow with the world while the records of the whole world grow with it (a version-3
 * index held them all, parsed whole on every rank), and a rank reads a bounded number of writers'
 * indexes: on the layout that saved, writer 0 and its own; loading on fewer ranks, the writers its
 * larger part spans. A save's rank 0 and writers do not grow with the world either. No
 * wall-clock or RSS threshold: bytes and counts. */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "bench/ckpt_index_sim.h"
#include "test.h"

static struct preset glm;

static void glm_load(void)
{
    static int loaded;
    struct preset_scale s = {0, 1, 1};
    char err[256];
    if (!loaded && preset_load("glm45-air", SHARDOPT_PRESET_DIR, &s, &glm, err, sizeof err) != 0)
        fprintf(stderr, "%s\n", err);
    loaded = 1;
}

/* The most any sampled rank of `loading` took to load the index `saved` wrote. */
static void load_sampled(const struct ckpt_sim *saved, const struct ckpt_sim *loading,
                         struct ckpt_sim_result *most)
{
    const int w = loading->world;
    const int ranks[5] = {0, 1, w / 2 + 3, w - 2, w - 1};
    memset(most, 0, sizeof *most);
    for (int i = 0; i < 5; i++) {
        struct ckpt_sim_result r;
        EXPECT_EQ_INT(ckpt_sim_load_rank(saved, loading, ranks[i], &r), SHARDOPT_OK);
        /* the writers that hold some of its parts, and writer 0, which it reads first */
        EXPECT_TRUE(r.writers_read <= r.writers_needed + 1);
        most->heap_peak = r.heap_peak > most->heap_peak ? r.heap_peak : most->heap_peak;
        most->heap_kept = r.heap_kept > most->heap_kept ? r.heap_kept : most->heap_kept;
        most->writers_read =
            r.writers_read > most->writers_read ? r.writers_read : most->writers_read;
        most->shards = r.shards > most->shards ? r.shards : most->shards;
        most->records = r.records;
    }
    printf("  %5d-rank checkpoint on %5d ranks: %lld records in all; a rank read at most %d "
           "writers' indexes, kept %lld records, heap peak %.1f MiB (%.1f MiB kept)\n",
           saved->world, loading->world, (long long)most->records, most->writers_read,
           (long long)most->shards, (double)most->heap_peak / 1048576.0,
           (double)most->heap_kept / 1048576.0);
}

TEST(a_rank_s_index_memory_does_not_grow_with_the_world)
{
    glm_load();
    ASSERT_TRUE(glm.n > 0);
    const struct ckpt_sim w256 = {&glm, 256, 8, 1}, w1024 = {&glm, 1024, 8, 1};
    struct ckpt_sim_result a, b;
    load_sampled(&w256, &w256, &a);
    load_sampled(&w1024, &w1024, &b);
    /* the world's records grow 4x ... */
    EXPECT_TRUE(b.records >= 3 * a.records);
    /* ... a rank's index memory does not (each writer's index holds its own records: as many at
     * any world, their block CRCs fewer as the world grows) */
    EXPECT_TRUE(b.heap_peak <= a.heap_peak + a.heap_peak / 4);
    EXPECT_TRUE(b.heap_kept <= a.heap_kept + a.heap_kept / 4);
    /* on the layout that saved: writer 0 (replicated tensors) and the rank's own */
    EXPECT_TRUE(a.writers_read <= 2 && b.writers_read <= 2);
    /* and the records kept are this rank's: one shard per tensor it holds a part of */
    EXPECT_TRUE(b.shards <= 2 * glm.n);
}

TEST(a_load_on_another_world_reads_only_the_writers_its_parts_span)
{
    glm_load();
    ASSERT_TRUE(glm.n > 0);
    const struct ckpt_sim w256 = {&glm, 256, 8, 1}, w1024 = {&glm, 1024, 8, 1},
                          w1000 = {&glm, 1000, 8, 1};
    struct ckpt_sim_result same, fewer, uneven;
    load_sampled(&w1024, &w1024, &same);
    /* 4 writers' parts in each loading rank's part of a tensor (dense and expert parts lie with
     * different writers): the writers that hold them, no others (load_sampled) */
    load_sampled(&w1024, &w256, &fewer);
    EXPECT_TRUE(fewer.writers_read > 2);
    /* chunks that do not line up with the saved ones */
    load_sampled(&w1024, &w1000, &uneven);
    EXPECT_TRUE(uneven.writers_read > 2);
    /* what a rank keeps grows with its own part (4x the elements: 4 writers' records), not with
     * the saving world */
    EXPECT_TRUE(fewer.heap_peak <= 6 * same.heap_peak);
    EXPECT_TRUE(uneven.heap_peak <= 3 * same.heap_peak);
}

/* The save side (ckpt_sim_save: the runtime's own writer-index and publish code, real files): a
 * writer builds and writes its own records only, and rank 0 builds index.json (O(parameters))
 * and holds 16 bytes per writer (the sizes it checks each writer's files against). Neither may
 * grow with the world: before format_version 4 rank 0 gathered every writer's records into one
 * tree, about 4x the heap at 4x the ranks. */
/* 1 when glibc's counts see a 1 MiB allocation (not under ASan, which replaces malloc) */
static int heap_measured(void)
{
    const size_t before = mallinfo2().uordblks;
    char *volatile p = malloc(1 << 20);
    const size_t after = mallinfo2().uordblks;
    free(p);
    return after >= before + (1u << 20);
}

TEST(a_save_s_rank_0_and_writers_index_memory_does_not_grow_with_the_world)
{
    glm_load();
    ASSERT_TRUE(glm.n > 0);
    const struct ckpt_sim w1024 = {&glm, 1024, 8, 1}, w4096 = {&glm, 4096, 8, 1};
    struct ckpt_sim_save_result a, b;
    /* ckpt_sim_save makes the scratch directory and removes it: inside a fresh one */
    char root[64] = "/tmp/test_ckpt_index_scale_XXXXXX", scratch[96];
    ASSERT_TRUE(mkdtemp(root) != NULL);
    snprintf(scratch, sizeof scratch, "%s/save", root);
    ASSERT_EQ_INT(ckpt_sim_save(&w1024, scratch, &a), SHARDOPT_OK);
    ASSERT_EQ_INT(ckpt_sim_save(&w4096, scratch, &b), SHARDOPT_OK);
    printf("  save: rank 0's heap %.2f MiB at 1,024 ranks, %.2f MiB at 4,096; a writer's %.2f / "
           "%.2f MiB (%lld / %lld records); index.json %lld / %lld bytes\n",
           (double)a.rank0_heap / 1048576.0, (double)b.rank0_heap / 1048576.0,
           (double)a.writer_heap / 1048576.0, (double)b.writer_heap / 1048576.0,
           (long long)a.writer_records, (long long)b.writer_records, (long long)a.index_bytes,
           (long long)b.index_bytes);
    EXPECT_TRUE(a.writer_records > 0);
    /* a sanitizer's allocator leaves glibc's counts at 0: the growth checks below then hold
     * trivially, so only where the heap is measured must it be seen */
    if (heap_measured())
        EXPECT_TRUE(a.rank0_heap > 0 && a.writer_heap > 0);
    EXPECT_TRUE(b.rank0_heap <= a.rank0_heap + a.rank0_heap / 4);
    EXPECT_TRUE(b.writer_heap <= a.writer_heap + a.writer_heap / 4);
    /* index.json holds the parameters alone: the same bytes at any world */
    EXPECT_EQ_INT(b.index_bytes, a.index_bytes);
    rmdir(scratch); /* left only if a save failed */
    EXPECT_EQ_INT(rmdir(root), 0);
}

/* The measure itself sees growth: the same model's index of format_version 2 (every writer's
 * records in index.json, parsed whole: what every rank did before version 4) takes about 4x the
 * heap at 4x the world. GLM-4.5-Air cut to 2 MoE layers, so that the 1,024-rank version-2 index
 * stays small here. */
TEST(the_measure_sees_a_version_2_index_grow_with_the_world)
{
    struct preset small;
    struct preset_scale sc = {2, 1, 1};
    char err[256];
    ASSERT_EQ_INT(preset_load("glm45-air", SHARDOPT_PRESET_DIR, &sc, &small, err, sizeof err), 0);
    const struct ckpt_sim w256 = {&small, 256, 8, 1}, w1024 = {&small, 1024, 8, 1};
    struct ckpt_sim_result a, b, a4, b4;
    EXPECT_EQ_INT(ckpt_sim_load_v2(&w256, &a), SHARDOPT_OK);
    EXPECT_EQ_INT(ckpt_sim_load_v2(&w1024, &b), SHARDOPT_OK);
    load_sampled(&w256, &w256, &a4);
    load_sampled(&w1024, &w1024, &b4);
    printf("  version 2, %d tensors: %.1f MiB on 256 ranks, %.1f MiB on 1,024; version 4: %.2f "
           "MiB, %.2f MiB\n",
           small.n, (double)a.heap_peak / 1048576.0, (double)b.heap_peak / 1048576.0,
           (double)a4.heap_peak / 1048576.0, (double)b4.heap_peak / 1048576.0);
    EXPECT_TRUE(b.heap_peak >= 3 * a.heap_peak);
    EXPECT_TRUE(b4.heap_peak <= a4.heap_peak + a4.heap_peak / 4);
    preset_free(&small);
    preset_free(&glm);
}

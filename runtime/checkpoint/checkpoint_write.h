/* A writer's files in a save's temporary directory (checkpoint_write.c), for checkpoint_save.c.
 * Private to the checkpoint files. */
#ifndef RUNTIME_CHECKPOINT_WRITE_H
#define RUNTIME_CHECKPOINT_WRITE_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/checkpoint/checkpoint.h"

/* One tensor a writer wrote, as its blob holds it (followed by nblocks block CRCs):
 * ckpt_writer_index_write turns the blob into the writer's index. */
struct ckpt_shard_record {
    int32_t param, kind, dtype, pad; /* rt->params[param], its ckpt_tensors kind */
    int64_t lo[3], len[3];
    uint32_t crc, nblocks;
};

/* Append n bytes at p to a growing blob (*len used of *cap): 0, or -1 out of memory. */
int ckpt_blob_add(char **blob, size_t *len, size_t *cap, const void *p, size_t n);

/* This rank's file at path: header, then each tensor's bytes (state, then with ckpt_weights the
 * parameter), CRCs taken as they are written. *blob (*blob_len bytes; the caller frees it): the
 * shard records ckpt_writer_index_write turns into this writer's index; *file_bytes: the file's
 * size. */
shardopt_status_t ckpt_rank_file_write(shardopt_runtime_t rt, const char *path, char **blob,
                                       size_t *blob_len, int64_t *file_bytes);

/* Each writer: its shard records (blob, from ckpt_rank_file_write) as tmp/rank-NNNNN.index.json
 * with its integrity record (format_version 4). *bytes: the file's size. */
shardopt_status_t ckpt_writer_index_write(shardopt_runtime_t rt, const char *tmp, const char *blob,
                                          size_t blob_len, int64_t *bytes);

/* Write `text` as dir/name (tfd open on dir) and its integrity record name.crc32c ("%08x\n", the
 * CRC-32C of its bytes), each fsynced: 0, or -1 with errno set and *failed naming the file
 * (crc_name, crc_len bytes, receives the record's name). */
int ckpt_text_file_put(int tfd, const char *name, const char *text, size_t len, const char **failed,
                       char *crc_name, size_t crc_len);

/* Rank 0, once every writer's files are in tmpname (a directory of dfd, DIR open): checks them
 * against sizes (two per dense rank: its rank file's and its index's), writes index.json (the
 * global facts, O(parameters)) and its record, renames the directory to step_name and replaces
 * latest, then prunes. */
shardopt_status_t ckpt_save_publish(shardopt_runtime_t rt, int dfd, const char *dir,
                                    const char *tmpname, const char *step_name,
                                    const int64_t *sizes);

/* n integers as a JSON array; NULL when out of memory: never an array with elements missing. */
cJSON *ckpt_json_i64_array(const int64_t *v, int n);

#endif

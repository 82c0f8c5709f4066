/* The saved shards as a load reads them (checkpoint_shard_read.c): the files opened so far and
 * the chunk blocks are read through. */
#ifndef RUNTIME_CHECKPOINT_SHARD_READ_H
#define RUNTIME_CHECKPOINT_SHARD_READ_H

#include "runtime/checkpoint/checkpoint_index.h"
#include "runtime/checkpoint/safetensors.h"

struct ck_file {
    const char *name;
    int fd;
    uint64_t size;
    struct st_header hdr;
    int opened;
};

struct ck_reader {
    struct ck_file *files; /* room for every shard's file (the caller allocates it) */
    int nfiles;
    unsigned char *chunk; /* CKPT_CHUNK bytes (the caller allocates it) */
};

/* Copy the overlap of one saved shard (of tensor t, in checkpoint directory dir) with mine into
 * dst, converted to dtype ddt. Reads whole CRC blocks covering the runs, in chunks, and checks
 * every block (and the tensor's own CRC where the shard is read whole). Adds the elements copied
 * to *copied. */
shardopt_status_t ckpt_shard_read(struct ck_reader *R, const char *dir, const struct ck_tensor *t,
                                  const struct ck_shard *sh, const struct plan_box *mine,
                                  unsigned char *dst, int ddt, int64_t *copied);

/* Closes the files opened and frees the file table and the chunk. */
void ckpt_reader_free(struct ck_reader *R);

#endif

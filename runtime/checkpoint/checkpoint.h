/* Checkpoints (docs/checkpoint.md): what save and load share. */
#ifndef RUNTIME_CHECKPOINT_H
#define RUNTIME_CHECKPOINT_H

#include "runtime/runtime.h"
#include "sharding/plan.h"

/* 2: index.json has its integrity record, index.json.crc32c, beside it. 3: the checkpoint also
 * holds the parameters (ckpt_weights: "weights": true, a tensor named as each parameter), which a
 * version-2 reader would refuse as damaged rather than as newer. 4: index.json holds the global
 * facts alone (O(parameters)); each writer's shard records are in its own rank-NNNNN.index.json
 * (with its integrity record), so that no rank builds or parses the whole world's records. A save
 * writes 4; a load reads 1 (without the record), 2, 3 and 4 (only with it). */
#define CKPT_FORMAT_VERSION       4
#define CKPT_FORMAT_OLDEST        1
#define CKPT_FORMAT_WEIGHTS_FIRST 3
#define CKPT_FORMAT_WRITERS_FIRST 4
#define CKPT_WRITER_INDEX_FMT     "rank-%05d.index.json"
#define CKPT_RANK_FILE_FMT        "rank-%05d.safetensors"
#define CKPT_INDEX_CRC_NAME       "index.json.crc32c"
#define CKPT_BLOCK                ((size_t)1 << 20) /* bytes per CRC32C block: partial readers verify blocks */
#define CKPT_CHUNK                ((size_t)16 << 20) /* bytes per read or write call */
#define CKPT_INDEX_MAX            ((size_t)1 << 30) /* index.json: the most a load reads, a save writes */

/* One optimizer state tensor of a parameter. */
struct ckpt_kind {
    const char *suffix; /* "momentum", "exp_avg", "exp_avg_sq"; NULL: the parameter's weight */
    int dtype;
    size_t offset; /* in the state store */
};

/* The state tensors a parameter has (1 for Muon, 2 for AdamW). */
int ckpt_kinds(const shardopt_runtime_t rt, const struct shardopt_param *p,
               struct ckpt_kind out[2]);

/* The tensors a checkpoint holds of a parameter: its state kinds, then, with `weights`
 * (ckpt_weights), the parameter itself (suffix NULL, its registered dtype, offset 0: its data is
 * not in the state store). Returns how many (at most 3). */
int ckpt_tensors(const shardopt_runtime_t rt, const struct shardopt_param *p, int weights,
                 struct ckpt_kind out[3]);

/* Shape and local box of a parameter as 3-D (leading dims of 1). */
void ckpt_box3(const struct layout *l, int64_t shape[3], struct plan_box *box);

/* "<param>.<suffix>", or "<param>" for the parameter itself (suffix NULL) */
void ckpt_tensor_name(const struct shardopt_param *p, const char *suffix, char *out, size_t len);

/* "F32" / "BF16", and back (-1 for anything else). */
const char *ckpt_dtype_name(int dtype);
int ckpt_dtype_parse(const char *s);

/* Write len bytes to fd, in CKPT_CHUNK calls: 0, or -1 with errno set (SHARDOPT_FAULT=<site>:<n>
 * injects a failure at a chunk). */
int ckpt_write_all(int fd, const void *buf, size_t len, const char *site);

/* Create `name` (relative to dirfd, or a path with AT_FDCWD) for writing, in a save's temporary
 * directory: a new plain file only (O_EXCL), never through a link, never waiting. A FIFO put
 * there (between rank 0's mkdir and this open) held a blocking open until a reader came, for
 * good: the save hung on this rank; a hard link there would have been truncated. An fd, or -1
 * with errno set: EEXIST for anything already at the name (nothing is opened or emptied). */
int ckpt_file_create(int dirfd, const char *name);

/* What a save's message adds after strerror(err) for ckpt_file_create's EEXIST ("" otherwise). */
const char *ckpt_file_create_note(int err);

/* The longest checkpoint directory path save and load take. */
#define CKPT_DIR_MAX 3000

/* dir as save and load take it (not NULL): not empty, at most CKPT_DIR_MAX bytes; else
 * ERR_INVALID_ARGUMENT, the message starting "<who>: " (nothing when who is ""). */
shardopt_status_t ckpt_dir_check(const char *who, const char *dir);

/* shardopt_save and shardopt_load once the runtime is claimed for them (rt_claim, in
 * checkpoint_common.c: one thread's call at a time) */
shardopt_status_t ckpt_save_run(shardopt_runtime_t rt, const char *dir);
shardopt_status_t ckpt_load_run(shardopt_runtime_t rt, const char *dir);

/* A file a load could not open or read (base/file_read.h), refused as "<who>: <path>: <why>":
 * ERR_IO when it could not be opened or read, ERR_CORRUPT when it is not a regular file ("is a
 * FIFO, expected a regular file") or larger than the load reads, ERR_OUT_OF_MEMORY. */
struct file_read_error;
shardopt_status_t ckpt_file_refused(const char *who, const char *path,
                                    const struct file_read_error *e);

/* A checkpoint file name the index (or latest) may name: a plain name, no '/', not "." or "..",
 * no control character, valid UTF-8. */
int ckpt_name_is_plain(const char *s);

/* For tests only (NULL otherwise): called on rank 0 with the path of a save's temporary
 * directory just before it checks the rank files there and publishes them. */
extern void (*ckpt_test_before_publish)(const char *tmp_path);

/* The checks shardopt_load applies to an index.json text (len bytes, a NUL after them) once its
 * integrity record matched, alone (the record is not looked for: the structure is what is
 * checked): SHARDOPT_OK, SHARDOPT_ERR_CORRUPT, SHARDOPT_ERR_UNSUPPORTED (format_version) or
 * SHARDOPT_ERR_OUT_OF_MEMORY. For the fuzz target tests/fuzz/fuzz_index.c and the corpus test. */
shardopt_status_t ckpt_index_check(const char *text, size_t len);

/* The checks a load applies to writer 0's rank-00000.index.json (text, len bytes, a NUL after
 * them; its integrity record taken as matching) of the checkpoint whose index.json (of
 * format_version 4) is index_text: every record, none kept. For the fuzz target
 * tests/fuzz/fuzz_writer_index.c. SHARDOPT_ERR_INVALID_ARGUMENT when index_text is refused. */
shardopt_status_t ckpt_writer_index_check(const char *index_text, size_t index_len,
                                          const char *text, size_t len);

/* Every rank returns the same status: the worst one, with the message of the rank that had it
 * (or a pointer to that rank's log). */

shardopt_status_t ckpt_agree(const shardopt_runtime_t rt, shardopt_status_t mine, const char *what);

/* Before a load allocates its copy of the state: the host memory it takes (a host store's
 * staging copy; with device state the host view and the read buffer, twice the state), summed
 * over the node's ranks (comm_node_sum), against what the machine has left (base/meminfo.h), so
 * that a load too large for the memory left fails with the bytes instead of an OOM kill while
 * the copy is zeroed. Collective (call it on every rank); mine: this rank's status so far (not
 * OK: it takes part needing nothing and mine is returned). Local verdict: the caller agrees. */
shardopt_status_t ckpt_memory_check(const shardopt_runtime_t rt, shardopt_status_t mine);

/* "[a, b]": the last ndim (1-3) of a shape padded to 3 dims with leading 1s, as it was given. */
const char *ckpt_shape_text(char *out, size_t len, const int64_t shape3[3], int ndim);

#endif

/* The safetensors container: an 8-byte little-endian header length N, N bytes of JSON, then the
 * raw tensor bytes. Pure: builds and checks headers in memory, no I/O, no MPI. Refusals fill a
 * message naming the tensor and the field; the caller prefixes the file name and logs it. */
#ifndef RUNTIME_SAFETENSORS_H
#define RUNTIME_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "shardopt.h"

/* Same values as kernels' KDT_F32 / KDT_BF16, so a dtype passes between the two unchanged. */
enum st_dtype { ST_DTYPE_F32 = 0, ST_DTYPE_BF16 = 1 };

/* The largest JSON header accepted: 100,000,000 bytes, the reference implementation's
 * MAX_HEADER_SIZE (decimal, not MiB). */
#define ST_HEADER_MAX 100000000ull

/* Doubles are exact integers below 2^53; cJSON reads every number as a double. */
#define ST_U53_LIMIT 9007199254740992.0
#define ST_META_KEY  "__metadata__"

/* Longest tensor name, and longest metadata key, in bytes without the NUL. */
#define ST_NAME_MAX 255

/* The byte offset of the first byte of s that is not valid UTF-8 (strict, as the reference
 * reader: no overlongs, surrogates or code points past U+10FFFF), or -1 when s is valid. */
long st_utf8_error(const char *s);
#define ST_KEY_MAX  63
#define ST_NDIM_MAX 3

struct st_tensor {
    char name[ST_NAME_MAX + 1];
    int dtype; /* enum st_dtype */
    int ndim;  /* 0-3 */
    int64_t shape[ST_NDIM_MAX];
    uint64_t begin, end; /* byte offsets relative to the start of the data area */
};

struct st_meta {
    char key[ST_KEY_MAX + 1];
    char *value; /* heap-allocated, NUL-terminated */
};

struct st_header {
    struct st_tensor *t; /* in the order of the JSON header */
    int n;
    struct st_meta *meta;
    int nmeta;
    uint64_t data_start; /* file offset of the data area: 8 + JSON length */
    int *by_name;        /* private to st_header_find: indices of t sorted by name */
};

/* Bytes per element of a dtype: 4 for F32, 2 for BF16. */
size_t st_dtype_size(int dtype);

/* "F32" or "BF16"; "?" for anything else. */
const char *st_dtype_name(int dtype);

/* The checks the writer shares with the reader (safetensors_read.c), so that nothing is written
 * that a read refuses. st_name_problem: NULL when name may name a tensor, else what is wrong with
 * it (empty, longer than ST_NAME_MAX, a control character). st_shape_bytes: 1 with the byte size
 * of a shape in *bytes, 0 when it would not fit in 64 bits. */
const char *st_name_problem(const char *name);
int st_shape_bytes(const int64_t *shape, int ndim, int dtype, uint64_t *bytes);

/* Writing (safetensors_write.c). Build the 8-byte length and the JSON header (metadata first, then
 * the tensors in the given order, space-padded so that 8 + N is a multiple of 8) for tensors laid
 * out back to back from offset 0: begin/end are computed and written into t[]. The data area starts
 * at *out_len.
 * @param t       n tensor descriptions; name, dtype, ndim, shape are read, begin/end written
 * @param meta    nmeta metadata entries (may be NULL when nmeta is 0), written as strings
 * @param out     receives a malloc'd buffer of *out_len bytes (set only on success)
 * @return SHARDOPT_OK; SHARDOPT_ERR_OUT_OF_MEMORY; SHARDOPT_ERR_INVALID_ARGUMENT when a
 *         description would make a file that st_header_parse refuses (dtype, ndim, a negative or
 *         overflowing shape, an empty, long, duplicate or non-UTF-8 name or metadata key or value,
 *         a name with a control character or named "__metadata__"). */
shardopt_status_t st_header_build(struct st_tensor *t, int n, const struct st_meta *meta, int nmeta,
                                  char **out, size_t *out_len);

/* Reading (safetensors_read.c). Step 1: the JSON length from the file's first 8 bytes and the file
 * size. Refuses a file shorter than 8 bytes and a length above file_size - 8 or ST_HEADER_MAX.
 * @param json_len  receives the length (set only on success)
 * @param err       receives the reason for a refusal (may be NULL)
 * @return SHARDOPT_OK or SHARDOPT_ERR_CORRUPT */
shardopt_status_t st_header_len(const unsigned char first8[8], uint64_t file_size,
                                uint64_t *json_len, char *err, size_t errlen);

/* Step 2 of reading: parse and validate json_len bytes of JSON (no NUL needed) against the file
 * size. Checks every field's type, the dtype (F32, BF16), shapes (0-3 integral dims whose byte
 * size fits 64 bits), offsets (end - begin equals the byte size, inside the file, no two tensors
 * overlapping), names (non-empty, < 256 bytes, no control characters, no duplicates), metadata
 * values (strings), UTF-8 and integral numbers. Offsets and sizes of 2^53 or more are refused:
 * cJSON reads numbers as doubles, which are exact only below that (9 PB, far beyond any shard).
 * Allocates only in proportion to json_len, which step 1 checked against the file size.
 * @param out  receives the header (set only on success); release it with st_header_free
 * @param err  receives the reason for a refusal (may be NULL)
 * @return SHARDOPT_OK, SHARDOPT_ERR_CORRUPT or SHARDOPT_ERR_OUT_OF_MEMORY */
shardopt_status_t st_header_parse(const char *json, uint64_t json_len, uint64_t file_size,
                                  struct st_header *out, char *err, size_t errlen);

/* Release what st_header_parse allocated and zero h. NULL and a zeroed header are fine. */
void st_header_free(struct st_header *h);

/* The tensor called name, or NULL. O(log n). */
const struct st_tensor *st_header_find(const struct st_header *h, const char *name);

/* The bytes h's tensors hold, summed (at most the data area: they lie in it, none overlapping).
 * A file whose data area holds more (a gap between tensors, bytes after the last) is not a
 * safetensors file: the format indexes every byte of it. */
uint64_t st_header_data_bytes(const struct st_header *h);

#endif

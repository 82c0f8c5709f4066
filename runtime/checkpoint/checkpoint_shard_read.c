/* A load's reads of the saved shards (shardopt_load, checkpoint_load.c): each shard file opened
 * once, its safetensors header checked against its size, and the part of a shard that overlaps
 * this rank read block by block, each block's CRC32C checked, converted to the configured dtype.
 */
#include "runtime/checkpoint/checkpoint_shard_read.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/crc32c.h"
#include "base/fault.h"
#include "base/file_read.h"
#include "base/log.h"
#include "base/mem.h"
#include "sharding/reshard.h"

/* len bytes at `at`: 0; -1 for an I/O error (errno set; SHARDOPT_FAULT=ckpt.read:<n> injects
 * EIO, or hang@ckpt.read a rank that stops mid-load); 1 when the file ends first. */
static int pread_all(int fd, void *buf, size_t len, uint64_t at)
{
    unsigned char *p = buf;
    if (fault_hit("ckpt.read"))
        return -1;
    while (len > 0) {
        ssize_t r = pread(fd, p, len, (off_t)at);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -1;
        if (r == 0)
            return 1;
        p += r;
        len -= (size_t)r;
        at += (uint64_t)r;
    }
    return 0;
}

/* A read that did not return every byte: the disk or filesystem failed (ERR_IO, as for a save),
 * or the file is shorter than its header says (ERR_CORRUPT). */
static shardopt_status_t read_fail(int r, const char *path, const char *file, const char *what)
{
    if (r < 0)
        return log_fail(SHARDOPT_ERR_IO, "load: %s%s%s: %s: read failed: %s", path, file ? "/" : "",
                        file ? file : "", what, strerror(errno));
    return log_fail(SHARDOPT_ERR_CORRUPT, "load: %s%s%s: %s: file truncated", path, file ? "/" : "",
                    file ? file : "", what);
}

static shardopt_status_t file_open(struct ck_reader *R, const char *dir, const char *name,
                                   struct ck_file **out)
{
    char path[4400], err[256];
    unsigned char first8[8];
    uint64_t json_len;

    for (int i = 0; i < R->nfiles; i++)
        if (strcmp(R->files[i].name, name) == 0) {
            *out = &R->files[i];
            return SHARDOPT_OK;
        }
    struct ck_file *f = &R->files[R->nfiles];
    memset(f, 0, sizeof *f);
    f->name = name;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    struct file_read_error e;
    f->fd = file_read_open(path, 0, &f->size, &e); /* no FIFO or device: a load never hangs */
    if (f->fd < 0)
        return ckpt_file_refused("load", path, &e);
    R->nfiles++;
    int r = pread_all(f->fd, first8, 8, 0);
    if (r != 0)
        return read_fail(r, path, NULL, "shorter than a safetensors header");
    if (st_header_len(first8, f->size, &json_len, err, sizeof err) != 0)
        return log_fail(SHARDOPT_ERR_CORRUPT, "load: %s: %s", path, err);
    char *json = mem_malloc(json_len + 1);
    if (json == NULL)
        return log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                        "load: %s: out of memory allocating %llu bytes for the header", path,
                        (unsigned long long)json_len + 1);
    if ((r = pread_all(f->fd, json, json_len, 8)) != 0) {
        free(json);
        return read_fail(r, path, NULL, "header");
    }
    const shardopt_status_t rc = st_header_parse(json, json_len, f->size, &f->hdr, err, sizeof err);
    free(json);
    if (rc != SHARDOPT_OK) /* refused (corrupt), or out of memory reading it */
        return log_fail(rc == SHARDOPT_ERR_OUT_OF_MEMORY ? rc : SHARDOPT_ERR_CORRUPT,
                        "load: %s: %s", path, err);
    if (f->size - f->hdr.data_start != st_header_data_bytes(&f->hdr)) { /* a save writes none */
        const unsigned long long after = f->size - f->hdr.data_start,
                                 held = st_header_data_bytes(&f->hdr);
        st_header_free(&f->hdr); /* not opened: the reader's release would not free it */
        return log_fail(
            SHARDOPT_ERR_CORRUPT,
            "load: %s: %llu bytes after the header, its tensors hold %llu: bytes "
            "no tensor indexes (a gap, or appended), which safetensors files never hold",
            path, after, held);
    }
    f->opened = 1;
    *out = f;
    return SHARDOPT_OK;
}

/* dst[i] <- src[i] converted between the checkpoint's dtype and the configured one. */
static void elems_convert(void *dst, int ddt, const void *src, int sdt, size_t n)
{
    if (ddt == sdt) {
        memcpy(dst, src, n * kdtype_size(ddt));
    } else if (ddt == KDT_F32) {
        for (size_t i = 0; i < n; i++)
            ((float *)dst)[i] = f32_from_bf16(((const uint16_t *)src)[i]);
    } else {
        for (size_t i = 0; i < n; i++)
            ((uint16_t *)dst)[i] = bf16_from_f32(((const float *)src)[i]);
    }
}

shardopt_status_t ckpt_shard_read(struct ck_reader *R, const char *dir, const struct ck_tensor *t,
                                  const struct ck_shard *sh, const struct plan_box *mine,
                                  unsigned char *dst, int ddt, int64_t *copied)
{
    struct reshard_runs runs;
    struct ck_file *f = NULL;
    shardopt_status_t status;
    const size_t es = kdtype_size(t->dtype), des = kdtype_size(ddt);
    int64_t so, doff, len;

    if (!reshard_runs_init(&runs, &sh->box, mine))
        return SHARDOPT_OK;
    status = file_open(R, dir, sh->file, &f);
    if (status != SHARDOPT_OK)
        return status;
    const struct st_tensor *st = st_header_find(&f->hdr, t->name);
    if (st == NULL)
        return log_fail(SHARDOPT_ERR_CORRUPT, "load: %s/%s: tensor '%s' missing", dir, sh->file,
                        t->name);
    status = ckpt_shard_header_check(dir, t, sh, st);
    if (status != SHARDOPT_OK)
        return status;
    const int64_t numel = sh->box.len[0] * sh->box.len[1] * sh->box.len[2];
    const uint64_t tensor_bytes = (uint64_t)numel * es, base = f->hdr.data_start + st->begin;

    /* the saved shard is exactly this rank's, in the same dtype (a load on the layout that
     * saved): read it straight into place and check the blocks there */
    if (ddt == t->dtype && memcmp(&sh->box, mine, sizeof *mine) == 0) {
        int r = pread_all(f->fd, dst, (size_t)tensor_bytes, base);
        if (r != 0) {
            char what[300];
            snprintf(what, sizeof what, "tensor '%s'", t->name);
            return read_fail(r, dir, sh->file, what);
        }
        uint32_t whole = 0;
        for (uint64_t k = 0; k < tensor_bytes; k += CKPT_BLOCK) {
            const size_t blen =
                (size_t)(tensor_bytes - k < CKPT_BLOCK ? tensor_bytes - k : CKPT_BLOCK);
            const uint32_t c = crc32c_update(0, dst + k, blen);
            whole = crc32c_combine(whole, c, blen);
            if (c != sh->blocks[k / CKPT_BLOCK])
                return log_fail(SHARDOPT_ERR_CORRUPT,
                                "load: %s/%s: tensor '%s': CRC32C mismatch in bytes [%llu, %llu) "
                                "(the file is damaged)",
                                dir, sh->file, t->name, (unsigned long long)k,
                                (unsigned long long)(k + blen));
        }
        /* read whole, the tensor's own CRC (what external tools see) is checked too */
        if (whole != sh->crc)
            return log_fail(SHARDOPT_ERR_CORRUPT,
                            "load: %s/%s: tensor '%s': CRC32C %08x, the index says %08x", dir,
                            sh->file, t->name, whole, sh->crc);
        *copied += numel;
        return SHARDOPT_OK;
    }

    /* the source byte range the runs span, widened to whole blocks */
    struct reshard_runs scan = runs;
    int64_t first = -1, last = 0;
    while (reshard_runs_next(&scan, &so, &doff, &len)) {
        if (first < 0)
            first = so;
        last = so + len;
    }
    uint64_t a = (uint64_t)first * es / CKPT_BLOCK * CKPT_BLOCK;
    uint64_t b = ((uint64_t)last * es + CKPT_BLOCK - 1) / CKPT_BLOCK * CKPT_BLOCK;
    b = b < tensor_bytes ? b : tensor_bytes;

    int have = reshard_runs_next(&runs, &so, &doff, &len);
    for (uint64_t c0 = a; c0 < b; c0 += CKPT_CHUNK) {
        const uint64_t c1 = c0 + CKPT_CHUNK < b ? c0 + CKPT_CHUNK : b;
        int r = pread_all(f->fd, R->chunk, (size_t)(c1 - c0), base + c0);
        if (r != 0) {
            char what[300];
            snprintf(what, sizeof what, "tensor '%s'", t->name);
            return read_fail(r, dir, sh->file, what);
        }
        for (uint64_t k = c0; k < c1; k += CKPT_BLOCK) {
            const size_t blen = (size_t)(c1 - k < CKPT_BLOCK ? c1 - k : CKPT_BLOCK);
            if (crc32c_update(0, R->chunk + (k - c0), blen) != sh->blocks[k / CKPT_BLOCK])
                return log_fail(SHARDOPT_ERR_CORRUPT,
                                "load: %s/%s: tensor '%s': CRC32C mismatch in bytes [%llu, %llu) "
                                "(the file is damaged)",
                                dir, sh->file, t->name, (unsigned long long)k,
                                (unsigned long long)(k + blen));
        }
        /* the runs' parts inside this chunk */
        const int64_t e0 = (int64_t)(c0 / es), e1 = (int64_t)(c1 / es);
        while (have && so < e1) {
            const int64_t lo = so > e0 ? so : e0, hi = so + len < e1 ? so + len : e1;
            elems_convert(dst + (size_t)(doff + (lo - so)) * des, ddt,
                          R->chunk + (size_t)(lo - e0) * es, t->dtype, (size_t)(hi - lo));
            *copied += hi - lo;
            if (so + len <= e1)
                have = reshard_runs_next(&runs, &so, &doff, &len);
            else
                break;
        }
    }
    return SHARDOPT_OK;
}

void ckpt_reader_free(struct ck_reader *R)
{
    for (int i = 0; i < R->nfiles; i++) {
        if (R->files[i].fd >= 0)
            close(R->files[i].fd);
        if (R->files[i].opened)
            st_header_free(&R->files[i].hdr);
    }
    free(R->files);
    free(R->chunk);
}

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fault.h"
#include "base/file_read.h"
#include "base/log.h"
#include "base/status.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/safetensors.h"
#include "runtime/comm/comm_wait.h"

int ckpt_kinds(const shardopt_runtime_t rt, const struct shardopt_param *p, struct ckpt_kind out[2])
{
    if (p->algo == SHARDOPT_ALGO_MUON) {
        out[0] = (struct ckpt_kind){"momentum", rt->cfg.momentum_dtype, p->off_momentum};
        return 1;
    }
    out[0] = (struct ckpt_kind){"exp_avg", rt->cfg.adam_state_dtype, p->off_exp_avg};
    out[1] = (struct ckpt_kind){"exp_avg_sq", rt->cfg.adam_v_dtype, p->off_exp_avg_sq};
    return 2;
}

int ckpt_tensors(const shardopt_runtime_t rt, const struct shardopt_param *p, int weights,
                 struct ckpt_kind out[3])
{
    int n = ckpt_kinds(rt, p, out);
    if (weights)
        out[n++] =
            (struct ckpt_kind){NULL, p->param_dtype == SHARDOPT_DTYPE_BF16 ? KDT_BF16 : KDT_F32, 0};
    return n;
}

void ckpt_box3(const struct layout *l, int64_t shape[3], struct plan_box *box)
{
    const int pad = 3 - l->ndim;
    for (int d = 0; d < 3; d++) {
        const int s = d - pad;
        shape[d] = s >= 0 ? l->shape[s] : 1;
        box->lo[d] = s >= 0 ? l->lo[s] : 0;
        box->len[d] = s >= 0 ? l->len[s] : 1;
    }
}

void ckpt_tensor_name(const struct shardopt_param *p, const char *suffix, char *out, size_t len)
{
    if (suffix == NULL)
        snprintf(out, len, "%s", p->name);
    else
        snprintf(out, len, "%s.%s", p->name, suffix);
}

const char *ckpt_dtype_name(int dtype) { return dtype == KDT_BF16 ? "BF16" : "F32"; }

int ckpt_dtype_parse(const char *s)
{
    if (strcmp(s, "F32") == 0)
        return KDT_F32;
    if (strcmp(s, "BF16") == 0)
        return KDT_BF16;
    return -1;
}

int ckpt_name_is_plain(const char *s)
{
    if (s == NULL || s[0] == '\0' || strlen(s) > 255 || strcmp(s, ".") == 0 || strcmp(s, "..") == 0)
        return 0;
    for (const char *c = s; *c; c++)
        if (*c == '/' || (unsigned char)*c < 0x20 || (unsigned char)*c == 0x7f)
            return 0;
    return st_utf8_error(s) < 0; /* it is printed in messages as it is */
}

shardopt_status_t ckpt_file_refused(const char *who, const char *path,
                                    const struct file_read_error *e)
{
    switch (e->fault) {
    case FILE_READ_KIND: /* a save writes every file a load opens as a regular file */
    case FILE_READ_SIZE: return log_fail(SHARDOPT_ERR_CORRUPT, "%s: %s: %s", who, path, e->why);
    case FILE_READ_MEMORY:
        return log_fail(SHARDOPT_ERR_OUT_OF_MEMORY, "%s: %s: %s", who, path, e->why);
    case FILE_READ_IO:
        return log_fail(SHARDOPT_ERR_IO, "%s: %s: read failed: %s", who, path, e->why);
    default: return log_fail(SHARDOPT_ERR_IO, "%s: %s: %s", who, path, e->why);
    }
}

shardopt_status_t ckpt_dir_check(const char *who, const char *dir)
{
    const char *sep = who[0] != '\0' ? ": " : "";
    /* "" was opened as a path and failed with ERR_IO naming nothing; a longer path than this
     * filled the 1023 bytes of a message before its reason */
    if (dir[0] == '\0')
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "%s%sdir is empty: name the checkpoint directory (\".\" for the current "
                        "one)",
                        who, sep);
    if (strlen(dir) > CKPT_DIR_MAX)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "%s%sdirectory path of %zu bytes: at most %d", who, sep, strlen(dir),
                        CKPT_DIR_MAX);
    return SHARDOPT_OK;
}

shardopt_status_t ckpt_agree(const shardopt_runtime_t rt, shardopt_status_t mine, const char *what)
{
    return groups_agree(&rt->groups, mine, what);
}

int ckpt_write_all(int fd, const void *buf, size_t len, const char *site)
{
    const char *p = buf;
    while (len > 0) {
        if (fault_hit(site))
            return -1; /* errno as the fault asks (EIO unless given) */
        ssize_t w = write(fd, p, len < CKPT_CHUNK ? len : CKPT_CHUNK);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

int ckpt_file_create(int dirfd, const char *name)
{
    struct stat st;
    /* O_EXCL: the temporary directory is this save's own, made empty; anything at the name was
     * put there since, and is never opened through nor emptied (a hard link to the previous
     * step's rank file would have been truncated with it) */
    int fd = openat(dirfd, name, O_CREAT | O_EXCL | O_WRONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC,
                    0644);
    if (fd < 0)
        return -1;
    /* what O_EXCL created is a plain file; the O_NONBLOCK it ignores goes, so that writes are as
     * they always were */
    int err = fstat(fd, &st) != 0 ? errno : !S_ISREG(st.st_mode) ? ENXIO : 0;
    if (err == 0 && fcntl(fd, F_SETFL, 0) != 0)
        err = errno;
    if (err != 0) {
        close(fd);
        errno = err;
        return -1;
    }
    return fd;
}

const char *ckpt_file_create_note(int err)
{
    return err == EEXIST  ? " (put there after the save made its temporary directory: a FIFO, a "
                            "link or a file, left unopened)"
           : err == ENXIO ? " (not a plain file)"
                          : "";
}

const char *ckpt_shape_text(char *out, size_t len, const int64_t shape3[3], int ndim)
{
    const int64_t *s = shape3 + (ndim >= 1 && ndim <= 3 ? 3 - ndim : 0);
    if (ndim == 1)
        snprintf(out, len, "[%lld]", (long long)s[0]);
    else if (ndim == 2)
        snprintf(out, len, "[%lld, %lld]", (long long)s[0], (long long)s[1]);
    else
        snprintf(out, len, "[%lld, %lld, %lld]", (long long)s[0], (long long)s[1], (long long)s[2]);
    return out;
}

/* One thread's call on a runtime at a time (docs/api.md, Threads): a save or load while another
 * thread's call runs is refused before it reads anything. */
static shardopt_status_t claimed_run(shardopt_runtime_t rt, const char *dir, const char *call,
                                     shardopt_status_t (*run)(shardopt_runtime_t, const char *))
{
    const shardopt_status_t claimed = rt_claim(rt, call);
    if (claimed != SHARDOPT_OK)
        return claimed;
    const shardopt_status_t status = run(rt, dir);
    rt_release(rt);
    return status;
}

shardopt_status_t shardopt_save(shardopt_runtime_t rt, const char *dir)
{
    return claimed_run(rt, dir, "save", ckpt_save_run);
}

shardopt_status_t shardopt_load(shardopt_runtime_t rt, const char *dir)
{
    return claimed_run(rt, dir, "load", ckpt_load_run);
}

shardopt_status_t ckpt_memory_check(const shardopt_runtime_t rt, shardopt_status_t mine)
{
    const size_t b = rt->store.bytes;
    const uint64_t need = state_store_on_device(&rt->store) ? 2 * (uint64_t)b : b;
    struct node_memory m;
    const shardopt_status_t st =
        comm_node_memory(&rt->groups, need, mine, "load", "load's memory check", &m);
    if (st != SHARDOPT_OK || !m.over)
        return st;
    return log_fail(
        SHARDOPT_ERR_OUT_OF_MEMORY,
        "load: rank %d: the copy of the optimizer state a load reads into needs %llu "
        "bytes of host memory (%llu with this node's %d ranks of the runtime), but %llu "
        "bytes are available (%s); nothing was read, the state is unchanged",
        rt->groups.me.rank, (unsigned long long)need, (unsigned long long)m.node, m.ranks,
        (unsigned long long)m.avail, m.src);
}

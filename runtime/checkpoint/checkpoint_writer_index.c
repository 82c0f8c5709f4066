/* Version 4's writers' indexes (rank-NNNNN.index.json), as a load reads them: each one's
 * integrity record, its records checked whole against index.json, the shards overlapping what this
 * rank needs kept, the order the writers are read in (writer 0, the writers a guess of the saving
 * layout names, then outward from this rank), and that the kept shards tile each need. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/crc32c.h"
#include "base/file_read.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/status.h"
#include "runtime/checkpoint/checkpoint_index.h"
#include "runtime/config/json_strict.h"

void (*ckpt_index_test_probe)(void);

shardopt_status_t ckpt_index_writer_read(void *ctx, const char *stepdir, int w, char **text,
                                         size_t *len)
{
    char name[64], path[4400], *rec = NULL;
    size_t n = 0;
    struct file_read_error e;
    (void)ctx;
    *text = NULL;
    snprintf(name, sizeof name, CKPT_WRITER_INDEX_FMT, w);
    snprintf(path, sizeof path, "%s/%s", stepdir, name);
    if (file_read_text(path, CKPT_INDEX_MAX, text, len, &e) != 0)
        return ckpt_file_refused("load", path, &e);
    /* its integrity record, checked before a byte is parsed: version 4 always has one (16 bytes:
     * more is refused as not the record's form) */
    snprintf(path, sizeof path, "%s/%s.crc32c", stepdir, name);
    shardopt_status_t status = SHARDOPT_OK;
    if (file_read_text(path, 16, &rec, &n, &e) != 0 && e.fault != FILE_READ_SIZE)
        status =
            e.fault == FILE_READ_OPEN && e.err == ENOENT
                ? log_fail(SHARDOPT_ERR_CORRUPT,
                           "load: %s: %s: the integrity record of %s is missing", path, e.why, name)
                : ckpt_file_refused("load", path, &e);
    int good = rec != NULL && n == 9 && rec[8] == '\n';
    for (int i = 0; good && i < 8; i++)
        good = (rec[i] >= '0' && rec[i] <= '9') || (rec[i] >= 'a' && rec[i] <= 'f');
    if (status == SHARDOPT_OK && !good)
        status = log_fail(SHARDOPT_ERR_CORRUPT,
                          "load: %s: not 8 lowercase hex digits and a newline (the CRC-32C of %s): "
                          "the record is damaged",
                          path, name);
    else if (status == SHARDOPT_OK) {
        rec[8] = '\0';
        const uint32_t want = (uint32_t)strtoul(rec, NULL, 16);
        const uint32_t have = crc32c_update(0, *text, *len);
        if (want != have)
            status = log_fail(SHARDOPT_ERR_CORRUPT,
                              "load: %s/%s: CRC32C %08x, %s.crc32c says %08x: the writer's index "
                              "is damaged",
                              stepdir, name, have, name, want);
    }
    free(rec);
    if (status != SHARDOPT_OK) {
        free(*text);
        *text = NULL;
    }
    return status;
}

/* Elements of a and b's overlap (3-D boxes), and that box. */
static int64_t box_overlap(const struct plan_box *a, const struct plan_box *b, struct plan_box *o)
{
    int64_t v = 1;
    for (int d = 0; d < 3; d++) {
        const int64_t lo = a->lo[d] > b->lo[d] ? a->lo[d] : b->lo[d];
        const int64_t ahi = a->lo[d] + a->len[d], bhi = b->lo[d] + b->len[d];
        const int64_t hi = ahi < bhi ? ahi : bhi;
        if (hi <= lo)
            return 0;
        o->lo[d] = lo;
        o->len[d] = hi - lo;
        v *= hi - lo;
    }
    return v;
}

/* Keep shard sh of t (its blocks move to t). */
static shardopt_status_t shard_keep(struct ck_index *L, const char *ixfile, struct ck_tensor *t,
                                    struct ck_shard *sh)
{
    if (t->nshards == t->cap) {
        const int cap = t->cap ? 2 * t->cap : 4;
        struct ck_shard *n = mem_realloc(t->shards, sizeof(*n) * (size_t)cap);
        if (n == NULL)
            return log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                            "load: %s/%s: out of memory allocating %zu bytes for the shards of "
                            "'%s'",
                            L->dir, ixfile, sizeof(*n) * (size_t)cap, t->name);
        t->shards = n;
        t->cap = cap;
    }
    t->shards[t->nshards++] = *sh;
    sh->blocks = NULL;
    return SHARDOPT_OK;
}

/* One writer's index: every record checked, the shards overlapping a need kept (covered[k]
 * counts the elements of need k they cover). */
/* A JSON value a message shows: its number, or what it is instead. */
static const char *number_text(const cJSON *v, char *out, size_t len)
{
    if (cJSON_IsNumber(v))
        snprintf(out, len, "%.17g", v->valuedouble);
    else
        snprintf(out, len, "%s", v == NULL ? "missing" : "not a number");
    return out;
}

static shardopt_status_t writer_parse(struct ck_index *L, int w, const char *text, size_t len,
                                      const struct ck_need *need, int64_t *covered, int *left)
{
    char ixfile[64], why[256], rankfile[64], num[40];
    cJSON *root = NULL;
    const cJSON *e;
    uint64_t v;
    snprintf(ixfile, sizeof ixfile, CKPT_WRITER_INDEX_FMT, w);
    snprintf(rankfile, sizeof rankfile, CKPT_RANK_FILE_FMT, w);
    shardopt_status_t status =
        json_strict_parse(text, len, JSON_STRICT_INTEGERS, &root, why, sizeof why);
    if (status == SHARDOPT_ERR_OUT_OF_MEMORY)
        return log_fail(status, "load: %s/%s: %s while parsing it", L->dir, ixfile, why);
    if (status != SHARDOPT_OK)
        return log_fail(SHARDOPT_ERR_CORRUPT, "load: %s/%s: %s", L->dir, ixfile, why);
    if (ckpt_index_test_probe != NULL)
        ckpt_index_test_probe();
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    const cJSON *shards = cJSON_GetObjectItemCaseSensitive(root, "shards");
    const cJSON *file = cJSON_GetObjectItemCaseSensitive(root, "file");
    if (!cJSON_IsObject(root) || !cJSON_IsString(fmt) ||
        strcmp(fmt->valuestring, "shardopt-checkpoint-shards") != 0)
        status = ckpt_index_bad_in(L->dir, ixfile,
                                   "\"format\" is not \"shardopt-checkpoint-shards\"", NULL);
    else if (!ckpt_json_uint(cJSON_GetObjectItemCaseSensitive(root, "format_version"), CK_INT_MAX,
                             &v) ||
             v != (uint64_t)L->version)
        status = ckpt_index_bad_in(L->dir, ixfile, "\"format_version\" is not index.json's", NULL);
    else if (!ckpt_json_uint(cJSON_GetObjectItemCaseSensitive(root, "step"), CK_INT_MAX, &v) ||
             v != L->step) {
        snprintf(why, sizeof why,
                 "\"step\" is %s, not index.json's %llu (a writer's index of another save)",
                 number_text(cJSON_GetObjectItemCaseSensitive(root, "step"), num, sizeof num),
                 (unsigned long long)L->step);
        status = ckpt_index_bad_in(L->dir, ixfile, why, NULL);
    } else if (!ckpt_json_uint(cJSON_GetObjectItemCaseSensitive(root, "writer"), 2147483647.0,
                               &v) ||
               v != (uint64_t)w) {
        /* a writer's files renamed or copied to another number */
        snprintf(why, sizeof why, "\"writer\" is %s, not the number in its name (%d)",
                 number_text(cJSON_GetObjectItemCaseSensitive(root, "writer"), num, sizeof num), w);
        status = ckpt_index_bad_in(L->dir, ixfile, why, NULL);
    }
    /* the rank file of the same number: nothing else a writer writes */
    else if (!cJSON_IsString(file) || strcmp(file->valuestring, rankfile) != 0)
        status =
            ckpt_index_bad_in(L->dir, ixfile, "\"file\" is not the rank file of its number", NULL);
    else if (!cJSON_IsArray(shards))
        status = ckpt_index_bad_in(L->dir, ixfile, "\"shards\" missing", NULL);
    const char *kept_name = NULL;
    const cJSON *list = status == SHARDOPT_OK ? shards : (const cJSON *)NULL;
    cJSON_ArrayForEach(e, list)
    {
        const cJSON *tn = cJSON_GetObjectItemCaseSensitive(e, "tensor");
        struct ck_tensor *t =
            cJSON_IsString(tn) ? (struct ck_tensor *)ckpt_index_find(L, tn->valuestring) : NULL;
        if (t == NULL) {
            status = ckpt_index_bad_in(L->dir, ixfile,
                                       "a shard's \"tensor\" names no tensor of index.json",
                                       cJSON_IsString(tn) ? tn->valuestring : NULL);
            break;
        }
        if (t->seen_writer == w + 1) { /* a writer holds one shard of a tensor */
            status = ckpt_index_bad_in(L->dir, ixfile,
                                       "a tensor has two shards in one writer's index", t->name);
            break;
        }
        t->seen_writer = w + 1;
        struct ck_shard sh;
        memset(&sh, 0, sizeof sh);
        status = ckpt_shard_parse(L->dir, ixfile, t, t->shape + (3 - t->ndim), e, 0, &sh);
        struct plan_box o;
        const int k = t->need - 1;
        const int64_t vol =
            status == SHARDOPT_OK && k >= 0 ? box_overlap(&sh.box, &need[k].box, &o) : 0;
        if (vol > 0) {
            if (kept_name == NULL) { /* the rank file's name, once per writer */
                if (L->nfiles == L->files_cap) {
                    const int cap = L->files_cap ? 2 * L->files_cap : 16;
                    char **n = mem_realloc(L->files, sizeof(*n) * (size_t)cap);
                    if (n == NULL)
                        status = log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                                          "load: %s/%s: out of memory allocating %zu bytes for "
                                          "the file names",
                                          L->dir, ixfile, sizeof(*n) * (size_t)cap);
                    else
                        L->files = n, L->files_cap = cap;
                }
                char *copy = status == SHARDOPT_OK ? mem_strdup(rankfile) : NULL;
                if (status == SHARDOPT_OK && copy == NULL)
                    status = log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                                      "load: %s/%s: out of memory allocating %zu bytes for a file "
                                      "name",
                                      L->dir, ixfile, strlen(rankfile) + 1);
                if (copy != NULL)
                    kept_name = L->files[L->nfiles++] = copy;
            }
            sh.file = kept_name;
            covered[k] += vol;
            int64_t want = 1;
            for (int d = 0; d < 3; d++)
                want *= need[k].box.len[d];
            if (covered[k] > want) /* a valid checkpoint's shards never overlap */
                status = ckpt_index_bad_in(
                    L->dir, ixfile,
                    "the shards overlap (they must tile the tensor exactly): more than this "
                    "rank's part is covered",
                    t->name);
            else if (covered[k] == want)
                (*left)--;
            if (status == SHARDOPT_OK)
                status = shard_keep(L, ixfile, t, &sh);
        }
        free(sh.blocks);
        if (status != SHARDOPT_OK)
            break;
    }
    cJSON_Delete(root);
    return status;
}

static int need_covered(const struct ck_need *n, int64_t covered)
{
    return covered == n->box.len[0] * n->box.len[1] * n->box.len[2];
}

/* Writer w's index, once: read, checked, its overlapping shards kept. */
static shardopt_status_t writer_visit(struct ck_index *L, int w, unsigned char *done,
                                      const struct ck_need *need, int64_t *covered, int *left,
                                      ck_writer_read_fn rd, void *ctx)
{
    if (done[w])
        return SHARDOPT_OK;
    done[w] = 1;
    char *text = NULL;
    size_t len = 0;
    shardopt_status_t status = rd(ctx, L->dir, w, &text, &len);
    if (status == SHARDOPT_OK)
        status = writer_parse(L, w, text, len, need, covered, left);
    free(text);
    L->writers_read++;
    return status;
}

/* torch.chunk's piece of n over `parts` that holds index i: ceil-sized pieces */
static int64_t chunk_of(int64_t n, int64_t parts, int64_t i)
{
    const int64_t c = (n + parts - 1) / parts;
    return c > 0 ? i / c : 0;
}

#define CK_GUESS_MAX 64

/* The writers that held need n's part of t had the saving world sharded it as n says (dense:
 * torch.chunk along n->dim over the dense group, writer = dense rank; expert stack: E / ep experts
 * per EP rank, then chunks along n->dim over the expert group; dense rank = expert-group rank x
 * ep + EP rank, as sharding/mesh.h numbers them). Only a first guess: the caller reads them
 * and checks what they hold. At most CK_GUESS_MAX. */
static int writers_guess(const struct ck_index *L, const struct ck_tensor *t,
                         const struct ck_need *n, int *ws)
{
    const int W = L->writers, dim = n->dim >= 0 && n->dim < 3 ? n->dim : 0;
    const int64_t lo = n->box.lo[dim], hi = lo + n->box.len[dim] - 1;
    int k = 0;
    if (!n->expert) {
        for (int64_t w = chunk_of(t->shape[dim], W, lo);
             w <= chunk_of(t->shape[dim], W, hi) && w < W && k < CK_GUESS_MAX; w++)
            ws[k++] = (int)w;
        return k;
    }
    const int ep = L->ep, xs = W / L->ep;
    const int64_t per = t->shape[0] / ep; /* experts per EP rank */
    if (per <= 0 || xs <= 0 || dim == 0)  /* chunks of the EP rank's own experts: not guessed */
        return 0;
    for (int64_t e = n->box.lo[0] / per;
         e <= (n->box.lo[0] + n->box.len[0] - 1) / per && e < ep && k < CK_GUESS_MAX; e++)
        for (int64_t x = chunk_of(t->shape[dim], xs, lo);
             x <= chunk_of(t->shape[dim], xs, hi) && x < xs && k < CK_GUESS_MAX; x++)
            ws[k++] = (int)(x * ep + e);
    return k;
}

shardopt_status_t ckpt_index_select(struct ck_index *L, const struct ck_need *need, int nneed,
                                    int me, int nme, ck_writer_read_fn rd, void *ctx)
{
    if (L->version < CKPT_FORMAT_WRITERS_FIRST)
        return SHARDOPT_OK;
    shardopt_status_t status = SHARDOPT_OK;
    int left = 0, most = 0;
    int64_t *covered = mem_calloc((size_t)nneed + 1, sizeof(*covered));
    if (covered == NULL)
        return log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                        "load: %s: out of memory allocating %zu bytes for what each writer covers",
                        L->dir, ((size_t)nneed + 1) * sizeof(*covered));
    for (int k = 0; k < nneed; k++) {
        struct ck_tensor *t = (struct ck_tensor *)ckpt_index_find(L, need[k].tensor);
        if (t == NULL || need[k].box.len[0] * need[k].box.len[1] * need[k].box.len[2] == 0)
            continue; /* not in the checkpoint (the loader decides), or nothing of it here */
        t->need = k + 1;
        left++;
    }
    const int W = L->writers;
    unsigned char *done = status == SHARDOPT_OK ? mem_calloc((size_t)W + 1, 1) : NULL;
    if (done == NULL) {
        free(covered);
        return log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                        "load: %s: out of memory allocating %zu bytes for the writers read", L->dir,
                        (size_t)W + 1);
    }
    /* writer 0: replicated tensors are only there */
    status = writer_visit(L, 0, done, need, covered, &left, rd, ctx);
    /* the writers a need's part lies in, if the saver sharded it as this rank's trainer does */
    for (int k = 0; left > 0 && status == SHARDOPT_OK && k < nneed; k++) {
        const struct ck_tensor *t = ckpt_index_find(L, need[k].tensor);
        int ws[CK_GUESS_MAX];
        const int n = t != NULL && t->need == k + 1 ? writers_guess(L, t, &need[k], ws) : 0;
        for (int i = 0; i < n && status == SHARDOPT_OK && !need_covered(&need[k], covered[k]); i++)
            status = writer_visit(L, ws[i], done, need, covered, &left, rd, ctx);
    }
    /* then every other writer, outward from this rank's relative position */
    const int w0 = nme > 0 ? (int)((int64_t)me * W / nme) : 0;
    for (int i = 1; left > 0 && status == SHARDOPT_OK && i <= 2 * W; i++) {
        const int w = i & 1 ? w0 + (i + 1) / 2 - 1 : w0 - i / 2;
        if (w >= 0 && w < W)
            status = writer_visit(L, w, done, need, covered, &left, rd, ctx);
    }
    free(done);
    /* the shards kept for each need tile its box: checked before any byte of a rank file is
     * read (a gap is a writer's index missing a record; an overlap was refused as it came) */
    for (int k = 0; status == SHARDOPT_OK && k < nneed; k++) {
        const struct ck_tensor *t = ckpt_index_find(L, need[k].tensor);
        if (t != NULL && t->need == k + 1)
            most = t->nshards > most ? t->nshards : most;
    }
    const size_t cbytes = sizeof(struct ck_corner) * 8 * ((size_t)most + 1);
    struct ck_corner *corners = status == SHARDOPT_OK ? mem_malloc(cbytes) : NULL;
    if (status == SHARDOPT_OK && corners == NULL)
        status = log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                          "load: %s: out of memory allocating %zu bytes to check that the shards "
                          "tile this rank's part",
                          L->dir, cbytes);
    for (int k = 0; status == SHARDOPT_OK && k < nneed; k++) {
        const struct ck_tensor *t = ckpt_index_find(L, need[k].tensor);
        if (t == NULL || t->need != k + 1)
            continue;
        /* the kept shards clipped to the need, in its coordinates, against the need's box */
        struct ck_tensor part = {.name = t->name, .nshards = t->nshards};
        struct ck_shard *clip = mem_calloc((size_t)t->nshards + 1, sizeof(*clip));
        if (clip == NULL) {
            status = log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                              "load: %s: out of memory allocating %zu bytes to check the shards of "
                              "'%s'",
                              L->dir, ((size_t)t->nshards + 1) * sizeof(*clip), t->name);
            break;
        }
        for (int d = 0; d < 3; d++)
            part.shape[d] = need[k].box.len[d];
        for (int s = 0; s < t->nshards; s++) {
            box_overlap(&t->shards[s].box, &need[k].box, &clip[s].box);
            for (int d = 0; d < 3; d++)
                clip[s].box.lo[d] -= need[k].box.lo[d];
        }
        part.shards = clip;
        if (covered[k] != part.shape[0] * part.shape[1] * part.shape[2] ||
            !ckpt_shards_tile(&part, corners))
            status =
                ckpt_index_bad_in(L->dir, "rank-*.index.json",
                                  covered[k] < part.shape[0] * part.shape[1] * part.shape[2]
                                      ? "the shards leave part of the tensor uncovered (they "
                                        "must tile it exactly): this rank's part is not covered "
                                        "whole"
                                      : ckpt_tiling_problem(&part),
                                  t->name);
        free(clip);
    }
    free(corners);
    free(covered);
    return status;
}

shardopt_status_t ckpt_writer_index_check(const char *index_text, size_t index_len,
                                          const char *text, size_t len)
{
    struct ck_index L;
    int left = 0;
    memset(&L, 0, sizeof L);
    snprintf(L.dir, sizeof L.dir, "(index text)");
    shardopt_status_t status = ckpt_index_parse(&L, index_text, index_len, 1, 1);
    if (status != SHARDOPT_OK || L.version < CKPT_FORMAT_WRITERS_FIRST)
        status = SHARDOPT_ERR_INVALID_ARGUMENT;
    else /* no needs: every record is checked, none kept */
        status = writer_parse(&L, 0, text, len, NULL, NULL, &left);
    ckpt_index_free(&L);
    return status;
}

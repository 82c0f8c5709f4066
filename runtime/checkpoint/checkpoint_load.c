/* shardopt_load: follow DIR/latest (or take a step directory), read the index (checkpoint_index.c),
 * and fill every rank's state from the shards that overlap it, reading only the blocks it needs and
 * checking each block's CRC32C. Everything lands in a staging copy first; the state changes only
 * when every rank succeeded, so a refused checkpoint leaves memory as it was on every rank. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/fault.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/mem_writable.h"
#include "base/status.h"
#include "runtime/checkpoint/checkpoint_index.h"
#include "runtime/checkpoint/checkpoint_load_report.h"
#include "runtime/checkpoint/checkpoint_shard_read.h"
#include "runtime/checkpoint/safetensors.h"
#include "runtime/comm/comm_wait.h"
#include "sharding/reshard.h"

struct ck_load {
    struct ck_index ix;     /* what index.json says */
    struct ck_reader rd;    /* the shard files opened, the read chunk */
    unsigned char *staging; /* the new state, in the arena's kind of memory */
    unsigned char *fill;    /* what rank_fill writes: staging, or its host copy (device state) */
    const unsigned char *current; /* the state now, as host memory (load_allow_missing) */
    void *current_copy, *fill_copy;
    uint64_t *steps;     /* per registered param */
    unsigned char *read; /* per registered param: state read from the checkpoint */
    int converted;
    unsigned char *wfill; /* ckpt_weights: the parameters read, host memory, at woff[i] */
    size_t *woff;         /* per registered param */
    unsigned char *wread; /* per registered param: its weight was read */
    const struct state_store *store; /* staging is a buffer of its kind */
    char converted_names[512];
    int kept; /* load_allow_missing: registered tensors the checkpoint lacks (kept as they are) */
    char kept_names[512];
};

/* ---- one rank's part ---- */

static shardopt_status_t rank_fill(shardopt_runtime_t rt, struct ck_load *L)
{
    const int allow_missing = rt->cfg.load_allow_missing, weights = rt->cfg.ckpt_weights;
    if (weights && !L->ix.weights)
        return log_fail(SHARDOPT_ERR_MISMATCH,
                        "load: %s/index.json: ckpt_weights = true and the checkpoint holds no "
                        "weights (saved with ckpt_weights = false): the parameters cannot be "
                        "restored from it (load with ckpt_weights = false for the optimizer state "
                        "alone)",
                        L->ix.dir);
    for (int i = 0; i < rt->nparams; i++) {
        const struct shardopt_param *p = rt->params[i];
        struct ckpt_kind k[3];
        const int nk = ckpt_tensors(rt, p, weights, k);
        int64_t shape[3];
        struct plan_box mine;
        char name[1100];
        ckpt_box3(&p->layout, shape, &mine);
        L->steps[i] = p->step;
        for (int j = 0; j < nk; j++) {
            const int is_weight = k[j].suffix == NULL;
            ckpt_tensor_name(p, k[j].suffix, name, sizeof name);
            const struct ck_tensor *t = ckpt_index_find(&L->ix, name);
            if (t != NULL && t->is_weight != is_weight)
                t = NULL; /* "x.momentum" the weight of another parameter: not x's state */
            if (t == NULL) {
                if (allow_missing) { /* kept as it is, named in rank 0's warning (renamed?) */
                    ckpt_names_add(L->kept_names, sizeof L->kept_names, &L->kept, name);
                    if (!is_weight) /* its current state; a weight is left unwritten */
                        memcpy(L->fill + k[j].offset, L->current + k[j].offset,
                               (size_t)p->layout.local_numel * kdtype_size(k[j].dtype));
                    continue;
                }
                return ckpt_load_missing(&L->ix, p, name, is_weight);
            }
            if (memcmp(t->shape, shape, sizeof shape) != 0) {
                char saved[96], registered[96]; /* as each was given: not padded to 3 dims */
                return log_fail(
                    SHARDOPT_ERR_MISMATCH,
                    "load: %s/index.json: tensor '%s' has shape %s in the checkpoint, "
                    "the registered parameter %s",
                    L->ix.dir, name, ckpt_shape_text(saved, sizeof saved, t->shape, t->ndim),
                    ckpt_shape_text(registered, sizeof registered, shape, p->layout.ndim));
            }
            if (t->dtype != k[j].dtype && L->converted++ < 8) {
                size_t o = strlen(L->converted_names);
                snprintf(L->converted_names + o, sizeof L->converted_names - o,
                         "%s%.120s%s (%s -> %s)", o ? ", " : "", name, is_weight ? " (weight)" : "",
                         ckpt_dtype_name(t->dtype), ckpt_dtype_name(k[j].dtype));
            }
            int64_t copied = 0;
            unsigned char *dst = is_weight ? L->wfill + L->woff[i] : L->fill + k[j].offset;
            *(is_weight ? &L->wread[i] : &L->read[i]) = 1;
            for (int s = 0; s < t->nshards; s++) {
                shardopt_status_t status = ckpt_shard_read(&L->rd, L->ix.dir, t, &t->shards[s],
                                                           &mine, dst, k[j].dtype, &copied);
                if (status != SHARDOPT_OK)
                    return status;
            }
            if (copied != p->layout.local_numel)
                return log_fail(SHARDOPT_ERR_CORRUPT,
                                "load: %s/index.json: tensor '%s': the shards cover %lld of the "
                                "%lld elements this rank needs",
                                L->ix.dir, name, (long long)copied,
                                (long long)p->layout.local_numel);
            const shardopt_status_t vs = ckpt_load_values_check(L->ix.dir, name, k[j].suffix, dst,
                                                                k[j].dtype, (size_t)copied);
            if (vs != SHARDOPT_OK)
                return vs;
        }
    }
    /* per-parameter step counts, each checked by index_params: a parameter whose state was read
     * takes its record's; one kept (load_allow_missing) keeps its own unless it has a record,
     * capped at the checkpoint's step (the step the load resumes at) */
    for (int i = 0; i < rt->nparams; i++) {
        const struct ck_param *rec = ckpt_index_param(&L->ix, rt->params[i]->name);
        if (rec != NULL)
            L->steps[i] = rec->step;
        else if (!L->read[i] && L->steps[i] > L->ix.step)
            L->steps[i] = L->ix.step;
        else if (L->read[i])
            return log_fail(SHARDOPT_ERR_CORRUPT,
                            "load: %s/index.json: parameter '%s' has state in the checkpoint but "
                            "no record in \"params\" (its step count)",
                            L->ix.dir, rt->params[i]->name);
    }
    return SHARDOPT_OK;
}

static void load_free(struct ck_load *L)
{
    ckpt_reader_free(&L->rd);
    free(L->read);
    if (L->staging != NULL)
        state_store_buffer_free(L->store, L->staging);
    free(L->current_copy);
    free(L->fill_copy);
    free(L->steps);
    free(L->wfill);
    free(L->woff);
    free(L->wread);
    ckpt_index_free(&L->ix);
}

/* ckpt_weights: host memory for every registered parameter's local shard, filled by rank_fill
 * and written to the parameters only once every rank succeeded. */
static shardopt_status_t weights_staging_alloc(shardopt_runtime_t rt, struct ck_load *L)
{
    size_t total = 0;
    L->woff = mem_calloc((size_t)rt->nparams + 1, sizeof(*L->woff));
    L->wread = L->woff != NULL ? mem_calloc((size_t)rt->nparams + 1, 1) : NULL;
    if (L->wread == NULL)
        return log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                        "load: rank %d: out of memory allocating %zu bytes for the weight table",
                        rt->groups.me.rank, mem_failed_bytes());
    /* each parameter at a 64-byte boundary: a bf16 weight of odd length put the fp32 one after
     * it 2 bytes off (the conversion and the value check stored and read misaligned floats:
     * UBSan, test_xcheck_resume_options_np3 with a bf16 weight beside an fp32 one) */
    for (int i = 0; i < rt->nparams; i++) {
        const struct shardopt_param *p = rt->params[i];
        L->woff[i] = total;
        const size_t bytes =
            (size_t)p->layout.local_numel *
            kdtype_size(p->param_dtype == SHARDOPT_DTYPE_BF16 ? KDT_BF16 : KDT_F32);
        size_t up = 0;
        if (!mem_align_up(bytes, 64, &up) || up > SIZE_MAX - 1 - total)
            return log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                            "load: rank %d: the staging for the parameters (ckpt_weights) "
                            "passes SIZE_MAX bytes at parameter '%s' (%zu bytes)",
                            rt->groups.me.rank, p->name, bytes);
        total += up;
    }
    if ((L->wfill = mem_malloc(total + 1)) == NULL)
        return log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                        "load: rank %d: out of memory allocating %zu bytes of staging for the "
                        "parameters (ckpt_weights)",
                        rt->groups.me.rank, total + 1);
    return SHARDOPT_OK;
}

/* The weights read into the registered parameters: host memory is copied (nothing can fail);
 * device memory is uploaded and waited for, and a failure there is reported (not agreed: the
 * caller agrees) with the parameters possibly part written. */
static shardopt_status_t weights_store(shardopt_runtime_t rt, const struct ck_load *L)
{
    for (int i = 0; i < rt->nparams; i++) {
        const struct shardopt_param *p = rt->params[i];
        const size_t bytes =
            (size_t)p->layout.local_numel *
            kdtype_size(p->param_dtype == SHARDOPT_DTYPE_BF16 ? KDT_BF16 : KDT_F32);
        if (!L->wread[i] || bytes == 0)
            continue;
        if (rt_on_device(rt))
            rt->dev->copy(&rt->kctx, p->data, L->wfill + L->woff[i], bytes);
        else
            memcpy(p->data, L->wfill + L->woff[i], bytes);
    }
    if (rt_on_device(rt) && (fault_hit("copy") || rt->dev->sync(&rt->kctx) != 0))
        return log_fail(SHARDOPT_ERR_DEVICE,
                        "load: rank %d: %s: copying the parameters read to the device failed "
                        "(%s): they may be part written (the optimizer state is unchanged); load "
                        "again",
                        rt->groups.me.rank, L->ix.dir, rt->ops->name);
    return SHARDOPT_OK;
}

/* weights_store copies into the parameters' data after every rank agreed: data in a mapping this
 * process cannot write (weights mapped PROT_READ, a read-only numpy array) was a SIGSEGV there.
 * OK, or ERR_INVALID_ARGUMENT naming the first such parameter and this rank; host data only (the
 * device's copy writes device memory). One read of /proc/self/maps for every parameter. */
struct weight_span {
    uintptr_t lo, hi; /* what mem_writable_first_read_only reads first */
    int param;
};

static int weight_span_by_lo(const void *a, const void *b)
{
    const struct weight_span *x = a, *y = b;
    return (x->lo > y->lo) - (x->lo < y->lo);
}

static shardopt_status_t weights_writable(shardopt_runtime_t rt)
{
    struct weight_span *sp = mem_malloc(((size_t)rt->nparams + 1) * sizeof *sp);
    if (sp == NULL)
        return log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                        "load: rank %d: out of memory allocating %zu bytes for the parameters' "
                        "spans",
                        rt->groups.me.rank, ((size_t)rt->nparams + 1) * sizeof *sp);
    int n = 0;
    for (int i = 0; i < rt->nparams; i++) {
        const struct shardopt_param *p = rt->params[i];
        const size_t bytes = (size_t)p->layout.local_numel * kdtype_size(p->param_dtype);
        if (bytes > 0 && p->data != NULL) {
            sp[n].lo = (uintptr_t)p->data;
            sp[n].hi = sp[n].lo + bytes;
            sp[n++].param = i;
        }
    }
    /* in address order, as mem_writable_first_read_only walks them */
    qsort(sp, (size_t)n, sizeof *sp, weight_span_by_lo);
    char perms[8] = "none", path[256] = "no mapping";
    const int bad = mem_writable_first_read_only(sp, n, sizeof *sp, perms, path, sizeof path);
    shardopt_status_t st = SHARDOPT_OK;
    if (bad >= 0)
        st = log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                      "load: rank %d: the data of parameter '%s' [%p, +%zu bytes) lies in memory "
                      "this process cannot write (%s, %s): ckpt_weights = true writes the "
                      "parameters read into it; pass writable memory (or load with ckpt_weights "
                      "= false); nothing was loaded",
                      rt->groups.me.rank, rt->params[sp[bad].param]->name, (void *)sp[bad].lo,
                      (size_t)(sp[bad].hi - sp[bad].lo), perms, path);
    free(sp);
    return st;
}

/* Version 4: the shard records of the parts this rank holds, from the writers' indexes that
 * have them (checkpoint_writer_index.c). A tensor the checkpoint lacks, or holds in another shape,
 * or as the other kind (a weight for a state tensor), is rank_fill's to refuse or keep: no need. */
static shardopt_status_t shards_select(shardopt_runtime_t rt, struct ck_index *ix)
{
    if (ix->version < CKPT_FORMAT_WRITERS_FIRST)
        return SHARDOPT_OK;
    const int weights = rt->cfg.ckpt_weights;
    struct ck_need *need = mem_calloc((size_t)(3 * rt->nparams + 1), sizeof(*need));
    char(*names)[1100] =
        need != NULL ? mem_calloc((size_t)(3 * rt->nparams + 1), sizeof(*names)) : NULL;
    if (names == NULL) {
        free(need);
        return log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                        "load: rank %d: out of memory allocating %zu bytes for the tensor names",
                        rt->groups.me.rank, (size_t)(3 * rt->nparams + 1) * sizeof(*names));
    }
    int n = 0;
    for (int i = 0; i < rt->nparams; i++) {
        const struct shardopt_param *p = rt->params[i];
        struct ckpt_kind k[3];
        const int nk = ckpt_tensors(rt, p, weights, k);
        int64_t shape[3];
        struct plan_box mine;
        ckpt_box3(&p->layout, shape, &mine);
        for (int j = 0; j < nk; j++) {
            ckpt_tensor_name(p, k[j].suffix, names[n], sizeof names[n]);
            const struct ck_tensor *t = ckpt_index_find(ix, names[n]);
            if (t == NULL || t->is_weight != (k[j].suffix == NULL) ||
                memcmp(t->shape, shape, sizeof shape) != 0 || p->layout.local_numel == 0)
                continue;
            need[n].tensor = names[n];
            need[n].box = mine;
            need[n].dim = p->layout.shard_dim + (3 - p->layout.ndim);
            need[n].expert = p->placement == SHARDOPT_PLACEMENT_EXPERT;
            n++;
        }
    }
    const shardopt_status_t status = ckpt_index_select(
        ix, need, n, rt->groups.me.d, rt->groups.mesh.dense, ckpt_index_writer_read, NULL);
    free(names);
    free(need);
    return status;
}

shardopt_status_t ckpt_load_run(shardopt_runtime_t rt, const char *dir)
{
    struct ck_load L;
    shardopt_status_t status = SHARDOPT_OK;
    char *text = NULL;
    size_t len0 = 0;
    int verified = 0;
    long long head[2] = {0, 0}; /* the text's length, and whether its integrity record matched */

    if (rt == NULL)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "load: NULL runtime");
    comm_phase("load", -1);
    /* a refusal of this rank alone joins the opening agreement: the others would wait in it */
    status =
        rt_open_call(rt, "load",
                     dir == NULL      ? log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "load: NULL dir")
                     : !rt->committed ? log_fail(SHARDOPT_ERR_STATE, "load: runtime not committed")
                                      : SHARDOPT_OK); /* its uploads to init's device */
    if (status != SHARDOPT_OK)
        return status;
    memset(&L, 0, sizeof L);
    L.store = &rt->store;
    if (rt->groups.me.rank == 0) { /* only rank 0's dir is read: only it is checked */
        status = ckpt_dir_check("", dir);
        if (status == SHARDOPT_OK)
            status = ckpt_index_read(dir, L.ix.dir, sizeof L.ix.dir, &text, &len0, &verified);
        head[0] = (long long)len0;
        head[1] = verified;
    }
    status = ckpt_agree(rt, status, "load");
    if (status != SHARDOPT_OK) {
        free(text);
        return status;
    }
    groups_bcast(&rt->groups, L.ix.dir, sizeof L.ix.dir, MPI_CHAR);
    groups_bcast(&rt->groups, head, 2, MPI_LONG_LONG);
    const long long text_len = head[0];
    if (rt->groups.me.rank != 0)
        text = mem_malloc((size_t)text_len + 1);
    status = text != NULL ? SHARDOPT_OK
                          : log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                                     "load: rank %d: out of memory allocating %lld bytes for the "
                                     "index text",
                                     rt->groups.me.rank, text_len + 1);
    status = ckpt_agree(rt, status, "load");
    if (status != SHARDOPT_OK) {
        free(text);
        return status;
    }
    groups_bcast(&rt->groups, text, (int)text_len + 1, MPI_CHAR);

    status = ckpt_index_parse(&L.ix, text, (size_t)text_len, (int)head[1], rt->groups.me.rank != 0);
    if (status == SHARDOPT_OK)
        status = shards_select(rt, &L.ix);
    /* weights_store copies into the parameters' data after every rank agreed: data in a
     * read-only mapping is refused now, before anything is read */
    if (status == SHARDOPT_OK && rt->cfg.ckpt_weights && !rt_on_device(rt))
        status = weights_writable(rt);
    status = ckpt_memory_check(rt, status); /* collective: every rank */
    if (status == SHARDOPT_OK) {
        /* the same allocator as the state: on success it becomes the state */
        void *staging = NULL;
        const shardopt_status_t st = state_store_buffer_alloc(&rt->store, &staging);
        int nf = 0;
        for (int i = 0; i < L.ix.nt; i++)
            nf += L.ix.t[i].nshards;
        const size_t steps_bytes = ((size_t)rt->nparams + 1) * sizeof(uint64_t);
        const size_t files_bytes = ((size_t)nf + 1) * sizeof(*L.rd.files);
        L.staging = staging;
        if (st != SHARDOPT_OK)
            status = log_fail_context(st, "load: rank %d: staging copy", rt->groups.me.rank);
        else if ((L.steps = mem_calloc((size_t)rt->nparams + 1, sizeof(uint64_t))) == NULL ||
                 (L.read = mem_calloc((size_t)rt->nparams + 1, 1)) == NULL)
            status = log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                              "load: rank %d: out of memory allocating %zu bytes for step counts",
                              rt->groups.me.rank,
                              L.steps == NULL ? steps_bytes : (size_t)rt->nparams + 1);
        else if ((L.rd.chunk = mem_malloc(CKPT_CHUNK)) == NULL)
            status = log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                              "load: rank %d: out of memory allocating %zu bytes for a read chunk",
                              rt->groups.me.rank, (size_t)CKPT_CHUNK);
        else if ((L.rd.files = mem_calloc((size_t)nf + 1, sizeof(*L.rd.files))) == NULL)
            status =
                log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                         "load: rank %d: out of memory allocating %zu bytes for the file table",
                         rt->groups.me.rank, files_bytes);
        else if (rt->cfg.ckpt_weights)
            status = weights_staging_alloc(rt, &L);
    }
    if (status == SHARDOPT_OK) {
        /* device state: files are read into host memory, then go up in one copy */
        L.fill = L.staging;
        /* out of memory for the host copy, or the device failed: the store says which */
        status = state_store_host_view(&rt->store, &rt->kctx, state_store_ptr(&rt->store, 0),
                                       &L.current, &L.current_copy);
        if (status != SHARDOPT_OK)
            status = log_fail_context(status, "load: rank %d", rt->groups.me.rank);
        else if (state_store_on_device(&rt->store) &&
                 (L.fill = L.fill_copy = mem_malloc(rt->store.bytes ? rt->store.bytes : 1)) == NULL)
            status = log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                              "load: rank %d: out of memory allocating %zu bytes of host staging",
                              rt->groups.me.rank, rt->store.bytes ? rt->store.bytes : 1);
    }
    if (status == SHARDOPT_OK) {
        /* every element of every tensor is covered once (ckpt_index_parse proved the tiling), and
         * what lies between tensors (alignment) is zero, as in a fresh arena: nothing of the
         * staging memory's previous contents can become state */
        memset(L.fill, 0, rt->store.bytes);
        status = rank_fill(rt, &L);
    }
    if (status == SHARDOPT_OK && L.fill != L.staging) {
        status = state_store_upload(&rt->store, &rt->kctx, L.staging, L.fill);
        if (status != SHARDOPT_OK)
            status = log_fail_context(status, "load: rank %d", rt->groups.me.rank);
    }
    status = ckpt_agree(rt, status, "load");
    /* every rank has everything: the parameters are written, then the state swapped in */
    if (status == SHARDOPT_OK && rt->cfg.ckpt_weights && weights_store(rt, &L) != SHARDOPT_OK)
        status = ckpt_agree(rt, SHARDOPT_ERR_DEVICE, "load");
    else if (status == SHARDOPT_OK && rt->cfg.ckpt_weights && rt_on_device(rt))
        status = ckpt_agree(rt, SHARDOPT_OK, "load"); /* another rank's copies may have failed */
    if (status == SHARDOPT_OK) {
        state_store_swap(&rt->store, (void **)&L.staging); /* the old state is freed below */
        for (int i = 0; i < rt->nparams; i++)
            rt->params[i]->step = L.steps[i];
        rt->counters.steps = L.ix.step;
        if (L.converted && rt->groups.me.rank == 0)
            log_warn("load: %s: %d tensor(s) converted to the configured (state) or registered "
                     "(weight) dtype: %s%s",
                     L.ix.dir, L.converted, L.converted_names, L.converted > 8 ? ", ..." : "");
        ckpt_load_report_unmatched(rt, &L.ix, L.kept, L.kept_names); /* logs on rank 0 */
        if (rt->groups.me.rank == 0) {
            log_info("load: %s (step %llu)", L.ix.dir, (unsigned long long)L.ix.step);
        }
    }
    load_free(&L);
    free(text);
    return status;
}

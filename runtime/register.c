/* Registration: validate a parameter description, decide its algorithm, keep a copy. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/mem.h"
#include "base/status.h"
#include "kernels/rng.h"
#include "runtime/checkpoint/safetensors.h"
#include "runtime/classify.h"
#include "runtime/live.h"
#include "runtime/runtime.h"

/* Oldest descriptor layout we accept (version 1 is current). */
#define DESC_V1_SIZE (offsetof(shardopt_param_desc_t, wd_mult) + sizeof(double))
/* the longest state suffix a checkpoint appends to a parameter's name is ".exp_avg_sq" */
#define REGISTER_NAME_MAX (ST_NAME_MAX - (int)sizeof(".exp_avg_sq") + 1)

/* Newton-Schulz hands a matrix's sides to BLAS and cuBLAS as int (rows, columns, leading
 * dimensions): a side past 2^31 - 1 (a [1, 2^31 + 64] matrix, which commit took) wraps to a
 * negative size there, and the step's Newton-Schulz would be BLAS's parameter error, not the
 * update. */
static shardopt_status_t muon_sides_check(const shardopt_param_desc_t *d)
{
    const int64_t rows = d->shape[d->ndim - 2], cols = d->shape[d->ndim - 1];
    if (rows <= INT_MAX && cols <= INT_MAX)
        return SHARDOPT_OK;
    return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                    "register '%s': algo = %s gives Muon a %lld x %lld matrix: each side must be "
                    "at most 2^31 - 1 (Newton-Schulz's BLAS and cuBLAS take int sizes); register "
                    "it with algo = adamw",
                    d->name, d->algo == SHARDOPT_ALGO_AUTO ? "auto" : "muon", (long long)rows,
                    (long long)cols);
}

static shardopt_status_t algo_resolve(const shardopt_runtime_t rt, const shardopt_param_desc_t *d,
                                      shardopt_algo_t *algo_p)
{
    switch (d->algo) {
    case SHARDOPT_ALGO_AUTO:
        *algo_p = classify_auto_is_muon(d->name, d->ndim, d->shape, rt->cfg.adamw_patterns)
                      ? SHARDOPT_ALGO_MUON
                      : SHARDOPT_ALGO_ADAMW;
        return *algo_p == SHARDOPT_ALGO_MUON ? muon_sides_check(d) : SHARDOPT_OK;
    case SHARDOPT_ALGO_MUON:
        if (d->ndim < 2)
            return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                            "register '%s': algo = muon needs a 2-D matrix or 3-D expert stack, "
                            "got ndim = %d",
                            d->name, d->ndim);
        *algo_p = SHARDOPT_ALGO_MUON;
        return muon_sides_check(d);
    case SHARDOPT_ALGO_ADAMW: *algo_p = SHARDOPT_ALGO_ADAMW; return SHARDOPT_OK;
    }
    return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                    "register '%s': algo = %d: accepted auto (0), muon (1), adamw (2)", d->name,
                    (int)d->algo);
}

static int dtype_valid(shardopt_dtype_t t)
{
    return t == SHARDOPT_DTYPE_FP32 || t == SHARDOPT_DTYPE_BF16;
}

/* The dim-0 window a shard is taken in (an expert stack's experts of this EP rank), and the size
 * of the group the shards tile. */
static shardopt_status_t shard_window(const shardopt_runtime_t rt, const shardopt_param_desc_t *d,
                                      const char *what, int64_t *lo, int64_t *len, int *group)
{
    const struct groups *g = &rt->groups;

    *lo = 0;
    *len = d->shape[0];
    switch (d->placement) {
    case SHARDOPT_PLACEMENT_DENSE: *group = g->mesh.dense; break;
    case SHARDOPT_PLACEMENT_REPLICATED: *group = 1; break;
    case SHARDOPT_PLACEMENT_EXPERT:
        if (d->shape[0] <= 0 || d->shape[0] % g->mesh.ep != 0)
            return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                            "%s '%s': %lld experts cannot be split over ep %d: the expert "
                            "count must be a multiple of ep",
                            what, d->name != NULL ? d->name : "(unnamed)", (long long)d->shape[0],
                            g->mesh.ep);
        *len = d->shape[0] / g->mesh.ep;
        *lo = g->me.ep_rank * *len;
        *group = mesh_xs_size(&g->mesh);
        break;
    }
    return SHARDOPT_OK;
}

/* A data or grad pointer not aligned to its element size: the kernels read and write whole
 * elements through it (undefined in C; on a GPU a misaligned access is a sticky error that ends
 * the process's CUDA context), so it is refused where it is given. Returns "data", "grad" or
 * NULL (both fine, or NULL). */
static const char *misaligned(const void *data, shardopt_dtype_t ddt, const void *grad,
                              shardopt_dtype_t gdt)
{
    if (data != NULL && (uintptr_t)data % kdtype_size(ddt) != 0)
        return "data";
    if (grad != NULL && (uintptr_t)grad % kdtype_size(gdt) != 0)
        return "grad";
    return NULL;
}

static shardopt_status_t misaligned_fail(const char *call, int entry, int n, const char *name,
                                         const char *which, const void *ptr, shardopt_dtype_t dt)
{
    char who[400];
    if (entry >= 0)
        snprintf(who, sizeof who, "%s: entry %d of %d ('%s')", call, entry, n, name);
    else
        snprintf(who, sizeof who, "%s '%s'", call, name);
    return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                    "%s: %s %p is not aligned to its %zu-byte %s elements: pass memory aligned to "
                    "the element size%s",
                    who, which, ptr, kdtype_size(dt), shardopt_dtype_name(dt),
                    entry >= 0 ? "; no pointer was changed" : "");
}

static shardopt_status_t desc_validate(const shardopt_runtime_t rt, const shardopt_param_desc_t *d,
                                       struct layout *layout)
{
    shardopt_status_t status;
    char err[256];
    const char *n = d->name;
    int64_t win_lo, win_len;
    int group = 1;

    if (d->version < 1 || d->version > SHARDOPT_PARAM_DESC_VERSION || d->size < DESC_V1_SIZE)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "register: descriptor version %u / size %zu: initialise it with "
                        "SHARDOPT_PARAM_DESC_INIT",
                        d->version, d->size);
    if (n == NULL || n[0] == '\0')
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "register: name is %s",
                        n == NULL ? "NULL" : "empty");
    /* a checkpoint stores "<name>.exp_avg_sq" in a safetensors name of at most ST_NAME_MAX
     * bytes: a longer name would save and then not load */
    if (strlen(n) > REGISTER_NAME_MAX)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "register '%.64s...': name of %zu bytes: at most %d (a checkpoint stores "
                        "'<name>.exp_avg_sq' in a safetensors name of at most %d bytes)",
                        n, strlen(n), REGISTER_NAME_MAX, ST_NAME_MAX);
    for (const unsigned char *c = (const unsigned char *)n; *c != '\0'; c++)
        if (*c < 0x20 || *c == 0x7f)
            return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                            "register '%.64s': name has a control character (byte 0x%02x at %td): "
                            "checkpoints refuse them",
                            n, *c, (const char *)c - n);
    /* the reference safetensors reader refuses a header that is not UTF-8: such a name would
     * train for days and then fail to save */
    const long bad = st_utf8_error(n);
    if (bad >= 0)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "register: name is not valid UTF-8 (byte 0x%02x at %ld): checkpoints "
                        "(safetensors) refuse it",
                        (unsigned char)n[bad], bad);
    if (d->ndim > 3)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "register '%s': ndim = %d: tensors of 4 or more dims are not supported; "
                        "register per-layer stacks (2-D matrices or 3-D [E, out, in] expert "
                        "stacks) instead",
                        n, d->ndim);
    if (!dtype_valid(d->param_dtype) || !dtype_valid(d->grad_dtype))
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "register '%s': %s = %d: accepted fp32 (0), bf16 (1)", n,
                        dtype_valid(d->param_dtype) ? "grad_dtype" : "param_dtype",
                        dtype_valid(d->param_dtype) ? (int)d->grad_dtype : (int)d->param_dtype);
    if (d->placement != SHARDOPT_PLACEMENT_DENSE && d->placement != SHARDOPT_PLACEMENT_EXPERT &&
        d->placement != SHARDOPT_PLACEMENT_REPLICATED)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "register '%s': placement = %d: accepted dense, expert, replicated", n,
                        (int)d->placement);
    if (d->placement == SHARDOPT_PLACEMENT_EXPERT && d->ndim != 3)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "register '%s': placement expert needs a 3-D [E, out, in] stack, got "
                        "ndim = %d",
                        n, d->ndim);
    /* a flag: 2 on one rank and 1 on another would register as different parameters */
    if (d->transposed != 0 && d->transposed != 1)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "register '%s': transposed = %d: accepted 0 or 1", n, d->transposed);
    if (d->transposed && d->ndim < 2)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "register '%s': transposed applies to matrices, got ndim = %d", n, d->ndim);
    status = shard_window(rt, d, "register", &win_lo, &win_len, &group);
    if (status != SHARDOPT_OK)
        return status;
    status = layout_init(layout, d->ndim, d->shape, d->shard_dim, d->shard_offset, d->shard_length,
                         win_lo, win_len);
    if (status != SHARDOPT_OK) { /* layout.c's message, logged once with the parameter's name */
        snprintf(err, sizeof err, "%s", shardopt_last_error());
        if (d->placement == SHARDOPT_PLACEMENT_EXPERT && d->shard_dim == 0 && d->ndim == 3)
            return log_fail(status,
                            "register '%s': %s: offsets along dim 0 count from this EP rank's "
                            "first expert (EP rank %d holds experts [%lld, %lld) of %lld: "
                            "register a slice of [0, %lld); shardopt_shard_range computes it)",
                            n, err, rt->groups.me.ep_rank, (long long)win_lo,
                            (long long)(win_lo + win_len), (long long)d->shape[0],
                            (long long)win_len);
        return log_fail(status, "register '%s': %s", n, err);
    }
    /* a shard group of one rank (or a replicated tensor) holds the whole extent */
    int64_t t_lo, t_n;
    layout_tile_range(layout, &t_lo, &t_n);
    if (group == 1 && layout->len[layout->shard_dim] != t_n)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "register '%s': shard [%lld, %lld) of dim %d covers less than its extent "
                        "%lld, but %s",
                        n, (long long)layout->shard_offset,
                        (long long)(layout->shard_offset + layout->shard_length), d->shard_dim,
                        (long long)t_n,
                        d->placement == SHARDOPT_PLACEMENT_REPLICATED
                            ? "a replicated tensor is whole on every rank"
                            : "its shard group has one rank: it must hold the whole tensor");
    if (!(d->lr_mult >= 0 && d->lr_mult < 1e6) || !(d->wd_mult >= 0 && d->wd_mult < 1e6))
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "register '%s': %s = %g: accepted [0, 1e6)",
                        n, d->lr_mult >= 0 && d->lr_mult < 1e6 ? "wd_mult" : "lr_mult",
                        d->lr_mult >= 0 && d->lr_mult < 1e6 ? d->wd_mult : d->lr_mult);
    if (d->data == NULL && layout->local_numel > 0)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "register '%s': data is NULL for a local shard of %lld elements", n,
                        (long long)layout->local_numel);
    const char *unaligned = misaligned(d->data, d->param_dtype, d->grad, d->grad_dtype);
    if (unaligned != NULL)
        return misaligned_fail("register", -1, 0, n, unaligned,
                               unaligned[0] == 'd' ? d->data : d->grad,
                               unaligned[0] == 'd' ? d->param_dtype : d->grad_dtype);
    for (int i = 0; i < rt->nparams; i++)
        if (strcmp(rt->params[i]->name, n) == 0)
            return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                            "register '%s': name already registered (parameter %d)", n, i);
    return SHARDOPT_OK;
}

static shardopt_status_t params_grow(shardopt_runtime_t rt)
{
    if (rt->nparams < rt->params_cap)
        return SHARDOPT_OK;
    int cap = rt->params_cap ? 2 * rt->params_cap : 64;
    void *p = mem_realloc(rt->params, (size_t)cap * sizeof(*rt->params));
    if (p == NULL)
        return log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                        "register: out of memory allocating %zu bytes for the parameter list",
                        (size_t)cap * sizeof(*rt->params));
    rt->params = p;
    rt->params_cap = cap;
    return SHARDOPT_OK;
}

/* Validate and keep one parameter. */
static shardopt_status_t param_add(shardopt_runtime_t rt, const shardopt_param_desc_t *desc,
                                   shardopt_param_t *param_p)
{
    shardopt_status_t status;
    struct shardopt_param *p;
    struct layout layout;
    shardopt_algo_t algo = SHARDOPT_ALGO_AUTO;

    status = desc_validate(rt, desc, &layout);
    if (status != SHARDOPT_OK)
        return status;
    status = algo_resolve(rt, desc, &algo);
    if (status != SHARDOPT_OK)
        return status;
    status = params_grow(rt);
    if (status != SHARDOPT_OK)
        return status;

    p = mem_calloc(1, sizeof(*p));
    if (p == NULL)
        return log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                        "register '%s': out of memory allocating %zu bytes for the parameter",
                        desc->name, sizeof(*p));
    p->name = mem_strdup(desc->name);
    if (p->name == NULL) {
        status = log_fail(SHARDOPT_ERR_OUT_OF_MEMORY,
                          "register '%s': out of memory allocating %zu bytes for its name",
                          desc->name, strlen(desc->name) + 1);
        goto err_free;
    }
    p->rt = rt;
    p->name_hash = rng_name_hash(p->name);
    p->index = rt->nparams;
    p->layout = layout;
    p->param_dtype = desc->param_dtype;
    p->grad_dtype = desc->grad_dtype;
    p->transposed = desc->transposed != 0;
    p->placement = desc->placement;
    p->data = desc->data;
    p->grad = desc->grad;
    p->algo = algo;
    p->lr_mult = desc->lr_mult;
    p->wd_mult = desc->wd_mult;

    rt->params[rt->nparams++] = p;
    *param_p = p;
    return SHARDOPT_OK;

err_free:
    free(p);
    return status;
}

/* Registration is local, commit collective: a failed registration is remembered (the count and
 * the first message) so that commit fails on every rank instead of leaving the others waiting
 * for this one (commit_check.c). Returns status. */
static shardopt_status_t register_failed(shardopt_runtime_t rt, shardopt_status_t status)
{
    if (rt->register_failures++ == 0)
        snprintf(rt->register_error, sizeof rt->register_error, "%s", shardopt_last_error());
    return status;
}

static shardopt_status_t register_run(shardopt_runtime_t rt, const shardopt_param_desc_t *desc,
                                      shardopt_param_t *param_p)
{
    shardopt_status_t status;

    if (rt == NULL || desc == NULL || param_p == NULL)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "register: NULL %s",
                        rt == NULL     ? "runtime"
                        : desc == NULL ? "desc"
                                       : "param_p");
    if (rt->committed)
        return log_fail(SHARDOPT_ERR_STATE, "register '%s': runtime already committed",
                        desc->name != NULL ? desc->name : "(null)");
    status = param_add(rt, desc, param_p);
    return status == SHARDOPT_OK ? status : register_failed(rt, status);
}

static shardopt_status_t set_pointers_run(shardopt_param_t param, void *data, const void *grad)
{
    if (param == NULL)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "param_set_pointers: NULL param");
    if (data == NULL && param->layout.local_numel > 0)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "param_set_pointers '%s': data is NULL for a local shard of %lld elements",
                        param->name, (long long)param->layout.local_numel);
    const char *bad = misaligned(data, param->param_dtype, grad, param->grad_dtype);
    if (bad != NULL)
        return misaligned_fail("param_set_pointers", -1, 0, param->name, bad,
                               bad[0] == 'd' ? data : grad,
                               bad[0] == 'd' ? param->param_dtype : param->grad_dtype);
    param->data = data;
    param->grad = grad;
    return SHARDOPT_OK;
}

static shardopt_status_t params_set_pointers_run(shardopt_runtime_t rt, int n,
                                                 const shardopt_param_t *params, void *const *data,
                                                 const void *const *grad)
{
    if (rt == NULL)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "params_set_pointers: NULL runtime");
    if (n < 0)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "params_set_pointers: n = %d: accepted 0 or more entries", n);
    if (n > 0 && (params == NULL || data == NULL))
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "params_set_pointers: %s is NULL for n = %d entries",
                        params == NULL ? "params" : "data", n);
    /* every entry is checked before any is applied: a trainer that gets a refusal still steps
     * the pointers it had, never a mix of old and new ones */
    const uint64_t epoch = ++rt->set_epoch;
    for (int i = 0; i < n; i++) {
        const struct shardopt_param *p = params[i];
        if (p == NULL)
            return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                            "params_set_pointers: entry %d of %d: NULL param; no pointer was "
                            "changed",
                            i, n);
        if (p->rt != rt)
            return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                            "params_set_pointers: entry %d of %d ('%s'): the parameter was "
                            "registered with %s; no pointer was changed",
                            i, n, p->name,
                            live_has(p->rt) ? "another runtime"
                                            : "a runtime finalized since (its handle must not be "
                                              "used after shardopt_finalize)");
        if (data[i] == NULL && p->layout.local_numel > 0)
            return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                            "params_set_pointers: entry %d of %d ('%s'): data is NULL for a "
                            "local shard of %lld elements; no pointer was changed",
                            i, n, p->name, (long long)p->layout.local_numel);
        const void *gi = grad != NULL ? grad[i] : NULL;
        const char *bad = misaligned(data[i], p->param_dtype, gi, p->grad_dtype);
        if (bad != NULL)
            return misaligned_fail("params_set_pointers", i, n, p->name, bad,
                                   bad[0] == 'd' ? data[i] : gi,
                                   bad[0] == 'd' ? p->param_dtype : p->grad_dtype);
        if (p->set_epoch == epoch)
            return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                            "params_set_pointers: entry %d of %d ('%s'): the same parameter as "
                            "entry %d (give each parameter once); no pointer was changed",
                            i, n, p->name, p->set_entry);
        params[i]->set_epoch = epoch;
        params[i]->set_entry = i;
    }
    for (int i = 0; i < n; i++) {
        params[i]->data = data[i];
        params[i]->grad = grad != NULL ? grad[i] : NULL;
    }
    return SHARDOPT_OK;
}

shardopt_status_t shardopt_param_get_algo(shardopt_param_t param, shardopt_algo_t *algo)
{
    if (param == NULL || algo == NULL)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "param_get_algo: NULL %s",
                        param == NULL ? "param" : "algo");
    const shardopt_status_t live = live_param_check(param, "param_get_algo");
    if (live != SHARDOPT_OK)
        return live;
    *algo = param->algo;
    return SHARDOPT_OK;
}

shardopt_status_t shardopt_shard_range(shardopt_runtime_t rt, const shardopt_param_desc_t *d,
                                       int64_t *offset, int64_t *length, int64_t *global_offset)
{
    if (rt == NULL || d == NULL || offset == NULL || length == NULL)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "shard_range: NULL %s",
                        rt == NULL       ? "runtime"
                        : d == NULL      ? "desc"
                        : offset == NULL ? "offset"
                                         : "length");
    if (!live_has(rt)) /* finalized: its memory is not read (it takes no claim: reads only) */
        return live_refuse("shard_range", rt);
    const char *n = d->name != NULL ? d->name : "(unnamed)";
    if (d->version < 1 || d->version > SHARDOPT_PARAM_DESC_VERSION || d->size < DESC_V1_SIZE)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "shard_range: descriptor version %u / size %zu: initialise it with "
                        "SHARDOPT_PARAM_DESC_INIT",
                        d->version, d->size);
    if (d->ndim < 1 || d->ndim > 3)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "shard_range '%s': ndim = %d: accepted 1..3",
                        n, d->ndim);
    for (int i = 0; i < d->ndim; i++)
        if (d->shape[i] < 1)
            return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                            "shard_range '%s': shape[%d] = %lld: every global dim must be >= 1", n,
                            i, (long long)d->shape[i]);
    if (d->shard_dim < 0 || d->shard_dim >= d->ndim)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "shard_range '%s': shard_dim = %d: accepted 0..%d", n, d->shard_dim,
                        d->ndim - 1);
    if (d->placement != SHARDOPT_PLACEMENT_DENSE && d->placement != SHARDOPT_PLACEMENT_EXPERT &&
        d->placement != SHARDOPT_PLACEMENT_REPLICATED)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "shard_range '%s': placement = %d: accepted dense, expert, replicated", n,
                        (int)d->placement);
    if (d->placement == SHARDOPT_PLACEMENT_EXPERT && d->ndim != 3)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "shard_range '%s': placement expert needs a 3-D [E, out, in] stack, got "
                        "ndim = %d",
                        n, d->ndim);
    int64_t win_lo, win_len;
    int group = 1;
    shardopt_status_t status = shard_window(rt, d, "shard_range", &win_lo, &win_len, &group);
    if (status != SHARDOPT_OK)
        return status;
    const struct groups *g = &rt->groups;
    const int64_t extent = d->shard_dim == 0 ? win_len : d->shape[d->shard_dim];
    int64_t lo = 0, len = extent;
    /* torch.chunk (layout_chunk): FSDP2's Shard(dim) slices so, it is what a trainer's own
     * all-gather most often assumes, and commit computes these slices instead of gathering them */
    if (d->placement == SHARDOPT_PLACEMENT_DENSE)
        layout_chunk(extent, g->mesh.dense, g->me.d, &lo, &len);
    else if (d->placement == SHARDOPT_PLACEMENT_EXPERT)
        layout_chunk(extent, group, g->me.xs_rank, &lo, &len);
    *offset = lo;
    *length = len;
    if (global_offset != NULL)
        *global_offset = (d->shard_dim == 0 ? win_lo : 0) + lo;
    return SHARDOPT_OK;
}

/* A binding that refuses a parameter itself (an fp16 array) still has to fail commit on every
 * rank; it poisoned the runtime with a descriptor of ndim 0, and the log then blamed ndim. */
static shardopt_status_t refused_run(shardopt_runtime_t rt, const char *name, const char *reason)
{
    if (name == NULL || reason == NULL)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "register_refused: NULL %s",
                        name == NULL ? "name" : "reason");
    if (rt->committed)
        return log_fail(SHARDOPT_ERR_STATE, "register_refused '%.64s': runtime already committed",
                        name);
    char shown[400];
    return register_failed(rt, log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                                        "register '%.64s': refused by the caller: %s", name,
                                        log_escape(shown, sizeof shown, reason, strlen(reason))));
}

shardopt_status_t shardopt_register_refused(shardopt_runtime_t rt, const char *name,
                                            const char *reason)
{
    const shardopt_status_t claimed = rt_claim(rt, "register_refused");
    if (claimed != SHARDOPT_OK)
        return claimed;
    const shardopt_status_t status = refused_run(rt, name, reason);
    rt_release(rt);
    return status;
}

shardopt_status_t shardopt_register(shardopt_runtime_t rt, const shardopt_param_desc_t *desc,
                                    shardopt_param_t *param_p)
{
    const shardopt_status_t claimed = rt_claim(rt, "register");
    if (claimed != SHARDOPT_OK)
        return claimed;
    const shardopt_status_t status = register_run(rt, desc, param_p);
    rt_release(rt);
    return status;
}

shardopt_status_t shardopt_param_set_pointers(shardopt_param_t param, void *data, const void *grad)
{
    const shardopt_status_t claimed = live_param_claim(param, "param_set_pointers");
    if (claimed != SHARDOPT_OK)
        return claimed;
    struct shardopt_runtime *rt = param != NULL ? param->rt : NULL;
    const shardopt_status_t status = set_pointers_run(param, data, grad);
    rt_release(rt);
    return status;
}

shardopt_status_t shardopt_params_set_pointers(shardopt_runtime_t rt, int n,
                                               const shardopt_param_t *params, void *const *data,
                                               const void *const *grad)
{
    const shardopt_status_t claimed = rt_claim(rt, "params_set_pointers");
    if (claimed != SHARDOPT_OK)
        return claimed;
    const shardopt_status_t status = params_set_pointers_run(rt, n, params, data, grad);
    rt_release(rt);
    return status;
}

/* One parameter's optimizer state and step count read and replaced in place, without a
 * checkpoint (shardopt_param_get_state and friends): what a language binding's state_dict
 * needs, on any file system layout. The state keeps its dtype: nothing is converted here. */
#include <math.h>
#include <string.h>

#include "base/fault.h"
#include "base/mem_writable.h"
#include "base/status.h"
#include "runtime/live.h"
#include "runtime/runtime.h"

/* Step counts shardopt_param_set_step takes: below 2^53, which a checkpoint's index (a JSON
 * number, read as a double) holds exactly; a load takes the same (CKPT_STEP_LIMIT,
 * runtime/checkpoint/checkpoint_index.h) */
#define PARAM_STEP_LIMIT (1ull << 53)

const char *shardopt_state_kind_name(shardopt_state_kind_t v)
{
    static const char *const n[] = {"momentum", "exp_avg", "exp_avg_sq"};
    return (int)v >= 0 && (int)v < 3 ? n[v] : "unknown";
}

/* The state tensor `kind` of p: its offset in the store and dtype, or a refusal naming what p
 * has. call names the entry point. */
static shardopt_status_t state_find(const struct shardopt_param *p, shardopt_state_kind_t kind,
                                    const char *call, size_t *off, shardopt_dtype_t *dtype)
{
    const shardopt_config_t *c = &p->rt->cfg;
    if (!p->rt->committed)
        return log_fail(SHARDOPT_ERR_STATE,
                        "%s '%s': runtime not committed (call shardopt_commit): the state is "
                        "allocated there",
                        call, p->name);
    const int muon = p->algo == SHARDOPT_ALGO_MUON;
    if (muon && kind == SHARDOPT_STATE_MOMENTUM) {
        *off = p->off_momentum;
        *dtype = c->momentum_dtype;
        return SHARDOPT_OK;
    }
    if (!muon && (kind == SHARDOPT_STATE_EXP_AVG || kind == SHARDOPT_STATE_EXP_AVG_SQ)) {
        const int sq = kind == SHARDOPT_STATE_EXP_AVG_SQ;
        *off = sq ? p->off_exp_avg_sq : p->off_exp_avg;
        *dtype = sq ? c->adam_v_dtype : c->adam_state_dtype;
        return SHARDOPT_OK;
    }
    return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "%s '%s': kind = %s (%d): a %s parameter has %s",
                    call, p->name, shardopt_state_kind_name(kind), (int)kind,
                    shardopt_algo_name(p->algo),
                    muon ? "momentum (0)" : "exp_avg (1) and exp_avg_sq (2)");
}

shardopt_status_t shardopt_param_state_info(shardopt_param_t param, shardopt_state_kind_t kind,
                                            shardopt_dtype_t *dtype, int64_t *count)
{
    size_t off = 0;
    shardopt_dtype_t dt = SHARDOPT_DTYPE_FP32;
    if (param == NULL)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "param_state_info: NULL param");
    const shardopt_status_t live = live_param_check(param, "param_state_info");
    if (live != SHARDOPT_OK)
        return live;
    const shardopt_status_t st = state_find(param, kind, "param_state_info", &off, &dt);
    if (st != SHARDOPT_OK)
        return st;
    if (dtype != NULL)
        *dtype = dt;
    if (count != NULL)
        *count = param->layout.local_numel;
    return SHARDOPT_OK;
}

/* Checks shared by get and set: the tensor exists, buf has its dtype and size. */
static shardopt_status_t state_check_buf(const struct shardopt_param *p, shardopt_state_kind_t kind,
                                         const void *buf, size_t bytes, shardopt_dtype_t dtype,
                                         const char *call, void **state)
{
    size_t off = 0;
    shardopt_dtype_t held = SHARDOPT_DTYPE_FP32;
    shardopt_status_t st = state_find(p, kind, call, &off, &held);
    if (st != SHARDOPT_OK)
        return st;
    const char *kname = shardopt_state_kind_name(kind);
    if (dtype != held)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "%s '%s' %s: buffer dtype %s (%d), but the state is held in %s: pass a "
                        "%s buffer (the library converts nothing; convert in the caller)",
                        call, p->name, kname, shardopt_dtype_name(dtype), (int)dtype,
                        shardopt_dtype_name(held), shardopt_dtype_name(held));
    const size_t n = (size_t)p->layout.local_numel, want = n * kdtype_size(held);
    if (bytes != want)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "%s '%s' %s: %zu bytes given, this rank holds %zu %s elements = %zu bytes",
                        call, p->name, kname, bytes, n, shardopt_dtype_name(held), want);
    if (buf == NULL && bytes > 0)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "%s '%s' %s: NULL buffer for %zu bytes",
                        call, p->name, kname, bytes);
    *state = state_store_ptr(&p->rt->store, off);
    return SHARDOPT_OK;
}

/* Copy between the caller's host buffer and the state: through the device's copy where the
 * state is device memory, after the runtime's queued work (a step given a stream may still be
 * writing it; a host store may still be receiving a staging slot's copy-out). */
static shardopt_status_t state_move(struct shardopt_runtime *rt, const struct shardopt_param *p,
                                    void *dst, const void *src, size_t bytes, const char *call)
{
    if (bytes == 0)
        return SHARDOPT_OK;
    shardopt_status_t st = rt_device_enter(rt, call);
    if (st != SHARDOPT_OK)
        return st;
    if (state_store_on_device(&rt->store)) {
        rt->dev->copy(&rt->kctx, dst, src, bytes);
        if (fault_hit("copy") || rt->dev->sync(&rt->kctx) != 0)
            return log_fail(SHARDOPT_ERR_DEVICE,
                            "%s '%s': rank %d: copying %zu bytes %s the "
                            "device failed (%s)",
                            call, p->name, rt->groups.me.rank, bytes,
                            strcmp(call, "param_set_state") == 0 ? "to" : "from", rt->ops->name);
        return SHARDOPT_OK;
    }
    if (rt->dev->sync(&rt->kctx) != 0)
        return log_fail(SHARDOPT_ERR_DEVICE,
                        "%s '%s': rank %d: waiting for the device's copies of the state failed "
                        "(%s)",
                        call, p->name, rt->groups.me.rank, rt->ops->name);
    /* get_state's memcpy into the caller's buffer: a read-only one (a PROT_READ mapping, a
     * read-only numpy array's memory) was a SIGSEGV here */
    char perms[8], path[256];
    if (strcmp(call, "param_get_state") == 0 &&
        mem_writable_refused(dst, bytes, perms, path, sizeof path))
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "%s '%s': rank %d: buf = %p (+%zu bytes) lies in memory this process "
                        "cannot write (%s, %s): pass a writable buffer; nothing was copied",
                        call, p->name, rt->groups.me.rank, dst, bytes, perms, path);
    memcpy(dst, src, bytes);
    return SHARDOPT_OK;
}

static shardopt_status_t get_state_run(shardopt_param_t param, shardopt_state_kind_t kind,
                                       void *buf, size_t bytes, shardopt_dtype_t dtype)
{
    void *state = NULL;
    if (param == NULL)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "param_get_state: NULL param");
    shardopt_status_t st =
        state_check_buf(param, kind, buf, bytes, dtype, "param_get_state", &state);
    return st != SHARDOPT_OK ? st
                             : state_move(param->rt, param, buf, state, bytes, "param_get_state");
}

/* Values no step can start from: NaN or Inf in any state (the next update spreads it over the
 * parameter, a Muon momentum over the whole matrix through Newton-Schulz), and a negative second
 * moment (AdamW divides by its square root). Before, each was taken and the next step returned OK
 * with every weight of the tensor NaN. */
static shardopt_status_t state_values_check(const struct shardopt_param *p,
                                            shardopt_state_kind_t kind, const void *buf,
                                            shardopt_dtype_t dtype)
{
    const int sq = kind == SHARDOPT_STATE_EXP_AVG_SQ;
    for (size_t i = 0; i < (size_t)p->layout.local_numel; i++) {
        const float v = kload(buf, (int)dtype, i);
        if (isfinite(v) && !(sq && v < 0))
            continue;
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "param_set_state '%s' %s: element %zu is %g: accepted finite values%s; "
                        "the state is unchanged",
                        p->name, shardopt_state_kind_name(kind), i, (double)v,
                        sq ? " >= 0 (AdamW divides by the square root of exp_avg_sq)" : "");
    }
    return SHARDOPT_OK;
}

static shardopt_status_t set_state_run(shardopt_param_t param, shardopt_state_kind_t kind,
                                       const void *buf, size_t bytes, shardopt_dtype_t dtype)
{
    void *state = NULL;
    if (param == NULL)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "param_set_state: NULL param");
    shardopt_status_t st =
        state_check_buf(param, kind, buf, bytes, dtype, "param_set_state", &state);
    if (st == SHARDOPT_OK)
        st = state_values_check(param, kind, buf, dtype);
    return st != SHARDOPT_OK ? st
                             : state_move(param->rt, param, state, buf, bytes, "param_set_state");
}

shardopt_status_t shardopt_param_get_step(shardopt_param_t param, uint64_t *step)
{
    if (param == NULL || step == NULL)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "param_get_step: NULL %s",
                        param == NULL ? "param" : "step");
    const shardopt_status_t live = live_param_check(param, "param_get_step");
    if (live != SHARDOPT_OK)
        return live;
    if (!param->rt->committed)
        return log_fail(SHARDOPT_ERR_STATE,
                        "param_get_step '%s': runtime not committed (call shardopt_commit)",
                        param->name);
    *step = param->step;
    return SHARDOPT_OK;
}

static shardopt_status_t set_step_run(shardopt_param_t param, uint64_t step)
{
    if (param == NULL)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "param_set_step: NULL param");
    if (!param->rt->committed)
        return log_fail(SHARDOPT_ERR_STATE,
                        "param_set_step '%s': runtime not committed (call shardopt_commit)",
                        param->name);
    /* UINT64_MAX wrapped to 0 at the next step (AdamW's bias correction 1 - beta^0 then
     * divides by 0), and a count of 2^53 or more did not come back from a checkpoint exactly */
    if (step >= PARAM_STEP_LIMIT)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                        "param_set_step '%s': step = %llu: accepted [0, 2^53) (what a "
                        "checkpoint's index holds exactly)",
                        param->name, (unsigned long long)step);
    param->step = step;
    return SHARDOPT_OK;
}

shardopt_status_t shardopt_param_get_state(shardopt_param_t param, shardopt_state_kind_t kind,
                                           void *buf, size_t bytes, shardopt_dtype_t dtype)
{
    const shardopt_status_t claimed = live_param_claim(param, "param_get_state");
    if (claimed != SHARDOPT_OK)
        return claimed;
    struct shardopt_runtime *rt = param != NULL ? param->rt : NULL;
    const shardopt_status_t status = get_state_run(param, kind, buf, bytes, dtype);
    rt_release(rt);
    return status;
}

shardopt_status_t shardopt_param_set_state(shardopt_param_t param, shardopt_state_kind_t kind,
                                           const void *buf, size_t bytes, shardopt_dtype_t dtype)
{
    const shardopt_status_t claimed = live_param_claim(param, "param_set_state");
    if (claimed != SHARDOPT_OK)
        return claimed;
    struct shardopt_runtime *rt = param != NULL ? param->rt : NULL;
    const shardopt_status_t status = set_state_run(param, kind, buf, bytes, dtype);
    rt_release(rt);
    return status;
}

shardopt_status_t shardopt_param_set_step(shardopt_param_t param, uint64_t step)
{
    const shardopt_status_t claimed = live_param_claim(param, "param_set_step");
    if (claimed != SHARDOPT_OK)
        return claimed;
    struct shardopt_runtime *rt = param != NULL ? param->rt : NULL;
    const shardopt_status_t status = set_step_run(param, step);
    rt_release(rt);
    return status;
}

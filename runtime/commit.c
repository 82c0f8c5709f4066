/* commit: freeze the parameter set, lay out state and the step's buffers. Everything the step
 * needs is allocated here, so the step itself allocates nothing. */
#include "kernels/lr_scale.h"
#include "kernels/ns_variant.h"
#include "log.h"
#include "runtime.h"
#include "status.h"

/* Reserve this parameter's state slices and return the size of its NS buffers. */
static size_t param_plan(shardopt_runtime_t rt, struct shardopt_param *p, size_t *ns_floats)
{
    const size_t n = (size_t)p->layout.local_numel;

    if (p->algo == SHARDOPT_ALGO_ADAMW) {
        p->off_exp_avg = state_store_reserve(&rt->store, n * sizeof(float));
        p->off_exp_avg_sq = state_store_reserve(&rt->store, n * sizeof(float));
        return 0;
    }
    const size_t mom_bytes = n * kdtype_size(rt->cfg.momentum_dtype);
    p->off_momentum = state_store_reserve(&rt->store, mom_bytes);

    layout_matrix_view(&p->layout, p->transposed, &p->mv);
    p->ns_variant = ns_variant_for_shape(p->mv.rows, p->mv.cols);
    p->lr_scale = lr_scale_factor(rt->cfg.lr_scale, p->mv.true_rows, p->mv.true_cols);
    size_t ws = ns_workspace_floats(p->mv.rows, p->mv.cols);
    if (ws > *ns_floats)
        *ns_floats = ws;
    return n * kdtype_size(rt->cfg.comm_dtype);
}

static shardopt_status_t buffer_alloc(shardopt_runtime_t rt, void **buf, size_t bytes,
                                      const char *what)
{
    *buf = rt->ops->alloc(bytes);
    if (*buf == NULL)
        return log_fail(SHARDOPT_ERR_OUT_OF_MEMORY, "commit: %zu bytes for %s", bytes, what);
    rt->bytes_workspace += bytes;
    return SHARDOPT_OK;
}

shardopt_status_t shardopt_commit(shardopt_runtime_t rt)
{
    shardopt_status_t status;
    size_t comm_bytes = 0, ns_floats = 0;

    if (rt == NULL)
        return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "commit: NULL runtime");
    if (rt->committed)
        return log_fail(SHARDOPT_ERR_STATE, "commit: runtime already committed");

    for (int i = 0; i < rt->nparams; i++) {
        size_t b = param_plan(rt, rt->params[i], &ns_floats);
        if (b > comm_bytes)
            comm_bytes = b;
    }

    if (state_store_alloc(&rt->store) != 0) {
        status = log_fail(SHARDOPT_ERR_OUT_OF_MEMORY, "commit: %zu bytes of optimizer state",
                          rt->store.bytes);
        goto err_reset;
    }
    status = buffer_alloc(rt, &rt->u_buf, comm_bytes, "the Newton-Schulz input");
    if (status != SHARDOPT_OK)
        goto err_free;
    status = buffer_alloc(rt, &rt->o_buf, comm_bytes, "the Newton-Schulz output");
    if (status != SHARDOPT_OK)
        goto err_free;
    status = buffer_alloc(rt, (void **)&rt->ns_ws.buf, ns_floats * sizeof(float),
                          "the Newton-Schulz workspace");
    if (status != SHARDOPT_OK)
        goto err_free;
    rt->ns_ws.floats = ns_floats;
    rt->committed = 1;
    log_info("commit: %d params, state %zu bytes, workspace %zu bytes", rt->nparams,
             rt->store.bytes, rt->bytes_workspace);
    return SHARDOPT_OK;

err_free:
    rt->ops->free(rt->ns_ws.buf);
    rt->ops->free(rt->o_buf);
    rt->ops->free(rt->u_buf);
    rt->ns_ws.buf = NULL;
    rt->o_buf = rt->u_buf = NULL;
    rt->bytes_workspace = 0;
    state_store_free(&rt->store);
err_reset:
    /* leave the runtime as before the call: it may be committed again or finalized */
    state_store_init(&rt->store, rt->ops);
    return status;
}

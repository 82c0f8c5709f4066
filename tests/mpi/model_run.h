/* Running the model of model.h on a layout from SHARDOPT_TEST_LAYOUT
 * ("dp_replicate,dp_shard,cp,ep,expert_shard_dim"), and gathering its tensors to rank 0: shared
 * by the distributed tests. */
#ifndef SHARDOPT_TEST_MODEL_RUN_H
#define SHARDOPT_TEST_MODEL_RUN_H

#include "fixture.h"
#include "model.h"
#include "runtime/runtime.h"

static int world, me; /* set by setup() */
static int L_rep = 1, L_shard = -1, L_cp = 1, L_ep = 1, L_xdim = 0;
/* 1: the expert shard groups' teams planned matrix by matrix, without the group-wide choice
 * (runtime.h, xs_team_guard_off), which keeps one owner per expert matrix on this model */
static int L_xs_teams;

static void setup(void)
{
    const char *l = getenv("SHARDOPT_TEST_LAYOUT");
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    if (l != NULL)
        sscanf(l, "%d,%d,%d,%d,%d", &L_rep, &L_shard, &L_cp, &L_ep, &L_xdim);
}

struct run {
    shardopt_runtime_t rt;
    struct tbox box[MODEL_NPARAMS];
    shardopt_param_t h[MODEL_NPARAMS];
    void *w[MODEL_NPARAMS], *g[MODEL_NPARAMS];
};

static struct tcoords coords_of(shardopt_runtime_t rt)
{
    shardopt_stats_t st = SHARDOPT_STATS_INIT;
    shardopt_get_stats(rt, &st);
    return (struct tcoords){st.dense_rank, st.dense_size,        st.ep_rank,
                            st.ep_size,    st.expert_shard_rank, st.expert_shard_size};
}

/* Register the model's shards on this rank; `bad_shape` changes one shape on rank 1. */
static shardopt_status_t run_setup(struct run *r, MPI_Comm comm, shardopt_config_t cfg,
                                   int bad_shape)
{
    if (comm != MPI_COMM_SELF) {
        cfg.dp_replicate = L_rep;
        cfg.dp_shard = L_shard;
        cfg.cp = L_cp;
        cfg.ep = L_ep;
    }
    r->rt = fixture_runtime_on(comm, &cfg);
    r->rt->xs_team_guard_off = L_xs_teams;
    struct tcoords c = coords_of(r->rt);
    for (int p = 0; p < MODEL_NPARAMS; p++) {
        const struct tparam *t = &model_params[p];
        struct tbox *b = &r->box[p];
        model_box(t, &c, comm == MPI_COMM_SELF ? 0 : L_xdim, b);
        const size_t es = model_esize(t->dtype);
        r->w[p] = calloc((size_t)b->numel + 1, es);
        r->g[p] = calloc((size_t)b->numel + 1, es);
        for (int64_t i = 0; i < b->numel; i++)
            model_store(r->w[p], t->dtype, i, model_value(p, 0, model_global(t, b, i)));
        shardopt_param_desc_t d = SHARDOPT_PARAM_DESC_INIT;
        d.name = t->name;
        d.ndim = t->ndim;
        memcpy(d.shape, t->shape, sizeof d.shape);
        if (bad_shape == 1 && me == 1 && p == 7)
            d.shape[0] = 38; /* valid here; differs from rank 0 */
        if (bad_shape == 2 && me == 1 && p == 7)
            d.shape[0] = 3; /* this rank's own shard no longer fits: register fails here */
        d.placement = t->placement;
        d.transposed = t->transposed;
        d.param_dtype = d.grad_dtype = t->dtype;
        d.shard_dim = b->shard_dim;
        d.shard_offset = b->offset;
        d.shard_length = b->length;
        d.data = r->w[p];
        d.grad = r->g[p];
        /* a trainer goes on to commit after a failed register: commit fails everywhere */
        shardopt_register(r->rt, &d, &r->h[p]);
    }
    return shardopt_commit(r->rt);
}

static void run_grads(struct run *r, int step, int nan_here)
{
    for (int p = 0; p < MODEL_NPARAMS; p++) {
        const struct tparam *t = &model_params[p];
        for (int64_t i = 0; i < r->box[p].numel; i++)
            model_store(r->g[p], t->dtype, i, model_value(p, step, model_global(t, &r->box[p], i)));
    }
    if (nan_here) { /* NaN, +Inf and -Inf in an expert stack and in a dense matrix */
        const float bad[3] = {NAN, INFINITY, -INFINITY};
        for (int k = 0; k < 3; k++) {
            if (r->box[11].numel > k)
                ((float *)r->g[11])[k] = bad[k];
            if (r->box[2].numel > k)
                ((float *)r->g[2])[(k + 1) % 3] = bad[k];
        }
    }
}

/* Set: run_steps (and a test's own step loop, through run_betas) pass AdamW betas and eps that
 * change every step (step args version 4), as a scheduler cycling beta1 does; the config's
 * otherwise. A path that built its AdamW arguments from the config would then differ. */
static int run_betas_cycle;

__attribute__((unused)) static void run_betas(shardopt_step_args_t *a, int step)
{
    /* beta1, beta2, eps; -1 the config's */
    static const double cycle[4][3] = {
        {0.95, 0.99, 1e-6}, {0.85, -1, -1}, {-1, -1, -1}, {0.5, 0.7, 1e-3}};
    if (!run_betas_cycle)
        return;
    a->adamw_beta1 = cycle[step % 4][0];
    a->adamw_beta2 = cycle[step % 4][1];
    a->adamw_eps = cycle[step % 4][2];
}

static shardopt_status_t run_steps(struct run *r, int from, int to)
{
    for (int s = from; s <= to; s++) {
        shardopt_step_args_t args = SHARDOPT_STEP_ARGS_INIT;
        args.lr = 0.02;
        run_betas(&args, s);
        run_grads(r, s, 0);
        shardopt_status_t status = shardopt_step(r->rt, &args);
        if (status != SHARDOPT_OK)
            return status;
    }
    return SHARDOPT_OK;
}

static void run_free(struct run *r)
{
    shardopt_finalize(r->rt);
    for (int p = 0; p < MODEL_NPARAMS; p++) {
        free(r->w[p]);
        free(r->g[p]);
    }
}

/* The bytes of kind k (0 param, 1 momentum or exp_avg, 2 exp_avg_sq) of tensor p on this rank. */
static const void *kind_data(const struct run *r, int p, int k, size_t *es)
{
    const struct shardopt_param *h = r->h[p];
    const struct shardopt_runtime *rt = h->rt;
    *es = model_esize(model_params[p].dtype);
    if (k == 0)
        return r->w[p];
    if (h->algo == SHARDOPT_ALGO_MUON) {
        *es = kdtype_size(rt->cfg.momentum_dtype);
        return k == 1 ? state_store_ptr(&rt->store, h->off_momentum) : NULL;
    }
    *es = kdtype_size(k == 1 ? rt->cfg.adam_state_dtype : rt->cfg.adam_v_dtype);
    return state_store_ptr(&rt->store, k == 1 ? h->off_exp_avg : h->off_exp_avg_sq);
}

/* Gather kind k of tensor p from every rank into the global layout on rank 0 (out, numel*es).
 * Replicas must agree: returns the number of elements two ranks disagree on. */
__attribute__((unused)) static long gather(const struct run *r, int p, int k, unsigned char *out)
{
    const struct tparam *t = &model_params[p];
    size_t es;
    const void *mine = kind_data(r, p, k, &es);
    int64_t box[6], *boxes = NULL;
    int cnt = mine != NULL ? (int)(r->box[p].numel * (int64_t)es) : 0, *cnts = NULL, *displs = NULL;
    unsigned char *all = NULL, *seen = NULL;
    long bad = 0;

    memcpy(box, r->box[p].lo, sizeof(int64_t) * 3);
    memcpy(box + 3, r->box[p].len, sizeof(int64_t) * 3);
    if (me == 0) {
        boxes = malloc(sizeof(int64_t) * 6 * (size_t)world);
        cnts = malloc(sizeof(int) * (size_t)world);
        displs = malloc(sizeof(int) * (size_t)world);
    }
    MPI_Gather(box, 6, MPI_INT64_T, boxes, 6, MPI_INT64_T, 0, MPI_COMM_WORLD);
    MPI_Gather(&cnt, 1, MPI_INT, cnts, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (me == 0) {
        int total = 0;
        for (int i = 0; i < world; i++) {
            displs[i] = total;
            total += cnts[i];
        }
        all = malloc((size_t)total + 1);
        seen = calloc((size_t)(t->shape[0] * t->shape[1] * t->shape[2]), 1);
    }
    MPI_Gatherv(mine, cnt, MPI_BYTE, all, cnts, displs, MPI_BYTE, 0, MPI_COMM_WORLD);
    if (me == 0) {
        for (int i = 0; i < world; i++) {
            struct tbox b;
            memcpy(b.lo, boxes + 6 * i, sizeof(int64_t) * 3);
            memcpy(b.len, boxes + 6 * i + 3, sizeof(int64_t) * 3);
            b.numel = b.len[0] * b.len[1] * b.len[2];
            for (int64_t e = 0; e < b.numel && cnts[i] > 0; e++) {
                int64_t gi = model_global(t, &b, e);
                unsigned char *dst = out + (size_t)gi * es, *src = all + displs[i] + (size_t)e * es;
                if (seen[gi])
                    bad += memcmp(dst, src, es) != 0;
                else
                    memcpy(dst, src, es);
                seen[gi] = 1;
            }
        }
        free(all);
        free(seen);
        free(boxes);
        free(cnts);
        free(displs);
    }
    return bad;
}

__attribute__((unused)) static void snapshot(const struct run *r, unsigned char **out, size_t *len)
{
    size_t total = 0, es;
    for (int p = 0; p < MODEL_NPARAMS; p++)
        for (int k = 0; k < 3; k++)
            if (kind_data(r, p, k, &es) != NULL)
                total += (size_t)r->box[p].numel * es;
    *out = malloc(total + 1);
    *len = 0;
    for (int p = 0; p < MODEL_NPARAMS; p++)
        for (int k = 0; k < 3; k++) {
            const void *src = kind_data(r, p, k, &es);
            if (src != NULL) {
                memcpy(*out + *len, src, (size_t)r->box[p].numel * es);
                *len += (size_t)r->box[p].numel * es;
            }
        }
}

#endif

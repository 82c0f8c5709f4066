/* One tensor of a multi-step test through the public API (test_step_adamw.c, test_step_muon.c):
 * what it registers, its weights drawn from a seed, and two gradient buffers that the test
 * alternates with shardopt_param_set_pointers, as FSDP2 hands new gradients. Both files checked
 * their rule against a double oracle from the same set-up; it lives here once. */
#ifndef SHARDOPT_TEST_STEP_TENSOR_H
#define SHARDOPT_TEST_STEP_TENSOR_H

#include <stdlib.h>

#include "fixture.h"
#include "kernels/dtype.h"

struct step_tensor {
    /* what the test sets */
    const char *name;
    int ndim;
    int64_t shape[3]; /* entries past ndim are passed as given (0 where unset) */
    int transposed;
    shardopt_dtype_t pdt, gdt;
    double lr_mult, wd_mult;
    /* what step_tensor_register fills */
    size_t n;            /* elements */
    int64_t batch, r, c; /* the stored matrices (Muon): batch x r x c */
    void *w;             /* weights, pdt */
    void *g[2];          /* gradients, gdt */
    shardopt_param_t h;
};

/* x stored as dt at p[i] (rounded to fp32 first, then to bf16 where dt is bf16). */
static inline void step_put(void *p, shardopt_dtype_t dt, size_t i, double x)
{
    if (dt == SHARDOPT_DTYPE_BF16)
        ((uint16_t *)p)[i] = bf16_from_f32((float)x);
    else
        ((float *)p)[i] = (float)x;
}

/* Allocates t's weights (scale * test_rand(seed) each, in order) and zeroed gradients, and
 * registers t on rt with its dtypes, multipliers and orientation; the register call's status. */
static inline shardopt_status_t step_tensor_register(shardopt_runtime_t rt, struct step_tensor *t,
                                                     double scale, uint64_t *seed)
{
    t->batch = t->ndim == 3 ? t->shape[0] : 1;
    t->r = t->ndim >= 2 ? t->shape[t->ndim - 2] : 1;
    t->c = t->shape[t->ndim - 1];
    t->n = (size_t)(t->batch * t->r * t->c);
    t->w = calloc(t->n, 4);
    t->g[0] = calloc(t->n, 4);
    t->g[1] = calloc(t->n, 4);
    for (size_t i = 0; i < t->n; i++)
        step_put(t->w, t->pdt, i, scale * test_rand(seed));
    shardopt_param_desc_t d =
        fixture_desc(t->name, t->ndim, t->shape[0], t->shape[1], t->shape[2], t->w, t->g[0]);
    d.transposed = t->transposed;
    d.param_dtype = t->pdt;
    d.grad_dtype = t->gdt;
    d.lr_mult = t->lr_mult;
    d.wd_mult = t->wd_mult;
    return shardopt_register(rt, &d, &t->h);
}

/* Frees what step_tensor_register allocated (after shardopt_finalize). */
static inline void step_tensor_free(struct step_tensor *t)
{
    free(t->w);
    free(t->g[0]);
    free(t->g[1]);
}

#endif

/* Elementwise calls gathered into one launch: on a device backend (a table with *_many entries)
 * the pieces of a bucket, or all AdamW tensors, become one kernel instead of one per piece;
 * elsewhere each call runs at once. Callers flush before anything that depends on the results
 * is queued (an exchange, a copy out, the next phase). With offload = optimizer every call runs
 * at once: its staging slot is copied out right after it. */
#ifndef RUNTIME_ELEM_BATCH_H
#define RUNTIME_ELEM_BATCH_H

#include "kernels/ops.h"

struct shardopt_runtime;

#define EW_PENDING_MAX 256

struct ew_pending {
    int kind; /* 0 none, 1 momentum, 2 adamw, 3 apply */
    int count;
    union {
        struct momentum_args m[EW_PENDING_MAX];
        struct adamw_args a[EW_PENDING_MAX];
        struct apply_args p[EW_PENDING_MAX];
    } u;
};

void ew_momentum(struct shardopt_runtime *rt, const struct momentum_args *a);
void ew_adamw(struct shardopt_runtime *rt, const struct adamw_args *a);
void ew_apply(struct shardopt_runtime *rt, const struct apply_args *a);
void ew_flush(struct shardopt_runtime *rt);

#endif

/* A load's report of what did not match (checkpoint_load_report.h). */
#include "runtime/checkpoint/checkpoint_load_report.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "base/status.h"
#include "kernels/dtype.h"
#include "kernels/rng.h"

void ckpt_names_add(char *list, size_t cap, int *count, const char *name)
{
    if ((*count)++ >= CKPT_LOAD_NAMES_SHOWN)
        return;
    const size_t o = strlen(list);
    snprintf(list + o, cap - o, "%s%.120s", o ? ", " : "", name);
}

/* A parameter renamed since the save shows up twice: its new name's tensors kept as they were
 * (load_allow_missing) and its old name's record unused. Neither may pass without a word, or its
 * state is lost silently. Unused records alone (a checkpoint of a larger model, another pipeline
 * stage's) are normal without load_allow_missing: info, not a warning. */
/* Whether a parameter of this name is registered: by the hash register computed, then the text.
 * No allocation (a load's every allocation failure must fail the load, tests/unit/
 * test_alloc_fault.c, and a report is no reason to fail one); O(parameters) per name, and called
 * only when some record is unused, until the names shown are found. */
static int registered(shardopt_runtime_t rt, const char *name)
{
    const uint64_t h = rng_name_hash(name);
    for (int i = 0; i < rt->nparams; i++)
        if (rt->params[i]->name_hash == h && strcmp(rt->params[i]->name, name) == 0)
            return 1;
    return 0;
}

void ckpt_load_report_unmatched(shardopt_runtime_t rt, const struct ck_index *ix, int kept,
                                const char *kept_names)
{
    char unused_names[512] = "";
    int unused = ix->np;
    for (int i = 0; i < rt->nparams; i++) /* names are unique on both sides */
        unused -= ckpt_index_param(ix, rt->params[i]->name) != NULL;
    for (int i = 0, n = 0;
         rt->groups.me.rank == 0 && i < ix->np && n < unused && n < CKPT_LOAD_NAMES_SHOWN; i++)
        if (!registered(rt, ix->p[i].name))
            ckpt_names_add(unused_names, sizeof unused_names, &n, ix->p[i].name);
    rt->load_kept = kept;
    rt->load_unused = unused;
    if (kept == 0 && unused == 0)
        return;
    if (rt->groups.me.rank != 0) /* every rank found the same: one line for the job */
        return;
    const int warn = kept > 0 || rt->cfg.load_allow_missing;
    log_msg(warn ? LOG_WARN : LOG_INFO,
            "load: %s: %d tensor(s) of registered parameters are not in the checkpoint and keep "
            "their current values (load_allow_missing)%s%s%s; %d parameter(s) of the checkpoint "
            "match no registered parameter and were not loaded%s%s%s%s",
            ix->dir, kept, kept ? ": " : "", kept_names,
            kept > CKPT_LOAD_NAMES_SHOWN ? ", ..." : "", unused, unused ? ": " : "", unused_names,
            unused > CKPT_LOAD_NAMES_SHOWN ? ", ..." : "",
            kept && unused ? " (a parameter renamed since the save loses its state this way: "
                             "register it under its saved name)"
                           : "");
}

shardopt_status_t ckpt_load_values_check(const char *dir, const char *tensor, const char *suffix,
                                         const void *buf, int dtype, size_t n)
{
    if (suffix == NULL || strcmp(suffix, "exp_avg_sq") != 0)
        return SHARDOPT_OK;
    for (size_t i = 0; i < n; i++) {
        const float v = kload(buf, dtype, i);
        if (v < 0)
            return log_fail(
                SHARDOPT_ERR_CORRUPT,
                "load: %s: tensor '%s': element %zu of this rank's part is %g: a second "
                "moment is never negative (AdamW divides by its square root; no save "
                "writes one): a damaged or foreign checkpoint",
                dir, tensor, i, (double)v);
    }
    return SHARDOPT_OK;
}

shardopt_status_t ckpt_load_missing(const struct ck_index *ix, const struct shardopt_param *p,
                                    const char *name, int is_weight)
{
    const struct ck_param *saved = ckpt_index_param(ix, p->name);
    char why[300] = "";
    if (!is_weight && saved != NULL && saved->algo != (int)p->algo)
        snprintf(why, sizeof why,
                 "; the checkpoint holds parameter '%.100s' as %s (its state %s), this runtime "
                 "steps it with %s: algo or adamw_patterns differ from the save's",
                 p->name, saved->algo == SHARDOPT_ALGO_MUON ? "muon" : "adamw",
                 saved->algo == SHARDOPT_ALGO_MUON ? "'<name>.momentum'"
                                                   : "'<name>.exp_avg', '<name>.exp_avg_sq'",
                 p->algo == SHARDOPT_ALGO_MUON ? "muon" : "adamw");
    return log_fail(SHARDOPT_ERR_MISMATCH,
                    "load: %s/index.json: %s '%s' of parameter '%s' is not in the checkpoint%s "
                    "(set load_allow_missing to keep its current %s)",
                    ix->dir, is_weight ? "weight" : "tensor", name, p->name, why,
                    is_weight ? "value" : "state");
}

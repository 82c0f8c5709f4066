/* What a load reports beyond the files' integrity: the parts of the model and of the checkpoint
 * that did not meet (load_allow_missing), named in rank 0's log, and state values no save writes.
 */
#ifndef RUNTIME_CHECKPOINT_LOAD_REPORT_H
#define RUNTIME_CHECKPOINT_LOAD_REPORT_H

#include "runtime/checkpoint/checkpoint_index.h"

/* Names listed in a load's warnings; the count says how many there were. */
#define CKPT_LOAD_NAMES_SHOWN 8

/* Count one more name in *count and append it to list (cap bytes, ", "-separated) while fewer
 * than CKPT_LOAD_NAMES_SHOWN are listed. */
void ckpt_names_add(char *list, size_t cap, int *count, const char *name);

/* Every rank, after a load succeeded (the counts go to rt->load_kept / load_unused, the stats'),
 * and on rank 0 the log: `kept` registered tensors the checkpoint lacks (load_allow_
 * missing kept their values; the first few in kept_names) and the checkpoint's parameter
 * records no registered parameter matches, counted and named in one log line: a warning when
 * anything was kept or load_allow_missing is on, else info. Nothing when everything matched. */
void ckpt_load_report_unmatched(shardopt_runtime_t rt, const struct ck_index *ix, int kept,
                                const char *kept_names);

/* A state tensor just read (n elements of dtype at buf) that no step can start from: a negative
 * exp_avg_sq (AdamW divides by its square root), which no save writes; ERR_CORRUPT naming the
 * tensor, element and value. NaN and Inf are left to check_state_every: a checkpoint of a run
 * that diverged may be loaded to look at. suffix NULL (a weight): nothing to check. */
shardopt_status_t ckpt_load_values_check(const char *dir, const char *tensor, const char *suffix,
                                         const void *buf, int dtype, size_t n);

/* ERR_MISMATCH for a registered tensor `name` (of parameter p, a weight or a state tensor) the
 * checkpoint lacks, saying why where the index shows it: the checkpoint holds p under the other
 * algorithm (algo or adamw_patterns changed since the save: its state tensors have other
 * names). */
shardopt_status_t ckpt_load_missing(const struct ck_index *ix, const struct shardopt_param *p,
                                    const char *name, int is_weight);

#endif

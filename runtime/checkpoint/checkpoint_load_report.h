/* What a load reports beyond its status: the parts of the model and of the checkpoint that did
 * not meet (load_allow_missing), named in rank 0's log. */
#ifndef RUNTIME_CHECKPOINT_LOAD_REPORT_H
#define RUNTIME_CHECKPOINT_LOAD_REPORT_H

#include "runtime/checkpoint/checkpoint_index.h"

/* Names listed in a load's warnings; the count says how many there were. */
#define CKPT_LOAD_NAMES_SHOWN 8

/* Count one more name in *count and append it to list (cap bytes, ", "-separated) while fewer
 * than CKPT_LOAD_NAMES_SHOWN are listed. */
void ckpt_names_add(char *list, size_t cap, int *count, const char *name);

/* Rank 0, after a load succeeded: `kept` registered tensors the checkpoint lacks (load_allow_
 * missing kept their values; the first few in kept_names) and the checkpoint's parameter
 * records no registered parameter matches, counted and named in one log line: a warning when
 * anything was kept or load_allow_missing is on, else info. Nothing when everything matched. */
void ckpt_load_report_unmatched(shardopt_runtime_t rt, const struct ck_index *ix, int kept,
                                const char *kept_names);

#endif

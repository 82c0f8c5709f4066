/* Which algorithm `algo = auto` gives a parameter: Muon for a matrix (both matrix dims > 1)
 * whose name matches no adamw_patterns entry, AdamW otherwise. Pure, so that the tools that
 * plan layouts (bench/shardopt_plan.c) classify exactly as the runtime does. */
#ifndef RUNTIME_CLASSIFY_H
#define RUNTIME_CLASSIFY_H

#include <stddef.h>
#include <stdint.h>

/* Does name match one comma-separated entry of patterns (spaces around an entry ignored): a
 * substring, or `=exact`? */
int classify_name_matches(const char *name, const char *patterns);

/* How many entries of patterns match none of the n names; their text, quoted and
 * comma-separated, into out (cut at len). */
int classify_unmatched(const char *patterns, const char *const *names, int n, char *out,
                       size_t len);

/* 1: Muon under algo = auto; 0: AdamW. */
int classify_auto_is_muon(const char *name, int ndim, const int64_t *shape, const char *patterns);

#endif

/* The runtimes shardopt_init made that shardopt_finalize has not freed, in this process. A
 * handle used after its finalize (a second finalize, a step, save or get_stats on it) read and
 * wrote freed memory: a crash, or heap damage found later; it is now refused by its pointer,
 * which is compared, never read. A handle whose memory a later init reused is that runtime
 * again (an address cannot tell): the check finds a handle finalized and not replaced. */
#ifndef RUNTIME_LIVE_H
#define RUNTIME_LIVE_H

#include "runtime/runtime.h"

/* rt made by init (live_add) and finalized (live_remove: before anything of it is freed). */
void live_add(struct shardopt_runtime *rt);
void live_remove(struct shardopt_runtime *rt);

/* 1: rt is a live runtime; 0: not (finalized, or never one) */
int live_has(const struct shardopt_runtime *rt);

/* The refusal of a call on a runtime that is not live (ERR_INVALID_ARGUMENT naming the call and
 * the pointer, nothing of it read). */
shardopt_status_t live_refuse(const char *call, const struct shardopt_runtime *rt);

/* rt_claim's test and claim under the list's lock, so that a finalize in another thread cannot
 * free rt between them: 1 claimed for `call`; 0 not live; -1 busy (*running: the call running
 * on it). */
int live_claim(struct shardopt_runtime *rt, const char *call, const char **running);

#endif

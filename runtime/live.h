/* The runtimes shardopt_init made that shardopt_finalize has not freed, in this process. A
 * handle used after its finalize (a second finalize, a step, save or get_stats on it) read and
 * wrote freed memory: a crash, or heap damage found later; it is now refused by its pointer,
 * which is compared, never read.
 *
 * Finalize keeps the shell of the runtime (its struct, its parameters' structs and names, all
 * else freed) among the last LIVE_RETIRED_MAX finalized (live_retire): while a shell is kept,
 * no later init or register can be given its address, so a runtime handle is not taken for a
 * newer runtime, and a parameter handle can be read to find its runtime and name and refused.
 * A handle older than that window is undefined behaviour, as after free. */
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

/* The refusal of a call while another thread's call (running) holds the runtime: ERR_STATE
 * naming both, and the parameter when name is not NULL. */
shardopt_status_t live_busy(const char *call, const char *name, const char *running);

/* rt_claim for a parameter's calls: claims its runtime (release it with rt_release(p->rt)), or
 * ERR_INVALID_ARGUMENT naming the parameter when that runtime was finalized (its shell is kept a
 * while: below), ERR_STATE when another thread's call runs on it. A NULL p is OK here, as for
 * rt_claim: the call refuses it by name. */
shardopt_status_t live_param_claim(const struct shardopt_param *p, const char *call);

/* The same check without a claim, for the calls that only read a parameter. */
shardopt_status_t live_param_check(const struct shardopt_param *p, const char *call);

/* After finalize freed all else of rt (live_remove first): keeps rt's shell, frees the oldest
 * shells past LIVE_RETIRED_MAX runtimes or LIVE_RETIRED_BYTES (the newest always kept). */
#define LIVE_RETIRED_MAX   16
#define LIVE_RETIRED_BYTES ((size_t)64 << 20)
void live_retire(struct shardopt_runtime *rt);

#endif

/* The process's live runtimes (live.c) as a list to walk: every runtime shardopt_init made that
 * shardopt_finalize has not taken out, linked through live_next, under one mutex. Finalize takes
 * its runtime out under that lock before it frees anything, so what a walk reads of another
 * runtime stays valid while the lock is held. runtime/step/ walks it (alias_check.c: another
 * runtime that stepped the same memory); adding, taking out and claiming a runtime stay live.h's,
 * the lifecycle's, which step/ does not see (tests/floors.sh). */
#ifndef RUNTIME_LIVE_LIST_H
#define RUNTIME_LIVE_LIST_H

#include "runtime/runtime.h"

/* The list's lock, around a walk and around what a walker keeps under it; not recursive: call
 * no live_* function while it is held. */
void live_lock(void);
void live_unlock(void);

/* With the lock held: the first live runtime (NULL: none), the rest through ->live_next. */
struct shardopt_runtime *live_first(void);

#endif

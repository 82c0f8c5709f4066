/* Fault injection for tests: SHARDOPT_FAULT=<site>:<n> makes the n-th call at `site` fail,
 * SHARDOPT_FAULT=kill@<site>:<n> kills the process there (SIGKILL: no cleanup, as a crash), and
 * SHARDOPT_FAULT=hang@<site>:<n> stops it there for good (a rank that makes no more progress;
 * the others' waits then time out). SHARDOPT_FAULT_RANK=<r> limits the fault to the runtime's
 * rank r, as one sick node in a job. Read once, when the library is loaded. Sites are named where
 * they are checked (checkpoint_write.c: ckpt.write, ckpt.fsync, ckpt.index; checkpoint_save.c:
 * ckpt.rename; checkpoint_dir.c: ckpt.lock, ckpt.latest, ckpt.prune; checkpoint_load.c: ckpt.read,
 * each read of a rank file; prepass.c: step.prepass; muon_exec.c: step.exchange, each exchange a
 * bucket starts; ns_sharded.c: step.ns, each iteration of a sharded or team Newton-Schulz piece on
 * a member holding columns of it, a stand-in for a kernel refusing; copy: each device copy whose
 * completion is checked, in offload/state_store.c and muon_exec.c; comm_wait.c: init.split, each
 * communicator split of init (the four groups, or those init_from_groups derives, then the node
 * splits for bind = auto and device = local_rank), init.dup, each trainer's group init_from_groups
 * duplicates; comm_nccl.c: nccl.id, each NCCL group's unique-id broadcast), but for `alloc`:
 * alloc:<n> makes the n-th allocation of the library (base/mem.h, every layer's, and cJSON's while
 * armed) return NULL, counted from the load or from fault_arm (with SHARDOPT_FAULT_RANK, from init
 * on that rank). Only one site is armed at a time; kill@alloc and hang@alloc are refused, and so is
 * a site no call names (fault.c's list). */
#ifndef BASE_FAULT_H
#define BASE_FAULT_H

/* 1 when this call at `site` is to fail (errno EIO, or the spec's). Never returns when it is to
 * kill. */
int fault_hit(const char *site);

/* Re-arm from a spec like SHARDOPT_FAULT's (NULL disarms), counting from zero: for tests.
 * Not thread-safe against library calls in flight for `alloc`. */
void fault_arm(const char *spec);

/* This process's runtime rank, for SHARDOPT_FAULT_RANK (set by init; -1 before). */
void fault_set_rank(int rank);

/* The same for the sites init passes before it calls fault_set_rank (the groups' splits and
 * dups): the rank only, leaving alloc:<n> to count from fault_set_rank as it always has. */
void fault_note_rank(int rank);

#endif

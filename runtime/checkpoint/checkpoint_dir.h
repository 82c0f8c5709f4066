/* A checkpoint directory's own files (checkpoint_dir.c): the lock, tree removal, a crashed save's
 * leftovers, pruning, DIR/latest. Private to the checkpoint files; rank 0 calls them. */
#ifndef RUNTIME_CHECKPOINT_DIR_H
#define RUNTIME_CHECKPOINT_DIR_H

#include <stddef.h>

#include "base/status.h"

/* Take DIR/.lock (dfd is DIR open), exclusive, recording this writer in it; another writer holds
 * it: refused, naming the holder. *lock_fd is -1 after OK when the filesystem has no flock (the
 * save goes on unguarded; the caller then clears no leftovers). */
shardopt_status_t ckpt_dir_lock_take(int dfd, const char *dir, int *lock_fd);

/* Clear the holder's record and drop the lock (fd -1: nothing). */
void ckpt_dir_lock_release(int fd);

/* Remove the temporary directories (.tmp-step-*) of crashed saves; with the lock held only. */
void ckpt_dir_leftovers_clear(int dfd, const char *dir);

/* DIR holding an index.json (a step directory, or a stray copy of one's files) fails the save:
 * a load of DIR would take it for a step directory and never read the latest this save writes. */
shardopt_status_t ckpt_dir_not_a_step(int dfd, const char *dir);

/* DIR/step_name of the step being saved: absent, or a crashed save's unpublished step (removed);
 * the step latest names, or anything a save did not make, fails the save. */
shardopt_status_t ckpt_dir_stale_step_clear(int dfd, const char *dir, const char *step_name,
                                            unsigned long long step);

/* Keep keep_last step directories, `published` (the one latest names) among them; failures warn. */
void ckpt_dir_steps_prune(int dfd, const char *dir, int keep_last, const char *published);

/* Remove the directory `name` of dfd and what it holds, never following a link; anything but a
 * directory is left: -1 (errno ELOOP or ENOTDIR). */
int ckpt_dir_tree_remove(int dfd, const char *name);

/* Replace DIR/latest, atomically, by a file naming step_name (`final`: the step's path, for
 * messages). */
shardopt_status_t ckpt_dir_latest_replace(int dfd, const char *dir, const char *step_name,
                                          const char *final);

/* A load's reading of DIR/latest (path): the step directory name it holds into name (name_len
 * bytes), or refused, its bytes shown escaped. */
shardopt_status_t ckpt_dir_latest_read(const char *dir, const char *path, char *name,
                                       size_t name_len);

#endif

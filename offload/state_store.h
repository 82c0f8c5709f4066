/* Where optimizer state lives. With offload = none (the only mode so far) all state sits in one
 * arena allocated through the backend's kernel ops (device memory on CUDA, host on the CPU):
 * one allocation, 64-byte aligned slices, zeroed at commit. */
#ifndef OFFLOAD_STATE_STORE_H
#define OFFLOAD_STATE_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/ops.h"

struct state_store {
    const struct kernel_ops *ops;
    size_t bytes; /* reserved so far; the arena's size once allocated */
    unsigned char *base;
};

void state_store_init(struct state_store *s, const struct kernel_ops *ops);

/* Reserve a slice of `bytes` before allocation; returns its offset in the arena. */
size_t state_store_reserve(struct state_store *s, size_t bytes);

/* Allocate and zero the arena. Returns 0, or -1 when the allocation failed. */
int state_store_alloc(struct state_store *s);

void *state_store_ptr(const struct state_store *s, size_t offset);

void state_store_free(struct state_store *s);

/* Exchange the arena with *other, a buffer of the same size from the same ops (a load that
 * filled a complete new copy of the state installs it without copying it back). */
void state_store_swap(struct state_store *s, void **other);

#endif

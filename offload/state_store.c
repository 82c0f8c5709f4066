#include "state_store.h"

#include <string.h>

#define STATE_ALIGN 64

void state_store_init(struct state_store *s, const struct kernel_ops *ops)
{
    s->ops = ops;
    s->bytes = 0;
    s->base = NULL;
}

size_t state_store_reserve(struct state_store *s, size_t bytes)
{
    size_t off = s->bytes;
    s->bytes += (bytes + STATE_ALIGN - 1) / STATE_ALIGN * STATE_ALIGN;
    return off;
}

int state_store_alloc(struct state_store *s)
{
    s->base = s->ops->alloc(s->bytes);
    if (s->base == NULL)
        return -1;
    /* the CPU arena is host memory; a device arena gets a memset op with the CUDA backend */
    memset(s->base, 0, s->bytes);
    return 0;
}

void *state_store_ptr(const struct state_store *s, size_t offset) { return s->base + offset; }

void state_store_swap(struct state_store *s, void **other)
{
    void *old = s->base;
    s->base = *other;
    *other = old;
}

void state_store_free(struct state_store *s)
{
    if (s->base != NULL)
        s->ops->free(s->base);
    s->base = NULL;
}

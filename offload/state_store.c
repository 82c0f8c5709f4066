#include "state_store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fault.h"
#include "base/mem.h"
#include "host_store.h"

#define STATE_ALIGN 64

void state_store_init(struct state_store *s, const struct kernel_ops *ops)
{
    memset(s, 0, sizeof *s);
    s->ops = ops;
}

void state_store_use_host(struct state_store *s, hwloc_topology_t topo, hwloc_const_nodeset_t nodes,
                          uint64_t limit)
{
    s->host = 1;
    s->topo = topo;
    s->nodes = nodes;
    s->limit = limit;
}

size_t state_store_reserve(struct state_store *s, size_t bytes)
{
    size_t off = s->bytes;
    s->bytes += (bytes + STATE_ALIGN - 1) / STATE_ALIGN * STATE_ALIGN;
    return off;
}

void *state_store_buffer_alloc(const struct state_store *s, char *err, size_t errlen)
{
    if (s->host) {
        void *h = host_store_alloc(s->topo, s->nodes, s->bytes, s->limit, err, errlen);
        /* a device backend copies to and from it: pinned, the copies are asynchronous DMA */
        if (h != NULL && s->ops->host_register != NULL && s->ops->host_register(h, s->bytes) != 0) {
            snprintf(err, errlen, "host store: pinning %zu bytes failed (%s)", s->bytes,
                     s->ops->name);
            host_store_free(s->topo, h, s->bytes);
            return NULL;
        }
        return h;
    }
    void *p = s->ops->alloc(s->bytes);
    if (p == NULL)
        snprintf(err, errlen, "state: out of memory allocating %zu bytes (kernels %s)", s->bytes,
                 s->ops->name);
    return p;
}

void state_store_buffer_free(const struct state_store *s, void *p)
{
    if (p == NULL)
        return;
    if (s->host && s->ops->host_unregister != NULL)
        s->ops->host_unregister(p);
    if (s->host)
        host_store_free(s->topo, p, s->bytes);
    else
        s->ops->free(p);
}

int state_store_alloc(struct state_store *s, char *err, size_t errlen)
{
    s->base = state_store_buffer_alloc(s, err, errlen);
    if (s->base == NULL)
        return -1;
    if (s->host || s->ops->fill == NULL)
        memset(s->base, 0, s->bytes);
    else
        s->ops->fill(NULL, s->base, 0, s->bytes); /* the legacy stream: done before later work */
    return 0;
}

void *state_store_ptr(const struct state_store *s, size_t offset) { return s->base + offset; }

int state_store_on_device(const struct state_store *s)
{
    return !s->host && s->ops->host_alloc != NULL;
}

const unsigned char *state_store_host_view(const struct state_store *s,
                                           const struct kernel_ctx *ctx, const void *buf,
                                           void **copy, char *err, size_t errlen)
{
    *copy = NULL;
    if (!state_store_on_device(s)) {
        /* a host store: the step's last copies out of the device may still be in flight */
        if (s->ops->sync != NULL && s->ops->sync(ctx) != 0) {
            snprintf(err, errlen, "state: waiting for the device's copies failed (%s)",
                     s->ops->name);
            return NULL;
        }
        return buf;
    }
    *copy = mem_malloc(s->bytes ? s->bytes : 1);
    if (*copy == NULL) {
        snprintf(err, errlen,
                 "state: out of memory allocating %zu bytes for a host copy of the device state",
                 s->bytes ? s->bytes : 1);
        return NULL;
    }
    s->ops->copy(ctx, *copy, buf, s->bytes);
    /* SHARDOPT_FAULT=copy:<n>: a device copy reported failed (as CUDA reports it, at the sync) */
    if (fault_hit("copy") || s->ops->sync(ctx) != 0) {
        snprintf(err, errlen, "state: copying %zu bytes from the device failed (%s)", s->bytes,
                 s->ops->name);
        free(*copy);
        *copy = NULL;
        return NULL;
    }
    return *copy;
}

int state_store_upload(const struct state_store *s, const struct kernel_ctx *ctx, void *dst,
                       const void *src, char *err, size_t errlen)
{
    if (!state_store_on_device(s)) {
        if (dst != src)
            memcpy(dst, src, s->bytes);
        return 0;
    }
    s->ops->copy(ctx, dst, src, s->bytes);
    if (fault_hit("copy") || s->ops->sync(ctx) != 0) {
        snprintf(err, errlen, "state: copying %zu bytes to the device failed (%s)", s->bytes,
                 s->ops->name);
        return -1;
    }
    return 0;
}

void state_store_swap(struct state_store *s, void **other)
{
    void *old = s->base;
    s->base = *other;
    *other = old;
}

void state_store_free(struct state_store *s)
{
    state_store_buffer_free(s, s->base);
    s->base = NULL;
}

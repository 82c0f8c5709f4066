#include "state_store.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/fault.h"
#include "base/mem.h"
#include "base/status.h"
#include "host_store.h"

#define STATE_ALIGN 64

void state_store_init(struct state_store *s, const struct device_ops *dev)
{
    memset(s, 0, sizeof *s);
    s->dev = dev;
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
    /* saturating: registered sizes that add up past SIZE_MAX (parameters of up to 2^60
     * elements each) must ask for more than any machine has, never wrap to a small arena that
     * the step would write past; commit's memory check refuses that arena, naming the
     * parameter and its bytes (commit_buffers.c) */
    size_t up = SIZE_MAX;
    if (!mem_align_up(bytes, STATE_ALIGN, &up))
        up = SIZE_MAX;
    s->bytes = s->bytes > SIZE_MAX - up ? SIZE_MAX : s->bytes + up;
    return off;
}

shardopt_status_t state_store_buffer_alloc(const struct state_store *s, void **out)
{
    *out = NULL;
    if (s->host) {
        void *h = NULL;
        const shardopt_status_t status =
            host_store_alloc(s->topo, s->nodes, s->bytes, s->limit, &h);
        if (status != SHARDOPT_OK)
            return status;
        /* a device backend copies to and from it: pinned, the copies are asynchronous DMA */
        if (device_has(s->dev, DEVICE_CAP_HOST_REGISTER) &&
            s->dev->host_register(h, s->bytes) != 0) {
            host_store_free(s->topo, h, s->bytes);
            return status_set(SHARDOPT_ERR_OUT_OF_MEMORY,
                              "host store: pinning %zu bytes failed (%s)", s->bytes, s->dev->name);
        }
        *out = h;
        return SHARDOPT_OK;
    }
    *out = s->dev->alloc(s->bytes);
    if (*out == NULL)
        return status_set(SHARDOPT_ERR_OUT_OF_MEMORY,
                          "state: out of memory allocating %zu bytes (device %s)", s->bytes,
                          s->dev->name);
    return SHARDOPT_OK;
}

void state_store_buffer_free(const struct state_store *s, void *p)
{
    if (p == NULL)
        return;
    if (s->host && device_has(s->dev, DEVICE_CAP_HOST_REGISTER))
        s->dev->host_unregister(p);
    if (s->host)
        host_store_free(s->topo, p, s->bytes);
    else
        s->dev->free(p);
}

shardopt_status_t state_store_alloc(struct state_store *s)
{
    void *base = NULL;
    const shardopt_status_t status = state_store_buffer_alloc(s, &base);
    s->base = base;
    if (status != SHARDOPT_OK)
        return status;
    if (s->host)
        memset(s->base, 0, s->bytes);
    else
        s->dev->fill(NULL, s->base, 0, s->bytes); /* the legacy stream: done before later work */
    return SHARDOPT_OK;
}

void *state_store_ptr(const struct state_store *s, size_t offset) { return s->base + offset; }

int state_store_on_device(const struct state_store *s)
{
    return !s->host && device_has(s->dev, DEVICE_CAP_DEVICE_MEMORY);
}

shardopt_status_t state_store_host_view(const struct state_store *s, const struct kernel_ctx *ctx,
                                        const void *buf, const unsigned char **view, void **copy)
{
    *copy = NULL;
    *view = NULL;
    if (!state_store_on_device(s)) {
        /* a host store: the step's last copies out of the device may still be in flight */
        if (s->dev->sync(ctx) != 0)
            return status_set(SHARDOPT_ERR_DEVICE,
                              "state: waiting for the device's copies failed (%s)", s->dev->name);
        *view = buf;
        return SHARDOPT_OK;
    }
    *copy = mem_malloc(s->bytes ? s->bytes : 1);
    if (*copy == NULL)
        return status_set(
            SHARDOPT_ERR_OUT_OF_MEMORY,
            "state: out of memory allocating %zu bytes for a host copy of the device state",
            s->bytes ? s->bytes : 1);
    s->dev->copy(ctx, *copy, buf, s->bytes);
    /* SHARDOPT_FAULT=copy:<n>: a device copy reported failed (as CUDA reports it, at the sync) */
    if (fault_hit("copy") || s->dev->sync(ctx) != 0) {
        free(*copy);
        *copy = NULL;
        return status_set(SHARDOPT_ERR_DEVICE,
                          "state: copying %zu bytes from the device failed (%s)", s->bytes,
                          s->dev->name);
    }
    *view = *copy;
    return SHARDOPT_OK;
}

shardopt_status_t state_store_upload(const struct state_store *s, const struct kernel_ctx *ctx,
                                     void *dst, const void *src)
{
    if (!state_store_on_device(s)) {
        if (dst != src)
            memcpy(dst, src, s->bytes);
        return SHARDOPT_OK;
    }
    s->dev->copy(ctx, dst, src, s->bytes);
    if (fault_hit("copy") || s->dev->sync(ctx) != 0)
        return status_set(SHARDOPT_ERR_DEVICE, "state: copying %zu bytes to the device failed (%s)",
                          s->bytes, s->dev->name);
    return SHARDOPT_OK;
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

/* The one rule of a device table: its caps say which slots it fills (device.h). */
#include "device.h"

const char *device_ops_check(const struct device_ops *d)
{
    /* capability 0: the slots every table fills */
    const struct {
        unsigned cap;
        const char *slot;
        int filled;
    } slots[] = {
        {0, "copy", d->copy != NULL},
        {0, "copy2d", d->copy2d != NULL},
        {0, "fill", d->fill != NULL},
        {0, "alloc", d->alloc != NULL},
        {0, "free", d->free != NULL},
        {0, "sync", d->sync != NULL},
        {DEVICE_CAP_COPY_LANES, "copy_on", d->copy_on != NULL},
        {DEVICE_CAP_COPY_LANES, "lane_record", d->lane_record != NULL},
        {DEVICE_CAP_COPY_LANES, "lane_wait", d->lane_wait != NULL},
        {DEVICE_CAP_BACKEND, "backend_create", d->backend_create != NULL},
        {DEVICE_CAP_BACKEND, "backend_destroy", d->backend_destroy != NULL},
        {DEVICE_CAP_BACKEND, "device_count", d->device_count != NULL},
        {DEVICE_CAP_BACKEND, "device_pci_bus_id", d->device_pci_bus_id != NULL},
        {DEVICE_CAP_HOST_PINNED, "host_alloc", d->host_alloc != NULL},
        {DEVICE_CAP_HOST_PINNED, "host_free", d->host_free != NULL},
        {DEVICE_CAP_HOST_REGISTER, "host_register", d->host_register != NULL},
        {DEVICE_CAP_HOST_REGISTER, "host_unregister", d->host_unregister != NULL},
        {DEVICE_CAP_STREAMS, "stream_begin", d->stream_begin != NULL},
        {DEVICE_CAP_STREAMS, "stream_end", d->stream_end != NULL},
        {DEVICE_CAP_MARKS, "mark", d->mark != NULL},
        {DEVICE_CAP_MARKS, "mark_seconds", d->mark_seconds != NULL},
        {DEVICE_CAP_MARKS, "mark_done", d->mark_done != NULL},
        {DEVICE_CAP_POINTER_KIND, "pointer_kind", d->pointer_kind != NULL},
        {DEVICE_CAP_THREAD_DEVICE, "device_enter", d->device_enter != NULL},
    };
    for (size_t i = 0; i < sizeof slots / sizeof slots[0]; i++)
        if (slots[i].filled != (slots[i].cap == 0 || device_has(d, slots[i].cap)))
            return slots[i].slot;
    /* device memory moves through host mirrors: a table without pinned ones cannot serve it */
    if (device_has(d, DEVICE_CAP_DEVICE_MEMORY) && !device_has(d, DEVICE_CAP_HOST_PINNED))
        return "host_alloc";
    return NULL;
}

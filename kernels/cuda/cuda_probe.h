/* Device queries of the CUDA backend (C linkage). */
#ifndef KERNELS_CUDA_PROBE_H
#define KERNELS_CUDA_PROBE_H

#include <stddef.h>

/* Visible CUDA devices; 0 without a driver or device. */
int cuda_probe_device_count(void);

/* Host -> device -> host round trip through dst_dev; 0 on success. */
int cuda_probe_copy(void *dst_dev, const void *src_host, void *back_host, size_t bytes);

#endif

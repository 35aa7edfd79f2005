/*
 * copy.h - how libtensorfs-cuda moves bytes: the copy engine.
 *
 * copy_cuda.c does it with the CUDA runtime (the library people link);
 * copy_cpu.c does it with memcpy, so that the protocol and the library's
 * logic are tested on machines without a GPU (the "device" pointer is
 * then host memory). Each function returns 0 or -errno with the message
 * set through tfsc_fail.
 */
#ifndef TENSORFS_CUDA_COPY_H
#define TENSORFS_CUDA_COPY_H

#include <stdbool.h>
#include <stddef.h>

/* "cuda" or "cpu" */
extern const char tfsc_copy_engine[];

/* Is p something the engine can copy to or from? Checked before any pin is taken. */
int tfsc_copy_check(const void *p, size_t len);
/* Make host memory DMA-able (the arena); *done says whether it was. */
int tfsc_copy_register(void *host, size_t len, bool *done);
void tfsc_copy_unregister(void *host);
/* Queue a copy on stream: host to device, device to host, or zeros to device. */
int tfsc_copy_h2d(void *dev, const void *host, size_t n, void *stream);
int tfsc_copy_d2h(void *host, const void *dev, size_t n, void *stream);
int tfsc_copy_zero(void *dev, size_t n, void *stream);
/* Wait for everything queued on stream. */
int tfsc_copy_sync(void *stream);
/* Pinned host memory for bounce buffers. */
void *tfsc_copy_host_alloc(size_t n);
void tfsc_copy_host_free(void *p);

#endif

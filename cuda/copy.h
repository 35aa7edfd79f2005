/*
 * copy.h - how libtensorfs-cuda moves bytes: the copy engine.
 *
 * copy_cuda.c does it with the CUDA runtime (the library people link);
 * copy_cpu.c does it with memcpy, so that the protocol and the library's
 * logic are tested on machines without a GPU (the "device" pointer is
 * then host memory). Each function returns 0 or -errno with the message
 * set through tfsc_fail.
 *
 * Copies are asynchronous: queued on a stream, done some time before the
 * stream is synchronized or an event recorded after them has been waited
 * for. Until then neither side of a copy may be reused or released. The
 * pipelines of client.c (the next batch or bounce buffer filled while the
 * last is copied) rest on events; the CPU engine defers its memcpys to the
 * wait, so that a buffer reused too early shows in the tests as wrong bytes.
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
/*
 * Events: a point in a stream's queue. tfsc_copy_event_wait returns once
 * every copy queued before the last tfsc_copy_event_record of ev is done;
 * an event never recorded is done.
 */
int tfsc_copy_event_new(void **ev);
void tfsc_copy_event_free(void *ev);
int tfsc_copy_event_record(void *ev, void *stream);
int tfsc_copy_event_wait(void *ev);
/* Pinned host memory for bounce buffers. */
void *tfsc_copy_host_alloc(size_t n);
void tfsc_copy_host_free(void *p);

#endif

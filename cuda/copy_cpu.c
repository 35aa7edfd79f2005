/*
 * copy_cpu.c - the copy engine of the protocol tests: memcpy.
 *
 * Linked instead of copy_cuda.c into the tests that check the shared-arena
 * protocol and the library's batching on machines without a GPU. The
 * "device" pointer is host memory. A copy is queued, as on a CUDA stream,
 * and done only when the calling thread waits for an event recorded after
 * it or syncs: a pipeline that reuses a buffer or releases a pin before it
 * has waited then copies the wrong bytes, and the tests see them. There is
 * one queue per thread (the library waits in the thread that queued), and
 * its memory is freed whenever it drains.
 */
#include "client.h"
#include "copy.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define HOST_ALIGN 4096
#define QUEUE_MIN 16 /* copies a queue has room for at first */

/* A queued copy; src NULL: zeros. */
struct op {
	void *dst;
	const void *src;
	size_t n;
};

/* This thread's queue: ops [0, q_n) are copies q_base to q_base + q_n - 1 in queue order. */
static __thread struct op *q;
static __thread size_t q_n, q_cap;
static __thread uint64_t q_base;

/* An event: the number of copies queued before its record. */
struct cpu_event {
	uint64_t seq;
};

static int enqueue(void *dst, const void *src, size_t n)
{
	if (q_n == q_cap) {
		size_t cap = q_cap ? 2 * q_cap : QUEUE_MIN;
		struct op *nq = realloc(q, cap * sizeof(*nq));

		if (!nq)
			return tfsc_fail(-ENOMEM, "out of memory");
		q = nq;
		q_cap = cap;
	}
	q[q_n++] = (struct op){dst, src, n};
	return 0;
}

/* Do the copies queued before copy number upto; free the queue once empty. */
static void run_until(uint64_t upto)
{
	size_t i = 0;

	if (!q_n)
		return; /* nothing queued: q may be NULL, which memmove must not get */
	for (; i < q_n && q_base + i < upto; i++) {
		if (q[i].src)
			memcpy(q[i].dst, q[i].src, q[i].n);
		else
			memset(q[i].dst, 0, q[i].n);
	}
	memmove(q, q + i, (q_n - i) * sizeof(*q));
	q_n -= i;
	q_base += i;
	if (q_n == 0) {
		free(q);
		q = NULL;
		q_cap = 0;
	}
}

const char tfsc_copy_engine[] = "cpu";

/*
 * Test hook: the copy after this many more fails with -EIO, so that the
 * tests reach the library's error paths (a failed copy of a pinned batch).
 * Negative: never.
 */
int tfsc_copy_fail_after = -1;

static int maybe_fail(void)
{
	if (tfsc_copy_fail_after < 0 || tfsc_copy_fail_after-- > 0)
		return 0;
	return tfsc_fail(-EIO, "copy failed (test hook)");
}

int tfsc_copy_check(const void *p, size_t len)
{
	(void)p;
	(void)len;
	return 0;
}

int tfsc_copy_register(void *host, size_t len, bool *done)
{
	(void)host;
	(void)len;
	*done = false;
	return 0;
}

void tfsc_copy_unregister(void *host)
{
	(void)host;
}

int tfsc_copy_h2d(void *dev, const void *host, size_t n, void *stream)
{
	(void)stream;
	if (maybe_fail())
		return -EIO;
	return enqueue(dev, host, n);
}

int tfsc_copy_d2h(void *host, const void *dev, size_t n, void *stream)
{
	(void)stream;
	if (maybe_fail())
		return -EIO;
	return enqueue(host, dev, n);
}

int tfsc_copy_zero(void *dev, size_t n, void *stream)
{
	(void)stream;
	if (maybe_fail())
		return -EIO;
	return enqueue(dev, NULL, n);
}

int tfsc_copy_sync(void *stream)
{
	(void)stream;
	run_until(UINT64_MAX);
	return 0;
}

int tfsc_copy_event_new(void **ev)
{
	*ev = calloc(1, sizeof(struct cpu_event));
	return *ev ? 0 : tfsc_fail(-ENOMEM, "out of memory");
}

void tfsc_copy_event_free(void *ev)
{
	free(ev);
}

int tfsc_copy_event_record(void *ev, void *stream)
{
	(void)stream;
	((struct cpu_event *)ev)->seq = q_base + q_n;
	return 0;
}

int tfsc_copy_event_wait(void *ev)
{
	run_until(((struct cpu_event *)ev)->seq);
	return 0;
}

void *tfsc_copy_host_alloc(size_t n)
{
	return aligned_alloc(HOST_ALIGN, (n + HOST_ALIGN - 1) / HOST_ALIGN * HOST_ALIGN);
}

void tfsc_copy_host_free(void *p)
{
	free(p);
}

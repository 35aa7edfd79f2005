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
 *
 * A GPU's copies are slower than its compute; memcpy is not. To let the
 * tests of the activation offloader see copies that lag the compute, as
 * on a GPU, TENSORFS_CPU_COPY_GBPS sets a rate in GB/s (10^9 bytes): "R"
 * for both directions, or "h2d=R,d2h=R" (either may be left out: no
 * limit). Each direction is then one engine, as a GPU has one copy engine
 * each way: a copy starts when the engine is free, and the thread that
 * runs it returns no sooner than n / R after that start. Zero fills are a
 * kernel on a GPU, not a copy: no limit. A bad value fails every copy.
 */
#include "client.h"
#include "copy.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define HOST_ALIGN 4096
#define QUEUE_MIN 16 /* copies a queue has room for at first */
#define RATE_ENV "TENSORFS_CPU_COPY_GBPS"
#define NS_PER_S 1000000000ULL

enum dir { DIR_H2D, DIR_D2H, DIR_ZERO };

/* A queued copy; src NULL: zeros. */
struct op {
	void *dst;
	const void *src;
	size_t n;
	enum dir dir;
};

/*
 * The copy engine of one direction under RATE_ENV: bytes per ns (0: no
 * limit), and when the copies already given to it will be done.
 */
struct engine {
	double bytes_per_ns;
	uint64_t free_at_ns; /* lock */
};

static struct engine engines[2]; /* DIR_H2D, DIR_D2H */
static pthread_mutex_t engine_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t rate_once = PTHREAD_ONCE_INIT;
static int rate_err; /* -EINVAL: RATE_ENV is malformed */

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * NS_PER_S + (uint64_t)ts.tv_nsec;
}

/* One "R" of RATE_ENV: a positive number of GB/s, as bytes per ns. */
static int parse_rate(const char *s, size_t len, double *bytes_per_ns)
{
	char buf[32], *end;
	double gbps;

	if (len == 0 || len >= sizeof(buf))
		return -EINVAL;
	memcpy(buf, s, len);
	buf[len] = 0;
	gbps = strtod(buf, &end);
	if (*end || !(gbps > 0) || gbps > 1e6)
		return -EINVAL;
	*bytes_per_ns = gbps; /* 10^9 bytes per 10^9 ns */
	return 0;
}

static void rate_init(void)
{
	const char *v = getenv(RATE_ENV);
	double r;

	if (!v || !*v)
		return;
	if (!strchr(v, '=')) {
		rate_err = parse_rate(v, strlen(v), &r);
		if (!rate_err)
			engines[DIR_H2D].bytes_per_ns = engines[DIR_D2H].bytes_per_ns = r;
		return;
	}
	while (*v && !rate_err) {
		size_t len = strcspn(v, ",");
		enum dir d;

		if (strncmp(v, "h2d=", 4) == 0)
			d = DIR_H2D;
		else if (strncmp(v, "d2h=", 4) == 0)
			d = DIR_D2H;
		else {
			rate_err = -EINVAL;
			break;
		}
		rate_err = parse_rate(v + 4, len < 4 ? 0 : len - 4, &engines[d].bytes_per_ns);
		v += len;
		if (*v == ',')
			v++;
	}
}

/* Checked before a copy is queued, so that the call fails, not the wait. */
static int rate_check(void)
{
	pthread_once(&rate_once, rate_init);
	if (rate_err)
		return tfsc_fail(rate_err, "%s=%s: want GB/s as R or h2d=R,d2h=R", RATE_ENV,
				 getenv(RATE_ENV));
	return 0;
}

/*
 * Give a copy of n bytes to its direction's engine: it starts when the
 * engine is free; returns when it is to end (0: no limit).
 */
static uint64_t engine_take(enum dir d, size_t n)
{
	uint64_t start, end;

	if (d == DIR_ZERO || engines[d].bytes_per_ns <= 0)
		return 0;
	pthread_mutex_lock(&engine_lock);
	start = now_ns();
	if (engines[d].free_at_ns > start)
		start = engines[d].free_at_ns;
	end = start + (uint64_t)((double)n / engines[d].bytes_per_ns);
	engines[d].free_at_ns = end;
	pthread_mutex_unlock(&engine_lock);
	return end;
}

/* Sleep until the engine would have finished (CLOCK_MONOTONIC ns). */
static void engine_wait(uint64_t end)
{
	struct timespec ts = {.tv_sec = (time_t)(end / NS_PER_S),
			      .tv_nsec = (long)(end % NS_PER_S)};

	if (!end)
		return;
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

/* This thread's queue: ops [0, q_n) are copies q_base to q_base + q_n - 1 in queue order. */
static __thread struct op *q;
static __thread size_t q_n, q_cap;
static __thread uint64_t q_base;

/* An event: the number of copies queued before its record. */
struct cpu_event {
	uint64_t seq;
};

static int enqueue(void *dst, const void *src, size_t n, enum dir dir)
{
	int ret = rate_check();

	if (ret)
		return ret;
	if (q_n == q_cap) {
		size_t cap = q_cap ? 2 * q_cap : QUEUE_MIN;
		struct op *nq = realloc(q, cap * sizeof(*nq));

		if (!nq)
			return tfsc_fail(-ENOMEM, "out of memory");
		q = nq;
		q_cap = cap;
	}
	q[q_n++] = (struct op){dst, src, n, dir};
	return 0;
}

/* Do the copies queued before copy number upto; free the queue once empty. */
static void run_until(uint64_t upto)
{
	size_t i = 0;

	if (!q_n)
		return; /* nothing queued: q may be NULL, which memmove must not get */
	for (; i < q_n && q_base + i < upto; i++) {
		uint64_t end = engine_take(q[i].dir, q[i].n);

		if (q[i].src)
			memcpy(q[i].dst, q[i].src, q[i].n);
		else
			memset(q[i].dst, 0, q[i].n);
		engine_wait(end);
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
	return enqueue(dev, host, n, DIR_H2D);
}

int tfsc_copy_d2h(void *host, const void *dev, size_t n, void *stream)
{
	(void)stream;
	if (maybe_fail())
		return -EIO;
	return enqueue(host, dev, n, DIR_D2H);
}

int tfsc_copy_zero(void *dev, size_t n, void *stream)
{
	(void)stream;
	if (maybe_fail())
		return -EIO;
	return enqueue(dev, NULL, n, DIR_ZERO);
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

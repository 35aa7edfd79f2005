/*
 * aio_handle.c - DeepSpeed's aio handle, in C.
 *
 * Every scheduled file (an op) goes to all P threads of the handle, in order;
 * thread t moves bytes [t*N/P, (t+1)*N/P) with its own libaio context, in
 * block_size requests, as do_aio_operation_overlap() or
 * do_aio_operation_sequential() in deepspeed_aio_common.cpp.  The file is
 * closed in ah_wait(), once every thread is done with it.  Unlike DeepSpeed,
 * the result of every request is checked against its size.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libaio.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "aio_handle.h"
#include "swapbench.h"

/* Mode of files DeepSpeed creates (open_file() in deepspeed_aio_common.cpp). */
#define AH_FILE_MODE 0600
#define AH_OPS_INITIAL 16
/* Linux thread names hold 15 characters. */
#define AH_THREAD_NAME_MAX 15

/* The first failure seen in a transfer, and how many there were. */
struct ah_fail {
	uint64_t count;
	int err;	  /* -errno of a failed request or call; 0 for a short one */
	const char *call; /* the call that failed, when not a request */
	uint64_t off;	  /* file offset of the request */
	long long res;	  /* bytes transferred */
	uint64_t len;	  /* bytes asked for */
};

struct ah_op {
	const char *path;
	int fd;
	bool read;
	char *buf;
	uint64_t nbytes;
	double t_sched;
	/* guarded by the handle's lock */
	int remaining;
	double t_done;
	struct ah_fail fail;
};

struct ah_thread {
	struct ah_handle *h;
	int tid;
	pthread_t thread;
	bool started;
	io_context_t ctx;
	struct iocb *iocbs; /* queue_depth of them */
	struct iocb **free; /* stack of iocbs not in flight */
	int nfree;
	struct iocb **batch;	 /* iocbs of one io_submit */
	struct io_event *events; /* queue_depth of them */
	int next;		 /* next op to run; guarded by the handle's lock */
};

struct ah_handle {
	struct ah_config cfg;
	char name[8];
	struct ah_thread *threads;
	pthread_mutex_t lock; /* guards ops, nops, ndone, stop, ops' status, threads' next */
	pthread_cond_t work;  /* an op was scheduled, or stop was set */
	pthread_cond_t done;  /* an op finished */
	struct ah_op **ops;
	int nops;
	int cap;
	int ndone;
	bool stop;
};

static void fail_request(struct ah_fail *f, const struct iocb *cb, long long res)
{
	if (f->count++)
		return;
	f->err = res < 0 ? (int)res : 0;
	f->call = NULL;
	f->off = (uint64_t)cb->u.c.offset;
	f->res = res;
	f->len = cb->u.c.nbytes;
}

static void fail_call(struct ah_fail *f, const char *call, int err, uint64_t off)
{
	if (f->count++)
		return;
	f->err = err;
	f->call = call;
	f->off = off;
	f->res = 0;
	f->len = 0;
}

/* Submit @n prepared iocbs; returns how many went in (the rest are failed). */
static int submit(struct ah_thread *t, int n, struct ah_fail *f)
{
	int done = 0;

	while (done < n) {
		int chunk = t->h->cfg.single_submit ? 1 : n - done;
		int r = io_submit(t->ctx, chunk, t->batch + done);

		if (r == -EINTR)
			continue;
		if (r <= 0) {
			fail_call(f, "io_submit", r ? r : -EIO,
				  (uint64_t)t->batch[done]->u.c.offset);
			break;
		}
		done += r;
	}
	for (int i = done; i < n; i++)
		t->free[t->nfree++] = t->batch[i];
	return done;
}

/* Reap between @min and @max completions and check each one's size. */
static int reap(struct ah_thread *t, int min, int max, struct ah_fail *f)
{
	int r;

	do {
		r = io_pgetevents(t->ctx, min, max, t->events, NULL, NULL);
	} while (r == -EINTR);
	if (r < 0) {
		fail_call(f, "io_pgetevents", r, 0);
		return r;
	}
	for (int i = 0; i < r; i++) {
		struct iocb *cb = t->events[i].obj;
		long long res = (long long)(long)t->events[i].res;

		if (res != (long long)cb->u.c.nbytes)
			fail_request(f, cb, res);
		t->free[t->nfree++] = cb;
	}
	return r;
}

/* Take a free iocb and point it at [off, off+len) of the op. */
static struct iocb *prep(struct ah_thread *t, const struct ah_op *op, uint64_t off, uint64_t len)
{
	struct iocb *cb = t->free[--t->nfree];

	if (op->read)
		io_prep_pread(cb, op->fd, op->buf + off, len, (long long)off);
	else
		io_prep_pwrite(cb, op->fd, op->buf + off, len, (long long)off);
	return cb;
}

/* do_aio_operation_overlap(): keep queue_depth requests in flight. */
static void run_overlap(struct ah_thread *t, const struct ah_op *op, uint64_t off, uint64_t end,
			struct ah_fail *f)
{
	const int qd = t->h->cfg.queue_depth;
	const uint64_t bs = t->h->cfg.block_size;
	int pending = 0;

	for (;;) {
		int n = 0;

		while (pending + n < qd && off < end) {
			uint64_t len = end - off < bs ? end - off : bs;

			t->batch[n++] = prep(t, op, off, len);
			off += len;
		}
		if (n > 0) {
			int in = submit(t, n, f);

			pending += in;
			if (in < n)
				off = end; /* issue nothing more; drain what is in flight */
		}
		if (pending == 0)
			break;
		int r = reap(t, 1, pending, f);

		if (r < 0)
			break;
		pending -= r;
	}
}

/* do_aio_operation_sequential(): submit queue_depth requests, wait for all. */
static void run_sequential(struct ah_thread *t, const struct ah_op *op, uint64_t off, uint64_t end,
			   struct ah_fail *f)
{
	const int qd = t->h->cfg.queue_depth;
	const uint64_t bs = t->h->cfg.block_size;

	while (off < end) {
		int n = 0;

		while (n < qd && off < end) {
			uint64_t len = end - off < bs ? end - off : bs;

			t->batch[n++] = prep(t, op, off, len);
			off += len;
		}
		int pending = submit(t, n, f);

		while (pending > 0) {
			int r = reap(t, pending, pending, f);

			if (r < 0)
				return;
			pending -= r;
		}
		if (f->count && f->call)
			return;
	}
}

/* One thread's slice of one op: cpu_op_desc_t::run(). */
static void run_slice(struct ah_thread *t, struct ah_op *op)
{
	struct ah_handle *h = t->h;
	uint64_t per_thread = op->nbytes / (uint64_t)h->cfg.threads;
	uint64_t off = per_thread * (uint64_t)t->tid;
	struct ah_fail f = {0};

	if (h->cfg.overlap_events)
		run_overlap(t, op, off, off + per_thread, &f);
	else
		run_sequential(t, op, off, off + per_thread, &f);

	pthread_mutex_lock(&h->lock);
	if (f.count) {
		uint64_t before = op->fail.count;

		if (!before || f.off < op->fail.off)
			op->fail = f;
		op->fail.count = before + f.count;
	}
	if (--op->remaining == 0) {
		op->t_done = sb_now();
		h->ndone++;
		pthread_cond_broadcast(&h->done);
	}
	pthread_mutex_unlock(&h->lock);
}

static void *thread_main(void *arg)
{
	struct ah_thread *t = arg;
	struct ah_handle *h = t->h;

	pthread_mutex_lock(&h->lock);
	for (;;) {
		while (t->next >= h->nops && !h->stop)
			pthread_cond_wait(&h->work, &h->lock);
		if (t->next >= h->nops)
			break;
		struct ah_op *op = h->ops[t->next++];

		pthread_mutex_unlock(&h->lock);
		run_slice(t, op);
		pthread_mutex_lock(&h->lock);
	}
	pthread_mutex_unlock(&h->lock);
	return NULL;
}

static int thread_init(struct ah_handle *h, struct ah_thread *t, int tid)
{
	int qd = h->cfg.queue_depth;
	int ret;

	t->h = h;
	t->tid = tid;
	t->iocbs = calloc((size_t)qd, sizeof(*t->iocbs));
	t->free = calloc((size_t)qd, sizeof(*t->free));
	t->batch = calloc((size_t)qd, sizeof(*t->batch));
	t->events = calloc((size_t)qd, sizeof(*t->events));
	if (!t->iocbs || !t->free || !t->batch || !t->events)
		return -ENOMEM;
	for (int i = 0; i < qd; i++)
		t->free[t->nfree++] = &t->iocbs[i];
	ret = io_setup(qd, &t->ctx);
	if (ret < 0) {
		t->ctx = 0;
		sb_err("io_setup(%d): %s (see /proc/sys/fs/aio-max-nr)", qd, strerror(-ret));
		return ret;
	}
	return 0;
}

static void thread_fini(struct ah_thread *t)
{
	if (t->ctx)
		io_destroy(t->ctx);
	free(t->iocbs);
	free(t->free);
	free(t->batch);
	free(t->events);
}

int ah_create(struct ah_handle **out, const struct ah_config *cfg, const char *name)
{
	struct ah_handle *h;
	char tname[32];
	int ret = 0;
	int i;

	assert(cfg->threads > 0 && cfg->queue_depth > 0 && cfg->block_size > 0);
	h = calloc(1, sizeof(*h));
	if (!h)
		return -ENOMEM;
	h->cfg = *cfg;
	snprintf(h->name, sizeof(h->name), "%s", name);
	pthread_mutex_init(&h->lock, NULL);
	pthread_cond_init(&h->work, NULL);
	pthread_cond_init(&h->done, NULL);
	h->threads = calloc((size_t)cfg->threads, sizeof(*h->threads));
	if (!h->threads) {
		ret = -ENOMEM;
		goto cleanup;
	}
	for (i = 0; i < cfg->threads; i++) {
		ret = thread_init(h, &h->threads[i], i);
		if (ret)
			goto cleanup;
	}
	for (i = 0; i < cfg->threads; i++) {
		struct ah_thread *t = &h->threads[i];

		ret = -pthread_create(&t->thread, NULL, thread_main, t);
		if (ret)
			goto cleanup;
		t->started = true;
		snprintf(tname, sizeof(tname), "sb-%s-%d", h->name, i);
		tname[AH_THREAD_NAME_MAX] = '\0';
		pthread_setname_np(t->thread, tname);
	}
	*out = h;
	return 0;
cleanup:
	ah_destroy(h);
	return ret;
}

void ah_destroy(struct ah_handle *h)
{
	int i;

	if (!h)
		return;
	if (ah_pending(h))
		ah_wait(h, NULL);
	pthread_mutex_lock(&h->lock);
	h->stop = true;
	pthread_cond_broadcast(&h->work);
	pthread_mutex_unlock(&h->lock);
	for (i = 0; h->threads && i < h->cfg.threads; i++) {
		if (h->threads[i].started)
			pthread_join(h->threads[i].thread, NULL);
		thread_fini(&h->threads[i]);
	}
	pthread_cond_destroy(&h->done);
	pthread_cond_destroy(&h->work);
	pthread_mutex_destroy(&h->lock);
	free(h->ops);
	free(h->threads);
	free(h);
}

static int schedule(struct ah_handle *h, const char *path, int fd, bool read, void *buf,
		    uint64_t nbytes)
{
	struct ah_op *op = calloc(1, sizeof(*op));

	if (!op)
		return -ENOMEM;
	op->path = path;
	op->fd = fd;
	op->read = read;
	op->buf = buf;
	op->nbytes = nbytes;
	op->remaining = h->cfg.threads;
	op->t_sched = sb_now();

	pthread_mutex_lock(&h->lock);
	if (h->nops == h->cap) {
		int cap = h->cap ? h->cap * 2 : AH_OPS_INITIAL;
		struct ah_op **ops = realloc(h->ops, (size_t)cap * sizeof(*ops));

		if (!ops) {
			pthread_mutex_unlock(&h->lock);
			free(op);
			return -ENOMEM;
		}
		h->ops = ops;
		h->cap = cap;
	}
	h->ops[h->nops++] = op;
	pthread_cond_broadcast(&h->work);
	pthread_mutex_unlock(&h->lock);
	return 0;
}

int ah_pread(struct ah_handle *h, const char *path, void *buf, uint64_t nbytes)
{
	struct stat st;
	int fd;
	int ret;

	assert(nbytes % (uint64_t)h->cfg.threads == 0);
	if (stat(path, &st)) {
		ret = -errno;
		sb_err("stat %s: %s", path, strerror(errno));
		return ret;
	}
	if ((uint64_t)st.st_size != nbytes) {
		/* writes never truncate: a bigger file may be left by other settings */
		sb_err("%s: file is %lld bytes, expected %" PRIu64 "%s", path,
		       (long long)st.st_size, nbytes,
		       (uint64_t)st.st_size > nbytes
			   ? " (left by a run with other settings? start from an empty folder)"
			   : "");
		return -EIO;
	}
	fd = open(path, O_RDONLY | O_DIRECT);
	if (fd < 0) {
		ret = -errno;
		sb_err("open %s for read: %s", path, strerror(errno));
		return ret;
	}
	ret = schedule(h, path, fd, true, buf, nbytes);
	if (ret)
		close(fd);
	return ret;
}

int ah_pwrite(struct ah_handle *h, const char *path, const void *buf, uint64_t nbytes)
{
	int fd;
	int ret;

	assert(nbytes % (uint64_t)h->cfg.threads == 0);
	fd = open(path, O_WRONLY | O_CREAT | O_DIRECT, AH_FILE_MODE);
	if (fd < 0) {
		ret = -errno;
		sb_err("open %s for write: %s", path, strerror(errno));
		return ret;
	}
	ret = schedule(h, path, fd, false, (void *)buf, nbytes);
	if (ret)
		close(fd);
	return ret;
}

int ah_pending(const struct ah_handle *h)
{
	return h->nops;
}

static void report_fail(const struct ah_op *op)
{
	const struct ah_fail *f = &op->fail;
	const char *what = op->read ? "read" : "write";
	char more[64] = "";

	if (f->count > 1)
		snprintf(more, sizeof(more), " (%" PRIu64 " failed requests)", f->count);
	if (f->call)
		sb_err("%s %s offset %" PRIu64 ": %s: %s%s", what, op->path, f->off, f->call,
		       strerror(-f->err), more);
	else if (f->err)
		sb_err("%s %s offset %" PRIu64 ": %s (%" PRIu64 " bytes)%s", what, op->path, f->off,
		       strerror(-f->err), f->len, more);
	else
		sb_err("short %s %s offset %" PRIu64 ": %lld of %" PRIu64 " bytes%s", what,
		       op->path, f->off, f->res, f->len, more);
}

int ah_wait(struct ah_handle *h, struct ah_result *res)
{
	struct ah_result r = {0};
	double first = 0, last = 0;
	int ret = 0;
	int i;

	pthread_mutex_lock(&h->lock);
	while (h->ndone < h->nops)
		pthread_cond_wait(&h->done, &h->lock);
	for (i = 0; i < h->nops; i++) {
		struct ah_op *op = h->ops[i];

		close(op->fd);
		if (op->fail.count) {
			report_fail(op);
			r.errors += op->fail.count;
			ret = -EIO;
		}
		if (i == 0 || op->t_sched < first)
			first = op->t_sched;
		if (op->t_done > last)
			last = op->t_done;
		r.ops++;
		r.bytes += op->nbytes;
		free(op);
	}
	h->nops = 0;
	h->ndone = 0;
	for (i = 0; i < h->cfg.threads; i++)
		h->threads[i].next = 0;
	pthread_mutex_unlock(&h->lock);
	r.busy_s = r.ops ? last - first : 0;
	if (res)
		*res = r;
	return ret;
}

/*
 * dev_engine.c - the engines that move a slab device's requests to its
 * file and back: io_uring on an O_DIRECT slab (nvme), libaio where
 * io_uring is not to be had, and a pool of threads doing pread/pwrite (a
 * pfs folder). Each takes requests with dev_take and hands each finished
 * transfer to dev_finish; a write that extends the slab grows it ahead
 * (slab_grow), and one into space given back allocates it again first.
 *
 * Calls the queue (dev.c) and dev_measure.c; dev_slab.c calls it to set
 * an engine up.
 */
#include "dev_int.h"
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

static int slab_sync(struct tb_dev *d)
{
	if (fdatasync(d->fd) < 0) {
		int e = errno;

		log_err("%s: fdatasync of the slab failed: %s", d->name, strerror(e));
		return -e;
	}
	return 0;
}

/* ---- engine: io_uring ---- */

struct uring_priv {
	struct io_uring ring;
	bool fixed_bufs;
};

static int register_buffers(struct tb_dev *d, struct uring_priv *u)
{
	size_t n = (d->arena->bytes + URING_MAX_BUF - 1) / URING_MAX_BUF;
	struct iovec *iov = calloc(n, sizeof(*iov));
	int ret;

	if (!iov)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		iov[i].iov_base = (char *)d->arena->base + i * URING_MAX_BUF;
		iov[i].iov_len = d->arena->bytes - i * URING_MAX_BUF;
		if (iov[i].iov_len > URING_MAX_BUF)
			iov[i].iov_len = URING_MAX_BUF;
	}
	ret = io_uring_register_buffers(&u->ring, iov, (unsigned)n);
	free(iov);
	u->fixed_bufs = ret == 0;
	return ret;
}

/*
 * Raise the slab's size to end. The I/O threads raise it (a pfs pool has
 * many); dev_give_back lowers it (cut_end), under the device lock with no
 * slot in use past the new end, so that no write goes there meanwhile.
 */
static void slab_end_raise(struct tb_dev *d, uint64_t end)
{
	uint64_t at = __atomic_load_n(&d->slab_end, __ATOMIC_RELAXED);

	while (at < end && !__atomic_compare_exchange_n(&d->slab_end, &at, end, false,
							__ATOMIC_RELAXED, __ATOMIC_RELAXED))
		;
}

/*
 * Grow the slab file ahead of a write that would extend it, in SLAB_GROW
 * steps, with fallocate. A write past the end of a file, or into a hole,
 * takes the filesystem's inode lock exclusively (ext4, xfs) and io_uring
 * hands it to a worker thread, so such writes run one at a time; into
 * space allocated ahead they run in parallel, as overwrites do. Called on
 * the device's I/O thread; a failure only costs that speed.
 */
static void slab_grow(struct tb_dev *d, uint64_t end)
{
	uint64_t to, cap = d->alloc.nslots * d->block_size, free_bytes, slab_bytes;
	uint64_t at = __atomic_load_n(&d->slab_end, __ATOMIC_RELAXED);

	if (end <= at)
		return;
	if (!d->prealloc) {
		slab_end_raise(d, end); /* the write extends the slab */
		return;
	}
	to = (end + SLAB_GROW - 1) / SLAB_GROW * SLAB_GROW;
	if (to > cap)
		to = cap > end ? cap : end;
	/*
	 * Never into the filesystem's reserve: the metadata store may share
	 * the filesystem (meta= inside the folder), and a slab grown into all
	 * of a filesystem that others had filled left its commits ENOSPC.
	 */
	if (dev_fs_room(d, &free_bytes, &slab_bytes) < 0)
		free_bytes = UINT64_MAX; /* not known: try */
	if (to - at > free_bytes)
		to = end;
	if (to - at > free_bytes) {
		slab_end_raise(d, end); /* the write itself will say whether it fits */
		return;
	}
	if (fallocate(d->fd, 0, (off_t)at, (off_t)(to - at)) == 0) {
		slab_end_raise(d, to);
		return;
	}
	if (errno == EOPNOTSUPP || errno == ENOSYS)
		d->prealloc = false; /* the filesystem cannot: writes extend the slab */
	slab_end_raise(d, end);
}

/*
 * The run of slots that fill_run found given back is allocated again
 * before the write goes. Within the slab's size, with the write's own
 * slot first; a failure only costs speed (the write fills its hole).
 */
static void slab_fill(struct tb_dev *d, struct tb_io *r)
{
	if (!r->fill)
		return;
	if (fallocate(d->fd, 0, (off_t)(r->slot * d->block_size),
		      (off_t)(r->fill * d->block_size)) < 0 &&
	    (errno == EOPNOTSUPP || errno == ENOSYS))
		d->prealloc = false;
	r->fill = 0;
}

static void uring_prep(struct tb_dev *d, struct uring_priv *u, struct io_uring_sqe *sqe,
		       struct tb_io *r)
{
	char *buf = (char *)r->buf + r->done_bytes;
	unsigned len = (unsigned)(r->len - r->done_bytes);
	off_t off = (off_t)(r->slot * d->block_size + r->done_bytes);
	size_t arena_off = (size_t)((char *)r->buf - (char *)d->arena->base);

	if (r->op == IO_WRITE) {
		slab_fill(d, r);
		slab_grow(d, (uint64_t)off + len);
	}
	if (u->fixed_bufs && (char *)r->buf >= (char *)d->arena->base &&
	    arena_off < d->arena->bytes) {
		int idx = (int)(arena_off / URING_MAX_BUF);

		if (r->op == IO_READ)
			io_uring_prep_read_fixed(sqe, d->fd, buf, len, off, idx);
		else
			io_uring_prep_write_fixed(sqe, d->fd, buf, len, off, idx);
	} else if (r->op == IO_READ) {
		io_uring_prep_read(sqe, d->fd, buf, len, (uint64_t)off);
	} else {
		io_uring_prep_write(sqe, d->fd, buf, len, (uint64_t)off);
	}
	io_uring_sqe_set_data(sqe, r);
}

static struct io_uring_sqe *get_sqe(struct io_uring *ring)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(ring);

	if (!sqe) {
		io_uring_submit(ring);
		sqe = io_uring_get_sqe(ring);
	}
	return sqe;
}

/* Puts what is queued for the device into the ring; returns how much. */
static unsigned uring_feed(struct tb_dev *d, struct uring_priv *u, struct tb_io **batch)
{
	unsigned n = dev_take(d, batch, ENGINE_BATCH);

	for (unsigned i = 0; i < n; i++)
		uring_prep(d, u, get_sqe(&u->ring), batch[i]);
	return n;
}

static void *uring_thread(void *arg)
{
	struct tb_dev *d = arg;
	struct uring_priv *u = d->priv;
	struct tb_io *batch[ENGINE_BATCH];
	bool poll_armed = false;
	dev_name_thread(d);
	for (;;) {
		struct io_uring_cqe *cqe;
		unsigned head, seen = 0;
		uint64_t throttle;

		pthread_mutex_lock(&d->lock);
		bool done = d->stopping && dev_idle_locked(d);
		pthread_mutex_unlock(&d->lock);
		if (done)
			break;
		uring_feed(d, u, batch);
		if (!poll_armed) {
			struct io_uring_sqe *sqe = get_sqe(&u->ring);

			io_uring_prep_poll_add(sqe, d->wake_efd, POLLIN);
			io_uring_sqe_set_data(sqe, NULL);
			poll_armed = true;
		}
		throttle = dev_throttle_ns(d);
		if (throttle) {
			struct __kernel_timespec ts = {(long long)(throttle / 1000000000ULL),
						       (long long)(throttle % 1000000000ULL)};

			io_uring_submit(&u->ring);
			io_uring_wait_cqe_timeout(&u->ring, &cqe, &ts);
		} else {
			io_uring_submit_and_wait(&u->ring, 1);
		}
		io_uring_for_each_cqe(&u->ring, head, cqe)
		{
			struct tb_io *r = io_uring_cqe_get_data(cqe);

			seen++;
			if (!r) {
				dev_drain_efd(d->wake_efd);
				poll_armed = false;
				continue;
			}
			if (dev_finish(d, r, cqe->res))
				dev_requeue(d, r);
			/*
			 * A completion's callbacks can take a while (a reader's
			 * reply copies its block to the kernel): what was queued
			 * meanwhile goes to the device now, not after the batch.
			 * Left for the batch's end, the device sat idle 4 times in
			 * 10 under a sequential reader.
			 */
			if (uring_feed(d, u, batch))
				io_uring_submit(&u->ring);
		}
		io_uring_cq_advance(&u->ring, seen);
	}
	return NULL;
}

static void uring_fini(struct tb_dev *d)
{
	struct uring_priv *u = d->priv;

	if (u) {
		io_uring_queue_exit(&u->ring);
		free(u);
	}
}

static const struct dev_engine uring_engine = {
	.name = "io_uring",
	.thread = uring_thread,
	.sync = slab_sync,
	.fini = uring_fini,
};

int dev_uring_setup(struct tb_dev *d)
{
	struct uring_priv *u = calloc(1, sizeof(*u));
	int ret;

	if (!u)
		return -ENOMEM;
	/* Room for a full queue of resubmissions and the eventfd poll. */
	ret = io_uring_queue_init(d->qd * 2 + 2, &u->ring, 0);
	if (ret < 0) {
		free(u);
		return ret;
	}
	d->priv = u;
	d->eng = &uring_engine;
	if (register_buffers(d, u) < 0)
		log_info("%s: cannot register the arena with io_uring; using unregistered "
			 "buffers",
			 d->name);
	return 0;
}

/* ---- engine: libaio ---- */

struct aio_priv {
	io_context_t ctx;
	int efd;
};

static void aio_prep(struct tb_dev *d, struct aio_priv *a, struct tb_io *r)
{
	char *buf = (char *)r->buf + r->done_bytes;
	size_t len = r->len - r->done_bytes;
	long long off = (long long)(r->slot * d->block_size + r->done_bytes);

	if (r->op == IO_READ) {
		io_prep_pread(&r->iocb, d->fd, buf, len, off);
	} else {
		slab_fill(d, r);
		slab_grow(d, (uint64_t)off + len);
		io_prep_pwrite(&r->iocb, d->fd, buf, len, off);
	}
	io_set_eventfd(&r->iocb, a->efd);
	r->iocb.data = r;
}

static void aio_submit_batch(struct tb_dev *d, struct aio_priv *a, struct tb_io **batch,
			     unsigned n)
{
	struct iocb *iocbs[256];
	unsigned done = 0;

	for (unsigned i = 0; i < n; i++) {
		aio_prep(d, a, batch[i]);
		iocbs[i] = &batch[i]->iocb;
	}
	while (done < n) {
		int ret = io_submit(a->ctx, (long)(n - done), iocbs + done);

		if (ret > 0) {
			done += (unsigned)ret;
			continue;
		}
		if (ret == -EAGAIN || ret == -EINTR) {
			usleep(100);
			continue;
		}
		/* The rest cannot be submitted at all: fail them. */
		for (; done < n; done++)
			dev_finish(d, batch[done], ret ? ret : -EIO);
	}
}

/* Submits what is queued for the device. */
static void aio_feed(struct tb_dev *d, struct aio_priv *a, struct tb_io **batch)
{
	unsigned n = dev_take(d, batch, ENGINE_BATCH);

	if (n)
		aio_submit_batch(d, a, batch, n);
}

static void *aio_thread(void *arg)
{
	struct tb_dev *d = arg;
	struct aio_priv *a = d->priv;
	struct tb_io *batch[ENGINE_BATCH];
	struct io_event events[ENGINE_BATCH];
	dev_name_thread(d);
	for (;;) {
		struct pollfd pfd[2] = {{d->wake_efd, POLLIN, 0}, {a->efd, POLLIN, 0}};
		struct timespec zero = {0, 0};
		uint64_t throttle;
		int got;

		pthread_mutex_lock(&d->lock);
		bool done = d->stopping && dev_idle_locked(d);
		pthread_mutex_unlock(&d->lock);
		if (done)
			break;
		aio_feed(d, a, batch);
		throttle = dev_throttle_ns(d);
		if (poll(pfd, 2, throttle ? (int)(throttle / 1000000 + 1) : -1) < 0 &&
		    errno != EINTR)
			break;
		dev_drain_efd(d->wake_efd);
		dev_drain_efd(a->efd);
		got = io_getevents(a->ctx, 0, ENGINE_BATCH, events, &zero);
		for (int i = 0; i < got; i++) {
			struct tb_io *r = events[i].data;

			if (dev_finish(d, r, (long)events[i].res))
				dev_requeue(d, r);
			aio_feed(d, a, batch); /* as uring_thread does */
		}
	}
	return NULL;
}

static void aio_fini(struct tb_dev *d)
{
	struct aio_priv *a = d->priv;

	if (a) {
		io_destroy(a->ctx);
		if (a->efd >= 0)
			close(a->efd);
		free(a);
	}
}

static const struct dev_engine aio_engine = {
	.name = "libaio",
	.thread = aio_thread,
	.sync = slab_sync,
	.fini = aio_fini,
};

int dev_aio_setup(struct tb_dev *d)
{
	struct aio_priv *a = calloc(1, sizeof(*a));
	int ret;

	if (!a)
		return -ENOMEM;
	ret = io_setup((int)d->qd, &a->ctx);
	if (ret < 0) {
		free(a);
		return ret;
	}
	a->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (a->efd < 0) {
		io_destroy(a->ctx);
		free(a);
		return -errno;
	}
	d->priv = a;
	d->eng = &aio_engine;
	return 0;
}

/* ---- engine: a thread pool (pfs) ---- */

/*
 * The pool starts with POOL_THREADS_START threads (or the depth, if lower)
 * and grows by one whenever a request is queued while none is idle, up to
 * the device's depth, which dev_set_readahead raises to cover a reader's
 * whole window: a remote folder's latency is hidden only by as many
 * requests in flight as latency x bandwidth holds.
 */
struct pool_priv {
	pthread_t threads[POOL_THREADS_MAX];
	unsigned n;	   /* started; with d->lock */
	unsigned idle;	   /* waiting for requests; with d->lock */
	pthread_cond_t cv; /* with d->lock: requests queued, or stopping */
};

static void *pool_thread(void *arg)
{
	struct tb_dev *d = arg;
	struct pool_priv *p = d->priv;
	uint64_t next_look = 0;

	dev_name_thread(d);
	for (;;) {
		struct tb_io *r;
		uint64_t throttle, now = dev_now_ns();

		/* Not the lock for each request: a look is due once a second. */
		if (now >= next_look) {
			next_look = now + POOL_LOOK_NS;
			pthread_mutex_lock(&d->lock);
			dev_room_look(d);
			pthread_mutex_unlock(&d->lock);
		}
		if (dev_take(d, &r, 1) == 0) {
			pthread_mutex_lock(&d->lock);
			if (d->stopping && dev_idle_locked(d)) {
				pthread_mutex_unlock(&d->lock);
				break;
			}
			p->idle++;
			throttle = d->bw_cap && d->tokens <= 0
					   ? (uint64_t)(-d->tokens * 1e9 / (double)d->bw_cap) + 1000
					   : 100000000ULL;
			struct timespec ts;
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_nsec += (long)(throttle % 1000000000ULL);
			ts.tv_sec += (time_t)(throttle / 1000000000ULL) + ts.tv_nsec / 1000000000L;
			ts.tv_nsec %= 1000000000L;
			pthread_cond_timedwait(&p->cv, &d->lock, &ts);
			p->idle--;
			pthread_mutex_unlock(&d->lock);
			continue;
		}
		do {
			char *buf = (char *)r->buf + r->done_bytes;
			size_t len = r->len - r->done_bytes;
			off_t off = (off_t)(r->slot * d->block_size + r->done_bytes);
			ssize_t res = r->op == IO_READ ? pread(d->fd, buf, len, off)
						       : pwrite(d->fd, buf, len, off);

			if (res < 0)
				res = -errno;
			if (!dev_finish(d, r, (long)res))
				break;
			/* short transfer: this thread goes on with the rest */
			pthread_mutex_lock(&d->lock);
			pthread_mutex_unlock(&d->lock);
		} while (1);
	}
	return NULL;
}

static void pool_kick(struct tb_dev *d)
{
	struct pool_priv *p = d->priv;

	/* The new thread waits for d->lock in dev_take until we let it go. */
	pthread_mutex_lock(&d->lock);
	pthread_cond_signal(&p->cv);
	if (d->running && !d->stopping && !p->idle && p->n < d->qd && p->n < POOL_THREADS_MAX &&
	    pthread_create(&p->threads[p->n], NULL, pool_thread, d) == 0)
		p->n++;
	pthread_mutex_unlock(&d->lock);
}

static int pool_start(struct tb_dev *d)
{
	struct pool_priv *p = d->priv;
	unsigned first = d->qd < POOL_THREADS_START ? d->qd : POOL_THREADS_START;
	int ret = 0;

	pthread_mutex_lock(&d->lock);
	for (p->n = 0; p->n < first && !ret;) {
		ret = pthread_create(&p->threads[p->n], NULL, pool_thread, d);
		if (!ret)
			p->n++;
	}
	pthread_mutex_unlock(&d->lock);
	return -ret;
}

static void pool_stop(struct tb_dev *d)
{
	struct pool_priv *p = d->priv;
	unsigned n;

	pthread_mutex_lock(&d->lock);
	pthread_cond_broadcast(&p->cv);
	n = p->n;
	pthread_mutex_unlock(&d->lock);
	for (unsigned i = 0; i < n; i++)
		pthread_join(p->threads[i], NULL);
}

static void pool_fini(struct tb_dev *d)
{
	struct pool_priv *p = d->priv;

	if (p) {
		pthread_cond_destroy(&p->cv);
		free(p);
	}
}

static const struct dev_engine pool_engine = {
	.name = "threads",
	.start = pool_start,
	.kick = pool_kick,
	.stop = pool_stop,
	.sync = slab_sync,
	.fini = pool_fini,
};

int dev_pool_setup(struct tb_dev *d)
{
	struct pool_priv *p = calloc(1, sizeof(*p));

	if (!p)
		return -ENOMEM;
	pthread_cond_init(&p->cv, NULL);
	d->priv = p;
	d->eng = &pool_engine;
	return 0;
}

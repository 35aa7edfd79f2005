/*
 * nvme.c - the nvme backend.
 *
 * Each device is one folder holding `tensorfs.slab`, a file of block-size
 * slots, and `tensorfs.dev`, which records the store and the device index
 * so that reordered or foreign folders are caught at mount. The slab is
 * opened O_DIRECT: the DRAM arena is the only cache.
 *
 * One thread per device owns the ring (or the libaio context). Producers
 * push requests onto per-class queues under the device lock and kick an
 * eventfd; the thread moves them into the kernel within the class limits,
 * reaps completions, resubmits the rest of a short transfer, and calls the
 * request's completion on its own thread.
 *
 * Capacity is fixed at open: the free space of the folder's filesystem plus
 * what the slab already holds, less a reserve of 1% so that the metadata
 * store beside it can still grow.
 */
#include "nvme.h"
#include "alloc.h"
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define SLAB_NAME "tensorfs.slab"
#define ID_NAME "tensorfs.dev"
#define RESERVE_PERCENT 1
#define RESERVE_MIN_BLOCKS 2
#define URING_MAX_BUF (1UL << 30) /* a registered buffer is at most 1 GiB */
#define WAKE_TAG 0

struct nvme_dev {
	unsigned index;
	char dir[256];
	char name[16];
	int fd;
	size_t block_size;
	enum tb_engine engine;
	unsigned qd;
	const struct dram_arena *arena;

	/* io_uring */
	struct io_uring ring;
	bool ring_ok;
	bool fixed_bufs;
	size_t buf_chunk;
	/* libaio */
	io_context_t aio_ctx;
	int aio_efd;

	int wake_efd;
	pthread_t thread;
	bool running;

	pthread_mutex_t lock; /* guards everything below */
	struct nvme_req *head[NVME_NCLASS], *tail[NVME_NCLASS];
	unsigned inflight[NVME_NCLASS];
	unsigned queued_reads;
	bool stopping;
	struct slot_alloc alloc;
	bool full;
	uint64_t read_bytes, write_bytes, read_ops, write_ops, errors;
	long err_log_sec;
};

static void dev_err(char *err, size_t errlen, const char *fmt, const char *dir, int e)
{
	char what[600];

	snprintf(what, sizeof(what), fmt, dir);
	snprintf(err, errlen, "%s: %s", what, strerror(e));
}

static int open_slab(struct nvme_dev *d, char *err, size_t errlen)
{
	char path[512];
	struct statvfs vfs;
	struct stat st;
	uint64_t fs_bytes, free_bytes, reserve, slab_bytes, nslots;

	snprintf(path, sizeof(path), "%s/%s", d->dir, SLAB_NAME);
	d->fd = open(path, O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0600);
	if (d->fd < 0) {
		dev_err(err, errlen, "nvme folder %s: cannot open the slab file", d->dir, errno);
		return -errno;
	}
	if (fstat(d->fd, &st) < 0 || fstatvfs(d->fd, &vfs) < 0) {
		dev_err(err, errlen, "nvme folder %s", d->dir, errno);
		return -errno;
	}
	if (vfs.f_flag & ST_RDONLY) {
		snprintf(err, errlen, "nvme folder %s is on a read-only filesystem", d->dir);
		return -EROFS;
	}
	fs_bytes = (uint64_t)vfs.f_blocks * vfs.f_frsize;
	free_bytes = (uint64_t)vfs.f_bavail * vfs.f_frsize;
	slab_bytes = (uint64_t)st.st_blocks * 512;
	reserve = fs_bytes / 100 * RESERVE_PERCENT;
	if (reserve < RESERVE_MIN_BLOCKS * d->block_size)
		reserve = RESERVE_MIN_BLOCKS * d->block_size;
	nslots = free_bytes + slab_bytes > reserve ? (free_bytes + slab_bytes - reserve) / d->block_size
						   : 0;
	/* Slots already in the slab stay addressable even if the disk filled since. */
	if ((uint64_t)st.st_size / d->block_size > nslots)
		nslots = (uint64_t)st.st_size / d->block_size;
	if (nslots == 0) {
		snprintf(err, errlen, "nvme folder %s has no free space", d->dir);
		return -ENOSPC;
	}
	return slot_alloc_init(&d->alloc, nslots);
}

/*
 * Bind the folder to this store and this position in the nvme list, or
 * check that it already is: block locations name devices by position.
 */
static int check_identity(struct nvme_dev *d, const char *store_id, char *err, size_t errlen)
{
	char path[512], id[64] = "", line[160];
	unsigned idx = 0;
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", d->dir, ID_NAME);
	f = fopen(path, "r");
	if (f) {
		bool ok = fgets(line, sizeof(line), f) &&
			  sscanf(line, "tensorfs-dev store=%63s index=%u", id, &idx) == 2;

		fclose(f);
		if (!ok) {
			snprintf(err, errlen, "nvme folder %s: %s is malformed", d->dir, ID_NAME);
			return -EINVAL;
		}
		if (strcmp(id, store_id) != 0) {
			snprintf(err, errlen,
				 "nvme folder %s belongs to another tensorfs store (%s); give the "
				 "meta= folder it was created with",
				 d->dir, id);
			return -EINVAL;
		}
		if (idx != d->index) {
			snprintf(err, errlen,
				 "nvme folder %s was device %u of this store but is listed as %u; "
				 "keep the nvme= folders in their original order",
				 d->dir, idx, d->index);
			return -EINVAL;
		}
		return 0;
	}
	if (errno != ENOENT) {
		dev_err(err, errlen, "nvme folder %s: cannot read " ID_NAME, d->dir, errno);
		return -errno;
	}
	f = fopen(path, "w");
	if (!f) {
		dev_err(err, errlen, "nvme folder %s is not writable", d->dir, errno);
		return -errno;
	}
	fprintf(f, "tensorfs-dev store=%s index=%u\n", store_id, d->index);
	if (fflush(f) != 0 || fsync(fileno(f)) != 0) {
		dev_err(err, errlen, "nvme folder %s: cannot write " ID_NAME, d->dir, errno);
		fclose(f);
		return -errno;
	}
	fclose(f);
	return 0;
}

static int register_buffers(struct nvme_dev *d)
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
	ret = io_uring_register_buffers(&d->ring, iov, (unsigned)n);
	free(iov);
	if (ret == 0) {
		d->fixed_bufs = true;
		d->buf_chunk = URING_MAX_BUF;
	}
	return ret;
}

static int setup_engine(struct nvme_dev *d, enum tb_engine want, char *err, size_t errlen)
{
	int ret;

	if (want != TB_ENGINE_AIO) {
		/* One slot more than the depth for the eventfd poll. */
		ret = io_uring_queue_init(d->qd * 2 + 2, &d->ring, 0);
		if (ret == 0) {
			d->ring_ok = true;
			d->engine = TB_ENGINE_URING;
			if (register_buffers(d) < 0)
				log_info("%s: cannot register the arena with io_uring; using "
					 "unregistered buffers",
					 d->name);
			return 0;
		}
		if (want == TB_ENGINE_URING) {
			dev_err(err, errlen, "nvme folder %s: io_uring setup failed", d->dir, -ret);
			return ret;
		}
		log_info("%s: io_uring unavailable (%s); using libaio", d->name, strerror(-ret));
	}
	memset(&d->aio_ctx, 0, sizeof(d->aio_ctx));
	ret = io_setup((int)d->qd, &d->aio_ctx);
	if (ret < 0) {
		dev_err(err, errlen, "nvme folder %s: libaio setup failed", d->dir, -ret);
		return ret;
	}
	d->aio_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (d->aio_efd < 0)
		return -errno;
	d->engine = TB_ENGINE_AIO;
	return 0;
}

int nvme_open(struct nvme_dev **out, unsigned index, const char *dir, const char *store_id,
	      size_t block_size, enum tb_engine engine, unsigned queue_depth,
	      const struct dram_arena *arena, char *err, size_t errlen)
{
	struct nvme_dev *d = calloc(1, sizeof(*d));
	struct stat st;
	int ret;

	if (!d)
		return -ENOMEM;
	d->index = index;
	d->fd = d->wake_efd = d->aio_efd = -1;
	d->block_size = block_size;
	d->qd = queue_depth;
	d->arena = arena;
	snprintf(d->dir, sizeof(d->dir), "%s", dir);
	snprintf(d->name, sizeof(d->name), "nvme%u", index);
	pthread_mutex_init(&d->lock, NULL);

	if (stat(dir, &st) < 0) {
		dev_err(err, errlen, "nvme folder %s", dir, errno);
		ret = -errno;
		goto fail;
	}
	if (!S_ISDIR(st.st_mode)) {
		snprintf(err, errlen, "nvme folder %s is not a directory", dir);
		ret = -ENOTDIR;
		goto fail;
	}
	if (access(dir, W_OK) < 0) {
		dev_err(err, errlen, "nvme folder %s is not writable", dir, errno);
		ret = -errno;
		goto fail;
	}
	ret = check_identity(d, store_id, err, errlen);
	if (ret < 0)
		goto fail;
	ret = open_slab(d, err, errlen);
	if (ret < 0)
		goto fail;
	d->wake_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (d->wake_efd < 0) {
		ret = -errno;
		goto fail;
	}
	ret = setup_engine(d, engine, err, errlen);
	if (ret < 0)
		goto fail;
	*out = d;
	return 0;
fail:
	nvme_close(d);
	return ret;
}

/* Move requests from the class queues into `out`, within the limits. */
static unsigned take_requests(struct nvme_dev *d, struct nvme_req **out, unsigned max)
{
	unsigned n = 0, total = 0;

	for (int c = 0; c < NVME_NCLASS; c++)
		total += d->inflight[c];
	for (int c = 0; c < NVME_NCLASS && total < d->qd && n < max; c++) {
		unsigned limit = d->qd;

		/* Write-back keeps a quarter of the depth once reads want the device. */
		if (c == NVME_CLS_WB &&
		    (d->queued_reads || d->inflight[NVME_CLS_DEMAND] || d->inflight[NVME_CLS_PREFETCH]))
			limit = d->qd / 4 ? d->qd / 4 : 1;
		while (d->head[c] && total < d->qd && n < max && d->inflight[c] < limit) {
			struct nvme_req *r = d->head[c];

			d->head[c] = r->next;
			if (!d->head[c])
				d->tail[c] = NULL;
			if (r->op == NVME_READ)
				d->queued_reads--;
			d->inflight[c]++;
			total++;
			out[n++] = r;
		}
	}
	return n;
}

static bool dev_idle(struct nvme_dev *d)
{
	for (int c = 0; c < NVME_NCLASS; c++)
		if (d->head[c] || d->inflight[c])
			return false;
	return true;
}

/* Account a finished transfer; returns true when the request must go again. */
static bool finish_io(struct nvme_dev *d, struct nvme_req *r, long res)
{
	int err = 0;

	if (res > 0 && (size_t)res < r->len - r->done_bytes) {
		r->done_bytes += (size_t)res;
		return true;
	}
	if (res == 0)
		err = -EIO; /* past the end of the slab: never written */
	else if (res < 0)
		err = (int)res;
	pthread_mutex_lock(&d->lock);
	d->inflight[r->cls]--;
	if (err) {
		d->errors++;
		if (log_ratelimit(&d->err_log_sec, 10))
			log_err("%s: %s of slot %llu failed: %s", d->name,
				r->op == NVME_READ ? "read" : "write", (unsigned long long)r->slot,
				strerror(-err));
	} else if (r->op == NVME_READ) {
		d->read_bytes += r->len;
		d->read_ops++;
	} else {
		d->write_bytes += r->len;
		d->write_ops++;
	}
	pthread_mutex_unlock(&d->lock);
	r->done(r, err);
	return false;
}

static void requeue_front(struct nvme_dev *d, struct nvme_req *r)
{
	pthread_mutex_lock(&d->lock);
	d->inflight[r->cls]--;
	r->next = d->head[r->cls];
	d->head[r->cls] = r;
	if (!d->tail[r->cls])
		d->tail[r->cls] = r;
	if (r->op == NVME_READ)
		d->queued_reads++;
	pthread_mutex_unlock(&d->lock);
}

static void drain_wake(int efd)
{
	uint64_t v;

	while (read(efd, &v, sizeof(v)) == sizeof(v))
		;
}

static void uring_prep(struct nvme_dev *d, struct io_uring_sqe *sqe, struct nvme_req *r)
{
	char *buf = (char *)r->buf + r->done_bytes;
	unsigned len = (unsigned)(r->len - r->done_bytes);
	off_t off = (off_t)(r->slot * d->block_size + r->done_bytes);
	size_t arena_off = (size_t)((char *)r->buf - (char *)d->arena->base);

	if (d->fixed_bufs && (char *)r->buf >= (char *)d->arena->base &&
	    arena_off < d->arena->bytes) {
		int idx = (int)(arena_off / d->buf_chunk);

		if (r->op == NVME_READ)
			io_uring_prep_read_fixed(sqe, d->fd, buf, len, off, idx);
		else
			io_uring_prep_write_fixed(sqe, d->fd, buf, len, off, idx);
	} else if (r->op == NVME_READ) {
		io_uring_prep_read(sqe, d->fd, buf, len, (uint64_t)off);
	} else {
		io_uring_prep_write(sqe, d->fd, buf, len, (uint64_t)off);
	}
	io_uring_sqe_set_data(sqe, r);
}

static void *uring_thread(void *arg)
{
	struct nvme_dev *d = arg;
	struct nvme_req *batch[256];
	bool poll_armed = false;
	char tname[16];

	snprintf(tname, sizeof(tname), "tfs-nvme%u", d->index % 1000);
	pthread_setname_np(pthread_self(), tname);
	for (;;) {
		struct io_uring_cqe *cqe;
		unsigned n, head, seen = 0;

		pthread_mutex_lock(&d->lock);
		if (d->stopping && dev_idle(d)) {
			pthread_mutex_unlock(&d->lock);
			break;
		}
		n = take_requests(d, batch, 256);
		pthread_mutex_unlock(&d->lock);

		for (unsigned i = 0; i < n; i++) {
			struct io_uring_sqe *sqe = io_uring_get_sqe(&d->ring);

			if (!sqe) {
				io_uring_submit(&d->ring);
				sqe = io_uring_get_sqe(&d->ring);
			}
			uring_prep(d, sqe, batch[i]);
		}
		if (!poll_armed) {
			struct io_uring_sqe *sqe = io_uring_get_sqe(&d->ring);

			if (!sqe) {
				io_uring_submit(&d->ring);
				sqe = io_uring_get_sqe(&d->ring);
			}
			io_uring_prep_poll_add(sqe, d->wake_efd, POLLIN);
			io_uring_sqe_set_data(sqe, NULL);
			poll_armed = true;
		}
		io_uring_submit_and_wait(&d->ring, 1);
		io_uring_for_each_cqe(&d->ring, head, cqe)
		{
			struct nvme_req *r = io_uring_cqe_get_data(cqe);

			seen++;
			if (!r) {
				drain_wake(d->wake_efd);
				poll_armed = false;
				continue;
			}
			if (finish_io(d, r, cqe->res))
				requeue_front(d, r);
		}
		io_uring_cq_advance(&d->ring, seen);
	}
	return NULL;
}

static void aio_prep(struct nvme_dev *d, struct nvme_req *r)
{
	char *buf = (char *)r->buf + r->done_bytes;
	size_t len = r->len - r->done_bytes;
	long long off = (long long)(r->slot * d->block_size + r->done_bytes);

	if (r->op == NVME_READ)
		io_prep_pread(&r->iocb, d->fd, buf, len, off);
	else
		io_prep_pwrite(&r->iocb, d->fd, buf, len, off);
	io_set_eventfd(&r->iocb, d->aio_efd);
	r->iocb.data = r;
}

static void aio_submit_batch(struct nvme_dev *d, struct nvme_req **batch, unsigned n)
{
	struct iocb *iocbs[256];
	unsigned done = 0;

	for (unsigned i = 0; i < n; i++) {
		aio_prep(d, batch[i]);
		iocbs[i] = &batch[i]->iocb;
	}
	while (done < n) {
		int ret = io_submit(d->aio_ctx, (long)(n - done), iocbs + done);

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
			finish_io(d, batch[done], ret ? ret : -EIO);
	}
}

static void *aio_thread(void *arg)
{
	struct nvme_dev *d = arg;
	struct nvme_req *batch[256];
	struct io_event events[256];
	char tname[16];

	snprintf(tname, sizeof(tname), "tfs-nvme%u", d->index % 1000);
	pthread_setname_np(pthread_self(), tname);
	for (;;) {
		struct pollfd pfd[2] = {{d->wake_efd, POLLIN, 0}, {d->aio_efd, POLLIN, 0}};
		struct timespec zero = {0, 0};
		unsigned n;
		int got;

		pthread_mutex_lock(&d->lock);
		if (d->stopping && dev_idle(d)) {
			pthread_mutex_unlock(&d->lock);
			break;
		}
		n = take_requests(d, batch, 256);
		pthread_mutex_unlock(&d->lock);
		if (n)
			aio_submit_batch(d, batch, n);

		if (poll(pfd, 2, -1) < 0 && errno != EINTR)
			break;
		drain_wake(d->wake_efd);
		drain_wake(d->aio_efd);
		got = io_getevents(d->aio_ctx, 0, 256, events, &zero);
		for (int i = 0; i < got; i++) {
			struct nvme_req *r = events[i].data;

			if (finish_io(d, r, (long)events[i].res))
				requeue_front(d, r);
		}
	}
	return NULL;
}

int nvme_start(struct nvme_dev *d)
{
	int ret = pthread_create(&d->thread, NULL,
				 d->engine == TB_ENGINE_URING ? uring_thread : aio_thread, d);

	if (ret)
		return -ret;
	d->running = true;
	return 0;
}

static void kick(struct nvme_dev *d)
{
	uint64_t one = 1;

	if (write(d->wake_efd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		log_err("%s: cannot wake the I/O thread: %s", d->name, strerror(errno));
}

void nvme_stop(struct nvme_dev *d)
{
	if (!d->running)
		return;
	pthread_mutex_lock(&d->lock);
	d->stopping = true;
	pthread_mutex_unlock(&d->lock);
	kick(d);
	pthread_join(d->thread, NULL);
	d->running = false;
}

void nvme_close(struct nvme_dev *d)
{
	if (!d)
		return;
	nvme_stop(d);
	if (d->ring_ok)
		io_uring_queue_exit(&d->ring);
	if (d->engine == TB_ENGINE_AIO && d->aio_ctx)
		io_destroy(d->aio_ctx);
	if (d->aio_efd >= 0)
		close(d->aio_efd);
	if (d->wake_efd >= 0)
		close(d->wake_efd);
	if (d->fd >= 0)
		close(d->fd);
	slot_alloc_free_all(&d->alloc);
	pthread_mutex_destroy(&d->lock);
	free(d);
}

void nvme_submit(struct nvme_dev *d, struct nvme_req *r)
{
	r->next = NULL;
	r->done_bytes = 0;
	pthread_mutex_lock(&d->lock);
	if (d->tail[r->cls])
		d->tail[r->cls]->next = r;
	else
		d->head[r->cls] = r;
	d->tail[r->cls] = r;
	if (r->op == NVME_READ)
		d->queued_reads++;
	pthread_mutex_unlock(&d->lock);
	kick(d);
}

int nvme_sync(struct nvme_dev *d)
{
	if (fdatasync(d->fd) < 0) {
		int e = errno;

		log_err("%s: fdatasync of the slab failed: %s", d->name, strerror(e));
		return -e;
	}
	return 0;
}

int nvme_alloc(struct nvme_dev *d, uint64_t *slot)
{
	int64_t s;

	pthread_mutex_lock(&d->lock);
	s = d->full ? -ENOSPC : slot_alloc_get(&d->alloc);
	pthread_mutex_unlock(&d->lock);
	if (s < 0)
		return (int)s;
	*slot = (uint64_t)s;
	return 0;
}

void nvme_free(struct nvme_dev *d, uint64_t slot)
{
	pthread_mutex_lock(&d->lock);
	if (slot_alloc_put(&d->alloc, slot) < 0)
		log_err("%s: freeing slot %llu that is not in use", d->name,
			(unsigned long long)slot);
	d->full = false;
	pthread_mutex_unlock(&d->lock);
}

int nvme_mark(struct nvme_dev *d, uint64_t slot)
{
	int ret;

	pthread_mutex_lock(&d->lock);
	ret = slot_alloc_mark(&d->alloc, slot);
	pthread_mutex_unlock(&d->lock);
	return ret;
}

void nvme_set_full(struct nvme_dev *d)
{
	pthread_mutex_lock(&d->lock);
	d->full = true;
	pthread_mutex_unlock(&d->lock);
}

uint64_t nvme_free_slots(struct nvme_dev *d)
{
	uint64_t n;

	pthread_mutex_lock(&d->lock);
	n = d->full ? 0 : d->alloc.nslots - d->alloc.used;
	pthread_mutex_unlock(&d->lock);
	return n;
}

void nvme_get_stats(struct nvme_dev *d, struct tb_dev_stats *st)
{
	pthread_mutex_lock(&d->lock);
	snprintf(st->name, sizeof(st->name), "%s", d->name);
	snprintf(st->path, sizeof(st->path), "%s", d->dir);
	st->engine = d->engine == TB_ENGINE_URING ? "io_uring" : "libaio";
	st->capacity = d->alloc.nslots * d->block_size;
	st->used = d->alloc.used * d->block_size;
	st->read_bytes = d->read_bytes;
	st->write_bytes = d->write_bytes;
	st->read_ops = d->read_ops;
	st->write_ops = d->write_ops;
	st->errors = d->errors;
	st->inflight_demand = d->inflight[NVME_CLS_DEMAND];
	st->inflight_wb = d->inflight[NVME_CLS_WB];
	pthread_mutex_unlock(&d->lock);
}

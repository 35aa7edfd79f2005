/*
 * gpu.c - the shared-arena server for GPU clients (-o cuda=on).
 *
 * A GPU client (libtensorfs-cuda) moves a tensor between the GPU and a
 * file with one DMA straight from or into the DRAM arena, instead of a
 * FUSE read or write and a copy through a bounce buffer. This file serves
 * it: a unix socket (protocol in cuda/gpu_proto.h) hands out the arena's
 * memfd, pins the blocks of a file range in the cache, answers with their
 * slot offsets, and on release commits a write as a pwrite would: size,
 * mtime, and the kernel's page cache of the range dropped. A reader that
 * pins in windows asks ahead (PREFETCH) for the windows it will pin next,
 * so that blocks on nvme load while it copies the window it holds.
 *
 * One thread (tfs-gpu) accepts connections; only the mount owner's uid is
 * served, and a client refused is told why before the hang-up. The socket
 * lies in a 0700 folder that the daemon makes where no other user can
 * rename or replace it (make_sock_dir). Each
 * connection has its own thread (tfs-gpu-conn), owned and joined by the
 * accept thread or by fs_gpu_stop. A connection thread alone touches its
 * pins; when the client closes or dies the thread releases them all. Pins
 * of all clients together stay below tb_client_pins, so that clients can
 * never starve the daemon's own readers and writers. A write pin holds
 * the file's io lock shared; a truncate waits for it only a bounded time
 * (ops_data.c io_lock_excl). Every fd a client sends is closed once used.
 *
 * With cuda=on the daemon also registers the arena with CUDA when a GPU
 * is there (cuMemHostRegister, through libcuda loaded at run time, so the
 * daemon needs no CUDA to build or run); without one it says so once.
 *
 * It may call req.c (the learner told of each pin), ctl_names.c (a control
 * file is no client's file), the inode table, prefetch.c and the block
 * store; never the FUSE ops or the control files' contents (ctl.c calls
 * fs_gpu_json).
 */
#include "fs.h"
#include "log.h"
#include "../cuda/gpu_proto.h"
#include "../cuda/gpu_sock.h"

#include <assert.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define GPU_MAX_CONNS 64
#define GPU_GRANTS 64 /* files one connection may use, most recent kept */
#define GPU_LISTEN_BACKLOG 16
#define GPU_REFUSED_MAX 16	  /* refused clients whose request is awaited */
#define GPU_REFUSE_LINGER_MS 1000 /* how long it is awaited */
#define GPU_SOCK_NAME "sock"
#define GPU_CU_PORTABLE 0x01 /* CU_MEMHOSTREGISTER_PORTABLE */
#define WAKE_STOP 's'
#define WAKE_REAP 'r'

/* One PIN: blocks [first, first + n) of ino, for bytes [off, off + len). */
struct gpu_pin {
	uint64_t id;
	bool write;
	uint64_t ino, off, len, first;
	uint32_t n;
	struct fs_inode *in; /* write: held, with in->io shared, until release */
	struct tb_ref *refs; /* ref.e NULL: a hole */
	struct gpu_pin *next;
};

struct gpu_grant {
	uint64_t ino;
	bool read, write;
};

struct gpu_conn {
	struct fs_gpu *g;
	int fd;
	pthread_t thread;
	bool done; /* the thread has finished; g->lock */
	/* the connection thread's own */
	struct gpu_pin *pins;
	uint64_t npinned, next_pin;
	struct gpu_grant grants[GPU_GRANTS];
	unsigned ngrants, grant_next;
	/* what PREFETCH asked for and is not yet issued: blocks [pf_next, pf_end) of pf_ino */
	uint64_t pf_ino, pf_next, pf_end;
	struct tfs_gpu_rep *rep; /* TFS_GPU_REP_MAX bytes */
	struct gpu_conn *next;
};

/* libcuda, loaded at run time when cuda=on */
typedef int (*cu_init_fn)(unsigned);
typedef int (*cu_count_fn)(int *);
typedef int (*cu_device_fn)(int *, int);
typedef int (*cu_retain_fn)(void **, int);
typedef int (*cu_release_fn)(int);
typedef int (*cu_push_fn)(void *);
typedef int (*cu_pop_fn)(void **);
typedef int (*cu_register_fn)(void *, size_t, unsigned);
typedef int (*cu_unregister_fn)(void *);
typedef int (*cu_errstr_fn)(int, const char **);

struct gpu_cuda {
	void *lib;
	int dev;
	void *ctx;
	bool registered;
	char why[160]; /* what happened, for the log and the gpu file */
	cu_release_fn release;
	cu_push_fn push;
	cu_pop_fn pop;
	cu_unregister_fn unregister;
};

/* A refused connection, answered, kept until its request is read (refuse). */
struct gpu_refused {
	int fd;
	uint64_t until_ms; /* fs_monotonic_ms */
};

struct fs_gpu {
	struct fs *fs;
	struct fuse_session *se;
	char dir[PATH_MAX];
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	int lfd;
	int wake_pipe[2]; /* to the accept thread: WAKE_STOP, or WAKE_REAP */
	pthread_t thread;
	bool thread_started;
	uint64_t id;
	uid_t owner;
	struct tb_arena_info arena;
	size_t bs;
	uint64_t max_pins, max_wpins;
	struct gpu_cuda cu;
	/* the accept thread's own */
	struct gpu_refused refused_q[GPU_REFUSED_MAX];
	unsigned nrefused;

	pthread_mutex_t lock; /* guards all below */
	pthread_cond_t cv;    /* pins were released, or stopping */
	struct gpu_conn *conns;
	unsigned nconns; /* threads not yet joined */
	unsigned nlive;	 /* connections still open */
	uint64_t pinned, wpinned;
	bool stopping;
	bool have_dev;
	dev_t mnt_dev;
	uint64_t pins_total, read_bytes, write_bytes, refused, failed_writes;
	uint64_t prefetches, prefetch_bytes; /* PREFETCH requests that issued some, and bytes */
	long refuse_log_sec;
};

/* ---- CUDA registration of the arena ---- */

static const char *cu_err(struct gpu_cuda *cu, int rc)
{
	cu_errstr_fn errstr = cu->lib ? (cu_errstr_fn)dlsym(cu->lib, "cuGetErrorString") : NULL;
	const char *s = NULL;

	if (errstr && errstr(rc, &s) == 0 && s)
		return s;
	return "unknown CUDA error";
}

/* Pin the arena for DMA where a GPU is present; never fails the mount. */
static void cuda_register(struct fs_gpu *g)
{
	struct gpu_cuda *cu = &g->cu;
	cu_init_fn init;
	cu_count_fn count;
	cu_device_fn device;
	cu_retain_fn retain;
	cu_register_fn reg;
	int n = 0, rc;

	cu->lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!cu->lib) {
		snprintf(cu->why, sizeof(cu->why), "no GPU: libcuda.so.1 cannot be loaded");
		goto plain;
	}
	init = (cu_init_fn)dlsym(cu->lib, "cuInit");
	count = (cu_count_fn)dlsym(cu->lib, "cuDeviceGetCount");
	device = (cu_device_fn)dlsym(cu->lib, "cuDeviceGet");
	retain = (cu_retain_fn)dlsym(cu->lib, "cuDevicePrimaryCtxRetain");
	reg = (cu_register_fn)dlsym(cu->lib, "cuMemHostRegister_v2");
	cu->release = (cu_release_fn)dlsym(cu->lib, "cuDevicePrimaryCtxRelease_v2");
	cu->push = (cu_push_fn)dlsym(cu->lib, "cuCtxPushCurrent_v2");
	cu->pop = (cu_pop_fn)dlsym(cu->lib, "cuCtxPopCurrent_v2");
	cu->unregister = (cu_unregister_fn)dlsym(cu->lib, "cuMemHostUnregister");
	if (!init || !count || !device || !retain || !reg || !cu->release || !cu->push ||
	    !cu->pop || !cu->unregister) {
		snprintf(cu->why, sizeof(cu->why), "no GPU: libcuda.so.1 lacks the driver API");
		goto plain;
	}
	rc = init(0);
	if (rc == 0)
		rc = count(&n);
	if (rc || n == 0) {
		snprintf(cu->why, sizeof(cu->why), "no GPU: %s",
			 rc ? cu_err(cu, rc) : "the driver sees no device");
		goto plain;
	}
	rc = device(&cu->dev, 0);
	if (rc == 0)
		rc = retain(&cu->ctx, cu->dev);
	if (rc) {
		snprintf(cu->why, sizeof(cu->why), "cannot open GPU 0: %s", cu_err(cu, rc));
		goto plain;
	}
	cu->push(cu->ctx);
	rc = reg(g->arena.base, g->arena.bytes, GPU_CU_PORTABLE);
	cu->pop(&cu->ctx);
	if (rc) {
		snprintf(cu->why, sizeof(cu->why), "cannot register the arena with CUDA: %s",
			 cu_err(cu, rc));
		cu->release(cu->dev);
		cu->ctx = NULL;
		goto plain;
	}
	cu->registered = true;
	snprintf(cu->why, sizeof(cu->why), "arena registered with CUDA (%d GPU(s))", n);
	log_info("cuda=on: the %zu MiB DRAM arena is pinned for DMA by CUDA", g->arena.bytes >> 20);
	return;
plain:
	log_warn("cuda=on: %s; the DRAM arena stays plain (clients still share it)", cu->why);
	if (cu->lib)
		dlclose(cu->lib);
	cu->lib = NULL;
}

static void cuda_unregister(struct fs_gpu *g)
{
	struct gpu_cuda *cu = &g->cu;

	if (cu->registered) {
		cu->push(cu->ctx);
		cu->unregister(g->arena.base);
		cu->pop(&cu->ctx);
		cu->release(cu->dev);
		cu->registered = false;
	}
	if (cu->lib)
		dlclose(cu->lib);
	cu->lib = NULL;
}

/* ---- messages ---- */

static void rep_init(struct tfs_gpu_rep *rep, uint16_t op, int status)
{
	memset(rep, 0, sizeof(*rep));
	rep->magic = TFS_GPU_MAGIC;
	rep->version = TFS_GPU_VERSION;
	rep->op = op;
	rep->status = status;
}

/* Send rep on sock, with fd as SCM_RIGHTS when fd >= 0. */
static int rep_send(int sock, struct tfs_gpu_rep *rep, int fd)
{
	size_t len = sizeof(*rep) + rep->nblocks * sizeof(uint64_t);

	return gpusock_send(sock, rep, len, fd) < 0 ? -EPIPE : 0;
}

/*
 * Receive one request; *fd gets a passed descriptor or -1 (gpusock_recv
 * closes any other). 0 at EOF, 1, or -errno.
 */
static int req_recv(struct gpu_conn *c, struct tfs_gpu_req *req, int *fd)
{
	ssize_t n = gpusock_recv(c->fd, req, sizeof(*req), 0, fd);

	if (n < 0 && n != -EMSGSIZE)
		return (int)n;
	if (n == 0)
		return 0;
	if (n != (ssize_t)sizeof(*req) || req->magic != TFS_GPU_MAGIC ||
	    req->version != TFS_GPU_VERSION)
		return -EPROTO;
	return 1;
}

/* ---- grants: which files this connection may pin ---- */

static struct gpu_grant *grant_find(struct gpu_conn *c, uint64_t ino)
{
	for (unsigned i = 0; i < c->ngrants; i++)
		if (c->grants[i].ino == ino)
			return &c->grants[i];
	return NULL;
}

static int mount_dev(struct fs_gpu *g, dev_t *dev)
{
	struct stat st;

	pthread_mutex_lock(&g->lock);
	if (g->have_dev) {
		*dev = g->mnt_dev;
		pthread_mutex_unlock(&g->lock);
		return 0;
	}
	pthread_mutex_unlock(&g->lock);
	/* Asked lazily: the FUSE loop serves this stat, so it must be running. */
	if (stat(g->fs->cfg->mountpoint, &st) < 0)
		return -errno;
	pthread_mutex_lock(&g->lock);
	g->mnt_dev = st.st_dev;
	g->have_dev = true;
	pthread_mutex_unlock(&g->lock);
	*dev = st.st_dev;
	return 0;
}

/*
 * What an fd's open proved: O_RDONLY the right to read, O_WRONLY to write,
 * O_RDWR both. An O_PATH fd proves neither (it is opened without any
 * permission check, even of a mode 000 file), nor does access mode 3,
 * which Linux opens for ioctls only.
 */
static int fd_rights(int fd, bool *read, bool *write)
{
	int flags = fcntl(fd, F_GETFL);

	if (flags < 0)
		return -errno;
	if (flags & O_PATH)
		return -EBADF;
	switch (flags & O_ACCMODE) {
	case O_RDONLY:
		*read = true;
		return 0;
	case O_WRONLY:
		*write = true;
		return 0;
	case O_RDWR:
		*read = *write = true;
		return 0;
	default:
		return -EBADF;
	}
}

/*
 * The client proves its right to a file by passing an fd of it: the fd
 * must be a regular file of this mount with the inode it names; its open
 * mode says what the connection may do.
 */
static int do_grant(struct gpu_conn *c, const struct tfs_gpu_req *req, int fd)
{
	struct gpu_grant *gr;
	struct stat st;
	dev_t dev = 0;
	bool read = false, write = false;
	int ret;

	if (fd < 0)
		return -EBADF;
	ret = fd_rights(fd, &read, &write);
	if (ret)
		return ret;
	ret = mount_dev(c->g, &dev);
	if (ret)
		return ret;
	if (fstat(fd, &st) < 0)
		return -errno;
	if (st.st_dev != dev)
		return -EXDEV;
	if (!S_ISREG(st.st_mode) || fs_ctl_ino(st.st_ino))
		return -EINVAL;
	if ((uint64_t)st.st_ino != req->ino)
		return -ESTALE;
	gr = grant_find(c, req->ino);
	if (!gr) {
		gr = &c->grants[c->grant_next];
		c->grant_next = (c->grant_next + 1) % GPU_GRANTS;
		if (c->ngrants < GPU_GRANTS)
			c->ngrants++;
		*gr = (struct gpu_grant){.ino = req->ino};
	}
	gr->read |= read;
	gr->write |= write;
	return 0;
}

/* ---- the pin budget ---- */

/*
 * Take up to want blocks of the budget. A connection that holds no pins
 * waits for some; one that holds pins must not (two such clients could
 * wait on each other), so it gets what is free or -EAGAIN.
 */
static int budget_take(struct gpu_conn *c, uint64_t want, bool write, uint64_t *got)
{
	struct fs_gpu *g = c->g;
	uint64_t avail;

	pthread_mutex_lock(&g->lock);
	for (;;) {
		if (g->stopping) {
			pthread_mutex_unlock(&g->lock);
			return -ESHUTDOWN;
		}
		avail = g->max_pins - g->pinned;
		if (write && g->max_wpins - g->wpinned < avail)
			avail = g->max_wpins - g->wpinned;
		if (avail)
			break;
		if (c->npinned) {
			pthread_mutex_unlock(&g->lock);
			return -EAGAIN;
		}
		pthread_cond_wait(&g->cv, &g->lock);
	}
	*got = want < avail ? want : avail;
	g->pinned += *got;
	if (write)
		g->wpinned += *got;
	pthread_mutex_unlock(&g->lock);
	c->npinned += *got;
	return 0;
}

static void budget_give(struct gpu_conn *c, uint64_t n, bool write)
{
	struct fs_gpu *g = c->g;

	pthread_mutex_lock(&g->lock);
	g->pinned -= n;
	if (write)
		g->wpinned -= n;
	pthread_cond_broadcast(&g->cv);
	pthread_mutex_unlock(&g->lock);
	c->npinned -= n;
}

/* ---- pins ---- */

/* Bytes of block i of a pin: where they start in the block, how many. */
static void pin_span(const struct gpu_pin *p, size_t bs, uint32_t i, size_t *bo, size_t *n)
{
	uint64_t start = (p->first + i) * bs, end = start + bs;

	if (start < p->off)
		start = p->off;
	if (end > p->off + p->len)
		end = p->off + p->len;
	*bo = start % bs;
	*n = end - start;
}

static void pin_free(struct gpu_pin *p)
{
	if (p) {
		free(p->refs);
		free(p);
	}
}

/* Waits for the loads of one PIN_READ. */
struct load_wait {
	struct tb_waiter w; /* first: the callback casts back */
	struct load_batch *b;
	uint32_t i;
};

struct load_batch {
	pthread_mutex_t lock;
	pthread_cond_t cv;
	unsigned pending;
	int err;
	struct gpu_pin *p;
	struct load_wait *w;
};

static void load_done(struct load_batch *b, uint32_t i, int err, const struct tb_ref *ref)
{
	pthread_mutex_lock(&b->lock);
	if (err == 0)
		b->p->refs[i] = *ref;
	else if (err != -ENOENT && !b->err)
		b->err = err;
	if (--b->pending == 0)
		pthread_cond_signal(&b->cv);
	pthread_mutex_unlock(&b->lock);
}

static void load_ready(struct tb_waiter *w, int err)
{
	struct load_wait *lw = (struct load_wait *)w;

	load_done(lw->b, lw->i, err, &w->ref);
}

/* Pin every block of p for reading; loads run in parallel, then we wait. */
static int pin_read_blocks(struct fs *fs, struct fs_inode *in, struct gpu_pin *p)
{
	struct load_batch b = {.pending = 1, .p = p};
	int ret;

	b.w = calloc(p->n, sizeof(*b.w));
	if (!b.w)
		return -ENOMEM;
	pthread_mutex_init(&b.lock, NULL);
	pthread_cond_init(&b.cv, NULL);
	pthread_mutex_lock(&in->lock);
	in->unread = 0; /* read: its writer is not blind (write_data) */
	pthread_mutex_unlock(&in->lock);
	pthread_rwlock_rdlock(&in->io);
	for (uint32_t i = 0; i < p->n; i++) {
		struct tb_ref ref = {0};

		b.w[i].b = &b;
		b.w[i].i = i;
		b.w[i].w.fn = load_ready;
		pthread_mutex_lock(&b.lock);
		b.pending++;
		pthread_mutex_unlock(&b.lock);
		ret = tb_get(fs->tb, p->ino, p->first + i, &ref, &b.w[i].w);
		if (ret != 1)
			load_done(&b, i, ret, &ref);
	}
	pthread_rwlock_unlock(&in->io);
	pthread_mutex_lock(&b.lock);
	b.pending--;
	while (b.pending)
		pthread_cond_wait(&b.cv, &b.lock);
	ret = b.err;
	pthread_mutex_unlock(&b.lock);
	pthread_cond_destroy(&b.cv);
	pthread_mutex_destroy(&b.lock);
	free(b.w);
	if (ret)
		for (uint32_t i = 0; i < p->n; i++)
			if (p->refs[i].e)
				tb_put(fs->tb, &p->refs[i], 0);
	return ret;
}

/*
 * A write pin that will not be committed: the slots may hold a copy cut
 * short, or, for a block that was not cached, stale bytes of another
 * block. Zero the range so that neither can be read, and keep the size.
 */
static void write_abandon(struct fs_gpu *g, struct gpu_pin *p, uint32_t n)
{
	struct fs *fs = g->fs;

	for (uint32_t i = 0; i < n; i++) {
		size_t bo, len;

		pin_span(p, g->bs, i, &bo, &len);
		memset((char *)p->refs[i].data + bo, 0, len);
		tb_put_dirty(fs->tb, &p->refs[i], bo, len);
	}
}

/*
 * FUSE files use the page cache: drop what the kernel has of the range,
 * and its attributes. Not once the FUSE loop has ended: the unmount is
 * about to close the fd the notice would go to.
 */
static void inval(struct fs_gpu *g, uint64_t ino, uint64_t off, uint64_t len)
{
	if (!fuse_session_exited(g->se))
		fuse_lowlevel_notify_inval_inode(g->se, ino, (off_t)off, (off_t)len);
}

/*
 * A write pin holds in->io shared from PIN to RELEASE, and says so in
 * in->gpu_wpins: a truncate waits only so long for it (ops_data.c io_lock_excl).
 */
static void wpin_lock(struct fs_inode *in)
{
	pthread_rwlock_rdlock(&in->io);
	pthread_mutex_lock(&in->lock);
	if (in->gpu_wpins++ == 0)
		in->gpu_wpin_ms = fs_monotonic_ms();
	pthread_mutex_unlock(&in->lock);
}

static void wpin_unlock(struct fs_inode *in)
{
	pthread_mutex_lock(&in->lock);
	assert(in->gpu_wpins > 0);
	in->gpu_wpins--;
	pthread_mutex_unlock(&in->lock);
	pthread_rwlock_unlock(&in->io);
}

/* Pin every block of p for writing, holding in->io shared until release. */
static int pin_write_blocks(struct fs *fs, struct fs_inode *in, struct gpu_pin *p, size_t bs)
{
	/* Only the mount's owner is served: its blocks count against it (tiers/fair.c). */
	const struct tb_writer who = {.uid = (uint32_t)fs->gpu->owner};
	uint64_t resv = p->n;
	uint32_t i;
	int ret;

	wpin_lock(in);
	/* All the space first, so a full tier fails the request before it changes anything. */
	ret = tb_reserve(fs->tb, resv);
	if (ret) {
		wpin_unlock(in);
		return ret;
	}
	for (i = 0; i < p->n; i++) {
		size_t bo, n;

		pin_span(p, bs, i, &bo, &n);
		ret = tb_get_write(fs->tb, p->ino, p->first + i, bo, n, false, &p->refs[i], &resv,
				   &who);
		if (ret)
			break;
	}
	tb_unreserve(fs->tb, resv);
	if (ret) {
		struct fs_gpu *g = fs->gpu;

		write_abandon(g, p, i);
		if (i)
			fs_inode_written(in, 0, 0);
		wpin_unlock(in);
		if (i)
			inval(g, p->ino, p->off, p->len);
		return ret;
	}
	return 0;
}

/*
 * What PIN and PREFETCH check first: the grant covers the access, the range
 * fits a file offset, and ino is a regular file. On success *in holds a
 * reference (fs_iput it) and *size is the file's size now.
 */
static int granted_file(struct gpu_conn *c, const struct tfs_gpu_req *req, bool write,
			struct fs_inode **in, uint64_t *size)
{
	struct gpu_grant *gr = grant_find(c, req->ino);
	int ret;

	*in = NULL;
	if (!gr || !(write ? gr->write : gr->read))
		return -EACCES;
	if (req->off > UINT64_MAX - req->len || req->off + req->len > (uint64_t)INT64_MAX)
		return -EFBIG;
	ret = fs_iget(c->g->fs, req->ino, in);
	if (ret)
		return ret;
	pthread_mutex_lock(&(*in)->lock);
	*size = (*in)->rec.size;
	ret = S_ISREG((*in)->rec.mode) ? 0 : -EINVAL;
	pthread_mutex_unlock(&(*in)->lock);
	return ret;
}

/*
 * Issue what is left of the connection's stream (PREFETCH) for in, up to
 * the first block that finds no slot or I/O now; the rest waits for the
 * connection's next PIN or PREFETCH. The loads go to the devices together
 * (tb_plug), as a FUSE reader's do, so that an elevator can merge
 * neighbours. Returns the blocks issued or found cached.
 */
static uint64_t pf_pump(struct gpu_conn *c, struct fs_inode *in)
{
	struct fs *fs = c->g->fs;
	uint64_t b, from = c->pf_next;

	if (c->pf_ino != in->ino || c->pf_next >= c->pf_end)
		return 0;
	/* in->io shared, as for a PIN_READ: no truncate frees the blocks under us. */
	pthread_rwlock_rdlock(&in->io);
	tb_plug();
	for (b = c->pf_next; b < c->pf_end; b++)
		if (tb_prefetch_stream(fs->tb, in->ino, b) < 0)
			break;
	tb_unplug();
	pthread_rwlock_unlock(&in->io);
	c->pf_next = b;
	return b - from;
}

static int do_pin(struct gpu_conn *c, const struct tfs_gpu_req *req, bool write)
{
	struct fs_gpu *g = c->g;
	struct fs *fs = g->fs;
	struct fs_inode *in = NULL;
	struct gpu_pin *p = NULL;
	uint64_t size = 0, end, want, got = 0;
	int ret;

	ret = granted_file(c, req, write, &in, &size);
	if (ret)
		goto out;
	end = req->off + req->len;
	if (!write && end > size)
		end = size > req->off ? size : req->off;
	c->rep->size = size;
	c->rep->off = req->off;
	if (end == req->off)
		goto out; /* nothing to pin: an empty range, or at EOF */

	want = (end - 1) / g->bs - req->off / g->bs + 1;
	if (req->max_blocks && want > req->max_blocks)
		want = req->max_blocks;
	if (want > TFS_GPU_MAX_BLOCKS)
		want = TFS_GPU_MAX_BLOCKS;
	ret = budget_take(c, want, write, &got);
	if (ret)
		goto out;
	p = calloc(1, sizeof(*p));
	if (p)
		p->refs = calloc(got, sizeof(*p->refs));
	if (!p || !p->refs) {
		ret = -ENOMEM;
		goto out;
	}
	p->write = write;
	p->ino = req->ino;
	p->off = req->off;
	p->first = req->off / g->bs;
	p->n = (uint32_t)got;
	p->len = ((p->first + got) * g->bs < end ? (p->first + got) * g->bs : end) - req->off;
	if (fs_touch(fs, in, write ? (size > end ? size : end) : size, p->off, p->len,
		     write))
		fs_prefetch_kick(fs);
	if (!write && pf_pump(c, in)) {
		/* Blocks the last PREFETCH could not issue then: loading while this pin waits. */
		pthread_mutex_lock(&g->lock);
		g->prefetches++;
		pthread_mutex_unlock(&g->lock);
	}
	ret = write ? pin_write_blocks(fs, in, p, g->bs) : pin_read_blocks(fs, in, p);
	if (ret)
		goto out;
	p->id = ++c->next_pin;
	if (write) {
		p->in = in; /* the reference goes with the pin */
		in = NULL;
	}
	p->next = c->pins;
	c->pins = p;
	c->rep->pin = p->id;
	c->rep->len = p->len;
	c->rep->nblocks = p->n;
	for (uint32_t i = 0; i < p->n; i++)
		c->rep->slot[i] = p->refs[i].e
				      ? (uint64_t)((char *)p->refs[i].data - (char *)g->arena.base)
				      : TFS_GPU_HOLE;
	pthread_mutex_lock(&g->lock);
	g->pins_total++;
	pthread_mutex_unlock(&g->lock);
	p = NULL;
	got = 0;
out:
	if (got)
		budget_give(c, got, write);
	pin_free(p);
	if (in)
		fs_iput(fs, in);
	return ret;
}

/* Unpin p; for a write, commit it when ok, else zero its range. */
static void pin_release(struct gpu_conn *c, struct gpu_pin *p, bool ok)
{
	struct fs_gpu *g = c->g;
	struct fs *fs = g->fs;

	if (!p->write) {
		for (uint32_t i = 0; i < p->n; i++) {
			size_t bo, n;

			pin_span(p, g->bs, i, &bo, &n);
			if (p->refs[i].e)
				tb_put(fs->tb, &p->refs[i], ok ? n : 0);
		}
	} else {
		if (ok) {
			for (uint32_t i = 0; i < p->n; i++) {
				size_t bo, n;

				pin_span(p, g->bs, i, &bo, &n);
				tb_put_dirty(fs->tb, &p->refs[i], bo, n);
			}
		} else {
			write_abandon(g, p, p->n);
		}
		fs_inode_written(p->in, ok ? p->off + p->len : 0, ok ? p->len : 0);
		wpin_unlock(p->in);
		fs_iput(fs, p->in);
		inval(g, p->ino, p->off, p->len);
	}
	pthread_mutex_lock(&g->lock);
	if (ok && p->write)
		g->write_bytes += p->len;
	else if (ok)
		g->read_bytes += p->len;
	else if (p->write)
		g->failed_writes++;
	pthread_mutex_unlock(&g->lock);
	budget_give(c, p->n, p->write);
	pin_free(p);
}

/*
 * Start loading [off, off + len) below EOF, for a reader that will pin it
 * soon: hints, so that the prefetch bounds meant for guesses do not refuse
 * what a client says it will read next, with a stream's bound on loads in
 * flight (tb_prefetch_stream). Stops at the first block that finds no slot
 * or I/O now and says in rep->len how far it got; the connection keeps the
 * rest and issues it at its next PIN or PREFETCH (pf_pump): a client asks
 * for each range once. A PREFETCH that does not continue the last one
 * replaces it.
 */
static int do_prefetch(struct gpu_conn *c, const struct tfs_gpu_req *req)
{
	struct fs_gpu *g = c->g;
	struct fs *fs = g->fs;
	struct fs_inode *in = NULL;
	uint64_t size = 0, end, first, last, issued;
	int ret;

	ret = granted_file(c, req, false, &in, &size);
	if (ret == -EACCES || ret == -EFBIG || !in)
		return ret;
	end = req->off + req->len < size ? req->off + req->len : size;
	c->rep->off = req->off;
	c->rep->size = size;
	if (ret || end <= req->off)
		goto out;
	first = req->off / g->bs;
	last = (end - 1) / g->bs;
	if (c->pf_ino == req->ino && first >= c->pf_next && first <= c->pf_end) {
		if (last + 1 > c->pf_end)
			c->pf_end = last + 1;
	} else {
		c->pf_ino = req->ino;
		c->pf_next = first;
		c->pf_end = last + 1;
	}
	issued = pf_pump(c, in);
	if (c->pf_next <= first)
		c->rep->len = 0;
	else
		c->rep->len = (c->pf_next > last ? end : c->pf_next * g->bs) - req->off;
	if (issued) {
		pthread_mutex_lock(&g->lock);
		g->prefetches++;
		g->prefetch_bytes += issued * g->bs;
		pthread_mutex_unlock(&g->lock);
	}
out:
	fs_iput(fs, in);
	return ret;
}

static int do_release(struct gpu_conn *c, const struct tfs_gpu_req *req)
{
	struct gpu_pin **pp;

	for (pp = &c->pins; *pp; pp = &(*pp)->next) {
		struct gpu_pin *p = *pp;

		if (p->id != req->pin)
			continue;
		*pp = p->next;
		pin_release(c, p, req->status == 0);
		return 0;
	}
	return -ENOENT;
}

/* ---- connections ---- */

static int do_hello(struct gpu_conn *c, const struct tfs_gpu_req *req)
{
	struct fs_gpu *g = c->g;

	rep_init(c->rep, TFS_GPU_HELLO, 0);
	c->rep->arena_bytes = g->arena.bytes;
	c->rep->block_size = g->bs;
	c->rep->mount_id = g->id;
	c->rep->max_pins = g->max_pins;
	c->rep->max_write_pins = g->max_wpins;
	return rep_send(c->fd, c->rep, req->want_arena ? g->arena.fd : -1);
}

/* Serve one request, fd (or -1) having come with it; < 0 when the reply could not go. */
static int serve(struct gpu_conn *c, const struct tfs_gpu_req *req, int fd)
{
	if (req->op == TFS_GPU_HELLO)
		return do_hello(c, req);
	rep_init(c->rep, req->op, 0);
	switch (req->op) {
	case TFS_GPU_GRANT:
		c->rep->status = do_grant(c, req, fd);
		break;
	case TFS_GPU_PIN_READ:
	case TFS_GPU_PIN_WRITE:
		c->rep->status = do_pin(c, req, req->op == TFS_GPU_PIN_WRITE);
		break;
	case TFS_GPU_RELEASE:
		c->rep->status = do_release(c, req);
		break;
	case TFS_GPU_PREFETCH:
		c->rep->status = do_prefetch(c, req);
		break;
	default:
		c->rep->status = -EOPNOTSUPP;
		break;
	}
	return rep_send(c->fd, c->rep, -1);
}

static void *conn_main(void *arg)
{
	struct gpu_conn *c = arg;
	struct fs_gpu *g = c->g;
	struct tfs_gpu_req req;
	int fd, ret;

	for (;;) {
		ret = req_recv(c, &req, &fd);
		if (ret > 0 && serve(c, &req, fd) < 0)
			ret = -EPIPE;
		/* GRANT keeps no fd, and one kept would hold the mount busy: all are closed. */
		if (fd >= 0)
			close(fd);
		if (ret == -EPROTO) {
			/* Say why before hanging up: a client of another version. */
			rep_init(c->rep, req.op, -EPROTO);
			rep_send(c->fd, c->rep, -1);
		}
		if (ret <= 0)
			break;
	}
	/* The client is gone (or broke the protocol): nothing it pinned stays pinned. */
	while (c->pins) {
		struct gpu_pin *p = c->pins;

		c->pins = p->next;
		pin_release(c, p, !p->write);
	}
	shutdown(c->fd, SHUT_RDWR);
	pthread_mutex_lock(&g->lock);
	c->done = true;
	g->nlive--;
	pthread_mutex_unlock(&g->lock);
	/* Ask the accept thread to join us; at stop nobody reads this, and no one needs to. */
	char wake = WAKE_REAP;
	if (write(g->wake_pipe[1], &wake, 1) != 1) {
		/* the pipe is full: the accept thread has wake-ups queued already */
	}
	return NULL;
}

/* Join the threads of finished connections. Called by the accept thread. */
static void reap(struct fs_gpu *g, bool all)
{
	struct gpu_conn **cp = &g->conns, *c;

	pthread_mutex_lock(&g->lock);
	while ((c = *cp)) {
		if (!c->done && !all) {
			cp = &c->next;
			continue;
		}
		*cp = c->next;
		g->nconns--;
		pthread_mutex_unlock(&g->lock);
		pthread_join(c->thread, NULL);
		close(c->fd);
		free(c->rep);
		free(c);
		pthread_mutex_lock(&g->lock);
	}
	pthread_mutex_unlock(&g->lock);
}

/* ---- refused connections ---- */

/* Read what the refused client sent, closing any fd it passed, and hang up. */
static void refused_close(struct fs_gpu *g, unsigned i)
{
	struct tfs_gpu_req req;
	ssize_t n;
	int fd;

	do
		n = gpusock_recv(g->refused_q[i].fd, &req, sizeof(req), MSG_DONTWAIT, &fd);
	while (n > 0 || n == -EMSGSIZE);
	close(g->refused_q[i].fd);
	g->refused_q[i] = g->refused_q[--g->nrefused];
}

/*
 * Answer a client we will not serve with why (status), then hang up, but
 * only once its first request has been read: a socket closed with a
 * message unread makes the peer's next read fail with ECONNRESET instead
 * of returning the answer. The accept thread keeps the socket in its poll
 * set until the request comes, the client hangs up, or GPU_REFUSE_LINGER_MS
 * pass; at most GPU_REFUSED_MAX wait, the oldest gives way.
 */
static void refuse(struct fs_gpu *g, int fd, uid_t uid, int status, const char *why)
{
	struct gpu_refused *r;
	struct tfs_gpu_rep rep;
	bool log;

	pthread_mutex_lock(&g->lock);
	g->refused++;
	log = log_ratelimit(&g->refuse_log_sec, 10);
	pthread_mutex_unlock(&g->lock);
	if (log)
		log_warn("gpu socket: refused a client of uid %u: %s", (unsigned)uid, why);
	rep_init(&rep, TFS_GPU_HELLO, status);
	rep_send(fd, &rep, -1);
	if (g->nrefused == GPU_REFUSED_MAX) {
		unsigned oldest = 0;

		for (unsigned i = 1; i < g->nrefused; i++)
			if (g->refused_q[i].until_ms < g->refused_q[oldest].until_ms)
				oldest = i;
		refused_close(g, oldest);
	}
	r = &g->refused_q[g->nrefused++];
	r->fd = fd;
	r->until_ms = fs_monotonic_ms() + GPU_REFUSE_LINGER_MS;
}

/* ---- accepting ---- */

static void accept_one(struct fs_gpu *g)
{
	struct ucred cred;
	socklen_t len = sizeof(cred);
	struct gpu_conn *c;
	int fd = accept4(g->lfd, NULL, NULL, SOCK_CLOEXEC);

	if (fd < 0)
		return;
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) {
		close(fd);
		return;
	}
	if (cred.uid != g->owner) {
		refuse(g, fd, cred.uid, -EACCES, "only the mount owner may use the arena");
		return;
	}
	pthread_mutex_lock(&g->lock);
	if (g->nconns >= GPU_MAX_CONNS) {
		pthread_mutex_unlock(&g->lock);
		refuse(g, fd, cred.uid, -EMFILE, "too many connections");
		return;
	}
	c = calloc(1, sizeof(*c));
	if (c) {
		c->g = g;
		c->fd = fd;
		c->rep = calloc(1, TFS_GPU_REP_MAX);
	}
	if (!c || !c->rep || pthread_create(&c->thread, NULL, conn_main, c) != 0) {
		pthread_mutex_unlock(&g->lock);
		if (c)
			free(c->rep);
		free(c);
		refuse(g, fd, cred.uid, -ENOMEM, "out of memory or threads");
		return;
	}
	pthread_setname_np(c->thread, "tfs-gpu-conn");
	c->next = g->conns;
	g->conns = c;
	g->nconns++;
	g->nlive++;
	pthread_mutex_unlock(&g->lock);
}

static void *accept_main(void *arg)
{
	struct fs_gpu *g = arg;
	struct pollfd pf[2 + GPU_REFUSED_MAX];

	for (;;) {
		unsigned nref = g->nrefused;
		uint64_t now = fs_monotonic_ms();
		int timeout = -1;
		char wake = 0;
		int n;

		pf[0] = (struct pollfd){g->lfd, POLLIN, 0};
		pf[1] = (struct pollfd){g->wake_pipe[0], POLLIN, 0};
		for (unsigned i = 0; i < nref; i++) {
			uint64_t until = g->refused_q[i].until_ms;
			int left = until > now ? (int)(until - now) : 0;

			pf[2 + i] = (struct pollfd){g->refused_q[i].fd, POLLIN, 0};
			if (timeout < 0 || left < timeout)
				timeout = left;
		}
		n = poll(pf, 2 + nref, timeout);
		if (n < 0 && errno != EINTR)
			break;
		now = fs_monotonic_ms();
		/* From the last: refused_close moves the last entry into the one it closes. */
		for (unsigned i = nref; i-- > 0;)
			if ((n > 0 && pf[2 + i].revents) || g->refused_q[i].until_ms <= now)
				refused_close(g, i);
		if (n > 0 && pf[1].revents) {
			if (read(g->wake_pipe[0], &wake, 1) == 1 && wake == WAKE_STOP)
				break;
			reap(g, false);
		}
		if (n > 0 && (pf[0].revents & POLLIN))
			accept_one(g);
	}
	while (g->nrefused)
		refused_close(g, g->nrefused - 1);
	return NULL;
}

/* ---- start, stop, and the control file ---- */

/* One folder of trusted_dir: 0, or -errno with why set. */
static int trusted_one(const char *path, uid_t uid, char *why, size_t whylen)
{
	struct stat st;

	if (lstat(path, &st) < 0) {
		int e = errno;

		snprintf(why, whylen, "%s: %s", path, strerror(e));
		return -e;
	}
	if (!S_ISDIR(st.st_mode)) {
		snprintf(why, whylen, "%s is not a folder", path);
		return -EPERM;
	}
	if (st.st_uid != uid && st.st_uid != 0) {
		snprintf(why, whylen, "%s is owned by uid %u", path, (unsigned)st.st_uid);
		return -EPERM;
	}
	if ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX)) {
		snprintf(why, whylen, "%s is writable by group or others (mode %04o)", path,
			 (unsigned)(st.st_mode & 07777));
		return -EPERM;
	}
	return 0;
}

/*
 * Whether dir (a resolved path) and every folder above it are beyond other
 * users' reach: each owned by uid or root, and writable by nobody else
 * unless sticky (then nobody else can rename or remove what is ours in
 * it). Else the owner of such a folder could move the socket's folder
 * aside and put a socket of its own where clients look for the daemon's.
 * 0, or -EPERM with why set.
 */
static int trusted_dir(const char *dir, uid_t uid, char *why, size_t whylen)
{
	char path[PATH_MAX];
	size_t n = strlen(dir);
	int ret;

	if (dir[0] != '/' || n >= sizeof(path)) {
		snprintf(why, whylen, "not an absolute path");
		return -EPERM;
	}
	memcpy(path, dir, n + 1);
	ret = trusted_one("/", uid, why, whylen);
	for (size_t end = 1; end <= n && !ret; end++) {
		char keep = path[end];

		if (keep != '/' && keep != 0)
			continue;
		path[end] = 0;
		ret = trusted_one(path, uid, why, whylen);
		path[end] = keep;
	}
	return ret;
}

/*
 * A private folder for the socket, made 0700 by the daemon's uid in the
 * first of $XDG_RUNTIME_DIR, /run/user/UID and /tmp that no other user can
 * change (trusted_dir). An XDG_RUNTIME_DIR of another user is what su
 * without - or sudo -E leaves a root daemon: it is passed over, with a
 * warning.
 */
static int make_sock_dir(struct fs_gpu *g, char *err, size_t errlen)
{
	const char *xdg = getenv("XDG_RUNTIME_DIR");
	char run[64], real[PATH_MAX], why[PATH_MAX + 64];
	const char *cand[3];
	unsigned ncand = 0;
	struct stat st;
	int ret = -EPERM;

	snprintf(run, sizeof(run), "/run/user/%u", (unsigned)g->owner);
	if (xdg && *xdg)
		cand[ncand++] = xdg;
	cand[ncand++] = run;
	cand[ncand++] = "/tmp";
	for (unsigned i = 0; i < ncand; i++) {
		if (!realpath(cand[i], real)) {
			ret = -errno;
			snprintf(why, sizeof(why), "%s: %s", cand[i], strerror(-ret));
		} else {
			ret = trusted_dir(real, g->owner, why, sizeof(why));
		}
		if (ret == 0)
			break;
		if (cand[i] == xdg)
			log_warn("cuda=on: XDG_RUNTIME_DIR=%s is not used for the GPU socket: %s; "
				 "another user could replace the socket",
				 xdg, why);
	}
	if (ret) {
		snprintf(err, errlen,
			 "cuda=on: no folder for the GPU socket that only uid %u or root can "
			 "change (%s)",
			 (unsigned)g->owner, why);
		return ret;
	}
	if ((size_t)snprintf(g->dir, sizeof(g->dir), "%s/tensorfs-gpu-XXXXXX", real) >=
	    sizeof(g->dir)) {
		g->dir[0] = 0;
		snprintf(err, errlen, "cuda=on: the GPU socket's path under %s is too long", real);
		return -ENAMETOOLONG;
	}
	if (!mkdtemp(g->dir)) {
		ret = -errno;
		snprintf(err, errlen, "cuda=on: cannot make a folder for the GPU socket in %s: %s",
			 real, strerror(errno));
		g->dir[0] = 0;
		return ret;
	}
	/* Made by us, 0700: nobody else can enter it or change what is in it. */
	if (lstat(g->dir, &st) < 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid() ||
	    (st.st_mode & 077)) {
		snprintf(err, errlen, "cuda=on: the GPU socket's folder %s is not private", g->dir);
		return -EPERM;
	}
	if ((size_t)snprintf(g->path, sizeof(g->path), "%s/%s", g->dir, GPU_SOCK_NAME) >=
	    sizeof(g->path)) {
		g->path[0] = 0;
		snprintf(err, errlen, "cuda=on: the GPU socket's path %s/%s is too long", g->dir,
			 GPU_SOCK_NAME);
		return -ENAMETOOLONG;
	}
	return 0;
}

static int listen_sock(struct fs_gpu *g)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};

	g->lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (g->lfd < 0)
		return -errno;
	memcpy(sa.sun_path, g->path, strlen(g->path) + 1);
	if (bind(g->lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || chmod(g->path, 0600) < 0 ||
	    listen(g->lfd, GPU_LISTEN_BACKLOG) < 0)
		return -errno;
	return 0;
}

static void gpu_free(struct fs_gpu *g)
{
	if (g->lfd >= 0)
		close(g->lfd);
	if (g->path[0] && unlink(g->path) < 0 && errno != ENOENT)
		log_warn("cannot remove the gpu socket %s: %s", g->path, strerror(errno));
	if (g->dir[0] && rmdir(g->dir) < 0)
		log_warn("cannot remove the gpu socket's folder %s: %s", g->dir, strerror(errno));
	if (g->wake_pipe[0] >= 0) {
		close(g->wake_pipe[0]);
		close(g->wake_pipe[1]);
	}
	cuda_unregister(g);
	pthread_cond_destroy(&g->cv);
	pthread_mutex_destroy(&g->lock);
	free(g);
}

int fs_gpu_start(struct fs *fs, struct fuse_session *se, char *err, size_t errlen)
{
	struct fs_gpu *g;
	int ret;

	if (!fs->cfg->cuda)
		return 0;
	g = calloc(1, sizeof(*g));
	if (!g)
		return -ENOMEM;
	g->fs = fs;
	g->se = se;
	g->lfd = -1;
	g->wake_pipe[0] = g->wake_pipe[1] = -1;
	g->owner = getuid();
	g->bs = fs->bs;
	pthread_mutex_init(&g->lock, NULL);
	pthread_cond_init(&g->cv, NULL);
	tb_arena(fs->tb, &g->arena);
	tb_client_pins(fs->tb, &g->max_pins, &g->max_wpins);
	if (getrandom(&g->id, sizeof(g->id), 0) != sizeof(g->id))
		g->id = (uint64_t)getpid() << 32 ^ (uint64_t)time(NULL);
	cuda_register(g);
	fs->gpu = g;
	if (g->arena.fd < 0) {
		/* Clients see no socket in the gpu file and take the pread path. */
		log_warn("cuda=on: the DRAM arena is not a sealed memfd; GPU clients "
			 "will read and write through FUSE");
		return 0;
	}
	ret = make_sock_dir(g, err, errlen);
	if (ret == 0)
		ret = listen_sock(g);
	if (ret == 0 && pipe2(g->wake_pipe, O_CLOEXEC | O_NONBLOCK) < 0)
		ret = -errno;
	if (ret == 0)
		ret = -pthread_create(&g->thread, NULL, accept_main, g);
	if (ret) {
		if (g->dir[0] && g->path[0])
			snprintf(err, errlen, "cuda=on: cannot serve the GPU socket in %s: %s",
				 g->dir, strerror(-ret));
		fs->gpu = NULL;
		gpu_free(g);
		return ret;
	}
	pthread_setname_np(g->thread, "tfs-gpu");
	g->thread_started = true;
	log_info("cuda=on: GPU clients connect to %s", g->path);
	return 0;
}

void fs_gpu_stop(struct fs *fs)
{
	struct fs_gpu *g = fs->gpu;
	char c = WAKE_STOP;

	if (!g)
		return;
	if (g->thread_started) {
		/* Blocking now: the stop must not be lost in a full pipe. */
		fcntl(g->wake_pipe[1], F_SETFL, 0);
		if (write(g->wake_pipe[1], &c, 1) != 1)
			log_err("cannot stop the gpu socket thread: %s", strerror(errno));
		pthread_join(g->thread, NULL);
	}
	/* Hang up on every client; each thread then releases its pins. */
	pthread_mutex_lock(&g->lock);
	g->stopping = true;
	pthread_cond_broadcast(&g->cv);
	for (struct gpu_conn *cn = g->conns; cn; cn = cn->next)
		shutdown(cn->fd, SHUT_RDWR);
	pthread_mutex_unlock(&g->lock);
	reap(g, true);
	fs->gpu = NULL;
	gpu_free(g);
}

struct json_t *fs_gpu_json(struct fs *fs)
{
	struct fs_gpu *g = fs->gpu;
	char id[20];
	json_t *j = json_object();

	json_object_set_new(j, "enabled", json_boolean(g != NULL));
	if (!g) {
		json_object_set_new(j, "socket", json_null());
		return j;
	}
	snprintf(id, sizeof(id), "%016llx", (unsigned long long)g->id);
	pthread_mutex_lock(&g->lock);
	json_object_set_new(j, "socket", g->thread_started ? json_string(g->path) : json_null());
	json_object_set_new(j, "id", json_string(id));
	json_object_set_new(j, "arena_bytes", json_integer((json_int_t)g->arena.bytes));
	json_object_set_new(j, "block_size", json_integer((json_int_t)g->bs));
	json_object_set_new(j, "huge_pages", json_boolean(g->arena.huge));
	json_object_set_new(j, "cuda_registered", json_boolean(g->cu.registered));
	json_object_set_new(j, "cuda", json_string(g->cu.why));
	json_object_set_new(j, "max_pins", json_integer((json_int_t)g->max_pins));
	json_object_set_new(j, "max_write_pins", json_integer((json_int_t)g->max_wpins));
	json_object_set_new(j, "clients", json_integer(g->nlive));
	json_object_set_new(j, "pinned_blocks", json_integer((json_int_t)g->pinned));
	json_object_set_new(j, "write_pinned_blocks", json_integer((json_int_t)g->wpinned));
	json_object_set_new(j, "pins", json_integer((json_int_t)g->pins_total));
	json_object_set_new(j, "read_bytes", json_integer((json_int_t)g->read_bytes));
	json_object_set_new(j, "write_bytes", json_integer((json_int_t)g->write_bytes));
	json_object_set_new(j, "failed_writes", json_integer((json_int_t)g->failed_writes));
	json_object_set_new(j, "refused", json_integer((json_int_t)g->refused));
	json_object_set_new(j, "prefetches", json_integer((json_int_t)g->prefetches));
	json_object_set_new(j, "prefetch_bytes", json_integer((json_int_t)g->prefetch_bytes));
	pthread_mutex_unlock(&g->lock);
	return j;
}

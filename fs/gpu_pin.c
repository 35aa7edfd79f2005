/*
 * gpu_pin.c - the GPU server's transfer engine: what a connection may pin
 * (grants: a descriptor of the file, open for reading or writing, sent by
 * the client), the pin budget shared by all clients (below
 * tb_client_pins), the pins of a file range's blocks for a read (loaded
 * first) or a write (reserved, with the file's io lock held shared), their
 * release (a write's commit: size, mtime, the kernel's page cache of the
 * range dropped), and the loads ahead that PREFETCH asks for.
 *
 * gpu_conn.c's connection threads call in here; it may call req.c (the
 * learner told of each pin), ctl_names.c (a control file is no client's
 * file), the inode table, prefetch.c and the block store, and nothing of
 * gpu_conn.c, gpu.c, ctl or ops.
 */
#include "gpu_int.h"
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
int fs_gpu_grant(struct gpu_conn *c, const struct tfs_gpu_req *req, int fd)
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
 * in->gpu_wpins: a truncate waits only so long for it (ops_data.c fs_io_lock_excl).
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

int fs_gpu_pin(struct gpu_conn *c, const struct tfs_gpu_req *req, bool write)
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
void fs_gpu_pin_release(struct gpu_conn *c, struct gpu_pin *p, bool ok)
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
int fs_gpu_prefetch(struct gpu_conn *c, const struct tfs_gpu_req *req)
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

int fs_gpu_release(struct gpu_conn *c, const struct tfs_gpu_req *req)
{
	struct gpu_pin **pp;

	for (pp = &c->pins; *pp; pp = &(*pp)->next) {
		struct gpu_pin *p = *pp;

		if (p->id != req->pin)
			continue;
		*pp = p->next;
		fs_gpu_pin_release(c, p, req->status == 0);
		return 0;
	}
	return -ENOENT;
}

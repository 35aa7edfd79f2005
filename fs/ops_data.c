/*
 * ops_data.c - the FUSE ops on file data: open, release, flush, fsync,
 * read, write, fallocate and copy_file_range, and the helpers that a
 * change of size shares with setattr (fs_io_lock_excl, fs_truncate_to).
 *
 * A write copies into DRAM slots and is answered at once, or, where it
 * would wait for dirty room, from defer.c's threads, as an fsync is (the
 * part both run, storing a write job and answering it, is wjob.c's); a
 * read is answered straight from the slots with an iovec, and a read that
 * misses is answered from the I/O completion, so no worker thread waits on
 * a device; nor long on a GPU client's write pin: a change of size gives
 * up with ETXTBSY (fs_io_lock_excl).
 *
 * It may call the control files (ctl*.c: their open, read and write),
 * req.c, wjob.c, defer.c, loop.c (where the serving thread landed a
 * write's bytes), the inode table, prefetch.c, the store and the block
 * store.
 */
#include "ops_int.h"
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <linux/fuse.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#define FS_READAHEAD_SLACK (8U << 20) /* concurrent readers arrive out of order */
/*
 * Bytes one copy_file_range moves at most; callers loop on a short count.
 * It bounds the time a copy holds a worker (by value it is as many bytes
 * written) and keeps the count within the 32 bits of FUSE's reply.
 */
#define FS_MAX_COPY (64U << 20)

/* ---- data: helpers shared by write, truncate, punch and copy ---- */

/*
 * Take in->io exclusively, for a change of size or block map. A GPU
 * client's write pin holds it shared for as long as that client copies
 * (gpu_pin.c), and the client is not the caller, so the wait is bounded: it
 * ends with EINTR when the kernel interrupts the request (any signal,
 * SIGKILL too), and with ETXTBSY once write pins have held the file for
 * FS_PIN_WAIT_MS, or we have waited that long for them, as the kernel
 * refuses to truncate an active swap file. The pin is never taken away:
 * its client may still be copying into the slots. Without GPU pins this
 * waits as a plain wrlock would.
 */
int fs_io_lock_excl(fuse_req_t req, struct fs_inode *in)
{
	uint64_t t0 = fs_monotonic_ms(), now, since;
	struct timespec until;
	unsigned wpins;

	for (;;) {
		clock_gettime(CLOCK_MONOTONIC, &until);
		until.tv_nsec += FS_PIN_WAIT_STEP_MS * 1000000L;
		if (until.tv_nsec >= 1000000000L) {
			until.tv_sec++;
			until.tv_nsec -= 1000000000L;
		}
		if (pthread_rwlock_clockwrlock(&in->io, CLOCK_MONOTONIC, &until) == 0)
			return 0;
		if (fuse_req_interrupted(req))
			return -EINTR;
		pthread_mutex_lock(&in->lock);
		wpins = in->gpu_wpins;
		since = in->gpu_wpin_ms;
		pthread_mutex_unlock(&in->lock);
		now = fs_monotonic_ms();
		if (wpins && (now - since >= FS_PIN_WAIT_MS || now - t0 >= FS_PIN_WAIT_MS))
			break;
	}
	log_warn("inode %llu: GPU write pins have held it for %llu ms; refusing to change its "
		 "size (ETXTBSY)",
		 (unsigned long long)in->ino, (unsigned long long)(now - since));
	return -ETXTBSY;
}

/* Blocks of persistent space a write of len bytes at off needs. */
static uint64_t write_blocks(const struct fs *fs, uint64_t off, size_t len)
{
	return len ? (off + len - 1) / fs->bs - off / fs->bs + 1 : 0;
}

/*
 * Store len bytes of buf (NULL: zeros) at off for uid, extending the size,
 * waiting for room where it must; the caller holds in->io.
 */
static int write_data(struct fs *fs, struct fs_inode *in, const char *buf, size_t len, off_t off,
		      uint32_t uid)
{
	struct fs_wjob j = {.in = in,
			    .data = buf,
			    .len = len,
			    .off = (uint64_t)off,
			    .resv = write_blocks(fs, (uint64_t)off, len),
			    .who = {.uid = uid}};
	int ret;

	/* All the space first, so a full tier fails the request before it changes anything. */
	ret = tb_reserve(fs->tb, j.resv);
	if (ret)
		return ret;
	ret = fs_write_run(fs, &j);
	tb_unreserve(fs->tb, j.resv);
	return ret;
}

/* Read len bytes at off into buf, synchronously; holes and EOF read as zeros. */
static int read_data(struct fs *fs, struct fs_inode *in, char *buf, size_t len, off_t off)
{
	size_t done = 0;

	while (done < len) {
		uint64_t pos = (uint64_t)off + done;
		size_t bo = pos % fs->bs, n = fs->bs - bo;
		struct tb_ref ref;
		int ret;

		if (n > len - done)
			n = len - done;
		ret = tb_get(fs->tb, in->ino, pos / fs->bs, &ref, NULL);
		if (ret == -ENOENT) {
			memset(buf + done, 0, n);
		} else if (ret == 0) {
			memcpy(buf + done, (char *)ref.data + bo, n);
			tb_put(fs->tb, &ref, n);
		} else {
			return ret;
		}
		done += n;
	}
	return 0;
}

/*
 * End a write txn that freed block locations: committed where ret (its
 * work's result) is 0, and then the freed ones given back; else aborted.
 */
static int commit_release(struct fs *fs, MDB_txn *txn, int ret, struct locvec *freed)
{
	if (ret) {
		meta_abort(txn);
		meta_locvec_free(freed);
		return ret;
	}
	ret = meta_commit(txn);
	if (ret) {
		meta_locvec_free(freed);
		return ret;
	}
	return fs_release_locs(fs, freed);
}

/*
 * Drop whole blocks [from, to) from the cache and the block map.
 * Caller holds in->io exclusively.
 */
static int drop_blocks(struct fs *fs, struct fs_inode *in, uint64_t from, uint64_t to,
		       const struct meta_inode *rec)
{
	struct locvec freed = {0};
	MDB_txn *txn;
	int ret;

	if (from < to)
		tb_drop(fs->tb, in->ino, from, to);
	ret = meta_begin(fs->meta, true, &txn);
	if (ret)
		return ret;
	if (from < to)
		ret = meta_bmap_clear(fs->meta, txn, in->ino, from, to, &freed);
	if (!ret && rec)
		ret = meta_inode_put(fs->meta, txn, in->ino, rec);
	return commit_release(fs, txn, ret, &freed);
}

/* Zero bytes [off, off+len) that lie in partial blocks, for uid; caller holds io. */
static int zero_partial(struct fs *fs, struct fs_inode *in, uint64_t off, uint64_t len,
			uint32_t uid)
{
	uint64_t end = off + len;
	uint64_t head_end = (off / fs->bs + 1) * fs->bs;
	int ret = 0;

	if (off % fs->bs) {
		uint64_t n = (end < head_end ? end : head_end) - off;

		ret = write_data(fs, in, NULL, n, (off_t)off, uid);
		if (ret || end <= head_end)
			return ret;
	}
	if (end % fs->bs && end / fs->bs * fs->bs >= off)
		ret = write_data(fs, in, NULL, end % fs->bs, (off_t)(end / fs->bs * fs->bs), uid);
	return ret;
}

/* Change the size, for uid; caller holds in->io exclusively. */
int fs_truncate_to(struct fs *fs, struct fs_inode *in, uint64_t size, uint32_t uid)
{
	struct meta_inode rec;
	uint64_t old;
	int ret;

	pthread_mutex_lock(&in->lock);
	old = in->rec.size;
	pthread_mutex_unlock(&in->lock);
	if (size < old && size % fs->bs) {
		/* The tail of the new last block must read as zeros later. */
		uint64_t blk_end = (size / fs->bs + 1) * fs->bs;
		uint64_t zero_end = old < blk_end ? old : blk_end;

		ret = write_data(fs, in, NULL, zero_end - size, (off_t)size, uid);
		if (ret)
			return ret;
	}
	pthread_mutex_lock(&in->lock);
	in->rec.size = size;
	fs_rec_touch(&in->rec, true);
	in->attr_dirty = false;
	rec = in->rec;
	pthread_mutex_unlock(&in->lock);
	if (size >= old)
		return drop_blocks(fs, in, 0, 0, &rec);
	return drop_blocks(fs, in, (size + fs->bs - 1) / fs->bs, UINT64_MAX, &rec);
}

/* ---- open files ---- */

/*
 * How an open's I/O goes. An O_DIRECT open for writing goes straight to us
 * (FOPEN_DIRECT_IO). Through the page cache's code, each write would first
 * ask us, in a round trip under the file's exclusive lock, whether the
 * file has capabilities to drop (the kernel's file_remove_privs): writes
 * to one file took turns, and the swap folder's write phase ran at half
 * its read phase's rate. Such writes drop those privileges here instead
 * (drop_privs). One thing changes for the writer: a MAP_SHARED mmap of
 * that descriptor fails with ENODEV. A read-only O_DIRECT open keeps the
 * page cache's code, which asks nothing before a read and sends the
 * pieces of one synchronous request larger than a FUSE request (1 MiB)
 * at once, where the direct path sends them one after another: `dd
 * bs=8M iflag=direct` of a file in DRAM read at 4.9-7.2 GB/s that way,
 * and at 7.1-11.9 GB/s this way (e290580). Every open keeps
 * its page cache across opens.
 */
void fs_open_io(struct fuse_file_info *fi)
{
	fi->direct_io = (fi->flags & O_DIRECT) && (fi->flags & O_ACCMODE) != O_RDONLY;
	fi->keep_cache = 1;
	fi->noflush = 1; /* fs_flush has nothing to do: no round trip at each close */
	fi->fh = 0;
}

void fs_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of_req(req);
	struct fs_inode *in;
	int ret;

	FS_COUNT(fs, opens, 1);
	if (fs_ctl_ino(ino)) {
		fs_ctl_open(fs, req, ino, fi);
		return;
	}
	ret = fs_iget(fs, ino, &in);
	if (ret) {
		fs_reply_err(fs, req, ret);
		return;
	}
	if (S_ISDIR(in->rec.mode)) {
		fs_iput(fs, in);
		fs_reply_err(fs, req, EISDIR);
		return;
	}
	if ((fi->flags & O_TRUNC) && (fi->flags & O_ACCMODE) != O_RDONLY) {
		/* The kernel hands O_TRUNC to us (atomic_o_trunc). */
		ret = fs_io_lock_excl(req, in);
		if (ret == 0) {
			ret = fs_truncate_to(fs, in, 0, fuse_req_ctx(req)->uid);
			pthread_rwlock_unlock(&in->io);
		}
		if (ret) {
			fs_iput(fs, in);
			fs_reply_err(fs, req, ret);
			return;
		}
	}
	fs_open_io(fi);
	/* The reference is the open's; release drops it. */
	if (fuse_reply_open(req, fi) != 0)
		fs_iput(fs, in);
}

void fs_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of_req(req);
	struct fs_inode *in;

	if (fs_ctl_ino(ino)) {
		fs_ctl_release(fs, req, fi);
		return;
	}
	/* Drop the open's reference, found again through the table. */
	if (fs_iget(fs, ino, &in) == 0) {
		fs_iflush_attr(fs, in);
		fs_iput(fs, in);
		fs_iput(fs, in);
	}
	fuse_reply_err(req, 0);
}

void fs_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)ino;
	(void)fi;
	fuse_reply_err(req, 0);
}

void fs_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of_req(req);
	struct fs_inode *in;
	int ret;

	(void)datasync;
	(void)fi;
	FS_COUNT(fs, fsyncs, 1);
	if (fs_ctl_ino(ino)) {
		fuse_reply_err(req, 0);
		return;
	}
	ret = fs_iget(fs, ino, &in);
	if (ret) {
		fs_reply_err(fs, req, ret);
		return;
	}
	/* It waits for the devices: in defer.c's threads, not in this one. */
	if (fs_defer_fsync(fs, req, in) != 0)
		fs_fsync_run(fs, req, in, 0);
}

void fs_fsyncdir(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of_req(req);

	(void)ino;
	(void)datasync;
	(void)fi;
	fs_reply_err(fs, req, tb_durable(fs->tb));
}

/* ---- read: answered from the slots, or from the load's completion ---- */

struct read_blk {
	struct tb_waiter w;
	struct tb_ref ref;
	struct read_ctx *ctx;
	bool hole;
};

struct read_ctx {
	fuse_req_t req;
	struct fs *fs;
	uint64_t off;
	size_t size;
	unsigned nblk;
	int pending; /* atomic */
	int err;     /* atomic: first error */
	struct read_blk blk[];
};

static void read_finish(struct read_ctx *c)
{
	struct fs *fs = c->fs;
	struct iovec *iov = calloc(c->nblk, sizeof(*iov));
	size_t left = c->size, bo = c->off % fs->bs;

	if (c->err || !iov) {
		fs_reply_err(fs, c->req, c->err ? c->err : -ENOMEM);
		goto out;
	}
	for (unsigned i = 0; i < c->nblk; i++) {
		size_t n = fs->bs - bo < left ? fs->bs - bo : left;
		const char *base = c->blk[i].hole ? tb_zero_block(fs->tb) : c->blk[i].ref.data;

		iov[i].iov_base = (char *)base + bo;
		iov[i].iov_len = n;
		left -= n;
		bo = 0;
	}
	fuse_reply_iov(c->req, iov, (int)c->nblk);
	FS_COUNT(fs, read_bytes, c->size);
out:
	left = c->size;
	bo = c->off % fs->bs;
	for (unsigned i = 0; i < c->nblk; i++) {
		size_t n = fs->bs - bo < left ? fs->bs - bo : left;

		if (c->blk[i].ref.e)
			tb_put(fs->tb, &c->blk[i].ref, c->err ? 0 : n);
		left -= n;
		bo = 0;
	}
	free(iov);
	__atomic_sub_fetch(&fs->rd_blocks, c->nblk, __ATOMIC_RELAXED);
	free(c);
}

/* The readers' queue, in blocks: the prefetch window covers it (tb_pf_readers). */
static void readers_queue(struct fs *fs, unsigned nblk)
{
	uint64_t n = __atomic_add_fetch(&fs->rd_blocks, nblk, __ATOMIC_RELAXED);
	uint64_t told = __atomic_load_n(&fs->rd_told, __ATOMIC_RELAXED);

	while (n > told) {
		if (__atomic_compare_exchange_n(&fs->rd_told, &told, n, false, __ATOMIC_RELAXED,
						__ATOMIC_RELAXED)) {
			tb_pf_readers(fs->tb, n);
			break;
		}
	}
}

static void read_blk_ready(struct tb_waiter *w, int err)
{
	struct read_blk *b = (struct read_blk *)w;
	struct read_ctx *c = b->ctx;

	if (err == 0) {
		b->ref = w->ref;
	} else if (err == -ENOENT) {
		b->hole = true;
	} else {
		int zero = 0;

		__atomic_compare_exchange_n(&c->err, &zero, err, false, __ATOMIC_SEQ_CST,
					    __ATOMIC_SEQ_CST);
	}
	if (__atomic_sub_fetch(&c->pending, 1, __ATOMIC_ACQ_REL) == 0)
		read_finish(c);
}

/* A reader near where the last read ended is sequential: load ahead of it. */
static void fs_readahead(struct fs *fs, struct fs_inode *in, uint64_t off, size_t size,
		      uint64_t fsize)
{
	uint64_t next, first, last, end_blk;
	bool seq;

	pthread_mutex_lock(&in->lock);
	next = in->ra_next;
	seq = off == 0 || (off + FS_READAHEAD_SLACK >= next && off <= next + FS_READAHEAD_SLACK);
	if (off + size > in->ra_next || !seq)
		in->ra_next = off + size;
	pthread_mutex_unlock(&in->lock);
	if (!seq || !fs->cfg->readahead)
		return;
	first = (off + size - 1) / fs->bs + 1;
	last = first + (fs->cfg->readahead + fs->bs - 1) / fs->bs;
	end_blk = (fsize + fs->bs - 1) / fs->bs;
	if (fs_readahead_deep(fs, in, first, end_blk))
		return;
	for (uint64_t b = first; b < last && b < end_blk; b++) {
		if (tb_prefetch(fs->tb, in->ino, b, false) < 0)
			break; /* no room now, far enough ahead, or every slot is needed sooner */
	}
}

void fs_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of_req(req);
	struct fs_inode *in;
	struct read_ctx *c;
	uint64_t fsize;
	int ret;

	if (fs_ctl_ino(ino)) {
		fs_ctl_read(req, size, off, fi);
		return;
	}
	FS_COUNT(fs, reads, 1);
	ret = fs_iget(fs, ino, &in);
	if (ret) {
		fs_reply_err(fs, req, ret);
		return;
	}
	pthread_mutex_lock(&in->lock);
	fsize = in->rec.size;
	in->unread = 0;
	pthread_mutex_unlock(&in->lock);
	if (off < 0 || (uint64_t)off >= fsize || size == 0) {
		fs_iput(fs, in);
		fuse_reply_buf(req, NULL, 0);
		return;
	}
	if ((uint64_t)off + size > fsize)
		size = (size_t)(fsize - (uint64_t)off);
	/* The prefetcher is woken once this read has pinned: the cache then knows where it is. */
	bool moved = fs_touch(fs, in, fsize, (uint64_t)off, size, false);

	uint64_t first = (uint64_t)off / fs->bs, last = ((uint64_t)off + size - 1) / fs->bs;
	unsigned nblk = (unsigned)(last - first + 1);
	c = calloc(1, sizeof(*c) + nblk * sizeof(c->blk[0]));
	if (!c) {
		fs_iput(fs, in);
		fs_reply_err(fs, req, ENOMEM);
		return;
	}
	c->req = req;
	c->fs = fs;
	c->off = (uint64_t)off;
	c->size = size;
	c->nblk = nblk;
	c->pending = 1; /* ours, dropped after submitting */
	readers_queue(fs, nblk);

	pthread_rwlock_rdlock(&in->io);
	for (unsigned i = 0; i < nblk; i++) {
		struct read_blk *b = &c->blk[i];

		b->ctx = c;
		b->w.fn = read_blk_ready;
		__atomic_add_fetch(&c->pending, 1, __ATOMIC_ACQ_REL);
		ret = tb_get(fs->tb, ino, first + i, &b->ref, &b->w);
		if (ret == 1)
			continue; /* read_blk_ready runs on completion */
		if (ret == 0)
			b->w.ref = b->ref;
		read_blk_ready(&b->w, ret);
	}
	fs_readahead(fs, in, (uint64_t)off, size, fsize);
	/* A read takes blocks loaded ahead: the cycle's pass may go on. */
	if (__atomic_exchange_n(&fs->pf_room_wait, false, __ATOMIC_RELAXED) || moved)
		fs_prefetch_kick(fs);
	pthread_rwlock_unlock(&in->io);
	fs_iput(fs, in);
	if (__atomic_sub_fetch(&c->pending, 1, __ATOMIC_ACQ_REL) == 0)
		read_finish(c);
}

/* ---- write ---- */

/* The mode bits a write takes: set-user-ID, and set-group-ID where group execute is on. */
static mode_t privs_killed(mode_t mode, uint32_t write_flags)
{
	if (!(write_flags & FUSE_WRITE_KILL_SUIDGID))
		return 0;
	return mode & (S_ISUID | (mode & S_IXGRP ? S_ISGID : 0));
}

/*
 * What a write takes from its file, as the kernel's page-cache path does
 * before it (file_remove_privs) and its direct path leaves to us: the
 * file's capabilities, always, and the mode bits above when the writer
 * lacks CAP_FSETID (the kernel then sets FUSE_WRITE_KILL_SUIDGID). The
 * capabilities' presence is looked up once per inode loaded; setxattr and
 * removexattr of them clear what is known.
 */
static int drop_privs(struct fs *fs, struct fs_inode *in, uint32_t write_flags)
{
	struct meta_inode rec;
	mode_t kill;
	MDB_txn *txn;
	size_t len;
	bool caps;
	int ret = 0;

	pthread_mutex_lock(&in->lock);
	if (in->caps == FS_CAPS_UNKNOWN) {
		/* Under the lock, so that a setxattr's forgetting comes after, not before. */
		ret = meta_begin(fs->meta, false, &txn);
		if (ret == 0) {
			ret = meta_xattr_get(fs->meta, txn, in->ino, FS_XATTR_CAPS, NULL, 0, &len);
			meta_abort(txn);
		}
		if (ret == 0 || ret == -ENODATA)
			in->caps = ret == 0 ? FS_CAPS_SET : FS_CAPS_NONE;
	}
	kill = privs_killed(in->rec.mode, write_flags);
	caps = in->caps == FS_CAPS_SET;
	pthread_mutex_unlock(&in->lock);
	if (ret && ret != -ENODATA)
		return ret;
	if (!kill && !caps)
		return 0;

	/* The rare path. A write transaction first, then the inode: fs_iflush_attr's order. */
	ret = meta_begin(fs->meta, true, &txn);
	if (ret)
		return ret;
	pthread_mutex_lock(&in->lock);
	kill = privs_killed(in->rec.mode, write_flags);
	caps = in->caps != FS_CAPS_NONE; /* unknown again if a setxattr came meanwhile */
	in->caps = FS_CAPS_NONE; /* before the commit: a setxattr's forgetting comes after */
	in->rec.mode &= ~kill;
	fs_rec_touch(&in->rec, false);
	in->attr_dirty = false;
	rec = in->rec;
	pthread_mutex_unlock(&in->lock);
	ret = caps ? meta_xattr_del(fs->meta, txn, in->ino, FS_XATTR_CAPS) : 0;
	if (ret == 0 || ret == -ENODATA)
		ret = meta_inode_put(fs->meta, txn, in->ino, &rec);
	ret = ret ? (meta_abort(txn), ret) : meta_commit(txn);
	if (ret) {
		pthread_mutex_lock(&in->lock);
		in->caps = FS_CAPS_UNKNOWN;
		in->attr_dirty = true; /* the mode goes with the next change, or at release */
		pthread_mutex_unlock(&in->lock);
		return ret;
	}
	/* The kernel's copy of the mode goes: the next stat asks us. */
	if (kill && fs->se)
		fuse_lowlevel_notify_inval_inode(fs->se, in->ino, -1, 0);
	return 0;
}

void fs_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
	      struct fuse_file_info *fi)
{
	struct fs *fs = fs_of_req(req);
	struct fs_landing *land = fs_landing;
	struct fs_inode *in;
	uint64_t fsize;
	bool privs;
	int ret;

	(void)fi;
	/* The bytes were received into a spare slot of the arena (loop.c). */
	if (land && buf == land->expect && size == land->size)
		buf = land->data;
	else
		land = NULL;
	FS_COUNT(fs, writes, 1);
	if (fs_ctl_ino(ino)) {
		fs_ctl_write(fs, req, ino, buf, size);
		return;
	}
	if (off < 0) {
		fs_reply_err(fs, req, EINVAL);
		return;
	}
	ret = fs_iget(fs, ino, &in);
	if (ret) {
		fs_reply_err(fs, req, ret);
		return;
	}
	pthread_mutex_lock(&in->lock);
	fsize = in->rec.size > (uint64_t)off + size ? in->rec.size : (uint64_t)off + size;
	/* Anything for drop_privs to drop, or to look up: rarely after a file's first write. */
	privs = in->caps != FS_CAPS_NONE || privs_killed(in->rec.mode, fs_write_flags);
	pthread_mutex_unlock(&in->lock);
	/* The file's size, not the end of this write: a rewrite from the start is of all of it. */
	if (fs_touch(fs, in, fsize, (uint64_t)off, size, true))
		fs_prefetch_kick(fs);
	ret = privs ? drop_privs(fs, in, fs_write_flags) : 0;
	if (ret) {
		fs_iput(fs, in);
		fs_reply_err(fs, req, ret);
		return;
	}
	struct fs_wjob j = {.req = req,
			    .in = in,
			    .data = buf,
			    .len = size,
			    .off = (uint64_t)off,
			    .reply = size,
			    .resv = write_blocks(fs, (uint64_t)off, size),
			    .slot = land ? land->slot : NULL,
			    .who = {.uid = fuse_req_ctx(req)->uid, .nowait = true}};
	/* All the space first, so a full tier fails the request before it changes anything. */
	ret = tb_reserve(fs->tb, j.resv);
	if (ret) {
		fs_iput(fs, in);
		fs_reply_err(fs, req, ret);
		return;
	}
	pthread_rwlock_rdlock(&in->io);
	ret = fs_write_run(fs, &j);
	pthread_rwlock_unlock(&in->io);
	/*
	 * Where it would wait (for dirty room, mostly), the rest waits in
	 * defer.c's threads, not in this one, which serves /dev/fuse: the
	 * job, its reference on in and its reservation go with it. Refused
	 * there (past the bytes a user may park), it waits here, as before.
	 */
	if (ret == -EAGAIN && fs_defer_write(fs, &j) == 0)
		return;
	if (ret == -EAGAIN)
		fs_write_resume(fs, &j);
	else
		fs_write_end(fs, &j, ret);
}

/* ---- fallocate and copy_file_range ---- */

static int punch(struct fs *fs, struct fs_inode *in, uint64_t off, uint64_t len, uint32_t uid)
{
	uint64_t size, end, first, last;
	int ret;

	pthread_mutex_lock(&in->lock);
	size = in->rec.size;
	pthread_mutex_unlock(&in->lock);
	if (off >= size)
		return 0;
	end = off + len < size ? off + len : size;
	first = (off + fs->bs - 1) / fs->bs;
	last = end / fs->bs; /* whole blocks are [first, last) */
	if (first < last) {
		ret = drop_blocks(fs, in, first, last, NULL);
		if (ret)
			return ret;
	}
	/* write_data must not grow the file: zero only inside it. */
	ret = zero_partial(fs, in, off, end - off, uid);
	pthread_mutex_lock(&in->lock);
	in->rec.size = size;
	pthread_mutex_unlock(&in->lock);
	return ret;
}

void fs_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off, off_t len,
		  struct fuse_file_info *fi)
{
	struct fs *fs = fs_of_req(req);
	struct fs_inode *in;
	int ret;

	(void)fi;
	FS_COUNT(fs, fallocates, 1);
	if (off < 0 || len <= 0) {
		fs_reply_err(fs, req, EINVAL);
		return;
	}
	if (mode & ~(FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE)) {
		fs_reply_err(fs, req, EOPNOTSUPP);
		return;
	}
	if ((mode & FALLOC_FL_PUNCH_HOLE) && !(mode & FALLOC_FL_KEEP_SIZE)) {
		fs_reply_err(fs, req, EINVAL);
		return;
	}
	ret = fs_iget(fs, ino, &in);
	if (ret)
		goto err;
	ret = fs_io_lock_excl(req, in);
	if (ret) {
		fs_iput(fs, in);
		goto err;
	}
	if (mode & FALLOC_FL_PUNCH_HOLE) {
		fs_watch(req);
		ret = punch(fs, in, (uint64_t)off, (uint64_t)len, fuse_req_ctx(req)->uid);
		fs_unwatch();
	} else {
		/* No preallocation: we check that the space exists now. */
		ret = tb_space_check(fs->tb, ((uint64_t)len + fs->bs - 1) / fs->bs);
		pthread_mutex_lock(&in->lock);
		if (!ret && !(mode & FALLOC_FL_KEEP_SIZE) &&
		    (uint64_t)off + (uint64_t)len > in->rec.size) {
			in->rec.size = (uint64_t)off + (uint64_t)len;
			fs_rec_touch(&in->rec, false);
			in->attr_dirty = true;
		}
		pthread_mutex_unlock(&in->lock);
		if (!ret)
			ret = fs_iflush_attr(fs, in);
	}
	pthread_rwlock_unlock(&in->io);
	fs_iput(fs, in);
err:
	fs_reply_err(fs, req, ret);
}

/*
 * Copy n bytes by value, through a bounce buffer, for uid; *done counts
 * them. Once some are copied, it stops with -EAGAIN where a write would
 * wait for room, so that the request answers with a short count rather
 * than hold its worker (callers loop on it); the first block waits.
 */
static int copy_bytes(struct fs *fs, struct fs_inode *src, uint64_t soff, struct fs_inode *dst,
		      uint64_t doff, uint64_t n, uint32_t uid, uint64_t *done)
{
	char *buf = malloc(fs->bs);
	int ret = buf ? 0 : -ENOMEM;

	while (!ret && n) {
		size_t chunk = n < fs->bs ? n : fs->bs;
		struct fs_wjob j = {.in = dst,
				    .data = buf,
				    .len = chunk,
				    .off = doff,
				    .resv = write_blocks(fs, doff, chunk),
				    .who = {.uid = uid, .nowait = *done > 0}};

		ret = read_data(fs, src, buf, chunk, (off_t)soff);
		if (!ret)
			ret = tb_reserve(fs->tb, j.resv);
		if (ret)
			break;
		ret = fs_write_run(fs, &j);
		tb_unreserve(fs->tb, j.resv);
		*done += j.done;
		soff += chunk;
		doff += chunk;
		n -= chunk;
	}
	free(buf);
	return ret;
}

/* Let whole blocks of dst share the blocks of src: no data moves. */
static int share_blocks(struct fs *fs, struct fs_inode *src, uint64_t sidx, struct fs_inode *dst,
			uint64_t didx, uint64_t n, uint64_t new_end)
{
	struct locvec freed = {0};
	struct meta_inode rec;
	MDB_txn *txn;
	int ret;

	ret = tb_flush_obj(fs->tb, src->ino);
	if (ret)
		return ret;
	tb_drop(fs->tb, dst->ino, didx, didx + n);
	pthread_mutex_lock(&dst->lock);
	if (new_end > dst->rec.size)
		dst->rec.size = new_end;
	fs_rec_touch(&dst->rec, true);
	dst->attr_dirty = false;
	rec = dst->rec;
	pthread_mutex_unlock(&dst->lock);
	ret = meta_begin(fs->meta, true, &txn);
	if (ret)
		return ret;
	ret = meta_bmap_share(fs->meta, txn, src->ino, sidx, dst->ino, didx, n, &freed);
	if (!ret)
		ret = meta_inode_put(fs->meta, txn, dst->ino, &rec);
	ret = commit_release(fs, txn, ret, &freed);
	if (!ret)
		FS_COUNT(fs, copy_shared_bytes, n * fs->bs);
	return ret;
}

void fs_copy_file_range(fuse_req_t req, fuse_ino_t ino_in, off_t off_in,
			struct fuse_file_info *fi_in, fuse_ino_t ino_out, off_t off_out,
			struct fuse_file_info *fi_out, size_t len, int flags)
{
	struct fs *fs = fs_of_req(req);
	struct fs_inode *src = NULL, *dst = NULL;
	uint64_t size_in, so = (uint64_t)off_in, dof = (uint64_t)off_out, n = 0, done = 0;
	uint32_t uid;
	int ret;

	(void)fi_in;
	(void)fi_out;
	FS_COUNT(fs, copies, 1);
	if (flags || off_in < 0 || off_out < 0) {
		fs_reply_err(fs, req, EINVAL);
		return;
	}
	if (fs_ctl_ino(ino_in) || fs_ctl_ino(ino_out)) {
		fs_reply_err(fs, req, EOPNOTSUPP);
		return;
	}
	ret = fs_iget(fs, ino_in, &src);
	if (!ret)
		ret = fs_iget(fs, ino_out, &dst);
	if (ret)
		goto out;
	pthread_mutex_lock(&src->lock);
	size_in = src->rec.size;
	pthread_mutex_unlock(&src->lock);
	n = so >= size_in ? 0 : size_in - so;
	if (n > len)
		n = len;
	if (ino_in == ino_out && so < dof + n && dof < so + n) {
		ret = -EINVAL; /* overlapping ranges of one file */
		goto out;
	}
	if (n == 0)
		goto out;
	if (n > FS_MAX_COPY) {
		n = FS_MAX_COPY;
		/* End on a block boundary, so that the next call shares whole blocks. */
		n -= (so + n) % fs->bs < n ? (so + n) % fs->bs : 0;
	}

	ret = fs_io_lock_excl(req, dst);
	if (ret)
		goto out;
	fs_watch(req);
	uid = fuse_req_ctx(req)->uid;
	if (so % fs->bs == dof % fs->bs) {
		uint64_t head = so % fs->bs ? fs->bs - so % fs->bs : 0;

		if (head > n)
			head = n;
		ret = copy_bytes(fs, src, so, dst, dof, head, uid, &done);
		uint64_t whole = (n - head) / fs->bs;
		if (!ret && whole)
			ret = share_blocks(fs, src, (so + head) / fs->bs, dst, (dof + head) / fs->bs,
					   whole, dof + head + whole * fs->bs);
		if (!ret)
			done += whole * fs->bs;
		uint64_t tail = n - head - whole * fs->bs;
		uint64_t t = head + whole * fs->bs;
		if (!ret && tail)
			ret = copy_bytes(fs, src, so + t, dst, dof + t, tail, uid, &done);
	} else {
		ret = copy_bytes(fs, src, so, dst, dof, n, uid, &done);
	}
	fs_unwatch();
	pthread_rwlock_unlock(&dst->io);
	if (ret == -EAGAIN) { /* room to wait for: what is copied so far, a short count */
		ret = 0;
		n = done;
	}
	if (!ret)
		ret = fs_iflush_attr(fs, dst);
out:
	if (dst)
		fs_iput(fs, dst);
	if (src)
		fs_iput(fs, src);
	if (ret)
		fs_reply_err(fs, req, ret);
	else
		fuse_reply_write(req, n);
}

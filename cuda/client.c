/*
 * client.c - libtensorfs-cuda: tfs_gpu_read and tfs_gpu_write.
 *
 * A call finds the tensorfs mount of its fd (by st_dev, in
 * /proc/self/mountinfo) and reads MOUNT/.tensorfs/gpu. Where that names a
 * socket, the first call maps the arena memfd the daemon passes, and
 * registers it with CUDA; the mount, its mapping and a pool of idle
 * connections are kept per process. Every connection first checks that
 * the server runs as the mount's owner or root (mount_connect), so that a
 * socket planted at that path receives nothing. Then the call pins the range in
 * batches, copies between the slots and device memory, waits, and
 * releases (cuda/gpu_proto.h has the protocol). Reads pin the next batch
 * while the current one is copied; writes go one batch at a time, since
 * a write pin that is released unused costs the range its old bytes.
 *
 * Where there is no socket, the daemon refuses us, or the file is not on
 * tensorfs, the call goes through pread/pwrite and a pinned bounce buffer.
 * That choice is not cached: a later call on the same mount looks again.
 *
 * The copy engine (cuda/copy.h) is CUDA in the library and memcpy in the
 * protocol tests; nothing here knows which.
 *
 * This file is the calls and the zero-copy path. It calls the fallback
 * (client_fallback.c), the mounts and connections this process keeps
 * (client_mount.c) and the connection's requests (client_conn.c); none
 * of them calls it (client_int.h).
 */
#include "client_int.h"
#include "copy.h"
#include "tensorfs_cuda.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- zero-copy ---- */

/* One pinned batch, copied out of the reply so that the next PIN may reuse it. */
struct batch {
	uint64_t pin, off, len, first;
	uint32_t n;
	uint64_t slot[TFS_GPU_MAX_BLOCKS];
};

static int take_batch(struct tfsc_mount *m, const struct tfs_gpu_rep *r, bool write,
		      struct batch *b)
{
	uint64_t nblk;

	b->pin = r->pin;
	b->off = r->off;
	b->len = r->len;
	b->first = r->off / m->bs;
	b->n = r->nblocks;
	nblk = r->len ? (r->off + r->len - 1) / m->bs - b->first + 1 : 0;
	if (nblk != r->nblocks)
		return tfsc_fail(-EPROTO, "the tensorfs daemon pinned %u blocks for %llu bytes",
				 r->nblocks, (unsigned long long)r->len);
	for (uint32_t i = 0; i < b->n; i++) {
		uint64_t s = r->slot[i];

		/* Only the offsets we were given, and only inside the arena. */
		if (s == TFS_GPU_HOLE && !write)
			;
		else if (s == TFS_GPU_HOLE || s % m->bs || s > m->arena_bytes - m->bs)
			return tfsc_fail(-EPROTO, "the tensorfs daemon gave a bad slot offset");
		b->slot[i] = s;
	}
	return 0;
}

/* PIN, proving the right to the file first if the daemon asks for that. */
static int pin(struct tfsc_conn *c, int fd, uint64_t ino, bool write, uint64_t off, uint64_t len,
	       uint32_t max_blocks)
{
	int ret = tfsc_pin(c, write, ino, off, len, max_blocks);

	if (ret != -EACCES)
		return ret;
	ret = tfsc_grant(c, fd, ino);
	if (ret == -ENOTCONN || ret == -EPROTO)
		return ret;
	if (ret)
		return tfsc_fail(ret == -EXDEV ? -EXDEV : -EBADF,
				 "the tensorfs daemon does not let this fd %s the file: %s",
				 write ? "write" : "read", strerror(-ret));
	return tfsc_pin(c, write, ino, off, len, max_blocks);
}

/*
 * Queue the copies of one batch: runs of blocks whose slots follow each
 * other are one copy, runs of holes one memset. base is the device
 * address of byte off0 of the file.
 */
static int queue_batch(struct tfsc_mount *m, const struct batch *b, bool write, char *base,
		       uint64_t off0, void *stream)
{
	uint32_t i = 0;

	while (i < b->n) {
		uint64_t start = (b->first + i) * m->bs;
		uint64_t from = start < b->off ? b->off : start, to;
		uint32_t j = i + 1;
		int ret;

		while (j < b->n &&
		       (b->slot[i] == TFS_GPU_HOLE ? b->slot[j] == TFS_GPU_HOLE
						   : b->slot[j] == b->slot[i] + (j - i) * m->bs))
			j++;
		to = (b->first + j) * m->bs;
		if (to > b->off + b->len)
			to = b->off + b->len;
		char *dev = base + (from - off0);
		char *host = b->slot[i] == TFS_GPU_HOLE
				 ? NULL
				 : (char *)m->arena + b->slot[i] + (from - start);
		if (!host)
			ret = tfsc_copy_zero(dev, to - from, stream);
		else if (write)
			ret = tfsc_copy_d2h(host, dev, to - from, stream);
		else
			ret = tfsc_copy_h2d(dev, host, to - from, stream);
		if (ret)
			return ret;
		i = j;
	}
	return 0;
}

/* A broken connection fails the call, and perhaps the daemon is gone. */
static bool broken(int err)
{
	return err == -ENOTCONN || err == -EPROTO;
}

/*
 * Ask the daemon to load the file up to *ahead_to, up to m->read_ahead
 * blocks past pos (where the next PIN starts), ahead of the PINs that
 * will want it. Best effort: only a broken connection is an error.
 */
static int prefetch_ahead(struct tfsc_mount *m, struct tfsc_conn *c, uint64_t ino, uint64_t pos,
			  uint64_t end, uint64_t *ahead_to)
{
	uint64_t want = pos + (uint64_t)(m->read_batch + m->read_ahead) * m->bs;
	uint64_t from = *ahead_to > pos ? *ahead_to : pos;
	int ret;

	if (m->no_prefetch || !m->read_ahead)
		return 0;
	if (want > end)
		want = end;
	/* Not for every window: when a window's worth is wanted, for the next few. */
	if (want < from + (uint64_t)m->read_batch * m->bs && want < end)
		return 0;
	if (from >= want)
		return 0;
	ret = tfsc_prefetch(c, ino, from, want - from);
	if (ret == -EOPNOTSUPP)
		m->no_prefetch = true;
	if (broken(ret))
		return ret;
	*ahead_to = want;
	return 0;
}

/*
 * zc_read's window at pos (to end at the most): pinned, taken into b and its
 * copies queued, recorded by ev. *have: a window of some bytes was taken.
 */
static int zc_window(struct tfsc_mount *m, struct tfsc_conn *c, int fd, uint64_t ino, uint64_t pos,
		     uint64_t end, struct batch *b, char *dev, uint64_t off, void *stream, void *ev,
		     bool *have)
{
	int ret = pin(c, fd, ino, false, pos, end - pos, m->read_batch);

	if (ret == 0)
		ret = take_batch(m, c->rep, false, b);
	*have = ret == 0 && b->len;
	if (*have) {
		ret = queue_batch(m, b, false, dev, off, stream);
		if (!ret)
			ret = tfsc_copy_event_record(ev, stream);
	}
	return ret;
}

/*
 * Pin window k + 1 while window k is copied, and have the daemon load the
 * windows after it meanwhile, so that for a file on nvme the device reads
 * overlap the copies. Window k is released once an event recorded after
 * its copies says they are done: the copies of k + 1 are queued by then,
 * so the DMA engine never waits for a round trip to the daemon.
 */
static ssize_t zc_read(struct tfsc_mount *m, struct tfsc_conn *c, int fd, uint64_t ino,
		       uint64_t off, size_t len, char *dev, void *stream, bool *conn_ok)
{
	struct batch *cur = malloc(sizeof(*cur)), *next = malloc(sizeof(*next)), *t;
	void *ev_cur = NULL, *ev_next = NULL, *evt;
	uint64_t end = off + len, pos = off, ahead_to = off;
	bool have_cur = false, have_next = false;
	int ret, rel, s;

	if (!cur || !next) {
		ret = tfsc_fail(-ENOMEM, "out of memory");
		goto out;
	}
	ret = tfsc_copy_event_new(&ev_cur);
	if (!ret)
		ret = tfsc_copy_event_new(&ev_next);
	if (!ret)
		ret = prefetch_ahead(m, c, ino, pos, end, &ahead_to);
	if (!ret)
		ret = zc_window(m, c, fd, ino, pos, end, cur, dev, off, stream, ev_cur, &have_cur);
	while (have_cur) {
		uint64_t cur_end = cur->off + cur->len;

		if (ret == 0 && cur_end < end)
			ret = prefetch_ahead(m, c, ino, cur_end, end, &ahead_to);
		/* The next window, pinned and queued while this one is copied; the daemon will not
		 * wait. */
		if (ret == 0 && cur_end < end) {
			int r = pin(c, fd, ino, false, cur_end, end - cur_end, m->read_batch);

			if (r == 0)
				r = take_batch(m, c->rep, false, next);
			have_next = r == 0 && next->len;
			if (r && r != -EAGAIN)
				ret = r;
			if (have_next && !ret) {
				ret = queue_batch(m, next, false, dev, off, stream);
				if (!ret)
					ret = tfsc_copy_event_record(ev_next, stream);
			}
		}
		/* The slots must not be released before the copies have left them. */
		s = ret ? tfsc_copy_sync(stream) : tfsc_copy_event_wait(ev_cur);
		if (!ret)
			ret = s;
		rel = broken(ret) ? 0 : tfsc_release(c, cur->pin, ret);
		have_cur = false;
		if (!ret)
			ret = rel;
		if (ret)
			break;
		pos = cur_end;
		if (have_next) {
			t = cur, cur = next, next = t;
			evt = ev_cur, ev_cur = ev_next, ev_next = evt;
			have_cur = true;
			have_next = false;
		} else if (pos < end) {
			/* -EAGAIN above: the pin limit was reached; this window is free now. */
			ret = zc_window(m, c, fd, ino, pos, end, cur, dev, off, stream, ev_cur,
					&have_cur);
			if (ret && !have_cur)
				break;
		}
	}
	if (have_next) {
		/* Its copies may be queued: they must be done before it is released. */
		tfsc_copy_sync(stream);
		if (!broken(ret))
			tfsc_release(c, next->pin, ret ? ret : -ECANCELED);
	}
out:
	/* Nothing may be left queued into memory the caller gets back. */
	if (ret)
		tfsc_copy_sync(stream);
	if (ev_cur)
		tfsc_copy_event_free(ev_cur);
	if (ev_next)
		tfsc_copy_event_free(ev_next);
	*conn_ok = !broken(ret);
	free(cur);
	free(next);
	return ret ? ret : (ssize_t)(pos - off);
}

static ssize_t zc_write(struct tfsc_mount *m, struct tfsc_conn *c, int fd, uint64_t ino,
			uint64_t off, size_t len, const char *dev, void *stream, bool *conn_ok)
{
	struct batch *b = malloc(sizeof(*b));
	uint64_t end = off + len, pos = off;
	int ret = 0;

	if (!b)
		ret = tfsc_fail(-ENOMEM, "out of memory");
	while (!ret && pos < end) {
		int s, rel;

		ret = pin(c, fd, ino, true, pos, end - pos, m->write_batch);
		if (ret == 0)
			ret = take_batch(m, c->rep, true, b);
		if (ret == 0 && b->len == 0)
			ret = tfsc_fail(-EPROTO, "the tensorfs daemon pinned nothing to write");
		if (ret)
			break;
		ret = queue_batch(m, b, true, (char *)dev, off, stream);
		s = tfsc_copy_sync(stream);
		if (!ret)
			ret = s;
		rel = tfsc_release(c, b->pin, ret);
		if (!ret)
			ret = rel;
		pos += b->len;
	}
	*conn_ok = !broken(ret);
	free(b);
	return ret ? ret : (ssize_t)len;
}

/* ---- the calls ---- */

/* Check what pread/pwrite would check, before anything is pinned. */
static int check_args(int fd, off_t offset, size_t len, const void *dev, bool write,
		      struct stat *st)
{
	int mode = fcntl(fd, F_GETFL);

	if (mode < 0)
		return tfsc_fail(-EBADF, "fd %d: %s", fd, strerror(errno));
	mode &= O_ACCMODE;
	if (write ? mode == O_RDONLY : mode == O_WRONLY)
		return tfsc_fail(-EBADF, "fd %d is not open for %s", fd,
				 write ? "writing" : "reading");
	if (fstat(fd, st) < 0)
		return tfsc_fail(-errno, "fstat: %s", strerror(errno));
	if (S_ISDIR(st->st_mode))
		return tfsc_fail(-EISDIR, "fd %d is a directory", fd);
	if (offset < 0 || (uint64_t)offset + len < (uint64_t)offset ||
	    (uint64_t)offset + len > (uint64_t)INT64_MAX)
		return tfsc_fail(-EINVAL, "bad offset %lld or length %zu", (long long)offset, len);
	if (len && !dev)
		return tfsc_fail(-EFAULT, "no device pointer");
	return len ? tfsc_copy_check(dev, len) : 0;
}

/* The connection failed, not the request: the daemon may have gone (a remount). */
static bool lost(ssize_t err)
{
	return err == -ENOTCONN;
}

static ssize_t gpu_io(int fd, off_t offset, size_t len, char *dev, void *stream, bool write)
{
	struct stat st;
	ssize_t ret;

	tfsc_errmsg[0] = 0;
	ret = check_args(fd, offset, len, dev, write, &st);
	if (ret < 0 || len == 0)
		return ret;
	/*
	 * Twice at most: a cached mount whose daemon went away is dropped and
	 * looked up again. Starting over is safe: a read reads the same bytes,
	 * a write writes them again.
	 */
	for (int attempt = 0; attempt < 2; attempt++) {
		struct tfsc_mount *m = S_ISREG(st.st_mode) ? tfsc_mount_get(fd, &st) : NULL;
		struct tfsc_conn *c = NULL;
		bool ok = false;

		if (!m)
			break;
		ret = tfsc_conn_get(m, &c);
		if (ret == 0) {
			ret = write ? zc_write(m, c, fd, st.st_ino, (uint64_t)offset, len, dev,
					       stream, &ok)
				    : zc_read(m, c, fd, st.st_ino, (uint64_t)offset, len, dev,
					      stream, &ok);
			tfsc_conn_put(m, c, ok);
		}
		if (!lost(ret) || attempt) {
			tfsc_mount_put(m);
			return ret;
		}
		tfsc_debug("connection to %s lost: %s", m->sock, tfsc_errmsg);
		tfsc_mount_drop(m);
		tfsc_mount_put(m);
	}
	return write ? tfsc_fb_write(fd, (uint64_t)offset, len, dev, stream)
		     : tfsc_fb_read(fd, (uint64_t)offset, len, dev, stream);
}

ssize_t tfs_gpu_read(int fd, off_t offset, size_t len, void *device_ptr, void *stream)
{
	return gpu_io(fd, offset, len, device_ptr, stream, false);
}

ssize_t tfs_gpu_write(int fd, off_t offset, size_t len, const void *device_ptr, void *stream)
{
	return gpu_io(fd, offset, len, (char *)device_ptr, stream, true);
}

int tfs_gpu_path(int fd)
{
	struct tfsc_mount *m;
	struct stat st;

	tfsc_errmsg[0] = 0;
	if (fstat(fd, &st) < 0)
		return tfsc_fail(-errno, "fstat: %s", strerror(errno));
	m = S_ISREG(st.st_mode) ? tfsc_mount_get(fd, &st) : NULL;
	if (!m)
		return TFS_GPU_PATH_FALLBACK;
	tfsc_mount_put(m);
	return TFS_GPU_PATH_ZEROCOPY;
}

/*
 * client_fallback.c - the call of libtensorfs-cuda where there is no
 * zero-copy path (no socket, the daemon refuses us, or the file is not
 * on tensorfs): pread/pwrite through two pinned bounce buffers, the copy
 * of one overlapping the I/O of the other, with O_DIRECT for a large
 * transfer's aligned middle.
 *
 * Calls client_mount.c (the bounce buffers) and the copy engine.
 */
#include "client_int.h"
#include "copy.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- the fallback: pread/pwrite through two pinned buffers ---- */

static uint64_t g_direct_bytes, g_buffered_bytes; /* __atomic */

void tfsc_fallback_bytes(uint64_t *direct, uint64_t *buffered)
{
	*direct = __atomic_load_n(&g_direct_bytes, __ATOMIC_RELAXED);
	*buffered = __atomic_load_n(&g_buffered_bytes, __ATOMIC_RELAXED);
}

/*
 * A second fd of fd's file, with its access mode and O_DIRECT, for the
 * aligned middle of a large transfer: -1 where the filesystem refuses
 * O_DIRECT (tmpfs of old kernels, some FUSE daemons), the transfer is
 * small, or the buffers are not aligned; the buffered fd then does all.
 */
static int direct_open(int fd, size_t len, const struct staging *st)
{
	char path[64];
	int flags = fcntl(fd, F_GETFL), dfd;

	if (len < FB_DIRECT_MIN || flags < 0 || (flags & O_DIRECT))
		return -1;
	for (int k = 0; k < 2; k++)
		if ((uintptr_t)st->buf[k] % FB_DIRECT_ALIGN)
			return -1;
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	dfd = open(path, (flags & O_ACCMODE) | O_DIRECT | O_CLOEXEC);
	if (dfd < 0)
		tfsc_debug("no O_DIRECT for fd %d: %s", fd, strerror(errno));
	return dfd;
}

/*
 * The next piece of [pos, end): through *dfd when it and the piece are
 * aligned, else buffered, up to where alignment starts or FB_CHUNK_BYTES.
 */
static size_t plan(uint64_t pos, uint64_t end, int dfd, bool *direct)
{
	uint64_t n = end - pos < FB_CHUNK_BYTES ? end - pos : FB_CHUNK_BYTES;

	*direct = false;
	if (dfd < 0)
		return (size_t)n;
	if (pos % FB_DIRECT_ALIGN)
		return (size_t)(n < FB_DIRECT_ALIGN - pos % FB_DIRECT_ALIGN
				    ? n
				    : FB_DIRECT_ALIGN - pos % FB_DIRECT_ALIGN);
	if (n >= FB_DIRECT_ALIGN) {
		*direct = true;
		n -= n % FB_DIRECT_ALIGN;
	}
	return (size_t)n;
}

/*
 * One pread or pwrite of a piece, retried on EINTR; through *dfd when
 * direct. A filesystem that takes the O_DIRECT open but refuses the I/O
 * (EINVAL) gets the rest buffered: *dfd is closed. Returns the bytes
 * moved (a pread's fewer at EOF, a pwrite's perhaps fewer) or -errno.
 */
static ssize_t piece_io(bool write, int fd, int *dfd, bool direct, char *buf, size_t n,
			uint64_t pos)
{
	for (;;) {
		int f = direct && *dfd >= 0 ? *dfd : fd;
		ssize_t r = write ? pwrite(f, buf, n, (off_t)pos) : pread(f, buf, n, (off_t)pos);

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0 && errno == EINVAL && f != fd) {
			tfsc_debug("O_DIRECT %s refused: %s", write ? "pwrite" : "pread",
			      strerror(errno));
			close(*dfd);
			*dfd = -1;
			continue;
		}
		if (r < 0)
			return tfsc_fail(-errno, "%s at %llu: %s", write ? "pwrite" : "pread",
					 (unsigned long long)pos, strerror(errno));
		__atomic_add_fetch(f == fd ? &g_buffered_bytes : &g_direct_bytes, (uint64_t)r,
				   __ATOMIC_RELAXED);
		return r;
	}
}

/*
 * The end of fb_read or fb_write, on every path: the staging buffers go back
 * to the pool only once no copy uses them, so wait for the stream first;
 * close dfd. ret, or the wait's error where ret is 0.
 */
static int fb_end(void *stream, int dfd, struct staging *st, int ret)
{
	int s = tfsc_copy_sync(stream);

	if (!ret)
		ret = s;
	if (dfd >= 0)
		close(dfd);
	tfsc_staging_put(st);
	return ret;
}

/*
 * pread piece i into buffer i % 2 once the copy of piece i - 2 has left
 * it, then queue its copy to the device: the read of a piece overlaps the
 * copy of the one before.
 */
ssize_t tfsc_fb_read(int fd, uint64_t off, size_t len, char *dev, void *stream)
{
	struct staging *st = tfsc_staging_get();
	uint64_t pos = off, end = off + len;
	int ret = 0, dfd;

	if (!st)
		return -ENOMEM;
	dfd = direct_open(fd, len, st);
	for (unsigned i = 0; pos < end; i++) {
		unsigned k = i % 2;
		bool direct;
		size_t n = plan(pos, end, dfd, &direct);
		ssize_t got;

		ret = tfsc_copy_event_wait(st->ev[k]);
		if (ret)
			break;
		got = piece_io(false, fd, &dfd, direct, st->buf[k], n, pos);
		if (got <= 0) {
			ret = (int)got;
			break; /* an error, or end of file */
		}
		ret = tfsc_copy_h2d(dev + (pos - off), st->buf[k], (size_t)got, stream);
		if (!ret)
			ret = tfsc_copy_event_record(st->ev[k], stream);
		if (ret)
			break;
		/* A short read ends at EOF, or says where to go on from: the next pread says which.
		 */
		pos += (uint64_t)got;
	}
	ret = fb_end(stream, dfd, st, ret);
	return ret ? ret : (ssize_t)(pos - off);
}

/* pwrite all of a piece: a short pwrite goes on from where it stopped; none is an error. */
static int piece_write(int fd, int *dfd, bool direct, char *buf, size_t n, uint64_t pos)
{
	size_t put = 0;

	while (put < n) {
		ssize_t r = piece_io(true, fd, dfd, direct, buf + put, n - put, pos + put);

		if (r < 0)
			return (int)r;
		if (r == 0)
			return tfsc_fail(-EIO, "pwrite at %llu wrote nothing",
					 (unsigned long long)(pos + put));
		put += (size_t)r;
		/* What is left may have lost its alignment: the page cache takes it. */
		if (put < n && (pos + put) % FB_DIRECT_ALIGN)
			direct = false;
	}
	return 0;
}

/*
 * Queue the copy of piece i + 1 into one buffer, then pwrite piece i from
 * the other once its copy is done: the copy of a piece overlaps the write
 * of the one before. A buffer is refilled only after its pwrite returned.
 */
ssize_t tfsc_fb_write(int fd, uint64_t off, size_t len, const char *dev, void *stream)
{
	struct staging *st = tfsc_staging_get();
	uint64_t pos = off, end = off + len;
	bool direct, next_direct = false;
	size_t n, next_n = 0;
	int ret, dfd;

	if (!st)
		return -ENOMEM;
	dfd = direct_open(fd, len, st);
	n = plan(pos, end, dfd, &direct);
	ret = tfsc_copy_d2h(st->buf[0], dev, n, stream);
	if (!ret)
		ret = tfsc_copy_event_record(st->ev[0], stream);
	for (unsigned i = 0; !ret && pos < end; i++) {
		unsigned k = i % 2;

		if (pos + n < end) {
			next_n = plan(pos + n, end, dfd, &next_direct);
			ret = tfsc_copy_d2h(st->buf[k ^ 1], dev + (pos + n - off), next_n, stream);
			if (!ret)
				ret = tfsc_copy_event_record(st->ev[k ^ 1], stream);
		}
		if (!ret)
			ret = tfsc_copy_event_wait(st->ev[k]);
		if (!ret)
			ret = piece_write(fd, &dfd, direct, st->buf[k], n, pos);
		pos += n;
		n = next_n;
		direct = next_direct;
	}
	ret = fb_end(stream, dfd, st, ret);
	return ret ? ret : (ssize_t)len;
}

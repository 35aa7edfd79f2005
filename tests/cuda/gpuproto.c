/*
 * gpuproto.c - tests of the shared-arena protocol and of libtensorfs-cuda's
 * logic, with memcpy in place of cudaMemcpyAsync (cuda/copy_cpu.c), so
 * that they run on machines without a GPU. The "device" memory is host
 * memory here. test_gpu_proto.sh mounts and runs each case:
 *
 *   gpuproto roundtrip MNT zerocopy|fallback [ITERS [THREADS]]
 *       random writes and reads at odd offsets and sizes through the
 *       library, pwrite, pread and truncate, against a copy in memory;
 *       the path taken must be the one named; again after a shutdown
 *   gpuproto protocol MNT
 *       the requests one by one: grants, pins, slot offsets, release,
 *       commit and abandon of writes, the pin limit, holes, EOF, bad input
 *   gpuproto owner MNT
 *       a client of another uid is refused (root only: it opens the
 *       socket to others first, so that only SO_PEERCRED stands between)
 *   gpuproto hijack MNT
 *       a socket that another uid planted in place of the daemon's (root
 *       only) receives no request and no fd from a root client, whose
 *       calls take pread/pwrite and move the right bytes
 *   gpuproto crash MNT
 *       a client that dies holding read and write pins leaves none
 *       behind, and the file it was writing can be truncated
 *   gpuproto remount MNT READY GO
 *       a process that used the arena goes on using it after the mount
 *       was replaced (it creates READY, then waits for GO)
 *   gpuproto copyfail MNT zerocopy|fallback
 *       a copy that fails midway fails the call with a message, leaves
 *       no pin, and changes no byte outside a failed write's range
 *   gpuproto fdleak MNT DAEMON-PID
 *       messages with several fds, several control messages, too many
 *       fds (MSG_CTRUNC), or an fd on a request other than GRANT leave
 *       the daemon holding no more fds than before
 *   gpuproto grantmode MNT
 *       a GRANT proves what the fd's open proved: O_PATH (of a mode 000
 *       file) and ioctl-only fds nothing, O_RDONLY read, O_WRONLY write
 *   gpuproto pinwait MNT
 *       while a client holds a write pin, a truncate can be killed, and
 *       truncate, O_TRUNC and a punched hole fail with ETXTBSY within a
 *       bound, changing nothing; the pin then commits; a truncate waits
 *       for a pin released soon
 *   gpuproto refuse MNT
 *       a refused client (another uid, or past the connection limit)
 *       reads a reply with the errno, then the hang-up (root only)
 *   gpuproto fallback DIR direct|buffered|any
 *       the pread/pwrite path on a file in DIR (not a cuda=on mount):
 *       aligned, unaligned and small ranges, several buffers' worth, reads
 *       across and past EOF, byte for byte; the aligned middle went with
 *       O_DIRECT, or not, as named; a pwrite cut short by RLIMIT_FSIZE
 *       fails the call with EFBIG
 *   gpuproto nvme MNT write|read SIZE
 *       write a file of SIZE bytes through the arena, or (after a remount
 *       has emptied DRAM) read it back, checking every byte: the read must
 *       have asked the daemon to load ahead (PREFETCH)
 *   gpuproto starve MNT reserve|expire
 *       with read pins on every clean block and the rest written, under
 *       the flusher's mark, the flusher keeps its reserve of the others,
 *       and a write to a new block gets a slot (mounted with
 *       dirty_expire_ms=0); blocks dirty behind a held write pin still go
 *       back at the age limit (mounted with a short one)
 *
 * Exit status: 0 pass, 1 fail, 77 skip.
 */
#include "client.h"
#include "gpu_sock.h"
#include "gputest.h"
#include "tensorfs_cuda.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define WAIT_TRIES 400 /* polls of a condition, 25 ms apart: 10 s at most */
#define OTHER_UID 65534

static const char *mnt;

static void sleep_ms(long ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};

	nanosleep(&ts, NULL);
}

/* An integer of MNT/.tensorfs/FILE, at the path of keys (NULL-ended). */
static long long ctl_int(const char *file, const char *const *keys)
{
	char path[4096];
	json_error_t e;
	json_t *j, *v;
	long long r;

	snprintf(path, sizeof(path), "%s/.tensorfs/%s", mnt, file);
	j = json_load_file(path, 0, &e);
	CHECK(j, "%s: %s", path, e.text);
	v = j;
	for (const char *const *k = keys; *k; k++)
		v = json_object_get(v, *k);
	CHECK(json_is_integer(v), "%s has no integer at %s...", path, keys[0]);
	r = json_integer_value(v);
	json_decref(j);
	return r;
}

/* An integer field of MNT/.tensorfs/gpu. */
static long long gpu_field(const char *key)
{
	return ctl_int("gpu", (const char *const[]){key, NULL});
}

/* Wait, boundedly, for field to read want. */
static bool wait_field(const char *key, long long want)
{
	for (int i = 0; i < WAIT_TRIES; i++) {
		if (gpu_field(key) == want)
			return true;
		sleep_ms(25);
	}
	return false;
}

static void pread_all(int fd, void *buf, size_t len, off_t off)
{
	size_t done = 0;

	while (done < len) {
		ssize_t n = pread(fd, (char *)buf + done, len - done, off + (off_t)done);

		CHECK(n > 0, "pread at %lld: %s", (long long)(off + (off_t)done),
		      n < 0 ? strerror(errno) : "EOF");
		done += (size_t)n;
	}
}

static void pwrite_all(int fd, const void *buf, size_t len, off_t off)
{
	size_t done = 0;

	while (done < len) {
		ssize_t n = pwrite(fd, (const char *)buf + done, len - done, off + (off_t)done);

		CHECK(n > 0, "pwrite: %s", strerror(errno));
		done += (size_t)n;
	}
}

static int open_in(const char *name, int flags)
{
	char path[4096];
	int fd;

	snprintf(path, sizeof(path), "%s/%s", mnt, name);
	fd = open(path, flags | O_CLOEXEC, 0644);
	CHECK(fd >= 0, "open %s: %s", path, strerror(errno));
	return fd;
}

/* ---- roundtrip: the library against a copy in memory ---- */

struct shadow {
	int fd;
	uint8_t *data;
	size_t size, cap;
};

static void shadow_grow(struct shadow *f, size_t size)
{
	if (size > f->cap) {
		f->cap = size * 2;
		f->data = realloc(f->data, f->cap);
		CHECK(f->data, "out of memory");
	}
	if (size > f->size)
		memset(f->data + f->size, 0, size - f->size);
	f->size = size;
}

/* The file must read as its shadow through FUSE: stale page cache shows here. */
static void verify_range(struct shadow *f, size_t off, size_t len, const char *after)
{
	uint8_t *buf;
	struct stat st;

	CHECK(fstat(f->fd, &st) == 0 && (size_t)st.st_size == f->size,
	      "after %s: size %lld, want %zu", after, (long long)st.st_size, f->size);
	if (off >= f->size)
		return;
	if (len > f->size - off)
		len = f->size - off;
	buf = malloc(len ? len : 1);
	CHECK(buf, "out of memory");
	pread_all(f->fd, buf, len, (off_t)off);
	for (size_t i = 0; i < len; i++)
		CHECK(buf[i] == f->data[off + i],
		      "after %s: byte %zu reads %02x through FUSE, want %02x", after, off + i,
		      buf[i], f->data[off + i]);
	free(buf);
}

struct rt_args {
	int id;
	unsigned iters;
	uint64_t seed;
	size_t bs, maxlen;
};

static void *roundtrip_thread(void *arg)
{
	struct rt_args *a = arg;
	uint64_t s = a->seed;
	struct shadow f = {0};
	char name[64];
	uint8_t *buf = malloc(a->maxlen), *got = malloc(a->maxlen + 1);
	struct timespec old[2] = {{1000000, 0}, {1000000, 0}};

	CHECK(buf && got, "out of memory");
	snprintf(name, sizeof(name), "rt%d", a->id);
	f.fd = open_in(name, O_RDWR | O_CREAT | O_TRUNC);
	for (unsigned it = 0; it < a->iters; it++) {
		unsigned op = (unsigned)(gt_rnd(&s) % 8);
		/* odd sizes and offsets, some whole blocks, some past the end */
		size_t len = 1 + (size_t)(gt_rnd(&s) % a->maxlen);
		size_t off = (size_t)(gt_rnd(&s) % (f.size + 2 * a->bs));
		struct stat st;
		ssize_t n;

		if (gt_rnd(&s) % 4 == 0)
			off -= off % a->bs;
		if (gt_rnd(&s) % 4 == 0 && len > a->bs)
			len -= len % a->bs;
		switch (op) {
		case 0:
		case 1:
		case 2: /* write through the library */
			gt_fill(buf, len, &s);
			/* Cache the old bytes in the kernel first: the write must drop them. */
			verify_range(&f, off, len, "caching");
			futimens(f.fd, old);
			n = tfs_gpu_write(f.fd, (off_t)off, len, buf, NULL);
			CHECK(n == (ssize_t)len, "tfs_gpu_write(%zu, %zu) = %zd: %s", off, len, n,
			      tfs_gpu_error());
			shadow_grow(&f, off + len > f.size ? off + len : f.size);
			memcpy(f.data + off, buf, len);
			verify_range(&f, off, len, "tfs_gpu_write");
			CHECK(fstat(f.fd, &st) == 0 && st.st_mtime > old[1].tv_sec,
			      "tfs_gpu_write left mtime at %lld", (long long)st.st_mtime);
			break;
		case 3: /* write through FUSE */
			gt_fill(buf, len, &s);
			pwrite_all(f.fd, buf, len, (off_t)off);
			shadow_grow(&f, off + len > f.size ? off + len : f.size);
			memcpy(f.data + off, buf, len);
			break;
		case 4:
		case 5:
		case 6: { /* read through the library, past EOF too */
			size_t want = off >= f.size ? 0 : (len < f.size - off ? len : f.size - off);

			memset(got, 0xA5, len + 1);
			n = tfs_gpu_read(f.fd, (off_t)off, len, got, NULL);
			CHECK(n == (ssize_t)want, "tfs_gpu_read(%zu, %zu) = %zd, want %zu: %s", off,
			      len, n, want, tfs_gpu_error());
			CHECK(want == 0 || memcmp(got, f.data + off, want) == 0,
			      "tfs_gpu_read(%zu, %zu) read other bytes than were written", off,
			      len);
			CHECK(got[want] == 0xA5, "tfs_gpu_read wrote past what it read");
			break;
		}
		case 7: { /* truncate, up (a hole) or down */
			size_t size = (size_t)(gt_rnd(&s) % (f.size + 3 * a->bs));

			CHECK(ftruncate(f.fd, (off_t)size) == 0, "ftruncate: %s", strerror(errno));
			if (size < f.size)
				f.size = size;
			shadow_grow(&f, size);
			break;
		}
		}
	}
	verify_range(&f, 0, f.size, "the last step");
	close(f.fd);
	free(f.data);
	free(buf);
	free(got);
	return NULL;
}

static int t_roundtrip(const char *expect, unsigned iters, int threads)
{
	struct rt_args a[16];
	pthread_t th[16];
	uint64_t seed = gt_seed();
	int fd = open_in("rt-path", O_RDWR | O_CREAT), want, path;
	struct stat st;
	char sock[108];
	uint64_t id;
	size_t bs;

	if (getenv("GPUPROTO_SEED"))
		seed = strtoull(getenv("GPUPROTO_SEED"), NULL, 0);
	want = strcmp(expect, "zerocopy") == 0 ? TFS_GPU_PATH_ZEROCOPY : TFS_GPU_PATH_FALLBACK;
	path = tfs_gpu_path(fd);
	CHECK(path == want, "tfs_gpu_path says %d, want %d (%s)", path, want, tfs_gpu_error());
	close(fd);
	/* What pread and pwrite would refuse, refused before anything is pinned. */
	{
		char b[16] = "0123456789abcde";
		int ro = open_in("rt-path", O_RDONLY), wo = open_in("rt-path", O_WRONLY);
		int dir = open(mnt, O_RDONLY | O_DIRECTORY);

		CHECK(tfs_gpu_write(ro, 0, 8, b, NULL) == -EBADF && tfs_gpu_error()[0],
		      "a write on a read-only fd");
		CHECK(tfs_gpu_read(wo, 0, 8, b, NULL) == -EBADF, "a read on a write-only fd");
		CHECK(tfs_gpu_read(ro, -1, 8, b, NULL) == -EINVAL, "a read at a negative offset");
		CHECK(tfs_gpu_read(ro, 0, 8, NULL, NULL) == -EFAULT, "a read into NULL");
		CHECK(tfs_gpu_read(dir, 0, 8, b, NULL) == -EISDIR, "a read of a directory");
		CHECK(tfs_gpu_read(ro, 0, 0, b, NULL) == 0, "a read of nothing");
		close(ro);
		close(wo);
		close(dir);
	}
	/* Blocks as the daemon has them: from the gpu file or, without one, st_blksize. */
	bs = 0;
	if (tfsc_gpu_file(mnt, sock, sizeof(sock), &id) == 0 && sock[0])
		bs = (size_t)gpu_field("block_size");
	if (!bs)
		bs = stat(mnt, &st) == 0 && st.st_blksize > 0 ? (size_t)st.st_blksize : 65536;
	if (threads < 1 || threads > 16)
		threads = 1;
	printf("roundtrip: %s, seed %llu, block %zu, %u steps x %d threads\n", expect,
	       (unsigned long long)seed, bs, iters, threads);
	for (int i = 0; i < threads; i++) {
		a[i] = (struct rt_args){i, iters, seed + (uint64_t)i * 7919, bs, 0};
		/* up to some batches of the pin limit, so that reads and writes take several */
		a[i].maxlen = 40 * bs < (8UL << 20) ? 40 * bs : (8UL << 20);
		CHECK(pthread_create(&th[i], NULL, roundtrip_thread, &a[i]) == 0, "pthread_create");
	}
	for (int i = 0; i < threads; i++)
		pthread_join(th[i], NULL);
	/* After a shutdown, calls start over. */
	tfs_gpu_shutdown();
	a[0].iters = 10;
	roundtrip_thread(&a[0]);
	if (want == TFS_GPU_PATH_ZEROCOPY) {
		CHECK(gpu_field("pinned_blocks") == 0, "pins left after the round trips");
		CHECK(gpu_field("write_bytes") > 0 && gpu_field("read_bytes") > 0,
		      "the round trips did not go through the arena");
	}
	printf("roundtrip: ok\n");
	return 0;
}

/* ---- protocol: one request at a time ---- */

struct arena {
	uint8_t *base;
	size_t bytes, bs;
	uint64_t max_pins;
};

static struct tfsc_conn *connect_mnt(struct arena *ar)
{
	char sock[108];
	struct tfsc_conn *c;
	uint64_t id;
	int afd = -1;

	CHECK(tfsc_gpu_file(mnt, sock, sizeof(sock), &id) == 0 && sock[0],
	      "%s/.tensorfs/gpu names no socket", mnt);
	CHECK(tfsc_connect(sock, &c) == 0, "connect: %s", tfs_gpu_error());
	CHECK(tfsc_hello(c, ar ? &afd : NULL) == 0, "HELLO: %s", tfs_gpu_error());
	CHECK(c->rep->mount_id == id, "HELLO names mount %llx, the gpu file %llx",
	      (unsigned long long)c->rep->mount_id, (unsigned long long)id);
	if (ar) {
		ar->bytes = c->rep->arena_bytes;
		ar->bs = c->rep->block_size;
		ar->max_pins = c->rep->max_pins;
		CHECK(ar->bytes == (size_t)gpu_field("arena_bytes") &&
			  ar->bs == (size_t)gpu_field("block_size"),
		      "HELLO and the gpu file disagree on the arena");
		ar->base = mmap(NULL, ar->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, afd, 0);
		CHECK(ar->base != MAP_FAILED, "cannot map the arena fd: %s", strerror(errno));
		close(afd);
	}
	return c;
}

/* The slots of the last PIN reply hold exactly these bytes of the range. */
static void check_slots(struct tfsc_conn *c, const struct arena *ar, const uint8_t *want,
			const char *what)
{
	const struct tfs_gpu_rep *r = c->rep;
	uint64_t first = r->off / ar->bs;

	for (uint32_t i = 0; i < r->nblocks; i++) {
		uint64_t start = (first + i) * ar->bs, from = start < r->off ? r->off : start;
		uint64_t to = start + ar->bs < r->off + r->len ? start + ar->bs : r->off + r->len;

		CHECK(r->slot[i] != TFS_GPU_HOLE, "%s: block %u is a hole", what, i);
		CHECK(r->slot[i] % ar->bs == 0 && r->slot[i] + ar->bs <= ar->bytes,
		      "%s: slot offset %llu is not a slot of the arena", what,
		      (unsigned long long)r->slot[i]);
		CHECK(memcmp(ar->base + r->slot[i] + (from - start), want + (from - r->off),
			     to - from) == 0,
		      "%s: the slot of block %u does not hold the file's bytes", what, i);
	}
}

static uint64_t ino_of(int fd)
{
	struct stat st;

	CHECK(fstat(fd, &st) == 0, "fstat");
	return st.st_ino;
}

static int t_protocol(void)
{
	struct arena ar;
	struct tfsc_conn *a = connect_mnt(&ar), *b = connect_mnt(NULL);
	uint64_t s = 42, pin, ino, id;
	size_t bs = ar.bs, size = 5 * bs / 2 + 123, big;
	uint8_t *data, *back;
	int rw, ro, wo, dir, other;
	struct tfs_gpu_req junk;
	struct stat st;
	char tmp[] = "/tmp/gpuproto.XXXXXX";
	int ret;

	printf("protocol: arena %zu MiB, block %zu, pin limit %llu\n", ar.bytes >> 20, bs,
	       (unsigned long long)ar.max_pins);
	big = (ar.max_pins + 8) * bs;
	data = malloc(big);
	back = malloc(big);
	CHECK(data && back, "out of memory");
	gt_fill(data, big, &s);
	rw = open_in("p-data", O_RDWR | O_CREAT | O_TRUNC);
	pwrite_all(rw, data, size, 0);
	ro = open_in("p-data", O_RDONLY);
	wo = open_in("p-data", O_WRONLY);
	ino = ino_of(rw);

	/* A file must be granted before it is pinned, and only as the fd was opened. */
	CHECK(tfsc_pin(a, false, ino, 0, size, 0) == -EACCES, "PIN_READ before GRANT");
	CHECK(tfsc_grant(a, wo, ino) == 0, "GRANT of a write-only fd: %s", tfs_gpu_error());
	CHECK(tfsc_pin(a, false, ino, 0, size, 0) == -EACCES, "PIN_READ with a write-only grant");
	CHECK(tfsc_grant(b, ro, ino) == 0, "GRANT of a read-only fd");
	CHECK(tfsc_pin(b, true, ino, 0, 10, 0) == -EACCES, "PIN_WRITE with a read-only grant");
	CHECK(tfsc_grant(a, ro, ino + 1) == -ESTALE, "GRANT naming another inode");
	dir = open(mnt, O_RDONLY | O_DIRECTORY);
	CHECK(tfsc_grant(a, dir, ino_of(dir)) == -EINVAL, "GRANT of a directory");
	close(dir);
	dir = open_in(".tensorfs/stats", O_RDONLY);
	CHECK(tfsc_grant(a, dir, ino_of(dir)) == -EINVAL, "GRANT of a control file");
	close(dir);
	other = mkstemp(tmp);
	CHECK(other >= 0, "mkstemp");
	unlink(tmp);
	CHECK(tfsc_grant(a, other, ino_of(other)) == -EXDEV, "GRANT of a file elsewhere");
	close(other);
	CHECK(tfsc_grant(a, ro, ino) == 0, "GRANT of a read-only fd");

	/* Read pins: the slots hold the file's bytes, at unaligned offsets too. */
	CHECK(tfsc_pin(a, false, ino, 77, size, 0) == 0, "PIN_READ: %s", tfs_gpu_error());
	CHECK(a->rep->off == 77 && a->rep->len == size - 77 && a->rep->size == size &&
		  a->rep->nblocks == 3,
	      "PIN_READ past EOF granted off %llu len %llu in %u blocks",
	      (unsigned long long)a->rep->off, (unsigned long long)a->rep->len, a->rep->nblocks);
	check_slots(a, &ar, data + 77, "PIN_READ");
	pin = a->rep->pin;
	CHECK(gpu_field("pinned_blocks") == 3, "the gpu file counts %lld pinned blocks, want 3",
	      gpu_field("pinned_blocks"));
	/* A pin is its connection's: another cannot release it. */
	CHECK(tfsc_release(b, pin, 0) == -ENOENT, "RELEASE of another connection's pin");
	CHECK(gpu_field("pinned_blocks") == 3, "a foreign RELEASE unpinned blocks");
	CHECK(tfsc_release(a, pin, 0) == 0, "RELEASE: %s", tfs_gpu_error());
	CHECK(tfsc_release(a, pin, 0) == -ENOENT, "RELEASE twice");
	CHECK(tfsc_release(a, 999999, 0) == -ENOENT, "RELEASE of a pin never given");
	CHECK(gpu_field("pinned_blocks") == 0, "blocks still pinned after RELEASE");

	/* EOF, and empty ranges. */
	CHECK(tfsc_pin(a, false, ino, size, 100, 0) == 0 && a->rep->len == 0 &&
		  a->rep->nblocks == 0,
	      "PIN_READ at EOF");
	CHECK(tfsc_pin(a, false, ino, 5, 0, 0) == 0 && a->rep->len == 0, "PIN_READ of nothing");

	/* Holes are named, not pinned. */
	CHECK(ftruncate(rw, (off_t)(6 * bs)) == 0, "ftruncate");
	CHECK(tfsc_pin(a, false, ino, 4 * bs, 2 * bs, 0) == 0 && a->rep->nblocks == 2 &&
		  a->rep->slot[0] == TFS_GPU_HOLE && a->rep->slot[1] == TFS_GPU_HOLE,
	      "PIN_READ of a hole");
	CHECK(tfsc_release(a, a->rep->pin, 0) == 0, "RELEASE of holes");

	/* A committed write: the file has the bytes, and grows. */
	CHECK(tfsc_grant(a, rw, ino) == 0, "GRANT of a read-write fd");
	gt_fill(back, 2 * bs, &s);
	CHECK(tfsc_pin(a, true, ino, 5 * bs + 100, 2 * bs, 0) == 0 && a->rep->nblocks == 3,
	      "PIN_WRITE: %s", tfs_gpu_error());
	CHECK(gpu_field("write_pinned_blocks") == 3, "write pins not counted");
	for (uint32_t i = 0; i < 3; i++) {
		uint64_t start = (5 + i) * bs, from = i ? start : 5 * bs + 100;
		uint64_t to = i == 2 ? 7 * bs + 100 : start + bs;

		CHECK(a->rep->slot[i] % bs == 0 && a->rep->slot[i] + bs <= ar.bytes,
		      "PIN_WRITE slot offset out of the arena");
		memcpy(ar.base + a->rep->slot[i] + (from - start), back + (from - 5 * bs - 100),
		       to - from);
	}
	CHECK(tfsc_release(a, a->rep->pin, 0) == 0, "RELEASE of a write");
	CHECK(fstat(rw, &st) == 0 && (size_t)st.st_size == 7 * bs + 100,
	      "size after a committed write: %lld", (long long)st.st_size);
	pread_all(rw, data + 5 * bs + 100, 2 * bs, (off_t)(5 * bs + 100)); /* data: now the file */
	CHECK(memcmp(data + 5 * bs + 100, back, 2 * bs) == 0, "a committed write reads back wrong");

	/* An abandoned write: its range reads as zeros, the rest and the size stay. */
	pread_all(rw, back, 7 * bs + 100, 0);
	CHECK(tfsc_pin(a, true, ino, bs + 10, bs, 0) == 0, "PIN_WRITE");
	memset(ar.base + a->rep->slot[0] + 10, 0xEE, bs - 10);
	CHECK(tfsc_release(a, a->rep->pin, -EIO) == 0, "RELEASE of a failed write");
	memset(back + bs + 10, 0, bs);
	pread_all(rw, data, 7 * bs + 100, 0);
	CHECK(memcmp(data, back, 7 * bs + 100) == 0,
	      "an abandoned write changed bytes outside its range, or left its own");
	CHECK(fstat(rw, &st) == 0 && (size_t)st.st_size == 7 * bs + 100,
	      "an abandoned write changed the size");
	CHECK(gpu_field("failed_writes") >= 1, "the abandoned write is not counted");

	/* The pin limit: a connection holding pins gets what is left, then -EAGAIN. */
	gt_fill(data, big, &s);
	pwrite_all(rw, data, big, 0);
	CHECK(tfsc_pin(a, false, ino, 0, big, TFS_GPU_MAX_BLOCKS) == 0, "big PIN_READ");
	CHECK(a->rep->nblocks == ar.max_pins || a->rep->nblocks == TFS_GPU_MAX_BLOCKS,
	      "PIN_READ granted %u blocks, the limit is %llu", a->rep->nblocks,
	      (unsigned long long)ar.max_pins);
	check_slots(a, &ar, data, "big PIN_READ");
	pin = a->rep->pin;
	if (ar.max_pins <= TFS_GPU_MAX_BLOCKS) {
		ret = tfsc_pin(a, false, ino, 0, bs, 0);
		CHECK(ret == -EAGAIN, "PIN_READ beyond the limit while holding it: %d", ret);
	}
	CHECK(tfsc_release(a, pin, 0) == 0, "RELEASE");

	/* Bad input: a request of another version is answered -EPROTO, then hung up on. */
	memset(&junk, 0, sizeof(junk));
	junk.magic = TFS_GPU_MAGIC;
	junk.version = TFS_GPU_VERSION + 1;
	junk.op = TFS_GPU_HELLO;
	CHECK(send(b->fd, &junk, sizeof(junk), MSG_NOSIGNAL) == sizeof(junk), "send");
	CHECK(recv(b->fd, b->rep, TFS_GPU_REP_MAX, 0) >= (ssize_t)sizeof(*b->rep) &&
		  b->rep->status == -EPROTO,
	      "a request of another version was not answered -EPROTO");
	CHECK(recv(b->fd, b->rep, TFS_GPU_REP_MAX, 0) == 0, "no hang-up after -EPROTO");
	CHECK(tfsc_pin(a, false, ino, 0, 1, 0) == 0, "the other connection suffered");
	CHECK(tfsc_release(a, a->rep->pin, 0) == 0, "RELEASE");

	tfsc_close(a);
	tfsc_close(b);
	CHECK(wait_field("clients", 0), "clients remain after both hung up");
	CHECK(gpu_field("pinned_blocks") == 0, "pins remain");
	(void)id;
	close(rw);
	close(ro);
	close(wo);
	munmap(ar.base, ar.bytes);
	free(data);
	free(back);
	printf("protocol: ok\n");
	return 0;
}

/* ---- clients of another uid (owner, refuse) ---- */

/*
 * Let every user reach the daemon's socket, whose path goes to sock, so
 * that only its credential check stands between another uid and it;
 * socket_private puts the modes back.
 */
static void socket_public(char sock[108], char dir[108])
{
	uint64_t id;

	CHECK(tfsc_gpu_file(mnt, sock, 108, &id) == 0 && sock[0], "no socket");
	snprintf(dir, 108, "%s", sock);
	*strrchr(dir, '/') = 0;
	CHECK(chmod(dir, 0755) == 0 && chmod(sock, 0666) == 0, "chmod: %s", strerror(errno));
}

static void socket_private(const char *sock, const char *dir)
{
	chmod(sock, 0600);
	chmod(dir, 0700);
}

/* Fork: 0 in the child, which then runs as OTHER_UID; its pid in the parent. */
static pid_t fork_other_uid(void)
{
	pid_t pid = fork();

	CHECK(pid >= 0, "fork");
	if (pid == 0 && (setgid(OTHER_UID) || setuid(OTHER_UID)))
		_exit(2);
	return pid;
}

/* The exit status of child pid, or -1 when it did not exit. */
static int child_status(pid_t pid)
{
	int status;

	CHECK(waitpid(pid, &status, 0) == pid, "waitpid");
	return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* ---- owner: SO_PEERCRED ---- */

static int t_owner(void)
{
	char sock[108], dir[108];
	long long refused;
	pid_t pid;
	int status;

	if (geteuid() != 0) {
		printf("owner: SKIP: needs root to run a client as another uid\n");
		return 77;
	}
	socket_public(sock, dir);
	refused = gpu_field("refused");
	pid = fork_other_uid();
	if (pid == 0) {
		struct tfsc_conn *c;
		int afd = -1, ret;

		ret = tfsc_connect(sock, &c);
		if (ret) {
			fprintf(stderr, "owner: child cannot connect: %s\n", tfs_gpu_error());
			_exit(3);
		}
		ret = tfsc_hello(c, &afd);
		_exit(ret == -EACCES && afd < 0 ? 0 : 1);
	}
	status = child_status(pid);
	CHECK(status == 0, "a client of uid %d was not refused (child status %d)", OTHER_UID,
	      status);
	CHECK(gpu_field("refused") == refused + 1, "the refusal is not counted");
	socket_private(sock, dir);
	/* The owner is still served. */
	tfsc_close(connect_mnt(NULL));
	printf("owner: ok\n");
	return 0;
}

/* ---- hijack: a socket planted by another uid receives nothing ---- */

#define HIJACK_BYTES (256UL << 10)
#define HIJACK_ARENA (4UL << 20) /* the fake server's own arena */
#define HIJACK_BLOCK (64UL << 10)
#define HIJACK_CONNS 16

/*
 * The fake server's answer to one request: HELLO as the daemon's, with an
 * arena; a PIN asks for a GRANT first, which is taken (with its fd).
 */
static int32_t fake_status(uint16_t op)
{
	if (op == TFS_GPU_HELLO || op == TFS_GPU_GRANT)
		return 0;
	return op == TFS_GPU_PIN_READ || op == TFS_GPU_PIN_WRITE ? -EACCES : -EIO;
}

static void fake_reply(int sock, const struct tfs_gpu_req *req, uint64_t id, int arena)
{
	struct tfs_gpu_rep rep = {.magic = TFS_GPU_MAGIC,
				  .version = TFS_GPU_VERSION,
				  .op = req->op,
				  .status = fake_status(req->op),
				  .arena_bytes = HIJACK_ARENA,
				  .block_size = HIJACK_BLOCK,
				  .mount_id = id,
				  .max_pins = 64,
				  .max_write_pins = 32};
	bool hello = req->op == TFS_GPU_HELLO && req->want_arena;

	/* an error: the client hung up, and it is counted by what it sent */
	(void)gpusock_send(sock, &rep, sizeof(rep), hello ? arena : -1);
}

/*
 * One request on conn: counts it and the fds it carried (closed), and
 * answers. false when the client hung up.
 */
static bool fake_serve(int conn, uint64_t id, int arena, unsigned *requests, unsigned *fds)
{
	union {
		char buf[CMSG_SPACE(8 * sizeof(int))];
		struct cmsghdr align;
	} u;
	struct tfs_gpu_req req;
	struct iovec iov = {&req, sizeof(req)};
	struct msghdr m = {.msg_iov = &iov,
			   .msg_iovlen = 1,
			   .msg_control = u.buf,
			   .msg_controllen = sizeof(u.buf)};
	ssize_t n = recvmsg(conn, &m, MSG_CMSG_CLOEXEC);

	if (n <= 0)
		return false;
	(*requests)++;
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(&m); cm; cm = CMSG_NXTHDR(&m, cm)) {
		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		for (size_t i = 0; i < (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
			int fd;

			memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
			close(fd);
			(*fds)++;
		}
	}
	if (n == (ssize_t)sizeof(req))
		fake_reply(conn, &req, id, arena);
	return true;
}

/*
 * The child, as OTHER_UID: listen at sock, where the daemon's socket was,
 * and serve as a daemon would until stop is readable; then write to out
 * how many requests and fds reached it.
 */
static void fake_server(const char *sock, uint64_t id, int ready, int stop, int out)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct pollfd pf[2 + HIJACK_CONNS];
	unsigned requests = 0, fds = 0, nconn = 0;
	int lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	int arena = memfd_create("fake-arena", MFD_CLOEXEC);

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock);
	if (lfd < 0 || arena < 0 || ftruncate(arena, HIJACK_ARENA) < 0 ||
	    bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(lfd, HIJACK_CONNS) < 0) {
		fprintf(stderr, "hijack: the fake server cannot listen at %s: %s\n", sock,
			strerror(errno));
		_exit(3);
	}
	if (write(ready, "r", 1) != 1)
		_exit(3);
	pf[0] = (struct pollfd){lfd, POLLIN, 0};
	pf[1] = (struct pollfd){stop, POLLIN, 0};
	while (poll(pf, 2 + nconn, -1) >= 0 && !pf[1].revents) {
		for (unsigned i = 0; i < nconn; i++) {
			if (!pf[2 + i].revents ||
			    fake_serve(pf[2 + i].fd, id, arena, &requests, &fds))
				continue;
			close(pf[2 + i].fd);
			pf[2 + i--] = pf[2 + --nconn];
		}
		if ((pf[0].revents & POLLIN) && nconn < HIJACK_CONNS) {
			int c = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);

			if (c >= 0)
				pf[2 + nconn++] = (struct pollfd){c, POLLIN, 0};
		}
	}
	dprintf(out, "%u %u\n", requests, fds);
	_exit(0);
}

/*
 * Another user who can write the socket's folder (an XDG_RUNTIME_DIR of
 * theirs, under su without -) puts a socket of their own where the gpu
 * file says the daemon's is. A root client must send it nothing: not
 * HELLO, and above all not the fd of a root file that GRANT passes; its
 * calls take pread/pwrite and move the right bytes.
 */
static int t_hijack(void)
{
	char sock[108], dir[108], counts[64] = "";
	int ready[2], stop[2], out[2], fd, path;
	unsigned requests = 99, fds = 99;
	uint8_t *data, *back;
	uint64_t id, seed = gt_seed();
	ssize_t wr, rd;
	struct pollfd pf;
	pid_t pid;

	if (geteuid() != 0) {
		printf("hijack: SKIP: needs root to plant a socket as another uid\n");
		return 77;
	}
	CHECK(tfsc_gpu_file(mnt, sock, sizeof(sock), &id) == 0 && sock[0], "no socket");
	snprintf(dir, sizeof(dir), "%s", sock);
	*strrchr(dir, '/') = 0;
	fd = open_in("hijack", O_RDWR | O_CREAT | O_TRUNC);
	CHECK(fchmod(fd, 0600) == 0, "fchmod: %s", strerror(errno));
	/* What the other user could do to a folder of theirs: replace the socket. */
	CHECK(unlink(sock) == 0 && chown(dir, OTHER_UID, OTHER_UID) == 0,
	      "cannot hand %s to uid %d: %s", dir, OTHER_UID, strerror(errno));
	CHECK(pipe2(ready, O_CLOEXEC) == 0 && pipe2(stop, O_CLOEXEC) == 0 &&
		  pipe2(out, O_CLOEXEC) == 0,
	      "pipe: %s", strerror(errno));
	pid = fork_other_uid();
	if (pid == 0) {
		/* Only its own ends: stop must read EOF when the parent closes it. */
		close(fd);
		close(ready[0]);
		close(stop[1]);
		close(out[0]);
		fake_server(sock, id, ready[1], stop[0], out[1]);
	}
	close(ready[1]);
	close(stop[0]);
	close(out[1]);
	pf = (struct pollfd){ready[0], POLLIN, 0};
	CHECK(poll(&pf, 1, WAIT_TRIES * 25) == 1 && read(ready[0], counts, 1) == 1,
	      "the fake server did not start");

	data = malloc(HIJACK_BYTES);
	back = calloc(1, HIJACK_BYTES);
	CHECK(data && back, "out of memory");
	printf("hijack: seed %llu\n", (unsigned long long)seed);
	gt_fill(data, HIJACK_BYTES, &seed);
	wr = tfs_gpu_write(fd, 0, HIJACK_BYTES, data, NULL);
	rd = tfs_gpu_read(fd, 0, HIJACK_BYTES, back, NULL);
	path = tfs_gpu_path(fd);

	close(stop[1]);
	pf = (struct pollfd){out[0], POLLIN, 0};
	CHECK(poll(&pf, 1, WAIT_TRIES * 25) == 1 && read(out[0], counts, sizeof(counts) - 1) > 0 &&
		  sscanf(counts, "%u %u", &requests, &fds) == 2,
	      "the fake server said nothing");
	CHECK(child_status(pid) == 0, "the fake server failed");
	unlink(sock);
	CHECK(chown(dir, 0, 0) == 0, "chown: %s", strerror(errno));
	CHECK(fds == 0, "a socket planted by uid %d received %u fds of root's files", OTHER_UID,
	      fds);
	CHECK(requests == 0, "a socket planted by uid %d received %u requests from root's client",
	      OTHER_UID, requests);
	CHECK(wr == (ssize_t)HIJACK_BYTES, "tfs_gpu_write: %zd (%s)", wr, tfs_gpu_error());
	CHECK(rd == (ssize_t)HIJACK_BYTES && memcmp(back, data, HIJACK_BYTES) == 0,
	      "tfs_gpu_read: %zd, or other bytes (%s)", rd, tfs_gpu_error());
	CHECK(path == TFS_GPU_PATH_FALLBACK, "tfs_gpu_path: %d, not the fallback", path);
	memset(back, 0, HIJACK_BYTES);
	pread_all(fd, back, HIJACK_BYTES, 0);
	CHECK(memcmp(back, data, HIJACK_BYTES) == 0, "the file does not hold what was written");
	close(fd);
	close(ready[0]);
	close(out[0]);
	free(data);
	free(back);
	printf("hijack: ok\n");
	return 0;
}

/* ---- crash: a client dies holding pins ---- */

static int t_crash(void)
{
	struct arena ar;
	struct tfsc_conn *c;
	size_t bs;
	uint8_t *data, *back;
	uint64_t s = 7;
	int p[2], rfd, wfd, status;
	char ok;
	pid_t pid, tpid;
	struct stat st;

	c = connect_mnt(&ar);
	bs = ar.bs;
	tfsc_close(c);
	munmap(ar.base, ar.bytes);
	data = malloc(8 * bs);
	back = malloc(8 * bs);
	CHECK(data && back, "out of memory");
	gt_fill(data, 8 * bs, &s);
	rfd = open_in("c-read", O_RDWR | O_CREAT | O_TRUNC);
	wfd = open_in("c-write", O_RDWR | O_CREAT | O_TRUNC);
	pwrite_all(rfd, data, 4 * bs, 0);
	pwrite_all(wfd, data, 8 * bs, 0);
	CHECK(wait_field("clients", 0), "clients connected before the test");
	CHECK(pipe(p) == 0, "pipe");
	pid = fork();
	CHECK(pid >= 0, "fork");
	if (pid == 0) {
		struct tfsc_conn *k = connect_mnt(NULL);

		if (tfsc_grant(k, rfd, ino_of(rfd)) ||
		    tfsc_pin(k, false, ino_of(rfd), 0, 4 * bs, 0) ||
		    tfsc_grant(k, wfd, ino_of(wfd)) ||
		    tfsc_pin(k, true, ino_of(wfd), bs, 2 * bs, 0))
			_exit(1);
		if (write(p[1], "k", 1) != 1)
			_exit(1);
		pause(); /* killed here, pins held */
		_exit(1);
	}
	close(p[1]);
	CHECK(read(p[0], &ok, 1) == 1, "the child could not pin");
	CHECK(gpu_field("pinned_blocks") == 6 && gpu_field("write_pinned_blocks") == 2,
	      "the child's pins are not counted");
	CHECK(gpu_field("clients") == 1, "the child is not counted as a client");
	kill(pid, SIGKILL);
	CHECK(waitpid(pid, &status, 0) == pid, "waitpid");
	CHECK(wait_field("pinned_blocks", 0), "pins of a dead client remain: %lld",
	      gpu_field("pinned_blocks"));
	CHECK(wait_field("clients", 0), "a dead client is still counted");
	CHECK(gpu_field("write_pinned_blocks") == 0, "write pins of a dead client remain");

	/* Its write was never committed: that range reads zeros, nothing else changed. */
	memcpy(back, data, 8 * bs);
	memset(back + bs, 0, 2 * bs);
	pread_all(wfd, data, 8 * bs, 0);
	CHECK(memcmp(data, back, 8 * bs) == 0, "the dead client's write range is not zeros");
	CHECK(fstat(wfd, &st) == 0 && (size_t)st.st_size == 8 * bs, "the size changed");
	/* A leaked write pin would hold the file's lock: truncate would never return. */
	tpid = fork();
	CHECK(tpid >= 0, "fork");
	if (tpid == 0) {
		alarm(60);
		_exit(ftruncate(wfd, (off_t)bs) == 0 ? 0 : 1);
	}
	CHECK(waitpid(tpid, &status, 0) == tpid && WIFEXITED(status) && WEXITSTATUS(status) == 0,
	      "truncate of the file a dead client was writing did not finish");
	close(rfd);
	close(wfd);
	free(data);
	free(back);
	printf("crash: ok\n");
	return 0;
}

/* ---- fdleak: every fd the daemon receives is closed ---- */

#define LEAK_ROUNDS 40 /* messages of each kind: a leak of one fd each shows plainly */
#define MANY_FDS 8     /* more than a message may carry, or the daemon has room for */

/* Entries of /proc/PID/fd. */
static int count_fds(pid_t pid)
{
	char path[64];
	struct dirent *d;
	int n = 0;
	DIR *dir;

	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	dir = opendir(path);
	CHECK(dir, "%s: %s", path, strerror(errno));
	while ((d = readdir(dir)))
		n += d->d_name[0] != '.';
	closedir(dir);
	return n;
}

/* Send req with fds as SCM_RIGHTS: in one control message, or (split) one each. */
static void send_fds(int sock, struct tfs_gpu_req *req, const int *fds, int n, bool split)
{
	union {
		char buf[MANY_FDS * CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	struct iovec iov = {req, sizeof(*req)};
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf};
	struct cmsghdr *cm;

	CHECK(n >= 1 && n <= MANY_FDS, "send_fds: %d fds", n);
	req->magic = TFS_GPU_MAGIC;
	req->version = TFS_GPU_VERSION;
	memset(&u, 0, sizeof(u));
	m.msg_controllen = split ? n * CMSG_SPACE(sizeof(int)) : CMSG_SPACE(n * sizeof(int));
	cm = CMSG_FIRSTHDR(&m);
	for (int i = 0; i < n; i++) {
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		if (split) {
			cm->cmsg_len = CMSG_LEN(sizeof(int));
			memcpy(CMSG_DATA(cm), &fds[i], sizeof(int));
			cm = CMSG_NXTHDR(&m, cm);
		} else {
			cm->cmsg_len = CMSG_LEN(n * sizeof(int));
			memcpy(CMSG_DATA(cm), fds, n * sizeof(int));
			break;
		}
	}
	CHECK(sendmsg(sock, &m, MSG_NOSIGNAL) == (ssize_t)sizeof(*req), "sendmsg: %s",
	      strerror(errno));
}

/* The daemon's answer to a request sent by hand: its status. */
static int32_t recv_status(struct tfsc_conn *c, const char *what)
{
	ssize_t n = recv(c->fd, c->rep, TFS_GPU_REP_MAX, 0);

	CHECK(n >= (ssize_t)sizeof(*c->rep), "%s: no reply (%s)", what,
	      n < 0 ? strerror(errno) : "hung up");
	return c->rep->status;
}

static int t_fdleak(pid_t daemon)
{
	struct tfsc_conn *c, *k;
	struct tfs_gpu_req req;
	int fds[MANY_FDS], rw, base, now = 0;
	uint64_t ino;

	rw = open_in("fl-data", O_RDWR | O_CREAT | O_TRUNC);
	pwrite_all(rw, "tensor", 6, 0);
	ino = ino_of(rw);
	for (int i = 0; i < MANY_FDS; i++)
		fds[i] = open_in("fl-data", O_RDONLY); /* of the mount: a leak keeps it busy */
	CHECK(wait_field("clients", 0), "clients connected before the test");
	base = count_fds(daemon);
	c = connect_mnt(NULL);
	for (int r = 0; r < LEAK_ROUNDS; r++) {
		req = (struct tfs_gpu_req){.op = TFS_GPU_GRANT, .ino = ino};
		send_fds(c->fd, &req, fds, 2, false);
		CHECK(recv_status(c, "GRANT with two fds") == -EBADF,
		      "GRANT with two fds in one message was not refused EBADF");
		req = (struct tfs_gpu_req){.op = TFS_GPU_GRANT, .ino = ino};
		send_fds(c->fd, &req, fds, 2, true);
		CHECK(recv_status(c, "GRANT with two control messages") == -EBADF,
		      "GRANT with two fds in two control messages was not refused EBADF");
		req = (struct tfs_gpu_req){.op = TFS_GPU_PIN_READ, .ino = ino, .len = 1};
		send_fds(c->fd, &req, fds, 1, false);
		CHECK(recv_status(c, "PIN_READ with an fd") == -EACCES,
		      "PIN_READ carrying an fd, of a file not granted");
		req = (struct tfs_gpu_req){.op = TFS_GPU_RELEASE, .pin = 999999};
		send_fds(c->fd, &req, fds, 2, false);
		CHECK(recv_status(c, "RELEASE with fds") == -ENOENT, "RELEASE carrying fds");
		req = (struct tfs_gpu_req){.op = TFS_GPU_HELLO};
		send_fds(c->fd, &req, fds, 1, false);
		CHECK(recv_status(c, "HELLO with an fd") == 0, "HELLO carrying an fd");
	}
	/* After all that, one fd in a GRANT still proves the right to the file. */
	CHECK(tfsc_grant(c, fds[0], ino) == 0, "GRANT after the bad ones: %s", tfs_gpu_error());
	CHECK(tfsc_pin(c, false, ino, 0, 6, 0) == 0 && c->rep->len == 6, "PIN_READ after GRANT");
	CHECK(tfsc_release(c, c->rep->pin, 0) == 0, "RELEASE");
	/* More fds than the daemon takes (MSG_CTRUNC): -EPROTO, and a hang-up. */
	for (int r = 0; r < LEAK_ROUNDS / 4; r++) {
		k = connect_mnt(NULL);
		req = (struct tfs_gpu_req){.op = TFS_GPU_GRANT, .ino = ino};
		send_fds(k->fd, &req, fds, MANY_FDS, r % 2);
		CHECK(recv_status(k, "GRANT with many fds") == -EPROTO,
		      "GRANT with %d fds was not answered -EPROTO", MANY_FDS);
		CHECK(recv(k->fd, k->rep, TFS_GPU_REP_MAX, 0) == 0, "no hang-up after -EPROTO");
		tfsc_close(k);
	}
	/* A message of the wrong size with an fd: the same. */
	k = connect_mnt(NULL);
	{
		int fd0 = fds[0];
		union {
			char buf[CMSG_SPACE(sizeof(int))];
			struct cmsghdr align;
		} u = {{0}};
		struct iovec iov = {&req, sizeof(req) / 2};
		struct msghdr m = {.msg_iov = &iov,
				   .msg_iovlen = 1,
				   .msg_control = u.buf,
				   .msg_controllen = sizeof(u.buf)};
		struct cmsghdr *cm = CMSG_FIRSTHDR(&m);

		req = (struct tfs_gpu_req){
		    .magic = TFS_GPU_MAGIC, .version = TFS_GPU_VERSION, .op = TFS_GPU_GRANT};
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(cm), &fd0, sizeof(int));
		CHECK(sendmsg(k->fd, &m, MSG_NOSIGNAL) == (ssize_t)(sizeof(req) / 2), "sendmsg");
		CHECK(recv_status(k, "a short GRANT") == -EPROTO, "a short GRANT: not -EPROTO");
	}
	tfsc_close(k);
	tfsc_close(c);

	/* The daemon holds no more fds than before, once it has joined the connections. */
	CHECK(wait_field("clients", 0), "clients remain after all hung up");
	for (int i = 0; i < WAIT_TRIES; i++) {
		now = count_fds(daemon);
		if (now <= base)
			break;
		sleep_ms(25);
	}
	CHECK(now <= base, "the daemon holds %d fds more than before the test: received fds leak",
	      now - base);
	for (int i = 0; i < MANY_FDS; i++)
		close(fds[i]);
	close(rw);
	printf("fdleak: ok (%d fds before and after)\n", base);
	return 0;
}

/* ---- grantmode: a GRANT proves only what the fd's open proved ---- */

static int t_grantmode(void)
{
	struct arena ar;
	struct tfsc_conn *c = connect_mnt(&ar), *w = connect_mnt(NULL), *r = connect_mnt(NULL);
	char path[4096];
	int rw, pfd, ioc, fd;
	uint64_t ino;
	uint8_t got[6];

	snprintf(path, sizeof(path), "%s/gm-data", mnt);
	rw = open_in("gm-data", O_RDWR | O_CREAT | O_TRUNC);
	pwrite_all(rw, "secret", 6, 0);
	ino = ino_of(rw);

	/* O_PATH opens a mode 000 file without a permission check: it proves nothing. */
	CHECK(fchmod(rw, 0) == 0, "fchmod: %s", strerror(errno));
	pfd = open(path, O_PATH | O_CLOEXEC);
	CHECK(pfd >= 0, "open O_PATH: %s", strerror(errno));
	CHECK(tfsc_grant(c, pfd, ino) == -EBADF, "GRANT of an O_PATH fd was not refused EBADF");
	CHECK(tfsc_pin(c, false, ino, 0, 6, 0) == -EACCES, "PIN_READ after an O_PATH GRANT");
	CHECK(tfsc_pin(c, true, ino, 0, 6, 0) == -EACCES, "PIN_WRITE after an O_PATH GRANT");
	close(pfd);
	CHECK(fchmod(rw, 0644) == 0, "fchmod: %s", strerror(errno));

	/* Access mode 3 (O_ACCMODE) opens for ioctls only: neither read nor write. */
	ioc = open(path, O_ACCMODE | O_CLOEXEC);
	if (ioc >= 0) {
		CHECK(tfsc_grant(c, ioc, ino) == -EBADF,
		      "GRANT of an ioctl-only fd was not refused");
		CHECK(tfsc_pin(c, false, ino, 0, 6, 0) == -EACCES,
		      "PIN_READ after an ioctl-only GRANT");
		CHECK(tfsc_pin(c, true, ino, 0, 6, 0) == -EACCES,
		      "PIN_WRITE after an ioctl-only GRANT");
		close(ioc);
	}

	/* O_WRONLY proves the right to write, not to read. */
	fd = open_in("gm-data", O_WRONLY);
	CHECK(tfsc_grant(c, fd, ino) == 0, "GRANT of an O_WRONLY fd: %s", tfs_gpu_error());
	close(fd);
	CHECK(tfsc_pin(c, false, ino, 0, 6, 0) == -EACCES, "PIN_READ with an O_WRONLY grant");
	CHECK(tfsc_pin(c, true, ino, 0, 6, 0) == 0 && c->rep->nblocks == 1,
	      "PIN_WRITE with an O_WRONLY grant: %s", tfs_gpu_error());
	memcpy(ar.base + c->rep->slot[0], "SECRET", 6);
	CHECK(tfsc_release(c, c->rep->pin, 0) == 0, "RELEASE of a write");
	pread_all(rw, got, 6, 0);
	CHECK(memcmp(got, "SECRET", 6) == 0, "the write of an O_WRONLY grant reads back wrong");

	/* O_RDONLY proves the right to read, not to write. */
	fd = open_in("gm-data", O_RDONLY);
	CHECK(tfsc_grant(r, fd, ino) == 0, "GRANT of an O_RDONLY fd: %s", tfs_gpu_error());
	close(fd);
	CHECK(tfsc_pin(r, true, ino, 0, 6, 0) == -EACCES, "PIN_WRITE with an O_RDONLY grant");
	CHECK(tfsc_pin(r, false, ino, 0, 6, 0) == 0 && r->rep->len == 6,
	      "PIN_READ with an O_RDONLY grant: %s", tfs_gpu_error());
	CHECK(tfsc_release(r, r->rep->pin, 0) == 0, "RELEASE");

	/* O_RDWR proves both. */
	CHECK(tfsc_grant(w, rw, ino) == 0, "GRANT of an O_RDWR fd: %s", tfs_gpu_error());
	CHECK(tfsc_pin(w, false, ino, 0, 6, 0) == 0, "PIN_READ with an O_RDWR grant");
	CHECK(tfsc_release(w, w->rep->pin, 0) == 0, "RELEASE");
	CHECK(tfsc_pin(w, true, ino, 6, 6, 0) == 0, "PIN_WRITE with an O_RDWR grant");
	CHECK(tfsc_release(w, w->rep->pin, -EIO) == 0, "RELEASE of an abandoned write");

	tfsc_close(c);
	tfsc_close(w);
	tfsc_close(r);
	munmap(ar.base, ar.bytes);
	close(rw);
	printf("grantmode: ok\n");
	return 0;
}

/* ---- pinwait: a truncate does not wait long for a client's write pin ---- */

#define KILL_WAIT_MS 1500   /* a killed truncate must be gone by then */
#define TRUNC_WAIT_MS 10000 /* a truncate must have returned by then */
#define PIN_SHORT_MS 300    /* a pin released this soon is waited for */

/* Wait at most ms for pid; true when it was reaped, with its status. */
static bool wait_pid_ms(pid_t pid, long ms, int *status)
{
	for (long t = 0; t <= ms; t += 10) {
		pid_t r = waitpid(pid, status, WNOHANG);

		CHECK(r >= 0, "waitpid: %s", strerror(errno));
		if (r == pid)
			return true;
		sleep_ms(10);
	}
	return false;
}

/* Run what (0 truncate, 1 open O_TRUNC, 2 punch a hole) on path in a child: it exits 0 or errno. */
static pid_t shrink_child(const char *path, int what, off_t size)
{
	pid_t pid = fork();
	int fd, ret = 0;

	CHECK(pid >= 0, "fork");
	if (pid)
		return pid;
	alarm(120); /* the old daemon never answers while the pin is held */
	if (what == 0) {
		ret = truncate(path, size);
	} else if (what == 1) {
		fd = open(path, O_WRONLY | O_TRUNC);
		ret = fd < 0 ? -1 : close(fd);
	} else {
		fd = open(path, O_WRONLY);
		ret = fd < 0 ? -1
			     : fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, size);
	}
	_exit(ret == 0 ? 0 : errno);
}

/* The child must have gone within ms; if not, release pin so that it can, and fail. */
static int reap_or_fail(struct tfsc_conn *c, uint64_t pin, pid_t pid, long ms, const char *what)
{
	int status;

	if (wait_pid_ms(pid, ms, &status))
		return status;
	tfsc_release(c, pin, -EIO);
	waitpid(pid, &status, 0);
	gt_die("%s: still waiting after %ld ms for a client's write pin", what, ms);
	return -1;
}

static int t_pinwait(void)
{
	struct arena ar;
	struct tfsc_conn *c = connect_mnt(&ar);
	size_t bs = ar.bs;
	uint8_t *old = malloc(4 * bs), *fresh = malloc(2 * bs), *got = malloc(4 * bs);
	char path[4096];
	uint64_t s = 13, ino, pin;
	struct timespec t0, t1;
	pid_t pid[3];
	struct stat st;
	int fd, status;

	CHECK(old && fresh && got, "out of memory");
	snprintf(path, sizeof(path), "%s/pw-data", mnt);
	fd = open_in("pw-data", O_RDWR | O_CREAT | O_TRUNC);
	ino = ino_of(fd);
	gt_fill(old, 4 * bs, &s);
	gt_fill(fresh, 2 * bs, &s);
	pwrite_all(fd, old, 4 * bs, 0);
	CHECK(tfsc_grant(c, fd, ino) == 0, "GRANT: %s", tfs_gpu_error());
	CHECK(tfsc_pin(c, true, ino, bs, 2 * bs, 0) == 0 && c->rep->nblocks == 2, "PIN_WRITE: %s",
	      tfs_gpu_error());
	pin = c->rep->pin;
	for (uint32_t i = 0; i < 2; i++)
		memcpy(ar.base + c->rep->slot[i], fresh + i * bs, bs);

	/* SIGKILL ends a truncate that waits for the pin. */
	pid[0] = shrink_child(path, 0, (off_t)(bs / 2));
	sleep_ms(PIN_SHORT_MS);
	CHECK(waitpid(pid[0], &status, WNOHANG) == 0, "a truncate did not wait for a write pin");
	kill(pid[0], SIGKILL);
	status = reap_or_fail(c, pin, pid[0], KILL_WAIT_MS, "a killed truncate");
	CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "the truncate was not killed");

	/* Truncate, O_TRUNC and a punched hole give up within a bound, with ETXTBSY. */
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (int i = 0; i < 3; i++)
		pid[i] = shrink_child(path, i, (off_t)(bs / 2));
	for (int i = 0; i < 3; i++) {
		static const char *const what[] = {"truncate", "open O_TRUNC", "a punched hole"};

		status = reap_or_fail(c, pin, pid[i], TRUNC_WAIT_MS, what[i]);
		CHECK(WIFEXITED(status) && WEXITSTATUS(status) == ETXTBSY,
		      "%s under a held write pin: exit %d, want ETXTBSY (%d)", what[i],
		      WIFEXITED(status) ? WEXITSTATUS(status) : -1, ETXTBSY);
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	CHECK(fstat(fd, &st) == 0 && (size_t)st.st_size == 4 * bs,
	      "a refused truncate changed the size to %lld", (long long)st.st_size);
	/* Bytes under the pin are the client's to change until it releases; the rest stay. */
	pread_all(fd, got, 4 * bs, 0);
	CHECK(memcmp(got, old, bs) == 0 && memcmp(got + 3 * bs, old + 3 * bs, bs) == 0,
	      "a refused truncate or punch changed the bytes");

	/* The pin is the client's still: its write commits, and reads return it. */
	CHECK(tfsc_release(c, pin, 0) == 0, "RELEASE of the write: %s", tfs_gpu_error());
	memcpy(old + bs, fresh, 2 * bs);
	pread_all(fd, got, 4 * bs, 0);
	CHECK(memcmp(got, old, 4 * bs) == 0, "the write pin's bytes do not read back");

	/* A truncate waits for a pin released soon, then goes through. */
	CHECK(tfsc_pin(c, true, ino, 0, bs, 0) == 0, "PIN_WRITE: %s", tfs_gpu_error());
	pin = c->rep->pin;
	memcpy(ar.base + c->rep->slot[0], fresh, bs);
	pid[0] = shrink_child(path, 0, (off_t)(bs / 2));
	sleep_ms(PIN_SHORT_MS);
	CHECK(waitpid(pid[0], &status, WNOHANG) == 0, "a truncate did not wait for a write pin");
	CHECK(tfsc_release(c, pin, 0) == 0, "RELEASE of the write: %s", tfs_gpu_error());
	status = reap_or_fail(c, 0, pid[0], TRUNC_WAIT_MS, "truncate after the pin's release");
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "truncate after the release: %s",
	      strerror(WIFEXITED(status) ? WEXITSTATUS(status) : 0));
	CHECK(fstat(fd, &st) == 0 && (size_t)st.st_size == bs / 2, "size %lld after the truncate",
	      (long long)st.st_size);
	pread_all(fd, got, bs / 2, 0);
	CHECK(memcmp(got, fresh, bs / 2) == 0, "the truncated file does not hold the last write");
	CHECK(gpu_field("write_pinned_blocks") == 0, "write pins remain");

	tfsc_close(c);
	munmap(ar.base, ar.bytes);
	close(fd);
	free(old);
	free(fresh);
	free(got);
	printf("pinwait: ok (a truncate gave up after %ld ms)\n",
	       (long)((t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000));
	return 0;
}

/* ---- refuse: a refused client reads why, not ECONNRESET ---- */

#define REFUSE_TRIES 50	    /* the race of a hang-up with our request shows in some */
#define REFUSE_SETTLE_MS 30 /* the daemon has answered, and hung up if it will, by then */
#define MAX_CONNS_TRY 200   /* more than the daemon serves at once */

/*
 * Connect to sock, send HELLO, let the daemon act, then read: its status,
 * or -errno of the read. The send fails (EPIPE) where the daemon hung up
 * before it; its answer must be there to read all the same.
 */
static int hello_raw(const char *sock, int *fdp)
{
	struct tfs_gpu_req req = {
	    .magic = TFS_GPU_MAGIC, .version = TFS_GPU_VERSION, .op = TFS_GPU_HELLO};
	struct timeval tv = {5, 0};
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct tfs_gpu_rep rep;
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	ssize_t n;

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		return -1000 - errno;
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	if (send(fd, &req, sizeof(req), MSG_NOSIGNAL) != (ssize_t)sizeof(req) && errno != EPIPE)
		return -2000 - errno;
	sleep_ms(REFUSE_SETTLE_MS);
	n = recv(fd, &rep, sizeof(rep), 0);
	if (n < 0) {
		int err = -errno;

		close(fd);
		return err;
	}
	*fdp = fd;
	return n == (ssize_t)sizeof(rep) && rep.magic == TFS_GPU_MAGIC ? rep.status : -EPROTO;
}

/* After a refusal: the connection ends, with nothing more to read. */
static bool hung_up(int fd)
{
	char b[8];

	return recv(fd, b, sizeof(b), 0) == 0;
}

static int t_refuse(void)
{
	char sock[108], dir[108];
	struct tfsc_conn *conns[MAX_CONNS_TRY];
	long long refused;
	int n = 0, ret = 0, fd = -1, status;
	pid_t pid;

	if (geteuid() != 0) {
		printf("refuse: SKIP: needs root to run a client as another uid\n");
		return 77;
	}
	CHECK(wait_field("clients", 0), "clients connected before the test");
	socket_public(sock, dir);
	refused = gpu_field("refused");
	pid = fork_other_uid();
	if (pid == 0) {
		for (int i = 0; i < REFUSE_TRIES; i++) {
			int r = hello_raw(sock, &fd);

			if (r != -EACCES) {
				fprintf(stderr, "refuse: try %d: %d (%s), want the reply -EACCES\n",
					i, r, r < 0 ? strerror(-r) : "");
				_exit(1);
			}
			if (!hung_up(fd)) {
				fprintf(stderr, "refuse: try %d: no hang-up after the reply\n", i);
				_exit(1);
			}
			close(fd);
		}
		_exit(0);
	}
	status = child_status(pid);
	socket_private(sock, dir);
	CHECK(status == 0, "a client of uid %d did not read its refusal (child status %d)",
	      OTHER_UID, status);
	CHECK(gpu_field("refused") == refused + REFUSE_TRIES, "the refusals are not counted");

	/* The owner, past the connection limit: refused with EMFILE, read as such. */
	while (n < MAX_CONNS_TRY) {
		ret = hello_raw(sock, &fd);
		if (ret != 0)
			break;
		conns[n] = calloc(1, sizeof(**conns));
		CHECK(conns[n], "out of memory");
		conns[n++]->fd = fd;
	}
	CHECK(ret == -EMFILE, "connection %d past the limit: %d (%s), want the reply -EMFILE", n,
	      ret, ret < 0 ? strerror(-ret) : "");
	CHECK(hung_up(fd), "no hang-up after -EMFILE");
	close(fd);
	while (n)
		tfsc_close(conns[--n]);
	CHECK(wait_field("clients", 0), "clients remain");
	tfsc_close(connect_mnt(NULL));
	printf("refuse: ok\n");
	return 0;
}

/* ---- remount: a process keeps using the library while the mount is replaced ---- */

static bool wait_file(const char *path)
{
	for (int i = 0; i < 60 * 40; i++) {
		if (access(path, F_OK) == 0)
			return true;
		sleep_ms(25);
	}
	return false;
}

static void write_check(const char *what, size_t len, uint64_t *s)
{
	uint8_t *buf = malloc(len), *got = malloc(len);
	int fd = open_in("rm", O_RDWR | O_CREAT);

	CHECK(buf && got, "out of memory");
	gt_fill(buf, len, s);
	CHECK(tfs_gpu_path(fd) == TFS_GPU_PATH_ZEROCOPY, "%s: not on the zero-copy path (%s)", what,
	      tfs_gpu_error());
	CHECK(tfs_gpu_write(fd, 333, len, buf, NULL) == (ssize_t)len, "%s: write: %s", what,
	      tfs_gpu_error());
	CHECK(tfs_gpu_read(fd, 333, len, got, NULL) == (ssize_t)len && memcmp(got, buf, len) == 0,
	      "%s: read back: %s", what, tfs_gpu_error());
	close(fd); /* no file stays open: the mount must be free to go */
	free(buf);
	free(got);
}

static int t_remount(const char *ready, const char *go)
{
	uint64_t s = 5;
	int fd;

	write_check("before the remount", 3UL << 20, &s);
	fd = open(ready, O_WRONLY | O_CREAT, 0644);
	CHECK(fd >= 0, "%s: %s", ready, strerror(errno));
	close(fd);
	CHECK(wait_file(go), "no word that the mount is back");
	write_check("after the remount", 3UL << 20, &s);
	printf("remount: ok\n");
	return 0;
}

/* ---- copyfail: a copy that fails while blocks are pinned ---- */

extern int tfsc_copy_fail_after; /* cuda/copy_cpu.c */

static int t_copyfail(const char *expect)
{
	bool zc = strcmp(expect, "zerocopy") == 0;
	/* Long enough that the second copy is another batch, or another bounce buffer. */
	size_t len = zc ? (size_t)(gpu_field("max_pins") * gpu_field("block_size")) * 3 / 2 + 777
			: (12UL << 20) + 777;
	size_t off = 12345, size = off + len + 54321;
	uint8_t *old = malloc(size), *buf = malloc(size), *got = malloc(size);
	uint64_t s = 99;
	struct stat st;
	ssize_t n;
	int fd;

	CHECK(old && buf && got, "out of memory");
	fd = open_in("cf", O_RDWR | O_CREAT | O_TRUNC);
	CHECK(tfs_gpu_path(fd) == (zc ? TFS_GPU_PATH_ZEROCOPY : TFS_GPU_PATH_FALLBACK),
	      "copyfail: not on the %s path", expect);
	gt_fill(old, size, &s);
	pwrite_all(fd, old, size, 0);

	/* A read whose second copy fails: an error with a message, no pin left. */
	tfsc_copy_fail_after = 1;
	n = tfs_gpu_read(fd, (off_t)off, len, got, NULL);
	CHECK(n == -EIO && strstr(tfs_gpu_error(), "test hook"), "a failed read returned %zd (%s)",
	      n, tfs_gpu_error());
	if (zc)
		CHECK(gpu_field("pinned_blocks") == 0, "a failed read left pins");

	/* A write whose second copy fails: its range holds new, old or zero bytes; the rest is as
	 * it was. */
	gt_fill(buf, size, &s);
	tfsc_copy_fail_after = 1;
	n = tfs_gpu_write(fd, (off_t)off, len, buf, NULL);
	CHECK(n == -EIO, "a failed write returned %zd (%s)", n, tfs_gpu_error());
	if (zc)
		CHECK(gpu_field("pinned_blocks") == 0 && gpu_field("write_pinned_blocks") == 0,
		      "a failed write left pins");
	CHECK(fstat(fd, &st) == 0 && (size_t)st.st_size == size, "a failed write changed the size");
	pread_all(fd, got, size, 0);
	CHECK(memcmp(got, old, off) == 0 &&
		  memcmp(got + off + len, old + off + len, size - off - len) == 0,
	      "a failed write changed bytes outside its range");
	for (size_t i = off; i < off + len; i++)
		CHECK(got[i] == buf[i - off] || got[i] == 0 || got[i] == old[i],
		      "a failed write left byte %zu neither new, old nor zero", i);

	/* The library goes on working. */
	tfsc_copy_fail_after = -1;
	CHECK(tfs_gpu_write(fd, (off_t)off, len, buf, NULL) == (ssize_t)len,
	      "write after a failure");
	CHECK(tfs_gpu_read(fd, (off_t)off, len, got, NULL) == (ssize_t)len &&
		  memcmp(got, buf, len) == 0,
	      "read after a failure");
	close(fd);
	free(old);
	free(buf);
	free(got);
	printf("copyfail: ok\n");
	return 0;
}

/* ---- fallback: double-buffered pread/pwrite, O_DIRECT in the middle ---- */

#define FB_PIECE (8UL << 20) /* cuda/client_int.h FB_CHUNK_BYTES */

static void fb_check_read(int fd, const uint8_t *want, size_t size, size_t off, size_t len)
{
	size_t n = off >= size ? 0 : (len < size - off ? len : size - off);
	uint8_t *got = malloc(len + 1);
	ssize_t r;

	CHECK(got, "out of memory");
	memset(got, 0xA5, len + 1);
	r = tfs_gpu_read(fd, (off_t)off, len, got, NULL);
	CHECK(r == (ssize_t)n, "tfs_gpu_read(%zu, %zu) = %zd, want %zu: %s", off, len, r, n,
	      tfs_gpu_error());
	for (size_t i = 0; i < n; i++)
		CHECK(got[i] == want[off + i], "tfs_gpu_read(%zu, %zu): byte %zu differs", off, len,
		      off + i);
	CHECK(got[n] == 0xA5, "tfs_gpu_read(%zu, %zu) wrote past what it read", off, len);
	free(got);
}

/* Write buf to [off, off + len) through the library; the shadow follows; pread must agree. */
static void fb_write(int fd, uint8_t *shadow, size_t *size, const uint8_t *buf, size_t off,
		     size_t len)
{
	uint8_t *got;
	ssize_t r = tfs_gpu_write(fd, (off_t)off, len, buf, NULL);
	struct stat st;

	CHECK(r == (ssize_t)len, "tfs_gpu_write(%zu, %zu) = %zd: %s", off, len, r, tfs_gpu_error());
	memcpy(shadow + off, buf, len);
	if (off + len > *size)
		*size = off + len;
	CHECK(fstat(fd, &st) == 0 && (size_t)st.st_size == *size,
	      "size %lld after a write, want %zu", (long long)st.st_size, *size);
	got = malloc(*size);
	CHECK(got, "out of memory");
	pread_all(fd, got, *size, 0);
	CHECK(memcmp(got, shadow, *size) == 0, "tfs_gpu_write(%zu, %zu): pread reads other bytes",
	      off, len);
	free(got);
}

/* In a child: a write that RLIMIT_FSIZE cuts short must fail, not return its length. */
static void fb_short_write(const char *path)
{
	size_t len = 3 * FB_PIECE;
	uint8_t *buf = calloc(1, len);
	pid_t pid;

	CHECK(buf, "out of memory");
	pid = fork();
	CHECK(pid >= 0, "fork: %s", strerror(errno));
	if (pid == 0) {
		struct rlimit rl = {FB_PIECE + 12345, FB_PIECE + 12345};
		int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		ssize_t r;

		signal(SIGXFSZ, SIG_IGN);
		if (fd < 0 || setrlimit(RLIMIT_FSIZE, &rl) < 0)
			_exit(3);
		r = tfs_gpu_write(fd, 0, len, buf, NULL);
		if (r != -EFBIG) {
			fprintf(stderr,
				"FAIL: a write cut short by RLIMIT_FSIZE returned %zd (%s)\n", r,
				tfs_gpu_error());
			_exit(1);
		}
		_exit(0);
	}
	CHECK(child_status(pid) == 0, "a write cut short by RLIMIT_FSIZE");
	unlink(path);
	free(buf);
}

static int t_fallback(const char *expect)
{
	size_t cap = 5 * FB_PIECE, size = 0;
	uint8_t *shadow = calloc(1, cap), *buf = malloc(cap);
	uint64_t s = 4242, d0, b0, d1, b1;
	char path[4096];
	int fd;

	CHECK(shadow && buf, "out of memory");
	snprintf(path, sizeof(path), "%s/fb-data", mnt);
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	CHECK(fd >= 0, "open %s: %s", path, strerror(errno));
	CHECK(tfs_gpu_path(fd) == TFS_GPU_PATH_FALLBACK, "%s is not on the fallback path", path);
	gt_fill(buf, cap, &s);
	tfsc_fallback_bytes(&d0, &b0);

	/* Aligned, several pieces: the two buffers take turns. */
	fb_write(fd, shadow, &size, buf, 0, 2 * FB_PIECE + 3 * 4096);
	fb_check_read(fd, shadow, size, 0, size);
	fb_check_read(fd, shadow, size, FB_PIECE, FB_PIECE);
	tfsc_fallback_bytes(&d1, &b1);
	if (strcmp(expect, "direct") == 0)
		CHECK(d1 - d0 >= 2 * (2 * FB_PIECE + 3 * 4096),
		      "aligned transfers went with O_DIRECT for %llu bytes only",
		      (unsigned long long)(d1 - d0));
	else if (strcmp(expect, "buffered") == 0)
		CHECK(d1 == d0, "O_DIRECT was used where it should not be");
	printf("fallback: %s: %llu bytes with O_DIRECT, %llu buffered\n", mnt,
	       (unsigned long long)(d1 - d0), (unsigned long long)(b1 - b0));

	/* Unaligned heads and tails, over and past what is there. */
	gt_fill(buf, cap, &s);
	fb_write(fd, shadow, &size, buf, 3 * 4096 + 123, 2 * FB_PIECE + 4321);
	gt_fill(buf, cap, &s);
	fb_write(fd, shadow, &size, buf, size - 777, FB_PIECE + 999); /* grows the file */
	fb_write(fd, shadow, &size, buf + 5, 4096 * 7, 4096 * 300);   /* aligned, small */
	fb_write(fd, shadow, &size, buf + 9, 100, 5000);	      /* small: buffered */
	fb_check_read(fd, shadow, size, 1, size - 2);
	fb_check_read(fd, shadow, size, 4095, 3 * FB_PIECE);
	fb_check_read(fd, shadow, size, 4096, 1);

	/* EOF: a read across it returns what is there, one at or past it 0. */
	CHECK(size % 4096, "the file should end unaligned");
	fb_check_read(fd, shadow, size, size - FB_PIECE - 5000, 4 * FB_PIECE);
	fb_check_read(fd, shadow, size, size - (size % 4096), 2 * FB_PIECE);
	fb_check_read(fd, shadow, size, size, FB_PIECE);
	fb_check_read(fd, shadow, size, size + 100, 2 * FB_PIECE);

	/* Through a write-only and a read-only fd: the O_DIRECT fd takes their mode. */
	{
		int wo = open(path, O_WRONLY | O_CLOEXEC), ro = open(path, O_RDONLY | O_CLOEXEC);

		CHECK(wo >= 0 && ro >= 0, "open %s: %s", path, strerror(errno));
		gt_fill(buf, cap, &s);
		CHECK(tfs_gpu_write(wo, 8192, 2 * FB_PIECE, buf, NULL) == (ssize_t)(2 * FB_PIECE),
		      "write through a write-only fd: %s", tfs_gpu_error());
		memcpy(shadow + 8192, buf, 2 * FB_PIECE);
		fb_check_read(ro, shadow, size, 0, size);
		close(wo);
		close(ro);
	}
	close(fd);
	unlink(path);

	snprintf(path, sizeof(path), "%s/fb-short", mnt);
	fb_short_write(path);
	free(shadow);
	free(buf);
	printf("fallback: ok\n");
	return 0;
}

/* ---- nvme: a file larger than DRAM read back through the arena ---- */

static int t_nvme(const char *what, size_t size)
{
	uint8_t *buf = malloc(size), *got = malloc(size);
	uint64_t s = 777;
	long long before;
	ssize_t n;
	int fd;

	CHECK(buf && got, "out of memory");
	gt_fill(buf, size, &s);
	if (strcmp(what, "write") == 0) {
		fd = open_in("nv", O_RDWR | O_CREAT | O_TRUNC);
		CHECK(tfs_gpu_path(fd) == TFS_GPU_PATH_ZEROCOPY, "nvme: not on the zero-copy path");
		n = tfs_gpu_write(fd, 0, size, buf, NULL);
		CHECK(n == (ssize_t)size, "tfs_gpu_write = %zd: %s", n, tfs_gpu_error());
		CHECK(fsync(fd) == 0, "fsync: %s", strerror(errno));
	} else {
		fd = open_in("nv", O_RDONLY);
		CHECK(tfs_gpu_path(fd) == TFS_GPU_PATH_ZEROCOPY, "nvme: not on the zero-copy path");
		before = gpu_field("prefetch_bytes");
		memset(got, 0, size);
		n = tfs_gpu_read(fd, 0, size, got, NULL);
		CHECK(n == (ssize_t)size, "tfs_gpu_read = %zd: %s", n, tfs_gpu_error());
		for (size_t i = 0; i < size; i++)
			CHECK(got[i] == buf[i], "byte %zu read back from nvme differs", i);
		CHECK(gpu_field("prefetch_bytes") > before,
		      "the read did not ask the daemon to load ahead");
		CHECK(gpu_field("pinned_blocks") == 0, "pins left after the read");
		printf("nvme: %lld bytes asked ahead\n", gpu_field("prefetch_bytes") - before);
	}
	close(fd);
	free(buf);
	free(got);
	printf("nvme %s: ok\n", what);
	return 0;
}

/* ---- starve: a slot is cleaned for whoever waits for one ---- */

#define STARVE_WAIT_MS 20000 /* a write that waits for a slot has one by then */
#define STARVE_PINS_MAX 64

/* An integer of MNT/.tensorfs/stats, under group (and sub, if not NULL). */
static long long stats_field(const char *group, const char *sub, const char *key)
{
	return sub ? ctl_int("stats", (const char *const[]){group, sub, key, NULL})
		   : ctl_int("stats", (const char *const[]){group, key, NULL});
}

/* Write n bytes of data to a new file name; its fd. */
static int write_file(const char *name, const uint8_t *data, size_t n)
{
	int fd = open_in(name, O_RDWR | O_CREAT | O_TRUNC);

	pwrite_all(fd, data, n, 0);
	return fd;
}

static void read_check(int fd, const uint8_t *want, size_t n, const char *what)
{
	uint8_t *got = malloc(n);

	CHECK(got, "out of memory");
	pread_all(fd, got, n, 0);
	CHECK(memcmp(got, want, n) == 0, "%s does not read back", what);
	free(got);
}

/*
 * The reserve: clean blocks held by read pins, every other slot written,
 * under the flusher's mark (the dirty limit less the clean reserve's low
 * mark, which is half of what the limit leaves: 4 of 256 slots here). The
 * pinned blocks cannot be evicted, so they do not make the reserve: the
 * flusher cleans low blocks of the others, and a write to a new block
 * gets a slot. Counted, they met the reserve and the write waited for
 * ever. Mounted with dirty_expire_ms=0, so that the age limit frees none.
 */
static int starve_reserve(void)
{
	struct arena ar;
	struct tfsc_conn *c = connect_mnt(&ar);
	size_t bs = ar.bs;
	uint64_t nslots = (uint64_t)stats_field("tiers", "dram", "capacity") / bs;
	uint64_t dirty_max = (uint64_t)stats_field("cache", NULL, "dirty_limit_bytes") / bs;
	uint64_t low = (nslots - dirty_max) / 2, npin = 3 * low + 2, nfill, pins[STARVE_PINS_MAX];
	unsigned npins = 0;
	uint8_t *held, *fill, *one;
	uint64_t s = 19;
	int hfd, ffd, ofd, status;
	pid_t pid;

	CHECK(npin <= ar.max_pins && npin < nslots / 2, "%llu slots, %llu clean kept: no room",
	      (unsigned long long)nslots, (unsigned long long)low);
	CHECK(stats_field("tiers", "dram", "used") == 0, "the DRAM tier is not empty at the start");
	held = malloc(npin * bs);
	fill = malloc(nslots * bs);
	one = malloc(bs);
	CHECK(held && fill && one, "out of memory");
	gt_fill(held, npin * bs, &s);
	gt_fill(fill, nslots * bs, &s);
	gt_fill(one, bs, &s);

	hfd = write_file("sv-held", held, npin * bs);
	CHECK(fsync(hfd) == 0, "fsync: %s", strerror(errno));
	CHECK(tfsc_grant(c, hfd, ino_of(hfd)) == 0, "GRANT: %s", tfs_gpu_error());
	for (uint64_t off = 0; off < npin * bs; off += c->rep->nblocks * bs) {
		CHECK(npins < STARVE_PINS_MAX, "too many pins");
		CHECK(tfsc_pin(c, false, ino_of(hfd), off, npin * bs - off, 0) == 0 &&
			      c->rep->nblocks > 0,
		      "PIN_READ: %s", tfs_gpu_error());
		pins[npins++] = c->rep->pin;
	}
	/* Every slot but the pinned ones, dirty. */
	nfill = nslots - (uint64_t)stats_field("tiers", "dram", "used") / bs;
	ffd = write_file("sv-fill", fill, nfill * bs);
	CHECK(stats_field("tiers", "dram", "used") == (long long)(nslots * bs) && nfill + low <= dirty_max,
	      "not the case to test: %lld of %llu bytes used, %llu blocks filled",
	      stats_field("tiers", "dram", "used"), (unsigned long long)(nslots * bs),
	      (unsigned long long)nfill);
	/* The flusher's reserve is made of slots that can go, not of the pinned ones. */
	for (int i = 0; i < WAIT_TRIES && stats_field("cache", NULL, "dirty_bytes") >
						  (long long)((nfill - low) * bs);
	     i++)
		sleep_ms(25);
	if (stats_field("cache", NULL, "dirty_bytes") > (long long)((nfill - low) * bs)) {
		long long d = stats_field("cache", NULL, "dirty_bytes");

		for (unsigned i = 0; i < npins; i++)
			tfsc_release(c, pins[i], 0);
		gt_die("%lld of %llu unpinned blocks dirty: the reserve counted the pinned ones",
		       d / (long long)bs, (unsigned long long)nfill);
	}

	pid = fork();
	CHECK(pid >= 0, "fork");
	if (pid == 0) {
		int fd = open_in("sv-one", O_RDWR | O_CREAT | O_TRUNC);

		alarm(120);
		_exit(pwrite(fd, one, bs, 0) == (ssize_t)bs && fsync(fd) == 0 ? 0 : 1);
	}
	if (!wait_pid_ms(pid, STARVE_WAIT_MS, &status)) {
		for (unsigned i = 0; i < npins; i++)
			tfsc_release(c, pins[i], 0);
		waitpid(pid, &status, 0);
		gt_die("a write waited %d s for a slot: %llu slots read-pinned, the other %llu dirty",
		       STARVE_WAIT_MS / 1000, (unsigned long long)npin, (unsigned long long)nfill);
	}
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the write of a new block failed");
	for (unsigned i = 0; i < npins; i++)
		CHECK(tfsc_release(c, pins[i], 0) == 0, "RELEASE: %s", tfs_gpu_error());
	ofd = open_in("sv-one", O_RDONLY);
	read_check(hfd, held, npin * bs, "the pinned file");
	read_check(ffd, fill, nfill * bs, "the file that filled DRAM");
	read_check(ofd, one, bs, "the block written last");
	tfsc_close(c);
	munmap(ar.base, ar.bytes);
	close(hfd);
	close(ffd);
	close(ofd);
	free(held);
	free(fill);
	free(one);
	printf("starve reserve: ok (%llu slots pinned, %llu written)\n", (unsigned long long)npin,
	       (unsigned long long)nfill);
	return 0;
}

/*
 * The age limit: a client holds a write pin on the oldest dirty block;
 * the blocks written after it still go back once they pass the limit
 * (dirty_expire_ms, short on this mount), and the pinned one after its
 * release.
 */
static int starve_expire(void)
{
	struct arena ar;
	struct tfsc_conn *c = connect_mnt(&ar);
	size_t bs = ar.bs, n = 8 * bs;
	uint8_t *head = malloc(bs), *aged = malloc(n);
	uint64_t s = 23, pin;
	long long expired;
	int hfd, afd;

	CHECK(head && aged, "out of memory");
	gt_fill(head, bs, &s);
	gt_fill(aged, n, &s);
	CHECK(stats_field("cache", NULL, "dirty_bytes") == 0, "dirty blocks at the start");
	expired = stats_field("cache", NULL, "expired_bytes");
	hfd = open_in("sv-head", O_RDWR | O_CREAT | O_TRUNC);
	CHECK(tfsc_grant(c, hfd, ino_of(hfd)) == 0, "GRANT: %s", tfs_gpu_error());
	CHECK(tfsc_pin(c, true, ino_of(hfd), 0, bs, 0) == 0 && c->rep->nblocks == 1,
	      "PIN_WRITE: %s", tfs_gpu_error());
	pin = c->rep->pin;
	memcpy(ar.base + c->rep->slot[0], head, bs);
	afd = write_file("sv-aged", aged, n);
	for (int i = 0; i < WAIT_TRIES && stats_field("cache", NULL, "dirty_bytes") > (long long)bs;
	     i++)
		sleep_ms(25);
	if (stats_field("cache", NULL, "dirty_bytes") > (long long)bs) {
		long long d = stats_field("cache", NULL, "dirty_bytes");

		tfsc_release(c, pin, 0);
		gt_die("%lld bytes still dirty past the age limit behind a held write pin, want %zu",
		       d, bs);
	}
	CHECK(stats_field("cache", NULL, "expired_bytes") - expired >= (long long)n,
	      "the blocks behind the pin went back, but not for the age limit");
	CHECK(tfsc_release(c, pin, 0) == 0, "RELEASE: %s", tfs_gpu_error());
	read_check(hfd, head, bs, "the block written through the pin");
	read_check(afd, aged, n, "the blocks written behind it");
	for (int i = 0; i < WAIT_TRIES && stats_field("cache", NULL, "dirty_bytes") > 0; i++)
		sleep_ms(25);
	CHECK(stats_field("cache", NULL, "dirty_bytes") == 0,
	      "the released block did not go back for the age limit");
	tfsc_close(c);
	munmap(ar.base, ar.bytes);
	close(hfd);
	close(afd);
	free(head);
	free(aged);
	printf("starve expire: ok\n");
	return 0;
}

/*
 * ---- stream: a PREFETCH of a range on nvme is read from the device whole ----
 *
 * PREFETCH the first nblk blocks of MNT/name, say ready (READY.1) and
 * wait for go (GO.1): the script counts the device's reads meanwhile.
 * Then PIN_READ the first block alone, release it, and do the same with
 * READY.2 and GO.2. The daemon issues the rest of a range it could not
 * issue at once at the connection's next PIN.
 */
static void handshake(const char *ready, const char *go, int step)
{
	char path[4096];
	int fd;

	snprintf(path, sizeof(path), "%s.%d", ready, step);
	fd = open(path, O_WRONLY | O_CREAT, 0644);
	CHECK(fd >= 0, "%s: %s", path, strerror(errno));
	close(fd);
	snprintf(path, sizeof(path), "%s.%d", go, step);
	CHECK(wait_file(path), "no word to go on (%s)", path);
}

static int t_stream(const char *name, uint64_t nblk, const char *ready, const char *go)
{
	struct arena ar;
	struct tfsc_conn *c = connect_mnt(&ar);
	int fd = open_in(name, O_RDONLY);
	uint64_t ino = ino_of(fd), pin;

	CHECK(tfsc_grant(c, fd, ino) == 0, "GRANT: %s", tfs_gpu_error());
	CHECK(tfsc_prefetch(c, ino, 0, nblk * ar.bs) == 0, "PREFETCH: %s", tfs_gpu_error());
	printf("stream: PREFETCH of %llu blocks issued %llu bytes at once\n",
	       (unsigned long long)nblk, (unsigned long long)c->rep->len);
	handshake(ready, go, 1);
	CHECK(tfsc_pin(c, false, ino, 0, ar.bs, 1) == 0 && c->rep->nblocks == 1,
	      "PIN_READ of block 0: %s", tfs_gpu_error());
	pin = c->rep->pin;
	CHECK(tfsc_release(c, pin, 0) == 0, "RELEASE: %s", tfs_gpu_error());
	handshake(ready, go, 2);
	close(fd);
	tfsc_close(c);
	munmap(ar.base, ar.bytes);
	printf("stream: ok\n");
	return 0;
}

int main(int argc, char **argv)
{
	/* The tests that take no argument but MNT. */
	static const struct {
		const char *name;
		int (*run)(void);
	} plain[] = {{"protocol", t_protocol}, {"owner", t_owner},	   {"hijack", t_hijack},
		     {"crash", t_crash},       {"grantmode", t_grantmode}, {"pinwait", t_pinwait},
		     {"refuse", t_refuse}};

	if (argc < 3) {
		fprintf(stderr,
			"usage: %s roundtrip MNT zerocopy|fallback [ITERS [THREADS]]\n"
			"       %s copyfail MNT zerocopy|fallback\n"
			"       %s remount MNT READY-FILE GO-FILE\n"
			"       %s fdleak MNT DAEMON-PID\n"
			"       %s fallback DIR direct|buffered|any\n"
			"       %s nvme MNT write|read SIZE-MIB\n"
			"       %s starve MNT reserve|expire\n"
			"       %s stream MNT FILE BLOCKS READY-FILE GO-FILE\n"
			"       %s protocol|owner|hijack|crash|grantmode|pinwait|refuse MNT\n",
			argv[0], argv[0], argv[0], argv[0], argv[0], argv[0], argv[0], argv[0], argv[0]);
		return 2;
	}
	mnt = argv[2];
	setvbuf(stdout, NULL, _IOLBF, 0);
	for (size_t i = 0; i < sizeof(plain) / sizeof(plain[0]); i++)
		if (strcmp(argv[1], plain[i].name) == 0)
			return plain[i].run();
	if (strcmp(argv[1], "roundtrip") == 0 && argc >= 4)
		return t_roundtrip(argv[3], argc > 4 ? (unsigned)atoi(argv[4]) : 200,
				   argc > 5 ? atoi(argv[5]) : 1);
	if (strcmp(argv[1], "copyfail") == 0 && argc >= 4)
		return t_copyfail(argv[3]);
	if (strcmp(argv[1], "remount") == 0 && argc >= 5)
		return t_remount(argv[3], argv[4]);
	if (strcmp(argv[1], "fdleak") == 0 && argc >= 4)
		return t_fdleak((pid_t)atoi(argv[3]));
	if (strcmp(argv[1], "fallback") == 0 && argc >= 4)
		return t_fallback(argv[3]);
	if (strcmp(argv[1], "starve") == 0 && argc >= 4 && strcmp(argv[3], "reserve") == 0)
		return starve_reserve();
	if (strcmp(argv[1], "starve") == 0 && argc >= 4 && strcmp(argv[3], "expire") == 0)
		return starve_expire();
	if (strcmp(argv[1], "nvme") == 0 && argc >= 5)
		return t_nvme(argv[3], (size_t)strtoull(argv[4], NULL, 10) << 20);
	if (strcmp(argv[1], "stream") == 0 && argc >= 7)
		return t_stream(argv[3], strtoull(argv[4], NULL, 10), argv[5], argv[6]);
	fprintf(stderr, "unknown test %s\n", argv[1]);
	return 2;
}

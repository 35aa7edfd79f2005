/*
 * client.c - libtensorfs-cuda: tfs_gpu_read and tfs_gpu_write.
 *
 * A call finds the tensorfs mount of its fd (by st_dev, in
 * /proc/self/mountinfo) and reads MOUNT/.tensorfs/gpu. Where that names a
 * socket, the first call maps the arena memfd the daemon passes, and
 * registers it with CUDA; the mount, its mapping and a pool of idle
 * connections are kept per process. Then the call pins the range in
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
 */
#include "client.h"
#include "copy.h"
#include "gpu_sock.h"
#include "tensorfs_cuda.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

#define BOUNCE_BYTES (8UL << 20) /* a fallback copy's unit */
#define BOUNCE_KEEP 4		 /* idle bounce buffers kept */
#define GPU_FILE "/.tensorfs/gpu"
#define FSTYPE "fuse.tensorfs"

static __thread char errmsg[256];

int tfsc_fail(int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(errmsg, sizeof(errmsg), fmt, ap);
	va_end(ap);
	return err;
}

const char *tfs_gpu_error(void)
{
	return errmsg;
}

/* Why a call falls back, for TENSORFS_CUDA_DEBUG=1. */
static void debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void debug(const char *fmt, ...)
{
	const char *d = getenv("TENSORFS_CUDA_DEBUG");
	va_list ap;

	if (!d || !*d || strcmp(d, "0") == 0)
		return;
	va_start(ap, fmt);
	fprintf(stderr, "libtensorfs-cuda: ");
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

/* ---- one connection ---- */

int tfsc_connect(const char *path, struct tfsc_conn **out)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct tfsc_conn *c;

	if (strlen(path) >= sizeof(sa.sun_path))
		return tfsc_fail(-ENAMETOOLONG, "socket path too long: %s", path);
	memcpy(sa.sun_path, path, strlen(path) + 1);
	c = calloc(1, sizeof(*c));
	if (c)
		c->rep = calloc(1, TFS_GPU_REP_MAX);
	if (!c || !c->rep) {
		if (c)
			free(c->rep);
		free(c);
		return tfsc_fail(-ENOMEM, "out of memory");
	}
	c->fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (c->fd < 0 || connect(c->fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int err = -errno;

		tfsc_close(c);
		return tfsc_fail(err, "cannot connect to %s: %s", path, strerror(-err));
	}
	*out = c;
	return 0;
}

void tfsc_close(struct tfsc_conn *c)
{
	if (!c)
		return;
	if (c->fd >= 0)
		close(c->fd);
	free(c->rep);
	free(c);
}

/* One request and its reply; fd_in goes along, *fd_out receives one. */
static int exchange(struct tfsc_conn *c, struct tfs_gpu_req *req, int fd_in, int *fd_out)
{
	ssize_t n;
	int rflags = 0, fd;

	req->magic = TFS_GPU_MAGIC;
	req->version = TFS_GPU_VERSION;
	/* A daemon that refuses us answers first and hangs up: read that answer. */
	if (gpusock_send(c->fd, req, sizeof(*req), fd_in) < 0)
		rflags |= MSG_DONTWAIT;
	n = gpusock_recv(c->fd, c->rep, TFS_GPU_REP_MAX, rflags, &fd);
	/*
	 * A peer that closed with our request unread makes the socket say
	 * ECONNRESET once, before the answer it queued: read that next.
	 */
	if (n == -ECONNRESET)
		n = gpusock_recv(c->fd, c->rep, TFS_GPU_REP_MAX, rflags | MSG_DONTWAIT, &fd);
	if (fd >= 0 && fd_out && *fd_out < 0)
		*fd_out = fd;
	else if (fd >= 0)
		close(fd);
	if (n == -EMSGSIZE)
		return tfsc_fail(-EPROTO, "bad reply from the tensorfs daemon");
	if (n <= 0)
		return tfsc_fail(-ENOTCONN, "the tensorfs daemon hung up (%s)",
				 n < 0 ? strerror((int)-n) : "closed");
	if ((size_t)n < sizeof(*c->rep) || c->rep->magic != TFS_GPU_MAGIC ||
	    (size_t)n != sizeof(*c->rep) + c->rep->nblocks * sizeof(uint64_t) ||
	    c->rep->nblocks > TFS_GPU_MAX_BLOCKS)
		return tfsc_fail(-EPROTO, "bad reply from the tensorfs daemon");
	if (c->rep->version != TFS_GPU_VERSION || c->rep->status == -EPROTO)
		return tfsc_fail(-EPROTO, "the tensorfs daemon speaks another protocol version");
	if (c->rep->op != req->op && c->rep->status == 0)
		return tfsc_fail(-EPROTO, "reply to another request from the tensorfs daemon");
	return c->rep->status;
}

int tfsc_hello(struct tfsc_conn *c, int *arena_fd)
{
	struct tfs_gpu_req req = {.op = TFS_GPU_HELLO, .want_arena = arena_fd != NULL};
	int ret;

	if (arena_fd)
		*arena_fd = -1;
	ret = exchange(c, &req, -1, arena_fd);
	if (ret == -EACCES)
		return tfsc_fail(ret, "the tensorfs daemon serves only the mount owner's uid");
	if (ret == -EMFILE)
		return tfsc_fail(ret, "the tensorfs daemon has too many GPU clients");
	if (ret)
		return ret;
	if (arena_fd && *arena_fd < 0)
		return tfsc_fail(-EPROTO, "the tensorfs daemon sent no arena");
	return 0;
}

int tfsc_grant(struct tfsc_conn *c, int fd, uint64_t ino)
{
	struct tfs_gpu_req req = {.op = TFS_GPU_GRANT, .ino = ino};

	return exchange(c, &req, fd, NULL);
}

int tfsc_pin(struct tfsc_conn *c, bool write, uint64_t ino, uint64_t off, uint64_t len,
	     uint32_t max_blocks)
{
	struct tfs_gpu_req req = {.op = write ? TFS_GPU_PIN_WRITE : TFS_GPU_PIN_READ,
				  .ino = ino,
				  .off = off,
				  .len = len,
				  .max_blocks = max_blocks};

	return exchange(c, &req, -1, NULL);
}

int tfsc_release(struct tfsc_conn *c, uint64_t pin, int status)
{
	struct tfs_gpu_req req = {.op = TFS_GPU_RELEASE, .pin = pin, .status = status};

	return exchange(c, &req, -1, NULL);
}

/* ---- finding the mount ---- */

/* mountinfo writes space, tab, newline and backslash as \ooo. */
static void unescape(char *s)
{
	char *o = s;

	for (; *s; s++) {
		if (s[0] == '\\' && s[1] >= '0' && s[1] <= '3' && s[2] >= '0' && s[2] <= '7' &&
		    s[3] >= '0' && s[3] <= '7') {
			*o++ = (char)((s[1] - '0') << 6 | (s[2] - '0') << 3 | (s[3] - '0'));
			s += 3;
		} else {
			*o++ = *s;
		}
	}
	*o = 0;
}

int tfsc_find_mount(int fd, char *root, size_t rootlen)
{
	struct stat st;
	char *line = NULL;
	size_t cap = 0;
	int ret = -ENOENT;
	FILE *f;

	if (fstat(fd, &st) < 0)
		return tfsc_fail(-errno, "fstat: %s", strerror(errno));
	f = fopen("/proc/self/mountinfo", "re");
	if (!f)
		return tfsc_fail(-errno, "/proc/self/mountinfo: %s", strerror(errno));
	while (ret == -ENOENT && getline(&line, &cap, f) > 0) {
		unsigned maj, min;
		char fsroot[PATH_MAX], mnt[PATH_MAX], fstype[64];
		const char *sep = strstr(line, " - ");

		if (!sep ||
		    sscanf(line, "%*u %*u %u:%u %4095s %4095s", &maj, &min, fsroot, mnt) != 4 ||
		    sscanf(sep + 3, "%63s", fstype) != 1)
			continue;
		if (makedev(maj, min) != st.st_dev || strcmp(fstype, FSTYPE) != 0 ||
		    strcmp(fsroot, "/") != 0)
			continue;
		unescape(mnt);
		if (strlen(mnt) >= rootlen)
			ret = tfsc_fail(-ENAMETOOLONG, "mount point too long");
		else
			ret = (memcpy(root, mnt, strlen(mnt) + 1), 0);
	}
	free(line);
	fclose(f);
	return ret;
}

int tfsc_gpu_file(const char *root, char *sock, size_t socklen, uint64_t *id)
{
	char path[PATH_MAX];
	json_error_t jerr;
	json_t *j, *s, *i;
	int ret = 0;

	snprintf(path, sizeof(path), "%s%s", root, GPU_FILE);
	j = json_load_file(path, 0, &jerr);
	if (!j)
		return tfsc_fail(-ENOENT, "%s: %s", path, jerr.text);
	s = json_object_get(j, "socket");
	i = json_object_get(j, "id");
	sock[0] = 0;
	*id = 0;
	if (json_is_string(s) && json_is_string(i)) {
		if (strlen(json_string_value(s)) >= socklen)
			ret = tfsc_fail(-ENAMETOOLONG, "socket path too long");
		else
			snprintf(sock, socklen, "%s", json_string_value(s));
		*id = strtoull(json_string_value(i), NULL, 16);
	}
	json_decref(j);
	return ret;
}

/* ---- the mounts this process uses ---- */

struct tfsc_mount {
	dev_t dev;
	char sock[sizeof(((struct sockaddr_un *)0)->sun_path)];
	void *arena;
	size_t arena_bytes, bs;
	uint32_t read_batch, write_batch; /* blocks asked per PIN */
	bool registered;
	unsigned refs;		 /* calls using it; g_lock */
	bool stale;		 /* off the list; freed when refs reach 0 */
	struct tfsc_conn *idle;	 /* g_lock */
	struct tfsc_mount *next; /* g_lock */
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER; /* guards all g_ */
static struct tfsc_mount *g_mounts;
static pid_t g_pid; /* whose the list is: a forked child starts over */
static void *g_bounce[BOUNCE_KEEP];
static unsigned g_nbounce;

static void mount_free(struct tfsc_mount *m)
{
	while (m->idle) {
		struct tfsc_conn *c = m->idle;

		m->idle = c->next;
		tfsc_close(c);
	}
	if (m->registered)
		tfsc_copy_unregister(m->arena);
	if (m->arena)
		munmap(m->arena, m->arena_bytes);
	free(m);
}

/* Call with g_lock held: forget what a parent process set up. */
static void forget_parent(void)
{
	if (g_pid == getpid())
		return;
	/* Its sockets and bounce buffers are the parent's; the copy engine may not work here. */
	g_mounts = NULL;
	g_nbounce = 0;
	g_pid = getpid();
}

/* Map the arena and make it DMA-able; c has just said HELLO with arena_fd. */
static int mount_map(struct tfsc_mount *m, struct tfsc_conn *c, int arena_fd)
{
	const struct tfs_gpu_rep *r = c->rep;
	uint64_t half;

	if (!r->block_size || r->arena_bytes < r->block_size || r->arena_bytes % r->block_size)
		return tfsc_fail(-EPROTO, "the tensorfs daemon sent a bad arena size");
	m->arena_bytes = r->arena_bytes;
	m->bs = r->block_size;
	half = r->max_pins / 2 ? r->max_pins / 2 : 1;
	m->read_batch = (uint32_t)(half < TFS_GPU_MAX_BLOCKS ? half : TFS_GPU_MAX_BLOCKS);
	half = r->max_write_pins / 2 ? r->max_write_pins / 2 : 1;
	m->write_batch = (uint32_t)(half < TFS_GPU_MAX_BLOCKS ? half : TFS_GPU_MAX_BLOCKS);
	m->arena = mmap(NULL, m->arena_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, arena_fd, 0);
	if (m->arena == MAP_FAILED) {
		m->arena = NULL;
		return tfsc_fail(-errno, "cannot map the arena: %s", strerror(errno));
	}
	if (tfsc_copy_register(m->arena, m->arena_bytes, &m->registered) < 0)
		debug("copies from the arena go unregistered: %s", errmsg);
	return 0;
}

/*
 * The shared arena of the mount that holds fd, with a reference for the
 * caller; NULL when calls on fd fall back (why is in the debug output).
 */
static struct tfsc_mount *mount_get(int fd, const struct stat *st)
{
	char root[PATH_MAX];
	struct tfsc_mount *m, *raced;
	struct tfsc_conn *c = NULL;
	uint64_t id;
	int afd = -1, ret;

	pthread_mutex_lock(&g_lock);
	forget_parent();
	for (m = g_mounts; m && m->dev != st->st_dev; m = m->next)
		;
	if (m)
		m->refs++;
	pthread_mutex_unlock(&g_lock);
	if (m)
		return m;

	if (tfsc_find_mount(fd, root, sizeof(root)) < 0) {
		debug("fd %d is not on a tensorfs mount", fd);
		return NULL;
	}
	m = calloc(1, sizeof(*m));
	if (!m)
		return NULL;
	m->dev = st->st_dev;
	ret = tfsc_gpu_file(root, m->sock, sizeof(m->sock), &id);
	if (ret == 0 && !m->sock[0])
		ret = tfsc_fail(-EOPNOTSUPP, "%s shares no arena (mounted without cuda=on)", root);
	if (ret == 0)
		ret = tfsc_connect(m->sock, &c);
	if (ret == 0)
		ret = tfsc_hello(c, &afd);
	if (ret == 0 && c->rep->mount_id != id)
		ret = tfsc_fail(-ESTALE, "%s is served by another daemon than its socket", root);
	if (ret == 0)
		ret = mount_map(m, c, afd);
	if (afd >= 0)
		close(afd);
	if (ret < 0) {
		debug("falling back to pread/pwrite on %s: %s", root, errmsg);
		tfsc_close(c);
		mount_free(m);
		return NULL;
	}
	m->idle = c;
	m->refs = 1;

	pthread_mutex_lock(&g_lock);
	forget_parent();
	for (raced = g_mounts; raced && raced->dev != m->dev; raced = raced->next)
		;
	if (raced) {
		/* Another thread mapped it first: use that one. */
		raced->refs++;
		pthread_mutex_unlock(&g_lock);
		mount_free(m);
		return raced;
	}
	m->next = g_mounts;
	g_mounts = m;
	pthread_mutex_unlock(&g_lock);
	return m;
}

/* Take m off the list: its daemon is gone. Freed once no call uses it. */
static void mount_drop(struct tfsc_mount *m)
{
	struct tfsc_mount **p;

	pthread_mutex_lock(&g_lock);
	for (p = &g_mounts; *p; p = &(*p)->next)
		if (*p == m) {
			*p = m->next;
			m->stale = true;
			break;
		}
	pthread_mutex_unlock(&g_lock);
}

static void mount_put(struct tfsc_mount *m)
{
	bool last;

	pthread_mutex_lock(&g_lock);
	last = --m->refs == 0 && m->stale;
	pthread_mutex_unlock(&g_lock);
	if (last)
		mount_free(m);
}

/* An idle connection of m, or a new one. */
static int conn_get(struct tfsc_mount *m, struct tfsc_conn **out)
{
	struct tfsc_conn *c;
	int ret;

	pthread_mutex_lock(&g_lock);
	c = m->idle;
	if (c)
		m->idle = c->next;
	pthread_mutex_unlock(&g_lock);
	if (c) {
		*out = c;
		return 0;
	}
	ret = tfsc_connect(m->sock, &c);
	if (ret == 0)
		ret = tfsc_hello(c, NULL);
	if (ret) {
		tfsc_close(c);
		/* The socket is gone or refuses us now: as good as a lost connection. */
		return ret == -EPROTO ? ret : -ENOTCONN;
	}
	*out = c;
	return 0;
}

/* Back to the pool when it is still good; closing it releases what it pinned. */
static void conn_put(struct tfsc_mount *m, struct tfsc_conn *c, bool good)
{
	if (!good) {
		tfsc_close(c);
		return;
	}
	pthread_mutex_lock(&g_lock);
	c->next = m->idle;
	m->idle = c;
	pthread_mutex_unlock(&g_lock);
}

void tfs_gpu_shutdown(void)
{
	struct tfsc_mount *m, *next, *unused = NULL;
	void *bounce[BOUNCE_KEEP];
	unsigned nb;

	pthread_mutex_lock(&g_lock);
	forget_parent();
	for (m = g_mounts; m; m = next) {
		next = m->next;
		m->stale = true;
		if (m->refs == 0) { /* else the call using it frees it */
			m->next = unused;
			unused = m;
		}
	}
	g_mounts = NULL;
	nb = g_nbounce;
	memcpy(bounce, g_bounce, sizeof(bounce));
	g_nbounce = 0;
	pthread_mutex_unlock(&g_lock);
	for (m = unused; m; m = next) {
		next = m->next;
		mount_free(m);
	}
	for (unsigned i = 0; i < nb; i++)
		tfsc_copy_host_free(bounce[i]);
}

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

static ssize_t zc_read(struct tfsc_mount *m, struct tfsc_conn *c, int fd, uint64_t ino,
		       uint64_t off, size_t len, char *dev, void *stream, bool *conn_ok)
{
	struct batch *cur = malloc(sizeof(*cur)), *next = malloc(sizeof(*next)), *t;
	uint64_t end = off + len, pos = off;
	bool have_cur = false, have_next = false;
	int ret, rel;

	if (!cur || !next) {
		ret = tfsc_fail(-ENOMEM, "out of memory");
		goto out;
	}
	ret = pin(c, fd, ino, false, pos, end - pos, m->read_batch);
	if (ret == 0)
		ret = take_batch(m, c->rep, false, cur);
	have_cur = ret == 0 && cur->len;
	while (have_cur) {
		ret = queue_batch(m, cur, false, dev, off, stream);
		/* Pin the next batch while this one is copied; the daemon will not wait for it. */
		if (ret == 0 && cur->off + cur->len < end) {
			int r = pin(c, fd, ino, false, cur->off + cur->len,
				    end - cur->off - cur->len, m->read_batch);

			if (r == 0)
				r = take_batch(m, c->rep, false, next);
			have_next = r == 0 && next->len;
			if (r && r != -EAGAIN)
				ret = r;
		}
		/* The slots must not be released before the copies have left them. */
		int s = tfsc_copy_sync(stream);
		if (!ret)
			ret = s;
		rel = tfsc_release(c, cur->pin, ret);
		have_cur = false;
		if (!ret)
			ret = rel;
		if (ret)
			break;
		pos = cur->off + cur->len;
		if (have_next) {
			t = cur, cur = next, next = t;
			have_cur = true;
			have_next = false;
		} else if (pos < end) {
			ret = pin(c, fd, ino, false, pos, end - pos, m->read_batch);
			if (ret == 0)
				ret = take_batch(m, c->rep, false, cur);
			have_cur = ret == 0 && cur->len;
			if (ret)
				break;
		}
	}
	if (have_next && !broken(ret))
		tfsc_release(c, next->pin, ret);
out:
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

/* ---- the fallback: pread/pwrite through a pinned bounce buffer ---- */

static void *bounce_get(void)
{
	void *p = NULL;

	pthread_mutex_lock(&g_lock);
	forget_parent();
	if (g_nbounce)
		p = g_bounce[--g_nbounce];
	pthread_mutex_unlock(&g_lock);
	return p ? p : tfsc_copy_host_alloc(BOUNCE_BYTES);
}

static void bounce_put(void *p)
{
	pthread_mutex_lock(&g_lock);
	if (g_nbounce < BOUNCE_KEEP) {
		g_bounce[g_nbounce++] = p;
		p = NULL;
	}
	pthread_mutex_unlock(&g_lock);
	if (p)
		tfsc_copy_host_free(p);
}

static ssize_t fb_read(int fd, uint64_t off, size_t len, char *dev, void *stream)
{
	char *bounce = bounce_get();
	size_t done = 0;
	int ret = 0;

	if (!bounce)
		return tfsc_fail(-ENOMEM, "cannot allocate a pinned bounce buffer");
	while (done < len) {
		size_t want = len - done < BOUNCE_BYTES ? len - done : BOUNCE_BYTES;
		ssize_t n = pread(fd, bounce, want, (off_t)(off + done));

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			ret = tfsc_fail(-errno, "pread: %s", strerror(errno));
			break;
		}
		if (n == 0)
			break; /* end of file */
		ret = tfsc_copy_h2d(dev + done, bounce, (size_t)n, stream);
		if (!ret)
			ret = tfsc_copy_sync(stream);
		if (ret)
			break;
		done += (size_t)n;
	}
	bounce_put(bounce);
	return ret ? ret : (ssize_t)done;
}

static ssize_t fb_write(int fd, uint64_t off, size_t len, const char *dev, void *stream)
{
	char *bounce = bounce_get();
	size_t done = 0;
	int ret = 0;

	if (!bounce)
		return tfsc_fail(-ENOMEM, "cannot allocate a pinned bounce buffer");
	while (done < len && !ret) {
		size_t want = len - done < BOUNCE_BYTES ? len - done : BOUNCE_BYTES;
		size_t put = 0;

		ret = tfsc_copy_d2h(bounce, dev + done, want, stream);
		if (!ret)
			ret = tfsc_copy_sync(stream);
		while (!ret && put < want) {
			ssize_t n = pwrite(fd, bounce + put, want - put, (off_t)(off + done + put));

			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0)
				ret = tfsc_fail(n < 0 ? -errno : -EIO, "pwrite: %s",
						n < 0 ? strerror(errno) : "wrote nothing");
			else
				put += (size_t)n;
		}
		done += want;
	}
	bounce_put(bounce);
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

	errmsg[0] = 0;
	ret = check_args(fd, offset, len, dev, write, &st);
	if (ret < 0 || len == 0)
		return ret;
	/*
	 * Twice at most: a cached mount whose daemon went away is dropped and
	 * looked up again. Starting over is safe: a read reads the same bytes,
	 * a write writes them again.
	 */
	for (int attempt = 0; attempt < 2; attempt++) {
		struct tfsc_mount *m = S_ISREG(st.st_mode) ? mount_get(fd, &st) : NULL;
		struct tfsc_conn *c = NULL;
		bool ok = false;

		if (!m)
			break;
		ret = conn_get(m, &c);
		if (ret == 0) {
			ret = write ? zc_write(m, c, fd, st.st_ino, (uint64_t)offset, len, dev,
					       stream, &ok)
				    : zc_read(m, c, fd, st.st_ino, (uint64_t)offset, len, dev,
					      stream, &ok);
			conn_put(m, c, ok);
		}
		if (!lost(ret) || attempt) {
			mount_put(m);
			return ret;
		}
		debug("connection to %s lost: %s", m->sock, errmsg);
		mount_drop(m);
		mount_put(m);
	}
	return write ? fb_write(fd, (uint64_t)offset, len, dev, stream)
		     : fb_read(fd, (uint64_t)offset, len, dev, stream);
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

	errmsg[0] = 0;
	if (fstat(fd, &st) < 0)
		return tfsc_fail(-errno, "fstat: %s", strerror(errno));
	m = S_ISREG(st.st_mode) ? mount_get(fd, &st) : NULL;
	if (!m)
		return TFS_GPU_PATH_FALLBACK;
	mount_put(m);
	return TFS_GPU_PATH_ZEROCOPY;
}

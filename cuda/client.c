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

#define FB_CHUNK_BYTES (8UL << 20)   /* a fallback pread or pwrite, at most */
#define FB_DIRECT_MIN (1UL << 20)    /* smaller transfers go through the page cache */
#define FB_DIRECT_ALIGN 4096UL	     /* what O_DIRECT asks of offsets, lengths, buffers */
#define STAGING_KEEP 4		     /* idle buffer pairs kept */
#define ZC_WINDOW_BYTES (32UL << 20) /* a read's PIN, at most */
#define ZC_AHEAD_WINDOWS 2	     /* windows a read asks the daemon to load ahead */
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

int tfsc_prefetch(struct tfsc_conn *c, uint64_t ino, uint64_t off, uint64_t len)
{
	struct tfs_gpu_req req = {.op = TFS_GPU_PREFETCH, .ino = ino, .off = off, .len = len};

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

/* The uid in a FUSE mount's super options ("rw,user_id=0,group_id=0,..."); -1 if none. */
static long mount_owner(const char *opts)
{
	const char *p = opts;

	while (p && *p) {
		if (strncmp(p, "user_id=", 8) == 0) {
			char *end;
			unsigned long v = strtoul(p + 8, &end, 10);

			return end > p + 8 && (*end == ',' || *end == 0) && v <= UINT32_MAX
				   ? (long)v
				   : -1;
		}
		p = strchr(p, ',');
		p = p ? p + 1 : NULL;
	}
	return -1;
}

int tfsc_find_mount(int fd, char *root, size_t rootlen, uid_t *owner)
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
		char fsroot[PATH_MAX], mnt[PATH_MAX], fstype[64], opts[PATH_MAX];
		const char *sep = strstr(line, " - ");
		long uid;

		/* After " - ": the type, the source (spaces escaped), the super options. */
		if (!sep ||
		    sscanf(line, "%*u %*u %u:%u %4095s %4095s", &maj, &min, fsroot, mnt) != 4 ||
		    sscanf(sep + 3, "%63s %*s %4095s", fstype, opts) != 2)
			continue;
		if (makedev(maj, min) != st.st_dev || strcmp(fstype, FSTYPE) != 0 ||
		    strcmp(fsroot, "/") != 0)
			continue;
		unescape(mnt);
		uid = mount_owner(opts);
		if (strlen(mnt) >= rootlen)
			ret = tfsc_fail(-ENAMETOOLONG, "mount point too long");
		else if (uid < 0)
			ret = tfsc_fail(-ENOENT, "%s: the kernel names no owner of the mount", mnt);
		else
			ret = (memcpy(root, mnt, strlen(mnt) + 1), *owner = (uid_t)uid, 0);
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
	uid_t owner; /* the FUSE mount's, as the kernel records it */
	char sock[sizeof(((struct sockaddr_un *)0)->sun_path)];
	void *arena;
	size_t arena_bytes, bs;
	uint32_t read_batch, write_batch; /* blocks asked per PIN */
	uint32_t read_ahead;		  /* blocks a read asks to load past its PIN */
	bool registered;
	bool no_prefetch;	 /* the daemon does not know PREFETCH */
	unsigned refs;		 /* calls using it; g_lock */
	bool stale;		 /* off the list; freed when refs reach 0 */
	struct tfsc_conn *idle;	 /* g_lock */
	struct tfsc_mount *next; /* g_lock */
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER; /* guards all g_ */
static struct tfsc_mount *g_mounts;
static pid_t g_pid; /* whose the list is: a forked child starts over */
/*
 * Two pinned buffers and an event for each: while one is filled by pread
 * (or written out by pwrite), the other's copy to (or from) the device
 * runs. A buffer is reused only after its event says its copy is done.
 */
struct staging {
	char *buf[2];
	void *ev[2];
};

static struct staging *g_staging[STAGING_KEEP];
static unsigned g_nstaging;

static void staging_free(struct staging *st);

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
	g_nstaging = 0;
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
	/*
	 * Reads pin in windows, so that the next windows load from the devices
	 * while this one is copied; loaded ahead, at most half the pin limit,
	 * so that what is loaded is not evicted again before its PIN.
	 */
	if (ZC_WINDOW_BYTES / m->bs && ZC_WINDOW_BYTES / m->bs < m->read_batch)
		m->read_batch = (uint32_t)(ZC_WINDOW_BYTES / m->bs);
	m->read_ahead = ZC_AHEAD_WINDOWS * m->read_batch;
	if (m->read_ahead > r->max_pins / 2)
		m->read_ahead = (uint32_t)(r->max_pins / 2);
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
 * Connect to m's socket, if the daemon's. The path comes from the gpu
 * file, and another user who could write a folder on it may have put a
 * socket of their own there, to receive the fds that GRANT sends and the
 * tensors written into their arena. So the server must run as the
 * mount's owner (the uid the kernel records for the FUSE mount, from the
 * mount call: no other user can forge it) or as root; SO_PEERCRED says
 * who listens, before anything is sent.
 */
static int mount_connect(const struct tfsc_mount *m, struct tfsc_conn **out)
{
	struct ucred cred;
	socklen_t len = sizeof(cred);
	struct tfsc_conn *c;
	int ret = tfsc_connect(m->sock, &c);

	if (ret)
		return ret;
	if (getsockopt(c->fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0)
		ret = tfsc_fail(-errno, "%s: cannot tell who serves it: %s", m->sock,
				strerror(errno));
	else if (cred.uid != m->owner && cred.uid != 0)
		ret = tfsc_fail(-EPERM,
				"%s is served by uid %u, not by the mount's owner (uid %u) or "
				"root: refused",
				m->sock, (unsigned)cred.uid, (unsigned)m->owner);
	if (ret) {
		tfsc_close(c);
		return ret;
	}
	*out = c;
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
	uid_t owner;
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

	if (tfsc_find_mount(fd, root, sizeof(root), &owner) < 0) {
		debug("fd %d is not on a tensorfs mount: %s", fd, errmsg);
		return NULL;
	}
	m = calloc(1, sizeof(*m));
	if (!m)
		return NULL;
	m->dev = st->st_dev;
	m->owner = owner;
	ret = tfsc_gpu_file(root, m->sock, sizeof(m->sock), &id);
	if (ret == 0 && !m->sock[0])
		ret = tfsc_fail(-EOPNOTSUPP, "%s shares no arena (mounted without cuda=on)", root);
	if (ret == 0)
		ret = mount_connect(m, &c);
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
	ret = mount_connect(m, &c);
	if (ret == 0)
		ret = tfsc_hello(c, NULL);
	if (ret) {
		if (ret == -EPERM)
			debug("%s", errmsg);
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
	struct staging *stg[STAGING_KEEP];
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
	nb = g_nstaging;
	memcpy(stg, g_staging, sizeof(stg));
	g_nstaging = 0;
	pthread_mutex_unlock(&g_lock);
	for (m = unused; m; m = next) {
		next = m->next;
		mount_free(m);
	}
	for (unsigned i = 0; i < nb; i++)
		staging_free(stg[i]);
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

/* ---- the fallback: pread/pwrite through two pinned buffers ---- */

static uint64_t g_direct_bytes, g_buffered_bytes; /* __atomic */

void tfsc_fallback_bytes(uint64_t *direct, uint64_t *buffered)
{
	*direct = __atomic_load_n(&g_direct_bytes, __ATOMIC_RELAXED);
	*buffered = __atomic_load_n(&g_buffered_bytes, __ATOMIC_RELAXED);
}

static void staging_free(struct staging *st)
{
	if (!st)
		return;
	for (int k = 0; k < 2; k++) {
		if (st->buf[k])
			tfsc_copy_host_free(st->buf[k]);
		if (st->ev[k])
			tfsc_copy_event_free(st->ev[k]);
	}
	free(st);
}

static struct staging *staging_get(void)
{
	struct staging *st = NULL;

	pthread_mutex_lock(&g_lock);
	forget_parent();
	if (g_nstaging)
		st = g_staging[--g_nstaging];
	pthread_mutex_unlock(&g_lock);
	if (st)
		return st;
	st = calloc(1, sizeof(*st));
	if (!st) {
		tfsc_fail(-ENOMEM, "out of memory");
		return NULL;
	}
	for (int k = 0; k < 2; k++) {
		st->buf[k] = tfsc_copy_host_alloc(FB_CHUNK_BYTES);
		if (!st->buf[k] || tfsc_copy_event_new(&st->ev[k]) < 0) {
			if (!st->buf[k])
				tfsc_fail(-ENOMEM, "cannot allocate a pinned bounce buffer");
			staging_free(st);
			return NULL;
		}
	}
	return st;
}

static void staging_put(struct staging *st)
{
	pthread_mutex_lock(&g_lock);
	if (g_nstaging < STAGING_KEEP) {
		g_staging[g_nstaging++] = st;
		st = NULL;
	}
	pthread_mutex_unlock(&g_lock);
	staging_free(st);
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
		debug("no O_DIRECT for fd %d: %s", fd, strerror(errno));
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
			debug("O_DIRECT %s refused: %s", write ? "pwrite" : "pread",
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
	staging_put(st);
	return ret;
}

/*
 * pread piece i into buffer i % 2 once the copy of piece i - 2 has left
 * it, then queue its copy to the device: the read of a piece overlaps the
 * copy of the one before.
 */
static ssize_t fb_read(int fd, uint64_t off, size_t len, char *dev, void *stream)
{
	struct staging *st = staging_get();
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
static ssize_t fb_write(int fd, uint64_t off, size_t len, const char *dev, void *stream)
{
	struct staging *st = staging_get();
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

/*
 * client_mount.c - what libtensorfs-cuda keeps per process: the mounts it
 * uses (the arena mapped and registered with the copy engine, the batch
 * sizes the daemon gave), a pool of idle connections per mount, and a
 * pool of pinned bounce buffers for the fallback; forgotten in a forked
 * child, freed by tfs_gpu_shutdown. Every connection first checks that
 * the server runs as the mount's owner or root (mount_connect), so that
 * a socket planted at that path receives nothing.
 *
 * Calls client_conn.c and the copy engine (cuda/copy.h).
 */
#include "client_int.h"
#include "copy.h"
#include "gpu_sock.h"
#include "tensorfs_cuda.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- the mounts this process uses ---- */

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER; /* guards all g_ */
static struct tfsc_mount *g_mounts;
static pid_t g_pid; /* whose the list is: a forked child starts over */
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
		tfsc_debug("copies from the arena go unregistered: %s", tfsc_errmsg);
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
struct tfsc_mount *tfsc_mount_get(int fd, const struct stat *st)
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
		tfsc_debug("fd %d is not on a tensorfs mount: %s", fd, tfsc_errmsg);
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
		tfsc_debug("falling back to pread/pwrite on %s: %s", root, tfsc_errmsg);
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
void tfsc_mount_drop(struct tfsc_mount *m)
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

void tfsc_mount_put(struct tfsc_mount *m)
{
	bool last;

	pthread_mutex_lock(&g_lock);
	last = --m->refs == 0 && m->stale;
	pthread_mutex_unlock(&g_lock);
	if (last)
		mount_free(m);
}

/* An idle connection of m, or a new one. */
int tfsc_conn_get(struct tfsc_mount *m, struct tfsc_conn **out)
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
			tfsc_debug("%s", tfsc_errmsg);
		tfsc_close(c);
		/* The socket is gone or refuses us now: as good as a lost connection. */
		return ret == -EPROTO ? ret : -ENOTCONN;
	}
	*out = c;
	return 0;
}

/* Back to the pool when it is still good; closing it releases what it pinned. */
void tfsc_conn_put(struct tfsc_mount *m, struct tfsc_conn *c, bool good)
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

struct staging *tfsc_staging_get(void)
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

void tfsc_staging_put(struct staging *st)
{
	pthread_mutex_lock(&g_lock);
	if (g_nstaging < STAGING_KEEP) {
		g_staging[g_nstaging++] = st;
		st = NULL;
	}
	pthread_mutex_unlock(&g_lock);
	staging_free(st);
}

/*
 * gpu_conn.c - the GPU server's socket and protocol: the socket's 0700
 * folder, made where no other user can rename or replace it
 * (fs_gpu_sock_dir, which first removes the folders that killed daemons
 * left: reap_sock_dirs), the accept thread (tfs-gpu) that serves only the
 * mount owner's uid and tells a refused client why before the hang-up, and one
 * thread per connection (tfs-gpu-conn) that reads each request
 * (cuda/gpu_proto.h), has gpu_pin.c do it, answers, and releases every pin
 * of its client when the client closes or dies. Every fd a client sends is
 * closed once used.
 *
 * gpu.c starts and stops it; it may call gpu_pin.c, the inode table and
 * the shared socket helpers (cuda/gpu_sock.h), and nothing of gpu.c, ctl
 * or ops.
 */
#include "gpu_int.h"
#include "log.h"
#include "../cuda/gpu_proto.h"
#include "../cuda/gpu_sock.h"

#include <assert.h>
#include <dirent.h>
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

#define SOCK_DIR_PREFIX "tensorfs-gpu-"
#define SOCK_DIR_STALE_S 60 /* a socket folder left this long, unanswered, is a dead daemon's */

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
		c->rep->status = fs_gpu_grant(c, req, fd);
		break;
	case TFS_GPU_PIN_READ:
	case TFS_GPU_PIN_WRITE:
		c->rep->status = fs_gpu_pin(c, req, req->op == TFS_GPU_PIN_WRITE);
		break;
	case TFS_GPU_RELEASE:
		c->rep->status = fs_gpu_release(c, req);
		break;
	case TFS_GPU_PREFETCH:
		c->rep->status = fs_gpu_prefetch(c, req);
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
		fs_gpu_pin_release(c, p, !p->write);
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
void fs_gpu_reap(struct fs_gpu *g, bool all)
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

void *fs_gpu_accept_main(void *arg)
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
			fs_gpu_reap(g, false);
		}
		if (n > 0 && (pf[0].revents & POLLIN))
			accept_one(g);
	}
	while (g->nrefused)
		refused_close(g, g->nrefused - 1);
	return NULL;
}

/* ---- the socket and its folder ---- */

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

/* Whether a daemon listens on NAME/sock in parent: no when refused or gone. */
static bool sock_alive(const char *parent, const char *name)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	bool alive = true;
	int fd;

	if ((size_t)snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/%s/%s", parent, name,
			     GPU_SOCK_NAME) >= sizeof(sa.sun_path))
		return true;
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return true;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 &&
	    (errno == ECONNREFUSED || errno == ENOENT))
		alive = false;
	close(fd);
	return alive;
}

/*
 * The socket folders that daemons of this user left when killed (kill -9
 * skips gpu_free): a tensorfs-gpu-* folder in parent that is ours, 0700,
 * unchanged for SOCK_DIR_STALE_S, and whose socket nobody listens on (or
 * that holds none). A live daemon answers the connect; one starting now
 * made or changed its folder within that time. Parent is a folder only we
 * or root can change (trusted_dir), so what is there stays what we saw.
 */
static void reap_sock_dirs(const char *parent)
{
	time_t now = time(NULL);
	unsigned removed = 0;
	struct dirent *de;
	DIR *d = opendir(parent);

	if (!d)
		return;
	while ((de = readdir(d))) {
		struct stat st;
		int fd;

		if (strncmp(de->d_name, SOCK_DIR_PREFIX, strlen(SOCK_DIR_PREFIX)) != 0 ||
		    fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
		    !S_ISDIR(st.st_mode) || st.st_uid != geteuid() ||
		    (st.st_mode & 07777) != 0700 || now - st.st_mtime < SOCK_DIR_STALE_S ||
		    sock_alive(parent, de->d_name))
			continue;
		fd = openat(dirfd(d), de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (fd < 0)
			continue;
		unlinkat(fd, GPU_SOCK_NAME, 0);
		close(fd);
		if (unlinkat(dirfd(d), de->d_name, AT_REMOVEDIR) == 0)
			removed++;
	}
	closedir(d);
	if (removed)
		log_info("cuda=on: removed %u GPU socket folder(s) that killed daemons left in %s",
			 removed, parent);
}

/*
 * A private folder for the socket, made 0700 by the daemon's uid in the
 * first of $XDG_RUNTIME_DIR, /run/user/UID and /tmp that no other user can
 * change (trusted_dir). An XDG_RUNTIME_DIR of another user is what su
 * without - or sudo -E leaves a root daemon: it is passed over, with a
 * warning.
 */
int fs_gpu_sock_dir(struct fs_gpu *g, char *err, size_t errlen)
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
	reap_sock_dirs(real);
	if ((size_t)snprintf(g->dir, sizeof(g->dir), "%s/" SOCK_DIR_PREFIX "XXXXXX", real) >=
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

int fs_gpu_listen(struct fs_gpu *g)
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

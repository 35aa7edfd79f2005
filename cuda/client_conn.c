/*
 * client_conn.c - one connection of libtensorfs-cuda to a daemon's gpu
 * socket and its requests (cuda/gpu_proto.h), one call each; finding the
 * tensorfs mount of an fd (by st_dev, in /proc/self/mountinfo) and the
 * socket its MOUNT/.tensorfs/gpu names; and the per-thread message that
 * tfs_gpu_error returns.
 *
 * Calls only the framing of cuda/gpu_sock.c.
 */
#include "client_int.h"
#include "gpu_sock.h"
#include "tensorfs_cuda.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

__thread char tfsc_errmsg[256];

int tfsc_fail(int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(tfsc_errmsg, sizeof(tfsc_errmsg), fmt, ap);
	va_end(ap);
	return err;
}

const char *tfs_gpu_error(void)
{
	return tfsc_errmsg;
}

void tfsc_debug(const char *fmt, ...)
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

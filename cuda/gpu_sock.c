/*
 * gpu_sock.c - sending and receiving one message of the GPU protocol, with
 * its file descriptor (see gpu_sock.h). Built into the daemon and into the
 * client library alike, so that both ends frame messages, and account for
 * the descriptors that travel with them, the same way.
 */
#include "gpu_sock.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

/*
 * Room for a few descriptors, though a message may carry one: a message
 * with two or three arrives whole and is seen to carry too many, one with
 * more arrives cut short (MSG_CTRUNC); either way all are closed.
 */
#define GPUSOCK_FDS_ROOM 4

int gpusock_send(int sock, const void *msg, size_t len, int fd)
{
	struct iovec iov = {(void *)msg, len};
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
	ssize_t n;

	if (fd >= 0) {
		struct cmsghdr *cm;

		memset(&u, 0, sizeof(u));
		m.msg_control = u.buf;
		m.msg_controllen = sizeof(u.buf);
		cm = CMSG_FIRSTHDR(&m);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(cm), &fd, sizeof(int));
	}
	do
		n = sendmsg(sock, &m, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	return (size_t)n == len ? 0 : -EMSGSIZE;
}

/* Keep the first descriptor of an SCM_RIGHTS message in *fd, close the rest; count them. */
static unsigned take_fds(struct msghdr *m, int *fd)
{
	unsigned count = 0;

	for (struct cmsghdr *cm = CMSG_FIRSTHDR(m); cm; cm = CMSG_NXTHDR(m, cm)) {
		size_t nfds;

		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS ||
		    cm->cmsg_len < CMSG_LEN(0))
			continue;
		nfds = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < nfds; i++) {
			int one;

			memcpy(&one, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
			if (count++ == 0)
				*fd = one;
			else
				close(one);
		}
	}
	return count;
}

ssize_t gpusock_recv(int sock, void *buf, size_t cap, int flags, int *fd)
{
	union {
		char buf[CMSG_SPACE(GPUSOCK_FDS_ROOM * sizeof(int))];
		struct cmsghdr align;
	} u;
	struct iovec iov = {buf, cap};
	struct msghdr m = {.msg_iov = &iov,
			   .msg_iovlen = 1,
			   .msg_control = u.buf,
			   .msg_controllen = sizeof(u.buf)};
	ssize_t n;

	*fd = -1;
	do
		n = recvmsg(sock, &m, flags | MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	if (take_fds(&m, fd) > 1 || n == 0 || (m.msg_flags & (MSG_TRUNC | MSG_CTRUNC))) {
		if (*fd >= 0)
			close(*fd);
		*fd = -1;
	}
	if (m.msg_flags & (MSG_TRUNC | MSG_CTRUNC))
		return -EMSGSIZE;
	return n;
}

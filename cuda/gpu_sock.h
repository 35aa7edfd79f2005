/*
 * gpu_sock.h - one message of the GPU protocol (gpu_proto.h) over its
 * SOCK_SEQPACKET unix socket, with at most one file descriptor passed as
 * SCM_RIGHTS. Both ends use it: the daemon (fs/gpu.c) and the client
 * library (cuda/client.c).
 *
 * The receiving side owns every descriptor the kernel installs for it, also
 * those of a message it refuses, so gpusock_recv closes all but the one it
 * hands back: a peer cannot make the receiver hold files open.
 */
#ifndef TENSORFS_GPU_SOCK_H
#define TENSORFS_GPU_SOCK_H

#include <stddef.h>
#include <sys/types.h>

/*
 * Send len bytes of msg as one message, with fd as SCM_RIGHTS when fd >= 0.
 * Returns 0, -EMSGSIZE if it went out short, or -errno.
 */
int gpusock_send(int sock, const void *msg, size_t len, int fd);

/*
 * Receive one message into buf (cap bytes); flags are recvmsg's. *fd gets
 * the descriptor that came with it, or -1. A message that carried more
 * than one keeps none: all are closed and *fd is -1; so is it whenever the
 * return is not above 0. Returns the message's
 * length, 0 at EOF, -EMSGSIZE when the message or its control data was
 * cut short (what descriptors arrived are closed), or -errno.
 */
ssize_t gpusock_recv(int sock, void *buf, size_t cap, int flags, int *fd);

#endif

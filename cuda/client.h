/*
 * client.h - the inside of libtensorfs-cuda, for its own files and for
 * the protocol tests: one connection to a daemon's gpu socket, and the
 * requests of cuda/gpu_proto.h, one call each.
 *
 * Each function returns 0 or -errno; a request's -errno may be the
 * daemon's answer (the reply is then in c->rep) or a broken connection
 * (-ENOTCONN, -EPROTO), after which the connection is useless.
 */
#ifndef TENSORFS_CUDA_CLIENT_H
#define TENSORFS_CUDA_CLIENT_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "gpu_proto.h"

struct tfsc_conn {
	int fd;
	struct tfs_gpu_rep *rep; /* the last reply, TFS_GPU_REP_MAX bytes */
	struct tfsc_conn *next;	 /* in a mount's idle list */
};

/* Connect to the socket at path. */
int tfsc_connect(const char *path, struct tfsc_conn **out);
void tfsc_close(struct tfsc_conn *c);
/* HELLO; with arena_fd, ask for the arena memfd and return it there. */
int tfsc_hello(struct tfsc_conn *c, int *arena_fd);
/* GRANT: prove the right to ino with fd, an open file of it. */
int tfsc_grant(struct tfsc_conn *c, int fd, uint64_t ino);
/* PIN_READ or PIN_WRITE of [off, off + len), at most max_blocks blocks. */
int tfsc_pin(struct tfsc_conn *c, bool write, uint64_t ino, uint64_t off, uint64_t len,
	     uint32_t max_blocks);
/* RELEASE pin; status 0 commits a write, else the copy failed. */
int tfsc_release(struct tfsc_conn *c, uint64_t pin, int status);
/* PREFETCH [off, off + len) of ino: start loading it into DRAM; rep->len says how much. */
int tfsc_prefetch(struct tfsc_conn *c, uint64_t ino, uint64_t off, uint64_t len);

/*
 * The tensorfs mount that holds file fd: its mount point in root (the
 * mount of its filesystem's root) and the uid that owns the mount (its
 * user_id=, which the kernel records at the mount call). -ENOENT when fd
 * is not on tensorfs.
 */
int tfsc_find_mount(int fd, char *root, size_t rootlen, uid_t *owner);
/*
 * What MOUNT/.tensorfs/gpu says: the socket path ("" when the daemon
 * shares no arena) and the mount's id.
 */
int tfsc_gpu_file(const char *root, char *sock, size_t socklen, uint64_t *id);

/*
 * For the tests: bytes the fallback moved with O_DIRECT and through the
 * page cache in this process, since it started.
 */
void tfsc_fallback_bytes(uint64_t *direct, uint64_t *buffered);

/* Set this thread's message for tfs_gpu_error; returns err. */
int tfsc_fail(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif

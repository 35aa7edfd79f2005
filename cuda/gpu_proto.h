/*
 * gpu_proto.h - the shared-arena protocol between the tensorfs daemon
 * (fs/gpu.c) and the GPU client library (cuda/client.c).
 *
 * With -o cuda=on the daemon listens on a unix SOCK_SEQPACKET socket whose
 * path it publishes in MOUNT/.tensorfs/gpu, in a 0700 folder of its own
 * that no other user can change. Only the mount owner's uid may connect
 * (SO_PEERCRED); the client, before it sends anything, checks the same
 * way that the server runs as the uid that owns the FUSE mount, or root. One message is one struct tfs_gpu_req, or one
 * struct tfs_gpu_rep followed by nblocks slot offsets; file descriptors
 * travel as SCM_RIGHTS. Every request has exactly one reply, in order.
 *
 *   HELLO      the reply carries the arena memfd (when want_arena), its
 *              size, the block size and the pin limits
 *   GRANT      carries an fd of a file on the mount: the connection may
 *              then pin that file for reading as O_RDONLY or O_RDWR, for
 *              writing as O_WRONLY or O_RDWR allows. An O_PATH fd, or one
 *              opened for ioctls only, proves nothing: -EBADF. PIN answers
 *              -EACCES for a file not granted.
 *   PIN_READ   pin the blocks of [off, off + len) that lie below EOF;
 *              the reply grants a prefix of the range (len 0: at EOF) and
 *              gives each block's slot offset in the arena, or
 *              TFS_GPU_HOLE for a hole, which reads as zeros
 *   PIN_WRITE  pin [off, off + len) for writing; the client copies into
 *              the slots, at the offset of the range within each block
 *   RELEASE    unpin a pin; for a write, status 0 commits it (size and
 *              mtime as a pwrite would set them), anything else says the
 *              copy failed: the range then reads as zeros
 *   PREFETCH   start loading the blocks of [off, off + len) below EOF into
 *              DRAM, pinning nothing and waiting for nothing: the reply
 *              comes at once, its len the bytes from off whose loads were
 *              issued or found cached (fewer when no slot or I/O could be
 *              had: the daemon issues the rest at the connection's next
 *              PIN or PREFETCH, so each range is asked for once). A reader
 *              sends it for the windows after the one it pins, so that
 *              device reads overlap its copies; the whole range may be in
 *              flight at once (up to a quarter of the slots). Needs the
 *              right to read, as PIN_READ. A daemon older than this op
 *              answers -EOPNOTSUPP; the client then reads without it.
 *
 * A pin belongs to its connection: no other connection can release it,
 * and all are released when the connection closes, also when the client
 * dies. A connection that holds no pin waits for its share of the pin
 * limit; one that holds some gets what is free now, or -EAGAIN. While a
 * write pin is held, a truncate of its file (or an open with O_TRUNC, a
 * fallocate, a copy_file_range into it) waits for it only a short while,
 * then fails with ETXTBSY; the pin stays the client's.
 *
 * A message carries at most one fd, and only GRANT uses it: the daemon
 * closes every fd it receives, and a message with several is taken as
 * carrying none. A client the daemon will not serve (another uid:
 * -EACCES; too many connections: -EMFILE) is answered with one reply of
 * that status, then hung up on once its first request has been read.
 */
#ifndef TENSORFS_GPU_PROTO_H
#define TENSORFS_GPU_PROTO_H

#include <stdint.h>

#define TFS_GPU_MAGIC 0x54465347U /* "TFSG" */
#define TFS_GPU_VERSION 1
#define TFS_GPU_MAX_BLOCKS 1024 /* slots in one PIN reply */
#define TFS_GPU_HOLE UINT64_MAX

enum tfs_gpu_op {
	TFS_GPU_HELLO = 1,
	TFS_GPU_GRANT = 2,
	TFS_GPU_PIN_READ = 3,
	TFS_GPU_PIN_WRITE = 4,
	TFS_GPU_RELEASE = 5,
	TFS_GPU_PREFETCH = 6,
};

struct tfs_gpu_req {
	uint32_t magic;
	uint16_t version;
	uint16_t op;
	uint64_t ino;	     /* GRANT, PIN, PREFETCH: the file's inode number (st_ino) */
	uint64_t off, len;   /* PIN, PREFETCH: the byte range */
	uint64_t pin;	     /* RELEASE: which */
	int32_t status;	     /* RELEASE: 0, or the copy's -errno */
	uint32_t max_blocks; /* PIN: grant at most this many blocks */
	uint32_t want_arena; /* HELLO: send the arena fd */
	uint32_t pad;
};

struct tfs_gpu_rep {
	uint32_t magic;
	uint16_t version;
	uint16_t op;
	int32_t status;	      /* 0 or -errno */
	uint32_t nblocks;     /* PIN: slot offsets that follow */
	uint64_t pin;	      /* PIN: the handle for RELEASE */
	uint64_t off, len;    /* PIN: the range granted; PREFETCH: the range issued */
	uint64_t size;	      /* PIN_READ: the file's size */
	uint64_t arena_bytes; /* HELLO */
	uint64_t block_size;  /* HELLO */
	uint64_t mount_id;    /* HELLO: the "id" of MOUNT/.tensorfs/gpu */
	uint64_t max_pins;    /* HELLO: blocks all clients may pin at once */
	uint64_t max_write_pins;
	uint64_t slot[]; /* PIN: arena offset of each block, or TFS_GPU_HOLE */
};

#define TFS_GPU_REP_MAX (sizeof(struct tfs_gpu_rep) + TFS_GPU_MAX_BLOCKS * sizeof(uint64_t))

#endif

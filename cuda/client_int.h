/*
 * client_int.h - what the files of libtensorfs-cuda share among
 * themselves: its constants, the state it keeps per mount and per
 * process, and the calls from one file to another. Neither the protocol
 * tests (client.h) nor the library's users (tensorfs_cuda.h) see it.
 *
 * The files, from the top down; each calls only those below it:
 *   client.c           the calls: checks, zero-copy, the choice of path
 *   client_fallback.c  pread/pwrite through two pinned bounce buffers
 *   client_mount.c     the mounts, idle connections and bounce buffers kept
 *   client_conn.c      one connection and its requests; finding the mount
 */
#ifndef TENSORFS_CUDA_CLIENT_INT_H
#define TENSORFS_CUDA_CLIENT_INT_H

#include "client.h"

#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/un.h>

#define FB_CHUNK_BYTES (8UL << 20)   /* a fallback pread or pwrite, at most */
#define FB_DIRECT_MIN (1UL << 20)    /* smaller transfers go through the page cache */
#define FB_DIRECT_ALIGN 4096UL	     /* what O_DIRECT asks of offsets, lengths, buffers */
#define STAGING_KEEP 4		     /* idle buffer pairs kept */
#define ZC_WINDOW_BYTES (32UL << 20) /* a read's PIN, at most */
#define ZC_AHEAD_WINDOWS 2	     /* windows a read asks the daemon to load ahead */
#define GPU_FILE "/.tensorfs/gpu"
#define FSTYPE "fuse.tensorfs"

/* client_conn.c: the message tfs_gpu_error gives, this thread's. */
extern __thread char tfsc_errmsg[256];
/* Why a call falls back, for TENSORFS_CUDA_DEBUG=1. */
void tfsc_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

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

/*
 * Two pinned buffers and an event for each: while one is filled by pread
 * (or written out by pwrite), the other's copy to (or from) the device
 * runs. A buffer is reused only after its event says its copy is done.
 */
struct staging {
	char *buf[2];
	void *ev[2];
};

/* client_mount.c */
/* The shared arena of the mount that holds fd, referenced; NULL: calls on fd fall back. */
struct tfsc_mount *tfsc_mount_get(int fd, const struct stat *st);
/* Take m off the list: its daemon is gone. Freed once no call uses it. */
void tfsc_mount_drop(struct tfsc_mount *m);
/* Give back the reference mount_get took. */
void tfsc_mount_put(struct tfsc_mount *m);
/* An idle connection of m, or a new one. */
int tfsc_conn_get(struct tfsc_mount *m, struct tfsc_conn **out);
/* Back to the pool when it is still good; closing it releases what it pinned. */
void tfsc_conn_put(struct tfsc_mount *m, struct tfsc_conn *c, bool good);
/* A pair of bounce buffers, from the pool or new; NULL with the message set. */
struct staging *tfsc_staging_get(void);
void tfsc_staging_put(struct staging *st);

/* client_fallback.c: the call through pread/pwrite; the bytes moved, or -errno. */
ssize_t tfsc_fb_read(int fd, uint64_t off, size_t len, char *dev, void *stream);
ssize_t tfsc_fb_write(int fd, uint64_t off, size_t len, const char *dev, void *stream);

#endif

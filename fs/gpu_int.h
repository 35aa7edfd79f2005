/*
 * gpu_int.h - what the files of the GPU server (gpu.c, gpu_conn.c,
 * gpu_pin.c) share, for them only: the server's state, a connection and
 * its pins, and the calls from one file to the next.
 */
#ifndef TENSORFS_GPU_INT_H
#define TENSORFS_GPU_INT_H

#include "fs.h"
#include "../cuda/gpu_proto.h"

#include <limits.h>
#include <sys/un.h>

#define GPU_MAX_CONNS 64
#define GPU_GRANTS 64 /* files one connection may use, most recent kept */
#define GPU_LISTEN_BACKLOG 16
#define GPU_REFUSED_MAX 16	  /* refused clients whose request is awaited */
#define GPU_REFUSE_LINGER_MS 1000 /* how long it is awaited */
#define GPU_SOCK_NAME "sock"
#define GPU_CU_PORTABLE 0x01 /* CU_MEMHOSTREGISTER_PORTABLE */
#define WAKE_STOP 's'
#define WAKE_REAP 'r'

/* One PIN: blocks [first, first + n) of ino, for bytes [off, off + len). */
struct gpu_pin {
	uint64_t id;
	bool write;
	uint64_t ino, off, len, first;
	uint32_t n;
	struct fs_inode *in; /* write: held, with in->io shared, until release */
	struct tb_ref *refs; /* ref.e NULL: a hole */
	struct gpu_pin *next;
};

struct gpu_grant {
	uint64_t ino;
	bool read, write;
};

struct gpu_conn {
	struct fs_gpu *g;
	int fd;
	pthread_t thread;
	bool done; /* the thread has finished; g->lock */
	/* the connection thread's own */
	struct gpu_pin *pins;
	uint64_t npinned, next_pin;
	struct gpu_grant grants[GPU_GRANTS];
	unsigned ngrants, grant_next;
	/* what PREFETCH asked for and is not yet issued: blocks [pf_next, pf_end) of pf_ino */
	uint64_t pf_ino, pf_next, pf_end;
	struct tfs_gpu_rep *rep; /* TFS_GPU_REP_MAX bytes */
	struct gpu_conn *next;
};

/* libcuda, loaded at run time when cuda=on */
typedef int (*cu_init_fn)(unsigned);
typedef int (*cu_count_fn)(int *);
typedef int (*cu_device_fn)(int *, int);
typedef int (*cu_retain_fn)(void **, int);
typedef int (*cu_release_fn)(int);
typedef int (*cu_push_fn)(void *);
typedef int (*cu_pop_fn)(void **);
typedef int (*cu_register_fn)(void *, size_t, unsigned);
typedef int (*cu_unregister_fn)(void *);
typedef int (*cu_errstr_fn)(int, const char **);

struct gpu_cuda {
	void *lib;
	int dev;
	void *ctx;
	bool registered;
	char why[160]; /* what happened, for the log and the gpu file */
	cu_release_fn release;
	cu_push_fn push;
	cu_pop_fn pop;
	cu_unregister_fn unregister;
};

/* A refused connection, answered, kept until its request is read (refuse). */
struct gpu_refused {
	int fd;
	uint64_t until_ms; /* fs_monotonic_ms */
};

struct fs_gpu {
	struct fs *fs;
	struct fuse_session *se;
	char dir[PATH_MAX];
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	int lfd;
	int wake_pipe[2]; /* to the accept thread: WAKE_STOP, or WAKE_REAP */
	pthread_t thread;
	bool thread_started;
	uint64_t id;
	uid_t owner;
	struct tb_arena_info arena;
	size_t bs;
	uint64_t max_pins, max_wpins;
	struct gpu_cuda cu;
	/* the accept thread's own */
	struct gpu_refused refused_q[GPU_REFUSED_MAX];
	unsigned nrefused;

	pthread_mutex_t lock; /* guards all below */
	pthread_cond_t cv;    /* pins were released, or stopping */
	struct gpu_conn *conns;
	unsigned nconns; /* threads not yet joined */
	unsigned nlive;	 /* connections still open */
	uint64_t pinned, wpinned;
	bool stopping;
	bool have_dev;
	dev_t mnt_dev;
	uint64_t pins_total, read_bytes, write_bytes, refused, failed_writes;
	uint64_t prefetches, prefetch_bytes; /* PREFETCH requests that issued some, and bytes */
	long refuse_log_sec;
};

/* gpu_conn.c: the socket, and the threads that accept and serve connections */
void fs_gpu_reap(struct fs_gpu *g, bool all);
void *fs_gpu_accept_main(void *arg);
int fs_gpu_sock_dir(struct fs_gpu *g, char *err, size_t errlen);
int fs_gpu_listen(struct fs_gpu *g);

/* gpu_pin.c: what a connection asks for: grants, pins, their release, prefetches */
int fs_gpu_grant(struct gpu_conn *c, const struct tfs_gpu_req *req, int fd);
int fs_gpu_pin(struct gpu_conn *c, const struct tfs_gpu_req *req, bool write);
void fs_gpu_pin_release(struct gpu_conn *c, struct gpu_pin *p, bool ok);
int fs_gpu_prefetch(struct gpu_conn *c, const struct tfs_gpu_req *req);
int fs_gpu_release(struct gpu_conn *c, const struct tfs_gpu_req *req);

#endif

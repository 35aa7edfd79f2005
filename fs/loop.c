/*
 * loop.c - the threads that take requests from /dev/fuse.
 *
 * libfuse's own loop reads each request into one buffer, so a write's
 * bytes reach the DRAM tier through a second copy, from that buffer into
 * the block's slot: on the swap folder's write phase that copy was a
 * seventh of all CPU time (c4272ef). Here each thread reads
 * with readv: the request's header and write arguments into its buffer, the
 * bytes after them into a spare slot of the DRAM arena (tb_spare_take),
 * and anything longer into the buffer's rest. A write of one whole block
 * then swaps that slot with the block's (tb_swap_slot): the kernel's copy
 * from the writer is the only one. Any other write copies from the spare
 * slot, as it would have from the buffer; any other request is put back
 * together in the buffer first. Either way libfuse parses and dispatches
 * it (fuse_session_process_buf), and fs_write finds the bytes through
 * fs_landing. A write that must wait for room does not wait here: it is
 * parked (defer.c), and one received into the spare slot takes the slot
 * with it, leaving the thread another spare in its place.
 *
 * The threads read the session's descriptor, as a reply goes back on the
 * descriptor its request came from. As in libfuse's loop, the signals its
 * handlers take go to the thread that waits in fs_loop. On the session's
 * exit (such a signal, or the kernel's ENODEV at unmount) that thread
 * wakes the others out of readv with FS_SIGWAKE (fs.h), whose handler
 * does nothing, until each has seen the exit and ended: never in the
 * middle of a request. (libfuse cancels its threads instead; cancelled,
 * ours would unwind frames that the address sanitizer's build poisons.)
 */
#include "fs.h"
#include "log.h"

#include <errno.h>
#include <linux/fuse.h>
#include <semaphore.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>

/* What precedes a write's bytes: the request header and its arguments. */
#define WRITE_HDR (sizeof(struct fuse_in_header) + sizeof(struct fuse_write_in))
/* The largest request: a whole write, or setxattr's 64 KiB value, and headers. */
#define REQ_BUF (FS_MAX_WRITE + 0x10000)
#define WAKE_NS 5000000L /* between wake-ups of a thread that has not ended */
#define BUSY_LOG_WAKES 2000 /* 10 s of them: the exit waits on a stuck request */

__thread struct fs_landing *fs_landing;
__thread uint32_t fs_write_flags;

struct loop;

struct worker {
	struct loop *l;
	pthread_t tid;
	bool started;
	bool ended; /* atomic */
	char *buf;	    /* REQ_BUF bytes */
	uint32_t spare;	    /* its slot of the arena, when has_spare */
	bool has_spare;
	struct fs_landing land;
};

struct loop {
	struct fs *fs;
	struct fuse_session *se;
	int fd;
	sem_t finish;
	int error;
};

/* One request into w->buf, a write's bytes into its spare slot. Returns its length or -errno. */
static ssize_t receive(struct worker *w)
{
	struct iovec iov[3];
	int n = 0;
	ssize_t res;
	int err;

	if (w->has_spare) {
		iov[n++] = (struct iovec){w->buf, WRITE_HDR};
		iov[n++] = (struct iovec){tb_slot_data(w->l->fs->tb, w->spare), w->l->fs->bs};
		iov[n++] = (struct iovec){w->buf + WRITE_HDR + w->l->fs->bs,
					  REQ_BUF - WRITE_HDR - w->l->fs->bs};
	} else {
		iov[n++] = (struct iovec){w->buf, REQ_BUF};
	}
	res = readv(w->l->fd, iov, n);
	err = errno;
	return res < 0 ? -err : res;
}

/*
 * Where the bytes after the header are: a write's stay in the spare slot
 * (fs_landing says so); any other request's are copied back behind its
 * header, so that libfuse sees it whole.
 */
static struct fs_landing *place(struct worker *w, size_t len)
{
	const struct fuse_in_header *in = (const struct fuse_in_header *)w->buf;
	const struct fuse_write_in *arg = (const struct fuse_write_in *)(in + 1);
	size_t bs = w->l->fs->bs;

	if (!w->has_spare || len <= WRITE_HDR)
		return NULL;
	if (in->opcode == FUSE_WRITE && in->len == len && arg->size == len - WRITE_HDR &&
	    arg->size <= bs) {
		w->land.expect = w->buf + WRITE_HDR;
		w->land.data = tb_slot_data(w->l->fs->tb, w->spare);
		w->land.size = arg->size;
		w->land.slot = &w->spare;
		return &w->land;
	}
	memcpy(w->buf + WRITE_HDR, tb_slot_data(w->l->fs->tb, w->spare),
	       len - WRITE_HDR < bs ? len - WRITE_HDR : bs);
	return NULL;
}

/* A write's flags: FUSE_WRITE_KILL_SUIDGID, which libfuse does not pass on. */
static uint32_t write_flags(const struct worker *w, size_t len)
{
	const struct fuse_in_header *in = (const struct fuse_in_header *)w->buf;
	const struct fuse_write_in *arg = (const struct fuse_write_in *)(in + 1);

	return in->opcode == FUSE_WRITE && len >= WRITE_HDR ? arg->write_flags : 0;
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	struct loop *l = w->l;
	sigset_t wake;

	pthread_setname_np(pthread_self(), "tfs-fuse");
	sigemptyset(&wake);
	sigaddset(&wake, FS_SIGWAKE);
	pthread_sigmask(SIG_UNBLOCK, &wake, NULL);
	while (!fuse_session_exited(l->se)) {
		ssize_t res = receive(w);
		struct fuse_buf fbuf = {0};

		if (res == -EINTR || res == -EAGAIN || res == -ENOENT)
			continue; /* ENOENT: the request was interrupted before it was read */
		if (res == -ENODEV) {
			fuse_session_exit(l->se); /* unmounted */
			break;
		}
		if (res < 0 || (size_t)res < sizeof(struct fuse_in_header)) {
			log_err("reading /dev/fuse: %s",
				res < 0 ? strerror((int)-res) : "short read");
			__atomic_store_n(&l->error, res < 0 ? (int)res : -EIO, __ATOMIC_RELAXED);
			fuse_session_exit(l->se);
			break;
		}
		fbuf.mem = w->buf;
		fbuf.size = (size_t)res;
		fs_landing = place(w, (size_t)res);
		fs_write_flags = write_flags(w, (size_t)res);
		fuse_session_process_buf(l->se, &fbuf);
		fs_landing = NULL;
		fs_write_flags = 0;
	}
	__atomic_store_n(&w->ended, true, __ATOMIC_RELEASE);
	sem_post(&l->finish);
	return NULL;
}

static void wake(int sig)
{
	(void)sig; /* only to end a readv with EINTR */
}

/*
 * Serve the session with nthreads threads until it exits. Returns 0, or
 * -errno when reading the device failed.
 */
int fs_loop(struct fs *fs, struct fuse_session *se, unsigned nthreads)
{
	struct loop l = {.fs = fs, .se = se, .fd = fuse_session_fd(se)};
	struct worker *w = calloc(nthreads, sizeof(*w));
	struct sigaction sa = {.sa_handler = wake}; /* no SA_RESTART: readv ends */
	sigset_t block, old;
	unsigned started = 0;

	if (!w)
		return -ENOMEM;
	if (sem_init(&l.finish, 0, 0) != 0) {
		free(w);
		return -errno;
	}
	sigemptyset(&sa.sa_mask);
	if (sigaction(FS_SIGWAKE, &sa, NULL) != 0) {
		sem_destroy(&l.finish);
		free(w);
		return -errno;
	}
	/* The signals libfuse's handlers take go to this thread, not the workers. */
	sigemptyset(&block);
	sigaddset(&block, SIGTERM);
	sigaddset(&block, SIGINT);
	sigaddset(&block, SIGHUP);
	sigaddset(&block, SIGQUIT);
	pthread_sigmask(SIG_BLOCK, &block, &old);
	/* Its threads take the writes that wait for room: they start first and end last. */
	if (fs_defer_start(fs, nthreads) != 0)
		log_warn("no threads for writes that wait for room: they wait in the ones that "
			 "serve /dev/fuse");
	for (unsigned i = 0; i < nthreads; i++) {
		w[i].l = &l;
		w[i].buf = malloc(REQ_BUF);
		if (!w[i].buf)
			break;
		/* Spares exist for a block a single write can fill (spare_slots). */
		w[i].has_spare = tb_spare_take(fs->tb, &w[i].spare) == 0;
		if (pthread_create(&w[i].tid, NULL, worker_main, &w[i]) != 0)
			break;
		w[i].started = true;
		started++;
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (!started) {
		log_err("cannot start a thread to serve /dev/fuse");
		l.error = -EAGAIN;
	} else {
		while (!fuse_session_exited(se))
			sem_wait(&l.finish);
	}
	for (unsigned i = 0, waits = 0; i < nthreads; i++) {
		/* Woken again until it ends: the first may come before its readv. */
		while (w[i].started && !__atomic_load_n(&w[i].ended, __ATOMIC_ACQUIRE)) {
			struct timespec ts = {0, WAKE_NS};

			pthread_kill(w[i].tid, FS_SIGWAKE);
			nanosleep(&ts, NULL);
			/* A thread inside a request that never ends holds the exit: say so, once. */
			if (++waits == BUSY_LOG_WAKES)
				log_err("exiting: a request thread is still inside a request after %d s; "
					"waiting for it (SIGKILL ends the daemon, losing what is not written back)",
					(int)(BUSY_LOG_WAKES * (WAKE_NS / 1000000L) / 1000));
		}
	}
	for (unsigned i = 0; i < nthreads; i++) {
		if (w[i].started)
			pthread_join(w[i].tid, NULL);
		if (w[i].has_spare)
			tb_spare_give(fs->tb, w[i].spare);
		free(w[i].buf);
	}
	fs_defer_stop(fs); /* the writes they parked are answered */
	sem_destroy(&l.finish);
	free(w);
	return l.error;
}

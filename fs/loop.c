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
 * The threads start before the mount (fs_loop_start), so that a daemon
 * that cannot make them (a cgroup's pids.max, say) fails with an error
 * before it mounts, rather than mounting, saying so, and then going away;
 * they read nothing until fs_loop_run gives the word after the mount.
 * They read the session's descriptor, as a reply goes back on the
 * descriptor its request came from. As in libfuse's loop, the signals its
 * handlers take go to the thread that waits in fs_loop_run. On the session's
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

struct fs_loop;

struct worker {
	struct fs_loop *l;
	pthread_t tid;
	bool started;
	bool ended; /* atomic */
	char *buf;	    /* REQ_BUF bytes */
	uint32_t spare;	    /* its slot of the arena, when has_spare */
	bool has_spare;
	struct fs_landing land;
};

struct fs_loop {
	struct fs *fs;
	struct fuse_session *se;
	int fd;		    /* the session's, set by fs_loop_run before go */
	struct worker *w;   /* nthreads of them, started of them running */
	unsigned nthreads, started;
	sem_t go;	    /* posted once per thread: the mount is made, or cancelled */
	bool cancelled;	    /* atomic: the mount failed, end without reading */
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

/* Wait for fs_loop_run's word; false: the loop was cancelled (the mount failed). */
static bool await_go(struct fs_loop *l)
{
	while (sem_wait(&l->go) != 0)
		; /* EINTR: FS_SIGWAKE */
	return !__atomic_load_n(&l->cancelled, __ATOMIC_ACQUIRE);
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	struct fs_loop *l = w->l;
	sigset_t wake;

	pthread_setname_np(pthread_self(), "tfs-fuse");
	sigemptyset(&wake);
	sigaddset(&wake, FS_SIGWAKE);
	pthread_sigmask(SIG_UNBLOCK, &wake, NULL);
	if (!await_go(l))
		goto out;
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
out:
	__atomic_store_n(&w->ended, true, __ATOMIC_RELEASE);
	sem_post(&l->finish);
	return NULL;
}

static void wake(int sig)
{
	(void)sig; /* only to end a readv with EINTR */
}

/* End every started thread (woken out of its read until it has), then free l. */
static void loop_end(struct fs_loop *l)
{
	struct worker *w = l->w;

	for (unsigned i = 0, waits = 0; i < l->nthreads; i++) {
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
	for (unsigned i = 0; i < l->nthreads; i++) {
		if (w[i].started)
			pthread_join(w[i].tid, NULL);
		if (w[i].has_spare)
			tb_spare_give(l->fs->tb, w[i].spare);
		free(w[i].buf);
	}
	fs_defer_stop(l->fs); /* the writes they parked are answered */
	sem_destroy(&l->go);
	sem_destroy(&l->finish);
	free(w);
	free(l);
}

int fs_loop_start(struct fs *fs, struct fuse_session *se, unsigned nthreads, struct fs_loop **out)
{
	struct fs_loop *l = calloc(1, sizeof(*l));
	struct sigaction sa = {.sa_handler = wake}; /* no SA_RESTART: readv ends */
	sigset_t block, old;
	int ret = 0;

	*out = NULL;
	if (!l || !(l->w = calloc(nthreads, sizeof(*l->w)))) {
		free(l);
		return -ENOMEM;
	}
	l->fs = fs;
	l->se = se;
	l->fd = -1;
	l->nthreads = nthreads;
	if (sem_init(&l->finish, 0, 0) != 0 || sem_init(&l->go, 0, 0) != 0) {
		free(l->w);
		free(l);
		return -ENOMEM;
	}
	sigemptyset(&sa.sa_mask);
	if (sigaction(FS_SIGWAKE, &sa, NULL) != 0) {
		ret = -errno;
		loop_end(l);
		return ret;
	}
	/* The signals libfuse's handlers take go to the thread in fs_loop_run, not the workers. */
	sigemptyset(&block);
	sigaddset(&block, SIGTERM);
	sigaddset(&block, SIGINT);
	sigaddset(&block, SIGHUP);
	sigaddset(&block, SIGQUIT);
	pthread_sigmask(SIG_BLOCK, &block, &old);
	for (unsigned i = 0; i < nthreads; i++) {
		struct worker *w = &l->w[i];

		w->l = l;
		w->buf = malloc(REQ_BUF);
		if (!w->buf) {
			ret = -ENOMEM;
			break;
		}
		/* Spares exist for a block a single write can fill (spare_slots). */
		w->has_spare = tb_spare_take(fs->tb, &w->spare) == 0;
		ret = -pthread_create(&w->tid, NULL, worker_main, w);
		if (ret)
			break;
		w->started = true;
		l->started++;
	}
	if (!l->started) {
		pthread_sigmask(SIG_SETMASK, &old, NULL);
		__atomic_store_n(&l->cancelled, true, __ATOMIC_RELEASE);
		loop_end(l);
		return ret ? ret : -EAGAIN;
	}
	if (l->started < nthreads)
		log_warn("started %u of %u threads that serve /dev/fuse: %s", l->started, nthreads,
			 strerror(-ret));
	/* The pool of writes that wait for room, after the serving threads: it may do without. */
	if (fs_defer_start(fs, nthreads) != 0)
		log_warn("no threads for writes that wait for room: they wait in the ones that "
			 "serve /dev/fuse");
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	*out = l;
	return 0;
}

void fs_loop_cancel(struct fs_loop *l)
{
	if (!l)
		return;
	__atomic_store_n(&l->cancelled, true, __ATOMIC_RELEASE);
	for (unsigned i = 0; i < l->started; i++)
		sem_post(&l->go);
	loop_end(l);
}

int fs_loop_run(struct fs_loop *l)
{
	int ret;

	l->fd = fuse_session_fd(l->se);
	for (unsigned i = 0; i < l->started; i++)
		sem_post(&l->go); /* after fd: sem_post orders it before their reads */
	while (!fuse_session_exited(l->se))
		sem_wait(&l->finish);
	ret = __atomic_load_n(&l->error, __ATOMIC_RELAXED);
	loop_end(l);
	return ret;
}

/*
 * defer.c - writes that wait for dirty room, and fsyncs, off the FUSE workers.
 *
 * The threads that read /dev/fuse (loop.c) are few (threads=). A write
 * that found the dirty budget full used to wait in one of them until
 * write-back made room, so that one user's writers against a slow device
 * held every worker, and another user's stat or ls waited seconds behind
 * them. Now fs_write tries the block store without waiting (struct
 * tb_writer's nowait) and, where it would wait, parks the rest of the
 * request here and goes back to /dev/fuse; a thread of this pool writes it
 * once there is room and answers it (FUSE's low-level API takes a reply
 * from any thread). Its bytes stay valid: a write received into a spare
 * slot of the arena (loop.c) takes the slot with it, and the thread that
 * received it another spare; any other is copied.
 * An fsync, which waits for its file's write-back and a sync point, is
 * always answered from here.
 *
 * The pool has a thread per worker. They take parked requests user by user,
 * in turn, a user running at most its share of the threads while others
 * have writes parked; in the block store the dirty budget is shared the
 * same way (tiers/fair.c). The bytes parked are bounded by the dirty
 * budget, and each user's by its share of that bound: past it, a write
 * waits in its worker as before.
 *
 * ops_data.c parks here; the pool goes on with a parked request through
 * wjob.c (fs_write_resume, fs_write_end, fs_fsync_run) and never calls the
 * ops. loop.c starts and stops it.
 */
#include "fs.h"
#include "log.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DEFER_FLOOR_DIV 16 /* a user's share of the parked bytes: never under 1/16 of the bound */
#define BUSY_LOG_S 10	   /* the exit waits on a request this long, then says so (as loop.c) */

struct job {
	struct job *next;
	bool fsync; /* an fsync of w.in, answered to w.req; else the write w */
	struct fs_wjob w;
	uint32_t slot; /* the spare slot that holds w.data, when w.slot */
	char *copy;    /* else w.data's own copy */
	bool partial;  /* some of the request was written before it was parked */
};

/* A user with writes parked or running. */
struct user {
	uint32_t uid;
	struct job *head, *tail;
	unsigned running; /* its jobs in the pool's threads */
	uint64_t bytes;	  /* of its jobs, parked or running */
};

struct fs_defer {
	struct fs *fs;
	pthread_mutex_t lock; /* guards all below */
	pthread_cond_t cv;    /* a job was parked or ended, or the pool stops */
	struct user *users;
	unsigned nusers, cap_users;
	unsigned turn;	 /* the user whose turn is next */
	uint64_t parked; /* jobs not yet taken */
	uint64_t bytes;	 /* of every job, parked or running */
	uint64_t max_bytes;
	pthread_t *tid;
	unsigned nthreads, started;
	bool stop;
};

static struct user *user_find(struct fs_defer *d, uint32_t uid)
{
	for (unsigned i = 0; i < d->nusers; i++)
		if (d->users[i].uid == uid)
			return &d->users[i];
	return NULL;
}

/* uid's entry, made if it has none; NULL when out of memory. Lock held. */
static struct user *user_get(struct fs_defer *d, uint32_t uid)
{
	struct user *u = user_find(d, uid);

	if (u)
		return u;
	if (d->nusers == d->cap_users) {
		unsigned cap = d->cap_users ? 2 * d->cap_users : 8;
		struct user *n = realloc(d->users, cap * sizeof(*n));

		if (!n)
			return NULL;
		d->users = n;
		d->cap_users = cap;
	}
	u = &d->users[d->nusers++];
	memset(u, 0, sizeof(*u));
	u->uid = uid;
	return u;
}

/* Forget u once it has nothing parked or running. Lock held. */
static void user_put(struct fs_defer *d, struct user *u)
{
	if (u->head || u->running || u->bytes)
		return;
	*u = d->users[--d->nusers];
	if (d->turn >= d->nusers)
		d->turn = 0;
}

/* Whether u may park len more bytes: within the bound, and within its share of it. */
static bool may_park(const struct fs_defer *d, const struct user *u, uint64_t len)
{
	unsigned n = 0;
	uint64_t share;

	if (d->bytes + len > d->max_bytes)
		return false;
	for (unsigned i = 0; i < d->nusers; i++)
		if (d->users[i].bytes || &d->users[i] == u)
			n++;
	share = d->max_bytes / (n ? n : 1);
	if (share < d->max_bytes / DEFER_FLOOR_DIV)
		share = d->max_bytes / DEFER_FLOOR_DIV;
	return u->bytes + len <= share;
}

/*
 * The next job to write: users in turn, each running at most its share of
 * the threads while others have jobs (any at the stop). Lock held.
 */
static struct job *pick(struct fs_defer *d, uint32_t *uid)
{
	unsigned active = 0, share;

	for (unsigned i = 0; i < d->nusers; i++)
		if (d->users[i].head || d->users[i].running)
			active++;
	share = active ? d->nthreads / active : d->nthreads;
	if (share < 1)
		share = 1;
	for (unsigned k = 0; k < d->nusers; k++) {
		unsigned i = (d->turn + k) % d->nusers;
		struct user *u = &d->users[i];
		struct job *j = u->head;

		if (!j || (u->running >= share && !d->stop))
			continue;
		u->head = j->next;
		if (!u->head)
			u->tail = NULL;
		u->running++;
		d->parked--;
		d->turn = (i + 1) % d->nusers;
		*uid = u->uid;
		return j;
	}
	return NULL;
}

/* Do j and answer it: with nothing of it done and its caller gone, EINTR. */
static void run(struct fs_defer *d, struct job *j)
{
	struct fs *fs = d->fs;
	bool gone = !j->partial && fuse_req_interrupted(j->w.req);

	if (j->fsync)
		fs_fsync_run(fs, j->w.req, j->w.in, gone ? -EINTR : 0);
	else if (gone)
		fs_write_end(fs, &j->w, -EINTR);
	else
		fs_write_resume(fs, &j->w);
	if (j->w.slot)
		tb_spare_give(fs->tb, j->slot); /* the block's old slot, if they swapped */
	free(j->copy);
	free(j);
}

static void *defer_main(void *arg)
{
	struct fs_defer *d = arg;

	pthread_setname_np(pthread_self(), "tfs-defer");
	pthread_mutex_lock(&d->lock);
	for (;;) {
		struct job *j;
		struct user *u;
		uint32_t uid;
		uint64_t len;

		while (!(j = pick(d, &uid)) && !(d->stop && !d->parked))
			pthread_cond_wait(&d->cv, &d->lock);
		if (!j)
			break;
		len = j->w.len;
		pthread_mutex_unlock(&d->lock);
		run(d, j);
		pthread_mutex_lock(&d->lock);
		u = user_find(d, uid);
		u->running--;
		u->bytes -= len;
		d->bytes -= len;
		user_put(d, u);
		if (d->parked)
			pthread_cond_broadcast(
			    &d->cv); /* a user under its share of the threads now */
	}
	pthread_mutex_unlock(&d->lock);
	return NULL;
}

/* Queue j as u's last. Lock held. */
static void enqueue(struct fs_defer *d, struct user *u, struct job *j)
{
	if (u->tail)
		u->tail->next = j;
	else
		u->head = j;
	u->tail = j;
	d->parked++;
	pthread_cond_signal(&d->cv);
}

int fs_defer_write(struct fs *fs, struct fs_wjob *w)
{
	struct fs_defer *d = fs->defer;
	uint64_t left = w->len - w->done;
	uint32_t fresh;
	struct user *u;
	struct job *j;
	int ret = 0;

	if (!d || !w->req)
		return -ENOSYS;
	j = calloc(1, sizeof(*j));
	if (!j)
		return -ENOMEM;
	pthread_mutex_lock(&d->lock);
	u = user_get(d, w->who.uid);
	if (!u) {
		ret = -ENOMEM;
	} else if (!may_park(d, u, left)) {
		ret = -EAGAIN;
		user_put(d, u);
	} else {
		u->bytes += left; /* held for it while the bytes move, outside the lock */
		d->bytes += left;
	}
	pthread_mutex_unlock(&d->lock);
	if (ret) {
		free(j);
		return ret;
	}

	j->w = *w;
	if (w->slot && w->done == 0 && tb_spare_take(fs->tb, &fresh) == 0) {
		/* Received into a spare slot: the slot goes with it, no copy; the thread has
		 * another. */
		j->slot = *w->slot;
		j->w.slot = &j->slot;
		*w->slot = fresh;
	} else {
		j->copy = malloc(left ? left : 1);
		if (!j->copy) {
			pthread_mutex_lock(&d->lock);
			u = user_find(d, w->who.uid);
			u->bytes -= left;
			d->bytes -= left;
			user_put(d, u);
			pthread_mutex_unlock(&d->lock);
			free(j);
			return -ENOMEM;
		}
		memcpy(j->copy, w->data + w->done, left);
		j->partial = w->done > 0;
		j->w.data = j->copy;
		j->w.off += w->done;
		j->w.len = left;
		j->w.done = 0;
		j->w.slot = NULL;
	}
	j->w.who.nowait = false;

	pthread_mutex_lock(&d->lock);
	enqueue(d, user_find(d, w->who.uid), j);
	pthread_mutex_unlock(&d->lock);
	FS_COUNT(fs, writes_parked, 1);
	return 0;
}

int fs_defer_fsync(struct fs *fs, fuse_req_t req, struct fs_inode *in)
{
	struct fs_defer *d = fs->defer;
	struct job *j;
	struct user *u;

	if (!d)
		return -ENOSYS;
	j = calloc(1, sizeof(*j));
	if (!j)
		return -ENOMEM;
	j->fsync = true;
	j->w.req = req;
	j->w.in = in;
	j->w.who.uid = fuse_req_ctx(req)->uid;
	pthread_mutex_lock(&d->lock);
	u = user_get(d, j->w.who.uid);
	if (u)
		enqueue(d, u, j);
	pthread_mutex_unlock(&d->lock);
	if (!u) {
		free(j);
		return -ENOMEM;
	}
	return 0;
}

int fs_defer_start(struct fs *fs, unsigned nthreads)
{
	struct fs_defer *d = calloc(1, sizeof(*d));
	struct tb_stats *st = calloc(1, sizeof(*st));
	int ret = 0;

	if (!d || !st || !(d->tid = calloc(nthreads, sizeof(*d->tid)))) {
		free(st);
		if (d)
			free(d->tid);
		free(d);
		return -ENOMEM;
	}
	tb_get_stats(fs->tb, st);
	d->max_bytes = st->dirty_limit_bytes;
	free(st);
	d->fs = fs;
	d->nthreads = nthreads;
	pthread_mutex_init(&d->lock, NULL);
	pthread_cond_init(&d->cv, NULL);
	for (; d->started < nthreads; d->started++) {
		ret = -pthread_create(&d->tid[d->started], NULL, defer_main, d);
		if (ret)
			break;
	}
	if (!d->started) {
		pthread_cond_destroy(&d->cv);
		pthread_mutex_destroy(&d->lock);
		free(d->tid);
		free(d);
		return ret;
	}
	if (ret)
		log_warn("started %u of %u threads for writes waiting for room", d->started,
			 nthreads);
	d->nthreads = d->started;
	fs->defer = d;
	return 0;
}

void fs_defer_stop(struct fs *fs)
{
	struct fs_defer *d = fs->defer;

	if (!d)
		return;
	struct timespec until;
	bool said = false;

	pthread_mutex_lock(&d->lock);
	d->stop = true;
	pthread_cond_broadcast(&d->cv);
	pthread_mutex_unlock(&d->lock);
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += BUSY_LOG_S;
	for (unsigned i = 0; i < d->started; i++) {
		/* Every parked request is answered first: one that never ends holds the exit. */
		if (!said && pthread_timedjoin_np(d->tid[i], NULL, &until) == 0)
			continue;
		if (!said)
			log_err("exiting: a request thread is still inside a request after %d s; "
				"waiting for it (SIGKILL ends the daemon, losing what is not "
				"written back)",
				BUSY_LOG_S);
		said = true;
		pthread_join(d->tid[i], NULL);
	}
	fs->defer = NULL;
	pthread_cond_destroy(&d->cv);
	pthread_mutex_destroy(&d->lock);
	free(d->users);
	free(d->tid);
	free(d);
}

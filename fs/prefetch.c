/*
 * prefetch.c - loads the files that come next in the learned cycle, and
 * files named by a hint, into the DRAM tier ahead of use.
 *
 * One thread (tfs-prefetch) wakes when the learner records a file or a
 * hint arrives. Only the blocks a file stores are visited, found through
 * the block map's cursor, so a sparse file of 2^63 bytes costs what it
 * holds. The work goes in turns of at most PF_TURN_BLOCKS blocks: a turn
 * of a hinted file, then a turn of the learned cycle's files. Users take
 * turns, each user's hints in the order given, so no user's hint, however
 * large its file, holds up another user's. A hint or a pass of the cycle
 * issues at most as many blocks as the DRAM tier holds: loading more would
 * only evict what it loaded first.
 * The cycle's files are the one in use and the next ones within the DRAM
 * tier (what is loaded of them is bounded by the cache's depth, below);
 * its pass starts over whenever the cycle moves. Blocks go in the prefetch
 * class, which devices serve after demand reads and before write-back.
 * tb_prefetch never waits: when the in-flight bound is reached the thread
 * sleeps a little and ends the turn. The cycle's pass keeps only a few
 * blocks ahead of their readers (the cache's bound): when it is reached
 * the thread sleeps until a read takes one (fs_read kicks it), so the
 * coming files are loaded just ahead of use. When no slot holds a block
 * needed later than the next one, the pass ends until the cycle moves.
 * Hints load their files whole.
 */
#include "fs.h"
#include "log.h"

#include <errno.h>
#include <string.h>
#include <time.h>

#define AHEAD_MAX 64	  /* files looked ahead at most */
#define RETRY_NS 2000000L /* when the prefetch class is full */
#define IDLE_MS 200	  /* wake to check the learner anyway */
#define PREFETCH_SHARE 1  /* the files looked at ahead hold at most the DRAM tier */
#define PF_TURN_BLOCKS 32 /* blocks one file issues per turn */
/*
 * A remote reader's window holds at least the object it reads and the next
 * whole one, whatever remote_readahead= says: less, and the next object's
 * GET would start only when the reader reached it.
 */
#define RA_DEEP_MIN_RUNS 2

/* The learned cycle's pass: its files, the one being loaded, and what is left. */
struct pf_cycle {
	uint64_t inos[AHEAD_MAX];
	unsigned n, i;
	uint64_t gen;
	struct fs_pf_file cur;
};

static uint64_t dram_blocks(const struct fs *fs)
{
	return fs->cfg->dram / fs->bs;
}

/*
 * One turn of a file: issue its next stored blocks from h->next, at most
 * PF_TURN_BLOCKS and h->left, and advance h. False when it has no more to
 * load (or has gone); true when another turn is due. For the cycle (not a
 * hint), *stop says that the pass should wait for the cycle to move.
 */
static bool prefetch_turn(struct fs *fs, struct fs_pf_file *h, bool hint, bool *stop)
{
	uint64_t idx[PF_TURN_BLOCKS], nblk;
	unsigned n, max = h->left < PF_TURN_BLOCKS ? (unsigned)h->left : PF_TURN_BLOCKS;
	struct fs_inode *in;
	bool more, retry = false;

	if (max == 0 || fs_iget(fs, h->ino, &in) != 0)
		return false;
	pthread_mutex_lock(&in->lock);
	nblk = (in->rec.size + fs->bs - 1) / fs->bs;
	pthread_mutex_unlock(&in->lock);
	if (meta_bmap_list(fs->meta, h->ino, h->next, nblk, idx, max, &n) != 0)
		n = 0;
	more = n == max;
	/*
	 * A turn's blocks reach the devices together: an s3 tier reads
	 * neighbours in one GET. The file's I/O lock is held shared over the
	 * whole turn, plug to unplug: taken per block, a truncate (O_TRUNC)
	 * could take it between two blocks and wait in tb_drop for a load
	 * still held in this thread's plug, while this thread waited for the
	 * lock, for ever.
	 */
	pthread_rwlock_rdlock(&in->io);
	tb_plug();
	for (unsigned i = 0; i < n && !fs->pf_stop; i++) {
		int ret = tb_prefetch(fs->tb, in->ino, idx[i], hint);

		if (ret == -ENOBUFS) {
			/*
			 * Far enough ahead: the next read kicks the thread (fs_read).
			 * Once more after raising the flag: a read that took a block
			 * before it saw no flag, and its room shows now.
			 */
			__atomic_store_n(&fs->pf_room_wait, true, __ATOMIC_RELAXED);
			ret = tb_prefetch(fs->tb, in->ino, idx[i], hint);
		}
		if (ret == -ENOBUFS) {
			*stop = true;
			more = true;
			break;
		}
		if (ret == -EBUSY) {
			*stop = true; /* every slot is needed sooner: wait for the cycle to move */
			h->left = 0;
			more = false;
			break;
		}
		if (ret == -EAGAIN) {
			/* Full for now: this block again at the file's next turn. */
			retry = true;
			more = true;
			break;
		}
		h->next = idx[i] + 1;
		h->left--;
	}
	tb_unplug();
	pthread_rwlock_unlock(&in->io);
	if (retry) {
		struct timespec ts = {0, RETRY_NS};

		nanosleep(&ts, NULL);
	}
	fs_iput(fs, in);
	return more && h->left > 0 && !fs->pf_stop;
}

/*
 * The hint whose turn it is: the oldest of the next user after the one
 * served last, in the order of uids. A user's own hints go in the order
 * given (a job hints what it needs first, first); users take turns.
 */
static unsigned next_hint(const struct fs *fs)
{
	unsigned best = FS_PF_HINTS, first = 0;

	for (unsigned i = 0; i < fs->pf_nhints; i++) {
		uint32_t u = fs->pf_hints[i].uid;

		if (u > fs->pf_last_uid && (best == FS_PF_HINTS || u < fs->pf_hints[best].uid))
			best = i;
		if (u < fs->pf_hints[first].uid)
			first = i;
	}
	return best < FS_PF_HINTS ? best : first;
}

/* A turn of the hint whose turn it is; false when none is queued. */
static bool hint_turn(struct fs *fs)
{
	struct fs_pf_file h;
	unsigned i;
	bool more, stop = false;

	pthread_mutex_lock(&fs->pf_lock);
	if (!fs->pf_nhints) {
		pthread_mutex_unlock(&fs->pf_lock);
		return false;
	}
	i = next_hint(fs);
	h = fs->pf_hints[i];
	pthread_mutex_unlock(&fs->pf_lock);

	more = prefetch_turn(fs, &h, true, &stop);

	/* Only this thread removes hints, and others append, so slot i is still h's. */
	pthread_mutex_lock(&fs->pf_lock);
	fs->pf_last_uid = h.uid;
	if (more) {
		fs->pf_hints[i] = h;
	} else {
		fs->pf_nhints--;
		memmove(&fs->pf_hints[i], &fs->pf_hints[i + 1],
			(fs->pf_nhints - i) * sizeof(fs->pf_hints[0]));
	}
	pthread_mutex_unlock(&fs->pf_lock);
	return true;
}

static uint64_t learn_gen(struct fs *fs)
{
	return __atomic_load_n(&fs->learn.generation, __ATOMIC_RELAXED);
}

/* Start the cycle's pass over when the cycle has moved. */
static void cycle_refresh(struct fs *fs, struct pf_cycle *c)
{
	if (learn_gen(fs) == c->gen)
		return;
	c->n =
	    fs_learn_next(&fs->learn, c->inos, AHEAD_MAX, fs->cfg->dram / PREFETCH_SHARE, &c->gen);
	c->i = 0;
	c->cur = (struct fs_pf_file){.ino = c->n ? c->inos[0] : 0, .left = dram_blocks(fs)};
}

/* A turn of the learned cycle's pass; false when it has nothing to do. */
static bool cycle_turn(struct fs *fs, struct pf_cycle *c)
{
	/* prefetch=off turns off the learned cycle's prefetch, not hints. */
	if (!fs->cfg->prefetch)
		return false;
	bool stop = false;

	cycle_refresh(fs, c);
	if (c->i >= c->n || c->cur.left == 0)
		return false;
	if (!prefetch_turn(fs, &c->cur, false, &stop) && ++c->i < c->n && c->cur.left)
		c->cur = (struct fs_pf_file){.ino = c->inos[c->i], .left = c->cur.left};
	return !stop; /* stopped: asleep until a read or the cycle moves */
}

/*
 * Tell the cache when a pass of the cycle ends (a period's records since
 * the last), so it tunes its prefetch window to the pass (tb_cycle_pass).
 * *from: the record where the pass began.
 */
static void cycle_pass_check(struct fs *fs, uint64_t *from)
{
	struct fs_learn_stats st;

	fs_learn_stats(&fs->learn, &st);
	if (!st.period) {
		*from = st.records;
		return;
	}
	if (st.records - *from < st.period)
		return;
	*from = st.records;
	tb_cycle_pass(fs->tb);
	__atomic_store_n(&fs->rd_told, 0, __ATOMIC_RELAXED); /* the pass took the readers' queue */
}

static void *prefetch_main(void *arg)
{
	struct fs *fs = arg;
	struct pf_cycle cycle = {0};
	uint64_t pass_from = 0;

	pthread_setname_np(pthread_self(), "tfs-prefetch");
	pthread_mutex_lock(&fs->pf_lock);
	while (!fs->pf_stop) {
		uint64_t kicks = fs->pf_kicks;
		bool worked;

		pthread_mutex_unlock(&fs->pf_lock);
		worked = hint_turn(fs);
		worked |= cycle_turn(fs, &cycle);
		if (fs->cfg->prefetch)
			cycle_pass_check(fs, &pass_from);
		pthread_mutex_lock(&fs->pf_lock);
		/* A kick during the turn (a read took a block the turn found no room for) counts. */
		if (!worked && !fs->pf_nhints && !fs->pf_stop && fs->pf_kicks == kicks &&
		    (!fs->cfg->prefetch || learn_gen(fs) == cycle.gen)) {
			struct timespec ts;

			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_nsec += IDLE_MS * 1000000L;
			ts.tv_sec += ts.tv_nsec / 1000000000L;
			ts.tv_nsec %= 1000000000L;
			pthread_cond_timedwait(&fs->pf_cv, &fs->pf_lock, &ts);
		}
	}
	pthread_mutex_unlock(&fs->pf_lock);
	return NULL;
}

int fs_prefetch_start(struct fs *fs)
{
	pthread_mutex_init(&fs->pf_lock, NULL);
	pthread_cond_init(&fs->pf_cv, NULL);
	fs->pf_stop = false;
	fs->pf_nhints = 0;
	fs->pf_last_uid = 0;
	fs->pf_kicks = 0;
	if (pthread_create(&fs->pf_thread, NULL, prefetch_main, fs) != 0)
		return -EAGAIN;
	fs->pf_running = true;
	return 0;
}

void fs_prefetch_stop(struct fs *fs)
{
	if (!fs->pf_running)
		return;
	pthread_mutex_lock(&fs->pf_lock);
	fs->pf_stop = true;
	pthread_cond_signal(&fs->pf_cv);
	pthread_mutex_unlock(&fs->pf_lock);
	pthread_join(fs->pf_thread, NULL);
	fs->pf_running = false;
}

void fs_prefetch_kick(struct fs *fs)
{
	if (!fs->pf_running)
		return;
	pthread_mutex_lock(&fs->pf_lock);
	fs->pf_kicks++;
	pthread_cond_signal(&fs->pf_cv);
	pthread_mutex_unlock(&fs->pf_lock);
}

int fs_prefetch_hint(struct fs *fs, uint64_t ino, uint32_t uid)
{
	unsigned mine = 0;
	int ret = 0;

	pthread_mutex_lock(&fs->pf_lock);
	for (unsigned i = 0; i < fs->pf_nhints; i++) {
		if (fs->pf_hints[i].ino == ino)
			goto out; /* queued already: its turns go on */
		mine += fs->pf_hints[i].uid == uid;
	}
	if (fs->pf_nhints == FS_PF_HINTS || mine == FS_PF_HINTS_PER_USER)
		ret = -EBUSY;
	else
		fs->pf_hints[fs->pf_nhints++] =
		    (struct fs_pf_file){.ino = ino, .left = dram_blocks(fs), .uid = uid};
out:
	pthread_cond_signal(&fs->pf_cv);
	pthread_mutex_unlock(&fs->pf_lock);
	return ret;
}

/*
 * Where a window from block `from' may end, at most at `end' (or at the
 * file's end): after the last whole run (s3 object) that fits, each found
 * by a lookup of its first block. *next_run gets where the run after it
 * ends (0: not known), which the caller keeps (ra_end_run), so that a
 * reader whose window cannot move yet looks nothing up. Called without
 * in->lock.
 */
static uint64_t ra_window_end(struct fs *fs, uint64_t ino, uint64_t from, uint64_t from_run,
			      uint64_t end, uint64_t end_blk, unsigned run, uint64_t *next_run)
{
	uint64_t to = from, next;

	*next_run = 0;
	if (run <= 1)
		return end;
	while (to < end) {
		next = to == from && from_run > from ? from_run : to + tb_run_left(fs->tb, ino, to);
		if (next > end_blk)
			next = end_blk;
		if (next > end) {
			*next_run = next;
			break;
		}
		to = next;
	}
	return to;
}

/*
 * Readahead for a sequential reader of blocks on a remote tier. The window
 * is what the tier's latency x bandwidth asks (tb_ahead), up to
 * remote_readahead= (two runs at least), and never less than readahead=.
 * It is issued a placement run at a time (an s3 object's blocks), each
 * ending where its object does (ra_window_end), and plugged, so that the
 * tier serves a run with one request: sliding it a block per block read
 * made one GET per block, and ending windows on multiples of the run in the
 * file, where objects did not (one the write-back closed early moves every
 * later one), made two GETs per object. The home of
 * each block the reader enters is looked up once; the reader keeps the deep
 * window while any of its last 32 blocks was remote, so a file spread over
 * nvme and s3 keeps it, and the window grows by the inverse of the share of
 * those blocks that were remote: the depth is what the remote tier needs in
 * flight, and a window over a file a third on s3 holds a third of it there.
 * Blocks on nvme keep the shallow window that suits Belady's caching there,
 * since a deep one costs hits.
 */
bool fs_readahead_deep(struct fs *fs, struct fs_inode *in, uint64_t first, uint64_t end_blk)
{
	uint64_t cur = first - 1, from, from_run, to, b, end, seen, next_run;
	unsigned depth = 0, run = 1, min_depth = (unsigned)(fs->cfg->readahead / fs->bs);
	unsigned max_depth = (unsigned)(fs->cfg->remote_readahead / fs->bs);
	bool look;

	if (!fs->cfg->remote_readahead)
		return false;
	pthread_mutex_lock(&in->lock);
	look = in->ra_seen != cur + 1;
	in->ra_seen = cur + 1;
	pthread_mutex_unlock(&in->lock);
	if (look)
		depth = tb_ahead(fs->tb, in->ino, cur, &run);
	pthread_mutex_lock(&in->lock);
	if (look) {
		in->ra_remote = in->ra_remote << 1 | (depth > 0);
		if (depth) {
			in->ra_depth = depth;
			in->ra_run = run;
		}
	}
	if (!in->ra_remote) {
		pthread_mutex_unlock(&in->lock);
		return false;
	}
	run = in->ra_run ? in->ra_run : 1;
	depth = in->ra_depth * 32 / (unsigned)__builtin_popcount(in->ra_remote);
	if (max_depth < RA_DEEP_MIN_RUNS * run)
		max_depth = RA_DEEP_MIN_RUNS * run;
	if (depth > max_depth)
		depth = max_depth;
	if (depth < min_depth)
		depth = min_depth;
	/* A reader that jumped starts its window again where it is. */
	from = in->ra_end >= first && in->ra_end <= first + depth ? in->ra_end : first;
	from_run = from == in->ra_end ? in->ra_end_run : 0;
	end = first + depth < end_blk ? first + depth : end_blk;
	seen = in->ra_end;
	if (from_run > end && from_run < end_blk) {
		pthread_mutex_unlock(&in->lock);
		return true; /* the next run does not fit yet */
	}
	pthread_mutex_unlock(&in->lock);
	to = ra_window_end(fs, in->ino, from, from_run, end, end_blk, run, &next_run);
	pthread_mutex_lock(&in->lock);
	if (in->ra_end != seen) {
		pthread_mutex_unlock(&in->lock);
		return true; /* another reader of the file moved the window: it issues */
	}
	if (to <= from) {
		if (from == in->ra_end)
			in->ra_end_run = next_run;
		pthread_mutex_unlock(&in->lock);
		return true;
	}
	in->ra_end = to;
	in->ra_end_run = next_run;
	pthread_mutex_unlock(&in->lock);
	tb_plug();
	for (b = from; b < to; b++)
		if (tb_prefetch_deep(fs->tb, in->ino, b, depth + run) < 0)
			break; /* no room now, far enough ahead, or every slot is needed sooner */
	tb_unplug();
	if (b < to) {
		pthread_mutex_lock(&in->lock);
		if (in->ra_end == to) {
			in->ra_end = b;
			in->ra_end_run = 0;
		}
		pthread_mutex_unlock(&in->lock);
	}
	return true;
}

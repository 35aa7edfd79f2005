/*
 * learn.c - the access-trace learner: finds the cycle in which an offloader
 * touches its swap files, and ranks files by when they will be used next.
 *
 * A file is "used" when a read or write reaches it after it has been left
 * alone for a while: while more than REPEAT_MIN bytes (or a quarter of the
 * file) went to other files of its folder (its stream, below). Requests of
 * two swappers or aio threads that take turns on several files are so one
 * use of each, and a file read and later written back in one optimizer
 * step is two uses. A touch that goes on where the file's use reached (the
 * same direction, not from the start, within GO_ON_SLACK of the furthest
 * byte) is that use still, however many bytes went elsewhere meanwhile: the
 * pipelined swapper writes one subgroup's state while it reads the next
 * one's, and a write slowed by the reads was recorded three or four times
 * in one iteration and once in the next, which kept the learner from
 * matching the two. The
 * sequence of uses is kept in a ring. When a file comes back, the distance
 * to each of its last records is a candidate period; it fits when the
 * records before it match the records one period earlier, each within a
 * few records (JITTER, or an eighth of the period) of where the period
 * puts it, since concurrent streams reach their files in a slightly
 * different order each time. The candidate that fits most closely is
 * taken, and a period that still fits is replaced only by one of about
 * its length that fits more closely (find_period). Each record also checks
 * the previous prediction, and the hit rate (a moving average) is the
 * confidence: a skipped or an extra file lowers it a little, a different
 * workload lowers it until the cycle is dropped.
 *
 * With a cycle known, a file last recorded at position p is next used at
 * p + period; the block cache evicts the blocks used furthest ahead first.
 *
 * Each folder's files make a stream of their own, with its own ring, byte
 * clock and cycle (FS_LEARN_STREAMS of them; see stream_get): the
 * offloader's ranks each swap to a folder of their own (optimizer/rank<R>,
 * <dtype>params/rank<R>), and each rank's uses are one sequence, where all
 * of them together are not. Eight ranks reach their files in an order
 * that drifts by more than the jitter from one iteration to the next, and
 * one sequence of them all held no cycle. A use's distance is its
 * stream's, scaled to the streams' periods summed (a fraction of the
 * stream's cycle, as all of them go round once an iteration): with one
 * stream it is the stream's own.
 */
#include "learn.h"

#include <stdlib.h>
#include <string.h>

#define RING_MIN 8192	    /* records a stream keeps at first */
#define RING_MAX 65536	    /* and at most: periods up to half of it are learned */
#define REPEAT_MIN (8ULL << 20) /* bytes to other files that end a file's use, at least */
#define REPEAT_SHARE 4	    /* or this fraction of the file's size */
#define GO_ON_SLACK (64ULL << 20) /* a touch this near where its use reached goes on with it */
#define JITTER 16	    /* records a file may be early or late in the cycle, at most */
#define JITTER_SHARE 8	    /* and at most this fraction of the period */
#define IN_USE 2	    /* a file recorded within this many records is in use */
#define MATCH_WINDOW 32	    /* records compared to accept a period: at most */
#define MATCH_MIN 8	    /* and at least, several turns of a short one */
#define MATCH_SHARE 0.9	    /* of them that must match */
#define CONF_ALPHA 0.1	    /* weight of the latest prediction */
#define CONF_KEEP 0.5	    /* below this the cycle is dropped */
#define FILES_BUCKETS 16384
#define POSITIONS 4	    /* records of a file remembered: uses per cycle */

/* One sequence of uses: a folder's files. */
struct learn_stream {
	uint64_t key;	      /* the folder */
	uint64_t *ring;	      /* recorded files, by record index % ring_size */
	uint8_t *ring_write;  /* whether each record's use began with a write */
	uint64_t ring_size;   /* records kept, a power of two (ring_fit) */
	uint64_t n;	      /* records so far */
	uint64_t clock;	      /* atomic: bytes read and written in its files */
	uint64_t last_end;    /* atomic: where its last touch ended (fs_learn_touch) */
	uint64_t period;      /* files in its cycle; 0 while none is known */
	uint64_t bytes, blocks, tails; /* of the files of one cycle (cycle_size) */
	uint64_t written;     /* of those blocks, the ones of files the cycle writes */
	uint64_t sized_n, sized_period; /* n and period when they were summed */
	double confidence;    /* moving hit rate of the predictions */
	uint64_t last_rec;    /* the learner's record count at its last record */
};

struct learn_file {
	uint64_t ino;
	struct learn_stream *st; /* the stream of its first use */
	uint64_t last_clock; /* its stream's byte clock at its last touch */
	uint64_t last_pos;   /* its stream's record index of its last record, or UINT64_MAX */
	uint64_t pos[POSITIONS]; /* its last records, newest first; UINT64_MAX unused */
	uint64_t size;
	uint64_t use_end;    /* the furthest its current use reached, in bytes */
	bool use_write;	     /* whether that use writes */
	uint64_t written_n;  /* cycle_size: its stream's n when a write of it was seen in the period */
	struct learn_file *next;
};

/* How early or late a file may come in a cycle of p records: a small part of it. */
static uint64_t jitter(uint64_t p)
{
	return p / JITTER_SHARE < JITTER ? p / JITTER_SHARE : JITTER;
}

static uint64_t at(const struct learn_stream *st, uint64_t pos)
{
	return st->ring[pos & (st->ring_size - 1)];
}

static bool written_at(const struct learn_stream *st, uint64_t pos)
{
	return st->ring_write[pos & (st->ring_size - 1)];
}

/*
 * Give st a ring of size records (a power of two) holding the records it
 * keeps; -1, and st as it was, when memory is short.
 */
static int ring_resize(struct learn_stream *st, uint64_t size)
{
	uint64_t *ring = calloc(size, sizeof(*ring));
	uint8_t *w = calloc(size, sizeof(*w));

	if (!ring || !w) {
		free(ring);
		free(w);
		return -1;
	}
	for (uint64_t i = st->n > st->ring_size ? st->n - st->ring_size : 0; i < st->n; i++) {
		ring[i & (size - 1)] = at(st, i);
		w[i & (size - 1)] = written_at(st, i);
	}
	free(st->ring);
	free(st->ring_write);
	st->ring = ring;
	st->ring_write = w;
	st->ring_size = size;
	return 0;
}

/*
 * A file came back after p records: the ring must keep two such periods
 * (period_fits compares the last records with one period before, and the
 * prefetcher reads one period back). It starts at RING_MIN records and
 * doubles, up to RING_MAX, when a file comes back later than that allows:
 * a large model's optimizer, with many subgroups and a gradient file per
 * parameter, or a folder of thousands of files read in turn, has a cycle
 * of more than 4096 uses, and held none with a ring of 8192 (the cache
 * fell back to 2Q and moved the whole state each pass). The records kept
 * are copied; the period is found at the file's next return. Failing to
 * grow keeps the ring as it is.
 */
static void ring_fit(struct learn_stream *st, uint64_t p)
{
	uint64_t size = st->ring_size;

	while (size < RING_MAX && p + MATCH_WINDOW + jitter(p) >= size / 2)
		size *= 2;
	if (size != st->ring_size)
		ring_resize(st, size);
}

/*
 * The stream of folder key; a new one while there is room. Then a new
 * folder takes over the stream recorded in least recently, which its old
 * files still share: a folder of checkpoints of long ago, rather than a
 * rank's (taken by hash, a rank's stream took a new folder's records
 * between its own, and both lost their cycles).
 */
static struct learn_stream *stream_get(struct fs_learner *l, uint64_t key)
{
	struct learn_stream *st;

	for (unsigned i = 0; i < l->nstreams; i++)
		if (l->streams[i]->key == key)
			return l->streams[i];
	if (l->nstreams == FS_LEARN_STREAMS) {
		st = l->streams[0];
		for (unsigned i = 1; i < l->nstreams; i++)
			if (l->streams[i]->last_rec < st->last_rec)
				st = l->streams[i];
		st->key = key;
		return st;
	}
	st = calloc(1, sizeof(*st));
	if (!st)
		return NULL;
	st->key = key;
	if (ring_resize(st, RING_MIN) < 0) {
		free(st);
		return NULL;
	}
	l->streams[l->nstreams++] = st;
	return st;
}

/* The hash chain of ino's record. */
static struct learn_file **bucket(struct fs_learner *l, uint64_t ino)
{
	return &l->files[(ino * 0x9E3779B97F4A7C15ULL >> 50) % FILES_BUCKETS];
}

static struct learn_file *file_get(struct fs_learner *l, uint64_t ino)
{
	struct learn_file **b = bucket(l, ino);
	struct learn_file *f;

	for (f = *b; f; f = f->next)
		if (f->ino == ino)
			return f;
	f = calloc(1, sizeof(*f));
	if (!f)
		return NULL;
	f->ino = ino;
	f->last_pos = UINT64_MAX;
	for (int i = 0; i < POSITIONS; i++)
		f->pos[i] = UINT64_MAX;
	f->next = *b;
	*b = f;
	l->nfiles++;
	return f;
}

static struct learn_file *file_find(struct fs_learner *l, uint64_t ino)
{
	struct learn_file *f = *bucket(l, ino);

	while (f && f->ino != ino)
		f = f->next;
	return f;
}

/*
 * A file's record is kept while the file lives: an offloader that deletes
 * its activations every iteration makes new files, and new inode numbers,
 * each time, and their records, kept for ever, grew the learner without
 * bound and lengthened every lookup's chain.
 */
void fs_learn_forget(struct fs_learner *l, uint64_t ino)
{
	struct learn_file **p, *f;

	pthread_mutex_lock(&l->lock);
	for (p = bucket(l, ino); (f = *p); p = &f->next)
		if (f->ino == ino) {
			*p = f->next;
			free(f);
			l->nfiles--;
			break;
		}
	if (__atomic_load_n(&l->last_ino, __ATOMIC_RELAXED) == ino)
		__atomic_store_n(&l->last_ino, 0, __ATOMIC_RELAXED); /* no inode is 0 */
	pthread_mutex_unlock(&l->lock);
}

int fs_learn_init(struct fs_learner *l)
{
	memset(l, 0, sizeof(*l));
	pthread_mutex_init(&l->lock, NULL);
	l->files = calloc(FILES_BUCKETS, sizeof(*l->files));
	return l->files ? 0 : -1;
}

void fs_learn_fini(struct fs_learner *l)
{
	for (size_t b = 0; l->files && b < FILES_BUCKETS; b++)
		while (l->files[b]) {
			struct learn_file *f = l->files[b];

			l->files[b] = f->next;
			free(f);
		}
	free(l->files);
	for (unsigned i = 0; i < l->nstreams; i++) {
		free(l->streams[i]->ring);
		free(l->streams[i]->ring_write);
		free(l->streams[i]);
	}
	pthread_mutex_destroy(&l->lock);
}

/*
 * How far from position pos, within j records, ino was recorded: 0 at pos,
 * or j + 1 when it was not.
 */
static uint64_t recorded_off(const struct learn_stream *st, uint64_t ino, uint64_t pos,
			     uint64_t j)
{
	uint64_t lo = pos > j ? pos - j : 0, hi = pos + j, best = j + 1;

	if (hi >= st->n)
		hi = st->n - 1;
	if (st->n - lo > st->ring_size)
		lo = st->n - st->ring_size;
	for (uint64_t i = lo; i <= hi; i++)
		if (at(st, i) == ino && (i > pos ? i - pos : pos - i) < best)
			best = i > pos ? i - pos : pos - i;
	return best;
}

/* Whether ino was recorded within j records of position pos. */
static bool recorded_near(const struct learn_stream *st, uint64_t ino, uint64_t pos, uint64_t j)
{
	return recorded_off(st, ino, pos, j) <= j;
}

/*
 * Does the period p explain the records before the newest one? *cost: how
 * far they lie from where p puts them, in thousandths of a record on
 * average (a record not found counts as a jitter and one). The last p
 * records are compared, MATCH_MIN at least and MATCH_WINDOW at most: a
 * period shorter than MATCH_MIN is checked over several of its turns.
 * Compared over one, a file recorded twice in a row (one whose use other
 * files' bytes interrupted) made a period of 1 that fit, and it took the
 * place of a cycle that had stopped fitting for a moment.
 */
static bool period_fits(const struct learn_stream *st, uint64_t p, uint64_t *cost)
{
	uint64_t window = p < MATCH_WINDOW ? p : MATCH_WINDOW, match = 0, off = 0;

	if (window < MATCH_MIN)
		window = MATCH_MIN;

	if (p == 0 || p >= st->ring_size / 2 || st->n < p + window + jitter(p))
		return false;
	for (uint64_t j = 1; j <= window; j++) {
		uint64_t d = recorded_off(st, at(st, st->n - j), st->n - j - p, jitter(p));

		match += d <= jitter(p);
		off += d;
	}
	*cost = off * 1000 / window;
	return match >= MATCH_SHARE * (double)window;
}

/*
 * Sum the sizes of the files of one of st's periods, in bytes and in whole
 * blocks, and the blocks of those the period writes: a cycle that only
 * reads needs no write-back depth beside what stays (update_keep).
 */
static void cycle_size(struct fs_learner *l, struct learn_stream *st)
{
	uint64_t sum = 0, blocks = 0, tails = 0, written = 0;

	/*
	 * Oldest record first: a file is counted at its last record in the
	 * period (a file used twice is counted once), and by then each of its
	 * records has marked whether it was written.
	 */
	for (uint64_t j = st->period; j >= 1; j--) {
		struct learn_file *f = file_find(l, at(st, st->n - j));

		if (!f || f->st != st)
			continue;
		if (written_at(st, st->n - j))
			f->written_n = st->n;
		if (f->last_pos == st->n - j) {
			sum += f->size;
			if (l->block) {
				uint64_t b = (f->size + l->block - 1) / l->block;

				blocks += b;
				tails += f->size % l->block != 0;
				written += f->written_n == st->n ? b : 0;
			}
		}
	}
	st->bytes = sum;
	st->blocks = blocks;
	st->tails = tails;
	st->written = written;
}

/* The streams' cycles summed: what the owner and the stats see. */
static void sums(struct fs_learner *l)
{
	uint64_t period = 0, bytes = 0, blocks = 0, tails = 0, written = 0;

	for (unsigned i = 0; i < l->nstreams; i++) {
		const struct learn_stream *st = l->streams[i];

		if (!st->period)
			continue;
		period += st->period;
		bytes += st->bytes;
		blocks += st->blocks;
		tails += st->tails;
		written += st->written;
	}
	__atomic_store_n(&l->period, period, __ATOMIC_RELAXED);
	l->bytes = bytes;
	l->blocks = blocks;
	l->tails = tails;
	l->written = written;
}

/* A distance in st's records, as a share of its cycle in all the streams' records. */
static uint64_t scaled(const struct fs_learner *l, const struct learn_stream *st, uint64_t d)
{
	if (d == FS_LEARN_UNKNOWN || st->period == l->period || !st->period)
		return d;
	return (uint64_t)((unsigned __int128)d * l->period / st->period);
}

/*
 * A file used k times per cycle comes back k records of its own later: each
 * of its remembered records gives a candidate period. Without a period, the
 * candidate whose records lie closest to where it puts them is taken (the
 * nearest at a tie). A period that still explains the records is kept
 * unless a candidate of about its length (within a factor of two) explains
 * them more closely: a part of the cycle that repeats within it (the
 * optimizer's read and write of one subgroup) fits the last records too,
 * and taking it made the cache evict on the wrong period for part of every
 * iteration; a period a few records off the true one also fits, within the
 * jitter, and drifts. A period that does not explain the last records for
 * the moment (a file came late) is still the one to beat: a candidate must
 * lie closer than it does. Replaced by any candidate that fit at all, the
 * learner took, in the pipelined swapper's second iteration, a period 11
 * records short that missed its next predictions, and lost the cycle.
 */
static void find_period(struct learn_stream *st, struct learn_file *f)
{
	uint64_t cur = UINT64_MAX, best = 0, best_cost = UINT64_MAX, cost;
	bool held = st->period && period_fits(st, st->period, &cur);

	for (int i = 1; i < POSITIONS && f->pos[i] != UINT64_MAX; i++) {
		uint64_t p = st->n - 1 - f->pos[i];

		if (p == st->period || (held && (p < st->period / 2 || p > 2 * st->period)))
			continue;
		if (period_fits(st, p, &cost) && cost < best_cost && cost < cur) {
			best = p;
			best_cost = cost;
		}
	}
	if (best) {
		st->period = best;
		st->confidence = MATCH_SHARE;
	}
}

static void record(struct fs_learner *l, struct learn_file *f, bool write)
{
	struct learn_stream *st = f->st;

	if (st->period) {
		bool hit = st->n >= st->period &&
			   recorded_near(st, f->ino, st->n - st->period, jitter(st->period));

		st->confidence = (1 - CONF_ALPHA) * st->confidence + CONF_ALPHA * (hit ? 1 : 0);
		if (st->confidence < CONF_KEEP)
			st->period = 0;
	}
	if (f->pos[0] != UINT64_MAX)
		ring_fit(st, st->n - f->pos[0]);
	st->ring[st->n & (st->ring_size - 1)] = f->ino;
	st->ring_write[st->n & (st->ring_size - 1)] = write;
	f->last_pos = st->n;
	memmove(f->pos + 1, f->pos, (POSITIONS - 1) * sizeof(f->pos[0]));
	f->pos[0] = st->n;
	st->n++;
	st->last_rec = ++l->n;
	l->generation++;
	find_period(st, f);
	/*
	 * The cycle's sizes are summed when its period changes and then every
	 * eighth of a period: the sum walks a period's records, and at every
	 * record it cost a cycle of 30000 uses a second of CPU per iteration
	 * for sizes that do not change.
	 */
	if (st->period && (st->period != st->sized_period || st->n - st->sized_n > st->period / 8)) {
		cycle_size(l, st);
		st->sized_n = st->n;
		st->sized_period = st->period;
	}
	sums(l);
}

/* Whether a touch at off goes on with f's current use (see the top). */
static bool goes_on(const struct learn_file *f, uint64_t off, bool write)
{
	return f->last_pos != UINT64_MAX && write == f->use_write && off &&
	       off + GO_ON_SLACK >= f->use_end && off <= f->use_end + GO_ON_SLACK;
}

void fs_learn_touch(struct fs_learner *l, uint64_t ino, uint64_t stream, uint64_t size,
		    uint64_t off, uint64_t len, bool write)
{
	struct learn_stream *st;
	struct learn_file *f, *prev;
	uint64_t clock;

	if (__atomic_load_n(&l->last_ino, __ATOMIC_RELAXED) == ino) {
		/*
		 * The same file again: the common case, no lock. last_st may
		 * be a moment behind last_ino, and these bytes then count in
		 * the stream touched before: a clock a few MiB off, once.
		 * last_end is where the file's use reached, for the next
		 * touch that takes the lock; it shares the clock's line,
		 * which this path writes anyway.
		 */
		st = __atomic_load_n(&l->last_st, __ATOMIC_ACQUIRE);
		if (st) {
			__atomic_add_fetch(&st->clock, len, __ATOMIC_RELAXED);
			__atomic_store_n(&st->last_end, off + len, __ATOMIC_RELAXED);
			return;
		}
	}
	pthread_mutex_lock(&l->lock);
	l->touches++;
	f = file_get(l, ino);
	if (f && !f->st)
		f->st = stream_get(l, stream);
	if (!f || !f->st) {
		pthread_mutex_unlock(&l->lock);
		return; /* out of memory: this touch is not learned */
	}
	st = f->st;
	clock = __atomic_add_fetch(&st->clock, len, __ATOMIC_RELAXED) - len;
	/* The file touched before was in use until now, by its stream's clock. */
	prev = file_find(l, l->last_ino);
	if (prev && prev->st) {
		/* Where the touches that took no lock took its use. */
		uint64_t end = __atomic_load_n(&prev->st->last_end, __ATOMIC_RELAXED);

		if (prev->use_end < end)
			prev->use_end = end;
	}
	if (prev && prev != f && prev->st) {
		uint64_t now = __atomic_load_n(&prev->st->clock, __ATOMIC_RELAXED);

		if (prev->last_clock < now)
			prev->last_clock = now;
	}
	__atomic_store_n(&l->last_st, st, __ATOMIC_RELEASE);
	__atomic_store_n(&l->last_ino, ino, __ATOMIC_RELAXED);
	__atomic_store_n(&st->last_end, off + len, __ATOMIC_RELAXED);
	{
		uint64_t gap;

		f->size = size;
		gap = size / REPEAT_SHARE > REPEAT_MIN ? size / REPEAT_SHARE : REPEAT_MIN;
		if (f->last_pos == UINT64_MAX ||
		    (clock > f->last_clock + gap && !goes_on(f, off, write))) {
			record(l, f, write);
			f->use_write = write;
			f->use_end = 0;
		}
		if (f->use_end < off + len)
			f->use_end = off + len;
		if (f->last_clock < clock)
			f->last_clock = clock;
	}
	pthread_mutex_unlock(&l->lock);
}

void fs_learn_next_use(struct fs_learner *l, uint64_t ino, struct fs_learn_use *u)
{
	const struct learn_stream *st;
	struct learn_file *f;
	uint64_t at = 0;

	u->dist = FS_LEARN_UNKNOWN;
	u->write = false;
	u->now = false;
	u->size = 0;
	pthread_mutex_lock(&l->lock);
	f = file_find(l, ino);
	st = f ? f->st : NULL;
	if (f)
		u->size = f->size;
	if (st && f->last_pos != UINT64_MAX)
		u->now = f->last_pos + IN_USE >= st->n;
	if (st && st->period && f->last_pos != UINT64_MAX) {
		/* The soonest of its uses in the last cycle, one cycle on. */
		for (int i = 0; i < POSITIONS && f->pos[i] != UINT64_MAX; i++) {
			uint64_t next = f->pos[i] + st->period;

			if (next < st->n)
				break; /* older than a cycle */
			if (u->dist == FS_LEARN_UNKNOWN || next - st->n < u->dist) {
				u->dist = next - st->n;
				at = f->pos[i];
			}
		}
		if (u->dist == FS_LEARN_UNKNOWN)
			u->dist = 0; /* overdue: skipped this round, due any time now */
		else
			u->write = written_at(st, at);
		u->dist = scaled(l, st, u->dist);
	}
	pthread_mutex_unlock(&l->lock);
}

uint64_t fs_learn_distance(struct fs_learner *l, uint64_t ino)
{
	struct fs_learn_use u;

	fs_learn_next_use(l, ino, &u);
	return u.dist;
}

struct next_cand {
	uint64_t dist, ino;
	unsigned turn; /* among files as soon as each other: its stream's turn */
};

static int cand_cmp(const void *a, const void *b)
{
	const struct next_cand *x = a, *y = b;

	if (x->dist != y->dist)
		return x->dist < y->dist ? -1 : 1;
	return x->turn < y->turn ? -1 : x->turn > y->turn;
}

unsigned fs_learn_next(struct fs_learner *l, uint64_t *inos, unsigned max, uint64_t budget,
		       uint64_t *generation)
{
	struct next_cand *cand;
	unsigned k = 0, nc = 0, first;
	uint64_t bytes = 0;

	pthread_mutex_lock(&l->lock);
	*generation = l->generation;
	cand = l->nstreams && max ? malloc((size_t)l->nstreams * max * sizeof(*cand)) : NULL;
	if (!cand) {
		pthread_mutex_unlock(&l->lock);
		return 0;
	}
	first = l->next_turn++ % l->nstreams;
	/*
	 * In each stream, the file in use now (the newest record) first, for
	 * the rest of it; then the records after its record one period back
	 * come next. The streams' lists merge by distance (scaled). Ranks'
	 * streams of one period tie at every distance; the ties go in turns,
	 * from a stream one further at each call. In the streams' own order,
	 * the rank whose folder came first had its next files loaded first at
	 * every pass: eight ranks' slowest median was 12-18% behind the
	 * fastest (partitioned, durable), 6-9% with the turns.
	 */
	for (unsigned s = 0; s < l->nstreams; s++) {
		const struct learn_stream *st = l->streams[s];
		unsigned taken = 0, turn = (s + l->nstreams - first) % l->nstreams;

		for (uint64_t j = 0; st->period && j < st->period && taken < max; j++) {
			uint64_t pos = j == 0 ? st->n - 1 : st->n - st->period + j - 1;

			/* A use that begins with a write reads nothing: loading it is waste. */
			if (written_at(st, pos))
				continue;
			cand[nc++] = (struct next_cand){scaled(l, st, j), at(st, pos), turn};
			taken++;
		}
	}
	qsort(cand, nc, sizeof(*cand), cand_cmp);
	for (unsigned c = 0; c < nc && k < max; c++) {
		struct learn_file *f = file_find(l, cand[c].ino);
		bool dup = false;

		for (unsigned i = 0; i < k; i++)
			dup |= inos[i] == cand[c].ino;
		if (dup || !f)
			continue;
		if (k && bytes + f->size > budget)
			break;
		bytes += f->size;
		inos[k++] = cand[c].ino;
	}
	pthread_mutex_unlock(&l->lock);
	free(cand);
	return k;
}

void fs_learn_stats(struct fs_learner *l, struct fs_learn_stats *st)
{
	double conf = 0;
	uint64_t position = 0;

	pthread_mutex_lock(&l->lock);
	/* The least sure of the streams that hold a cycle, and where each is in it. */
	for (unsigned i = 0; i < l->nstreams; i++) {
		const struct learn_stream *s = l->streams[i];

		if (!s->period)
			continue;
		if (conf == 0 || s->confidence < conf)
			conf = s->confidence;
		position += s->n % s->period;
	}
	st->period = l->period;
	st->bytes = l->period ? l->bytes : 0;
	st->blocks = l->period ? l->blocks : 0;
	st->tails = l->period ? l->tails : 0;
	st->written = l->period ? l->written : 0;
	st->confidence = conf;
	st->position = position;
	st->records = l->n;
	st->streams = l->nstreams;
	st->files = l->nfiles;
	pthread_mutex_unlock(&l->lock);
}

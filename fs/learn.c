/*
 * learn.c - the access-trace learner: finds the cycle in which an offloader
 * touches its swap files, and ranks files by when they will be used next.
 *
 * A file is "used" when a read or write reaches it after it has been left
 * alone for a while: while more than REPEAT_MIN bytes (or a quarter of the
 * file) went to other files. Requests of two swappers, ranks or aio
 * threads that take turns on several files are so one use of each, and a
 * file read and later written back in one optimizer step is two uses. The
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
 */
#include "learn.h"

#include <stdlib.h>
#include <string.h>

#define RING 8192	    /* records kept */
#define REPEAT_MIN (8ULL << 20) /* bytes to other files that end a file's use, at least */
#define REPEAT_SHARE 4	    /* or this fraction of the file's size */
#define JITTER 16	    /* records a file may be early or late in the cycle, at most */
#define JITTER_SHARE 8	    /* and at most this fraction of the period */
#define IN_USE 2	    /* a file recorded within this many records is in use */
#define MATCH_WINDOW 32	    /* records compared to accept a period */
#define MATCH_SHARE 0.9	    /* of them that must match */
#define CONF_ALPHA 0.1	    /* weight of the latest prediction */
#define CONF_KEEP 0.5	    /* below this the cycle is dropped */
#define FILES_BUCKETS 4096
#define POSITIONS 4	    /* records of a file remembered: uses per cycle */

struct learn_file {
	uint64_t ino;
	uint64_t last_clock; /* the byte clock at its last touch */
	uint64_t last_pos;   /* record index of its last record, or UINT64_MAX */
	uint64_t pos[POSITIONS]; /* its last records, newest first; UINT64_MAX unused */
	uint64_t size;
	struct learn_file *next;
};

static struct learn_file *file_get(struct fs_learner *l, uint64_t ino)
{
	struct learn_file **b = &l->files[(ino * 0x9E3779B97F4A7C15ULL >> 50) % FILES_BUCKETS];
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
	return f;
}

static struct learn_file *file_find(struct fs_learner *l, uint64_t ino)
{
	struct learn_file *f = l->files[(ino * 0x9E3779B97F4A7C15ULL >> 50) % FILES_BUCKETS];

	while (f && f->ino != ino)
		f = f->next;
	return f;
}

int fs_learn_init(struct fs_learner *l)
{
	memset(l, 0, sizeof(*l));
	pthread_mutex_init(&l->lock, NULL);
	l->ring = calloc(RING, sizeof(*l->ring));
	l->ring_write = calloc(RING, sizeof(*l->ring_write));
	l->files = calloc(FILES_BUCKETS, sizeof(*l->files));
	return l->ring && l->ring_write && l->files ? 0 : -1;
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
	free(l->ring);
	free(l->ring_write);
	pthread_mutex_destroy(&l->lock);
}

static uint64_t at(const struct fs_learner *l, uint64_t pos)
{
	return l->ring[pos % RING];
}

/* How early or late a file may come in a cycle of p records: a small part of it. */
static uint64_t jitter(uint64_t p)
{
	return p / JITTER_SHARE < JITTER ? p / JITTER_SHARE : JITTER;
}

/*
 * How far from position pos, within j records, ino was recorded: 0 at pos,
 * or j + 1 when it was not.
 */
static uint64_t recorded_off(const struct fs_learner *l, uint64_t ino, uint64_t pos, uint64_t j)
{
	uint64_t lo = pos > j ? pos - j : 0, hi = pos + j, best = j + 1;

	if (hi >= l->n)
		hi = l->n - 1;
	if (l->n - lo > RING)
		lo = l->n - RING;
	for (uint64_t i = lo; i <= hi; i++)
		if (at(l, i) == ino && (i > pos ? i - pos : pos - i) < best)
			best = i > pos ? i - pos : pos - i;
	return best;
}

/* Whether ino was recorded within j records of position pos. */
static bool recorded_near(const struct fs_learner *l, uint64_t ino, uint64_t pos, uint64_t j)
{
	return recorded_off(l, ino, pos, j) <= j;
}

/*
 * Does the period p explain the records before the newest one? *cost: how
 * far they lie from where p puts them, in thousandths of a record on
 * average (a record not found counts as a jitter and one).
 */
static bool period_fits(const struct fs_learner *l, uint64_t p, uint64_t *cost)
{
	uint64_t window = p < MATCH_WINDOW ? p : MATCH_WINDOW, match = 0, off = 0;

	if (p == 0 || p >= RING / 2 || l->n < p + window + jitter(p))
		return false;
	for (uint64_t j = 1; j <= window; j++) {
		uint64_t d = recorded_off(l, at(l, l->n - j), l->n - j - p, jitter(p));

		match += d <= jitter(p);
		off += d;
	}
	*cost = off * 1000 / window;
	return match >= MATCH_SHARE * (double)window;
}

/* Sum the sizes of the files of one period, in bytes and in whole blocks. */
static void cycle_size(struct fs_learner *l)
{
	uint64_t sum = 0, blocks = 0, tails = 0;

	for (uint64_t j = 1; j <= l->period; j++) {
		struct learn_file *f = file_find(l, at(l, l->n - j));

		/* A file used twice in a period is counted at its last record. */
		if (f && f->last_pos == l->n - j) {
			sum += f->size;
			if (l->block) {
				blocks += (f->size + l->block - 1) / l->block;
				tails += f->size % l->block != 0;
			}
		}
	}
	l->bytes = sum;
	l->blocks = blocks;
	l->tails = tails;
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
 * jitter, and drifts.
 */
static void find_period(struct fs_learner *l, struct learn_file *f)
{
	uint64_t cur, best = 0, best_cost = UINT64_MAX, cost;
	bool held = l->period && period_fits(l, l->period, &cur);

	if (!held)
		cur = UINT64_MAX;

	for (int i = 1; i < POSITIONS && f->pos[i] != UINT64_MAX; i++) {
		uint64_t p = l->n - 1 - f->pos[i];

		if (p == l->period || (held && (p < l->period / 2 || p > 2 * l->period)))
			continue;
		if (period_fits(l, p, &cost) && cost < best_cost && cost < cur) {
			best = p;
			best_cost = cost;
		}
	}
	if (best) {
		l->period = best;
		l->confidence = MATCH_SHARE;
	}
}

static void record(struct fs_learner *l, struct learn_file *f, bool write)
{
	if (l->period) {
		bool hit = l->n >= l->period &&
			   recorded_near(l, f->ino, l->n - l->period, jitter(l->period));

		l->confidence = (1 - CONF_ALPHA) * l->confidence + CONF_ALPHA * (hit ? 1 : 0);
		if (l->confidence < CONF_KEEP)
			l->period = 0;
	}
	l->ring[l->n % RING] = f->ino;
	l->ring_write[l->n % RING] = write;
	f->last_pos = l->n;
	memmove(f->pos + 1, f->pos, (POSITIONS - 1) * sizeof(f->pos[0]));
	f->pos[0] = l->n;
	l->n++;
	l->generation++;
	find_period(l, f);
	if (l->period)
		cycle_size(l);
}

void fs_learn_touch(struct fs_learner *l, uint64_t ino, uint64_t size, uint64_t len, bool write)
{
	uint64_t clock = __atomic_add_fetch(&l->clock, len, __ATOMIC_RELAXED) - len;
	struct learn_file *f, *prev;

	if (__atomic_load_n(&l->last_ino, __ATOMIC_RELAXED) == ino)
		return; /* the same file again: the common case, no lock */
	pthread_mutex_lock(&l->lock);
	/* The file touched before was in use until now. */
	prev = file_find(l, l->last_ino);
	if (prev && prev->last_clock < clock)
		prev->last_clock = clock;
	__atomic_store_n(&l->last_ino, ino, __ATOMIC_RELAXED);
	l->touches++;
	f = file_get(l, ino);
	if (f) {
		uint64_t gap;

		f->size = size;
		gap = size / REPEAT_SHARE > REPEAT_MIN ? size / REPEAT_SHARE : REPEAT_MIN;
		if (f->last_pos == UINT64_MAX || clock > f->last_clock + gap)
			record(l, f, write);
		if (f->last_clock < clock)
			f->last_clock = clock;
	}
	pthread_mutex_unlock(&l->lock);
}

void fs_learn_next_use(struct fs_learner *l, uint64_t ino, struct fs_learn_use *u)
{
	struct learn_file *f;
	uint64_t at = 0;

	u->dist = FS_LEARN_UNKNOWN;
	u->write = false;
	u->now = false;
	u->size = 0;
	pthread_mutex_lock(&l->lock);
	f = file_find(l, ino);
	if (f)
		u->size = f->size;
	if (f && f->last_pos != UINT64_MAX)
		u->now = f->last_pos + IN_USE >= l->n;
	if (l->period && f && f->last_pos != UINT64_MAX) {
		/* The soonest of its uses in the last cycle, one cycle on. */
		for (int i = 0; i < POSITIONS && f->pos[i] != UINT64_MAX; i++) {
			uint64_t next = f->pos[i] + l->period;

			if (next < l->n)
				break; /* older than a cycle */
			if (u->dist == FS_LEARN_UNKNOWN || next - l->n < u->dist) {
				u->dist = next - l->n;
				at = f->pos[i];
			}
		}
		if (u->dist == FS_LEARN_UNKNOWN)
			u->dist = 0; /* overdue: skipped this round, due any time now */
		else
			u->write = l->ring_write[at % RING];
	}
	pthread_mutex_unlock(&l->lock);
}

uint64_t fs_learn_distance(struct fs_learner *l, uint64_t ino)
{
	struct fs_learn_use u;

	fs_learn_next_use(l, ino, &u);
	return u.dist;
}

unsigned fs_learn_next(struct fs_learner *l, uint64_t *inos, unsigned max, uint64_t budget,
		       uint64_t *generation)
{
	unsigned k = 0;
	uint64_t bytes = 0;

	pthread_mutex_lock(&l->lock);
	*generation = l->generation;
	/*
	 * The file in use now (the newest record) first, for the rest of it;
	 * then the records after its record one period back come next.
	 */
	for (uint64_t j = 0; l->period && j < l->period && k < max; j++) {
		uint64_t pos = j == 0 ? l->n - 1 : l->n - l->period + j - 1;
		uint64_t ino = at(l, pos);
		struct learn_file *f = file_find(l, ino);
		bool dup = false;

		/* A use that begins with a write reads nothing: loading it is waste. */
		if (l->ring_write[pos % RING])
			continue;
		for (unsigned i = 0; i < k; i++)
			dup |= inos[i] == ino;
		if (dup || !f)
			continue;
		if (k && bytes + f->size > budget)
			break;
		bytes += f->size;
		inos[k++] = ino;
	}
	pthread_mutex_unlock(&l->lock);
	return k;
}

void fs_learn_stats(struct fs_learner *l, struct fs_learn_stats *st)
{
	pthread_mutex_lock(&l->lock);
	st->period = l->period;
	st->bytes = l->period ? l->bytes : 0;
	st->blocks = l->period ? l->blocks : 0;
	st->tails = l->period ? l->tails : 0;
	st->confidence = l->period ? l->confidence : 0;
	st->position = l->period ? l->n % l->period : 0;
	st->records = l->n;
	pthread_mutex_unlock(&l->lock);
}

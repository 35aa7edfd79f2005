/*
 * evict.c - which block leaves the DRAM tier, and in which order the
 * flusher cleans dirty ones.
 *
 * Only CLEAN, unpinned entries are evicted; free slots come first. The
 * victim is chosen by the policy: Belady's rule on the owner's learned
 * cycle (cache_policy=auto while a cycle is known), else 2Q, CLOCK or
 * sampled LRU. A cycle larger than the cache keeps the blocks that stay
 * spread evenly over its objects (update_keep), so that hits and misses
 * mix in every file. The flusher writes back dirty blocks in the order
 * that eviction will take them (evict_take_cycle, evict_take_lru), so
 * that a slot is clean before anyone needs it.
 *
 * Policy: it decides; flush.c carries out the write-backs it chooses
 * (flush_start_wb). May call flush.c, marks.c and entry.c. 2q's sets are
 * kept by ghost.c as entries come and go; whether a cycle rules is
 * marks.c's marks_cycle_period, which every layer asks.
 */
#include "cache_int.h"
#include "fault.h"
#include "log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RANK_COST_SHARE 8 /* a ranking is reused for this many times what it took */
#define EVICT_SAMPLE 32	 /* candidates a sampled eviction compares */
#define CONVERT_MS 100	   /* dirty blocks not kept under the cycle: looked for this often */

/*
 * An object and its next use: evict.c ranks objects by it (rank_objects).
 * o is looked up again by obj at each use (rank_at): the object may have
 * gone since.
 */
struct rank {
	uint64_t obj;
	struct tb_obj *o;
	struct tb_use u;
};

/* ---- the victim ---- */

/*
 * Clean, not pinned by a reader, and not of a pinned object, unless pinned
 * objects hold more than their limit (their own writes can grow them).
 */
static bool evictable(const struct tb_store *s, const struct tb_entry *e)
{
	if (e->state != ES_CLEAN || e->pins)
		return false;
	return !(e->o && e->o->pinned) || s->n_pinned_res > s->pin_limit;
}

/*
 * The next evictable entry under the clock hand, which moves on past it;
 * NULL once the hand has moved *steps up to limit slots.
 */
static struct tb_entry *hand_next(struct tb_store *s, uint64_t *steps, uint64_t limit)
{
	while (*steps < limit) {
		struct tb_entry *e = &s->entries[s->clock_hand];

		++*steps;
		s->clock_hand = (s->clock_hand + 1) % s->nslots;
		if (evictable(s, e))
			return e;
	}
	return NULL;
}

/* CLOCK: the first evictable entry not referenced since the hand passed. */
static struct tb_entry *victim_clock(struct tb_store *s)
{
	uint64_t steps = 0;
	struct tb_entry *e;

	while ((e = hand_next(s, &steps, 2ULL * s->nslots))) {
		if (e->ref_bit) {
			e->ref_bit = false;
			continue;
		}
		return e;
	}
	return NULL;
}

/*
 * LRU, sampled as Redis samples it: look at up to EVICT_SAMPLE clean,
 * unpinned entries from the hand on and evict the least recently used.
 */
static struct tb_entry *victim_lru(struct tb_store *s)
{
	struct tb_entry *best = NULL, *e;
	uint64_t steps = 0;

	for (unsigned seen = 0; seen < EVICT_SAMPLE && (e = hand_next(s, &steps, s->nslots));
	     seen++)
		if (!best || e->last_use < best->last_use)
			best = e;
	return best;
}

/*
 * Belady's rule on the learned cycle. The owner tells, per object, how many
 * uses ahead it is needed next; the cache evicts from the object needed
 * furthest ahead (unknown objects first), and within an object the highest
 * block first, since files are read from the start. When the cycle is
 * larger than the cache, blocks that do not stay (see update_keep) go
 * before those that do, in the same order. The flusher cleans
 * dirty blocks in the same order. An object in use right now keeps the
 * blocks past its reader's position, and prefetched blocks not yet read are
 * kept too, as are blocks loaded for a hint (needed now, or the hint would
 * not be given; outside the cycle they would go first). Objects are ranked afresh for each choice; their number is what
 * is resident, tens to thousands, and at most RANK_MAX of them are looked
 * at. (Ranking objects rewritten next first, since evicting a clean copy
 * that is overwritten before it is read costs nothing, was tried: on the
 * optimizer's cycle it moved a fifth more, as the churn it adds ends in
 * more write-backs.)
 */
static int rank_cmp(const void *a, const void *b)
{
	const struct rank *x = a, *y = b;

	if (x->u.dist != y->u.dist)
		return x->u.dist > y->u.dist ? -1 : 1;
	/* At equal distance the object with more clean blocks: they cost no write. */
	return x->o->nclean > y->o->nclean ? -1 : x->o->nclean < y->o->nclean;
}

bool evict_protected(const struct tb_store *s, const struct tb_obj *o)
{
	return o->pinned && s->n_pinned_res <= s->pin_limit;
}

void evict_next_use(struct tb_store *s, uint64_t obj, struct tb_use *u)
{
	s->owner.next_use(s->owner.ctx, obj, u);
}

/*
 * The resident objects in eviction order. Ranking them asks the owner for
 * each one's next use and sorts them, under the store's lock: with
 * thousands of objects (a folder of many small files read in turn, or the
 * gradient and parameter files of a large model's ranks) that took more
 * than a millisecond, and was done for every eviction, 17% of the daemon's
 * time at 1024 objects. A ranking is kept for RANK_COST_SHARE times what it
 * took and then made anew (force: at once): a few objects are ranked
 * afresh at every choice, as before, and many at most an eighth of the
 * time. In between, the order does not change but for the objects used
 * since, whose next use moved from now to a cycle ahead (they stay last to
 * go, as when ranked), and objects that are new, which are not looked at
 * (their blocks are in use now). Returns how many are ranked; *fresh says
 * whether they were ranked just now.
 */
static size_t rank_objects(struct tb_store *s, bool force, bool *fresh)
{
	uint64_t t0 = dev_now_ns(), t1;
	size_t n = 0;

	*fresh = false;
	if (!force && s->rank && t0 - s->rank_ns < s->rank_ttl_ns)
		return s->rank_n;
	if (s->nobjs > s->rank_cap) {
		size_t cap = s->nobjs + s->nobjs / 2 + 16;
		struct rank *r = realloc(s->rank, cap * sizeof(*r));

		if (r) {
			s->rank = r;
			s->rank_cap = cap;
		}
	}
	for (struct tb_obj *o = LIST_FIRST(&s->objs); o && n < s->rank_cap;
	     o = LIST_NEXT(o, link)) {
		if (!o->n)
			continue;
		s->rank[n].obj = o->obj;
		s->rank[n].o = o;
		evict_next_use(s, o->obj, &s->rank[n].u);
		o->tail = s->rank[n].u.size % s->bs ? s->rank[n].u.size / s->bs + 1 : 0;
		n++;
	}
	if (n)
		qsort(s->rank, n, sizeof(*s->rank), rank_cmp);
	t1 = dev_now_ns();
	s->rank_n = n;
	memset(s->rank_pos, 0, sizeof(s->rank_pos));
	s->rank_ns = t1;
	s->rank_ttl_ns = (t1 - t0) * RANK_COST_SHARE;
	*fresh = true;
	return n;
}

/*
 * The i-th object of the ranking if it is still resident and has blocks
 * to take: clean ones, or with_dirty any, and is not protected by a pin.
 */
static struct tb_obj *rank_at(struct tb_store *s, size_t i, bool with_dirty)
{
	struct tb_obj *o = cache_obj_find(s, s->rank[i].obj);

	s->rank[i].o = o;
	if (!o || !(with_dirty ? o->n : o->nclean) || evict_protected(s, o))
		return NULL;
	return o;
}

/* Whether e lies ahead of its object's reader, the object being in use now. */
static bool ahead_of_reader(const struct tb_entry *e, const struct tb_use *u)
{
	return u->now && e->idx > e->o->last_idx;
}

/*
 * Under the cycle, which blocks stay resident. A steady pass misses the
 * same number of blocks whichever ones stay, so they are spread evenly
 * over every object of the cycle rather than kept as whole objects (the
 * first ones of the cycle, as Belady by object keeps them). Each file's
 * read then mixes hits, which cost the CPU a copy, with misses, which cost
 * the devices a read, and both work at once; whole objects made a phase
 * of hits with the devices idle and a phase of misses with the CPU
 * waiting. At twice the DRAM tier the swapper's device went from 54-64%
 * busy to 62-68%, and an iteration took 3-11% less time, moving the same
 * bytes (2cb445d). What stays is the dirty mark less the
 * prefetch window: the slots above the dirty mark (the flusher's clean
 * reserve) and the window are what blocks streaming through use. The
 * reserve was once taken off twice; with writers waiting for streaming
 * blocks rather than evicting kept ones, the 16 slots more that stay at
 * twice the DRAM tier cut the bytes moved from 0.537 to 0.527 of the raw
 * folder's. With a cycle that fits, keep_den is 0: every block stays.
 *
 * When the cycle does not fit and writes, the blocks streaming through
 * also get the write-back depth (wb_max, at most half the slots, at most
 * the blocks the cycle writes; stream_slots): without it, a writer of the
 * next phase waits for each write-back in turn. At 8x the DRAM tier
 * (dram=200M, 10 slots streaming) the partitioned swapper's writes had
 * under one request in flight and took 0.52-0.58 s per iteration against
 * the raw folder's 0.40-0.45; with 64 slots streaming, 0.36-0.45, for 4%
 * more bytes moved. A cycle that only reads has nothing to write back:
 * those slots stay with it, and a read-only cycle four times the DRAM
 * tier with 32 slots kept 24 blocks rather than 8.
 */
static uint64_t stream_slots(const struct tb_store *s, uint64_t written)
{
	uint64_t n = s->wb_max < s->nslots / 2 ? s->wb_max : s->nslots / 2;

	return n < written ? n : written;
}

static void update_keep(struct tb_store *s)
{
	uint64_t blocks = 0, tails = 0, written = 0, keep, stream;
	uint64_t margin = s->pf_win.depth;

	if (s->owner.cycle_size)
		s->owner.cycle_size(s->owner.ctx, &blocks, &tails, &written);
	stream = stream_slots(s, written);
	keep = s->dirty_max > margin ? s->dirty_max - margin : 0;
	if (blocks > keep)
		keep = keep > stream ? keep - stream : 0; /* a cycle that fits streams nothing */
	s->keep_num = keep;
	s->keep_den = blocks > keep ? blocks : 0;
	/*
	 * Last blocks that their objects fill in part do not stay (unless the
	 * whole cycle does): the devices move such a block only up to the end
	 * of its object (stored_len, cache_covers_stored), so its slot saves little
	 * I/O, where a whole block's saves a block each way. The share of the
	 * others that stays, as a threshold on 64-bit fractions; all of them:
	 * UINT64_MAX.
	 */
	s->keep_below = keep < blocks - tails
				? (uint64_t)(((unsigned __int128)keep << 64) / (blocks - tails))
				: UINT64_MAX;
}

/*
 * Whether e's block stays resident under the cycle (update_keep). Apart
 * from partly filled last blocks, which do not, those whose index (offset
 * by a hash of the object) read with its bits reversed as a fraction, the
 * van der Corput sequence, is below the share kept: any run of blocks
 * keeps about that share, evenly spaced, and a smaller share keeps a
 * subset of a larger one, so the cycle growing or shrinking moves only
 * the difference.
 */
bool evict_kept(const struct tb_store *s, const struct tb_entry *e)
{
	uint64_t x = e->idx + mix(e->obj, 0);

	if (!s->keep_den)
		return true;
	if (e->o && e->idx + 1 == e->o->tail)
		return false;
	if (s->keep_below == UINT64_MAX)
		return true;
	x = (x >> 1 & 0x5555555555555555ULL) | (x & 0x5555555555555555ULL) << 1;
	x = (x >> 2 & 0x3333333333333333ULL) | (x & 0x3333333333333333ULL) << 2;
	x = (x >> 4 & 0x0F0F0F0F0F0F0F0FULL) | (x & 0x0F0F0F0F0F0F0F0FULL) << 4;
	return __builtin_bswap64(x) < s->keep_below;
}

/*
 * The object's best victim, its highest evictable block: mode 0 only a
 * block not kept (any block of an object outside the cycle; none of one
 * due now, which the cycle does not place), 1 a kept one too, 2 any,
 * loaded ahead or not.
 */
static struct tb_entry *obj_victim(struct tb_store *s, const struct rank *r, int mode)
{
	struct tb_entry *best = NULL;
	bool outside = r->u.dist == UINT64_MAX;

	if (mode == 0 && r->u.dist == 0)
		return NULL;
	for (struct tb_entry *e = LIST_FIRST(&r->o->entries); e; e = LIST_NEXT(e, olink)) {
		if (!evictable(s, e))
			continue;
		if (mode < 2 && (e->prefetched || e->hinted || ahead_of_reader(e, &r->u)))
			continue;
		if (mode == 0 && !outside && evict_kept(s, e))
			continue;
		if (!best || e->idx > best->idx)
			best = e;
	}
	return best;
}

/*
 * The victim under the cycle. A block that stays is not taken while a
 * block streaming through is on its way out, if the caller may wait for
 * that one (wait_stream): its slot is clean in a moment, and taking a block
 * that stays costs a read when it is next used. A writer waits for blocks
 * in write-back and for those take_stream writes back next (WAIT_READY),
 * a prefetch only for those in write-back (WAIT_WB: it tries again later),
 * a reader for none: its wait is the application's. The optimizer's
 * writer dirties the blocks that stream through faster than the devices
 * write them back, and took 16-30 MB of the blocks that stay per iteration
 * at twice the DRAM tier; none since.
 *
 * Each mode looks on from the object where it found its last victim, and
 * round to the start: the objects before it had none then, and a ranking
 * kept for a while (rank_objects) holds the objects read since its making
 * last, behind all those whose blocks that do not stay are gone already.
 * Walking those from the start at every eviction made each one cost a
 * lookup per resident object.
 */
static struct tb_entry *victim_ranked(struct tb_store *s, size_t n, struct tb_use *vu,
				      enum wait_stream wait_stream, bool *waits)
{
	*waits = false;
	for (int mode = s->keep_den ? 0 : 1; mode < 3; mode++) {
		if (mode == 1 && s->keep_den && wait_stream &&
		    (s->n_stream_wb || (wait_stream == WAIT_READY && s->n_stream_ready))) {
			*waits = true;
			return NULL;
		}
		for (size_t k = 0, i = s->rank_pos[mode]; k < n; k++, i = i + 1 < n ? i + 1 : 0) {
			struct tb_entry *e = rank_at(s, i, false) ? obj_victim(s, &s->rank[i], mode) : NULL;

			if (e) {
				s->rank_pos[mode] = i;
				*vu = s->rank[i].u;
				if (mode == 2)
					vu->dist = 0, vu->write = false;
				if (mode > 0 && s->keep_den && evict_kept(s, e))
					s->kept_evicted++;
				return e;
			}
		}
	}
	return NULL;
}

/* A ranking kept from before that holds no victim is made anew: new objects may. */
static struct tb_entry *victim_cycle(struct tb_store *s, struct tb_use *vu, enum wait_stream wait_stream)
{
	bool fresh, waits;
	size_t n = rank_objects(s, false, &fresh);
	struct tb_entry *e;

	update_keep(s);
	e = victim_ranked(s, n, vu, wait_stream, &waits);
	if (!e && !waits && !fresh) {
		n = rank_objects(s, true, &fresh);
		e = victim_ranked(s, n, vu, wait_stream, &waits);
	}
	return e;
}

/*
 * 2Q (Johnson and Shasha, VLDB 1994), full version, sampled: new blocks
 * enter A1in, a FIFO of at most a quarter of the slots; a block evicted
 * from A1in is remembered in the ghost list A1out and goes to Am, managed
 * as LRU, if it is used again while remembered. The paper sizes A1out at
 * half the buffer; here it remembers twice the slots (16 bytes a key), so
 * that data reused across a scan as large as the DRAM tier still gets in.
 * Re-reads within A1in (the kernel reading one block in 128 KiB pieces)
 * do not promote, so a one-time scan never displaces the hot set.
 */
static struct tb_entry *victim_2q(struct tb_store *s)
{
	struct tb_entry *old_in = NULL, *lru_hot = NULL, *e;
	uint64_t resident = s->nslots - s->free_list.n, steps = 0;
	bool in_over = resident - s->n_hot > s->nslots / 4;

	for (unsigned seen = 0; seen < EVICT_SAMPLE && (e = hand_next(s, &steps, s->nslots));
	     seen++) {
		if (!e->hot && (!old_in || e->admit < old_in->admit))
			old_in = e;
		if (e->hot && (!lru_hot || e->last_use < lru_hot->last_use))
			lru_hot = e;
	}
	if (old_in && (in_over || !lru_hot))
		return old_in;
	return lru_hot ? lru_hot : old_in;
}

/*
 * The clean entry to evict by the policy. *vu, when the cycle ranks it,
 * says when its block is needed next (dist UINT64_MAX otherwise). NULL
 * when none is evictable, or, with wait_stream, none should be yet
 * (victim_cycle).
 */
struct tb_entry *evict_pick(struct tb_store *s, struct tb_use *vu, enum wait_stream wait_stream)
{
	vu->dist = UINT64_MAX;
	vu->write = vu->now = false;
	switch (s->cfg.policy) {
	case TB_POLICY_LRU:
		return victim_lru(s);
	case TB_POLICY_CLOCK:
		return victim_clock(s);
	case TB_POLICY_2Q:
		return victim_2q(s);
	default:
		return marks_cycle_period(s) ? victim_cycle(s, vu, wait_stream) : victim_2q(s);
	}
}

/* ---- what the flusher cleans first ---- */

/* Entries of o in eviction order: behind its reader by block, highest first. */
static int evict_order_cmp(const void *a, const void *b)
{
	const struct tb_entry *x = *(struct tb_entry *const *)a, *y = *(struct tb_entry *const *)b;

	return x->idx > y->idx ? -1 : x->idx < y->idx;
}

/*
 * evict_take_cycle's victims, the objects of the ranking in order; kept
 * blocks only with all_kept or over the dirty mark (over). Lock held.
 */
static size_t take_ranked(struct tb_store *s, struct tb_entry **out, size_t max, size_t nr,
			  bool all_kept, int64_t over, int64_t *want, uint64_t now,
			  uint64_t *next_ms)
{
	size_t n = 0;

	for (size_t i = 0; i < nr && *want > 0 && n < max; i++) {
		struct tb_obj *o = rank_at(s, i, true);
		size_t k = 0, behind;

		if (!o)
			continue;
		for (struct tb_entry *e = LIST_FIRST(&o->entries); e; e = LIST_NEXT(e, olink))
			if (!ahead_of_reader(e, &s->rank[i].u))
				s->scratch[k++] = e;
		behind = k;
		for (struct tb_entry *e = LIST_FIRST(&o->entries); e; e = LIST_NEXT(e, olink))
			if (ahead_of_reader(e, &s->rank[i].u))
				s->scratch[k++] = e;
		qsort(s->scratch, behind, sizeof(*s->scratch), evict_order_cmp);
		qsort(s->scratch + behind, k - behind, sizeof(*s->scratch), evict_order_cmp);
		for (size_t j = 0; j < k && *want > 0 && n < max; j++) {
			struct tb_entry *e = s->scratch[j];

			if (!all_kept && s->keep_den && evict_kept(s, e) &&
			    (over <= 0 || s->n_stream_wb))
				continue; /* see evict_take_cycle */
			if (flush_may_clean(s, e, now, next_ms) && s->wb_inflight < s->wb_max) {
				flush_start_wb(s, e);
				out[n++] = e;
				(*want)--;
			}
		}
	}
	return n;
}

/*
 * What the reserve or the dirty mark wants cleaned, in whole batches that
 * fit under wb_max: a device that packs blocks into objects (s3) holds
 * them until it has a whole object, or nothing more came for a while.
 * Cleaned a block for a block as the writer took slots, the blocks came as
 * slowly as PUTs ended, and at 64 blocks per object a 1 GiB dd made objects
 * of 19 blocks on average: 54 PUTs and 65 GETs per GB instead of 16; a
 * batch cut short by wb_max made objects of 22. Readers or writers waiting
 * for a slot (starved) get what they need whatever the batch.
 */
static int64_t wb_batch(const struct tb_store *s, int64_t want, int64_t starved)
{
	int64_t b = s->wb_batch, room;

	if (want <= 0 || b <= 1)
		return want;
	want = (want + b - 1) / b * b;
	room = s->wb_max > s->wb_inflight ? (int64_t)(s->wb_max - s->wb_inflight) / b * b : 0;
	return want > room && starved <= 0 ? room : want;
}

/*
 * Under the cycle: the blocks that eviction will take next are those of
 * the objects needed furthest ahead; the first clean_high of them in that
 * order must be free or clean (the reserve that evictions take without
 * waiting), so the dirty ones among them are written back now. Above the
 * dirty mark, dirty blocks go in the same order until it is met. Blocks
 * that stay (when the cycle is larger than the cache) are written back
 * only above the dirty mark, and then only while no block streaming
 * through is being written back: that one frees what the mark needs (one
 * that waits to be, take_stream starts first when it can). A block
 * that stays and was written back for the reserve cost a write, and the
 * eviction it was cleaned for a read at its next use; at twice the DRAM
 * tier this was 20-25 blocks of each per iteration, the last of what the
 * devices moved above the cycle's misses. Readers and writers waiting for
 * a slot that nothing in flight will free (flush_starved) get one cleaned
 * whatever the marks say, a kept block if no other can go.
 */
size_t evict_take_cycle(struct tb_store *s, struct tb_entry **out, size_t max, uint64_t now,
			uint64_t *next_ms)
{
	int64_t want, over, starved;
	size_t n = 0, nr = 0;
	bool ranked = false, fresh;

	update_keep(s);
	if (s->keep_den && now >= s->convert_ms) {
		/*
		 * Dirty blocks of the cycle that do not stay (what stayed before
		 * the cycle was known, or before it grew): eviction takes them
		 * next, so they go now, but not the block a writer is at or
		 * those past it, nor a partly written one. Blocks streaming
		 * through are take_stream's.
		 */
		nr = rank_objects(s, false, &fresh);
		ranked = true;
		for (size_t i = 0; i < nr && n < max && s->wb_inflight < s->wb_max; i++) {
			if (s->rank[i].u.dist == UINT64_MAX || s->rank[i].u.dist == 0 ||
			    !rank_at(s, i, true))
				continue; /* not in the cycle, or due now, or gone */
			for (struct tb_entry *e = LIST_FIRST(&s->rank[i].o->entries);
			     e && n < max && s->wb_inflight < s->wb_max; e = LIST_NEXT(e, olink))
				if (!evict_kept(s, e) && !e->partial &&
				    flush_may_clean(s, e, now, next_ms) &&
				    !(s->rank[i].u.now && e->idx >= e->o->last_idx)) {
					flush_start_wb(s, e);
					out[n++] = e;
				}
		}
		s->convert_ms = n ? now : now + CONVERT_MS;
	}
	want = (int64_t)s->clean_high - (int64_t)cache_evictable(s) - (int64_t)s->wb_inflight;
	over = flush_dirty_over(s, s->clean_low);
	if (over > want)
		want = over;
	starved = flush_starved(s);
	if (starved > want)
		want = starved;
	want = wb_batch(s, want, starved);
	if (want <= 0)
		return n;
	if (!ranked)
		nr = rank_objects(s, false, &fresh);
	/*
	 * Pass 1, only while readers or writers wait for a slot that nothing
	 * in flight will free: kept blocks too, in the same order.
	 */
	for (int pass = 0; pass < 2 && want > 0 && n < max; pass++) {
		if (pass == 1 && (!s->keep_den || flush_starved(s) <= 0))
			break;
		n += take_ranked(s, out + n, max - n, nr, pass == 1, over, &want, now, next_ms);
	}
	return n;
}

/*
 * Without a cycle: the oldest dirty blocks first, and those of 2q's
 * re-referenced set only when the others do not make up the reserve;
 * from flush_dirty_below on.
 */
size_t evict_take_lru(struct tb_store *s, struct tb_entry **out, size_t max, uint64_t now,
		      uint64_t *next_ms)
{
	int64_t want = (int64_t)s->clean_high - (int64_t)cache_evictable(s) -
		       (int64_t)s->wb_inflight,
		over = flush_dirty_over(s, flush_dirty_below(s)), starved = flush_starved(s);
	size_t n = 0;

	if (over > want)
		want = over;
	if (starved > want)
		want = starved;
	want = wb_batch(s, want, starved);

	for (int hot = 0; hot < 2 && want > 0; hot++) {
		struct tb_entry *e = TAILQ_FIRST(&s->dirty_list.q);
		size_t scanned = 0;

		while (e && want > 0 && n < max && s->wb_inflight < s->wb_max &&
		       scanned++ < FLUSH_SCAN_MAX) {
			struct tb_entry *next = TAILQ_NEXT(e, link);

			if (e->hot == hot && !evict_protected(s, e->o) &&
			    flush_may_clean(s, e, now, next_ms)) {
				flush_start_wb(s, e);
				out[n++] = e;
				want--;
			}
			e = next;
		}
	}
	return n;
}

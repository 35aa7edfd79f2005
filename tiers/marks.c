/*
 * marks.c - the dirty marks and the reserve of clean slots: how much the
 * flusher must clean, and waking it; and whether a learned cycle rules the
 * cache (marks_cycle_period), which the marks and every layer above ask.
 *
 * Shared state at the bottom of the cache: the requests (cache.c), the
 * policies (evict.c, flusher.c, prefetch.c), write-back (flush.c) and
 * placement (place.c) read the marks and kick the flusher. It calls
 * nothing of the cache but the inline helpers of cache_int.h; the flusher
 * it wakes waits on s->flush_cv (flusher.c).
 */
#include "cache_int.h"

#define CLEAN_KICK 8 /* evictions under the cycle between the flusher's looks */

/* ---- the dirty marks, and waking the flusher ---- */

/*
 * Dirty blocks over the dirty mark less `below': these must be cleaned
 * whatever they are.
 */
int64_t flush_dirty_over(struct tb_store *s, uint64_t below)
{
	return (int64_t)s->ndirty - (int64_t)s->wb_inflight -
	       ((int64_t)s->dirty_max - (int64_t)below);
}

/*
 * Slots that readers and writers wait for (entry_alloc_wait) and that no
 * write-back in flight will free: the flusher cleans this many whatever
 * the reserve and the dirty mark say. Under the cycle, blocks that stay
 * are not written back for the reserve; with every other slot pinned by
 * clients or held by writers, a write waited for a slot for ever
 * (unit-flush_starve). So did one without a cycle, when the reserve still
 * counted pinned clean blocks (cache_evictable): GPU read pins on 14 of
 * 256 slots and the other 242 dirty, under the flusher's mark (244),
 * hung tests/cuda/test_gpu_proto.sh.
 */
int64_t flush_starved(const struct tb_store *s)
{
	return (int64_t)s->slot_waiters - (int64_t)s->wb_inflight;
}

/*
 * Without a cycle, and when the oldest dirty block was overwritten blind
 * (a whole rewrite of a stored block that was not cached, by a writer that
 * has written the whole file since it last read it: it streams over the
 * file), write-back starts dirty_bg below the dirty mark, so that a
 * writer held at the mark finds the device queues full. From clean_low
 * below it, an O_DIRECT overwrite of a file 4x the DRAM tier kept 1.8
 * requests in flight on the disk, against the raw folder's 9, and ran at
 * 0.8x raw. Files read before they are rewritten (the optimizer's state
 * before the learner has its cycle) keep the lazy mark: written back early
 * in the first iterations, they left the swap's resident set smaller for
 * good, and each steady iteration moved 3% more (94b2c68).
 */
uint64_t flush_dirty_below(struct tb_store *s)
{
	struct tb_entry *oldest = TAILQ_FIRST(&s->dirty_list.q);

	return oldest && oldest->blind && !marks_cycle_period(s) ? s->dirty_bg : s->clean_low;
}

/*
 * Wake the flusher: there is work for it, or a reason to look again. Lock
 * held. The flusher drops the lock between looking for work and going to
 * sleep (it writes and commits in between); a kick in that gap would be
 * lost, so it sleeps only if no kick came since it looked (flush_main).
 * Lost, the stop at unmount left it asleep for ever, and an fsync that
 * found its blocks pinned waited with it.
 */
void flush_kick(struct tb_store *s)
{
	s->flush_kicks++;
	pthread_cond_signal(&s->flush_cv);
}

/*
 * The flusher keeps clean_high free or clean slots ahead of need; wake it
 * when they run short, when dirty data passes the background mark, and
 * after every few evictions while a cycle ranks the victims, since each
 * use moves which blocks lie furthest ahead. Also while someone waits for
 * a slot that nothing in flight frees: a writer letting go of its block
 * (tb_put_dirty) may have made one it can clean.
 */
void flush_kick_cleaner(struct tb_store *s, bool evicted)
{
	uint64_t below = flush_dirty_below(s);

	if (cache_evictable(s) < s->clean_high || flush_starved(s) > 0 ||
	    (below > s->clean_low && flush_dirty_over(s, below) > 0) ||
	    (evicted && ++s->evict_since_clean >= CLEAN_KICK))
		flush_kick(s);
}

/* ---- the policy's mode ---- */

uint64_t marks_cycle_period(struct tb_store *s)
{
	if (s->cfg.policy != TB_POLICY_AUTO || !s->owner.next_use || !s->owner.cycle_period)
		return 0;
	return s->owner.cycle_period(s->owner.ctx);
}

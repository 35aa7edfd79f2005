/*
 * flusher.c - the flusher thread, and what it writes back and when: the
 * policy of write-back.
 *
 * Write-back is lazy. A dirty block stays in DRAM until eviction needs its
 * slot, so a block rewritten while cached is never written back, and a
 * block that dies in DRAM (unlink, truncate, punch) is never written at
 * all. The flusher keeps clean_low to clean_high slots free or clean ahead
 * of need, writing back the dirty blocks the policy would evict first
 * (evict.c), so that neither a reader nor a writer waits on a write-back.
 * Under the cycle, a block that streams through (take_stream) is written
 * back as soon as it is rewritten. It also writes back what must go now:
 * blocks that fsync, flush or unmount wait on, and blocks dirty for longer
 * than dirty_expire_ms, the bound on what a crash can lose without fsync.
 * Every sync_interval_ms while there are commits, the owner's own
 * (metadata) included, and at once after sync_commits of them, it asks
 * for a sync point. With nothing to do it sleeps without a deadline.
 *
 * Policy: it decides, and flush.c carries out (the writes, their commits,
 * the sync point). May call: evict.c (the order of victims), flush.c,
 * marks.c, entry.c; nothing calls it but tb_start (store.c), which starts
 * flush_main.
 */
#include "cache_int.h"
#include "fault.h"
#include "log.h"

#include <errno.h>
#include <stdlib.h>

#define STOP_RETRY_MS 20000   /* at the stop, failed write-backs are retried this long */
#define COMMIT_BATCH_MAX 1024
#define STREAM_SCAN 256	 /* newest dirty blocks the flusher looks at for streaming ones */
#define BUSY_RETRY_MS 10 /* a dirty block pinned by a writer is looked at again after */

/* ---- what is written back ---- */

/*
 * Whether a dirty block must be written back now, whatever the cache
 * needs: fsync, flush or unmount wait on it, or it has been dirty longer
 * than the age limit. *at says when it would be due otherwise.
 */
static bool due(struct tb_store *s, struct tb_entry *e, uint64_t now, uint64_t *at)
{
	*at = s->cfg.dirty_expire_ms ? e->dirty_ms + s->cfg.dirty_expire_ms : UINT64_MAX;
	if (s->stopping && e->retries) {
		/* Failed before: retried until the stop's deadline (flusher_done). */
		uint64_t end = s->stop_ms + STOP_RETRY_MS;

		if (now >= end)
			return false;
		if (now < e->dirty_ms || e->wpins || e->merging) {
			*at = now < e->dirty_ms ? e->dirty_ms : now + BUSY_RETRY_MS;
			if (*at > end)
				*at = end;
			return false;
		}
		return true;
	}
	if (e->wpins || e->merging) {
		/*
		 * Look again soon: a writer's pin is held for one copy. A block
		 * due now (urgent, or the store stopping) is looked at again
		 * in BUSY_RETRY_MS whatever the age limit: the writer's unpin
		 * wakes the flusher only for space, and with dirty_expire_ms=0
		 * an fsync or a flush that found the block pinned waited for
		 * whatever woke the flusher next.
		 */
		if (*at < now + BUSY_RETRY_MS || e->urgent || s->stopping)
			*at = now + BUSY_RETRY_MS;
		return false;
	}
	if (e->retries && now < e->dirty_ms) {
		*at = e->dirty_ms;
		return false;
	}
	if (e->urgent || s->stopping)
		return true;
	if (now < *at)
		return false;
	s->expired++;
	return true;
}

/*
 * Take the dirty entries that are due into WB. Lock held. The dirty list
 * is in the order blocks became dirty, so the age limit needs only its
 * head, but for blocks marked urgent or waiting to retry, which go to its
 * head (make_urgent); the whole list is walked (FLUSH_SCAN_MAX at most)
 * while there are such blocks (due_scan).
 */
static size_t take_due(struct tb_store *s, struct tb_entry **out, size_t max, uint64_t now,
		       uint64_t *next_ms)
{
	struct tb_entry *e = TAILQ_FIRST(&s->dirty_list.q);
	bool full = s->due_scan || s->stopping, again = false;
	size_t n = 0, scanned = 0;

	while (e && n < max && s->wb_inflight < s->wb_max && scanned++ < FLUSH_SCAN_MAX) {
		struct tb_entry *next = TAILQ_NEXT(e, link);
		uint64_t at = UINT64_MAX;

		if (due(s, e, now, &at)) {
			flush_start_wb(s, e);
			e->req.push = true;
			out[n++] = e;
		} else {
			if (at < *next_ms)
				*next_ms = at;
			/*
			 * A block a writer holds says nothing of those after
			 * it: a GPU client's write pin on the oldest kept every
			 * block behind it from the age limit.
			 */
			if (e->urgent || e->retries)
				again = true;
			else if (!full && !e->wpins && !e->merging)
				break; /* younger than the age limit, and so is the rest */
		}
		e = next;
	}
	if (full && !e && !again)
		s->due_scan = false;
	return n;
}

/*
 * Under the cycle, a stored block rewritten whole while it was not cached,
 * or loaded since its last write-back, streams through the cache (the
 * stream flag, set by make_dirty). In the optimizer's read-then-rewrite
 * cycle, a clean copy whose next use is a whole rewrite costs nothing to
 * evict, and Belady evicts the block used last, so such a block is gone
 * before its next read; only a block that stayed cached since its last
 * write-back is hit next time. Written back now, its slot is clean when
 * the next miss wants one. Lazily, misses found every slot dirty and
 * waited for the write-back of a block just rewritten, and writers waited
 * for the dirty budget: at twice the DRAM tier, the pipelined swapper
 * moved 0.57-0.64 of the raw folder's bytes and now moves 0.55-0.59, in
 * 0.81 s an iteration against 0.90 (cc945b9). Only the newest
 * dirty blocks are looked at. Lock held.
 */
static size_t take_stream(struct tb_store *s, struct tb_entry **out, size_t max, uint64_t now,
			  uint64_t *next_ms)
{
	size_t n = 0, seen = 0;

	for (struct tb_entry *e = TAILQ_LAST(&s->dirty_list.q, elist_q), *prev;
	     e && n < max && seen < STREAM_SCAN; e = prev, seen++) {
		prev = TAILQ_PREV(e, elist_q, link);
		if (s->wb_inflight >= s->wb_max)
			break;
		if (e->stream && e->fill >= s->bs && !e->partial && !evict_protected(s, e->o) &&
		    flush_may_clean(s, e, now, next_ms)) {
			flush_start_wb(s, e);
			out[n++] = e;
		}
	}
	return n;
}

/*
 * Take dirty entries into WB: those due (fsync, flush, unmount, the age
 * limit), the blocks streaming through, then the victims the cache wants
 * clean ahead of need. Lock held.
 */
static size_t take_dirty(struct tb_store *s, struct tb_entry **out, size_t max, uint64_t now,
			 uint64_t *next_ms)
{
	size_t n = take_due(s, out, max, now, next_ms);

	if (n == max || s->wb_inflight >= s->wb_max)
		return n;
	s->evict_since_clean = 0;
	if (marks_cycle_period(s)) {
		n += take_stream(s, out + n, max - n, now, next_ms);
		if (n == max || s->wb_inflight >= s->wb_max)
			return n;
		return n + evict_take_cycle(s, out + n, max - n, now, next_ms);
	}
	return n + evict_take_lru(s, out + n, max - n, now, next_ms);
}

/* ---- the flusher ---- */

/* Commits or released locations wait for a sync point. Lock held. */
static bool unsynced(struct tb_store *s)
{
	return s->commits_since_sync || s->npending ||
	       __atomic_load_n(&s->meta_commits, __ATOMIC_RELAXED);
}

/*
 * Whether the flusher may end: the store stops, nothing is in flight, and
 * nothing is dirty, or what is has failed its write-backs until
 * STOP_RETRY_MS after the stop. At the stop, a block that failed is
 * retried every STOP_RETRY_GAP_MS: a device that healed takes it (one
 * put down by its errors is tried again after 5 s, dev.c); one that does
 * not keeps it, and tb_close says it is lost. Retried for ever, a device
 * failing every write kept the daemon from ending at unmount. Lock held.
 */
static bool flusher_done(struct tb_store *s)
{
	if (!s->stopping || s->done || s->wb_inflight)
		return false;
	return !s->ndirty || now_ms() >= s->stop_ms + STOP_RETRY_MS;
}

void *flush_main(void *arg)
{
	struct tb_store *s = arg;
	struct tb_entry **batch = calloc(COMMIT_BATCH_MAX, sizeof(*batch));
	struct tb_entry **ready = calloc(2 * COMMIT_BATCH_MAX + s->wb_max, sizeof(*ready));
	uint64_t last_sync = now_ms();

	pthread_setname_np(pthread_self(), "tfs-flusher");
	dev_io_priority();
	if (!batch || !ready) {
		log_err("flusher: out of memory");
		abort();
	}
	pthread_mutex_lock(&s->lock);
	for (;;) {
		uint64_t now = now_ms(), next_ms = UINT64_MAX, kicks;
		size_t n, nready = 0;
		struct tb_entry *done;
		bool want_sync, failed;

		if (flusher_done(s))
			break;
		kicks = s->flush_kicks;
		n = take_dirty(s, batch, COMMIT_BATCH_MAX, now, &next_ms);
		done = s->done;
		s->done = NULL;
		pthread_mutex_unlock(&s->lock);

		fault_inject("flusher", FAULT_FLUSHER, 0); /* test builds: op=flusher */
		flush_start_writes(s, batch, n, ready, &nready);
		failed = false;
		while (done) {
			struct tb_entry *e = done;

			done = e->done_next;
			if (e->err) {
				pthread_mutex_lock(&s->lock);
				dev_unplace(s->dev[tb_loc_dev(e->new_loc)], tb_loc_slot(e->new_loc));
				/* ENOSPC: the device is full now (dev.c) */
				flush_wb_failed(s, e, e->err, e->err == -ENOSPC);
				pthread_mutex_unlock(&s->lock);
				failed = true; /* its retry is due later: look again before sleeping */
				continue;
			}
			ready[nready++] = e;
		}
		flush_commit_batch(s, ready, nready);

		pthread_mutex_lock(&s->lock);
		now = now_ms();
		want_sync = s->sync_req ||
			    (now - last_sync >= s->cfg.sync_interval_ms && unsynced(s));
		if (want_sync) {
			s->sync_req = false;
			pthread_mutex_unlock(&s->lock);
			flush_do_sync(s);
			last_sync = now_ms();
			pthread_mutex_lock(&s->lock);
			continue;
		}
		if (n || nready || failed || s->done || s->flush_kicks != kicks)
			continue; /* a kick while the lock was dropped: look again */
		/* Asleep until something is due: an idle mount costs no CPU. */
		if (unsynced(s) && next_ms > last_sync + s->cfg.sync_interval_ms)
			next_ms = last_sync + s->cfg.sync_interval_ms;
		if (next_ms == UINT64_MAX) {
			pthread_cond_wait(&s->flush_cv, &s->lock);
		} else if (next_ms > now) {
			struct timespec ts;

			deadline_in(&ts, next_ms - now);
			pthread_cond_timedwait(&s->flush_cv, &s->lock, &ts);
		}
	}
	pthread_mutex_unlock(&s->lock);
	free(batch);
	free(ready);
	return NULL;
}

/*
 * flush.c - write-back, its commits and the sync point, and fsync and
 * flush: the mechanism that carries out what the flusher (flusher.c) and
 * eviction (evict.c) decide to clean.
 *
 * A block taken into WB (flush_start_wb) is written in the write-back
 * class (flush_start_writes). A partly written block waits flush_delay_ms
 * for the rest of its bytes first (flush_may_clean). All-zero blocks
 * become holes with no I/O, and a block whose bytes are stored already is
 * shared (dedup); the others get a fresh slot (place.c). Finished
 * write-backs are committed to the owner in batches, one transaction per
 * batch (flush_commit_batch); a failed one goes back to DIRTY and is
 * retried (flush_wb_failed). A sync point (flush_do_sync) makes the
 * commits durable (device flush, then the owner's sync) and only then
 * returns released locations to the allocators, and wakes the thread that
 * gives their space back to the filesystem (giveback.c). fsync and flush
 * mark their blocks urgent and wait here.
 *
 * May call: place.c, load.c (the merge of a partial block, dedup's read
 * back), verify.c (hashes), giveback.c, and the shared layer (entry.c,
 * marks.c, fair.c); never the policies above it.
 */
#include "cache_int.h"
#include "fault.h"
#include "log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FULL_RETRY_MS 1000 /* a write-back that found no room, or a stall, is tried this often */
#define WB_RETRY_BASE_MS 100
#define WB_MAX_RETRIES 6
#define WB_PEND_MAX 64	 /* write-backs placed before they go to the devices together */
/*
 * The owner's commits bring a sync point at once after cfg.sync_commits
 * of them (256). Until a sync point is durable, LMDB keeps every page that
 * the commits since the one before replaced (its reader is pinned there,
 * fs/meta.c), about 10 pages of 4 KiB a commit: 30,000 creates and
 * unlinks grew the store by 2.3 GB while no data was written back. A
 * committer past twice that many waits for the sync point under way
 * (META_SYNC_WAIT_MS at most): a sync slowed by a busy disk (1 s) let
 * 100,000 creates leave 147 MB, 117 of it free pages.
 */
#define META_SYNC_WAIT_MS 5000

/* ---- I/O completions (device threads) ---- */

static void write_done(struct tb_io *r, int err)
{
	struct tb_entry *e = (struct tb_entry *)((char *)r - offsetof(struct tb_entry, req));
	struct tb_store *s = e->s;

	pthread_mutex_lock(&s->lock);
	e->err = err;
	e->done_next = s->done;
	s->done = e;
	flush_kick(s);
	pthread_mutex_unlock(&s->lock);
}

/* ---- write-back ---- */

/*
 * Whether a dirty block the cache wants clean may go now: a partly written
 * one waits flush_delay_ms for the rest of its bytes first.
 */
bool flush_may_clean(struct tb_store *s, struct tb_entry *e, uint64_t now, uint64_t *next_ms)
{
	if (e->state != ES_DIRTY || e->wpins || e->merging)
		return false;
	if (e->retries && now < e->dirty_ms) {
		if (e->dirty_ms < *next_ms)
			*next_ms = e->dirty_ms;
		return false;
	}
	if (e->partial && now < e->dirty_ms + s->cfg.flush_delay_ms) {
		if (e->dirty_ms + s->cfg.flush_delay_ms < *next_ms)
			*next_ms = e->dirty_ms + s->cfg.flush_delay_ms;
		return false;
	}
	return true;
}

/*
 * The bytes of a block to store: up to its last non-zero byte, in whole
 * sectors, or 0 when it is all zeros (a hole). The block's zero end, a
 * file's last block past the end of the file, is not written (cache_io_len).
 */
static size_t stored_len(const void *p, size_t bs)
{
	const uint64_t *w = p;
	size_t n = bs / sizeof(*w);

	while (n && !w[n - 1])
		n--;
	return (n * sizeof(*w) + SECTOR - 1) / SECTOR * SECTOR;
}

/*
 * Put a WB entry back to DIRTY after a failure. Lock held. It stays in
 * DRAM and is tried again, without end: after WB_MAX_RETRIES, fsync
 * reports the failure, but the block waits for its device to heal or for
 * space to come back. Retries back off; one that found no device with
 * room (no_room: ENOSPC from placement or from the device, which is then
 * full and takes no new block until it has room, dev_measure.c usable) costs no
 * I/O to try again, and is tried every FULL_RETRY_MS at least, so that
 * space freed is used soon. A commit that failed had written its block:
 * its retries back off in full (a full metadata filesystem cost a write
 * of every dirty block a second). The run of failures with no write-back
 * succeeding since is the store's stall, which bounds the wait of
 * writers at the dirty mark.
 */
void flush_wb_failed(struct tb_store *s, struct tb_entry *e, int err, bool no_room)
{
	uint64_t now = now_ms(), backoff;

	e->retries++;
	e->err = err;
	s->n.wb_errors++;
	err_recent_add(&s->wb_recent, now * 1000000);
	if (!s->stall_err)
		s->stall_ms = now;
	s->stall_err = err;
	s->stall_commit = false; /* flush_commit_batch says otherwise */
	if (e->retries >= WB_MAX_RETRIES && e->o)
		e->o->wb_err = err;
	if (log_ratelimit(&s->wb_log_sec, 10))
		log_err("write-back of block %llu of object %llu failed: %s (attempt %u)",
			(unsigned long long)e->idx, (unsigned long long)e->obj, strerror(-err),
			e->retries);
	cache_set_state(s, e, ES_DIRTY);
	/*
	 * Retried as soon as its backoff has passed, whoever sent it: fsync
	 * waits on it, or the cache wanted its slot.
	 */
	e->urgent = true;
	s->due_scan = true;
	backoff =
	    s->stopping ? STOP_RETRY_GAP_MS : WB_RETRY_BASE_MS << (e->retries < 8 ? e->retries : 8);
	if (no_room && backoff > FULL_RETRY_MS)
		backoff = FULL_RETRY_MS;
	e->dirty_ms = now + backoff;
	elist_prepend(&s->dirty_list, e); /* where take_due finds it: see make_urgent */
	s->wb_inflight--;
	pthread_cond_broadcast(&s->state_cv);
}

/*
 * While the store is stalled and turns writers away, one failed block is
 * tried again every FULL_RETRY_MS, whatever its backoff (a commit that
 * failed backs off to 25 s): the first to succeed ends the stall, so
 * writers are not turned away for long once space is back. Lock held.
 */
void flush_stall_probe(struct tb_store *s)
{
	uint64_t now = now_ms();

	if (now - s->stall_probe_ms < FULL_RETRY_MS)
		return;
	s->stall_probe_ms = now;
	/* Failed blocks go to the head of the dirty list (flush_wb_failed), as urgent ones do. */
	size_t seen = 0;
	for (struct tb_entry *e = TAILQ_FIRST(&s->dirty_list.q); e && seen++ < FLUSH_SCAN_MAX;
	     e = TAILQ_NEXT(e, link)) {
		if (!e->retries || e->wpins || e->merging)
			continue;
		e->dirty_ms = now;
		e->urgent = true;
		s->due_scan = true;
		flush_kick(s);
		return;
	}
}

void flush_start_wb(struct tb_store *s, struct tb_entry *e)
{
	elist_remove(&s->dirty_list, e);
	cache_set_state(s, e, ES_WB);
	e->urgent = false;
	e->req.push = false;
	s->wb_inflight++;
}

/*
 * Whether the stored block at loc, of len bytes and with hash (the entry's),
 * holds the entry's bytes, as read back from its device. A block that does
 * not is either another with the same hash or a damaged copy of this one:
 * in the second case (its bytes do not match the hash either) *damaged is
 * set. No lock held.
 */
static bool dedup_same_stored(struct tb_store *s, struct tb_entry *e, uint64_t loc, size_t len,
			      bool *damaged)
{
	size_t io = cache_io_len(len);
	char *bounce = NULL;
	bool same;

	*damaged = false;
	/* Its stored bytes, and zeros past them: the whole block its hash is of. */
	if (!cache_stored_ok(s, loc, len) || posix_memalign((void **)&bounce, IO_ALIGN, s->bs))
		return false;
	memset(bounce + io, 0, s->bs - io);
	if (cache_read_sync(s, loc, len, bounce) != 0) {
		free(bounce);
		return false;
	}
	same = memcmp(bounce, cache_slot_data(s, e), io) == 0 &&
	       e->new_len <= len; /* stored_len, set by flush_start_writes */
	if (!same)
		*damaged = cache_check(s, bounce, cache_read_sum(s, true, e->hash), loc,
				       CACHE_NO_OBJ, 0) != 0;
	free(bounce);
	return same;
}

/*
 * The entry's bytes, hashed (flush_start_writes): if a stored block has the same
 * hash (and, in verify mode, the same bytes as read back from its device),
 * the entry is committed as a reference to it. Otherwise it is stored, and
 * entered in the index (e->index) unless the block found holds other bytes
 * with the same hash. No lock held; the entry is in WB.
 */
static bool dedup_match(struct tb_store *s, struct tb_entry *e)
{
	uint64_t id, loc;
	size_t len;
	bool same, damaged = false;

	e->index = true;
	if (s->owner.dedup_find(s->owner.ctx, e->hash, &id, &loc, &len) != 0)
		return false;
	if (s->cfg.dedup == TB_DEDUP_VERIFY) {
		struct tb_entry *c;

		/* The stored copy's bytes, from DRAM when a clean copy is cached. */
		pthread_mutex_lock(&s->lock);
		c = cache_find_loc(s, loc, e);
		if (c) {
			cache_pin(s, c);
			s->n.dedup_verify_cached++;
		}
		pthread_mutex_unlock(&s->lock);
		if (c) {
			same = memcmp(cache_slot_data(s, c), cache_slot_data(s, e), s->bs) == 0;
			cache_unpin(s, c);
		} else {
			same = dedup_same_stored(s, e, loc, len, &damaged);
		}
		if (!same) {
			pthread_mutex_lock(&s->lock);
			s->n.dedup_verify_mismatch++;
			pthread_mutex_unlock(&s->lock);
			/*
			 * Not the same bytes: store it. Outside the index, unless
			 * the block found is damaged: then this one takes its
			 * place, so that later copies share good bytes.
			 */
			e->index = damaged;
			return false;
		}
	}
	e->share_id = id;
	e->new_loc = loc;
	return true;
}

/* Queue placed write-backs on their devices at once (tb_plug). */
static void submit_writes(struct tb_store *s, struct tb_entry **v, size_t n)
{
	tb_plug();
	for (size_t i = 0; i < n; i++)
		dev_submit(s->dev[tb_loc_dev(v[i]->new_loc)], &v[i]->req);
	tb_unplug();
}

/*
 * Outside the lock: holes go straight to commit, the rest to a device.
 * With a device that packs blocks into objects (s3), the writes go to the
 * devices wb_batch at a time, placed first (hashing and the dedup lookup
 * take a while for each), so that the engine gets an object's blocks
 * together: submitted one by one, a flusher preempted halfway through a
 * batch on a loaded machine made the engine close the object with part of
 * its blocks, and a 1 GiB dd made 20 PUTs and 21 GETs per GiB instead of
 * 16. The plug is held only while they are queued: a block read back for
 * dedup=verify must not wait in one.
 */
void flush_start_writes(struct tb_store *s, struct tb_entry **batch, size_t n,
			struct tb_entry **holes, size_t *nholes)
{
	struct tb_entry *pend[WB_PEND_MAX];
	size_t np = 0, pend_max = s->wb_batch < WB_PEND_MAX ? s->wb_batch : WB_PEND_MAX;

	for (size_t i = 0; i < n; i++) {
		struct tb_entry *e = batch[i];
		uint64_t loc;

		if (e->partial) {
			int ret = cache_merge_io(s, e);

			pthread_mutex_lock(&s->lock);
			if (ret < 0) {
				flush_wb_failed(s, e, ret, false);
				pthread_mutex_unlock(&s->lock);
				continue;
			}
			e->partial = false;
			s->n.partial_merged += (uint64_t)ret;
			pthread_cond_broadcast(&s->state_cv);
			pthread_mutex_unlock(&s->lock);
		}
		e->share_id = 0;
		e->hashed = e->index = false;
		e->new_len = stored_len(cache_slot_data(s, e), s->bs);
		if (!e->new_len) {
			e->new_loc = TB_LOC_NONE;
			holes[(*nholes)++] = e;
			continue;
		}
		/* Every stored block keeps its hash: each read of it is checked. */
		cache_hash(s, cache_slot_data(s, e), e->hash);
		e->hashed = true;
		if (s->cfg.dedup != TB_DEDUP_OFF && !e->no_share && dedup_match(s, e)) {
			holes[(*nholes)++] = e; /* no I/O: committed as a shared block */
			continue;
		}
		pthread_mutex_lock(&s->lock);
		int ret = place_block(s, &loc);
		if (ret < 0) {
			flush_wb_failed(s, e, ret, ret == -ENOSPC);
			pthread_mutex_unlock(&s->lock);
			continue;
		}
		pthread_mutex_unlock(&s->lock);
		if (s->dev[tb_loc_dev(loc)]->eng->alloc)
			e->new_len = s->bs; /* slots packed into objects (s3) are whole */
		e->new_loc = loc;
		e->req.op = IO_WRITE;
		e->req.cls = IO_WB;
		e->req.slot = tb_loc_slot(loc);
		e->req.buf = cache_slot_data(s, e);
		e->req.len = cache_io_len(e->new_len);
		e->req.done = write_done;
		if (pend_max <= 1) {
			dev_submit(s->dev[tb_loc_dev(loc)], &e->req);
			continue;
		}
		pend[np++] = e;
		if (np == pend_max) {
			submit_writes(s, pend, np);
			np = 0;
		}
	}
	submit_writes(s, pend, np);
}

/* Commit finished write-backs in one owner transaction, then settle them. */
void flush_commit_batch(struct tb_store *s, struct tb_entry **v, size_t n)
{
	struct tb_commit *c;
	int ret;

	if (!n)
		return;
	c = calloc(n, sizeof(*c));
	ret = c ? 0 : -ENOMEM;
	for (size_t i = 0; c && i < n; i++) {
		c[i].obj = v[i]->obj;
		c[i].idx = v[i]->idx;
		c[i].loc = v[i]->new_loc;
		c[i].len = v[i]->new_len;
		c[i].share_id = v[i]->share_id;
		c[i].hashed = v[i]->hashed;
		c[i].index = v[i]->index;
		memcpy(c[i].hash, v[i]->hash, TB_HASH_LEN);
	}
	if (c)
		ret = s->owner.commit(s->owner.ctx, c, n);
	free(c);

	pthread_mutex_lock(&s->lock);
	for (size_t i = 0; i < n; i++) {
		struct tb_entry *e = v[i];

		if (ret == -ESTALE) {
			/*
			 * A block to share went away: write these again, no
			 * error, and those that shared a block as new blocks.
			 * Shared again, the same batch failed the same way for
			 * ever (the owner's transaction was undone, so the index
			 * still named the block), and the flusher spun while an
			 * fsync waited: seen with an all-zero block, whose commit
			 * dropped the block's last reference, ahead of a block
			 * that shared it.
			 */
			if (e->new_loc != TB_LOC_NONE && !e->share_id)
				dev_free(s->dev[tb_loc_dev(e->new_loc)], tb_loc_slot(e->new_loc));
			if (e->share_id)
				e->no_share = true;
			e->share_id = 0;
			cache_set_state(s, e, ES_DIRTY);
			e->urgent = true;
			s->due_scan = true;
			elist_prepend(&s->dirty_list, e);
			s->wb_inflight--;
			continue;
		}
		if (ret < 0) {
			if (e->new_loc != TB_LOC_NONE && !e->share_id)
				dev_free(s->dev[tb_loc_dev(e->new_loc)], tb_loc_slot(e->new_loc));
			e->share_id = 0;
			flush_wb_failed(s, e, ret, false);
			s->stall_commit = true;
			continue;
		}
		if (e->share_id)
			s->n.dedup_hits++;
		cache_set_stored(e, e->new_loc != TB_LOC_NONE); /* a shared block's too */
		if (e->new_loc == TB_LOC_NONE)
			s->n.holes_written++;
		else if (!e->share_id)
			s->n.writeback_bytes += cache_io_len(e->new_len);
		e->share_id = 0;
		e->no_share = false;
		e->loc = e->new_loc;
		e->written_back = true;
		cache_set_state(s, e, ES_CLEAN);
		e->retries = 0;
		e->err = 0;
		e->reserved = false;
		s->reserved--;
		s->ndirty--;
		fair_cleaned(s, e);
		s->wb_inflight--;
	}
	if (ret == 0) {
		s->commits_since_sync += n;
		s->stall_err = 0; /* write-back works: the writers at the dirty mark wait on */
	}
	pthread_cond_broadcast(&s->state_cv);
	pthread_cond_broadcast(&s->space_cv);
	pthread_mutex_unlock(&s->lock);
}

static int flush_devs(void *arg)
{
	struct tb_store *s = arg;
	int ret = 0;

	for (unsigned i = 0; i < s->n_devs; i++) {
		int r = dev_sync(s->dev[i]);

		if (r < 0 && !ret)
			ret = r;
	}
	return ret;
}

/*
 * The window of the owner's commits between sync points: sync_commits,
 * less where the owner's store grew past its bound within one (urgent):
 * such a window is halved for the rest of the mount. The store keeps
 * about two windows of replaced pages, and only a shorter window keeps it
 * within a small filesystem (counted in commits alone, each window grew it
 * until the disk was full). A window that grew back after each cut let
 * the store creep up to its filesystem's last page: rm failed on a 10 MiB
 * one, so a cut stays.
 */
#define META_WINDOW_MIN 8
static uint64_t meta_window(struct tb_store *s)
{
	uint64_t w = __atomic_load_n(&s->meta_window, __ATOMIC_RELAXED);

	return w && w < s->cfg.sync_commits ? w : s->cfg.sync_commits;
}

/* At a sync point: the next window may be cut again. Lock held. */
static void meta_window_next(struct tb_store *s)
{
	s->meta_grew = false;
}

/*
 * The owner's sync, which flushes the devices once it has chosen the
 * commit to make durable; then the released locations go back. With
 * scratch=on, only the stop's sync point flushes: the others make the
 * commits safe from a kill, not from a power cut (the owner empties such
 * a store after one), and a released location goes back at once.
 */
int flush_do_sync(struct tb_store *s)
{
	uint64_t *frees;
	size_t nfrees;
	int ret = 0;
	bool power;

	pthread_mutex_lock(&s->sync_lock);
	pthread_mutex_lock(&s->lock);
	frees = s->pending;
	nfrees = s->npending;
	s->pending = NULL;
	s->npending = s->cap_pending = 0;
	s->commits_since_sync = 0;
	/* This sync point covers the owner's commits so far; those after count for the next. */
	__atomic_store_n(&s->meta_commits, 0, __ATOMIC_RELAXED);
	meta_window_next(s);
	s->syncing = true;
	power = !s->cfg.scratch || s->stopping;
	pthread_mutex_unlock(&s->lock);

	ret = s->owner.sync(s->owner.ctx, power ? flush_devs : NULL, s, power);

	pthread_mutex_lock(&s->lock);
	if (ret == 0) {
		for (size_t i = 0; i < nfrees; i++)
			dev_free(s->dev[tb_loc_dev(frees[i])], tb_loc_slot(frees[i]));
		free(frees);
		/* Free now, and free as of the durable state: a look sees them. */
		if (nfrees)
			giveback_arm(s);
	} else {
		/* Not durable: keep them pending for the next try. */
		for (size_t i = 0; i < nfrees; i++) {
			if (s->npending == s->cap_pending) {
				size_t cap = s->cap_pending ? s->cap_pending * 2 : 64;
				uint64_t *p = realloc(s->pending, cap * sizeof(*p));

				if (!p)
					break;
				s->pending = p;
				s->cap_pending = cap;
			}
			s->pending[s->npending++] = frees[i];
		}
		free(frees);
	}
	s->n.syncs++;
	s->sync_gen++;
	s->syncing = false;
	pthread_cond_broadcast(&s->space_cv);
	pthread_mutex_unlock(&s->lock);
	pthread_mutex_unlock(&s->sync_lock);
	return ret;
}

void tb_meta_committed(struct tb_store *s, bool urgent)
{
	uint64_t n = __atomic_add_fetch(&s->meta_commits, 1, __ATOMIC_RELAXED), gen;
	uint64_t at = meta_window(s), max = 2 * at;
	struct timespec ts;

	/* The first sets the flusher's deadline; the count wants a sync point now. */
	if (!urgent && n != 1 && (!at || (n != at && n < max)))
		return;
	pthread_mutex_lock(&s->lock);
	/* The store is over its bound until the sync point under way sets the next one. */
	if (urgent && !s->meta_grew && !s->syncing) {
		uint64_t half = n / 2 > META_WINDOW_MIN ? n / 2 : META_WINDOW_MIN;

		s->meta_grew = true;
		if (half < meta_window(s))
			__atomic_store_n(&s->meta_window, half, __ATOMIC_RELAXED);
	}
	if (urgent || (at && n >= at))
		s->sync_req = true;
	flush_kick(s);
	/*
	 * Past the bound, wait for the sync point under way: not the flusher
	 * (its commits are what the sync point waits for), nor before it runs.
	 */
	if ((urgent || (at && n >= max)) && s->started && !s->stopping &&
	    !pthread_equal(pthread_self(), s->flusher)) {
		gen = s->sync_gen;
		deadline_in(&ts, META_SYNC_WAIT_MS);
		while (s->sync_gen == gen && !s->stopping)
			if (pthread_cond_timedwait(&s->space_cv, &s->lock, &ts) == ETIMEDOUT)
				break;
	}
	pthread_mutex_unlock(&s->lock);
}

/* ---- fsync, flush and sync ---- */

static bool obj_has_dirty(struct tb_obj *o, uint64_t seq, int *err)
{
	for (struct tb_entry *e = LIST_FIRST(&o->entries); e; e = LIST_NEXT(e, olink)) {
		if (e->state != ES_DIRTY && e->state != ES_WB)
			continue;
		if (e->dirty_seq > seq)
			continue;
		if (e->state == ES_DIRTY && e->retries >= WB_MAX_RETRIES) {
			*err = e->err ? e->err : -EIO;
			continue;
		}
		return true;
	}
	return false;
}

/*
 * Make a DIRTY entry urgent, at the head of the dirty list: take_due walks
 * FLUSH_SCAN_MAX entries from the head, and an fsync's blocks behind more
 * older ones than that (4 GiB dirty, with 1 MiB blocks) were reached only
 * as those aged, or never with dirty_expire_ms=0. Lock held.
 */
static void make_urgent(struct tb_store *s, struct tb_entry *e)
{
	e->urgent = true;
	elist_remove(&s->dirty_list, e);
	elist_prepend(&s->dirty_list, e);
}

/* Mark o's blocks dirtied up to seq urgent; true when one was not already. Lock held. */
static bool mark_urgent(struct tb_store *s, struct tb_obj *o, uint64_t seq)
{
	bool marked = false;

	for (struct tb_entry *e = LIST_FIRST(&o->entries); e; e = LIST_NEXT(e, olink))
		if (e->state == ES_DIRTY && e->dirty_seq <= seq && !e->urgent) {
			make_urgent(s, e);
			marked = true;
		}
	return marked;
}

/*
 * A block whose write-back failed is tried again now for a new fsync or
 * flush, not at the end of its backoff: space may have come back, or its
 * device healed, since. One that failed WB_MAX_RETRIES times, which fsync
 * and flush no longer wait for, gets one more try that they wait for.
 * Lock held.
 */
static void retry_now(struct tb_entry *e)
{
	if (e->state != ES_DIRTY || !e->retries)
		return;
	if (e->retries >= WB_MAX_RETRIES)
		e->retries = WB_MAX_RETRIES - 1;
	e->dirty_ms = now_ms();
}

/*
 * The waits below end: each block is written back or has failed
 * WB_MAX_RETRIES times (backing off, a few seconds: FULL_RETRY_MS for a
 * full device), or the request was interrupted (tb_interruptible).
 */
int tb_flush_obj(struct tb_store *s, uint64_t obj)
{
	struct tb_obj *o;
	uint64_t seq;
	int err = 0, ret;

	pthread_mutex_lock(&s->lock);
	seq = s->dirty_seq;
	o = cache_obj_find(s, obj);
	if (o)
		for (struct tb_entry *e = LIST_FIRST(&o->entries); e; e = LIST_NEXT(e, olink)) {
			retry_now(e);
			if (e->state == ES_DIRTY && !e->urgent)
				make_urgent(s, e);
		}
	s->due_scan = true;
	flush_kick(s);
	while ((o = cache_obj_find(s, obj)) && obj_has_dirty(o, seq, &err)) {
		ret = cache_wait(s, &s->state_cv);
		if (ret) {
			pthread_mutex_unlock(&s->lock);
			return ret;
		}
		/*
		 * A write-back that failed left its block DIRTY and no longer
		 * urgent: without this its retry waited for the age limit
		 * (dirty_expire_ms), and so did this fsync.
		 */
		if ((o = cache_obj_find(s, obj)) && mark_urgent(s, o, seq))
			flush_kick(s);
	}
	if (o && o->wb_err) {
		if (!err)
			err = o->wb_err;
		o->wb_err = 0;
		cache_obj_maybe_free(s, o);
	}
	pthread_mutex_unlock(&s->lock);
	return err;
}

static int flush_all(struct tb_store *s)
{
	uint64_t seq;
	int err = 0;

	pthread_mutex_lock(&s->lock);
	seq = s->dirty_seq;
	for (struct tb_entry *e = TAILQ_FIRST(&s->dirty_list.q); e; e = TAILQ_NEXT(e, link)) {
		retry_now(e);
		e->urgent = true;
	}
	s->due_scan = true;
	flush_kick(s);
	for (;;) {
		bool busy = false;

		err = 0;
		for (uint32_t i = 0; i < s->nslots && !busy; i++) {
			struct tb_entry *e = &s->entries[i];

			if ((e->state == ES_DIRTY || e->state == ES_WB) && e->dirty_seq <= seq) {
				if (e->state == ES_DIRTY && e->retries >= WB_MAX_RETRIES)
					err = e->err ? e->err : -EIO;
				else
					busy = true;
			}
		}
		if (!busy)
			break;
		err = cache_wait(s, &s->state_cv);
		if (err)
			break;
	}
	pthread_mutex_unlock(&s->lock);
	return err;
}

int tb_sync(struct tb_store *s)
{
	int err = flush_all(s);
	int ret = flush_do_sync(s);

	return err ? err : ret;
}

int tb_durable(struct tb_store *s)
{
	return flush_do_sync(s);
}

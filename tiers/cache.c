/*
 * cache.c - the block cache in the DRAM arena: the requests on it (reads,
 * writes, dead blocks, pins of objects, residency) and its entries' states.
 *
 * Every slot of the arena has one entry. An entry caches block (obj, idx)
 * in one of four states:
 *
 *   LOADING  a read from the block's home device is in flight
 *   CLEAN    the slot equals the persisted block (or the block is new and
 *            was committed as a hole)
 *   DIRTY    written since the last write-back; holds one block of space
 *            reservation so that write-back can never find the tiers full
 *   WB       being written back; writers wait (stable pages), readers don't
 *
 * A write that covers only part of an uncached, persisted block does not
 * read the block first: the entry becomes DIRTY and "partial", with a
 * bitmap of the 1 KiB sectors written so far. Offloaders that split a
 * tensor over threads at 1 KiB-aligned offsets fill every block from two
 * requests, and this saves a read per block. Only when a partial block must
 * be whole (a read of it, its write-back, or a write not on sector
 * boundaries) are the missing sectors merged in from the persisted copy.
 *
 * Entries are found through a hash of (obj, idx) and listed per object, so
 * that fsync and truncate touch only their own blocks. Each object counts
 * its dirty blocks that have no stored copy yet (tb_unstored), which is
 * what its owner's block map does not show of it. Readers and writers pin
 * an entry while they copy (tb_get, tb_get_write); a block that needs a
 * slot takes a free one, or one that the policy frees.
 *
 * The layers of the cache, top down (cache_int.h lists them; a file calls
 * only the files below it): this file and store.c (a store's life and
 * stats) serve requests; the policy decides: prefetch.c what loads ahead,
 * flusher.c what is written back and when, evict.c what leaves DRAM; the
 * mechanism carries out: flush.c write-back, commits and sync, place.c
 * placement and space, load.c loads and merges, verify.c the checks of
 * what is read, giveback.c space given back; and below all, what every
 * one of them shares: entry.c the entries, marks.c the dirty marks,
 * ghost.c 2q's sets, fair.c the dirty budget's share among users.
 */
#include "cache_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STREAM_WAIT_MS 50 /* a writer waits this long at most for a streaming block's slot */

/*
 * The store's stall (flush.c, flush_wb_failed): every write-back has failed for
 * stall_wait_ms or more, none succeeding since. Then a wait for what only
 * a write-back frees (room under the dirty mark, a slot) ends with the
 * failure: -ENOSPC, else -EIO. 0 while not stalled. Lock held.
 */
static int stalled(struct tb_store *s)
{
	if (!s->stall_err || now_ms() - s->stall_ms < s->cfg.stall_wait_ms)
		return 0;
	flush_stall_probe(s);
	return s->stall_err == -ENOSPC ? -ENOSPC : -EIO;
}

/* ---- slots ---- */

/* A free entry: a free slot, else a victim among clean unpinned ones. */
static struct tb_entry *entry_alloc(struct tb_store *s, enum wait_stream wait_stream)
{
	struct tb_entry *e = TAILQ_FIRST(&s->free_list.q);
	struct tb_use vu;

	if (!e)
		e = evict_pick(s, &vu, wait_stream);
	if (!e) {
		flush_kick(s);
		return NULL;
	}
	return cache_entry_take(s, e);
}

/*
 * Wait for any slot; re-checks the hash, since the wait drops the lock.
 * 0 with *out the slot taken, or NULL when (obj, idx) is cached now; or
 * -EINTR (cache_wait). wait_stream: see victim_cycle. That wait is
 * bounded (STREAM_WAIT_MS): a streaming block that does not go (its
 * object pinned, or a write-back that keeps failing) does not hold a
 * writer. Only the wait after it counts as starved: that block is on its
 * way out, and the flusher would write back another with it for nothing.
 * Writers that passed the dirty mark together may fill the slots beyond it,
 * and then only a write-back frees one: while write-back is stalled, the
 * wait ends with the failure (stalled), as the wait at the mark does.
 * nowait: -EAGAIN where it would wait.
 */
static int entry_alloc_wait(struct tb_store *s, uint64_t obj, uint64_t idx, struct tb_entry **out,
			    enum wait_stream wait_stream, bool nowait)
{
	struct timespec until;
	int ret;

	if (wait_stream)
		deadline_in(&until, STREAM_WAIT_MS);
	for (;;) {
		*out = NULL;
		if (cache_lookup(s, obj, idx))
			return 0;
		*out = entry_alloc(s, wait_stream);
		if (*out)
			return 0;
		flush_kick(s);
		if (nowait)
			return -EAGAIN;
		if (!wait_stream) {
			ret = stalled(s);
			if (ret)
				return ret;
			/* The flusher cleans one for us (flush_starved). */
			s->slot_waiters++;
			ret = cache_wait(s, &s->space_cv);
			s->slot_waiters--;
			if (ret)
				return ret;
		} else if (pthread_cond_timedwait(&s->space_cv, &s->lock, &until) == ETIMEDOUT) {
			wait_stream = WAIT_NONE;
		}
	}
}

static void make_dirty(struct tb_store *s, struct tb_entry *e, bool blind, uint32_t uid)
{
	/*
	 * A stored block rewritten while not cached, or loaded since its last
	 * write-back: it streams through (see take_stream).
	 */
	bool uncached = e->state == ES_LOADING && e->stored; /* a whole rewrite, placeholder */

	e->stream = ((e->state == ES_CLEAN && !e->written_back) || uncached) &&
		    marks_cycle_period(s) && !(s->keep_den && evict_kept(s, e));
	e->blind = uncached && blind;
	cache_pf_clear(s, e);
	if (e->written_back)
		s->wb_rewritten++; /* written back, then written again in DRAM */
	e->written_back = false;
	cache_set_state(s, e, ES_DIRTY);
	e->dirty_seq = ++s->dirty_seq;
	e->dirty_ms = now_ms();
	e->fill = 0;
	e->reserved = true;
	s->ndirty++;
	fair_dirtied(s, e, uid);
	elist_append(&s->dirty_list, e);
	if (s->dirty_list.n == 1 && s->cfg.dirty_expire_ms)
		flush_kick(s); /* the flusher sleeps until the head ages */
	flush_kick_cleaner(s, false);
}

/* ---- the read side ---- */

/*
 * A reader waits on e, a block loading in the prefetch class: if its read
 * is still queued, it moves to the demand class, ahead of the prefetches
 * and write-backs queued. Local devices only: an s3 tier's prefetches go
 * out in runs, one ranged GET for an object's blocks. Lock held.
 */
static void promote(struct tb_store *s, struct tb_entry *e)
{
	for (unsigned i = 0; i < s->n_devs && !e->pf_promoted; i++) {
		if (s->dev[i]->eng->alloc)
			continue;
		if (dev_promote(s->dev[i], &e->req)) {
			e->pf_promoted = true;
			s->n.prefetch_promoted++;
		}
	}
}

static bool sector_aligned(struct tb_store *s, size_t off, size_t len)
{
	return off % SECTOR == 0 && ((off + len) % SECTOR == 0 || off + len == s->bs);
}

int tb_get(struct tb_store *s, uint64_t obj, uint64_t idx, struct tb_ref *ref,
	   struct tb_waiter *w)
{
	struct tb_entry *e;
	int ret;

	pthread_mutex_lock(&s->lock);
	for (;;) {
		e = cache_lookup(s, obj, idx);
		if (e && (e->placeholder || (e->partial && e->state == ES_WB))) {
			/* resolving a write's block, or the flusher is completing it */
			pthread_cond_wait(&s->state_cv, &s->lock);
			continue;
		}
		if (e && e->partial && !e->merging) {
			ret = cache_merge_partial(s, e);
			if (ret) {
				pthread_mutex_unlock(&s->lock);
				return ret;
			}
			continue;
		}
		if (e && e->state != ES_LOADING && !e->merging) {
			cache_pin(s, e);
			e->ref_bit = true;
			e->last_use = ++s->ticks;
			e->o->last_idx = idx;
			s->n.hits++;
			if (e->prefetched)
				s->n.prefetch_used++;
			cache_pf_clear(s, e);
			pthread_mutex_unlock(&s->lock);
			ref->e = e;
			ref->data = cache_slot_data(s, e);
			return 0;
		}
		if (e) { /* loading for someone else */
			e->o->last_idx = idx;
			if (e->pf_load && !e->pf_promoted)
				promote(s, e);
			if (w) {
				w->next = e->waiters;
				e->waiters = w;
				pthread_mutex_unlock(&s->lock);
				return 1;
			}
			pthread_cond_wait(&s->state_cv, &s->lock);
			continue;
		}
		ret = entry_alloc_wait(s, obj, idx, &e, WAIT_NONE, false);
		if (ret) {
			pthread_mutex_unlock(&s->lock);
			/* DRAM holds blocks that cannot be written back: to a reader, EIO. */
			return ret == -ENOSPC ? -EIO : ret;
		}
		if (!e)
			continue; /* someone else inserted it meanwhile */
		s->n.misses++;
		ret = cache_start_load(s, e, obj, idx, w, IO_DEMAND, false);
		if (ret != 1 || w) {
			pthread_mutex_unlock(&s->lock);
			return ret;
		}
		/* Synchronous caller: loop until the entry is ready. */
	}
}

void tb_put(struct tb_store *s, struct tb_ref *ref, size_t bytes_read)
{
	pthread_mutex_lock(&s->lock);
	s->n.dram_read_bytes += bytes_read;
	s->n.dram_read_ops++;
	cache_unpin_locked(s, ref->e);
	pthread_mutex_unlock(&s->lock);
	ref->e = NULL;
}

/* ---- the write side ---- */

/*
 * Wait for room under the dirty mark; it comes as dirty blocks are written
 * back. While every write-back fails (the devices are full or failing,
 * or the metadata's filesystem is full), none comes: once that has gone on
 * for stall_wait_ms, the writer gets the failure, -ENOSPC (else -EIO),
 * and so does every writer that comes to the mark while it lasts. The
 * dirty blocks stay in DRAM and are tried again (flush.c, flush_wb_failed); the
 * first to succeed ends the stall. Without this bound a writer waited
 * here, unkillable, for as long as another process kept the disk full
 * (14 minutes in one report). -EINTR when the request was interrupted.
 * Any other condition this wait comes to hold must keep both bounds.
 *
 * The room is shared among users (fair.c): who waits also while its user
 * is at or over its share of the budget and another user under theirs
 * waits; those users take the room first, so this keeps both bounds.
 * -EAGAIN instead of any wait for a nowait writer (struct tb_writer).
 */
static int wait_dirty_budget(struct tb_store *s, const struct tb_writer *who)
{
	uint32_t uid = who ? who->uid : 0;
	bool counted = false;
	unsigned slot;
	int ret;

	if (s->stopping || fair_may_dirty(s, fair_slot(s, uid), false))
		return 0;
	flush_kick(s);
	ret = stalled(s);
	if (ret || (who && who->nowait))
		return ret ? ret : -EAGAIN;
	/* Counted as waiting, for the others' share (fair.c), until room is ours. */
	slot = fair_wait_begin(s, uid);
	while (!fair_may_dirty(s, slot, true) && !s->stopping) {
		ret = stalled(s);
		if (ret)
			break;
		if (!counted)
			s->n.backpressure_waits++;
		counted = true;
		flush_kick(s);
		ret = cache_wait(s, &s->space_cv);
		if (ret)
			break;
	}
	fair_wait_end(s, slot);
	/* Its wait may have held back other users over their share: they look again. */
	if (s->fair_n > 1)
		pthread_cond_broadcast(&s->space_cv);
	return ret;
}

/*
 * A new DIRTY entry for a write of sectors of block (obj, idx). For part
 * of the block: a zeroed whole block if it is a hole, else partial over
 * its persisted copy. For the whole block, the resolve only tells whether
 * it is stored (tb_unstored). Lock held; dropped around the owner's
 * resolve, during which the entry is a placeholder.
 */
static int start_write(struct tb_store *s, struct tb_entry *e, uint64_t obj, uint64_t idx,
		       bool whole, bool blind, uint64_t *resv, uint32_t uid)
{
	struct tb_stored at;
	int ret, from_resv;

	from_resv = place_take(s, resv);
	if (from_resv < 0) {
		cache_entry_free(s, e);
		return from_resv;
	}
	cache_set_state(s, e, ES_LOADING);
	e->placeholder = true;
	ret = cache_entry_insert(s, e, obj, idx);
	if (ret < 0) {
		place_give(s, resv, from_resv);
		cache_entry_free(s, e);
		return ret;
	}
	pthread_mutex_unlock(&s->lock);
	ret = cache_resolve(s, obj, idx, &at);
	if (ret == -ENOENT && !whole)
		memset(cache_slot_data(s, e), 0, s->bs);
	pthread_mutex_lock(&s->lock);
	e->placeholder = false;
	if (ret && ret != -ENOENT) {
		place_give(s, resv, from_resv);
		cache_entry_unhash(s, e);
		cache_entry_free(s, e);
		pthread_cond_broadcast(&s->state_cv);
		return ret;
	}
	if (ret == 0 && !whole) {
		e->partial = true;
		e->base_loc = at.loc;
		e->base_len = at.len;
		e->base_hashed = at.hashed;
		memcpy(e->base_hash, at.hash, TB_HASH_LEN);
		e->nwritten = 0;
		memset(e->written, 0, s->sector_words * sizeof(uint64_t));
		s->n.partial_created++;
	}
	e->stored = ret == 0; /* not dirty yet: make_dirty counts it */
	make_dirty(s, e, blind, uid);
	pthread_cond_broadcast(&s->state_cv);
	return 0;
}

/*
 * An unaligned part of an uncached block: load the block if it is stored
 * (1: wait for it), else take a slot again and zero it (0, *e the slot, or
 * NULL when (obj, idx) is cached now); or -errno.
 */
static int load_or_zero(struct tb_store *s, struct tb_entry **e, uint64_t obj, uint64_t idx,
			bool nowait)
{
	int ret;

	s->n.misses++;
	ret = cache_start_load(s, *e, obj, idx, NULL, IO_DEMAND, false);
	if (ret != -ENOENT)
		return ret;
	ret = entry_alloc_wait(s, obj, idx, e, WAIT_READY, nowait);
	if (ret || !*e)
		return ret;
	memset(cache_slot_data(s, *e), 0, s->bs);
	return 0;
}

int tb_get_write(struct tb_store *s, uint64_t obj, uint64_t idx, size_t off, size_t len, bool blind,
		 struct tb_ref *ref, uint64_t *resv, const struct tb_writer *who)
{
	bool whole = off == 0 && len == s->bs;
	bool nowait = who && who->nowait;
	uint32_t uid = who ? who->uid : 0;
	struct tb_entry *e;
	int ret;

	pthread_mutex_lock(&s->lock);
	for (;;) {
		e = cache_lookup(s, obj, idx);
		if (e && (e->state == ES_LOADING || e->state == ES_WB || e->merging)) {
			ret = -EAGAIN;
			if (nowait)
				goto out_unlock;
			pthread_cond_wait(&s->state_cv, &s->lock);
			continue;
		}
		if (e && e->state == ES_DIRTY && e->partial && !sector_aligned(s, off, len)) {
			ret = -EAGAIN; /* the merge reads the stored block */
			if (nowait)
				goto out_unlock;
			ret = cache_merge_partial(s, e);
			if (ret)
				goto out_unlock;
			continue;
		}
		if (e && e->state == ES_DIRTY)
			break;
		if (e) { /* CLEAN: becomes dirty */
			ret = wait_dirty_budget(s, who);
			if (ret)
				goto out_unlock;
			if (cache_lookup(s, obj, idx) != e || e->state != ES_CLEAN)
				continue;
			ret = place_take(s, resv);
			if (ret < 0)
				goto out_unlock;
			if (cache_lookup(s, obj, idx) != e || e->state != ES_CLEAN) {
				place_give(s, resv, ret);
				continue;
			}
			make_dirty(s, e, false, uid);
			ret = 0;
			break;
		}
		ret = wait_dirty_budget(s, who);
		if (ret)
			goto out_unlock;
		ret = entry_alloc_wait(s, obj, idx, &e, WAIT_READY, nowait);
		if (ret)
			goto out_unlock;
		if (!e)
			continue;
		if (sector_aligned(s, off, len)) {
			/* An uncached block: no read; for part of it, remember which sectors. */
			ret = start_write(s, e, obj, idx, whole, blind, resv, uid);
			if (ret < 0)
				goto out_unlock;
			continue; /* the entry is DIRTY now: found above */
		}
		if (!whole) {
			ret = load_or_zero(s, &e, obj, idx, nowait);
			if (ret == 1 || (ret == 0 && !e))
				continue; /* wait for the load in the loop above, or cached now */
			if (ret)
				goto out_unlock;
		}
		ret = place_take(s, resv);
		if (ret < 0) {
			cache_entry_free(s, e);
			goto out_unlock;
		}
		if (cache_lookup(s, obj, idx)) { /* lost a race while waiting for space */
			place_give(s, resv, ret);
			cache_entry_free(s, e);
			continue;
		}
		int from_resv = ret;
		ret = cache_entry_insert(s, e, obj, idx);
		if (ret < 0) {
			place_give(s, resv, from_resv);
			cache_entry_free(s, e);
			goto out_unlock;
		}
		make_dirty(s, e, false, uid);
		break;
	}
	cache_pin(s, e);
	e->wpins++;
	e->ref_bit = true;
	e->last_use = ++s->ticks;
	e->o->last_idx = idx;
	pthread_mutex_unlock(&s->lock);
	ref->e = e;
	ref->data = cache_slot_data(s, e);
	return 0;
out_unlock:
	pthread_mutex_unlock(&s->lock);
	return ret;
}

void tb_put_dirty(struct tb_store *s, struct tb_ref *ref, size_t off, size_t len)
{
	struct tb_entry *e = ref->e;

	pthread_mutex_lock(&s->lock);
	if (e->partial) {
		uint32_t first = (uint32_t)(off / SECTOR);
		uint32_t end = (uint32_t)((off + len + SECTOR - 1) / SECTOR);

		for (uint32_t i = first; i < end; i++)
			if (!cache_sector_written(e, i)) {
				e->written[i / 64] |= 1ULL << (i % 64);
				e->nwritten++;
			}
		if (e->nwritten == s->nsectors) {
			e->partial = false; /* every byte was written: nothing to merge */
		} else if (e->wpins == 1 && cache_covers_stored(e)) {
			/*
			 * Every stored byte was written over (a file's last block
			 * rewritten to its end): the rest is zeros, with no read.
			 * No other writer is copying into the sectors zeroed.
			 */
			cache_zero_unwritten(s, e);
			e->partial = false;
		}
	}
	e->fill += len;
	s->n.dram_write_bytes += len;
	s->n.dram_write_ops++;
	e->wpins--;
	if (e->stream && !e->wpins && e->fill >= s->bs) {
		if (!e->stream_ready && e->state == ES_DIRTY) {
			e->stream_ready = true;
			s->n_stream_ready++;
		}
		flush_kick(s); /* take_stream */
	}
	if (cache_unpin_last(s, e) && e->dead)
		cache_entry_free(s, e);
	flush_kick_cleaner(s, false);
	pthread_cond_broadcast(&s->state_cv);
	pthread_mutex_unlock(&s->lock);
	ref->e = NULL;
}

int tb_spare_take(struct tb_store *s, uint32_t *slot)
{
	int ret = -ENOSPC;

	pthread_mutex_lock(&s->lock);
	if (s->nspares) {
		*slot = s->spares[--s->nspares];
		ret = 0;
	}
	pthread_mutex_unlock(&s->lock);
	return ret;
}

void tb_spare_give(struct tb_store *s, uint32_t slot)
{
	pthread_mutex_lock(&s->lock);
	s->spares[s->nspares++] = slot;
	pthread_mutex_unlock(&s->lock);
}

void *tb_slot_data(const struct tb_store *s, uint32_t slot)
{
	return dram_slot(&s->arena, slot);
}

/*
 * No I/O can be on the block's slot: tb_get_write returned it DIRTY, and
 * neither write-back (flush_may_clean) nor a merge starts under a write pin. With
 * no other pin, no reader, writer or GPU client is at its bytes either.
 */
bool tb_swap_slot(struct tb_store *s, struct tb_ref *ref, uint32_t *slot)
{
	struct tb_entry *e = ref->e;
	bool ok;

	pthread_mutex_lock(&s->lock);
	ok = e->state == ES_DIRTY && e->pins == 1 && e->wpins == 1 && !e->merging;
	if (ok) {
		uint32_t old = e->slot;

		e->slot = *slot;
		*slot = old;
		ref->data = cache_slot_data(s, e);
		s->n.swapped_write_bytes += s->bs;
	}
	pthread_mutex_unlock(&s->lock);
	return ok;
}

/* ---- dead blocks ---- */

void tb_drop(struct tb_store *s, uint64_t obj, uint64_t from, uint64_t to)
{
	struct tb_obj *o;
	struct tb_entry *e, *next;
	bool busy;

	pthread_mutex_lock(&s->lock);
	do {
		busy = false;
		o = cache_obj_find(s, obj);
		for (e = o ? LIST_FIRST(&o->entries) : NULL; e; e = LIST_NEXT(e, olink)) {
			if (e->idx < from || e->idx >= to)
				continue;
			if (e->state == ES_LOADING || e->state == ES_WB || e->wpins || e->merging) {
				busy = true;
				break;
			}
		}
		if (busy)
			pthread_cond_wait(&s->state_cv, &s->lock);
	} while (busy);

	o = cache_obj_find(s, obj);
	for (e = o ? LIST_FIRST(&o->entries) : NULL; e; e = next) {
		next = LIST_NEXT(e, olink);
		if (e->idx < from || e->idx >= to)
			continue;
		if (e->state == ES_DIRTY) {
			elist_remove(&s->dirty_list, e);
			s->ndirty--;
			fair_cleaned(s, e);
			if (e->reserved)
				s->reserved--;
			e->reserved = false;
		}
		cache_entry_unhash(s, e);
		cache_set_state(s, e, ES_FREE);
		if (e->pins)
			e->dead = true;
		else
			cache_entry_free(s, e);
	}
	pthread_cond_broadcast(&s->space_cv);
	pthread_mutex_unlock(&s->lock);
}

/* ---- pins, eviction on request, residency ---- */

int tb_pin_obj(struct tb_store *s, uint64_t obj, uint64_t nblocks)
{
	struct tb_obj *o;
	uint64_t have, need;
	int ret = 0;

	pthread_mutex_lock(&s->lock);
	o = cache_obj_get(s, obj);
	if (!o) {
		ret = -ENOMEM;
		goto out;
	}
	have = o->pinned ? 0 : o->n;
	need = nblocks > o->n ? nblocks - o->n : 0;
	if (s->n_pinned_res + have + need > s->pin_limit) {
		cache_obj_maybe_free(s, o);
		ret = -ENOSPC;
		goto out;
	}
	if (!o->pinned) {
		o->pinned = true;
		s->n_pinned_res += o->n;
	}
out:
	pthread_mutex_unlock(&s->lock);
	return ret;
}

void tb_unpin_obj(struct tb_store *s, uint64_t obj)
{
	struct tb_obj *o;

	pthread_mutex_lock(&s->lock);
	o = cache_obj_find(s, obj);
	if (o && o->pinned) {
		o->pinned = false;
		s->n_pinned_res -= o->n;
		cache_obj_maybe_free(s, o);
		pthread_cond_broadcast(&s->space_cv); /* its blocks may go now */
	}
	pthread_mutex_unlock(&s->lock);
}

int tb_evict_obj(struct tb_store *s, uint64_t obj)
{
	struct tb_obj *o;
	struct tb_entry *e, *next;
	int ret;

	tb_unpin_obj(s, obj);
	ret = tb_flush_obj(s, obj);
	if (ret)
		return ret;
	pthread_mutex_lock(&s->lock);
	o = cache_obj_find(s, obj);
	for (e = o ? LIST_FIRST(&o->entries) : NULL; e; e = next) {
		next = LIST_NEXT(e, olink);
		/* Blocks in use or dirtied again since the flush stay. */
		if (e->state != ES_CLEAN || e->pins)
			continue;
		if (e->prefetched)
			s->n.prefetch_wasted++;
		s->n.evictions++;
		cache_entry_unhash(s, e);
		cache_entry_free(s, e);
	}
	pthread_mutex_unlock(&s->lock);
	return 0;
}

uint64_t tb_resident(struct tb_store *s, uint64_t obj, bool *pinned)
{
	struct tb_obj *o;
	uint64_t n = 0;

	pthread_mutex_lock(&s->lock);
	o = cache_obj_find(s, obj);
	for (struct tb_entry *e = o ? LIST_FIRST(&o->entries) : NULL; e; e = LIST_NEXT(e, olink))
		if (e->state == ES_CLEAN || e->state == ES_DIRTY || e->state == ES_WB)
			n++;
	if (pinned)
		*pinned = o && o->pinned;
	pthread_mutex_unlock(&s->lock);
	return n;
}

uint64_t tb_unstored(struct tb_store *s, uint64_t obj)
{
	struct tb_obj *o;
	uint64_t n;

	pthread_mutex_lock(&s->lock);
	o = cache_obj_find(s, obj);
	n = o ? o->nunstored : 0;
	pthread_mutex_unlock(&s->lock);
	return n;
}

void tb_resident_each(struct tb_store *s, uint64_t obj, tb_block_fn fn, void *arg)
{
	struct tb_obj *o;

	pthread_mutex_lock(&s->lock);
	o = cache_obj_find(s, obj);
	for (struct tb_entry *e = o ? LIST_FIRST(&o->entries) : NULL; e; e = LIST_NEXT(e, olink))
		if (e->state == ES_CLEAN || e->state == ES_DIRTY || e->state == ES_WB)
			fn(arg, e->idx);
	pthread_mutex_unlock(&s->lock);
}

size_t tb_block_size(const struct tb_store *s)
{
	return s->bs;
}

const void *tb_zero_block(const struct tb_store *s)
{
	return s->zero;
}

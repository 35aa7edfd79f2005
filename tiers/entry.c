/*
 * entry.c - the cache's entries and their states: the lowest layer of the
 * block cache, which every other file of it may call.
 *
 * Owns: the hashes of entries by (obj, idx) and of objects, the objects'
 * lists and their counts of unstored blocks, the state of an entry and the
 * counts that follow it (cache_set_state), the CLEAN entries by location
 * (dedup's verify), freeing and taking a slot, pins, the waiters of a load
 * and its completion (cache_load_done), and waits a request may give up
 * (cache_wait). May call: marks.c (waking the flusher), ghost.c (2q's
 * sets, kept as entries come and go), dram.c and the inline helpers of
 * cache_int.h; nothing above it.
 */
#include "cache_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STORE_ALIGN 4096 /* device I/O of a stored block's bytes: O_DIRECT on 4Kn devices */

/* ---- waits that a request may give up ---- */

/* The calling thread's request and how to ask whether it was interrupted. */
static __thread bool (*intr_fn)(void *arg);
static __thread void *intr_arg;

void tb_interruptible(bool (*fn)(void *arg), void *arg)
{
	intr_fn = fn;
	intr_arg = arg;
}

/*
 * Wait on cv, lock held, for TB_WAIT_STEP_MS at most: 0 when woken or
 * time to look again, -EINTR when the calling thread's request has been
 * interrupted (tb_interruptible). The kernel interrupts a request whose
 * process got a signal, SIGKILL included; without this its process sat in
 * D state for as long as a full device kept the store waiting.
 */
int cache_wait(struct tb_store *s, pthread_cond_t *cv)
{
	struct timespec ts;

	if (intr_fn && intr_fn(intr_arg))
		return -EINTR;
	deadline_in(&ts, TB_WAIT_STEP_MS);
	pthread_cond_timedwait(cv, &s->lock, &ts);
	return intr_fn && intr_fn(intr_arg) ? -EINTR : 0;
}

/* ---- hash of entries and objects ---- */

struct tb_entry *cache_lookup(struct tb_store *s, uint64_t obj, uint64_t idx)
{
	struct tb_entry *e = s->hash[mix(obj, idx) & s->hash_mask];

	while (e && (e->obj != obj || e->idx != idx))
		e = e->hnext;
	return e;
}

struct tb_obj *cache_obj_find(struct tb_store *s, uint64_t obj)
{
	struct tb_obj *o = s->ohash[mix(obj, 0) & s->ohash_mask];

	while (o && o->obj != obj)
		o = o->hnext;
	return o;
}

struct tb_obj *cache_obj_get(struct tb_store *s, uint64_t obj)
{
	struct tb_obj *o = cache_obj_find(s, obj);
	struct tb_obj **b;

	if (o)
		return o;
	o = calloc(1, sizeof(*o));
	if (!o)
		return NULL;
	o->obj = obj;
	b = &s->ohash[mix(obj, 0) & s->ohash_mask];
	o->hnext = *b;
	*b = o;
	LIST_INSERT_HEAD(&s->objs, o, link);
	s->nobjs++;
	return o;
}

void cache_obj_maybe_free(struct tb_store *s, struct tb_obj *o)
{
	struct tb_obj **p;

	if (o->n || o->wb_err || o->pinned)
		return;
	for (p = &s->ohash[mix(o->obj, 0) & s->ohash_mask]; *p != o; p = &(*p)->hnext)
		;
	*p = o->hnext;
	LIST_REMOVE(o, link);
	s->nobjs--;
	free(o);
}

/* ---- entries ---- */

/* Dirty data of a block that has no stored copy: the owner's map lacks it. */
static bool unstored(const struct tb_entry *e)
{
	return (e->state == ES_DIRTY || e->state == ES_WB) && !e->stored;
}

/* Whether the owner's map now names a stored copy of e's block. Lock held. */
void cache_set_stored(struct tb_entry *e, bool stored)
{
	if (e->in_hash && unstored(e))
		e->o->nunstored--;
	e->stored = stored;
	if (e->in_hash && unstored(e))
		e->o->nunstored++;
}

int cache_entry_insert(struct tb_store *s, struct tb_entry *e, uint64_t obj, uint64_t idx)
{
	struct tb_obj *o = cache_obj_get(s, obj);
	struct tb_entry **b;

	if (!o)
		return -ENOMEM;
	e->obj = obj;
	e->idx = idx;
	e->o = o;
	b = &s->hash[mix(obj, idx) & s->hash_mask];
	e->hnext = *b;
	*b = e;
	e->in_hash = true;
	if (unstored(e))
		o->nunstored++;
	ghost_admit(s, e);
	if (o->pinned)
		s->n_pinned_res++;
	LIST_INSERT_HEAD(&o->entries, e, olink);
	o->n++;
	return 0;
}

void cache_entry_unhash(struct tb_store *s, struct tb_entry *e)
{
	struct tb_entry **p;
	struct tb_obj *o = e->o;

	if (!e->in_hash)
		return;
	for (p = &s->hash[mix(e->obj, e->idx) & s->hash_mask]; *p != e; p = &(*p)->hnext)
		;
	*p = e->hnext;
	e->in_hash = false;
	if (e->state == ES_CLEAN)
		o->nclean--;
	if (unstored(e))
		o->nunstored--;
	LIST_REMOVE(e, olink);
	o->n--;
	if (o->pinned)
		s->n_pinned_res--;
	e->o = NULL;
	cache_obj_maybe_free(s, o);
}

/* ---- CLEAN entries by location: a stored block's bytes may be in DRAM ---- */

static struct tb_entry **lochash_bucket(struct tb_store *s, uint64_t loc)
{
	return &s->lochash[mix(loc, 0x10c) & s->hash_mask];
}

static void lochash_add(struct tb_store *s, struct tb_entry *e)
{
	struct tb_entry **b = lochash_bucket(s, e->loc);

	e->lhnext = *b;
	*b = e;
	e->in_lochash = true;
}

static void lochash_del(struct tb_store *s, struct tb_entry *e)
{
	struct tb_entry **p = lochash_bucket(s, e->loc);

	while (*p != e)
		p = &(*p)->lhnext;
	*p = e->lhnext;
	e->in_lochash = false;
}

/* A CLEAN entry holding the stored block at loc, other than not. */
struct tb_entry *cache_find_loc(struct tb_store *s, uint64_t loc, const struct tb_entry *skip)
{
	struct tb_entry *e = *lochash_bucket(s, loc);

	while (e && (e->loc != loc || e == skip || e->partial))
		e = e->lhnext;
	return e;
}

/*
 * Move e to state st, keeping the counts of CLEAN entries (the store's and
 * its object's) that eviction and the flusher's cleaning go by, and the
 * location hash of CLEAN entries.
 */
void cache_set_state(struct tb_store *s, struct tb_entry *e, enum entry_state st)
{
	if (e->state == ES_CLEAN) {
		s->nclean--;
		if (e->pins)
			s->nclean_pinned--;
		if (e->in_hash)
			e->o->nclean--;
		if (e->in_lochash)
			lochash_del(s, e);
	}
	if (st == ES_CLEAN) {
		s->nclean++;
		if (e->pins)
			s->nclean_pinned++;
		if (e->in_hash)
			e->o->nclean++;
		if (e->loc != TB_LOC_NONE)
			lochash_add(s, e);
	}
	if (e->stream_ready) {
		s->n_stream_ready--;
		e->stream_ready = false;
	}
	if (e->stream_wb && st != ES_WB) {
		s->n_stream_wb--;
		e->stream_wb = false;
	} else if (!e->stream_wb && st == ES_WB && e->stream) {
		s->n_stream_wb++;
		e->stream_wb = true;
	}
	if (e->in_hash && unstored(e))
		e->o->nunstored--;
	e->state = st;
	if (e->in_hash && unstored(e))
		e->o->nunstored++;
}

/* ---- slots ---- */

/* e was loaded ahead of use and is now read, dirtied or gone. */
void cache_pf_clear(struct tb_store *s, struct tb_entry *e)
{
	e->hinted = false;
	if (e->prefetched) {
		e->prefetched = false;
		if (e->deep)
			s->n_pf_deep--;
		else
			s->n_pf--;
	}
}

void cache_entry_free(struct tb_store *s, struct tb_entry *e)
{
	cache_pf_clear(s, e);
	ghost_leave(s, e, false);
	cache_set_state(s, e, ES_FREE);
	e->dead = false;
	e->stored = false;
	e->loc = TB_LOC_NONE;
	elist_append(&s->free_list, e);
	pthread_cond_broadcast(&s->space_cv);
}

/* Take e (free, or a clean victim) for a new block. */
struct tb_entry *cache_entry_take(struct tb_store *s, struct tb_entry *e)
{
	bool evicted = e->state != ES_FREE;

	if (!evicted) {
		elist_remove(&s->free_list, e);
	} else {
		ghost_leave(s, e, true);
		cache_entry_unhash(s, e);
		s->n.evictions++;
		if (e->prefetched)
			s->n.prefetch_wasted++;
	}
	cache_pf_clear(s, e);
	cache_set_state(s, e, ES_FREE);
	e->pins = e->wpins = 0;
	e->err = 0;
	e->retries = 0;
	e->urgent = e->dead = e->reserved = e->written_back = e->stored = e->deep = false;
	e->stream = e->blind = false;
	e->placeholder = e->partial = e->merging = e->no_share = false;
	e->ref_bit = true;
	e->fill = 0;
	e->waiters = NULL;
	e->loc = e->new_loc = TB_LOC_NONE;
	flush_kick_cleaner(s, evicted);
	return e;
}

void *cache_slot_data(struct tb_store *s, struct tb_entry *e)
{
	return dram_slot(&s->arena, e->slot);
}

/* Whether a stored block at loc of len bytes can be: on one of our devices, in whole units. */
bool cache_stored_ok(const struct tb_store *s, uint64_t loc, size_t len)
{
	return tb_loc_dev(loc) < s->n_devs && len && len <= s->bs && len % SECTOR == 0;
}

/*
 * The device I/O that moves a block's len stored bytes: whole STORE_ALIGN
 * units, the block size at most. The bytes between are zeros, as written.
 */
size_t cache_io_len(size_t len)
{
	return (len + STORE_ALIGN - 1) / STORE_ALIGN * STORE_ALIGN;
}

/* ---- pins, and the end of a load ---- */

/*
 * Pin e, and count it among the clean blocks that cannot be evicted if it
 * is one (cache_evictable). Lock held.
 */
void cache_pin(struct tb_store *s, struct tb_entry *e)
{
	if (e->pins++ == 0 && e->state == ES_CLEAN)
		s->nclean_pinned++;
}

/* Let go of a pin; true when it was the last. Lock held. */
bool cache_unpin_last(struct tb_store *s, struct tb_entry *e)
{
	if (--e->pins)
		return false;
	if (e->state == ES_CLEAN)
		s->nclean_pinned--;
	return true;
}

/* Drop a pin of e. Lock held. */
void cache_unpin_locked(struct tb_store *s, struct tb_entry *e)
{
	if (cache_unpin_last(s, e)) {
		if (e->dead)
			cache_entry_free(s, e);
		pthread_cond_broadcast(&s->space_cv);
		pthread_cond_broadcast(&s->state_cv);
	}
}

void cache_unpin(struct tb_store *s, struct tb_entry *e)
{
	pthread_mutex_lock(&s->lock);
	cache_unpin_locked(s, e);
	pthread_mutex_unlock(&s->lock);
}

/* Pin e once for each waiter, handing each its reference. Lock held. */
void cache_pin_waiters(struct tb_store *s, struct tb_entry *e, struct tb_waiter *w)
{
	for (; w; w = w->next) {
		cache_pin(s, e);
		w->ref.e = e;
		w->ref.data = cache_slot_data(s, e);
	}
}

/* Tell the waiters; the list is theirs from here. No lock held. */
void cache_call_waiters(struct tb_waiter *w, int err)
{
	while (w) {
		struct tb_waiter *next = w->next;

		w->fn(w, err);
		w = next;
	}
}

/*
 * A load ended (err) and its bytes were checked: the entry becomes CLEAN,
 * pinned for each waiter, or goes. Called once per load, on an I/O thread
 * (a device's, or a verifier's). No lock held.
 */
void cache_load_done(struct tb_entry *e, int err)
{
	struct tb_store *s = e->s;
	struct tb_waiter *w;

	pthread_mutex_lock(&s->lock);
	w = e->waiters;
	e->waiters = NULL;
	if (e->pf_load) {
		e->pf_load = false;
		e->pf_promoted = false;
		s->prefetch_inflight--;
		if (w) {
			s->n.prefetch_late++; /* a demand read came before the prefetch finished */
			cache_pf_clear(s, e);
			s->n.prefetch_used++;
		}
	}
	if (err) {
		cache_entry_unhash(s, e);
		if (e->pins)
			e->dead = true;
		else
			cache_entry_free(s, e);
	} else {
		cache_set_state(s, e, ES_CLEAN);
		e->last_use = ++s->ticks;
		cache_pin_waiters(s, e, w);
	}
	/*
	 * A prefetch that landed with no reader waiting, or a load that
	 * failed, left a slot a writer waiting for one (entry_alloc_wait)
	 * may take.
	 */
	if (err || !e->pins)
		pthread_cond_broadcast(&s->space_cv);
	pthread_cond_broadcast(&s->state_cv);
	pthread_mutex_unlock(&s->lock);
	cache_call_waiters(w, err);
}

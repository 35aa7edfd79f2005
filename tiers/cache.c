/*
 * cache.c - the block cache in the DRAM arena: its entries and their states.
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
 * The rest of the cache, a file each (cache_int.h is what they share):
 * evict.c chooses what leaves DRAM, fair.c shares the dirty budget among
 * the users who write, flush.c writes back and syncs,
 * place.c puts written blocks on the devices and counts their space, and
 * prefetch.c loads blocks ahead of their readers.
 */
#include "cache_int.h"
#include "fault.h"
#include "log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PREFETCH_SHARE 8 /* prefetches in flight hold at most 1/8 of the slots */
#define PREFETCH_DEPTH_SHARE 64 /* blocks ahead of their readers: 1/64 of the slots */
#define PREFETCH_DEPTH_MIN 4
#define PREFETCH_DEEP_SHARE 4 /* readers of remote blocks: at most 1/4 of the slots ahead */
#define PF_GROW_SHARE 2	      /* the window grows to half the slots at most */
#define STREAM_WAIT_MS 50 /* a writer waits this long at most for a streaming block's slot */
#define CLEAN_LOW_SHARE 64 /* the flusher keeps 1/64 to 1/32 of the slots clean */
#define CLEAN_LOW_MIN 2
#define WB_RUNS 4 /* objects of a packing device (s3) the write-back keeps in flight */
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

/*
 * The store's stall (flush.c, wb_failed): every write-back has failed for
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

static struct tb_obj *obj_get(struct tb_store *s, uint64_t obj)
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
	o->lnext = s->objs;
	if (s->objs)
		s->objs->lprev = o;
	s->objs = o;
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
	if (o->lprev)
		o->lprev->lnext = o->lnext;
	else
		s->objs = o->lnext;
	if (o->lnext)
		o->lnext->lprev = o->lprev;
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

static int entry_insert(struct tb_store *s, struct tb_entry *e, uint64_t obj, uint64_t idx)
{
	struct tb_obj *o = obj_get(s, obj);
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
	evict_admit(s, e);
	if (o->pinned)
		s->n_pinned_res++;
	e->oprev = NULL;
	e->onext = o->head;
	if (o->head)
		o->head->oprev = e;
	o->head = e;
	o->n++;
	return 0;
}

static void entry_unhash(struct tb_store *s, struct tb_entry *e)
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
	if (e->oprev)
		e->oprev->onext = e->onext;
	else
		o->head = e->onext;
	if (e->onext)
		e->onext->oprev = e->oprev;
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
static void pf_clear(struct tb_store *s, struct tb_entry *e)
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

static void entry_free(struct tb_store *s, struct tb_entry *e)
{
	pf_clear(s, e);
	evict_leave(s, e, false);
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
		evict_leave(s, e, true);
		entry_unhash(s, e);
		s->evictions++;
		if (e->prefetched)
			s->pf_wasted++;
	}
	pf_clear(s, e);
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

/* A free entry: a free slot, else a victim among clean unpinned ones. */
static struct tb_entry *entry_alloc(struct tb_store *s, enum wait_stream wait_stream)
{
	struct tb_entry *e = s->free_list.head;
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

void *cache_slot_data(struct tb_store *s, struct tb_entry *e)
{
	return dram_slot(&s->arena, e->slot);
}

static void make_dirty(struct tb_store *s, struct tb_entry *e, bool blind, uint32_t uid)
{
	/*
	 * A stored block rewritten while not cached, or loaded since its last
	 * write-back: it streams through (see take_stream).
	 */
	bool uncached = e->state == ES_LOADING && e->stored; /* a whole rewrite, placeholder */

	e->stream = ((e->state == ES_CLEAN && !e->written_back) || uncached) &&
		    evict_cycle_period(s) && !(s->keep_den && evict_kept(s, e));
	e->blind = uncached && blind;
	pf_clear(s, e);
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

/* ---- I/O completions (device threads) ---- */

/* Pin e once for each waiter, handing each its reference. Lock held. */
static void pin_waiters(struct tb_store *s, struct tb_entry *e, struct tb_waiter *w)
{
	for (; w; w = w->next) {
		cache_pin(s, e);
		w->ref.e = e;
		w->ref.data = cache_slot_data(s, e);
	}
}

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
			s->pf_promoted++;
		}
	}
}

/* Tell the waiters; the list is theirs from here. No lock held. */
static void call_waiters(struct tb_waiter *w, int err)
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
			s->pf_late++; /* a demand read came before the prefetch finished */
			pf_clear(s, e);
			s->pf_used++;
		}
	}
	if (err) {
		entry_unhash(s, e);
		if (e->pins)
			e->dead = true;
		else
			entry_free(s, e);
	} else {
		cache_set_state(s, e, ES_CLEAN);
		e->last_use = ++s->ticks;
		pin_waiters(s, e, w);
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
	call_waiters(w, err);
}

/*
 * The device read of a load ended. A block with a hash to check goes to
 * the verifiers (verify.c), so that the device's thread goes on feeding
 * the device; it stays LOADING until checked, and no one sees its bytes.
 */
static void read_done(struct tb_io *r, int err)
{
	struct tb_entry *e = (struct tb_entry *)((char *)r - offsetof(struct tb_entry, req));
	struct tb_store *s = e->s;
	const uint8_t *sum = cache_read_sum(s, e->hashed, e->hash);

	if (!err && sum) {
		verify_load(s, e);
		return;
	}
	if (!err)
		cache_check(s, cache_slot_data(s, e), NULL, e->loc, e->obj, e->idx); /* counted */
	cache_load_done(e, err);
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

/* The owner's resolve, checked (cache_stored_ok). No lock held. */
int cache_resolve(struct tb_store *s, uint64_t obj, uint64_t idx, struct tb_stored *at)
{
	int ret;

	at->hashed = false;
	ret = s->owner.resolve(s->owner.ctx, obj, idx, at);
	if (ret == 0 && !cache_stored_ok(s, at->loc, at->len))
		ret = -EIO;
	return ret;
}

/*
 * Load the len bytes stored at loc into e's slot; the rest of the block is
 * zeros. read_done checks them against hash, when there is one.
 */
static void submit_read(struct tb_store *s, struct tb_entry *e, const struct tb_stored *at,
			enum io_class cls)
{
	size_t io = cache_io_len(at->len);

	e->loc = at->loc;
	e->stored = true; /* LOADING: not dirty, so no count changes */
	e->hashed = at->hashed;
	memcpy(e->hash, at->hash, TB_HASH_LEN);
	memset((char *)cache_slot_data(s, e) + io, 0, s->bs - io);
	e->req.op = IO_READ;
	e->req.cls = cls;
	e->req.slot = tb_loc_slot(at->loc);
	e->req.buf = cache_slot_data(s, e);
	e->req.len = io;
	e->req.done = read_done;
	dev_submit(s->dev[tb_loc_dev(at->loc)], &e->req);
}

/*
 * Start loading (obj, idx) into a new LOADING entry. Called with the lock
 * held, returns with it held; drops it around the owner's resolve.
 * Returns 1 when loading, -ENOENT for a hole, or -errno.
 */
int cache_start_load(struct tb_store *s, struct tb_entry *e, uint64_t obj, uint64_t idx,
		     struct tb_waiter *w, enum io_class cls, bool ahead)
{
	struct tb_stored at;
	int ret;

	cache_set_state(s, e, ES_LOADING);
	ret = entry_insert(s, e, obj, idx);
	if (ret < 0) {
		entry_free(s, e);
		return ret;
	}
	if (cls == IO_DEMAND)
		e->o->last_idx = idx;
	pthread_mutex_unlock(&s->lock);
	ret = cache_resolve(s, obj, idx, &at);
	if (ret == 0) {
		pthread_mutex_lock(&s->lock);
		if (w) {
			w->next = e->waiters;
			e->waiters = w;
		}
		if (cls == IO_PREFETCH) {
			e->pf_load = true;
			s->prefetch_inflight++;
		}
		e->hinted = cls == IO_PREFETCH && !ahead;
		if (ahead) {
			e->prefetched = true;
			if (e->deep)
				s->n_pf_deep++;
			else
				s->n_pf++;
		}
		pthread_mutex_unlock(&s->lock);
		submit_read(s, e, &at, cls);
		pthread_mutex_lock(&s->lock);
		return 1;
	}
	/* Hole or error: nothing to load. Waiters that joined retry and see it too. */
	pthread_mutex_lock(&s->lock);
	w = e->waiters;
	e->waiters = NULL;
	entry_unhash(s, e);
	entry_free(s, e);
	pthread_cond_broadcast(&s->state_cv);
	pthread_mutex_unlock(&s->lock);
	call_waiters(w, ret);
	pthread_mutex_lock(&s->lock);
	return ret;
}

/* ---- partial blocks ---- */

struct sync_io {
	struct tb_io io;
	pthread_mutex_t m;
	pthread_cond_t cv;
	bool done;
	int err;
};

static void sync_io_done(struct tb_io *r, int err)
{
	struct sync_io *x = (struct sync_io *)r;

	pthread_mutex_lock(&x->m);
	x->done = true;
	x->err = err;
	pthread_cond_signal(&x->cv);
	pthread_mutex_unlock(&x->m);
}

/* Read the len bytes stored at loc into buf, cache_io_len(len) long, and wait. No lock held. */
int cache_read_sync(struct tb_store *s, uint64_t loc, size_t len, void *buf)
{
	struct sync_io x = {0};

	if (tb_loc_dev(loc) >= s->n_devs)
		return -EIO;
	pthread_mutex_init(&x.m, NULL);
	pthread_cond_init(&x.cv, NULL);
	x.io.op = IO_READ;
	x.io.cls = IO_DEMAND;
	x.io.slot = tb_loc_slot(loc);
	x.io.buf = buf;
	x.io.len = cache_io_len(len);
	x.io.done = sync_io_done;
	dev_submit(s->dev[tb_loc_dev(loc)], &x.io);
	pthread_mutex_lock(&x.m);
	while (!x.done)
		pthread_cond_wait(&x.cv, &x.m);
	pthread_mutex_unlock(&x.m);
	pthread_mutex_destroy(&x.m);
	pthread_cond_destroy(&x.cv);
	return x.err;
}

static bool sector_written(const struct tb_entry *e, uint32_t i)
{
	return e->written[i / 64] >> (i % 64) & 1;
}

/* Whether the sectors written cover the persisted block's stored bytes. */
static bool covers_stored(const struct tb_entry *e)
{
	uint32_t n = (uint32_t)(e->base_len / SECTOR);

	for (uint32_t i = 0; i < n; i += 64) {
		uint64_t want = n - i >= 64 ? UINT64_MAX : (1ULL << (n - i)) - 1;

		if ((e->written[i / 64] & want) != want)
			return false;
	}
	return true;
}

/* Zero the sectors of a partial entry that were not written, past its stored bytes. */
static void zero_unwritten(struct tb_store *s, struct tb_entry *e)
{
	char *slot = cache_slot_data(s, e);

	for (uint32_t i = (uint32_t)(e->base_len / SECTOR); i < s->nsectors; i++)
		if (!sector_written(e, i))
			memset(slot + (size_t)i * SECTOR, 0, SECTOR);
}

/*
 * Fill the sectors of a partial entry that were not written from its
 * persisted block, reading only its stored bytes, and only when some of
 * them were not written over; the block read is checked against its hash
 * first. The entry is stable: no writer holds it (merging or WB). 1 when
 * it read, 0 when it did not, or -errno. No lock held.
 */
int cache_merge_io(struct tb_store *s, struct tb_entry *e)
{
	char *bounce = NULL, *slot = cache_slot_data(s, e);
	bool read = !covers_stored(e);
	size_t io = cache_io_len(e->base_len);
	int ret;

	if (read) {
		/* The whole block, zeros past its stored bytes: what its hash is of. */
		if (posix_memalign((void **)&bounce, IO_ALIGN, s->bs))
			return -ENOMEM;
		memset(bounce + io, 0, s->bs - io);
		ret = cache_read_sync(s, e->base_loc, e->base_len, bounce);
		if (ret == 0)
			ret = cache_check(s, bounce, cache_read_sum(s, e->base_hashed, e->base_hash),
					  e->base_loc, e->obj, e->idx);
		if (ret == 0)
			for (uint32_t i = 0; i < e->base_len / SECTOR; i++)
				if (!sector_written(e, i))
					memcpy(slot + (size_t)i * SECTOR,
					       bounce + (size_t)i * SECTOR, SECTOR);
		free(bounce);
		if (ret)
			return ret;
	}
	zero_unwritten(s, e);
	return read;
}

/* Hand a now-whole entry to the reads that waited on it. Lock held, dropped. */
static void wake_waiters(struct tb_store *s, struct tb_entry *e, int err)
{
	struct tb_waiter *w = e->waiters;

	e->waiters = NULL;
	if (!err)
		pin_waiters(s, e, w);
	pthread_cond_broadcast(&s->state_cv);
	pthread_mutex_unlock(&s->lock);
	call_waiters(w, err);
	pthread_mutex_lock(&s->lock);
}

/*
 * Make a DIRTY partial entry whole before it is read or written unaligned.
 * Lock held; dropped while waiting and during the read.
 */
static int merge_partial(struct tb_store *s, struct tb_entry *e)
{
	int ret;

	while (e->wpins && e->partial && !e->merging)
		pthread_cond_wait(&s->state_cv, &s->lock);
	if (!e->partial || e->merging || e->state != ES_DIRTY || !e->in_hash)
		return 0; /* someone else finished it, or it went: look again */
	e->merging = true;
	pthread_mutex_unlock(&s->lock);
	ret = cache_merge_io(s, e);
	pthread_mutex_lock(&s->lock);
	e->merging = false;
	if (ret >= 0) {
		e->partial = false;
		s->partial_merged += ret;
		ret = 0;
	}
	wake_waiters(s, e, ret);
	return ret;
}

static bool sector_aligned(struct tb_store *s, size_t off, size_t len)
{
	return off % SECTOR == 0 && ((off + len) % SECTOR == 0 || off + len == s->bs);
}

/* ---- the read side ---- */

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
			ret = merge_partial(s, e);
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
			s->hits++;
			if (e->prefetched)
				s->pf_used++;
			pf_clear(s, e);
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
		s->misses++;
		ret = cache_start_load(s, e, obj, idx, w, IO_DEMAND, false);
		if (ret != 1 || w) {
			pthread_mutex_unlock(&s->lock);
			return ret;
		}
		/* Synchronous caller: loop until the entry is ready. */
	}
}

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
static bool unpin_last(struct tb_store *s, struct tb_entry *e)
{
	if (--e->pins)
		return false;
	if (e->state == ES_CLEAN)
		s->nclean_pinned--;
	return true;
}

/* Drop a pin of e. Lock held. */
static void unpin_locked(struct tb_store *s, struct tb_entry *e)
{
	if (unpin_last(s, e)) {
		if (e->dead)
			entry_free(s, e);
		pthread_cond_broadcast(&s->space_cv);
		pthread_cond_broadcast(&s->state_cv);
	}
}

void cache_unpin(struct tb_store *s, struct tb_entry *e)
{
	pthread_mutex_lock(&s->lock);
	unpin_locked(s, e);
	pthread_mutex_unlock(&s->lock);
}

void tb_put(struct tb_store *s, struct tb_ref *ref, size_t bytes_read)
{
	pthread_mutex_lock(&s->lock);
	s->dram_read_bytes += bytes_read;
	s->dram_read_ops++;
	unpin_locked(s, ref->e);
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
 * dirty blocks stay in DRAM and are tried again (flush.c, wb_failed); the
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
			s->bp_waits++;
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
		entry_free(s, e);
		return from_resv;
	}
	cache_set_state(s, e, ES_LOADING);
	e->placeholder = true;
	ret = entry_insert(s, e, obj, idx);
	if (ret < 0) {
		place_give(s, resv, from_resv);
		entry_free(s, e);
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
		entry_unhash(s, e);
		entry_free(s, e);
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
		s->partial_created++;
	}
	e->stored = ret == 0; /* not dirty yet: make_dirty counts it */
	make_dirty(s, e, blind, uid);
	pthread_cond_broadcast(&s->state_cv);
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
			ret = merge_partial(s, e);
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
			/* Unaligned part of an uncached block: load it if persisted. */
			s->misses++;
			ret = cache_start_load(s, e, obj, idx, NULL, IO_DEMAND, false);
			if (ret == 1)
				continue; /* wait for it in the loop above */
			if (ret != -ENOENT)
				goto out_unlock;
			ret = entry_alloc_wait(s, obj, idx, &e, WAIT_READY, nowait);
			if (ret)
				goto out_unlock;
			if (!e)
				continue;
			memset(cache_slot_data(s, e), 0, s->bs);
		}
		ret = place_take(s, resv);
		if (ret < 0) {
			entry_free(s, e);
			goto out_unlock;
		}
		if (cache_lookup(s, obj, idx)) { /* lost a race while waiting for space */
			place_give(s, resv, ret);
			entry_free(s, e);
			continue;
		}
		int from_resv = ret;
		ret = entry_insert(s, e, obj, idx);
		if (ret < 0) {
			place_give(s, resv, from_resv);
			entry_free(s, e);
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
			if (!sector_written(e, i)) {
				e->written[i / 64] |= 1ULL << (i % 64);
				e->nwritten++;
			}
		if (e->nwritten == s->nsectors) {
			e->partial = false; /* every byte was written: nothing to merge */
		} else if (e->wpins == 1 && covers_stored(e)) {
			/*
			 * Every stored byte was written over (a file's last block
			 * rewritten to its end): the rest is zeros, with no read.
			 * No other writer is copying into the sectors zeroed.
			 */
			zero_unwritten(s, e);
			e->partial = false;
		}
	}
	e->fill += len;
	s->dram_write_bytes += len;
	s->dram_write_ops++;
	e->wpins--;
	if (e->stream && !e->wpins && e->fill >= s->bs) {
		if (!e->stream_ready && e->state == ES_DIRTY) {
			e->stream_ready = true;
			s->n_stream_ready++;
		}
		flush_kick(s); /* take_stream */
	}
	if (unpin_last(s, e) && e->dead)
		entry_free(s, e);
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
		s->swapped_write_bytes += s->bs;
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
		for (e = o ? o->head : NULL; e; e = e->onext) {
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
	for (e = o ? o->head : NULL; e; e = next) {
		next = e->onext;
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
		entry_unhash(s, e);
		cache_set_state(s, e, ES_FREE);
		if (e->pins)
			e->dead = true;
		else
			entry_free(s, e);
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
	o = obj_get(s, obj);
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
	for (e = o ? o->head : NULL; e; e = next) {
		next = e->onext;
		/* Blocks in use or dirtied again since the flush stay. */
		if (e->state != ES_CLEAN || e->pins)
			continue;
		if (e->prefetched)
			s->pf_wasted++;
		s->evictions++;
		entry_unhash(s, e);
		entry_free(s, e);
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
	for (struct tb_entry *e = o ? o->head : NULL; e; e = e->onext)
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
	for (struct tb_entry *e = o ? o->head : NULL; e; e = e->onext)
		if (e->state == ES_CLEAN || e->state == ES_DIRTY || e->state == ES_WB)
			fn(arg, e->idx);
	pthread_mutex_unlock(&s->lock);
}

void tb_get_stats(struct tb_store *s, struct tb_stats *st)
{
	uint64_t avail;

	memset(st, 0, sizeof(*st));
	pthread_mutex_lock(&s->lock);
	st->block_size = s->bs;
	st->dram_capacity = (uint64_t)s->nslots * s->bs;
	st->dram_used = (uint64_t)(s->nslots - s->free_list.n) * s->bs;
	st->dram_read_bytes = s->dram_read_bytes;
	st->dram_write_bytes = s->dram_write_bytes;
	st->swapped_write_bytes = s->swapped_write_bytes;
	st->dram_read_ops = s->dram_read_ops;
	st->dram_write_ops = s->dram_write_ops;
	st->hits = s->hits;
	st->misses = s->misses;
	st->evictions = s->evictions;
	st->dirty_bytes = s->ndirty * s->bs;
	st->dirty_limit_bytes = s->dirty_max * s->bs;
	st->dirty_background_bytes = (s->dirty_max - s->dirty_bg) * s->bs;
	st->kept_bytes = evict_cycle_period(s) && s->keep_den ? s->keep_num * s->bs : 0;
	st->kept_evicted_bytes = s->kept_evicted * s->bs;
	st->writeback_bytes = s->wb_bytes;
	st->holes_written = s->holes;
	st->wb_errors = s->wb_errors;
	st->recent_wb_errors = err_recent_count(&s->wb_recent, now_ms() * 1000000);
	st->health_window_s = HEALTH_WINDOW_S;
	st->stall_err = s->stall_err;
	st->stall_ms = s->stall_err ? now_ms() - s->stall_ms : 0;
	st->stall_commit = s->stall_commit;
	st->syncs = s->syncs;
	st->backpressure_waits = s->bp_waits;
	st->prefetch_issued = s->pf_issued;
	st->prefetch_used = s->pf_used;
	st->prefetch_wasted = s->pf_wasted;
	st->prefetch_late = s->pf_late;
	st->prefetch_refused = s->pf_refused;
	st->prefetch_promoted = s->pf_promoted;
	st->prefetch_depth = s->pf_win.depth;
	st->unsynced_blocks = s->commits_since_sync + s->npending;
	st->unsynced_commits = __atomic_load_n(&s->meta_commits, __ATOMIC_RELAXED);
	st->expired_bytes = s->expired * s->bs;
	st->rewritten_bytes = s->wb_rewritten * s->bs;
	st->partial_created = s->partial_created;
	st->partial_merged = s->partial_merged;
	st->dedup_hits = s->dedup_hits;
	st->dedup_verify_mismatch = s->dedup_mismatch;
	st->dedup_verify_cached = s->dedup_verify_cached;
	st->checksum_verified = __atomic_load_n(&s->sum_verified, __ATOMIC_RELAXED);
	st->checksum_unverified = __atomic_load_n(&s->sum_unverified, __ATOMIC_RELAXED);
	st->checksum_errors = __atomic_load_n(&s->sum_errors, __ATOMIC_RELAXED);
	st->pinned_bytes = s->n_pinned_res * s->bs;
	st->pin_limit_bytes = s->pin_limit * s->bs;
	st->hot_bytes = (uint64_t)s->n_hot * s->bs;
	st->ghost_hits = s->ghost_hits;
	st->huge_pages = s->arena.huge;
	st->thp_bytes = s->arena.thp_bytes;
	st->locked = s->arena.locked;
	avail = place_avail(s);
	pthread_mutex_unlock(&s->lock);
	st->n_devs = s->n_devs;
	for (unsigned i = 0; i < s->n_devs; i++) {
		dev_get_stats(s->dev[i], &st->dev[i]);
		/* What room they have is promised to dirty blocks: no new block fits. */
		if (!avail) {
			st->dev[i].avail = 0;
			st->dev[i].full = true;
		}
		st->dev[i].checksum_errors =
		    __atomic_load_n(&s->sum_dev_errors[i], __ATOMIC_RELAXED);
	}
}

size_t tb_block_size(const struct tb_store *s)
{
	return s->bs;
}

const void *tb_zero_block(const struct tb_store *s)
{
	return s->zero;
}

/* ---- life cycle ---- */

static uint64_t pow2_at_least(uint64_t n)
{
	uint64_t p = 1;

	while (p < n)
		p <<= 1;
	return p;
}

/*
 * The reserve of free or clean slots that the flusher keeps ahead of
 * evictions. Dirty data may fill the rest (write-back is lazy), less the
 * readers' worst case; dirty= lowers that mark. A device that packs
 * several blocks per object (s3) is fed by the flusher's batches, so the
 * reserve holds at least two of its objects: with dram=256M the reserve was
 * 4 to 8 blocks, objects went out with 5 of their 8 blocks on average, and
 * a 512 MiB dd made 190 requests per GB at half the speed (129 now).
 */
static void set_reserve(struct tb_store *s, const struct tb_config *cfg)
{
	uint64_t low = s->nslots / CLEAN_LOW_SHARE;

	if (low < CLEAN_LOW_MIN)
		low = CLEAN_LOW_MIN;
	for (unsigned i = 0; i < s->n_devs; i++)
		if (s->dev[i]->run > 1 && low < 2 * (uint64_t)s->dev[i]->run)
			low = 2 * (uint64_t)s->dev[i]->run;
	if (low > s->nslots / 4 && s->nslots / 4 >= CLEAN_LOW_MIN)
		low = s->nslots / 4;
	s->clean_low = low;
	s->clean_high = 2 * low;
	s->dirty_max = s->nslots > s->clean_high ? s->nslots - s->clean_high : 1;
	if (cfg->dirty_bytes && cfg->dirty_bytes / s->bs < s->dirty_max)
		s->dirty_max = cfg->dirty_bytes / s->bs;
	if (s->dirty_max < 1)
		s->dirty_max = 1;
	/* queue_depth per device, at most half the dirty mark, and never below 0 */
	s->dirty_bg = s->wb_max > s->clean_low ? s->wb_max : s->clean_low;
	if (s->dirty_bg > s->dirty_max / 2)
		s->dirty_bg = s->dirty_max / 2 > s->clean_low ? s->dirty_max / 2 : s->clean_low;
	if (s->dirty_bg > s->dirty_max)
		s->dirty_bg = s->dirty_max;
}

/*
 * Write-back blocks in flight at most: queue_depth per device, and for a
 * device that packs blocks into objects (s3) WB_RUNS of its objects, within
 * a quarter of the slots. Its engine holds an object's blocks until it has
 * them all: with 32 blocks in flight and 32-block objects, one PUT ran at a
 * time, and each waited for the region's first byte alone.
 */
static uint64_t wb_depth(const struct tb_store *s, const struct tb_config *cfg)
{
	uint64_t base = (uint64_t)s->n_devs * cfg->queue_depth, deep = 0;

	for (unsigned i = 0; i < s->n_devs; i++) {
		uint64_t runs = (uint64_t)WB_RUNS * s->dev[i]->run;

		deep += runs > cfg->queue_depth ? runs : cfg->queue_depth;
	}
	if (deep > s->nslots / 4)
		deep = s->nslots / 4;
	return deep > base ? deep : base;
}

int tb_open(const struct tb_config *cfg, const struct tb_owner *owner, struct tb_store **out,
	    char *err, size_t errlen)
{
	struct tb_store *s = calloc(1, sizeof(*s));
	uint64_t nslots, min_slots;
	int ret;

	if (!s)
		return -ENOMEM;
	s->cfg = *cfg;
	s->owner = *owner;
	s->bs = cfg->block_size;
	pthread_mutex_init(&s->lock, NULL);
	pthread_mutex_init(&s->sync_lock, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&s->state_cv, &ca);
	pthread_cond_init(&s->space_cv, &ca);
	pthread_cond_init(&s->flush_cv, &ca);
	pthread_cond_init(&s->give_back_cv, &ca);
	pthread_condattr_destroy(&ca);

	nslots = cfg->dram_bytes / s->bs;
	min_slots = (uint64_t)cfg->max_pinned + 16;
	if (nslots < min_slots) {
		snprintf(err, errlen,
			 "dram=%zuM is too small: with block=%zuK and these threads it needs at "
			 "least %lluM",
			 cfg->dram_bytes >> 20, s->bs >> 10,
			 (unsigned long long)((min_slots * s->bs + (1 << 20) - 1) >> 20));
		ret = -EINVAL;
		goto fail;
	}
	if (nslots > UINT32_MAX - cfg->spare_slots)
		nslots = UINT32_MAX - cfg->spare_slots;
	s->nslots = (uint32_t)nslots;
	/* The spare slots follow the cache's, outside dram_bytes. */
	ret = dram_arena_init(&s->arena, s->bs, s->nslots + cfg->spare_slots, cfg->share_arena);
	if (ret < 0) {
		snprintf(err, errlen, "cannot map a DRAM arena of %zuM: %s", cfg->dram_bytes >> 20,
			 strerror(-ret));
		goto fail;
	}
	s->zero = calloc(1, s->bs);
	s->spares = calloc(cfg->spare_slots + 1, sizeof(*s->spares));
	for (uint32_t i = 0; s->spares && i < cfg->spare_slots; i++)
		s->spares[s->nspares++] = s->nslots + cfg->spare_slots - 1 - i;
	s->entries = calloc(s->nslots, sizeof(*s->entries));
	s->hash_mask = pow2_at_least(2ULL * s->nslots) - 1;
	s->hash = calloc(s->hash_mask + 1, sizeof(*s->hash));
	s->lochash = calloc(s->hash_mask + 1, sizeof(*s->lochash));
	s->ohash_mask = pow2_at_least(s->nslots) - 1;
	s->ohash = calloc(s->ohash_mask + 1, sizeof(*s->ohash));
	s->nghost = s->nslots * 2 > 16 ? s->nslots * 2 : 16;
	s->ghost_mask = (uint32_t)pow2_at_least(s->nghost) - 1;
	s->ghost = calloc(s->nghost, sizeof(*s->ghost));
	s->ghost_next = calloc(s->nghost, sizeof(*s->ghost_next));
	s->ghost_head = calloc((size_t)s->ghost_mask + 1, sizeof(*s->ghost_head));
	s->scratch = calloc(s->nslots, sizeof(*s->scratch));
	/*
	 * Pins may hold what readers' pins do not need, less a quarter of
	 * the slots that writers always have to cycle through: dirty blocks
	 * become evictable once written back, pinned ones never do.
	 */
	s->pin_limit = s->nslots > cfg->max_pinned + 16 + s->nslots / 4
			       ? s->nslots - cfg->max_pinned - 16 - s->nslots / 4
			       : 0;
	if (!s->zero || !s->spares || !s->entries || !s->hash || !s->lochash || !s->ohash || !s->ghost || !s->ghost_next ||
	    !s->ghost_head || !s->scratch) {
		snprintf(err, errlen, "out of memory for %u cache entries", s->nslots);
		ret = -ENOMEM;
		goto fail;
	}
	s->nsectors = (uint32_t)(s->bs / SECTOR);
	s->sector_words = (s->nsectors + 63) / 64;
	s->sector_bits = calloc((size_t)s->nslots * s->sector_words, sizeof(uint64_t));
	if (!s->sector_bits) {
		snprintf(err, errlen, "out of memory for %u cache entries", s->nslots);
		ret = -ENOMEM;
		goto fail;
	}
	for (uint32_t i = 0; i < s->nslots; i++) {
		struct tb_entry *e = &s->entries[i];

		e->written = s->sector_bits + (size_t)i * s->sector_words;
		e->slot = i;
		e->s = s;
		e->loc = TB_LOC_NONE;
		elist_append(&s->free_list, e);
	}

	if (cfg->n_devs == 0 || cfg->n_devs > TB_MAX_DEVS) {
		snprintf(err, errlen, "between 1 and %d persistent devices are needed", TB_MAX_DEVS);
		ret = -EINVAL;
		goto fail;
	}
	for (unsigned i = 0; i < cfg->n_devs; i++) {
		const struct tb_dev_spec *sp = &cfg->devs[i];

		if (sp->kind == TB_KIND_S3)
			ret = dev_open_s3(&s->dev[i], i, cfg->s3, cfg->store_id, s->bs,
					  cfg->queue_depth, sp->bw, sp->cap, &s->arena, err, errlen);
		else
			ret = dev_open_slab(&s->dev[i], sp->kind == TB_KIND_PFS ? "pfs" : "nvme", i,
					    sp->path, cfg->store_id, s->bs, cfg->engine,
					    cfg->queue_depth, sp->bw, sp->cap, &s->arena, err, errlen);
		if (ret < 0)
			goto fail;
		dev_set_readahead(s->dev[i], cfg->remote_readahead);
		for (unsigned j = 0; j < i; j++)
			if (strcmp(s->dev[j]->name, s->dev[i]->name) == 0) /* a second pfs */
				snprintf(s->dev[i]->name, sizeof(s->dev[i]->name), "%s%u",
					 s->dev[i]->kind, i);
		s->n_devs++;
	}
	s->wb_max = wb_depth(s, cfg);
	for (unsigned i = 0; i < s->n_devs; i++)
		if (s->dev[i]->run > s->wb_batch && s->dev[i]->run <= s->wb_max)
			s->wb_batch = s->dev[i]->run;
	set_reserve(s, cfg);
	/*
	 * Blocks loaded ahead of their reader take slots from what the cycle
	 * keeps resident: enough to hide the devices' latency, no more.
	 */
	s->pf_win.depth = s->nslots / PREFETCH_DEPTH_SHARE > PREFETCH_DEPTH_MIN
				  ? s->nslots / PREFETCH_DEPTH_SHARE
				  : PREFETCH_DEPTH_MIN;
	s->pf_win.min = s->pf_win.depth;
	s->pf_win.max = s->nslots / PF_GROW_SHARE > s->pf_win.depth ? s->nslots / PF_GROW_SHARE
								     : s->pf_win.depth;
	s->pf_deep_max = s->nslots / PREFETCH_DEEP_SHARE;
	s->prefetch_max = s->nslots / PREFETCH_SHARE;
	if (s->prefetch_max > (uint64_t)s->n_devs * cfg->queue_depth)
		s->prefetch_max = (uint64_t)s->n_devs * cfg->queue_depth;
	*out = s;
	return 0;
fail:
	tb_forget_identity(s);
	tb_close(s);
	return ret;
}

void tb_forget_identity(struct tb_store *s)
{
	for (unsigned i = 0; i < s->n_devs; i++)
		dev_forget_identity(s->dev[i]);
}

unsigned tb_n_devs(const struct tb_store *s)
{
	return s->n_devs;
}

/* Device i against the store's blocks on it and its recorded binding (see tb.h). */
static int check_device(struct tb_dev *d, uint64_t blocks, const char *recorded, char *err,
			size_t errlen)
{
	char what[600];

	dev_describe(d, what, sizeof(what));
	if (d->id_missing && blocks && strcmp(d->kind, "s3") == 0) {
		snprintf(err, errlen,
			 "%s has no tensorfs.dev, but this store holds %llu blocks on it (device "
			 "%u): give the remote= bucket and prefix, and the endpoint=, that hold "
			 "them",
			 what, (unsigned long long)blocks, d->index);
		return -ENODEV;
	}
	if (d->id_missing && blocks) {
		snprintf(err, errlen,
			 "%s has no tensorfs.dev, but this store holds %llu blocks on it (device "
			 "%u): is its drive mounted? Mount it there, or give the folder that holds "
			 "them in this place of the list; an empty folder is taken as a new device "
			 "only where the store holds no blocks",
			 what, (unsigned long long)blocks, d->index);
		return -ENODEV;
	}
	if (!d->id_missing && recorded[0] && strcmp(d->bind, recorded) != 0) {
		snprintf(err, errlen,
			 "%s holds an earlier binding of device %u of this store (%s), not the one "
			 "its blocks there were written to since (%s): is the right drive mounted "
			 "there? %s",
			 what, d->index, d->bind[0] ? d->bind : "from before bindings", recorded,
			 blocks ? "Mount it, or give the folder that holds them"
				: "The store holds no blocks there: remove its tensorfs.dev and "
				  "tensorfs.slab to take it afresh");
		return -EINVAL;
	}
	if (d->slab_made && blocks) {
		snprintf(err, errlen,
			 "%s holds this store's tensorfs.dev but no tensorfs.slab, and the store "
			 "holds %llu blocks in it (device %u): put back its tensorfs.slab",
			 what, (unsigned long long)blocks, d->index);
		return -ENODEV;
	}
	return 0;
}

int tb_check_devices(struct tb_store *s, const uint64_t *blocks, char (*bind)[TB_BIND_LEN],
		     unsigned n_bind, bool *changed, char *err, size_t errlen)
{
	*changed = n_bind < s->n_devs;
	for (unsigned i = 0; i < s->n_devs; i++) {
		struct tb_dev *d = s->dev[i];
		const char *recorded = i < n_bind ? bind[i] : "";
		int ret = check_device(d, blocks[i], recorded, err, errlen);

		if (ret)
			return ret;
		if (d->id_missing) {
			dev_new_bind(bind[i]);
			*changed = true;
		} else if (strcmp(bind[i], d->bind) != 0) {
			/* Recorded "" (none known): what the identity says. */
			snprintf(bind[i], TB_BIND_LEN, "%s", d->bind);
			*changed = true;
		}
	}
	return 0;
}

int tb_bind_devices(struct tb_store *s, char (*bind)[TB_BIND_LEN], const char *store_id, char *err,
		    size_t errlen)
{
	for (unsigned i = 0; i < s->n_devs; i++) {
		int ret = dev_bind(s->dev[i], store_id, bind[i], err, errlen);

		if (ret)
			return ret;
	}
	return 0;
}

int tb_mark_used(struct tb_store *s, uint64_t loc)
{
	if (tb_loc_dev(loc) >= s->n_devs)
		return -ENODEV;
	return dev_mark(s->dev[tb_loc_dev(loc)], tb_loc_slot(loc));
}

int tb_start(struct tb_store *s)
{
	int ret;

	ret = verify_start(s);
	if (ret < 0)
		return ret;
	for (unsigned i = 0; i < s->n_devs; i++) {
		ret = dev_start(s->dev[i]);
		if (ret < 0)
			return ret;
	}
	ret = pthread_create(&s->flusher, NULL, flush_main, s);
	if (ret)
		return -ret;
	s->started = true;
	if (s->cfg.punch_after_ms) {
		pthread_mutex_lock(&s->lock);
		giveback_arm(s); /* the slab may hold free space since the last mount */
		pthread_mutex_unlock(&s->lock);
		ret = pthread_create(&s->giveback, NULL, giveback_main, s);
		if (ret)
			return -ret;
		s->giveback_started = true;
	}
	return 0;
}

int tb_close(struct tb_store *s)
{
	int ret = 0;

	if (!s)
		return 0;
	if (s->started) {
		ret = tb_sync(s);
		pthread_mutex_lock(&s->lock);
		s->stopping = true;
		s->stop_ms = now_ms();
		for (struct tb_entry *e = s->dirty_list.head; e; e = e->lnext)
			if (e->retries && e->dirty_ms > s->stop_ms + STOP_RETRY_GAP_MS)
				e->dirty_ms = s->stop_ms + STOP_RETRY_GAP_MS;
		s->flush_kicks++;
		__atomic_store_n(&s->give_back_stop, true, __ATOMIC_RELAXED);
		pthread_cond_broadcast(&s->flush_cv);
		pthread_cond_broadcast(&s->space_cv);
		pthread_cond_broadcast(&s->give_back_cv);
		pthread_mutex_unlock(&s->lock);
		if (s->giveback_started)
			pthread_join(s->giveback, NULL);
		pthread_join(s->flusher, NULL);
		int r = flush_do_sync(s);
		/*
		 * What counts is what is durable now: a block whose write-backs
		 * failed in the flush may have gone at the stop's last try.
		 */
		if (s->ndirty) {
			log_err("%llu dirty blocks were not written back",
				(unsigned long long)s->ndirty);
			ret = ret ? ret : -EIO;
		} else {
			ret = r;
		}
	}
	for (unsigned i = 0; i < s->n_devs; i++)
		dev_close(s->dev[i]);
	verify_stop(s); /* after the devices: no load completes any more */
	dram_arena_fini(&s->arena);
	if (s->ohash)
		for (uint64_t i = 0; i <= s->ohash_mask; i++)
			while (s->ohash[i]) {
				struct tb_obj *o = s->ohash[i];

				s->ohash[i] = o->hnext;
				free(o);
			}
	free(s->ohash);
	free(s->ghost);
	free(s->ghost_next);
	free(s->ghost_head);
	free(s->rank);
	free(s->scratch);
	free(s->hash);
	free(s->lochash);
	free(s->entries);
	free(s->sector_bits);
	free(s->zero);
	free(s->spares);
	free(s->pending);
	pthread_mutex_destroy(&s->lock);
	pthread_mutex_destroy(&s->sync_lock);
	pthread_cond_destroy(&s->state_cv);
	pthread_cond_destroy(&s->space_cv);
	pthread_cond_destroy(&s->flush_cv);
	pthread_cond_destroy(&s->give_back_cv);
	free(s);
	return ret;
}

/* ---- the arena, shared with local clients (fs/gpu.c) ---- */

void tb_arena(const struct tb_store *s, struct tb_arena_info *a)
{
	a->base = s->arena.base;
	a->bytes = s->arena.bytes;
	a->fd = s->arena.sealed ? s->arena.fd : -1;
	a->huge = s->arena.huge;
	a->locked = s->arena.locked;
}

void tb_client_pins(const struct tb_store *s, uint64_t *pins, uint64_t *write_pins)
{
	uint64_t reserved = (uint64_t)s->cfg.max_pinned + 16;
	uint64_t spare = s->nslots > reserved ? s->nslots - reserved : 0;

	/* Half of what readers leave, so that loads and prefetch still find slots. */
	*pins = spare / 2 ? spare / 2 : 1;
	/* Below the dirty mark: a client's own write pins must never hold it up. */
	*write_pins = s->dirty_max / 2 ? s->dirty_max / 2 : 1;
	if (*write_pins > *pins)
		*write_pins = *pins;
}

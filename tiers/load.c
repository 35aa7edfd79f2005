/*
 * load.c - reading blocks into the cache: loads from a block's home device,
 * synchronous reads of a stored block, and partial blocks (their written
 * sectors and the merge of the rest from the stored copy).
 *
 * Mechanism: it carries out the loads and merges that the requests
 * (cache.c), prefetch (prefetch.c) and write-back (flush.c) ask for, and
 * decides nothing about what stays. May call: verify.c (each read is
 * checked against its hash), entry.c, and the devices (dev.c and its
 * engines).
 */
#include "cache_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- loads (their completions run on device threads) ---- */

struct sync_io {
	struct tb_io io;
	pthread_mutex_t m;
	pthread_cond_t cv;
	bool done;
	int err;
};

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
	ret = cache_entry_insert(s, e, obj, idx);
	if (ret < 0) {
		cache_entry_free(s, e);
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
	cache_entry_unhash(s, e);
	cache_entry_free(s, e);
	pthread_cond_broadcast(&s->state_cv);
	pthread_mutex_unlock(&s->lock);
	cache_call_waiters(w, ret);
	pthread_mutex_lock(&s->lock);
	return ret;
}

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

/* ---- partial blocks ---- */

bool cache_sector_written(const struct tb_entry *e, uint32_t i)
{
	return e->written[i / 64] >> (i % 64) & 1;
}

/* Whether the sectors written cover the persisted block's stored bytes. */
bool cache_covers_stored(const struct tb_entry *e)
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
void cache_zero_unwritten(struct tb_store *s, struct tb_entry *e)
{
	char *slot = cache_slot_data(s, e);

	for (uint32_t i = (uint32_t)(e->base_len / SECTOR); i < s->nsectors; i++)
		if (!cache_sector_written(e, i))
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
	bool read = !cache_covers_stored(e);
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
				if (!cache_sector_written(e, i))
					memcpy(slot + (size_t)i * SECTOR,
					       bounce + (size_t)i * SECTOR, SECTOR);
		free(bounce);
		if (ret)
			return ret;
	}
	cache_zero_unwritten(s, e);
	return read;
}

/* Hand a now-whole entry to the reads that waited on it. Lock held, dropped. */
static void wake_waiters(struct tb_store *s, struct tb_entry *e, int err)
{
	struct tb_waiter *w = e->waiters;

	e->waiters = NULL;
	if (!err)
		cache_pin_waiters(s, e, w);
	pthread_cond_broadcast(&s->state_cv);
	pthread_mutex_unlock(&s->lock);
	cache_call_waiters(w, err);
	pthread_mutex_lock(&s->lock);
}

/*
 * Make a DIRTY partial entry whole before it is read or written unaligned.
 * Lock held; dropped while waiting and during the read.
 */
int cache_merge_partial(struct tb_store *s, struct tb_entry *e)
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
		s->n.partial_merged += ret;
		ret = 0;
	}
	wake_waiters(s, e, ret);
	return ret;
}

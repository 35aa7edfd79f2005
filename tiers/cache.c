/*
 * cache.c - the block cache in the DRAM arena, and the flusher.
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
 * what its owner's block map does not show of it. Only CLEAN, unpinned
 * entries are evicted; free slots come first. The victim is chosen by the
 * policy: Belady's rule on the owner's learned cycle (cache_policy=auto
 * while a cycle is known), else 2Q, CLOCK or sampled LRU. A cycle larger
 * than the cache keeps the blocks that stay spread evenly over its objects
 * (update_keep), so that hits and misses mix in every file.
 *
 * Write-back is lazy. A dirty block stays in DRAM until eviction needs its
 * slot, so a block rewritten while cached is never written back, and a
 * block that dies in DRAM (unlink, truncate, punch) is never written at
 * all. The flusher keeps clean_low to clean_high slots free or clean ahead
 * of need, writing back the dirty blocks the policy would evict first (the
 * objects needed furthest ahead under the cycle; the oldest dirty blocks,
 * 2Q's re-referenced ones last, without it), so that neither a reader nor
 * a writer waits on a write-back. Under the cycle, a block that streams
 * through (take_stream) is written back as soon as it is rewritten. It also writes back what must go now:
 * blocks that fsync, flush or unmount wait on, and blocks dirty for longer
 * than dirty_expire_ms, the bound on what a crash can lose without fsync.
 * A partly written block waits flush_delay_ms for the rest of its bytes.
 * All-zero blocks become holes with no I/O; the others get a fresh slot on
 * a device chosen by weighted round-robin and are written in the
 * write-back class. Finished write-backs are committed to the owner in
 * batches, one transaction per batch. Every sync_interval_ms while there
 * are commits, the flusher makes them durable (device flush, then the
 * owner's sync) and only then returns released locations to the
 * allocators; with nothing to do it sleeps without a deadline.
 *
 * Lock order: store lock, then a device lock. The store lock is never held
 * while calling the owner.
 */
#include "tb.h"
#include "dram.h"
#include "fault.h"
#include "log.h"
#include "dev.h"

#include <errno.h>
#include <pthread.h>
#include <xxhash.h>
#if defined(__x86_64__)
/*
 * The same hash through the library's dispatcher, which picks the widest
 * vector unit the CPU has (AVX2, AVX-512) at run time: 2.3x the plain
 * entry point's speed on this project's build machine.
 */
#include <xxh_x86dispatch.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define WB_RETRY_BASE_MS 100
#define STOP_RETRY_MS 20000   /* at the stop, failed write-backs are retried this long */
#define STOP_RETRY_GAP_MS 1000 /* and this often */
#define WB_MAX_RETRIES 6
#define FLUSH_SCAN_MAX 4096
#define COMMIT_BATCH_MAX 1024
#define PREFETCH_SHARE 8 /* prefetches in flight hold at most 1/8 of the slots */
#define PREFETCH_DEPTH_SHARE 64 /* blocks ahead of their readers: 1/64 of the slots */
#define PREFETCH_DEPTH_MIN 4
#define PREFETCH_DEEP_SHARE 4 /* readers of remote blocks: at most 1/4 of the slots ahead */
#define PF_GROW_SHARE 2	      /* the window grows to half the slots at most */
#define PF_LATE_SHARE 10      /* a pass whose prefetches were 1/10 late or more wants more */
#define PF_IDLE_PCT 50	      /* ...if the busiest device had requests in flight less of it */
#define PF_BUSY_PCT 90	      /* a pass with a device this busy wants less */
#define PF_PASS_MIN 16	      /* prefetches a pass must issue to judge its window */
#define PF_WORSE_PCT 105      /* a pass this much longer than before a growth undoes it, */
#define PF_BETTER_PCT 80      /* ...unless its late share fell to this much of what it was, */
#define PF_WORSE_GROSS_PCT 125 /* ...or unless it was not this much longer */
#define PF_HOLD_PASSES 8      /* ...and the window does not grow for this many passes */
#define SECTOR TB_LEN_UNIT /* granularity of a partial block's written map and stored lengths */
#define EVICT_SAMPLE 32	 /* candidates a sampled eviction compares */
#define RANK_MAX 4096	 /* objects the cycle's eviction order ranks */
#define STREAM_SCAN 256	 /* newest dirty blocks the flusher looks at for streaming ones */
#define STREAM_WAIT_MS 50 /* a writer waits this long at most for a streaming block's slot */
#define CLEAN_KICK 8	 /* evictions under the cycle between the flusher's looks */
#define CLEAN_LOW_SHARE 64 /* the flusher keeps 1/64 to 1/32 of the slots clean */
#define CLEAN_LOW_MIN 2
#define CONVERT_MS 100	   /* dirty blocks not kept under the cycle: looked for this often */
#define BUSY_RETRY_MS 10 /* a dirty block pinned by a writer is looked at again after */
#define SYNC_FREES 256	 /* released slots that call a sync point at once */
#define IO_ALIGN 4096	 /* O_DIRECT alignment of a merge's bounce buffer */
#define STORE_ALIGN 4096 /* device I/O of a stored block's bytes: O_DIRECT on 4Kn devices */

enum entry_state { ES_FREE, ES_LOADING, ES_CLEAN, ES_DIRTY, ES_WB };

/* What a taker of a slot may wait for rather than evict a block that stays (victim_cycle). */
enum wait_stream { WAIT_NONE, WAIT_WB, WAIT_READY };

struct tb_obj;

struct tb_entry {
	uint64_t obj, idx;
	uint32_t slot;
	enum entry_state state;
	bool in_hash, dead, ref_bit, reserved, urgent;
	bool prefetched; /* loaded ahead of use and not yet read */
	bool deep;	 /* prefetched for a reader of remote blocks: counted in n_pf_deep */
	bool written_back; /* CLEAN by a write-back, not by a load */
	bool stream;	   /* under the cycle, streams through: written back at once (take_stream) */
	bool stream_ready; /* counted in n_stream_ready */
	bool stream_wb;	   /* counted in n_stream_wb */
	bool blind;	   /* dirtied by a whole rewrite of a stored block not cached, unread */
	bool stored;	   /* the owner's block map names a stored copy of (obj, idx) */
	bool hot;	   /* 2q: in Am, the re-referenced set; else in A1in */
	uint64_t last_use; /* s->ticks at its last pin, for lru */
	uint64_t admit;	   /* s->ticks when it entered the cache, for 2q's FIFO */
	bool placeholder; /* LOADING only while the owner resolves a write's block */
	bool partial;	  /* DIRTY or WB with only some sectors written */
	bool merging;	  /* a partial entry is being completed */
	uint64_t *written; /* sector bitmap, meaningful while partial */
	uint32_t nwritten;
	uint64_t base_loc; /* the persisted block a partial entry completes from */
	size_t base_len;   /* bytes stored there; the rest of it is zeros */
	uint64_t share_id; /* WB: commit as a reference to this stored block */
	bool no_share;	   /* the last commit of it as a shared block was stale: store it */
	bool hashed;
	uint8_t hash[TB_HASH_LEN];
	int pins, wpins;
	int err;	   /* last write-back error */
	unsigned retries;  /* failed write-backs in a row */
	uint64_t loc;	   /* persisted location while CLEAN */
	uint64_t new_loc;  /* location being written while WB */
	size_t new_len;	   /* and the bytes written there (stored_len) */
	uint64_t dirty_seq;
	uint64_t dirty_ms; /* when it became dirty, or earliest retry */
	size_t fill;	   /* bytes written since it became dirty */
	struct tb_waiter *waiters;
	struct tb_entry *hnext;
	struct tb_entry *lhnext; /* chain of the location hash, while CLEAN */
	bool in_lochash;
	struct tb_entry *oprev, *onext; /* the object's list */
	struct tb_entry *lprev, *lnext; /* free or dirty list */
	struct tb_obj *o;
	struct tb_store *s;
	struct tb_io req;
};

struct tb_obj {
	uint64_t obj;
	struct tb_entry *head;
	unsigned n;
	unsigned nclean;   /* CLEAN entries in its list */
	uint64_t nunstored; /* DIRTY or WB entries in its list that are not stored */
	uint64_t last_idx; /* block of its latest pin: a reader's position */
	uint64_t tail;	   /* its last block + 1 if the object fills it in part (the cycle says), or 0 */
	struct tb_obj *lprev, *lnext; /* the store's list of objects */
	int wb_err; /* reported once by the next tb_flush_obj */
	bool pinned; /* its blocks stay resident (tb_pin_obj) */
	struct tb_obj *hnext;
};

struct elist {
	struct tb_entry *head, *tail;
	uint64_t n;
};

struct tb_store {
	struct tb_config cfg;
	struct tb_owner owner;
	size_t bs;
	struct dram_arena arena;
	void *zero;
	struct tb_dev *dev[TB_MAX_DEVS];
	unsigned n_devs;

	pthread_mutex_t lock; /* guards all below, and every entry */
	pthread_cond_t state_cv; /* an entry left LOADING or WB, or was unpinned */
	pthread_cond_t space_cv; /* a slot, dirty budget or space was freed */
	pthread_cond_t flush_cv; /* work for the flusher (flusher_kick) */
	uint64_t flush_kicks;	 /* flusher_kick calls: one during the flusher's turn counts */
	struct tb_entry *entries;
	uint32_t nslots;
	struct tb_entry **hash;
	uint64_t hash_mask;
	struct tb_entry **lochash; /* CLEAN entries by persisted location, for dedup's verify */
	struct tb_obj **ohash;
	uint64_t ohash_mask;
	struct tb_obj *objs;   /* every object, for the cycle's eviction order */
	uint64_t nobjs;
	struct rank *rank;     /* RANK_MAX, scratch of rank_objects */
	struct tb_entry **scratch; /* nslots, scratch of the flusher's victim choice */
	struct elist free_list, dirty_list;
	struct tb_entry *done; /* finished write I/O, for the flusher */
	uint32_t clock_hand;
	uint64_t ndirty;       /* DIRTY + WB */
	/*
	 * Blocks streaming through on their way out: DIRTY, whole and with no
	 * writer (take_stream's next), and in WB.
	 */
	uint64_t n_stream_ready, n_stream_wb;
	uint64_t nclean;       /* CLEAN */
	uint64_t dirty_max;
	uint64_t clean_low, clean_high; /* free or clean slots the flusher keeps */
	uint64_t dirty_bg;     /* blind overwrites without a cycle: write-back this far below dirty_max */
	uint64_t keep_num, keep_den; /* under the cycle, blocks that stay of its blocks (0: all) */
	uint64_t keep_below;	     /* the share of the others that stay, as a 64-bit fraction */
	uint64_t convert_ms;	     /* when the flusher looks for dirty blocks not kept again */
	uint64_t evict_since_clean; /* evictions since the flusher last chose victims */
	uint64_t kept_evicted;	    /* blocks that stay under the cycle, evicted (victim_cycle) */
	bool due_scan;	       /* dirty blocks are urgent or retrying: walk the whole list */
	uint64_t reserved;     /* blocks reserved by DIRTY entries */
	uint64_t wb_inflight, wb_max;
	uint64_t dirty_seq;
	double credit[TB_MAX_DEVS]; /* weighted round-robin of placement */
	unsigned run_dev;	    /* placement: the device of the current run */
	unsigned run_left;	    /* and the blocks it still gets in a row */
	uint64_t *pending;     /* released locations awaiting a sync */
	size_t npending, cap_pending;
	bool sync_req, stopping, started;
	uint64_t stop_ms; /* when tb_close stopped the store (flusher_done) */
	uint64_t sync_gen;
	uint64_t commits_since_sync;
	unsigned urgent_waiters;
	pthread_t flusher;

	pthread_mutex_t sync_lock; /* one sync at a time */

	/* statistics, under lock */
	uint64_t hits, misses, evictions, holes, wb_errors, syncs, bp_waits;
	uint64_t prefetch_inflight, prefetch_max;
	uint64_t n_pf, pf_depth; /* blocks loaded ahead and not yet read, and their bound */
	uint64_t pf_depth_min, pf_depth_max; /* what tb_cycle_pass moves pf_depth between */
	/* At the last pass's end: the time, devices' time active, and prefetch counts. */
	uint64_t pass_ns, pass_active_ns[TB_MAX_DEVS], pass_issued, pass_late;
	uint64_t pass_before_grow_ns; /* the pass before the window last grew; 0: it did not */
	unsigned pass_before_grow_late; /* and the share of its prefetches late, in % */
	unsigned pf_hold;	      /* passes left before the window may grow again */
	/* The same for readers of remote blocks (tb_prefetch_deep). */
	uint64_t n_pf_deep, pf_deep_max;
	uint64_t *sector_bits; /* one bitmap per slot */
	size_t sector_words;
	uint32_t nsectors;
	uint64_t partial_created, partial_merged;
	uint64_t dedup_hits, dedup_mismatch, dedup_verify_cached;
	uint64_t ticks; /* counts pins, for lru */
	/* 2q: blocks evicted from A1in, remembered by key in a ring */
	uint64_t *ghost;
	uint32_t *ghost_head, *ghost_next; /* chains of ring positions + 1 */
	uint32_t nghost, ghost_pos, ghost_mask;
	uint32_t n_hot;
	uint64_t ghost_hits;
	uint64_t n_pinned_res, pin_limit; /* resident blocks of pinned objects */
	uint64_t pf_issued, pf_used, pf_wasted, pf_late, pf_refused;
	uint64_t dram_read_bytes, dram_write_bytes, dram_read_ops, dram_write_ops;
	uint64_t swapped_write_bytes;
	uint32_t *spares, nspares; /* spare slots not taken (tb_spare_take) */
	uint64_t wb_bytes;
	uint64_t expired; /* write-backs started by the age limit */
	uint64_t wb_rewritten; /* written back, then written again while still cached */
	long wb_log_sec;
};

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void deadline_in(struct timespec *ts, uint64_t ms)
{
	clock_gettime(CLOCK_MONOTONIC, ts);
	ts->tv_sec += (time_t)(ms / 1000);
	ts->tv_nsec += (long)(ms % 1000) * 1000000;
	if (ts->tv_nsec >= 1000000000) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000;
	}
}

static uint64_t mix(uint64_t a, uint64_t b)
{
	uint64_t h = a * 0x9E3779B97F4A7C15ULL ^ (b + 0x632BE59BD9B4E019ULL);

	h ^= h >> 31;
	h *= 0xBF58476D1CE4E5B9ULL;
	return h ^ (h >> 29);
}

/* ---- lists ---- */

static void elist_append(struct elist *l, struct tb_entry *e)
{
	e->lnext = NULL;
	e->lprev = l->tail;
	if (l->tail)
		l->tail->lnext = e;
	else
		l->head = e;
	l->tail = e;
	l->n++;
}

static void elist_prepend(struct elist *l, struct tb_entry *e)
{
	e->lprev = NULL;
	e->lnext = l->head;
	if (l->head)
		l->head->lprev = e;
	else
		l->tail = e;
	l->head = e;
	l->n++;
}

static void elist_remove(struct elist *l, struct tb_entry *e)
{
	if (e->lprev)
		e->lprev->lnext = e->lnext;
	else
		l->head = e->lnext;
	if (e->lnext)
		e->lnext->lprev = e->lprev;
	else
		l->tail = e->lprev;
	e->lprev = e->lnext = NULL;
	l->n--;
}

/* ---- hash of entries and objects ---- */

static struct tb_entry *hash_find(struct tb_store *s, uint64_t obj, uint64_t idx)
{
	struct tb_entry *e = s->hash[mix(obj, idx) & s->hash_mask];

	while (e && (e->obj != obj || e->idx != idx))
		e = e->hnext;
	return e;
}

static struct tb_obj *obj_find(struct tb_store *s, uint64_t obj)
{
	struct tb_obj *o = s->ohash[mix(obj, 0) & s->ohash_mask];

	while (o && o->obj != obj)
		o = o->hnext;
	return o;
}

static struct tb_obj *obj_get(struct tb_store *s, uint64_t obj)
{
	struct tb_obj *o = obj_find(s, obj);
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

static void obj_maybe_free(struct tb_store *s, struct tb_obj *o)
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

/* ---- 2q's ghost list A1out: keys of blocks evicted from A1in ---- */

static uint64_t ghost_key(uint64_t obj, uint64_t idx)
{
	return mix(obj, idx) | 1; /* never 0, which marks a free ring position */
}

static void ghost_unlink(struct tb_store *s, uint32_t pos)
{
	uint32_t *p = &s->ghost_head[s->ghost[pos] & s->ghost_mask];

	while (*p != pos + 1)
		p = &s->ghost_next[*p - 1];
	*p = s->ghost_next[pos];
	s->ghost[pos] = 0;
}

/* Remember key, forgetting the oldest one when the ring is full. */
static void ghost_add(struct tb_store *s, uint64_t key)
{
	uint32_t pos = s->ghost_pos;
	uint32_t *head = &s->ghost_head[key & s->ghost_mask];

	if (!s->nghost)
		return;
	s->ghost_pos = (pos + 1) % s->nghost;
	if (s->ghost[pos])
		ghost_unlink(s, pos);
	s->ghost[pos] = key;
	s->ghost_next[pos] = *head;
	*head = pos + 1;
}

/* Whether key is remembered; it is forgotten if so. */
static bool ghost_take(struct tb_store *s, uint64_t key)
{
	if (!s->nghost)
		return false;
	for (uint32_t i = s->ghost_head[key & s->ghost_mask]; i; i = s->ghost_next[i - 1])
		if (s->ghost[i - 1] == key) {
			ghost_unlink(s, i - 1);
			return true;
		}
	return false;
}

/*
 * A block enters the cache. Under 2q it goes to the re-referenced set Am
 * when it was evicted from A1in recently (a second, uncorrelated use),
 * else to A1in, which a one-time scan passes through without touching Am.
 */
static void admit(struct tb_store *s, struct tb_entry *e)
{
	e->admit = ++s->ticks;
	e->hot = ghost_take(s, ghost_key(e->obj, e->idx));
	if (e->hot) {
		s->n_hot++;
		s->ghost_hits++;
	}
}

/* A block leaves the cache; evicted says whether 2q should remember it. */
static void leave(struct tb_store *s, struct tb_entry *e, bool evicted)
{
	if (e->hot) {
		e->hot = false;
		s->n_hot--;
	} else if (evicted) {
		ghost_add(s, ghost_key(e->obj, e->idx));
	}
}

/* Dirty data of a block that has no stored copy: the owner's map lacks it. */
static bool unstored(const struct tb_entry *e)
{
	return (e->state == ES_DIRTY || e->state == ES_WB) && !e->stored;
}

/* Whether the owner's map now names a stored copy of e's block. Lock held. */
static void set_stored(struct tb_entry *e, bool stored)
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
	admit(s, e);
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
	obj_maybe_free(s, o);
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
static struct tb_entry *lochash_find(struct tb_store *s, uint64_t loc, const struct tb_entry *not)
{
	struct tb_entry *e = *lochash_bucket(s, loc);

	while (e && (e->loc != loc || e == not || e->partial))
		e = e->lhnext;
	return e;
}

/*
 * Move e to state st, keeping the counts of CLEAN entries (the store's and
 * its object's) that eviction and the flusher's cleaning go by, and the
 * location hash of CLEAN entries.
 */
static void set_state(struct tb_store *s, struct tb_entry *e, enum entry_state st)
{
	if (e->state == ES_CLEAN) {
		s->nclean--;
		if (e->in_hash)
			e->o->nclean--;
		if (e->in_lochash)
			lochash_del(s, e);
	}
	if (st == ES_CLEAN) {
		s->nclean++;
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
	leave(s, e, false);
	set_state(s, e, ES_FREE);
	e->dead = false;
	e->stored = false;
	e->loc = TB_LOC_NONE;
	elist_append(&s->free_list, e);
	pthread_cond_broadcast(&s->space_cv);
}

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

/* CLOCK: the first evictable entry not referenced since the hand passed. */
static struct tb_entry *victim_clock(struct tb_store *s)
{
	for (uint64_t step = 0; step < 2ULL * s->nslots; step++) {
		struct tb_entry *e = &s->entries[s->clock_hand];

		s->clock_hand = (s->clock_hand + 1) % s->nslots;
		if (!evictable(s, e))
			continue;
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
	struct tb_entry *best = NULL;
	unsigned seen = 0;

	for (uint64_t step = 0; step < s->nslots && seen < EVICT_SAMPLE; step++) {
		struct tb_entry *e = &s->entries[s->clock_hand];

		s->clock_hand = (s->clock_hand + 1) % s->nslots;
		if (!evictable(s, e))
			continue;
		seen++;
		if (!best || e->last_use < best->last_use)
			best = e;
	}
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
 * kept too. Objects are ranked afresh for each choice; their number is what
 * is resident, tens to thousands, and at most RANK_MAX of them are looked
 * at. (Ranking objects rewritten next first, since evicting a clean copy
 * that is overwritten before it is read costs nothing, was tried: on the
 * optimizer's cycle it moved a fifth more, as the churn it adds ends in
 * more write-backs.)
 */
struct rank {
	struct tb_obj *o;
	struct tb_use u;
};

static int rank_cmp(const void *a, const void *b)
{
	const struct rank *x = a, *y = b;

	if (x->u.dist != y->u.dist)
		return x->u.dist > y->u.dist ? -1 : 1;
	/* At equal distance the object with more clean blocks: they cost no write. */
	return x->o->nclean > y->o->nclean ? -1 : x->o->nclean < y->o->nclean;
}

static bool obj_protected(const struct tb_store *s, const struct tb_obj *o)
{
	return o->pinned && s->n_pinned_res <= s->pin_limit;
}

static void next_use(struct tb_store *s, uint64_t obj, struct tb_use *u)
{
	s->owner.next_use(s->owner.ctx, obj, u);
}

/* Objects in eviction order; with_dirty counts objects holding only dirty blocks. */
static size_t rank_objects(struct tb_store *s, bool with_dirty)
{
	size_t n = 0;

	for (struct tb_obj *o = s->objs; o && n < RANK_MAX; o = o->lnext) {
		if (!(with_dirty ? o->n : o->nclean) || obj_protected(s, o))
			continue;
		s->rank[n].o = o;
		next_use(s, o->obj, &s->rank[n].u);
		o->tail = s->rank[n].u.size % s->bs ? s->rank[n].u.size / s->bs + 1 : 0;
		n++;
	}
	qsort(s->rank, n, sizeof(*s->rank), rank_cmp);
	return n;
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
 * bytes (docs/benchmarks.md). What stays is the dirty mark less the
 * prefetch window: the slots above the dirty mark (the flusher's clean
 * reserve) and the window are what blocks streaming through use. The
 * reserve was once taken off twice; with writers waiting for streaming
 * blocks rather than evicting kept ones, the 16 slots more that stay at
 * twice the DRAM tier cut the bytes moved from 0.537 to 0.527 of the raw
 * folder's. With a cycle that fits, keep_den is 0: every block stays.
 */
static void update_keep(struct tb_store *s)
{
	uint64_t blocks = 0, tails = 0, keep;
	uint64_t margin = s->pf_depth;

	if (s->owner.cycle_size)
		s->owner.cycle_size(s->owner.ctx, &blocks, &tails);
	keep = s->dirty_max > margin ? s->dirty_max - margin : 0;
	s->keep_num = keep;
	s->keep_den = blocks > keep ? blocks : 0;
	/*
	 * Last blocks that their objects fill in part do not stay (unless the
	 * whole cycle does): the devices move such a block only up to the end
	 * of its object (stored_len, covers_stored), so its slot saves little
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
static bool kept(const struct tb_store *s, const struct tb_entry *e)
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
	for (struct tb_entry *e = r->o->head; e; e = e->onext) {
		if (!evictable(s, e))
			continue;
		if (mode < 2 && (e->prefetched || ahead_of_reader(e, &r->u)))
			continue;
		if (mode == 0 && !outside && kept(s, e))
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
 */
static struct tb_entry *victim_cycle(struct tb_store *s, struct tb_use *vu, enum wait_stream wait_stream)
{
	size_t n = rank_objects(s, false);

	update_keep(s);
	for (int mode = s->keep_den ? 0 : 1; mode < 3; mode++) {
		if (mode == 1 && s->keep_den && wait_stream &&
		    (s->n_stream_wb || (wait_stream == WAIT_READY && s->n_stream_ready)))
			return NULL;
		for (size_t i = 0; i < n; i++) {
			struct tb_entry *e = obj_victim(s, &s->rank[i], mode);

			if (e) {
				*vu = s->rank[i].u;
				if (mode == 2)
					vu->dist = 0, vu->write = false;
				if (mode > 0 && s->keep_den && kept(s, e))
					s->kept_evicted++;
				return e;
			}
		}
	}
	return NULL;
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
	struct tb_entry *old_in = NULL, *lru_hot = NULL;
	unsigned seen = 0;
	uint64_t resident = s->nslots - s->free_list.n;
	bool in_over = resident - s->n_hot > s->nslots / 4;

	for (uint64_t step = 0; step < s->nslots && seen < EVICT_SAMPLE; step++) {
		struct tb_entry *e = &s->entries[s->clock_hand];

		s->clock_hand = (s->clock_hand + 1) % s->nslots;
		if (!evictable(s, e))
			continue;
		seen++;
		if (!e->hot && (!old_in || e->admit < old_in->admit))
			old_in = e;
		if (e->hot && (!lru_hot || e->last_use < lru_hot->last_use))
			lru_hot = e;
	}
	if (old_in && (in_over || !lru_hot))
		return old_in;
	return lru_hot ? lru_hot : old_in;
}

static uint64_t cycle_period(struct tb_store *s)
{
	if (s->cfg.policy != TB_POLICY_AUTO || !s->owner.next_use || !s->owner.cycle_period)
		return 0;
	return s->owner.cycle_period(s->owner.ctx);
}

/*
 * The clean entry to evict by the policy. *vu, when the cycle ranks it,
 * says when its block is needed next (dist UINT64_MAX otherwise). NULL
 * when none is evictable, or, with wait_stream, none should be yet
 * (victim_cycle).
 */
static struct tb_entry *pick_victim(struct tb_store *s, struct tb_use *vu, enum wait_stream wait_stream)
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
		return cycle_period(s) ? victim_cycle(s, vu, wait_stream) : victim_2q(s);
	}
}

/*
 * Dirty blocks over the dirty mark less `below': these must be cleaned
 * whatever they are.
 */
static int64_t dirty_over(struct tb_store *s, uint64_t below)
{
	return (int64_t)s->ndirty - (int64_t)s->wb_inflight -
	       ((int64_t)s->dirty_max - (int64_t)below);
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
 * good, and each steady iteration moved 3% more (docs/benchmarks.md).
 */
static uint64_t dirty_below(struct tb_store *s)
{
	struct tb_entry *oldest = s->dirty_list.head;

	return oldest && oldest->blind && !cycle_period(s) ? s->dirty_bg : s->clean_low;
}

/*
 * Wake the flusher: there is work for it, or a reason to look again. Lock
 * held. The flusher drops the lock between looking for work and going to
 * sleep (it writes and commits in between); a kick in that gap would be
 * lost, so it sleeps only if no kick came since it looked (flusher_main).
 * Lost, the stop at unmount left it asleep for ever, and an fsync that
 * found its blocks pinned waited with it.
 */
static void flusher_kick(struct tb_store *s)
{
	s->flush_kicks++;
	pthread_cond_signal(&s->flush_cv);
}

/*
 * The flusher keeps clean_high free or clean slots ahead of need; wake it
 * when they run short, when dirty data passes the background mark, and
 * after every few evictions while a cycle ranks the victims, since each
 * use moves which blocks lie furthest ahead.
 */
static void kick_cleaner(struct tb_store *s, bool evicted)
{
	uint64_t below = dirty_below(s);

	if (s->free_list.n + s->nclean < s->clean_high ||
	    (below > s->clean_low && dirty_over(s, below) > 0) ||
	    (evicted && ++s->evict_since_clean >= CLEAN_KICK))
		flusher_kick(s);
}

/* Take e (free, or a clean victim) for a new block. */
static struct tb_entry *entry_take(struct tb_store *s, struct tb_entry *e)
{
	bool evicted = e->state != ES_FREE;

	if (!evicted) {
		elist_remove(&s->free_list, e);
	} else {
		leave(s, e, true);
		entry_unhash(s, e);
		s->evictions++;
		if (e->prefetched)
			s->pf_wasted++;
	}
	pf_clear(s, e);
	set_state(s, e, ES_FREE);
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
	kick_cleaner(s, evicted);
	return e;
}

/* A free entry: a free slot, else a victim among clean unpinned ones. */
static struct tb_entry *entry_alloc(struct tb_store *s, enum wait_stream wait_stream)
{
	struct tb_entry *e = s->free_list.head;
	struct tb_use vu;

	if (!e)
		e = pick_victim(s, &vu, wait_stream);
	if (!e) {
		flusher_kick(s);
		return NULL;
	}
	return entry_take(s, e);
}

/*
 * Wait for any slot; re-checks the hash, since the wait drops the lock.
 * wait_stream: see victim_cycle. That wait is bounded (STREAM_WAIT_MS):
 * a streaming block that does not go (its object pinned, or a write-back
 * that keeps failing) does not hold a writer.
 */
static struct tb_entry *entry_alloc_wait(struct tb_store *s, uint64_t obj, uint64_t idx,
					 struct tb_entry **found, enum wait_stream wait_stream)
{
	struct timespec until;

	if (wait_stream)
		deadline_in(&until, STREAM_WAIT_MS);
	for (;;) {
		struct tb_entry *e;

		*found = hash_find(s, obj, idx);
		if (*found)
			return NULL;
		e = entry_alloc(s, wait_stream);
		if (e)
			return e;
		flusher_kick(s);
		if (!wait_stream)
			pthread_cond_wait(&s->space_cv, &s->lock);
		else if (pthread_cond_timedwait(&s->space_cv, &s->lock, &until) == ETIMEDOUT)
			wait_stream = WAIT_NONE;
	}
}

static void *slot_data(struct tb_store *s, struct tb_entry *e)
{
	return dram_slot(&s->arena, e->slot);
}

/* ---- space ---- */

static uint64_t space_avail(struct tb_store *s)
{
	uint64_t free_slots = 0;

	for (unsigned i = 0; i < s->n_devs; i++)
		free_slots += dev_free_slots(s->dev[i]);
	return free_slots > s->reserved ? free_slots - s->reserved : 0;
}

/* Reserve n blocks; waits for pending frees to come back through a sync. */
/*
 * Why no block can be had: -EIO when a device that is out after errors
 * holds the missing space (the application should see an I/O error, not
 * a full filesystem), else -ENOSPC.
 */
static int no_space_err(struct tb_store *s)
{
	for (unsigned i = 0; i < s->n_devs; i++)
		if (dev_out(s->dev[i]))
			return -EIO;
	return -ENOSPC;
}

static int reserve_blocks(struct tb_store *s, uint64_t n)
{
	for (int tries = 0; tries < 4; tries++) {
		uint64_t gen = s->sync_gen;
		struct timespec ts;

		if (space_avail(s) >= n) {
			s->reserved += n;
			return 0;
		}
		if (!s->npending && !s->wb_inflight && !s->commits_since_sync)
			break;
		s->sync_req = true;
		flusher_kick(s);
		deadline_in(&ts, 2000);
		while (s->sync_gen == gen)
			if (pthread_cond_timedwait(&s->space_cv, &s->lock, &ts) == ETIMEDOUT)
				break;
	}
	return no_space_err(s);
}

static uint64_t cycle_period(struct tb_store *s);
static bool kept(const struct tb_store *s, const struct tb_entry *e);

static void make_dirty(struct tb_store *s, struct tb_entry *e, bool blind)
{
	/*
	 * A stored block rewritten while not cached, or loaded since its last
	 * write-back: it streams through (see take_stream).
	 */
	bool uncached = e->state == ES_LOADING && e->stored; /* a whole rewrite, placeholder */

	e->stream = ((e->state == ES_CLEAN && !e->written_back) || uncached) && cycle_period(s) &&
		    !(s->keep_den && kept(s, e));
	e->blind = uncached && blind;
	pf_clear(s, e);
	if (e->written_back)
		s->wb_rewritten++; /* written back, then written again in DRAM */
	e->written_back = false;
	set_state(s, e, ES_DIRTY);
	e->dirty_seq = ++s->dirty_seq;
	e->dirty_ms = now_ms();
	e->fill = 0;
	e->reserved = true;
	s->ndirty++;
	elist_append(&s->dirty_list, e);
	if (s->dirty_list.n == 1 && s->cfg.dirty_expire_ms)
		flusher_kick(s); /* the flusher sleeps until the head ages */
	kick_cleaner(s, false);
}

/* ---- I/O completions (device threads) ---- */

/* Pin e once for each waiter, handing each its reference. Lock held. */
static void pin_waiters(struct tb_store *s, struct tb_entry *e, struct tb_waiter *w)
{
	for (; w; w = w->next) {
		e->pins++;
		w->ref.e = e;
		w->ref.data = slot_data(s, e);
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

static void read_done(struct tb_io *r, int err)
{
	struct tb_entry *e = (struct tb_entry *)((char *)r - offsetof(struct tb_entry, req));
	struct tb_store *s = e->s;
	struct tb_waiter *w;

	pthread_mutex_lock(&s->lock);
	w = e->waiters;
	e->waiters = NULL;
	if (e->req.cls == IO_PREFETCH) {
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
		set_state(s, e, ES_CLEAN);
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

static void write_done(struct tb_io *r, int err)
{
	struct tb_entry *e = (struct tb_entry *)((char *)r - offsetof(struct tb_entry, req));
	struct tb_store *s = e->s;

	pthread_mutex_lock(&s->lock);
	e->err = err;
	e->lnext = s->done;
	s->done = e;
	flusher_kick(s);
	pthread_mutex_unlock(&s->lock);
}

/* Whether a stored block at loc of len bytes can be: on one of our devices, in whole units. */
static bool stored_ok(const struct tb_store *s, uint64_t loc, size_t len)
{
	return tb_loc_dev(loc) < s->n_devs && len && len <= s->bs && len % SECTOR == 0;
}

/*
 * The device I/O that moves a block's len stored bytes: whole STORE_ALIGN
 * units, the block size at most. The bytes between are zeros, as written.
 */
static size_t io_len(size_t len)
{
	return (len + STORE_ALIGN - 1) / STORE_ALIGN * STORE_ALIGN;
}

/* The owner's resolve, checked (stored_ok). No lock held. */
static int resolve(struct tb_store *s, uint64_t obj, uint64_t idx, uint64_t *loc, size_t *len)
{
	int ret = s->owner.resolve(s->owner.ctx, obj, idx, loc, len);

	if (ret == 0 && !stored_ok(s, *loc, *len))
		ret = -EIO;
	return ret;
}

/* Load the len bytes stored at loc into e's slot; the rest of the block is zeros. */
static void submit_read(struct tb_store *s, struct tb_entry *e, uint64_t loc, size_t len,
			enum io_class cls)
{
	e->loc = loc;
	e->stored = true; /* LOADING: not dirty, so no count changes */
	memset((char *)slot_data(s, e) + io_len(len), 0, s->bs - io_len(len));
	e->req.op = IO_READ;
	e->req.cls = cls;
	e->req.slot = tb_loc_slot(loc);
	e->req.buf = slot_data(s, e);
	e->req.len = io_len(len);
	e->req.done = read_done;
	dev_submit(s->dev[tb_loc_dev(loc)], &e->req);
}

/*
 * Start loading (obj, idx) into a new LOADING entry. Called with the lock
 * held, returns with it held; drops it around the owner's resolve.
 * Returns 1 when loading, -ENOENT for a hole, or -errno.
 */
static int start_load(struct tb_store *s, struct tb_entry *e, uint64_t obj, uint64_t idx,
		      struct tb_waiter *w, enum io_class cls, bool ahead)
{
	uint64_t loc;
	size_t len;
	int ret;

	set_state(s, e, ES_LOADING);
	ret = entry_insert(s, e, obj, idx);
	if (ret < 0) {
		entry_free(s, e);
		return ret;
	}
	if (cls == IO_DEMAND)
		e->o->last_idx = idx;
	pthread_mutex_unlock(&s->lock);
	ret = resolve(s, obj, idx, &loc, &len);
	if (ret == 0) {
		pthread_mutex_lock(&s->lock);
		if (w) {
			w->next = e->waiters;
			e->waiters = w;
		}
		if (cls == IO_PREFETCH)
			s->prefetch_inflight++;
		if (ahead) {
			e->prefetched = true;
			if (e->deep)
				s->n_pf_deep++;
			else
				s->n_pf++;
		}
		pthread_mutex_unlock(&s->lock);
		submit_read(s, e, loc, len, cls);
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

/* Read the len bytes stored at loc into buf, io_len(len) long, and wait. No lock held. */
static int read_sync(struct tb_store *s, uint64_t loc, size_t len, void *buf)
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
	x.io.len = io_len(len);
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
	char *slot = slot_data(s, e);

	for (uint32_t i = (uint32_t)(e->base_len / SECTOR); i < s->nsectors; i++)
		if (!sector_written(e, i))
			memset(slot + (size_t)i * SECTOR, 0, SECTOR);
}

/*
 * Fill the sectors of a partial entry that were not written from its
 * persisted block, reading only its stored bytes, and only when some of
 * them were not written over. The entry is stable: no writer holds it
 * (merging or WB). 1 when it read, 0 when it did not, or -errno. No lock
 * held.
 */
static int merge_io(struct tb_store *s, struct tb_entry *e)
{
	char *bounce = NULL, *slot = slot_data(s, e);
	bool read = !covers_stored(e);
	int ret;

	if (read) {
		if (posix_memalign((void **)&bounce, IO_ALIGN, io_len(e->base_len)))
			return -ENOMEM;
		ret = read_sync(s, e->base_loc, e->base_len, bounce);
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
	ret = merge_io(s, e);
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
	struct tb_entry *e, *found;
	int ret;

	pthread_mutex_lock(&s->lock);
	for (;;) {
		e = hash_find(s, obj, idx);
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
			e->pins++;
			e->ref_bit = true;
			e->last_use = ++s->ticks;
			e->o->last_idx = idx;
			s->hits++;
			if (e->prefetched) {
				pf_clear(s, e);
				s->pf_used++;
			}
			pthread_mutex_unlock(&s->lock);
			ref->e = e;
			ref->data = slot_data(s, e);
			return 0;
		}
		if (e) { /* loading for someone else */
			e->o->last_idx = idx;
			if (w) {
				w->next = e->waiters;
				e->waiters = w;
				pthread_mutex_unlock(&s->lock);
				return 1;
			}
			pthread_cond_wait(&s->state_cv, &s->lock);
			continue;
		}
		e = entry_alloc_wait(s, obj, idx, &found, WAIT_NONE);
		if (!e)
			continue; /* someone else inserted it meanwhile */
		s->misses++;
		ret = start_load(s, e, obj, idx, w, IO_DEMAND, false);
		if (ret != 1 || w) {
			pthread_mutex_unlock(&s->lock);
			return ret;
		}
		/* Synchronous caller: loop until the entry is ready. */
	}
}

/* Drop a pin of e. Lock held. */
static void unpin_locked(struct tb_store *s, struct tb_entry *e)
{
	if (--e->pins == 0) {
		if (e->dead)
			entry_free(s, e);
		pthread_cond_broadcast(&s->space_cv);
		pthread_cond_broadcast(&s->state_cv);
	}
}

static void unpin(struct tb_store *s, struct tb_entry *e)
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

/*
 * Whether loading block idx of obj ahead of use is worth evicting v: only
 * if v is needed later than the block brought in (the "do no harm" rule of
 * integrated prefetching and caching, Cao, Felten, Karlin and Li), which
 * the cycle tells; without one, a prefetch never displaces 2q's
 * re-referenced set. An unknown block (outside the cycle: a hint, or a
 * reader of another file) is taken as needed now.
 */
static bool prefetch_worth(struct tb_store *s, const struct tb_entry *v, const struct tb_use *vu,
			   uint64_t obj, uint64_t idx)
{
	struct tb_use u;
	struct tb_obj *o;

	if (!cycle_period(s))
		return !v->hot;
	if (vu->dist == UINT64_MAX || vu->write)
		return true; /* unknown, or rewritten before it is read: no read lost */
	next_use(s, obj, &u);
	if (u.dist == UINT64_MAX)
		return true;
	o = obj_find(s, obj);
	if (o && u.now && idx > o->last_idx)
		u.dist = 0; /* ahead of the reader of an object in use now */
	return vu->dist > u.dist;
}

/*
 * Start loading (obj, idx) ahead of use, in the prefetch class (see tb.h);
 * depth > 0: for a reader of remote blocks, bounded by depth apart from
 * the shallow window.
 */
static int prefetch(struct tb_store *s, uint64_t obj, uint64_t idx, bool hint, uint64_t depth)
{
	uint64_t *n_pf = depth ? &s->n_pf_deep : &s->n_pf;
	uint64_t bound = depth ? (depth < s->pf_deep_max ? depth : s->pf_deep_max) : s->pf_depth;
	/* A remote reader's whole window may be in flight: latency is what it hides. */
	uint64_t inflight_max =
	    depth && s->pf_deep_max > s->prefetch_max ? s->pf_deep_max : s->prefetch_max;
	struct tb_entry *e;
	struct tb_use vu;
	int ret;

	pthread_mutex_lock(&s->lock);
	if (hash_find(s, obj, idx)) {
		pthread_mutex_unlock(&s->lock);
		return 0;
	}
	if (s->prefetch_inflight >= inflight_max || s->ndirty >= s->dirty_max) {
		pthread_mutex_unlock(&s->lock);
		return -EAGAIN; /* try again once some have landed */
	}
	if (!hint && *n_pf >= bound) {
		pthread_mutex_unlock(&s->lock);
		return -ENOBUFS; /* try again once some have been read */
	}
	e = s->free_list.head;
	if (!e) {
		e = pick_victim(s, &vu, WAIT_WB);
		if (!e) {
			flusher_kick(s);
			pthread_mutex_unlock(&s->lock);
			return -EAGAIN;
		}
		if (!hint && !prefetch_worth(s, e, &vu, obj, idx)) {
			s->pf_refused++;
			pthread_mutex_unlock(&s->lock);
			return -EBUSY;
		}
	}
	e = entry_take(s, e);
	e->deep = depth > 0;
	s->pf_issued++;
	ret = start_load(s, e, obj, idx, NULL, IO_PREFETCH, !hint);
	pthread_mutex_unlock(&s->lock);
	return ret == 1 || ret == -ENOENT ? 0 : ret;
}

/*
 * The next window for the cycle's prefetch, from the pass that ended:
 * issued and late prefetches in it, and pct, the share of its time the
 * busiest local device had a request in flight. A window of a few blocks
 * hides a device's latency; it cannot hide a burst of misses behind the
 * application's compute. With the state twice the DRAM tier and 0.14 s of
 * compute per subgroup (swapbench --compute-gbps 2), 8 blocks were 78%
 * late and the device idled over half of each iteration; at 64-128 blocks
 * under 10% were late and an iteration took 3-4% less, though fewer
 * blocks stay (each slot ahead is one the cycle does not keep: 0.62 of
 * the raw folder's bytes moved against 0.53). With no compute the device
 * is the bound, and deeper windows only moved more bytes. So the window
 * doubles while passes are late and the device idles, and halves back
 * while the device is busy. A growth after which the pass took longer is
 * undone, and the window holds for PF_HOLD_PASSES (tb_pf_grow_undone):
 * the device's idle share says what could overlap, not what a smaller
 * kept set costs.
 */
uint64_t tb_pf_depth_next(uint64_t depth, uint64_t min, uint64_t max, uint64_t issued,
			  uint64_t late, unsigned pct)
{
	if (issued >= PF_PASS_MIN && late * PF_LATE_SHARE >= issued && pct < PF_IDLE_PCT)
		return depth * 2 < max ? depth * 2 : max;
	if (pct >= PF_BUSY_PCT)
		return depth / 2 > min ? depth / 2 : min;
	return depth;
}

/*
 * Whether the pass after a growth undoes it: it took PF_WORSE_PCT of the
 * pass before or more, and its late share did not fall to PF_BETTER_PCT
 * of that pass's; or it took PF_WORSE_GROSS_PCT or more. Late shares are
 * in %. A pass that is mostly the application's compute varies by a few
 * percent on its own: undone on time alone, mount-volume's window went
 * 4 to 64 and back to 32 in a CI run under ASan, its last passes 18% late.
 */
bool tb_pf_grow_undone(uint64_t before_ns, unsigned before_late, uint64_t took_ns, unsigned late)
{
	if (took_ns * 100 >= before_ns * PF_WORSE_GROSS_PCT)
		return true;
	return took_ns * 100 >= before_ns * PF_WORSE_PCT && late * 100 >= before_late * PF_BETTER_PCT;
}

void tb_cycle_pass(struct tb_store *s)
{
	uint64_t now = dev_now_ns(), active[TB_MAX_DEVS], busiest = 0;
	unsigned n = s->n_devs;

	for (unsigned i = 0; i < n; i++) {
		struct tb_dev *d = s->dev[i];

		pthread_mutex_lock(&d->lock);
		dev_load_tick(d, now);
		active[i] = d->active_ns;
		pthread_mutex_unlock(&d->lock);
	}
	pthread_mutex_lock(&s->lock);
	if (s->pass_ns && now > s->pass_ns) {
		uint64_t took = now - s->pass_ns, depth = s->pf_depth;
		uint64_t issued = s->pf_issued - s->pass_issued, late = s->pf_late - s->pass_late;
		unsigned late_pct = issued ? (unsigned)(late * 100 / issued) : 0;

		for (unsigned i = 0; i < n; i++) {
			uint64_t a = active[i] - s->pass_active_ns[i];

			if (strcmp(s->dev[i]->kind, "s3") != 0 && a > busiest)
				busiest = a; /* s3's pool has its own deep window */
		}
		if (s->pass_before_grow_ns &&
		    tb_pf_grow_undone(s->pass_before_grow_ns, s->pass_before_grow_late, took,
				      late_pct)) {
			depth = depth / 2 > s->pf_depth_min ? depth / 2 : s->pf_depth_min;
			s->pf_hold = PF_HOLD_PASSES;
		} else {
			depth = tb_pf_depth_next(depth, s->pf_depth_min,
						 s->pf_hold ? depth : s->pf_depth_max, issued, late,
						 (unsigned)(busiest * 100 / took));
			if (s->pf_hold)
				s->pf_hold--;
		}
		s->pass_before_grow_ns = depth > s->pf_depth ? took : 0;
		s->pass_before_grow_late = late_pct;
		s->pf_depth = depth;
	}
	s->pass_ns = now;
	memcpy(s->pass_active_ns, active, n * sizeof(active[0]));
	s->pass_issued = s->pf_issued;
	s->pass_late = s->pf_late;
	pthread_mutex_unlock(&s->lock);
}

int tb_prefetch(struct tb_store *s, uint64_t obj, uint64_t idx, bool hint)
{
	return prefetch(s, obj, idx, hint, 0);
}

int tb_prefetch_deep(struct tb_store *s, uint64_t obj, uint64_t idx, unsigned depth)
{
	return prefetch(s, obj, idx, false, depth ? depth : 1);
}

unsigned tb_ahead(struct tb_store *s, uint64_t obj, uint64_t idx, unsigned *run)
{
	uint64_t loc;
	size_t len;
	struct tb_dev *d;

	*run = 1;
	if (resolve(s, obj, idx, &loc, &len) != 0)
		return 0;
	d = s->dev[tb_loc_dev(loc)];
	*run = d->run;
	return dev_ra_blocks(d);
}

/* ---- the write side ---- */

static void wait_dirty_budget(struct tb_store *s)
{
	bool counted = false;

	while (s->ndirty >= s->dirty_max && !s->stopping) {
		if (!counted)
			s->bp_waits++;
		counted = true;
		flusher_kick(s);
		pthread_cond_wait(&s->space_cv, &s->lock);
	}
}

/*
 * One block of space for an entry becoming dirty: from the request's
 * reservation (already counted in s->reserved) or new. Returns 1 or 0 for
 * which, for give_space, or -ENOSPC.
 */
static int take_space(struct tb_store *s, uint64_t *resv)
{
	if (resv && *resv) {
		(*resv)--;
		return 1;
	}
	return reserve_blocks(s, 1);
}

static void give_space(struct tb_store *s, uint64_t *resv, int from_resv)
{
	if (from_resv)
		(*resv)++;
	else
		s->reserved--;
}

/*
 * A new DIRTY entry for a write of sectors of block (obj, idx). For part
 * of the block: a zeroed whole block if it is a hole, else partial over
 * its persisted copy. For the whole block, the resolve only tells whether
 * it is stored (tb_unstored). Lock held; dropped around the owner's
 * resolve, during which the entry is a placeholder.
 */
static int start_write(struct tb_store *s, struct tb_entry *e, uint64_t obj, uint64_t idx,
		       bool whole, bool blind, uint64_t *resv)
{
	uint64_t loc;
	size_t len;
	int ret, from_resv;

	from_resv = take_space(s, resv);
	if (from_resv < 0) {
		entry_free(s, e);
		return from_resv;
	}
	set_state(s, e, ES_LOADING);
	e->placeholder = true;
	ret = entry_insert(s, e, obj, idx);
	if (ret < 0) {
		give_space(s, resv, from_resv);
		entry_free(s, e);
		return ret;
	}
	pthread_mutex_unlock(&s->lock);
	ret = resolve(s, obj, idx, &loc, &len);
	if (ret == -ENOENT && !whole)
		memset(slot_data(s, e), 0, s->bs);
	pthread_mutex_lock(&s->lock);
	e->placeholder = false;
	if (ret && ret != -ENOENT) {
		give_space(s, resv, from_resv);
		entry_unhash(s, e);
		entry_free(s, e);
		pthread_cond_broadcast(&s->state_cv);
		return ret;
	}
	if (ret == 0 && !whole) {
		e->partial = true;
		e->base_loc = loc;
		e->base_len = len;
		e->nwritten = 0;
		memset(e->written, 0, s->sector_words * sizeof(uint64_t));
		s->partial_created++;
	}
	e->stored = ret == 0; /* not dirty yet: make_dirty counts it */
	make_dirty(s, e, blind);
	pthread_cond_broadcast(&s->state_cv);
	return 0;
}

int tb_reserve(struct tb_store *s, uint64_t n)
{
	int ret;

	pthread_mutex_lock(&s->lock);
	ret = reserve_blocks(s, n);
	pthread_mutex_unlock(&s->lock);
	return ret;
}

void tb_unreserve(struct tb_store *s, uint64_t n)
{
	pthread_mutex_lock(&s->lock);
	s->reserved -= n;
	pthread_cond_broadcast(&s->space_cv);
	pthread_mutex_unlock(&s->lock);
}

int tb_get_write(struct tb_store *s, uint64_t obj, uint64_t idx, size_t off, size_t len,
		 bool blind, struct tb_ref *ref, uint64_t *resv)
{
	bool whole = off == 0 && len == s->bs;
	struct tb_entry *e, *found;
	int ret;

	pthread_mutex_lock(&s->lock);
	for (;;) {
		e = hash_find(s, obj, idx);
		if (e && (e->state == ES_LOADING || e->state == ES_WB || e->merging)) {
			pthread_cond_wait(&s->state_cv, &s->lock);
			continue;
		}
		if (e && e->state == ES_DIRTY && e->partial && !sector_aligned(s, off, len)) {
			ret = merge_partial(s, e);
			if (ret)
				goto out_unlock;
			continue;
		}
		if (e && e->state == ES_DIRTY)
			break;
		if (e) { /* CLEAN: becomes dirty */
			wait_dirty_budget(s);
			if (hash_find(s, obj, idx) != e || e->state != ES_CLEAN)
				continue;
			ret = take_space(s, resv);
			if (ret < 0)
				goto out_unlock;
			if (hash_find(s, obj, idx) != e || e->state != ES_CLEAN) {
				give_space(s, resv, ret);
				continue;
			}
			make_dirty(s, e, false);
			ret = 0;
			break;
		}
		wait_dirty_budget(s);
		e = entry_alloc_wait(s, obj, idx, &found, WAIT_READY);
		if (!e)
			continue;
		if (sector_aligned(s, off, len)) {
			/* An uncached block: no read; for part of it, remember which sectors. */
			ret = start_write(s, e, obj, idx, whole, blind, resv);
			if (ret < 0)
				goto out_unlock;
			continue; /* the entry is DIRTY now: found above */
		}
		if (!whole) {
			/* Unaligned part of an uncached block: load it if persisted. */
			s->misses++;
			ret = start_load(s, e, obj, idx, NULL, IO_DEMAND, false);
			if (ret == 1)
				continue; /* wait for it in the loop above */
			if (ret != -ENOENT)
				goto out_unlock;
			e = entry_alloc_wait(s, obj, idx, &found, WAIT_READY);
			if (!e)
				continue;
			memset(slot_data(s, e), 0, s->bs);
		}
		ret = take_space(s, resv);
		if (ret < 0) {
			entry_free(s, e);
			goto out_unlock;
		}
		if (hash_find(s, obj, idx)) { /* lost a race while waiting for space */
			give_space(s, resv, ret);
			entry_free(s, e);
			continue;
		}
		int from_resv = ret;
		ret = entry_insert(s, e, obj, idx);
		if (ret < 0) {
			give_space(s, resv, from_resv);
			entry_free(s, e);
			goto out_unlock;
		}
		make_dirty(s, e, false);
		break;
	}
	e->pins++;
	e->wpins++;
	e->ref_bit = true;
	e->last_use = ++s->ticks;
	e->o->last_idx = idx;
	pthread_mutex_unlock(&s->lock);
	ref->e = e;
	ref->data = slot_data(s, e);
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
		flusher_kick(s); /* take_stream */
	}
	if (--e->pins == 0 && e->dead)
		entry_free(s, e);
	kick_cleaner(s, false);
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
 * neither write-back (may_clean) nor a merge starts under a write pin. With
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
		ref->data = slot_data(s, e);
		s->swapped_write_bytes += s->bs;
	}
	pthread_mutex_unlock(&s->lock);
	return ok;
}

/* ---- flusher ---- */

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
 * Whether a dirty block the cache wants clean may go now: a partly written
 * one waits flush_delay_ms for the rest of its bytes first.
 */
static bool may_clean(struct tb_store *s, struct tb_entry *e, uint64_t now, uint64_t *next_ms)
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
 * file's last block past the end of the file, is not written (io_len).
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
 * Place a new block: smooth weighted round-robin over the devices, each
 * weighted by what it can do (its cap, else the bandwidth it showed when
 * driven hard: dev_weight), so that one flush drives every path in
 * proportion. Full and down devices weigh 0. A device that stores several
 * blocks per object (s3) gets its run of them in a row, so that one object
 * holds neighbours, which one ranged GET then reads back; its turn counts
 * as that many rounds, which keeps the proportions. A run goes on only
 * while its device is up, and a device tried again after being down gets
 * one block, not a run: a run begun before an outage and finished after
 * it sent a whole file's blocks to a bucket that was not there. Lock held.
 */
static int place(struct tb_store *s, uint64_t *loc)
{
	double w[TB_MAX_DEVS], total = 0;
	uint64_t slot;

	if (s->run_left && s->run_dev < s->n_devs && dev_up(s->dev[s->run_dev])) {
		s->run_left--;
		if (dev_alloc(s->dev[s->run_dev], &slot) == 0) {
			*loc = tb_loc(s->run_dev, slot);
			return 0;
		}
		s->run_left = 0;
	}
	for (unsigned i = 0; i < s->n_devs; i++) {
		w[i] = dev_weight(s->dev[i]);
		total += w[i];
	}
	while (total > 0) {
		unsigned run;
		int best = -1;

		for (unsigned i = 0; i < s->n_devs; i++) {
			if (w[i] <= 0)
				continue;
			if (best < 0 || s->credit[i] + w[i] > s->credit[best] + w[best])
				best = (int)i;
		}
		run = s->dev[best]->run && dev_up(s->dev[best]) ? s->dev[best]->run : 1;
		for (unsigned i = 0; i < s->n_devs; i++)
			if (w[i] > 0)
				s->credit[i] += w[i] * run;
		s->credit[best] -= total * run;
		if (dev_alloc(s->dev[best], &slot) == 0) {
			*loc = tb_loc((unsigned)best, slot);
			s->run_dev = (unsigned)best;
			s->run_left = run - 1;
			return 0;
		}
		total -= w[best];
		w[best] = 0;
	}
	return no_space_err(s);
}

/* Put a WB entry back to DIRTY after a failure. Lock held. */
static void wb_failed(struct tb_store *s, struct tb_entry *e, int err)
{
	e->retries++;
	e->err = err;
	s->wb_errors++;
	if (e->retries >= WB_MAX_RETRIES && e->o)
		e->o->wb_err = err;
	if (log_ratelimit(&s->wb_log_sec, 10))
		log_err("write-back of block %llu of object %llu failed: %s (attempt %u)",
			(unsigned long long)e->idx, (unsigned long long)e->obj, strerror(-err),
			e->retries);
	set_state(s, e, ES_DIRTY);
	/*
	 * Retried as soon as its backoff has passed, whoever sent it: fsync
	 * waits on it, or the cache wanted its slot.
	 */
	e->urgent = true;
	s->due_scan = true;
	e->dirty_ms = now_ms() + (s->stopping ? STOP_RETRY_GAP_MS
					      : WB_RETRY_BASE_MS << (e->retries < 8 ? e->retries : 8));
	elist_prepend(&s->dirty_list, e); /* where take_due finds it: see make_urgent */
	s->wb_inflight--;
	pthread_cond_broadcast(&s->state_cv);
}

static void start_wb(struct tb_store *s, struct tb_entry *e)
{
	elist_remove(&s->dirty_list, e);
	set_state(s, e, ES_WB);
	e->urgent = false;
	s->wb_inflight++;
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
	struct tb_entry *e = s->dirty_list.head;
	bool full = s->due_scan || s->stopping, again = false;
	size_t n = 0, scanned = 0;

	while (e && n < max && s->wb_inflight < s->wb_max && scanned++ < FLUSH_SCAN_MAX) {
		struct tb_entry *next = e->lnext;
		uint64_t at = UINT64_MAX;

		if (due(s, e, now, &at)) {
			start_wb(s, e);
			out[n++] = e;
		} else {
			if (at < *next_ms)
				*next_ms = at;
			if (e->urgent || e->retries)
				again = true;
			else if (!full)
				break; /* younger than the age limit, and so is the rest */
		}
		e = next;
	}
	if (full && !e && !again)
		s->due_scan = false;
	return n;
}

/* Entries of o in eviction order: behind its reader by block, highest first. */
static int evict_order_cmp(const void *a, const void *b)
{
	const struct tb_entry *x = *(struct tb_entry *const *)a, *y = *(struct tb_entry *const *)b;

	return x->idx > y->idx ? -1 : x->idx < y->idx;
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
 * devices moved above the cycle's misses.
 */
static size_t take_victims_cycle(struct tb_store *s, struct tb_entry **out, size_t max,
				 uint64_t now, uint64_t *next_ms)
{
	int64_t want, over;
	size_t n = 0, nr = 0;

	update_keep(s);
	if (s->keep_den && now >= s->convert_ms) {
		/*
		 * Dirty blocks of the cycle that do not stay (what stayed before
		 * the cycle was known, or before it grew): eviction takes them
		 * next, so they go now, but not the block a writer is at or
		 * those past it, nor a partly written one. Blocks streaming
		 * through are take_stream's.
		 */
		nr = rank_objects(s, true);
		for (size_t i = 0; i < nr && n < max && s->wb_inflight < s->wb_max; i++) {
			if (s->rank[i].u.dist == UINT64_MAX || s->rank[i].u.dist == 0)
				continue; /* not in the cycle, or due now */
			for (struct tb_entry *e = s->rank[i].o->head;
			     e && n < max && s->wb_inflight < s->wb_max; e = e->onext)
				if (!kept(s, e) && !e->partial && may_clean(s, e, now, next_ms) &&
				    !(s->rank[i].u.now && e->idx >= e->o->last_idx)) {
					start_wb(s, e);
					out[n++] = e;
				}
		}
		s->convert_ms = n ? now : now + CONVERT_MS;
	}
	want = (int64_t)s->clean_high - (int64_t)s->free_list.n - (int64_t)s->nclean -
	       (int64_t)s->wb_inflight;
	over = dirty_over(s, s->clean_low);
	if (over > want)
		want = over;
	if (want <= 0)
		return n;
	if (!nr)
		nr = rank_objects(s, true);
	for (size_t i = 0; i < nr && want > 0 && n < max; i++) {
		struct tb_obj *o = s->rank[i].o;
		size_t k = 0, behind;

		for (struct tb_entry *e = o->head; e; e = e->onext)
			if (!ahead_of_reader(e, &s->rank[i].u))
				s->scratch[k++] = e;
		behind = k;
		for (struct tb_entry *e = o->head; e; e = e->onext)
			if (ahead_of_reader(e, &s->rank[i].u))
				s->scratch[k++] = e;
		qsort(s->scratch, behind, sizeof(*s->scratch), evict_order_cmp);
		qsort(s->scratch + behind, k - behind, sizeof(*s->scratch), evict_order_cmp);
		for (size_t j = 0; j < k && want > 0 && n < max; j++) {
			struct tb_entry *e = s->scratch[j];

			if (s->keep_den && kept(s, e) && (over <= 0 || s->n_stream_wb))
				continue; /* see above */
			if (may_clean(s, e, now, next_ms) && s->wb_inflight < s->wb_max) {
				start_wb(s, e);
				out[n++] = e;
				want--;
			}
		}
	}
	return n;
}

/*
 * Without a cycle: the oldest dirty blocks first, and those of 2q's
 * re-referenced set only when the others do not make up the reserve;
 * from dirty_below on.
 */
static size_t take_victims_lru(struct tb_store *s, struct tb_entry **out, size_t max, uint64_t now,
			       uint64_t *next_ms)
{
	int64_t want = (int64_t)s->clean_high - (int64_t)s->free_list.n - (int64_t)s->nclean -
		       (int64_t)s->wb_inflight,
		over = dirty_over(s, dirty_below(s));
	size_t n = 0;

	if (over > want)
		want = over;

	for (int hot = 0; hot < 2 && want > 0; hot++) {
		struct tb_entry *e = s->dirty_list.head;
		size_t scanned = 0;

		while (e && want > 0 && n < max && s->wb_inflight < s->wb_max &&
		       scanned++ < FLUSH_SCAN_MAX) {
			struct tb_entry *next = e->lnext;

			if (e->hot == hot && !obj_protected(s, e->o) && may_clean(s, e, now, next_ms)) {
				start_wb(s, e);
				out[n++] = e;
				want--;
			}
			e = next;
		}
	}
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
 * 0.81 s an iteration against 0.90 (docs/benchmarks.md). Only the newest
 * dirty blocks are looked at. Lock held.
 */
static size_t take_stream(struct tb_store *s, struct tb_entry **out, size_t max, uint64_t now,
			  uint64_t *next_ms)
{
	size_t n = 0, seen = 0;

	for (struct tb_entry *e = s->dirty_list.tail, *prev; e && n < max && seen < STREAM_SCAN;
	     e = prev, seen++) {
		prev = e->lprev;
		if (s->wb_inflight >= s->wb_max)
			break;
		if (e->stream && e->fill >= s->bs && !e->partial && !obj_protected(s, e->o) &&
		    may_clean(s, e, now, next_ms)) {
			start_wb(s, e);
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
	if (cycle_period(s)) {
		n += take_stream(s, out + n, max - n, now, next_ms);
		if (n == max || s->wb_inflight >= s->wb_max)
			return n;
		return n + take_victims_cycle(s, out + n, max - n, now, next_ms);
	}
	return n + take_victims_lru(s, out + n, max - n, now, next_ms);
}

void tb_hash(const void *data, size_t len, uint8_t out[TB_HASH_LEN])
{
	XXH128_hash_t h = XXH3_128bits(data, len);

	memcpy(out, &h.low64, 8);
	memcpy(out + 8, &h.high64, 8);
}

/*
 * Hash the block; if a stored block has the same hash (and, in verify mode,
 * the same bytes as read back from its device), the entry is committed as
 * a reference to it. No lock held; the entry is in WB.
 */
static bool dedup_match(struct tb_store *s, struct tb_entry *e)
{
	uint64_t id, loc;
	size_t len;
	char *bounce = NULL;
	bool same;

	if (s->cfg.test_collide) {
		uint64_t one = 1; /* every block collides: verify must hold */

		memcpy(e->hash, &one, 8);
		memcpy(e->hash + 8, &one, 8);
	} else {
		tb_hash(slot_data(s, e), s->bs, e->hash);
	}
	e->hashed = true;
	if (s->owner.dedup_find(s->owner.ctx, e->hash, &id, &loc, &len) != 0)
		return false;
	if (s->cfg.dedup == TB_DEDUP_VERIFY) {
		struct tb_entry *c;

		/* The stored copy's bytes, from DRAM when a clean copy is cached. */
		pthread_mutex_lock(&s->lock);
		c = lochash_find(s, loc, e);
		if (c) {
			c->pins++;
			s->dedup_verify_cached++;
		}
		pthread_mutex_unlock(&s->lock);
		if (c) {
			same = memcmp(slot_data(s, c), slot_data(s, e), s->bs) == 0;
			unpin(s, c);
		} else {
			/* Its stored bytes, and zeros past them. */
			if (!stored_ok(s, loc, len) ||
			    posix_memalign((void **)&bounce, IO_ALIGN, io_len(len)))
				return false;
			same = read_sync(s, loc, len, bounce) == 0 &&
			       memcmp(bounce, slot_data(s, e), io_len(len)) == 0 &&
			       e->new_len <= len; /* stored_len, set by start_writes */
			free(bounce);
		}
		if (!same) {
			pthread_mutex_lock(&s->lock);
			s->dedup_mismatch++;
			pthread_mutex_unlock(&s->lock);
			/* Not the same bytes: store it, outside the index. */
			e->hashed = false;
			return false;
		}
	}
	e->share_id = id;
	e->new_loc = loc;
	return true;
}

/* Outside the lock: holes go straight to commit, the rest to a device. */
static void start_writes(struct tb_store *s, struct tb_entry **batch, size_t n,
			 struct tb_entry **holes, size_t *nholes)
{
	for (size_t i = 0; i < n; i++) {
		struct tb_entry *e = batch[i];
		uint64_t loc;

		if (e->partial) {
			int ret = merge_io(s, e);

			pthread_mutex_lock(&s->lock);
			if (ret < 0) {
				wb_failed(s, e, ret);
				pthread_mutex_unlock(&s->lock);
				continue;
			}
			e->partial = false;
			s->partial_merged += (uint64_t)ret;
			pthread_cond_broadcast(&s->state_cv);
			pthread_mutex_unlock(&s->lock);
		}
		e->share_id = 0;
		e->hashed = false;
		e->new_len = stored_len(slot_data(s, e), s->bs);
		if (!e->new_len) {
			e->new_loc = TB_LOC_NONE;
			holes[(*nholes)++] = e;
			continue;
		}
		if (s->cfg.dedup != TB_DEDUP_OFF && !e->no_share && dedup_match(s, e)) {
			holes[(*nholes)++] = e; /* no I/O: committed as a shared block */
			continue;
		}
		pthread_mutex_lock(&s->lock);
		int ret = place(s, &loc);
		if (ret < 0) {
			wb_failed(s, e, ret);
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
		e->req.buf = slot_data(s, e);
		e->req.len = io_len(e->new_len);
		e->req.done = write_done;
		dev_submit(s->dev[tb_loc_dev(loc)], &e->req);
	}
}

/* Commit finished write-backs in one owner transaction, then settle them. */
static void commit_batch(struct tb_store *s, struct tb_entry **v, size_t n)
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
			set_state(s, e, ES_DIRTY);
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
			wb_failed(s, e, ret);
			continue;
		}
		if (e->share_id)
			s->dedup_hits++;
		set_stored(e, e->new_loc != TB_LOC_NONE); /* a shared block's too */
		if (e->new_loc == TB_LOC_NONE)
			s->holes++;
		else if (!e->share_id)
			s->wb_bytes += io_len(e->new_len);
		e->share_id = 0;
		e->no_share = false;
		e->loc = e->new_loc;
		e->written_back = true;
		set_state(s, e, ES_CLEAN);
		e->retries = 0;
		e->err = 0;
		e->reserved = false;
		s->reserved--;
		s->ndirty--;
		s->wb_inflight--;
	}
	if (ret == 0)
		s->commits_since_sync += n;
	pthread_cond_broadcast(&s->state_cv);
	pthread_cond_broadcast(&s->space_cv);
	pthread_mutex_unlock(&s->lock);
}

/* Device flush, owner sync, then hand released locations back. */
static int do_sync(struct tb_store *s)
{
	uint64_t *frees;
	size_t nfrees;
	int ret = 0;

	pthread_mutex_lock(&s->sync_lock);
	pthread_mutex_lock(&s->lock);
	frees = s->pending;
	nfrees = s->npending;
	s->pending = NULL;
	s->npending = s->cap_pending = 0;
	s->commits_since_sync = 0;
	pthread_mutex_unlock(&s->lock);

	for (unsigned i = 0; i < s->n_devs; i++) {
		int r = dev_sync(s->dev[i]);

		if (r < 0 && !ret)
			ret = r;
	}
	if (!ret)
		ret = s->owner.sync(s->owner.ctx);

	pthread_mutex_lock(&s->lock);
	if (ret == 0) {
		for (size_t i = 0; i < nfrees; i++)
			dev_free(s->dev[tb_loc_dev(frees[i])], tb_loc_slot(frees[i]));
		free(frees);
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
	s->syncs++;
	s->sync_gen++;
	pthread_cond_broadcast(&s->space_cv);
	pthread_mutex_unlock(&s->lock);
	pthread_mutex_unlock(&s->sync_lock);
	return ret;
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

static void *flusher_main(void *arg)
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
		start_writes(s, batch, n, ready, &nready);
		failed = false;
		while (done) {
			struct tb_entry *e = done;

			done = e->lnext;
			if (e->err) {
				pthread_mutex_lock(&s->lock);
				dev_free(s->dev[tb_loc_dev(e->new_loc)], tb_loc_slot(e->new_loc));
				if (e->err == -ENOSPC)
					dev_set_full(s->dev[tb_loc_dev(e->new_loc)]);
				wb_failed(s, e, e->err);
				pthread_mutex_unlock(&s->lock);
				failed = true; /* its retry is due later: look again before sleeping */
				continue;
			}
			ready[nready++] = e;
		}
		commit_batch(s, ready, nready);

		pthread_mutex_lock(&s->lock);
		now = now_ms();
		want_sync = s->sync_req ||
			    (now - last_sync >= s->cfg.sync_interval_ms &&
			     (s->commits_since_sync || s->npending));
		if (want_sync) {
			s->sync_req = false;
			pthread_mutex_unlock(&s->lock);
			do_sync(s);
			last_sync = now_ms();
			pthread_mutex_lock(&s->lock);
			continue;
		}
		if (n || nready || failed || s->done || s->flush_kicks != kicks)
			continue; /* a kick while the lock was dropped: look again */
		/* Asleep until something is due: an idle mount costs no CPU. */
		if ((s->commits_since_sync || s->npending) &&
		    next_ms > last_sync + s->cfg.sync_interval_ms)
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

/* ---- flush, sync, drop ---- */

static bool obj_has_dirty(struct tb_obj *o, uint64_t seq, int *err)
{
	for (struct tb_entry *e = o->head; e; e = e->onext) {
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

	for (struct tb_entry *e = o->head; e; e = e->onext)
		if (e->state == ES_DIRTY && e->dirty_seq <= seq && !e->urgent) {
			make_urgent(s, e);
			marked = true;
		}
	return marked;
}

int tb_flush_obj(struct tb_store *s, uint64_t obj)
{
	struct tb_obj *o;
	uint64_t seq;
	int err = 0;

	pthread_mutex_lock(&s->lock);
	seq = s->dirty_seq;
	o = obj_find(s, obj);
	if (o)
		for (struct tb_entry *e = o->head; e; e = e->onext)
			if (e->state == ES_DIRTY && !e->urgent)
				make_urgent(s, e);
	s->due_scan = true;
	flusher_kick(s);
	while ((o = obj_find(s, obj)) && obj_has_dirty(o, seq, &err)) {
		pthread_cond_wait(&s->state_cv, &s->lock);
		/*
		 * A write-back that failed left its block DIRTY and no longer
		 * urgent: without this its retry waited for the age limit
		 * (dirty_expire_ms), and so did this fsync.
		 */
		if ((o = obj_find(s, obj)) && mark_urgent(s, o, seq))
			flusher_kick(s);
	}
	if (o && o->wb_err) {
		if (!err)
			err = o->wb_err;
		o->wb_err = 0;
		obj_maybe_free(s, o);
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
	for (struct tb_entry *e = s->dirty_list.head; e; e = e->lnext)
		e->urgent = true;
	s->due_scan = true;
	flusher_kick(s);
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
		pthread_cond_wait(&s->state_cv, &s->lock);
	}
	pthread_mutex_unlock(&s->lock);
	return err;
}

int tb_sync(struct tb_store *s)
{
	int err = flush_all(s);
	int ret = do_sync(s);

	return err ? err : ret;
}

int tb_durable(struct tb_store *s)
{
	return do_sync(s);
}

void tb_drop(struct tb_store *s, uint64_t obj, uint64_t from, uint64_t to)
{
	struct tb_obj *o;
	struct tb_entry *e, *next;
	bool busy;

	pthread_mutex_lock(&s->lock);
	do {
		busy = false;
		o = obj_find(s, obj);
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

	o = obj_find(s, obj);
	for (e = o ? o->head : NULL; e; e = next) {
		next = e->onext;
		if (e->idx < from || e->idx >= to)
			continue;
		if (e->state == ES_DIRTY) {
			elist_remove(&s->dirty_list, e);
			s->ndirty--;
			if (e->reserved)
				s->reserved--;
			e->reserved = false;
		}
		entry_unhash(s, e);
		set_state(s, e, ES_FREE);
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
		obj_maybe_free(s, o);
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
	o = obj_find(s, obj);
	if (o && o->pinned) {
		o->pinned = false;
		s->n_pinned_res -= o->n;
		obj_maybe_free(s, o);
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
	o = obj_find(s, obj);
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
	o = obj_find(s, obj);
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
	o = obj_find(s, obj);
	n = o ? o->nunstored : 0;
	pthread_mutex_unlock(&s->lock);
	return n;
}

void tb_resident_each(struct tb_store *s, uint64_t obj, tb_block_fn fn, void *arg)
{
	struct tb_obj *o;

	pthread_mutex_lock(&s->lock);
	o = obj_find(s, obj);
	for (struct tb_entry *e = o ? o->head : NULL; e; e = e->onext)
		if (e->state == ES_CLEAN || e->state == ES_DIRTY || e->state == ES_WB)
			fn(arg, e->idx);
	pthread_mutex_unlock(&s->lock);
}

void tb_release(struct tb_store *s, uint64_t loc)
{
	pthread_mutex_lock(&s->lock);
	if (s->npending == s->cap_pending) {
		size_t cap = s->cap_pending ? s->cap_pending * 2 : 64;
		uint64_t *p = realloc(s->pending, cap * sizeof(*p));

		if (!p) {
			/* Leaking one slot until the next mount beats reusing it early. */
			log_err("out of memory releasing a block; it is reclaimed at next mount");
			pthread_mutex_unlock(&s->lock);
			return;
		}
		s->pending = p;
		s->cap_pending = cap;
	}
	s->pending[s->npending++] = loc;
	/*
	 * A sync point is due: at the flusher's next interval, or now when
	 * many slots wait, so that rewrites reuse the space the slab already
	 * has instead of growing it (fresh extents of the slab file cost the
	 * filesystem an allocation, and the drive more than a rewrite).
	 */
	if (s->npending >= SYNC_FREES) {
		s->sync_req = true;
		flusher_kick(s);
	} else if (s->npending == 1) {
		flusher_kick(s);
	}
	pthread_mutex_unlock(&s->lock);
}

int tb_space_check(struct tb_store *s, uint64_t nblocks)
{
	int ret;

	pthread_mutex_lock(&s->lock);
	ret = reserve_blocks(s, nblocks);
	if (ret == 0)
		s->reserved -= nblocks;
	pthread_mutex_unlock(&s->lock);
	return ret;
}

void tb_space(struct tb_store *s, uint64_t *total, uint64_t *avail)
{
	struct tb_dev_stats st;

	*total = 0;
	for (unsigned i = 0; i < s->n_devs; i++) {
		dev_get_stats(s->dev[i], &st);
		*total += st.capacity;
	}
	pthread_mutex_lock(&s->lock);
	*avail = space_avail(s) * s->bs;
	pthread_mutex_unlock(&s->lock);
}

void tb_get_stats(struct tb_store *s, struct tb_stats *st)
{
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
	st->kept_bytes = cycle_period(s) && s->keep_den ? s->keep_num * s->bs : 0;
	st->kept_evicted_bytes = s->kept_evicted * s->bs;
	st->writeback_bytes = s->wb_bytes;
	st->holes_written = s->holes;
	st->wb_errors = s->wb_errors;
	st->syncs = s->syncs;
	st->backpressure_waits = s->bp_waits;
	st->prefetch_issued = s->pf_issued;
	st->prefetch_used = s->pf_used;
	st->prefetch_wasted = s->pf_wasted;
	st->prefetch_late = s->pf_late;
	st->prefetch_refused = s->pf_refused;
	st->prefetch_depth = s->pf_depth;
	st->unsynced_blocks = s->commits_since_sync + s->npending;
	st->expired_bytes = s->expired * s->bs;
	st->rewritten_bytes = s->wb_rewritten * s->bs;
	st->partial_created = s->partial_created;
	st->partial_merged = s->partial_merged;
	st->dedup_hits = s->dedup_hits;
	st->dedup_verify_mismatch = s->dedup_mismatch;
	st->dedup_verify_cached = s->dedup_verify_cached;
	st->pinned_bytes = s->n_pinned_res * s->bs;
	st->pin_limit_bytes = s->pin_limit * s->bs;
	st->hot_bytes = (uint64_t)s->n_hot * s->bs;
	st->ghost_hits = s->ghost_hits;
	st->huge_pages = s->arena.huge;
	st->thp_bytes = s->arena.thp_bytes;
	st->locked = s->arena.locked;
	pthread_mutex_unlock(&s->lock);
	st->n_devs = s->n_devs;
	for (unsigned i = 0; i < s->n_devs; i++)
		dev_get_stats(s->dev[i], &st->dev[i]);
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
	s->rank = calloc(RANK_MAX, sizeof(*s->rank));
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
	    !s->ghost_head || !s->rank || !s->scratch) {
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
	s->wb_max = (uint64_t)s->n_devs * cfg->queue_depth;
	set_reserve(s, cfg);
	/*
	 * Blocks loaded ahead of their reader take slots from what the cycle
	 * keeps resident: enough to hide the devices' latency, no more.
	 */
	s->pf_depth = s->nslots / PREFETCH_DEPTH_SHARE > PREFETCH_DEPTH_MIN
			      ? s->nslots / PREFETCH_DEPTH_SHARE
			      : PREFETCH_DEPTH_MIN;
	s->pf_depth_min = s->pf_depth;
	s->pf_depth_max = s->nslots / PF_GROW_SHARE > s->pf_depth ? s->nslots / PF_GROW_SHARE
								   : s->pf_depth;
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

int tb_mark_used(struct tb_store *s, uint64_t loc)
{
	if (tb_loc_dev(loc) >= s->n_devs)
		return -ENODEV;
	return dev_mark(s->dev[tb_loc_dev(loc)], tb_loc_slot(loc));
}

int tb_start(struct tb_store *s)
{
	int ret;

	for (unsigned i = 0; i < s->n_devs; i++) {
		ret = dev_start(s->dev[i]);
		if (ret < 0)
			return ret;
	}
	ret = pthread_create(&s->flusher, NULL, flusher_main, s);
	if (ret)
		return -ret;
	s->started = true;
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
		pthread_cond_broadcast(&s->flush_cv);
		pthread_cond_broadcast(&s->space_cv);
		pthread_mutex_unlock(&s->lock);
		pthread_join(s->flusher, NULL);
		int r = do_sync(s);
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
/* ---- end of the shared arena ---- */

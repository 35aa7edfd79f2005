/*
 * cache_int.h - what the block cache's files share, and nothing outside
 * tiers/ includes: the entry, object and store structures, and the calls
 * that cross from one of its files to another.
 *
 * The files are layered; each calls only the layers below it (the
 * declarations below are grouped by file):
 *   requests   cache.c (reads, writes, dead blocks, pins), store.c (open,
 *              start, close, stats)
 *   policy     prefetch.c what loads ahead; flusher.c what is written back
 *              and when; evict.c what leaves DRAM (flusher.c calls it)
 *   mechanism  flush.c write-back, commits, sync; place.c placement and
 *              space; load.c loads and merges; verify.c the checks of what
 *              is read; giveback.c space given back (flush.c calls the
 *              other four, load.c calls verify.c)
 *   shared     entry.c entries, states, pins (it calls marks.c and
 *              ghost.c); marks.c the dirty marks and waking the flusher;
 *              ghost.c 2q's sets; fair.c the dirty budget's share
 * Devices complete I/O through tb_io's done callback (load.c read_done,
 * flush.c write_done), on their own threads; that is the one way back up.
 *
 * Lock order: store lock, then a device lock. The store lock is never held
 * while calling the owner.
 */
#ifndef TFS_CACHE_INT_H
#define TFS_CACHE_INT_H

#include "tb.h"
#include "dev.h"
#include "dram.h"

#include <pthread.h>
#include <sys/queue.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#define STOP_RETRY_GAP_MS 1000 /* after the stop, failed write-backs are retried this often */
#define FLUSH_SCAN_MAX 4096 /* dirty blocks the flusher walks from the oldest, at most */
#define SECTOR TB_LEN_UNIT /* granularity of a partial block's written map and stored lengths */
#define IO_ALIGN 4096	 /* O_DIRECT alignment of a merge's bounce buffer */
#define SUM_LOG_RING 16	 /* damaged blocks remembered, so that each is logged once a while */
#define VERIFY_THREADS_MAX 8 /* threads that check loaded blocks: one per CPU, at most this */
#define FAIR_USERS 64	 /* users with a slot of their own in the dirty budget's share (fair.c) */

enum entry_state { ES_FREE, ES_LOADING, ES_CLEAN, ES_DIRTY, ES_WB };

/* What a taker of a slot may wait for rather than evict a block that stays (victim_cycle). */
enum wait_stream { WAIT_NONE, WAIT_WB, WAIT_READY };

struct tb_obj;
struct rank; /* evict.c */

struct tb_entry {
	uint64_t obj, idx;
	uint32_t slot;
	enum entry_state state;
	bool in_hash, dead, ref_bit, reserved, urgent;
	bool prefetched; /* loaded ahead of use and not yet read */
	bool hinted;	 /* loaded for a hint (tb_prefetch's hint) and not yet read */
	bool deep;	 /* prefetched for a reader of remote blocks: counted in n_pf_deep */
	bool pf_load;	 /* LOADING in the prefetch class: counted in prefetch_inflight */
	bool pf_promoted; /* and its read moved to the demand class (promote) */
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
	bool base_hashed;  /* and its hash, to check it against */
	uint8_t base_hash[TB_HASH_LEN];
	uint64_t share_id; /* WB: commit as a reference to this stored block */
	bool no_share;	   /* the last commit of it as a shared block was stale: store it */
	/*
	 * The block's hash: LOADING, of the stored copy, to check the read
	 * against; WB, of the bytes written back, and index says whether dedup
	 * may share it.
	 */
	bool hashed, index;
	uint8_t hash[TB_HASH_LEN];
	int pins, wpins;
	int err;	   /* last write-back error */
	unsigned retries;  /* failed write-backs in a row */
	uint64_t loc;	   /* persisted location while CLEAN */
	uint64_t new_loc;  /* location being written while WB */
	size_t new_len;	   /* and the bytes written there (stored_len) */
	uint64_t dirty_seq;
	uint16_t fair_slot; /* DIRTY or WB: its writer's user in s->users (fair.c) */
	uint64_t dirty_ms; /* when it became dirty, or earliest retry */
	size_t fill;	   /* bytes written since it became dirty */
	struct tb_waiter *waiters;
	struct tb_entry *hnext;
	struct tb_entry *lhnext; /* chain of the location hash, while CLEAN */
	bool in_lochash;
	LIST_ENTRY(tb_entry) olink; /* the object's list */
	TAILQ_ENTRY(tb_entry) link; /* free or dirty list */
	struct tb_entry *done_next; /* written back, for the flusher (s->done) */
	struct tb_obj *o;
	struct tb_store *s;
	struct tb_io req;
};

struct tb_obj {
	uint64_t obj;
	LIST_HEAD(, tb_entry) entries; /* its cached blocks */
	unsigned n;
	unsigned nclean;   /* CLEAN entries in its list */
	uint64_t nunstored; /* DIRTY or WB entries in its list that are not stored */
	uint64_t last_idx; /* block of its latest pin: a reader's position */
	uint64_t tail;	   /* its last block + 1 if the object fills it in part (the cycle says), or 0 */
	LIST_ENTRY(tb_obj) link; /* the store's list of objects */
	int wb_err; /* reported once by the next tb_flush_obj */
	bool pinned; /* its blocks stay resident (tb_pin_obj) */
	struct tb_obj *hnext;
};

/* A user's part of the dirty budget (fair.c): in use while either count is not 0. */
struct tb_user {
	uint32_t uid;
	unsigned waiting; /* writers waiting for room */
	uint64_t dirty;	  /* DIRTY and WB blocks it made dirty */
};

/* A list of entries that knows its length: the free and dirty lists. */
struct elist {
	TAILQ_HEAD(elist_q, tb_entry) q;
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
	pthread_cond_t flush_cv; /* work for the flusher (flush_kick) */
	uint64_t flush_kicks;	 /* flush_kick calls: one during the flusher's turn counts */
	struct tb_entry *entries;
	uint32_t nslots;
	struct tb_entry **hash;
	uint64_t hash_mask;
	struct tb_entry **lochash; /* CLEAN entries by persisted location, for dedup's verify */
	struct tb_obj **ohash;
	uint64_t ohash_mask;
	LIST_HEAD(, tb_obj) objs; /* every object, for the cycle's eviction order */
	uint64_t nobjs;
	struct rank *rank;     /* the cycle's eviction order (rank_objects) */
	size_t rank_n, rank_cap;
	size_t rank_pos[3]; /* where each mode of victim_ranked found its last victim */
	uint64_t rank_ns, rank_ttl_ns; /* when it was made, and how long it serves */
	struct tb_entry **scratch; /* nslots, scratch of the flusher's victim choice */
	struct elist free_list, dirty_list;
	struct tb_entry *done; /* finished write I/O, for the flusher */
	uint32_t clock_hand;
	uint64_t ndirty;       /* DIRTY + WB */
	struct tb_user users[FAIR_USERS + 1]; /* the last is shared by any more (fair.c) */
	unsigned fair_n;		      /* slots in use */
	/*
	 * Blocks streaming through on their way out: DIRTY, whole and with no
	 * writer (take_stream's next), and in WB.
	 */
	uint64_t n_stream_ready, n_stream_wb;
	uint64_t nclean;       /* CLEAN, pinned or not */
	uint64_t nclean_pinned; /* of those, pinned: no victims until let go */
	uint64_t slot_waiters; /* readers and writers waiting for a slot (entry_alloc_wait) */
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
	unsigned wb_batch; /* background write-back goes in multiples of this: an s3 object */
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
	uint64_t meta_commits; /* the owner's commits since the last sync point (atomic) */
	uint64_t meta_window;  /* owner's commits that bring a sync point (atomic; flush.c) */
	bool meta_grew;	       /* the owner's store grew past its bound since the last one */
	bool syncing;	       /* flush_do_sync is under way */
	uint64_t give_back_ms; /* when giveback.c next looks for space to give back; 0: none */
	pthread_cond_t give_back_cv; /* wakes the give-back thread */
	pthread_t giveback;
	bool giveback_started;
	bool give_back_stop; /* the store stops: a look ends early (atomic) */
	unsigned urgent_waiters;
	pthread_t flusher;

	pthread_mutex_t sync_lock; /* one sync at a time */

	/* statistics, under lock */
	struct tb_counts n; /* tb_stats' n */
	uint64_t prefetch_inflight, prefetch_max;
	uint64_t n_pf; /* blocks loaded ahead and not yet read */
	struct tb_pf_window pf_win; /* their bound, pf_win.depth, tuned by tb_cycle_pass */
	/* At the last pass's end: the time, devices' time active, and prefetch counts. */
	uint64_t pass_ns, pass_active_ns[TB_MAX_DEVS], pass_issued, pass_late;
	/* The same for readers of remote blocks (tb_prefetch_deep). */
	uint64_t n_pf_deep, pf_deep_max;
	uint64_t *sector_bits; /* one bitmap per slot */
	size_t sector_words;
	uint32_t nsectors;
	uint64_t sum_verified, sum_unverified, sum_errors; /* reads checked (tb_stats' checksum_) */
	uint64_t sum_dev_errors[TB_MAX_DEVS];
	struct {
		uint64_t loc, ms;
	} sum_logged[SUM_LOG_RING]; /* damaged blocks logged lately (sum_log_first) */
	/* verify.c: loads waiting for their check (chained by req.next), and the verifiers */
	pthread_mutex_t verify_lock; /* guards verify_head, verify_tail and verify_stopping */
	pthread_cond_t verify_cv;
	struct tb_io *verify_head, *verify_tail;
	bool verify_started, verify_stopping;
	pthread_t verifier[VERIFY_THREADS_MAX];
	unsigned nverifiers;
	uint64_t ticks; /* counts pins, for lru */
	/* 2q: blocks evicted from A1in, remembered by key in a ring */
	uint64_t *ghost;
	uint32_t *ghost_head, *ghost_next; /* chains of ring positions + 1 */
	uint32_t nghost, ghost_pos, ghost_mask;
	uint32_t n_hot;
	uint64_t n_pinned_res, pin_limit; /* resident blocks of pinned objects */
	uint32_t *spares, nspares;	  /* spare slots not taken (tb_spare_take) */
	uint64_t expired; /* write-backs started by the age limit */
	uint64_t wb_rewritten; /* written back, then written again while still cached */
	/*
	 * The stall: write-back's last failure while none has succeeded
	 * since (0: none), and when that run of failures began. It bounds
	 * the wait at the dirty mark (cache.c, wait_dirty_budget).
	 */
	int stall_err;
	uint64_t stall_ms;
	uint64_t stall_probe_ms; /* the last retry forced while stalled (flush_stall_probe) */
	bool stall_commit;	 /* the last failure was the owner's commit, not a device's */
	struct err_recent wb_recent; /* write-back failures of the last health window */
	long wb_log_sec;
};

static inline uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static inline void deadline_in(struct timespec *ts, uint64_t ms)
{
	clock_gettime(CLOCK_MONOTONIC, ts);
	ts->tv_sec += (time_t)(ms / 1000);
	ts->tv_nsec += (long)(ms % 1000) * 1000000;
	if (ts->tv_nsec >= 1000000000) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000;
	}
}

static inline uint64_t mix(uint64_t a, uint64_t b)
{
	uint64_t h = a * 0x9E3779B97F4A7C15ULL ^ (b + 0x632BE59BD9B4E019ULL);

	h ^= h >> 31;
	h *= 0xBF58476D1CE4E5B9ULL;
	return h ^ (h >> 29);
}

static inline void elist_append(struct elist *l, struct tb_entry *e)
{
	TAILQ_INSERT_TAIL(&l->q, e, link);
	l->n++;
}

static inline void elist_prepend(struct elist *l, struct tb_entry *e)
{
	TAILQ_INSERT_HEAD(&l->q, e, link);
	l->n++;
}

static inline void elist_remove(struct elist *l, struct tb_entry *e)
{
	TAILQ_REMOVE(&l->q, e, link);
	l->n--;
}

/* entry.c: entries, objects, states, slots, pins, the end of a load */
int cache_wait(struct tb_store *s, pthread_cond_t *cv);
struct tb_entry *cache_lookup(struct tb_store *s, uint64_t obj, uint64_t idx);
struct tb_obj *cache_obj_find(struct tb_store *s, uint64_t obj);
struct tb_obj *cache_obj_get(struct tb_store *s, uint64_t obj);
void cache_obj_maybe_free(struct tb_store *s, struct tb_obj *o);
void cache_set_stored(struct tb_entry *e, bool stored);
int cache_entry_insert(struct tb_store *s, struct tb_entry *e, uint64_t obj, uint64_t idx);
void cache_entry_unhash(struct tb_store *s, struct tb_entry *e);
struct tb_entry *cache_find_loc(struct tb_store *s, uint64_t loc, const struct tb_entry *skip);
void cache_set_state(struct tb_store *s, struct tb_entry *e, enum entry_state st);
void cache_pf_clear(struct tb_store *s, struct tb_entry *e);
void cache_entry_free(struct tb_store *s, struct tb_entry *e);
struct tb_entry *cache_entry_take(struct tb_store *s, struct tb_entry *e);
void *cache_slot_data(struct tb_store *s, struct tb_entry *e);
bool cache_stored_ok(const struct tb_store *s, uint64_t loc, size_t len);
size_t cache_io_len(size_t len);
void cache_pin(struct tb_store *s, struct tb_entry *e);
bool cache_unpin_last(struct tb_store *s, struct tb_entry *e);
void cache_unpin_locked(struct tb_store *s, struct tb_entry *e);
void cache_unpin(struct tb_store *s, struct tb_entry *e);
void cache_pin_waiters(struct tb_store *s, struct tb_entry *e, struct tb_waiter *w);
void cache_call_waiters(struct tb_waiter *w, int err);
void cache_load_done(struct tb_entry *e, int err);

/* load.c: loads, synchronous reads, partial blocks */
int cache_resolve(struct tb_store *s, uint64_t obj, uint64_t idx, struct tb_stored *at);
int cache_start_load(struct tb_store *s, struct tb_entry *e, uint64_t obj, uint64_t idx,
		     struct tb_waiter *w, enum io_class cls, bool ahead);
int cache_read_sync(struct tb_store *s, uint64_t loc, size_t len, void *buf);
bool cache_sector_written(const struct tb_entry *e, uint32_t i);
bool cache_covers_stored(const struct tb_entry *e);
void cache_zero_unwritten(struct tb_store *s, struct tb_entry *e);
int cache_merge_io(struct tb_store *s, struct tb_entry *e);
int cache_merge_partial(struct tb_store *s, struct tb_entry *e);

/*
 * Free slots and clean ones that eviction may take now: the reserve the
 * flusher keeps (clean_low to clean_high). Lock held.
 */
static inline uint64_t cache_evictable(const struct tb_store *s)
{
	return s->free_list.n + s->nclean - s->nclean_pinned;
}

/* verify.c: the check of blocks read against their hash */
void cache_hash(const struct tb_store *s, const void *block, uint8_t out[TB_HASH_LEN]);
const uint8_t *cache_read_sum(const struct tb_store *s, bool hashed, const uint8_t *hash);
#define CACHE_NO_OBJ UINT64_MAX /* cache_check of a block no file is named for */
int cache_check(struct tb_store *s, const void *block, const uint8_t *hash, uint64_t loc,
		uint64_t obj, uint64_t idx);
/* Check a load's bytes on a verifier, then cache_load_done. No lock held. */
void verify_load(struct tb_store *s, struct tb_entry *e);
int verify_start(struct tb_store *s);
void verify_stop(struct tb_store *s); /* once no load can complete: drains the queue */

/* evict.c: what leaves DRAM, and the order the flusher cleans in */
bool evict_protected(const struct tb_store *s, const struct tb_obj *o);
void evict_next_use(struct tb_store *s, uint64_t obj, struct tb_use *u);
bool evict_kept(const struct tb_store *s, const struct tb_entry *e);
struct tb_entry *evict_pick(struct tb_store *s, struct tb_use *vu, enum wait_stream wait_stream);
size_t evict_take_cycle(struct tb_store *s, struct tb_entry **out, size_t max, uint64_t now,
			uint64_t *next_ms);
size_t evict_take_lru(struct tb_store *s, struct tb_entry **out, size_t max, uint64_t now,
		      uint64_t *next_ms);

/* ghost.c: 2q's sets, kept as entries come and go */
void ghost_admit(struct tb_store *s, struct tb_entry *e);
void ghost_leave(struct tb_store *s, struct tb_entry *e, bool evicted);

/* fair.c: the dirty budget's share among users */
unsigned fair_slot(const struct tb_store *s, uint32_t uid);
bool fair_may_dirty(const struct tb_store *s, unsigned slot, bool queued);
unsigned fair_wait_begin(struct tb_store *s, uint32_t uid);
void fair_wait_end(struct tb_store *s, unsigned slot);
void fair_dirtied(struct tb_store *s, struct tb_entry *e, uint32_t uid);
void fair_cleaned(struct tb_store *s, struct tb_entry *e);

/* marks.c: the dirty marks, waking the flusher, and whether a cycle rules */
int64_t flush_dirty_over(struct tb_store *s, uint64_t below);
int64_t flush_starved(const struct tb_store *s);
uint64_t flush_dirty_below(struct tb_store *s);
void flush_kick(struct tb_store *s);
void flush_kick_cleaner(struct tb_store *s, bool evicted);
uint64_t marks_cycle_period(struct tb_store *s);

/* flusher.c: the flusher thread */
void *flush_main(void *arg);

/* flush.c: write-back, commits, the sync point */
bool flush_may_clean(struct tb_store *s, struct tb_entry *e, uint64_t now, uint64_t *next_ms);
void flush_start_wb(struct tb_store *s, struct tb_entry *e);
void flush_start_writes(struct tb_store *s, struct tb_entry **batch, size_t n,
			struct tb_entry **holes, size_t *nholes);
void flush_commit_batch(struct tb_store *s, struct tb_entry **v, size_t n);
void flush_wb_failed(struct tb_store *s, struct tb_entry *e, int err, bool no_room);
void flush_stall_probe(struct tb_store *s);
int flush_do_sync(struct tb_store *s);

/* giveback.c: free slab space back to the filesystem */
/* A sync point freed slots: look soon. Lock held. */
void giveback_arm(struct tb_store *s);
void *giveback_main(void *arg);

/* place.c: space */
/* Blocks the devices can still take, less those promised to dirty blocks. Lock held. */
uint64_t place_avail(struct tb_store *s);
int place_take(struct tb_store *s, uint64_t *resv);
void place_give(struct tb_store *s, uint64_t *resv, int from_resv);
int place_block(struct tb_store *s, uint64_t *loc);

#endif

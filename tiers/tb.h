/*
 * tb.h - the tiered block store: the contract between fs/ and tiers/.
 *
 * The store caches fixed-size blocks in one DRAM arena of block-size slots
 * and persists them on the nvme tier (one slab file per folder, blocks
 * striped across folders). A cached block is named by (obj, idx): fs/ uses
 * the inode number and the block index within the file. tiers/ never sees
 * file names, sizes or block maps: it asks its owner (fs/) through
 * struct tb_owner to resolve a name to a persisted location and to commit
 * the result of a write-back.
 *
 * Persisted blocks are never overwritten in place: every write-back takes a
 * fresh location and the old one is released by the owner once no block map
 * refers to it. Released locations are reused only after the next sync, so
 * a crash can never expose a location that the durable metadata still
 * names.
 *
 * A block whose bytes end in zeros, as a file's last block does past its
 * end, is written to a local device (nvme, pfs) only up to its last
 * non-zero KiB (in 4 KiB of I/O), and loaded as far: the owner keeps that
 * length with the location. The store tracks, for each cached block, how far its bytes
 * may be non-zero, so it never needs the file's size.
 *
 * Every block written back is hashed (tb_hash, of the whole block), and the
 * owner keeps the hash with the location. A block read from a device, for
 * a reader, a prefetch, the completion of a partial write or dedup's
 * verify, is checked against it before it is used: one that does not match
 * is never served nor cached, and its reader gets EIO. All functions
 * return 0 or -errno.
 */
#ifndef TENSORFS_TB_H
#define TENSORFS_TB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TB_LOC_NONE UINT64_MAX
#define TB_LOC_DEV_SHIFT 48
#define TB_LOC_SLOT_MASK ((1ULL << TB_LOC_DEV_SHIFT) - 1)
#define TB_MAX_DEVS 64
#define TB_BIND_LEN 40 /* a device's binding id, 36 characters, and room */

static inline uint64_t tb_loc(unsigned dev, uint64_t slot)
{
	return ((uint64_t)dev << TB_LOC_DEV_SHIFT) | slot;
}

static inline unsigned tb_loc_dev(uint64_t loc)
{
	return (unsigned)(loc >> TB_LOC_DEV_SHIFT);
}

static inline uint64_t tb_loc_slot(uint64_t loc)
{
	return loc & TB_LOC_SLOT_MASK;
}

enum tb_engine { TB_ENGINE_AUTO, TB_ENGINE_URING, TB_ENGINE_AIO };
enum tb_kind { TB_KIND_NVME, TB_KIND_PFS, TB_KIND_S3 };
enum tb_dedup { TB_DEDUP_OFF, TB_DEDUP_TRUST, TB_DEDUP_VERIFY };
/* auto: Belady on the owner's learned cycle while one is known, else clock. */
enum tb_policy { TB_POLICY_AUTO, TB_POLICY_CLOCK, TB_POLICY_LRU, TB_POLICY_2Q };

#define TB_HASH_LEN 16 /* XXH3-128 */
#define TB_LEN_UNIT 1024 /* a stored block's length (tb_commit.len) is a multiple */

/* An S3 bucket as a tier. Secrets live here and nowhere else. */
struct tb_s3_config {
	const char *endpoint;	/* http(s)://host[:port] */
	const char *bucket;
	const char *prefix;	/* key prefix inside the bucket, may be "" */
	const char *region;
	const char *access_key, *secret_key, *session_token;
	bool path_style;	/* host/bucket/key rather than bucket.host/key */
	unsigned timeout_ms;	/* total time a request may take, retries included */
	unsigned connections;	/* connection pool size, at least */
	uint64_t object_bytes;	/* blocks packed per object, in bytes, for a new bucket tier */
	uint64_t readahead_max; /* a reader's deepest window: the pool covers it */
};

/* One device of a persistent tier. */
struct tb_dev_spec {
	enum tb_kind kind;
	const char *path;	/* folder (nvme, pfs); unused for s3 */
	uint64_t bw;		/* bytes per second cap, 0: none */
	uint64_t cap;		/* bytes cap, 0: what the medium has */
};

struct tb_config {
	size_t block_size;
	size_t dram_bytes;
	size_t dirty_bytes;	   /* high-water mark, 0: all the arena but a clean reserve */
	const char *store_id;	   /* binds device folders to this store */
	const struct tb_dev_spec *devs; /* nvme folders first, then the remote tier */
	unsigned n_devs;
	const struct tb_s3_config *s3;
	enum tb_engine engine;	   /* for nvme devices */
	unsigned queue_depth;	   /* I/Os in flight per device */
	unsigned flush_delay_ms;   /* a partly written block waits this long */
	unsigned dirty_expire_ms;  /* written back once dirty this long; 0: only when evicted */
	unsigned sync_interval_ms; /* periodic durability point */
	unsigned sync_commits;	   /* the owner's commits that bring a sync point at once; 0: none */
	unsigned punch_after_ms;   /* free slab space goes back after this long; 0: never */
	/*
	 * While every write-back fails (the devices are full, or failing), a
	 * writer waiting for room under the dirty mark gets the failure
	 * (ENOSPC, else EIO) once the failures have gone on this long.
	 */
	unsigned stall_wait_ms;
	unsigned max_pinned;	   /* worst case of blocks pinned by readers */
	unsigned spare_slots;	   /* arena slots beyond dram_bytes, for tb_swap_slot */
	uint64_t remote_readahead; /* deepest window ahead of a reader of remote blocks, bytes */
	enum tb_dedup dedup;	   /* share blocks whose bytes are already stored */
	bool no_checksum; /* blocks read are not checked against their hash (still kept) */
	bool scratch;	  /* sync points before the stop flush no device (owner.sync's power) */
	enum tb_policy policy;	   /* eviction */
	bool share_arena;	   /* a memfd that GPU clients map (cuda=on) */
	bool test_collide;	   /* test hook: every block hashes alike */
};

/* One write-back result handed to the owner. */
struct tb_commit {
	uint64_t obj;
	uint64_t idx;
	uint64_t loc;	   /* new location, or TB_LOC_NONE for a hole */
	uint64_t len;	   /* bytes written at loc; the rest of the block is zeros */
	uint64_t share_id; /* non-zero: point at this stored block instead */
	bool hashed;	   /* hash is set: the block's bytes, kept to check every read */
	bool index;	   /* and dedup may share the block: enter it in its index */
	uint8_t hash[TB_HASH_LEN];
};

/*
 * Where a persisted block is: its location, the bytes stored there from the
 * block's start (the block size, or less for a block whose end is zeros:
 * see tb_commit), and the hash of the whole block (tb_hash) when the owner
 * has one. A block is checked against its hash whenever it is read from a
 * device, and never served when the two differ.
 */
struct tb_stored {
	uint64_t loc;
	size_t len;
	bool hashed;
	uint8_t hash[TB_HASH_LEN];
};

/* An object's next use, as the owner's learned cycle predicts it. */
struct tb_use {
	uint64_t dist; /* uses of objects until then; UINT64_MAX: unknown */
	bool write;    /* it begins with a write: the cached copy is not read again first */
	bool now;      /* the object is in use right now */
	uint64_t size; /* the object's bytes; 0 if unknown */
};

struct tb_owner {
	void *ctx;
	/* Where persisted block (obj, idx) is: 0 with *at filled, or -ENOENT for a hole. */
	int (*resolve)(void *ctx, uint64_t obj, uint64_t idx, struct tb_stored *at);
	/*
	 * Make n write-back results part of the block maps, atomically;
	 * -ESTALE when a block to share went away meanwhile (nothing changed).
	 */
	int (*commit)(void *ctx, const struct tb_commit *c, size_t n);
	/* A stored block with these bytes' hash: 0 with its id, location and length. */
	int (*dedup_find)(void *ctx, const uint8_t *hash, uint64_t *id, uint64_t *loc,
			  size_t *len);
	/*
	 * Make every commit so far durable: choose the commit to make durable
	 * first, then call flush(arg), which flushes the devices, so that a
	 * block committed during the flush is not counted durable. With
	 * power false (scratch=on, before the stop), flush is NULL and
	 * durable means a killed daemon loses nothing: no file is flushed.
	 */
	int (*sync)(void *ctx, int (*flush)(void *arg), void *arg, bool power);
	/*
	 * For eviction, called with the store lock held (it must take no lock
	 * of the store's): the period of the learned access cycle in uses of
	 * objects (0: no cycle known), and what the cycle says of obj's next
	 * use (struct tb_use).
	 */
	uint64_t (*cycle_period)(void *ctx);
	void (*next_use)(void *ctx, uint64_t obj, struct tb_use *u);
	/*
	 * Blocks of the objects of one cycle (0 while none is known), how
	 * many of them are last blocks that their object fills only in part,
	 * and how many are of objects that the cycle writes.
	 */
	void (*cycle_size)(void *ctx, uint64_t *blocks, uint64_t *tails, uint64_t *written);
};

struct tb_store;
struct tb_entry;

struct tb_ref {
	struct tb_entry *e;
	void *data;
};

/*
 * A read waiting for a block to load. fn is called once, on an I/O thread:
 * with err 0 and ref pinned for the caller, -ENOENT for a hole, or -errno.
 */
struct tb_waiter {
	struct tb_waiter *next;
	void (*fn)(struct tb_waiter *w, int err);
	struct tb_ref ref;
};

struct tb_dev_stats {
	char name[16];
	char path[512];
	const char *kind, *engine;
	uint64_t capacity, used;
	uint64_t read_bytes, write_bytes, read_ops, write_ops, errors;
	unsigned inflight_demand, inflight_prefetch, inflight_wb, queued;
	uint64_t bw_cap, bw_measured;
	uint64_t bw_capable; /* what it moved when driven hard (dev.h) */
	double weight;	     /* its placement weight now */
	uint64_t read_latency_us;
	uint64_t active_ns;	      /* time with a request in flight, since the mount */
	uint64_t readahead_bytes;     /* a remote reader's window now (dev_ra_blocks) */
	uint64_t requests;	      /* requests made to the medium (HTTP requests for s3) */
	uint64_t objects, dead_bytes; /* s3: objects stored, bytes in them no block uses */
	uint64_t compacted_objects, compacted_bytes;
	uint64_t slab_bytes;	 /* what the slab file takes on its filesystem (st_blocks) */
	uint64_t returned_bytes; /* free slab space given back to the filesystem so far */
	uint64_t avail;		/* bytes it can still take: its room, 0 while full */
	uint64_t recent_errors; /* errors of the last HEALTH_WINDOW_S seconds (dev.h) */
	uint64_t checksum_errors; /* blocks read from it that did not match their hash */
	uint64_t unanswered_ms;	  /* requests in flight, and none finished for this long; else 0 */
	bool up;
	bool full; /* no room left, or a write said ENOSPC and none has succeeded since */
};

/* What the store counts as it goes, since it was opened (tb_stats' n). */
struct tb_counts {
	uint64_t dram_read_bytes, dram_write_bytes, dram_read_ops, dram_write_ops;
	uint64_t swapped_write_bytes; /* of dram_write_bytes, taken in by tb_swap_slot: no copy */
	uint64_t hits, misses, evictions, writeback_bytes;
	uint64_t holes_written, wb_errors, syncs, backpressure_waits;
	uint64_t prefetch_issued, prefetch_used, prefetch_wasted, prefetch_late;
	uint64_t prefetch_refused;  /* not issued: every slot held a block needed sooner */
	uint64_t prefetch_promoted; /* late ones still queued, moved to the demand class */
	uint64_t partial_created, partial_merged; /* reads saved, and paid later */
	uint64_t dedup_hits, dedup_verify_mismatch;
	uint64_t dedup_verify_cached; /* verify compared with a copy in DRAM, not the device */
	uint64_t ghost_hits;	      /* 2q: promotions from A1out */
};

struct tb_stats {
	struct tb_counts n;
	size_t block_size;
	uint64_t dram_capacity, dram_used, dirty_bytes;
	uint64_t dirty_limit_bytes;	 /* writers wait here (dirty=) */
	uint64_t dirty_background_bytes; /* without a cycle, write-back starts here */
	uint64_t kept_bytes; /* a cycle larger than DRAM: what stays, spread over it; else 0 */
	uint64_t kept_evicted_bytes; /* of those, evicted: no other clean block could be had */
	uint64_t recent_wb_errors; /* write-back failures of the last health window */
	unsigned health_window_s;  /* its length */
	int stall_err;	   /* write-back fails with this and nothing succeeds since; 0: not */
	uint64_t stall_ms; /* for this long */
	bool stall_commit; /* the last failure was the metadata's commit, not a device's */
	uint64_t unsynced_blocks; /* write-backs committed since the last sync point */
	uint64_t unsynced_commits; /* owner's transactions since the last sync point */
	uint64_t expired_bytes;	  /* written back for the age limit, not for room */
	uint64_t rewritten_bytes; /* written back, then written again while in DRAM */
	uint64_t prefetch_depth;  /* blocks the cycle's prefetch loads ahead (tb_cycle_pass) */
	/*
	 * Blocks read from a device: checked against their hash, read with no
	 * hash to check (stored before blocks kept one, or checksum=off), and
	 * that did not match it (failed with EIO).
	 */
	uint64_t checksum_verified, checksum_unverified, checksum_errors;
	uint64_t pinned_bytes, pin_limit_bytes; /* resident blocks of pinned objects */
	uint64_t hot_bytes;			/* 2q: Am's size */
	bool huge_pages, locked;
	uint64_t thp_bytes; /* of the arena, in transparent huge pages at start */
	unsigned n_devs;
	struct tb_dev_stats dev[TB_MAX_DEVS];
};

/*
 * Before anything is made: refuse a device folder (nvme or pfs) that another
 * user owns or can write, or whose store files are links, not regular
 * files, or not ours alone (see storedir.h). 0, or -errno with err set.
 */
int tb_check_folder(enum tb_kind kind, const char *dir, char *err, size_t errlen);
/*
 * For a new store, whose metadata is in meta: refuse a device folder that
 * already holds another store's identity. 0, or -errno with err set.
 */
int tb_check_unclaimed(enum tb_kind kind, const char *dir, const char *meta, char *err,
		       size_t errlen);
/*
 * Open the store: arena, device folders and slab files; no threads yet.
 * A device with another store's identity, or this store's for another
 * place in the list, is refused; one with none is opened without one,
 * and tb_check_devices decides.
 */
int tb_open(const struct tb_config *cfg, const struct tb_owner *owner, struct tb_store **out,
	    char *err, size_t errlen);
/* Before tb_start: a location the metadata names is in use. */
int tb_mark_used(struct tb_store *s, uint64_t loc);
/*
 * After the locations are marked, before tb_start: each device against
 * what the store knows of it. blocks[i] is the blocks the store holds on
 * device i; bind[i] (n_bind of them) the binding it recorded for device i
 * ("" where it knows none). Refused, naming the device and what is
 * expected: a device without an identity, or a slab file, where the store
 * holds blocks; one whose identity carries another binding than the
 * recorded one. A device without an identity where the store holds no
 * block is a new one (or an emptied one, taken afresh): it gets a new
 * binding. On return bind[0..n_devs) is what the store must record, and
 * *changed whether that differs from what it had; record it, then call
 * tb_bind_devices. 0, or -errno with err set.
 */
int tb_check_devices(struct tb_store *s, const uint64_t *blocks, char (*bind)[TB_BIND_LEN],
		     unsigned n_bind, bool *changed, char *err, size_t errlen);
/* Write the identities of the devices that had none, with their bindings in bind. */
int tb_bind_devices(struct tb_store *s, char (*bind)[TB_BIND_LEN], const char *store_id, char *err,
		    size_t errlen);
/* How many devices the store has open. */
unsigned tb_n_devs(const struct tb_store *s);
/* Start the I/O and flusher threads. */
int tb_start(struct tb_store *s);
/* A failed start: remove the device identities and slab files this open created. */
void tb_forget_identity(struct tb_store *s);
/* Write back everything, sync, stop the threads and free the store. */
int tb_close(struct tb_store *s);

/*
 * Pin block (obj, idx) for reading. Returns 0 with *ref pinned and ready,
 * 1 when the block is loading and w was queued (see struct tb_waiter;
 * without w the call waits), -ENOENT for a hole (nothing pinned), or -errno.
 */
int tb_get(struct tb_store *s, uint64_t obj, uint64_t idx, struct tb_ref *ref,
	   struct tb_waiter *w);
/* Release a read pin, counting the bytes served from it. */
void tb_put(struct tb_store *s, struct tb_ref *ref, size_t bytes_read);
/*
 * Load (obj, idx) ahead of use, below demand reads and above write-back.
 * Never waits: 0 when issued or cached already; -EAGAIN when no slot or
 * I/O can be had right now (try again soon); -ENOBUFS when the blocks
 * loaded ahead and not yet read are at their bound (their readers must
 * catch up); -EBUSY when every slot holds a block needed sooner than this
 * one. A hint (an explicit request to load the object) is held to
 * neither of the last two.
 */
int tb_prefetch(struct tb_store *s, uint64_t obj, uint64_t idx, bool hint);
/*
 * For a sequential reader of block (obj, idx): 0 when its home is local
 * (nvme) or it has none, else how many blocks ahead of the reader to keep
 * loaded or in flight for its remote home (latency x bandwidth, see
 * dev_ra_blocks), and in *run how many blocks one request of that device
 * moves at best. Costs one lookup of the block's location.
 */
unsigned tb_ahead(struct tb_store *s, uint64_t obj, uint64_t idx, unsigned *run);
/*
 * Blocks from (obj, idx) on that the request reading its run (its s3
 * object) would read: where that request ends. 1 when the block is stored
 * alone or not stored. Costs one lookup of the block's location.
 */
unsigned tb_run_left(struct tb_store *s, uint64_t obj, uint64_t idx);
/*
 * tb_prefetch for a reader of remote blocks: the blocks loaded ahead this
 * way are bounded apart from the others, by depth (what tb_ahead said) and
 * a quarter of the slots, so that a deep window for a remote device does
 * not shrink the shallow one that suits nvme.
 */
int tb_prefetch_deep(struct tb_store *s, uint64_t obj, uint64_t idx, unsigned depth);
/*
 * tb_prefetch's hint for a reader that streams a range it will read next
 * (the GPU path's PREFETCH): its loads in flight may reach a quarter of
 * the slots, the deep window's bound, rather than the devices' queue
 * depth, so that the whole range is queued at the device at once.
 */
int tb_prefetch_stream(struct tb_store *s, uint64_t obj, uint64_t idx);
/*
 * A pass of the learned cycle ended: tune how far the cycle's prefetch
 * loads ahead, from this pass's late prefetches and devices' idle time
 * (tb_pf_depth_next, which takes pct, the busiest device's share of the
 * pass with a request in flight). Blocks loaded ahead take their slots
 * from those the cycle keeps.
 */
void tb_cycle_pass(struct tb_store *s);
/*
 * The window's rules, apart from the store (the unit test drives them):
 * its depth, between min and max; a growth being judged (before_ns, the
 * pass before it, and the best pass since); and the passes it holds.
 */
struct tb_pf_window {
	uint64_t depth, min, max;
	uint64_t floor; /* from the readers' queue (tb_pf_readers); at most floor_max, or 0 */
	uint64_t floor_max;
	uint64_t readers; /* the most blocks readers had in flight since the last pass */
	uint64_t before_ns; /* the pass before the last growth, while it is judged; 0: none */
	unsigned before_late; /* and its prefetches late, in % */
	uint64_t best_ns;     /* the shortest pass since the growth */
	unsigned best_late;   /* and its late share */
	unsigned judged;      /* passes since the growth */
	unsigned hold;	      /* passes left before the window may grow again */
};
/* A pass ended: took_ns long, with issued and late prefetches, pct busy. */
void tb_pf_window_pass(struct tb_pf_window *w, uint64_t took_ns, uint64_t issued, uint64_t late,
		       unsigned pct);
/* Readers have this many blocks in flight: the window covers their queue (see prefetch.c). */
void tb_pf_window_readers(struct tb_pf_window *w, uint64_t blocks);
void tb_pf_readers(struct tb_store *s, uint64_t blocks);
uint64_t tb_pf_depth_next(uint64_t depth, uint64_t min, uint64_t max, uint64_t issued,
			  uint64_t late, unsigned pct);
bool tb_pf_grow_undone(uint64_t before_ns, unsigned before_late, uint64_t took_ns, unsigned late);
/*
 * Hold the calling thread's requests to the devices until tb_unplug, then
 * queue them at once, so that a device sees a run of neighbours together
 * (the s3 engine serves them with one ranged GET). Nests.
 */
void tb_plug(void);
void tb_unplug(void);

/*
 * The calling thread serves a request that its client may give up on: the
 * waits of the store that can last while a device is full or failing (room
 * under the dirty mark, a free slot, tb_flush_obj and tb_sync) look at
 * fn(arg) every TB_WAIT_STEP_MS and end with -EINTR when it returns true.
 * fn(NULL, NULL) ends it; the caller must do so before arg goes away.
 */
#define TB_WAIT_STEP_MS 100
void tb_interruptible(bool (*fn)(void *arg), void *arg);

/*
 * Who writes (tb_get_write). The dirty budget is shared among the users
 * who write (tiers/fair.c): uid is the user a block that becomes dirty
 * counts against. nowait: where the write would sleep (for dirty room,
 * for a slot, or for a read or write-back of the block), tb_get_write
 * returns -EAGAIN instead, with nothing of the block changed, so that a
 * caller serving requests can leave the wait to another thread.
 */
struct tb_writer {
	uint32_t uid;
	bool nowait;
};
/*
 * Pin block (obj, idx) for writing bytes [off, off + len) of it. Loads a
 * persisted block first when the write covers only part of it, waits while
 * the block is being written back, and waits above the dirty high-water
 * mark, and while its user is over its share of it and another user waits
 * (see struct tb_writer; who NULL: uid 0, waiting); these waits are
 * bounded (see stall_wait_ms, and tb_interruptible). -ENOSPC when the
 * persistent tiers cannot take another block. A block that becomes dirty
 * takes one block of *resv when resv is given. blind: the writer does not
 * read what it writes (it has written the whole file since it last read
 * it); without a cycle, such rewrites of stored blocks are written back
 * from the background mark on.
 */
int tb_get_write(struct tb_store *s, uint64_t obj, uint64_t idx, size_t off, size_t len, bool blind,
		 struct tb_ref *ref, uint64_t *resv, const struct tb_writer *who);
/*
 * Reserve n blocks of persistent space for one request before it changes
 * anything; tb_get_write takes from *resv first. Return what is left.
 */
int tb_reserve(struct tb_store *s, uint64_t n);
void tb_unreserve(struct tb_store *s, uint64_t n);
/* Release a write pin; the block is now dirty. */
void tb_put_dirty(struct tb_store *s, struct tb_ref *ref, size_t off, size_t len);
/*
 * Spare slots: spare_slots slots of the arena outside the cache, for
 * receiving a write's bytes where the DRAM tier can take them without a
 * copy. A holder owns its spare until it gives it back; tb_swap_slot
 * trades it for another. tb_spare_take returns -ENOSPC when none is left.
 */
int tb_spare_take(struct tb_store *s, uint32_t *slot);
void tb_spare_give(struct tb_store *s, uint32_t slot);
void *tb_slot_data(const struct tb_store *s, uint32_t slot);
/*
 * Between tb_get_write of a whole block and its tb_put_dirty: when no one
 * else holds the block (no other pin), the spare *slot, which holds the
 * block's new bytes, becomes the block's slot and its old slot is handed
 * back in *slot, with no copy; ref->data follows. False: nothing changed,
 * and the caller copies as usual.
 */
bool tb_swap_slot(struct tb_store *s, struct tb_ref *ref, uint32_t *slot);

/* Write back every dirty block of obj and wait; returns a write-back error. */
int tb_flush_obj(struct tb_store *s, uint64_t obj);
/* Write back everything dirty and make it durable. */
int tb_sync(struct tb_store *s);
/* Make every commit so far durable, without waiting for dirty blocks. */
int tb_durable(struct tb_store *s);
/*
 * The owner committed a transaction of its own (metadata: a create, a
 * chmod, an unlink). It is made durable at the next sync point, which
 * comes within sync_interval_ms, or at once after many such commits: the
 * owner's store keeps the pages of every commit since the last sync point
 * (fs/meta.c), and a flood of metadata operations grew it without bound
 * while no data was written back. From any thread but the flusher's own
 * commits, holding no lock of the store's; cheap, but past a bound of
 * commits since the last sync point, or when urgent (the owner's store
 * grew past its own bound), it waits for the one under way (a few
 * seconds at most).
 */
void tb_meta_committed(struct tb_store *s, bool urgent);
/* Forget cached blocks idx in [from, to) of obj, dirty ones included. */
void tb_drop(struct tb_store *s, uint64_t obj, uint64_t from, uint64_t to);
/*
 * Keep obj's blocks resident: eviction passes them over while pinned
 * blocks stay within the pin limit (DRAM less the dirty budget and the
 * readers' worst case). nblocks is what the caller is about to load;
 * -ENOSPC when that would not fit. Pins are not persistent.
 */
int tb_pin_obj(struct tb_store *s, uint64_t obj, uint64_t nblocks);
void tb_unpin_obj(struct tb_store *s, uint64_t obj);
/* Unpin obj, write back its dirty blocks, and drop the clean ones from DRAM. */
int tb_evict_obj(struct tb_store *s, uint64_t obj);
/*
 * Dirty blocks of obj with no stored copy yet (new, never written back):
 * what the owner's block map does not show of obj. Counted as blocks
 * change state, so it costs nothing to ask. Between a write-back's commit
 * and its return to the cache a block is in both, for a moment.
 */
uint64_t tb_unstored(struct tb_store *s, uint64_t obj);
/* Blocks of obj resident in DRAM; *pinned, if given, says whether it is pinned. */
uint64_t tb_resident(struct tb_store *s, uint64_t obj, bool *pinned);
/*
 * Call fn with the index of each block of obj resident in DRAM (clean,
 * dirty or being written back), from the object's own list: the cost is
 * what obj holds in DRAM, whatever its size. A dirty block that was never
 * written back is here and nowhere else. fn runs under the store's lock and
 * must not call the store.
 */
typedef void (*tb_block_fn)(void *arg, uint64_t idx);
void tb_resident_each(struct tb_store *s, uint64_t obj, tb_block_fn fn, void *arg);
/* The owner no longer references loc; reuse it after the next sync. */
void tb_release(struct tb_store *s, uint64_t loc);
/* Check that n more blocks fit in the persistent tiers right now. */
int tb_space_check(struct tb_store *s, uint64_t nblocks);
/*
 * The scrub's check of stored blocks: read each of the n blocks from its
 * device (below demand reads) and compare it with its hash, where it has
 * one, checksum=off or not. Each result is 0, -EBADMSG when the bytes do not match the hash, or
 * the read's -errno; a mismatch is logged and counted as a read's is.
 * Returns 0, or -errno when the check could not be made (no memory).
 */
struct tb_check {
	uint64_t loc;
	size_t len;
	bool hashed;
	uint8_t hash[TB_HASH_LEN];
	int result;
};
int tb_check_stored(struct tb_store *s, struct tb_check *v, size_t n);
/* Bytes of capacity and free space across the persistent tiers. */
void tb_space(struct tb_store *s, uint64_t *total, uint64_t *avail);
void tb_get_stats(struct tb_store *s, struct tb_stats *st);
size_t tb_block_size(const struct tb_store *s);
/* A block of zeros, block_size long, for replying with holes. */
const void *tb_zero_block(const struct tb_store *s);
/*
 * A block's hash, for len bytes: XXH3-128, the low 64 bits then the high 64,
 * each in the host's byte order. Dedup's key and every read's check: the
 * block records on disk hold these, so their value never changes, whichever
 * vector unit computes them (the widest the CPU has, where libxxhash has its
 * x86 dispatcher).
 */
void tb_hash(const void *data, size_t len, uint8_t out[TB_HASH_LEN]);

/* ---- the arena, shared with local clients (fs/gpu.c) ---- */

struct tb_arena_info {
	void *base;
	size_t bytes;
	int fd; /* a sealed memfd of the arena, or -1 when it cannot be shared */
	bool huge, locked;
};

/* The DRAM arena; a pinned block's slot lies at (char *)ref.data - base. */
void tb_arena(const struct tb_store *s, struct tb_arena_info *a);
/*
 * How many blocks a client outside the store may keep pinned at once, in
 * all and for writing, and still leave the store's readers their slots
 * and its writers their dirty budget (a write pin holds a dirty block).
 */
void tb_client_pins(const struct tb_store *s, uint64_t *pins, uint64_t *write_pins);
/* ---- end of the shared arena ---- */

#endif

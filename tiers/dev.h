/*
 * dev.h - a persistent device of the block store, and its I/O engines.
 *
 * Every persistent tier is made of devices: one per nvme folder, one for a
 * pfs folder, one for an s3 bucket. A device owns the slots it stores
 * blocks in (an allocator), a queue of requests in three classes served in
 * order (demand reads, prefetch reads, write-back) with a bound on each,
 * an optional bandwidth cap (a token bucket) and capacity cap, a measured
 * bandwidth, a health state, and counters. Its engine moves requests to
 * the medium and back:
 *
 *   uring    io_uring on an O_DIRECT slab file, arena registered (nvme)
 *   aio      libaio on an O_DIRECT slab file (nvme fallback)
 *   threads  a pool of threads doing pread/pwrite on a slab file (pfs)
 *   s3       libcurl multi against an S3 endpoint, several slots per object
 *
 * A device sees nothing but its own queue: callers pass a request and get a
 * completion callback on the device's thread.
 *
 * Placement weighs a device by what it can do, not by what it was given: a
 * window in which the device was driven hard (requests waiting, or half its
 * depth in flight) sets its capability to what it moved, up or down; any
 * other window can only raise it. The read latency and that capability
 * give the readahead depth that keeps a remote device busy (dev_ra_blocks).
 */
#ifndef TENSORFS_DEV_H
#define TENSORFS_DEV_H

#include <libaio.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "alloc.h"
#include "dram.h"
#include "tb.h"

enum io_op { IO_READ, IO_WRITE };
enum io_class { IO_DEMAND, IO_PREFETCH, IO_WB, IO_NCLASS };

struct tb_io {
	struct tb_io *next;
	enum io_op op;
	enum io_class cls;
	uint64_t slot;
	void *buf;
	size_t len;
	size_t done_bytes; /* progress across short transfers */
	bool push; /* a write someone waits for (fsync, unmount, age limit): hold it no longer */
	uint64_t start_ns; /* when the engine took it, for latency */
	uint64_t fill;	   /* a write into space given back: slots from slot to allocate first */
	void (*done)(struct tb_io *r, int err);
	struct iocb iocb; /* aio engine only */
};

struct tb_dev;

struct dev_engine {
	const char *name;
	int (*start)(struct tb_dev *d); /* optional: before the thread starts */
	void *(*thread)(void *d);	/* optional: the engine's one thread, given d */
	void (*kick)(struct tb_dev *d); /* new requests are queued */
	void (*stop)(struct tb_dev *d); /* optional: finish what is queued, join threads */
	int (*sync)(struct tb_dev *d);	/* make completed writes durable */
	void (*fini)(struct tb_dev *d);
	/*
	 * Optional slot management, for an engine that packs slots into larger
	 * units (s3 objects); without them the bitmap allocator is used. Called
	 * with d->lock held.
	 */
	int (*alloc)(struct tb_dev *d, uint64_t *slot);
	void (*free)(struct tb_dev *d, uint64_t slot);
	int (*mark)(struct tb_dev *d, uint64_t slot);
	/* Write the identity of a device that has none (d->bind set); without it, tensorfs.dev. */
	int (*bind)(struct tb_dev *d, const char *store_id, char *err, size_t errlen);
	/* Blocks from slot to the end of the object it is stored in, itself included. */
	unsigned (*run_left)(struct tb_dev *d, uint64_t slot);
};

enum dev_health { DEV_UP, DEV_DOWN };

/*
 * Failures of the last HEALTH_WINDOW_S seconds, counted in HEALTH_BUCKETS
 * buckets of equal length: what health reports, apart from the lifetime
 * counts. A device that works again is healthy once its failures have
 * aged out of the window.
 */
#define HEALTH_WINDOW_S 60
#define HEALTH_BUCKETS 6
struct err_recent {
	uint64_t period[HEALTH_BUCKETS]; /* which bucket-long period each counts */
	uint64_t n[HEALTH_BUCKETS];
};
void err_recent_add(struct err_recent *r, uint64_t now_ns);
uint64_t err_recent_count(const struct err_recent *r, uint64_t now_ns);

struct tb_dev {
	const char *kind; /* "nvme", "pfs", "s3" */
	unsigned index;
	char name[16];
	char where[512]; /* folder or URL, for stats and logs */
	size_t block_size;
	unsigned qd;
	const struct dram_arena *arena;
	const struct dev_engine *eng;
	void *priv;	 /* the engine's state */
	int fd;		 /* slab file, where there is one */
	int dir_fd;	 /* its folder, checked (storedir.h), where there is one */
	bool id_made;	 /* this open created the identity file */
	bool id_missing; /* it had none: dev_bind writes one, if the store allows (tb_check_devices)
			  */
	char bind[TB_BIND_LEN]; /* the binding in its identity; "" in one from before bindings */
	bool slab_made;	 /* this open created the slab file */
	bool prealloc;	 /* grow the slab ahead of writes (nvme); off once unsupported */
	/*
	 * The slab's size: writes below it are overwrites. Raised by the I/O
	 * threads, lowered by dev_give_back (atomic): see slab_end_raise.
	 */
	uint64_t slab_end;
	int wake_efd;	 /* kicked when requests are queued */
	bool running;
	pthread_t thread; /* the engine's thread, where it has one (eng->thread) */

	pthread_mutex_t lock; /* guards everything below */
	struct tb_io *head[IO_NCLASS], *tail[IO_NCLASS];
	unsigned inflight[IO_NCLASS];
	unsigned queued_reads;
	unsigned backlog; /* requests the engine took and cannot start yet (s3) */
	bool stopping;
	struct slot_alloc alloc;
	bool full;	  /* a write said ENOSPC, and none sent after it has succeeded */
	uint64_t full_ns; /* when one last did: no new blocks for a while (usable) */
	/*
	 * nvme, pfs: slots it can still take without its filesystem running out,
	 * from fstatvfs at room_ns (room_locked), when alloc.used was
	 * room_used; and the room it had when it said ENOSPC, which it must
	 * pass to count as having space again before RETRY_FULL_NS.
	 */
	bool track_room;
	/*
	 * pfs: the room is looked at by a pool thread (dev_room_look), never
	 * on the placement path: a parallel filesystem's statfs may ask every
	 * server. room_busy: one is looking, the lock dropped.
	 */
	bool room_async, room_busy;
	uint64_t room_slots, room_used, room_ns, full_room;
	uint64_t room_fs_slots; /* of room_slots, its filesystem's free space */
	uint64_t fs_dev;	/* st_dev of the slab's filesystem (track_room) */
	bool said_full; /* the log said it is full, and not yet that it has room again */
	/*
	 * The last request finished, or requests went in flight on an idle
	 * device: with requests in flight, how long it has not answered
	 * (a parallel filesystem that stalls; tb_dev_stats.unanswered_ms).
	 */
	uint64_t answer_ns;
	long full_log_sec, room_log_sec;
	struct err_recent recent; /* errors of the last HEALTH_WINDOW_S */
	enum dev_health health;
	unsigned consecutive_errors;
	uint64_t down_ns; /* last failure while down */
	uint64_t bw_cap;      /* bytes per second, 0: none */
	double tokens;	      /* token bucket, in bytes */
	uint64_t tokens_ns;   /* last refill */
	double bw_measured;   /* moving average of bytes per second under load */
	double bw_capable;    /* what it moved when driven hard: its placement weight */
	bool bw_known;	      /* it was driven hard once: bw_capable is more than a floor */
	uint64_t bw_window_ns, bw_window_bytes;
	uint64_t bw_last_ns; /* end of the last transfer measured */
	uint64_t load_ns;    /* last change of the queue or in-flight counts */
	uint64_t busy_ns;    /* time driven hard in the current window */
	uint64_t active_ns;  /* time with a request in flight, since the start */
	uint64_t retries;    /* attempts the engine had to make again (s3) */
	uint64_t window_errors; /* errors + retries when the window began */
	double read_lat_ns;	/* moving average of a read's time from take to end */
	double read_lat_min_ns; /* the least of them, rising slowly: latency unloaded */
	uint64_t ra_max;	/* readahead depth at most, bytes (remote devices) */
	unsigned run;		/* blocks placement gives it in a row (an s3 object's) */
	uint64_t held_slots;	/* neither free nor in use: dead or unfilled, in packed objects */
	bool give_back;		/* free slab space goes back to the filesystem (dev_give_back) */
	uint64_t returned_bytes; /* slab space given back so far */
	uint64_t read_bytes, write_bytes, read_ops, write_ops, errors;
	/* Engines that count more (s3): requests sent, stored objects, dead bytes in them. */
	uint64_t requests, objects, dead_bytes, compacted_objects, compacted_bytes;
	long err_log_sec;
};

/* Open an nvme device on a folder (uring, else aio) or a pfs one (threads). */
int dev_open_slab(struct tb_dev **out, const char *kind, unsigned index, const char *dir,
		  const char *store_id, size_t block_size, enum tb_engine engine,
		  unsigned queue_depth, uint64_t bw_cap, uint64_t cap_bytes,
		  const struct dram_arena *arena, char *err, size_t errlen);
/* Open an s3 device on a bucket (s3.c). */
int dev_open_s3(struct tb_dev **out, unsigned index, const struct tb_s3_config *cfg,
		const char *store_id, size_t block_size, unsigned queue_depth, uint64_t bw_cap,
		uint64_t cap_bytes, const struct dram_arena *arena, char *err, size_t errlen);

int dev_start(struct tb_dev *d);
/* Finish every queued request, then stop the engine. */
void dev_stop(struct tb_dev *d);
void dev_close(struct tb_dev *d);

void dev_submit(struct tb_dev *d, struct tb_io *r);
/*
 * A read still queued in the prefetch class moves to the demand class,
 * behind the demand reads queued: a reader waits on it. Whether it was
 * queued here (false: in flight, done, or never queued on d).
 */
bool dev_promote(struct tb_dev *d, struct tb_io *r);
int dev_sync(struct tb_dev *d);
/* A failed start: remove the identity and slab files this open created, if any. */
void dev_forget_identity(struct tb_dev *d);
/* Give a device without an identity one, with binding bind. 0, or -errno with err set. */
int dev_bind(struct tb_dev *d, const char *store_id, const char *bind, char *err, size_t errlen);
/* A new binding id, random: 36 characters as a store id's. */
void dev_new_bind(char bind[TB_BIND_LEN]);
/* The binding in an identity's line into bind ("" when it has none); false when malformed. */
bool dev_parse_bind(const char *line, char bind[TB_BIND_LEN]);
/* "nvme folder PATH", "pfs folder PATH", "s3 tier URL": the device, for messages. */
void dev_describe(const struct tb_dev *d, char *buf, size_t len);

int dev_alloc(struct tb_dev *d, uint64_t *slot);
void dev_free(struct tb_dev *d, uint64_t slot);
/* Take back a slot whose write failed: dev_free, but no sign of room. */
void dev_unplace(struct tb_dev *d, uint64_t slot);
int dev_mark(struct tb_dev *d, uint64_t slot);
/*
 * Free slots it can take now: none while full or down, and no more than
 * its filesystem has room for (an nvme folder shares its filesystem with
 * others, who may fill it after the mount).
 */
uint64_t dev_free_slots(struct tb_dev *d);
/*
 * dev_free_slots, and for an nvme folder whose filesystem's space is
 * followed (else *fs_slots is UINT64_MAX): its room (the slots its
 * filesystem and its slab can still take) and, of that, its
 * filesystem's free space, so that folders sharing one filesystem are
 * not counted as having its space each.
 */
uint64_t dev_free_parts(struct tb_dev *d, uint64_t *room, uint64_t *fs_slots);
/*
 * Where d's room comes from, for counting a filesystem that holds several
 * devices once: its filesystem (st_dev of the slab), that filesystem's
 * free space less the reserve, and the slab's own space no slot uses.
 * -errno where the room is not followed (pfs, s3) or cannot be read.
 */
int dev_room_parts(struct tb_dev *d, uint64_t *fs_id, uint64_t *fs_free, uint64_t *slab_free);
/*
 * Give the slab space of slots free since the last look back to the
 * filesystem: the runs are punched, and the slab's end is cut off once
 * every slot past the last in use has given its space back; then the free
 * slots that still have their space are seen, for the next look. Only
 * slots free in the allocator are touched, and those are free as of the
 * durable state (tb.h: locations are freed only after a sync point), so a
 * roll-back after a power cut names none of them. Ends early once *stop
 * is set. Whether free slots with space are left, for a later look. Called
 * by the give-back thread (giveback.c), without the store lock.
 */
bool dev_give_back(struct tb_dev *d, const bool *stop);
/* Down after errors and not yet due for another try: its space is out of reach. */
bool dev_out(struct tb_dev *d);
/* Up: not down, and not being tried again after being down. */
bool dev_up(struct tb_dev *d);
/* Weight for placement: the cap or the capability measured; 0 when down or full. */
double dev_weight(struct tb_dev *d);
/*
 * Blocks a sequential reader of this device should have loaded or in flight
 * ahead of it: 0 for an nvme folder (the caller's readahead= applies), else
 * its capability times its unloaded read latency, twice over, between two
 * placement runs and ra_max. (The average latency would not do: by Little's
 * law it grows with what is in flight, and so with the depth itself.)
 */
unsigned dev_ra_blocks(struct tb_dev *d);
/*
 * Blocks from slot to the end of the run it was written in (its s3 object),
 * itself included: 1 on a device that stores blocks one by one.
 */
unsigned dev_run_left(struct tb_dev *d, uint64_t slot);
/* The deepest readahead for this device; a pfs pool grows to cover it. Before dev_start. */
void dev_set_readahead(struct tb_dev *d, uint64_t ra_max);
void dev_get_stats(struct tb_dev *d, struct tb_dev_stats *st);

/* For engines: requests to start now, within class limits and the cap. */
unsigned dev_take(struct tb_dev *d, struct tb_io **out, unsigned max);
/*
 * A transfer of bytes that started at start ended at now (nanoseconds):
 * update the measured bandwidth and the capability. Lock held. dev_finish
 * calls it; the unit test calls it with times of its own, after setting
 * the queue and in-flight counts it wants the window to see.
 */
void dev_measure(struct tb_dev *d, size_t bytes, uint64_t start, uint64_t now);
/* The queue, in-flight or backlog counts are about to change at now: account the time before. Lock
 * held. */
void dev_load_tick(struct tb_dev *d, uint64_t now);
/* For engines: a transfer ended; true when the request must go again. */
bool dev_finish(struct tb_dev *d, struct tb_io *r, long res);
/* For engines: a health probe's verdict (s3 while down). */
void dev_set_health(struct tb_dev *d, bool up);
/* For engines: put a request back at the head of its queue. */
void dev_requeue(struct tb_dev *d, struct tb_io *r);
/* For engines: nanoseconds until the token bucket allows the next request. */
uint64_t dev_throttle_ns(struct tb_dev *d);
void dev_drain_efd(int efd);
void dev_name_thread(struct tb_dev *d);
/* Raise the calling I/O thread's CPU priority (nice -10), where allowed. */
void dev_io_priority(void);
uint64_t dev_now_ns(void);
/* Allocator and identity of a new device: shared by every kind. */
int dev_init_common(struct tb_dev *d, const char *kind, unsigned index, size_t block_size,
		    unsigned queue_depth, uint64_t bw_cap, const struct dram_arena *arena);

#endif

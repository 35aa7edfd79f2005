/*
 * dev_int.h - what the files of a slab or s3 device share, inside tiers/:
 * the device's constants, in one place, and the few functions one file
 * of the device gives another. Not for callers of a device (dev.h).
 *
 * The files, from the top down; each calls only those below it:
 *   dev_slab.c     a slab folder: its identity, its slab file, opening it, giving space back
 *   dev_engine.c   the engines that move a slab's requests (io_uring, libaio, a thread pool)
 *   dev.c          the queue: classes, the cap, submit, take, finish, lifetime
 *   dev_measure.c  what a device can do and take: health, bandwidth, room, weight, stats
 */
#ifndef TENSORFS_DEV_INT_H
#define TENSORFS_DEV_INT_H

#include "dev.h"

#define SLAB_NAME "tensorfs.slab"
#define ID_NAME "tensorfs.dev"
#define RESERVE_PERCENT 1
#define RESERVE_MIN_BLOCKS 2
#define SLAB_GROW (256ULL << 20)  /* the slab grows ahead of writes by this much */
#define URING_MAX_BUF (1UL << 30) /* a registered buffer is at most 1 GiB */
#define ENGINE_BATCH 256	  /* requests an engine thread takes from its queue at once */
#define BURST_NS 50000000ULL	  /* a capped device may burst 50 ms worth */
#define BW_WINDOW_NS 200000000ULL /* bandwidth is measured over 200 ms windows */
#define BW_EWMA 0.3
#define BW_UNKNOWN 1e9 /* the weight of a device never driven hard, unless it showed more */
#define DOWN_AFTER_ERRORS 3
#define POOL_THREADS_START 16	     /* a pfs pool starts with this many, or the depth if lower */
#define POOL_THREADS_MAX 128	     /* and grows while requests wait, up to the depth */
#define RA_FACTOR 2		     /* readahead: twice latency x bandwidth ahead */
#define RA_LAT_RISE 0.005	     /* the least read latency rises this fraction a read */
#define RA_MIN_RUNS 2		     /* and at least two placement runs (s3 objects) */
#define PLUG_DEVS 8		     /* devices one plugged thread queues for at once */
#define RETRY_DOWN_NS 5000000000ULL  /* a down device is tried again after 5 s */
#define RETRY_FULL_NS 5000000000ULL  /* and one that said ENOSPC, too */
#define ROOM_REFRESH_NS 100000000ULL /* an nvme folder's free space is looked at this often */
#define ROOM_ASYNC_NS 1000000000ULL  /* a pfs folder's, by its pool, this often at most */
#define POOL_LOOK_NS 100000000ULL    /* each pool thread asks whether a look is due this often */

/* dev_measure.c */
/* The free bytes of d's filesystem past the reserve, and its slab's bytes on disk. */
int dev_fs_room(struct tb_dev *d, uint64_t *free_bytes, uint64_t *slab_bytes);
/* A folder's room as its filesystem gives it now, at mount. 0 or -errno. */
int dev_room_first(struct tb_dev *d);
/*
 * A pfs folder: look at its filesystem's room, where it is due
 * (ROOM_ASYNC_NS) and no other thread is looking, the lock dropped while
 * statfs asks the servers. A pool thread calls it, never placement. Lock held.
 */
void dev_room_look(struct tb_dev *d);
/* Say once that d is full (why), and once that it has room again. Lock held. */
void dev_full_note(struct tb_dev *d, bool full, const char *why);
/* A write said ENOSPC: no new blocks for a while. Lock held. */
void dev_full_locked(struct tb_dev *d, uint64_t now);

/* dev.c */
/* Slots of the slab that its file holds, whole or in part. */
uint64_t dev_slab_slots(struct tb_dev *d);
/* Nothing queued or in flight. Lock held. */
bool dev_idle_locked(struct tb_dev *d);

/* dev_engine.c: give a slab device its engine (d->eng, d->priv). 0 or -errno. */
int dev_uring_setup(struct tb_dev *d);
int dev_aio_setup(struct tb_dev *d);
int dev_pool_setup(struct tb_dev *d);

#endif

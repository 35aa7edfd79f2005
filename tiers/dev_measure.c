/*
 * dev_measure.c - what a device can do and what it can take: its health
 * (failures of the last while), its load and measured bandwidth, the room
 * of its filesystem and whether it is full, the slots it hands out, its
 * weight for placement, its readahead depth, and its stats.
 *
 * The measure that placement uses is the device's capability, not its
 * recent rate: a device sent little moves little, and weighing it by that
 * sent it less and less (the s3 tier's share of new blocks fell from 12% to
 * 3% in a 30-minute soak). A 200 ms window in which the device was driven
 * hard for at least half the time (requests waiting in its queue, or half
 * its depth in flight) says what it can do, and moves the capability
 * towards it, up or down; a window in which it was not can only raise it;
 * a window with failures or retries says nothing. Until a device has been
 * driven hard once, what it moved is only a floor, and it weighs at least
 * as much as an unmeasured one: weighed by the little a light load sent
 * it, a new device would never be sent enough to show more.
 *
 * Calls only the slot allocator (alloc.h) and the log: the queue (dev.c)
 * and the engines call it.
 */
#include "dev_int.h"
#include "log.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>

uint64_t dev_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* ---- failures of the last while, for health ---- */

#define HEALTH_BUCKET_NS (HEALTH_WINDOW_S * 1000000000ULL / HEALTH_BUCKETS)

void err_recent_add(struct err_recent *r, uint64_t now_ns)
{
	uint64_t period = now_ns / HEALTH_BUCKET_NS + 1; /* 0: a bucket never used */
	unsigned b = (unsigned)(period % HEALTH_BUCKETS);

	if (r->period[b] != period) {
		r->period[b] = period;
		r->n[b] = 0;
	}
	r->n[b]++;
}

uint64_t err_recent_count(const struct err_recent *r, uint64_t now_ns)
{
	uint64_t period = now_ns / HEALTH_BUCKET_NS + 1, n = 0;

	for (unsigned b = 0; b < HEALTH_BUCKETS; b++)
		if (r->period[b] && period - r->period[b] < HEALTH_BUCKETS)
			n += r->n[b];
	return n;
}

static unsigned inflight_total(const struct tb_dev *d)
{
	unsigned n = 0;

	for (int c = 0; c < IO_NCLASS; c++)
		n += d->inflight[c];
	return n;
}

/* Requests wait for it (in its queue, or in its engine), or half its depth is in flight. Lock held.
 */
static bool driven_hard(const struct tb_dev *d)
{
	if (d->backlog)
		return true;
	for (int c = 0; c < IO_NCLASS; c++)
		if (d->head[c])
			return true;
	return inflight_total(d) * 2 >= d->qd;
}

void dev_load_tick(struct tb_dev *d, uint64_t now)
{
	uint64_t from = d->load_ns > d->bw_window_ns ? d->load_ns : d->bw_window_ns;

	if (d->load_ns && now > d->load_ns && inflight_total(d))
		d->active_ns += now - d->load_ns;

	if (d->load_ns && now > from && driven_hard(d))
		d->busy_ns += now - from;
	d->load_ns = now;
}

/*
 * Bytes per second over windows in which the device moved data. A window
 * starts again after a gap of a window or more between one transfer's end
 * and the next one's start: the device sat idle, or was down, and that time
 * says nothing of its speed. (Counted, an outage of the s3 tier dragged its
 * measure down so far that placement sent it almost nothing afterwards.)
 * bw_measured is the moving average of every window; bw_capable, the
 * weight, follows only the windows that were driven hard, and rises with
 * any other window that moved more than it.
 */
void dev_measure(struct tb_dev *d, size_t bytes, uint64_t start, uint64_t now)
{
	if (!d->bw_window_ns || start >= d->bw_last_ns + BW_WINDOW_NS) {
		d->bw_window_ns = start;
		d->bw_window_bytes = 0;
		d->busy_ns = 0;
		d->window_errors = d->errors + d->retries;
		if (d->load_ns < start)
			d->load_ns = start;
	}
	dev_load_tick(d, now);
	d->bw_last_ns = now;
	d->bw_window_bytes += bytes;
	if (now - d->bw_window_ns < BW_WINDOW_NS)
		return;
	double span = (double)(now - d->bw_window_ns);
	double rate = (double)d->bw_window_bytes * 1e9 / span;
	bool hard = (double)d->busy_ns * 2 >= span;
	bool troubled = d->errors + d->retries != d->window_errors;

	d->bw_measured = d->bw_measured ? BW_EWMA * rate + (1 - BW_EWMA) * d->bw_measured : rate;
	if (!troubled && hard) {
		d->bw_capable = d->bw_known ? BW_EWMA * rate + (1 - BW_EWMA) * d->bw_capable : rate;
		d->bw_known = true;
	} else if (!troubled && rate > d->bw_capable)
		d->bw_capable = rate;
	d->bw_window_ns = now;
	d->bw_window_bytes = 0;
	d->busy_ns = 0;
	d->window_errors = d->errors + d->retries;
}

/*
 * The bytes of d's filesystem it may still take, past the reserve left to
 * the metadata store (which may share it: meta= inside the folder), and
 * the bytes its slab file holds on disk. -errno when it cannot be looked at.
 */
int dev_fs_room(struct tb_dev *d, uint64_t *free_bytes, uint64_t *slab_bytes)
{
	struct statvfs vfs;
	struct stat st;
	uint64_t fs_bytes, avail, reserve;

	if (fstatvfs(d->fd, &vfs) < 0 || fstat(d->fd, &st) < 0)
		return -errno;
	fs_bytes = (uint64_t)vfs.f_blocks * vfs.f_frsize;
	avail = (uint64_t)vfs.f_bavail * vfs.f_frsize;
	reserve = fs_bytes / 100 * RESERVE_PERCENT;
	if (reserve < RESERVE_MIN_BLOCKS * d->block_size)
		reserve = RESERVE_MIN_BLOCKS * d->block_size;
	*free_bytes = avail > reserve ? avail - reserve : 0;
	*slab_bytes = (uint64_t)st.st_blocks * 512;
	return 0;
}

/*
 * Say once that d is full (no new block fits: why), and once that it has
 * room again; at most once in 10 s each, should it go to and fro. Lock held.
 */
void dev_full_note(struct tb_dev *d, bool full, const char *why)
{
	if (full == d->said_full)
		return;
	d->said_full = full;
	if (full && log_ratelimit(&d->full_log_sec, 10))
		log_err("%s (%s): full (%s); new blocks go to other devices while it is, and "
			"dirty data waits in DRAM",
			d->name, d->where, why);
	if (!full && log_ratelimit(&d->room_log_sec, 10))
		log_info("%s (%s): has room again; new blocks go there", d->name, d->where);
}

/* What the filesystem said, when alloc.used was used. Lock held. */
static void room_store(struct tb_dev *d, uint64_t free_bytes, uint64_t slab_bytes, uint64_t used)
{
	uint64_t slab_slots = slab_bytes / d->block_size;

	d->room_fs_slots = free_bytes / d->block_size;
	d->room_slots = d->room_fs_slots + (slab_slots > used ? slab_slots - used : 0);
	d->room_used = used;
	dev_full_note(d, d->full || !d->room_slots, "its filesystem has no room left");
}

/*
 * The slots d can take without its filesystem running out: the free
 * space (dev_fs_room) and the slab's own space that no slot uses. Looked at
 * every ROOM_REFRESH_NS at most, and counted down by the slots taken
 * since; a pfs folder's by its pool (dev_room_look), not here. The
 * capacity set at mount holds where there is no filesystem (s3:
 * UINT64_MAX). Lock held.
 */
static uint64_t room_locked(struct tb_dev *d, uint64_t now)
{
	uint64_t free_bytes, slab_bytes, taken;

	if (!d->track_room)
		return UINT64_MAX;
	if (!d->room_async && (!d->room_ns || now - d->room_ns >= ROOM_REFRESH_NS)) {
		d->room_ns = now;
		if (dev_fs_room(d, &free_bytes, &slab_bytes) == 0)
			room_store(d, free_bytes, slab_bytes, d->alloc.used);
	}
	taken = d->alloc.used > d->room_used ? d->alloc.used - d->room_used : 0;
	if (d->alloc.used < d->room_used)
		return d->room_slots + (d->room_used - d->alloc.used); /* slots freed since */
	return d->room_slots > taken ? d->room_slots - taken : 0;
}

int dev_room_first(struct tb_dev *d)
{
	uint64_t free_bytes, slab_bytes;
	int ret = dev_fs_room(d, &free_bytes, &slab_bytes);

	pthread_mutex_lock(&d->lock);
	if (ret == 0) {
		room_store(d, free_bytes, slab_bytes, d->alloc.used);
		d->room_ns = dev_now_ns();
	}
	pthread_mutex_unlock(&d->lock);
	return ret;
}

void dev_room_look(struct tb_dev *d)
{
	uint64_t free_bytes, slab_bytes, used = d->alloc.used;
	int ret;

	if (!d->room_async || d->room_busy ||
	    (d->room_ns && dev_now_ns() - d->room_ns < ROOM_ASYNC_NS))
		return;
	d->room_busy = true;
	pthread_mutex_unlock(&d->lock);
	ret = dev_fs_room(d, &free_bytes, &slab_bytes);
	pthread_mutex_lock(&d->lock);
	d->room_busy = false;
	d->room_ns = dev_now_ns();
	/* Slots taken while it looked count as taken since: never more room than there is. */
	if (ret == 0)
		room_store(d, free_bytes, slab_bytes, used);
}

/*
 * A write said ENOSPC: no new blocks go here until RETRY_FULL_NS has
 * passed (then one probes it) or its filesystem shows more room than now
 * (usable). Said once, and once again when a write succeeds. Lock held.
 */
void dev_full_locked(struct tb_dev *d, uint64_t now)
{
	d->room_ns = 0; /* look again */
	d->full_room = room_locked(d, now);
	d->full_ns = now;
	d->full = true;
	dev_full_note(d, true, "a write said: No space left on device");
}

/*
 * A down device takes new blocks again once RETRY_DOWN_NS has passed since
 * its last failure: the next write is the probe. So does a full one after
 * RETRY_FULL_NS, or as soon as its filesystem shows more room than when it
 * filled: its filesystem may be shared, and others free space too. One
 * whose filesystem has no room left takes none. Lock held.
 */
static bool usable(struct tb_dev *d)
{
	uint64_t now = dev_now_ns(), room = room_locked(d, now);

	if (room == 0)
		return false;
	if (d->full && now - d->full_ns < RETRY_FULL_NS && room <= d->full_room)
		return false;
	return d->health == DEV_UP || now - d->down_ns >= RETRY_DOWN_NS;
}

/* Slots it can take now, whatever usable says. Lock held. */
static uint64_t free_locked(struct tb_dev *d)
{
	uint64_t n = d->alloc.used + d->held_slots >= d->alloc.nslots
			 ? 0
			 : d->alloc.nslots - d->alloc.used - d->held_slots;
	uint64_t room = room_locked(d, dev_now_ns());

	return n < room ? n : room;
}

int dev_alloc(struct tb_dev *d, uint64_t *slot)
{
	int64_t s;
	int ret = 0;

	pthread_mutex_lock(&d->lock);
	if (!usable(d))
		ret = -ENOSPC;
	else if (d->eng && d->eng->alloc)
		ret = d->eng->alloc(d, slot);
	else if ((s = slot_alloc_get(&d->alloc)) < 0)
		ret = (int)s;
	else
		*slot = (uint64_t)s;
	pthread_mutex_unlock(&d->lock);
	return ret;
}

/* Lock held. */
static void put_locked(struct tb_dev *d, uint64_t slot)
{
	if (d->eng && d->eng->free)
		d->eng->free(d, slot);
	else if (slot_alloc_put(&d->alloc, slot) < 0)
		log_err("%s: freeing slot %llu that is not in use", d->name,
			(unsigned long long)slot);
}

/*
 * A slot freed is room where the device's room is followed (room_locked
 * sees it). Where it is not (s3), a full device waits for RETRY_FULL_NS
 * all the same: freed, a slot may still find no room (a pfs folder's did,
 * given back to its filesystem and taken there by another writer, when
 * its room was not followed), and a device that took blocks at every free
 * said ENOSPC to them each time.
 */
void dev_free(struct tb_dev *d, uint64_t slot)
{
	pthread_mutex_lock(&d->lock);
	put_locked(d, slot);
	pthread_mutex_unlock(&d->lock);
}

/*
 * A slot whose write failed goes back, and is no sign of room: its write
 * may be what said ENOSPC. Where the room is followed, the room seen
 * stays what it was (room_used goes down with alloc.used), until the
 * filesystem is looked at again. Freed as room, it made a full device
 * usable at once, for the block to fail there again, and an fsync saw
 * ENOSPC while another device had room.
 */
void dev_unplace(struct tb_dev *d, uint64_t slot)
{
	uint64_t used;

	pthread_mutex_lock(&d->lock);
	used = d->alloc.used;
	put_locked(d, slot);
	if (d->track_room && d->alloc.used < used && d->room_used >= used - d->alloc.used)
		d->room_used -= used - d->alloc.used;
	pthread_mutex_unlock(&d->lock);
}

int dev_mark(struct tb_dev *d, uint64_t slot)
{
	int ret;

	pthread_mutex_lock(&d->lock);
	ret = d->eng && d->eng->mark ? d->eng->mark(d, slot) : slot_alloc_mark(&d->alloc, slot);
	pthread_mutex_unlock(&d->lock);
	return ret;
}

uint64_t dev_free_slots(struct tb_dev *d)
{
	uint64_t n;

	pthread_mutex_lock(&d->lock);
	n = usable(d) ? free_locked(d) : 0;
	pthread_mutex_unlock(&d->lock);
	return n;
}

uint64_t dev_free_parts(struct tb_dev *d, uint64_t *room, uint64_t *fs_slots)
{
	uint64_t n;

	pthread_mutex_lock(&d->lock);
	n = usable(d) ? free_locked(d) : 0;
	*room = room_locked(d, dev_now_ns());
	*fs_slots = d->track_room && d->fd >= 0 ? d->room_fs_slots : UINT64_MAX;
	pthread_mutex_unlock(&d->lock);
	return n;
}

int dev_room_parts(struct tb_dev *d, uint64_t *fs_id, uint64_t *fs_free, uint64_t *slab_free)
{
	struct stat st;
	uint64_t slab_bytes, slab_slots;
	int ret;

	pthread_mutex_lock(&d->lock);
	if (d->room_async && d->fd >= 0) {
		/* What the pool last saw: its filesystem is not asked here (dev_room_look). */
		*fs_free = d->room_fs_slots * d->block_size;
		*slab_free = (d->room_slots - d->room_fs_slots) * d->block_size;
		*fs_id = d->fs_dev;
		pthread_mutex_unlock(&d->lock);
		return 0;
	}
	if (!d->track_room || d->fd < 0 || fstat(d->fd, &st) < 0) {
		pthread_mutex_unlock(&d->lock);
		return -ENOTSUP;
	}
	ret = dev_fs_room(d, fs_free, &slab_bytes);
	if (ret == 0) {
		slab_slots = slab_bytes / d->block_size;
		*slab_free = (slab_slots > d->alloc.used ? slab_slots - d->alloc.used : 0) *
			     d->block_size;
		*fs_id = (uint64_t)st.st_dev;
	}
	pthread_mutex_unlock(&d->lock);
	return ret;
}

bool dev_out(struct tb_dev *d)
{
	bool out;

	pthread_mutex_lock(&d->lock);
	out = d->health == DEV_DOWN && dev_now_ns() - d->down_ns < RETRY_DOWN_NS;
	pthread_mutex_unlock(&d->lock);
	return out;
}

/* Lock held. */
static double weight_locked(struct tb_dev *d)
{
	double w;

	if (!usable(d) || !free_locked(d)) {
		w = 0;
	} else if (d->health == DEV_DOWN) {
		w = 1; /* probing: the smallest share until it answers */
	} else {
		/*
		 * A cap from the config wins over the measure. The measure is
		 * the capability (see dev_measure), not the recent rate, which
		 * is only the share the device was sent when the writer is the
		 * bottleneck. Unmeasured devices start equal.
		 */
		if (d->bw_cap)
			w = (double)d->bw_cap;
		else if (!d->bw_known && d->bw_capable < BW_UNKNOWN)
			w = BW_UNKNOWN;
		else
			w = d->bw_capable;
	}
	return w;
}

bool dev_up(struct tb_dev *d)
{
	bool up;

	pthread_mutex_lock(&d->lock);
	up = d->health == DEV_UP;
	pthread_mutex_unlock(&d->lock);
	return up;
}

double dev_weight(struct tb_dev *d)
{
	double w;

	pthread_mutex_lock(&d->lock);
	w = weight_locked(d);
	pthread_mutex_unlock(&d->lock);
	return w;
}

unsigned dev_ra_blocks(struct tb_dev *d)
{
	uint64_t bytes, lo, hi;

	if (strcmp(d->kind, "nvme") == 0 || !d->ra_max)
		return 0;
	pthread_mutex_lock(&d->lock);
	hi = d->ra_max;
	lo = (uint64_t)RA_MIN_RUNS * d->run * d->block_size;
	if (d->bw_capable > 0 && d->read_lat_min_ns > 0)
		bytes = (uint64_t)(RA_FACTOR * d->bw_capable * d->read_lat_min_ns / 1e9);
	else
		bytes = hi; /* not measured yet: the deepest */
	pthread_mutex_unlock(&d->lock);
	if (bytes > hi)
		bytes = hi;
	if (bytes < lo)
		bytes = lo;
	/* Whole runs: a reader's window ends on an object's end where it can. */
	bytes = (bytes + d->run * d->block_size - 1) / (d->run * d->block_size) * d->run *
		d->block_size;
	return (unsigned)(bytes / d->block_size);
}

unsigned dev_run_left(struct tb_dev *d, uint64_t slot)
{
	unsigned left;

	if (d->run <= 1)
		return 1;
	pthread_mutex_lock(&d->lock);
	left = d->eng->run_left ? d->eng->run_left(d, slot) : d->run - (unsigned)(slot % d->run);
	pthread_mutex_unlock(&d->lock);
	return left;
}

void dev_set_readahead(struct tb_dev *d, uint64_t ra_max)
{
	d->ra_max = ra_max;
	/* A pool deep enough for a reader's whole window (see pool_kick). */
	if (strcmp(d->kind, "pfs") == 0 && ra_max / d->block_size > d->qd)
		d->qd =
		    (unsigned)(ra_max / d->block_size < POOL_THREADS_MAX ? ra_max / d->block_size
									 : POOL_THREADS_MAX);
}

void dev_get_stats(struct tb_dev *d, struct tb_dev_stats *st)
{
	struct stat sb;
	uint64_t ra = (uint64_t)dev_ra_blocks(d) * d->block_size;

	pthread_mutex_lock(&d->lock);
	st->readahead_bytes = ra;
	snprintf(st->name, sizeof(st->name), "%s", d->name);
	snprintf(st->path, sizeof(st->path), "%s", d->where);
	st->kind = d->kind;
	st->engine = d->eng ? d->eng->name : "none";
	st->capacity = d->alloc.nslots * d->block_size;
	st->used = d->alloc.used * d->block_size;
	st->read_bytes = d->read_bytes;
	st->write_bytes = d->write_bytes;
	st->read_ops = d->read_ops;
	st->write_ops = d->write_ops;
	st->errors = d->errors;
	st->inflight_demand = d->inflight[IO_DEMAND];
	st->inflight_prefetch = d->inflight[IO_PREFETCH];
	st->inflight_wb = d->inflight[IO_WB];
	dev_load_tick(d, dev_now_ns());
	st->active_ns = d->active_ns;
	st->queued = d->queued_reads;
	for (struct tb_io *r = d->head[IO_WB]; r; r = r->next)
		st->queued++;
	st->bw_cap = d->bw_cap;
	st->bw_measured = (uint64_t)d->bw_measured;
	st->bw_capable = (uint64_t)d->bw_capable;
	st->weight = weight_locked(d);
	st->read_latency_us = (uint64_t)(d->read_lat_ns / 1000);
	st->requests = d->requests ? d->requests : d->read_ops + d->write_ops;
	st->objects = d->objects;
	st->dead_bytes = d->dead_bytes;
	st->compacted_objects = d->compacted_objects;
	st->compacted_bytes = d->compacted_bytes;
	st->returned_bytes = d->returned_bytes;
	st->up = d->health == DEV_UP;
	st->avail = free_locked(d) * d->block_size;
	st->full = d->full || !st->avail;
	st->recent_errors = err_recent_count(&d->recent, dev_now_ns());
	st->unanswered_ms = 0;
	if (st->inflight_demand + st->inflight_prefetch + st->inflight_wb) {
		uint64_t now = dev_now_ns();

		st->unanswered_ms = now > d->answer_ns ? (now - d->answer_ns) / 1000000 : 0;
	}
	pthread_mutex_unlock(&d->lock);
	if (d->fd >= 0 && !d->eng->alloc && fstat(d->fd, &sb) == 0)
		st->slab_bytes = (uint64_t)sb.st_blocks * 512;
}

/*
 * dev.c - devices of the persistent tiers: the queue, the classes, the
 * caps, health, and the slab engines (uring, aio, threads).
 *
 * Producers push requests onto per-class queues under the device lock and
 * kick an eventfd. The engine's thread takes them with dev_take, which
 * applies the class limits (write-back keeps a quarter of the depth while
 * reads want the device) and the bandwidth cap, and hands each finished
 * transfer to dev_finish, which resubmits the rest of a short transfer,
 * counts, measures bandwidth, tracks health and calls the completion.
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
 * A slab device is a folder holding `tensorfs.slab`, a file of block-size
 * slots, and `tensorfs.dev`, which binds the folder to the store and to
 * its position so that reordered or foreign folders are caught at mount.
 * The folder and both files are checked against other users (storedir.h)
 * and opened through one descriptor of the folder.
 * Capacity is the filesystem's free space plus what the slab holds, less
 * a 1% reserve for the metadata store, or the cap if smaller. Space free
 * in the slab for a while goes back to the filesystem (dev_give_back): a
 * free end is cut off, free runs within are punched, and a write into a
 * punched slot allocates its run again first, as the slab's growth does.
 */
#include "dev.h"
#include "fault.h"
#include "log.h"
#include "storedir.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <liburing.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#define SLAB_NAME "tensorfs.slab"
#define ID_NAME "tensorfs.dev"
#define RESERVE_PERCENT 1
#define RESERVE_MIN_BLOCKS 2
#define SLAB_GROW (256ULL << 20) /* the slab grows ahead of writes by this much */
#define URING_MAX_BUF (1UL << 30) /* a registered buffer is at most 1 GiB */
#define ENGINE_BATCH 256	  /* requests an engine thread takes from its queue at once */
#define BURST_NS 50000000ULL	  /* a capped device may burst 50 ms worth */
#define BW_WINDOW_NS 200000000ULL /* bandwidth is measured over 200 ms windows */
#define BW_EWMA 0.3
#define BW_UNKNOWN 1e9 /* the weight of a device never driven hard, unless it showed more */
#define DOWN_AFTER_ERRORS 3
#define POOL_THREADS_START 16	    /* a pfs pool starts with this many, or the depth if lower */
#define POOL_THREADS_MAX 128	    /* and grows while requests wait, up to the depth */
#define RA_FACTOR 2		    /* readahead: twice latency x bandwidth ahead */
#define RA_LAT_RISE 0.005	    /* the least read latency rises this fraction a read */
#define RA_MIN_RUNS 2		    /* and at least two placement runs (s3 objects) */
#define PLUG_DEVS 8		    /* devices one plugged thread queues for at once */
#define RETRY_DOWN_NS 5000000000ULL /* a down device is tried again after 5 s */
#define RETRY_FULL_NS 5000000000ULL /* and one that said ENOSPC, too */
#define ROOM_REFRESH_NS 100000000ULL /* an nvme folder's free space is looked at this often */

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

static void dev_err(char *err, size_t errlen, const char *fmt, const char *dir, int e)
{
	char what[600];

	snprintf(what, sizeof(what), fmt, dir);
	snprintf(err, errlen, "%s: %s", what, strerror(e));
}

/* ---- the generic device ---- */

int dev_init_common(struct tb_dev *d, const char *kind, unsigned index, size_t block_size,
		    unsigned queue_depth, uint64_t bw_cap, const struct dram_arena *arena)
{
	d->kind = kind;
	d->index = index;
	d->fd = -1;
	d->dir_fd = -1;
	d->block_size = block_size;
	d->qd = queue_depth;
	d->arena = arena;
	d->bw_cap = bw_cap;
	d->tokens = (double)bw_cap * BURST_NS / 1e9;
	d->tokens_ns = dev_now_ns();
	d->health = DEV_UP;
	d->run = 1;
	if (fault_init() < 0)
		return -EINVAL; /* a test build given a bad rule: logged */
	/* nvme folders are numbered; remotes are named by kind (s3, pfs, pfs2...). */
	if (strcmp(kind, "nvme") == 0)
		snprintf(d->name, sizeof(d->name), "%s%u", kind, index);
	else
		snprintf(d->name, sizeof(d->name), "%s", kind);
	pthread_mutex_init(&d->lock, NULL);
	d->wake_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	return d->wake_efd < 0 ? -errno : 0;
}

static void refill(struct tb_dev *d, uint64_t now)
{
	double burst = (double)d->bw_cap * BURST_NS / 1e9;

	if (burst < (double)d->block_size)
		burst = (double)d->block_size;
	d->tokens += (double)(now - d->tokens_ns) * (double)d->bw_cap / 1e9;
	if (d->tokens > burst)
		d->tokens = burst;
	d->tokens_ns = now;
}

uint64_t dev_throttle_ns(struct tb_dev *d)
{
	uint64_t ns = 0;

	pthread_mutex_lock(&d->lock);
	if (d->bw_cap && d->tokens <= 0)
		ns = (uint64_t)(-d->tokens * 1e9 / (double)d->bw_cap) + 1000;
	pthread_mutex_unlock(&d->lock);
	return ns;
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

/* Slots of the slab that its file holds, whole or in part. */
static uint64_t slab_slots(struct tb_dev *d)
{
	uint64_t end = __atomic_load_n(&d->slab_end, __ATOMIC_RELAXED);

	return (end + d->block_size - 1) / d->block_size;
}

/*
 * A write to slot is taken: where its space was given back, the run of
 * given-back slots from it (SLAB_GROW at most) is allocated again before
 * the write (slab_fill), as slab_grow does at the end. Into a hole, an
 * O_DIRECT write takes the inode lock exclusively (see slab_grow): the
 * writes of a run would go one at a time. Lock held.
 */
static uint64_t fill_run(struct tb_dev *d, uint64_t slot)
{
	uint64_t n;

	if (!d->give_back)
		return 0;
	n = slot_alloc_fill(&d->alloc, slot, SLAB_GROW / d->block_size, slab_slots(d));
	return d->prealloc ? n : 0;
}

static unsigned take_requests(struct tb_dev *d, struct tb_io **out, unsigned max)
{
	unsigned n = 0, total = 0;
	uint64_t now = dev_now_ns();

	pthread_mutex_lock(&d->lock);
	dev_load_tick(d, now);
	if (d->bw_cap)
		refill(d, now);
	for (int c = 0; c < IO_NCLASS; c++)
		total += d->inflight[c];
	for (int c = 0; c < IO_NCLASS && total < d->qd && n < max; c++) {
		unsigned limit = d->qd;

		/* Write-back keeps a quarter of the depth once reads want the device. */
		if (c == IO_WB &&
		    (d->queued_reads || d->inflight[IO_DEMAND] || d->inflight[IO_PREFETCH]))
			limit = d->qd / 4 ? d->qd / 4 : 1;
		while (d->head[c] && total < d->qd && n < max && d->inflight[c] < limit) {
			struct tb_io *r = d->head[c];

			/*
			 * Under a cap, the rest of a run (an s3 object's blocks,
			 * queued together) goes with its first block, in debt
			 * that the bucket pays back: taken a block at a time,
			 * each was its own GET.
			 */
			if (d->bw_cap && d->tokens <= 0 &&
			    !(n && d->run > 1 && r->slot / d->run == out[n - 1]->slot / d->run))
				goto out;
			d->head[c] = r->next;
			if (!d->head[c])
				d->tail[c] = NULL;
			if (r->op == IO_READ)
				d->queued_reads--;
			d->inflight[c]++;
			d->tokens -= (double)(r->len - r->done_bytes);
			r->fill = r->op == IO_WRITE ? fill_run(d, r->slot) : 0;
			r->start_ns = now;
			total++;
			out[n++] = r;
		}
	}
out:
	pthread_mutex_unlock(&d->lock);
	return n;
}

/*
 * Test builds: a request that fault injection fails is finished here with
 * its error, before the medium sees it; the others stay in out[], in order.
 */
static unsigned inject_faults(struct tb_dev *d, struct tb_io **out, unsigned n)
{
	unsigned kept = 0;

	for (unsigned i = 0; i < n; i++) {
		struct tb_io *r = out[i];
		enum fault_point at = r->op == IO_READ ? FAULT_READ : FAULT_WRITE;
		int err = fault_inject(d->name, at, r->slot);

		if (err)
			dev_finish(d, r, err);
		else
			out[kept++] = r;
	}
	return kept;
}

unsigned dev_take(struct tb_dev *d, struct tb_io **out, unsigned max)
{
	unsigned got, n;

	/*
	 * When every request taken was failed, take again: the engine would
	 * otherwise sleep with requests queued and none in flight to wake it.
	 */
	do {
		got = take_requests(d, out, max);
		n = inject_faults(d, out, got);
	} while (got && !n);
	return n;
}

static bool dev_idle_locked(struct tb_dev *d)
{
	for (int c = 0; c < IO_NCLASS; c++)
		if (d->head[c] || d->inflight[c])
			return false;
	return true;
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
static int fs_room(struct tb_dev *d, uint64_t *free_bytes, uint64_t *slab_bytes)
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
 * The slots d can take without its filesystem running out: the free
 * space (fs_room) and the slab's own space that no slot uses. Looked at
 * every ROOM_REFRESH_NS at most, and counted down by the slots taken
 * since. The capacity set at mount holds where the filesystem's space is
 * not followed (pfs, s3: UINT64_MAX). Lock held.
 */
/*
 * Say once that d is full (no new block fits: why), and once that it has
 * room again; at most once in 10 s each, should it go to and fro. Lock held.
 */
static void full_note(struct tb_dev *d, bool full, const char *why)
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

static uint64_t room_locked(struct tb_dev *d, uint64_t now)
{
	uint64_t free_bytes, slab_bytes, slab_slots, taken;

	if (!d->track_room)
		return UINT64_MAX;
	if (!d->room_ns || now - d->room_ns >= ROOM_REFRESH_NS) {
		d->room_ns = now;
		if (fs_room(d, &free_bytes, &slab_bytes) == 0) {
			slab_slots = slab_bytes / d->block_size;
			d->room_slots =
			    free_bytes / d->block_size +
			    (slab_slots > d->alloc.used ? slab_slots - d->alloc.used : 0);
			d->room_used = d->alloc.used;
			full_note(d, d->full || !d->room_slots, "its filesystem has no room left");
		}
	}
	taken = d->alloc.used > d->room_used ? d->alloc.used - d->room_used : 0;
	if (d->alloc.used < d->room_used)
		return d->room_slots + (d->room_used - d->alloc.used); /* slots freed since */
	return d->room_slots > taken ? d->room_slots - taken : 0;
}

/*
 * A write said ENOSPC: no new blocks go here until RETRY_FULL_NS has
 * passed (then one probes it) or its filesystem shows more room than now
 * (usable). Said once, and once again when a write succeeds. Lock held.
 */
static void full_locked(struct tb_dev *d, uint64_t now)
{
	d->room_ns = 0; /* look again */
	d->full_room = room_locked(d, now);
	d->full_ns = now;
	d->full = true;
	full_note(d, true, "a write said: No space left on device");
}

bool dev_finish(struct tb_dev *d, struct tb_io *r, long res)
{
	int err = 0;

	if (res > 0 && (size_t)res < r->len - r->done_bytes) {
		r->done_bytes += (size_t)res;
		return true;
	}
	if (res == 0)
		err = -EIO; /* past the end of the slab: never written */
	else if (res < 0)
		err = (int)res;
	uint64_t now = dev_now_ns();

	pthread_mutex_lock(&d->lock);
	dev_load_tick(d, now);
	d->inflight[r->cls]--;
	if (err) {
		d->errors++;
		err_recent_add(&d->recent, now);
		/*
		 * ENOSPC: full, not failing. No new blocks are placed here for a
		 * while (full_locked); counted towards down, a full device would
		 * turn its writers' ENOSPC into EIO (no_space_err).
		 */
		if (err == -ENOSPC && r->op == IO_WRITE)
			full_locked(d, now);
		if (err != -ENOSPC && d->health == DEV_DOWN)
			d->down_ns = dev_now_ns(); /* a retry failed: wait again */
		if (err != -ENOSPC && ++d->consecutive_errors >= DOWN_AFTER_ERRORS &&
		    d->health == DEV_UP) {
			d->health = DEV_DOWN;
			d->down_ns = dev_now_ns();
			log_err("%s (%s): down after %u errors in a row; no new blocks go there",
				d->name, d->where, d->consecutive_errors);
		}
		if (log_ratelimit(&d->err_log_sec, 10))
			log_err("%s: %s of slot %llu failed: %s", d->name,
				r->op == IO_READ ? "read" : "write", (unsigned long long)r->slot,
				strerror(-err));
	} else {
		if (d->health == DEV_DOWN)
			log_info("%s (%s): up again", d->name, d->where);
		if (d->full && r->op == IO_WRITE) {
			d->full = false;
			full_note(d, false, NULL);
		}
		d->health = DEV_UP;
		d->consecutive_errors = 0;
		if (r->op == IO_READ) {
			double lat = (double)(now - r->start_ns);

			d->read_bytes += r->len;
			d->read_ops++;
			d->read_lat_ns =
			    d->read_lat_ns ? BW_EWMA * lat + (1 - BW_EWMA) * d->read_lat_ns : lat;
			if (!d->read_lat_min_ns || lat < d->read_lat_min_ns)
				d->read_lat_min_ns = lat;
			else
				d->read_lat_min_ns += RA_LAT_RISE * (lat - d->read_lat_min_ns);
		} else {
			d->write_bytes += r->len;
			d->write_ops++;
		}
		dev_measure(d, r->len, r->start_ns, now);
	}
	pthread_mutex_unlock(&d->lock);
	r->done(r, err);
	return false;
}

void dev_set_health(struct tb_dev *d, bool up)
{
	pthread_mutex_lock(&d->lock);
	if (up && d->health == DEV_DOWN)
		log_info("%s (%s): up again", d->name, d->where);
	if (!up && d->health == DEV_UP) {
		log_err("%s (%s): down; no new blocks go there", d->name, d->where);
		d->down_ns = dev_now_ns();
	}
	d->health = up ? DEV_UP : DEV_DOWN;
	if (up)
		d->consecutive_errors = 0;
	pthread_mutex_unlock(&d->lock);
}

void dev_requeue(struct tb_dev *d, struct tb_io *r)
{
	pthread_mutex_lock(&d->lock);
	dev_load_tick(d, dev_now_ns());
	d->inflight[r->cls]--;
	r->next = d->head[r->cls];
	d->head[r->cls] = r;
	if (!d->tail[r->cls])
		d->tail[r->cls] = r;
	if (r->op == IO_READ)
		d->queued_reads++;
	pthread_mutex_unlock(&d->lock);
}

/*
 * The threads that keep the devices busy, each device's and the flusher,
 * use little CPU but gate every byte that reaches a drive: one that waits
 * for a CPU behind the FUSE threads' copies leaves its drive idle. On 2
 * cores fio's overwrite through dram= a quarter of the file ran 16% slower
 * with them at the default weight than at this one (docs/benchmarks.md).
 * Raising it takes CAP_SYS_NICE; without, they keep the default, and the
 * log says so once.
 */
#define IO_THREAD_NICE (-10)

void dev_io_priority(void)
{
	static bool told;

	if (setpriority(PRIO_PROCESS, (id_t)gettid(), IO_THREAD_NICE) == 0)
		return;
	if (!__atomic_exchange_n(&told, true, __ATOMIC_RELAXED))
		log_info("I/O threads keep the default priority: nice %d: %s", IO_THREAD_NICE,
			 strerror(errno));
}

/* Name the device's thread ("tfs-" and the device's name, 15 characters at most) and raise it. */
void dev_name_thread(struct tb_dev *d)
{
	char tname[16];

	memcpy(tname, "tfs-", 4);
	snprintf(tname + 4, sizeof(tname) - 4, "%.11s", d->name);
	pthread_setname_np(pthread_self(), tname);
	dev_io_priority();
}

void dev_drain_efd(int efd)
{
	uint64_t v;

	while (read(efd, &v, sizeof(v)) == sizeof(v))
		;
}

static void kick_efd(struct tb_dev *d)
{
	uint64_t one = 1;

	if (write(d->wake_efd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		log_err("%s: cannot wake the I/O thread: %s", d->name, strerror(errno));
}

/* Queue a chain of requests (linked by next) on their class queues. */
static void queue_chain(struct tb_dev *d, struct tb_io *r)
{
	pthread_mutex_lock(&d->lock);
	dev_load_tick(d, dev_now_ns());
	while (r) {
		struct tb_io *next = r->next;

		r->next = NULL;
		if (d->tail[r->cls])
			d->tail[r->cls]->next = r;
		else
			d->head[r->cls] = r;
		d->tail[r->cls] = r;
		if (r->op == IO_READ)
			d->queued_reads++;
		r = next;
	}
	pthread_mutex_unlock(&d->lock);
	if (d->eng->kick)
		d->eng->kick(d);
	else
		kick_efd(d);
}

/*
 * A plugged thread's requests, per device, queued at once when it unplugs:
 * the engine then sees a reader's run of blocks together and can serve
 * neighbours with one transfer (an s3 ranged GET), as the block layer's
 * plug lets an elevator merge.
 */
static __thread struct {
	unsigned depth, n;
	struct {
		struct tb_dev *d;
		struct tb_io *head, *tail;
	} q[PLUG_DEVS];
} plug;

static void plug_flush(void)
{
	unsigned n = plug.n;

	plug.n = 0;
	for (unsigned i = 0; i < n; i++)
		queue_chain(plug.q[i].d, plug.q[i].head);
}

void tb_plug(void)
{
	plug.depth++;
}

void tb_unplug(void)
{
	if (plug.depth && --plug.depth == 0)
		plug_flush();
}

void dev_submit(struct tb_dev *d, struct tb_io *r)
{
	unsigned i;

	r->next = NULL;
	r->done_bytes = 0;
	if (!plug.depth) {
		queue_chain(d, r);
		return;
	}
	for (i = 0; i < plug.n && plug.q[i].d != d; i++)
		;
	if (i == PLUG_DEVS) {
		plug_flush();
		i = 0;
	}
	if (i == plug.n) {
		plug.q[i].d = d;
		plug.q[i].head = plug.q[i].tail = NULL;
		plug.n++;
	}
	if (plug.q[i].tail)
		plug.q[i].tail->next = r;
	else
		plug.q[i].head = r;
	plug.q[i].tail = r;
}

bool dev_promote(struct tb_dev *d, struct tb_io *r)
{
	struct tb_io **pp, *prev = NULL;
	bool found = false;

	pthread_mutex_lock(&d->lock);
	for (pp = &d->head[IO_PREFETCH]; *pp; prev = *pp, pp = &(*pp)->next) {
		if (*pp != r)
			continue;
		*pp = r->next;
		if (d->tail[IO_PREFETCH] == r)
			d->tail[IO_PREFETCH] = prev;
		r->next = NULL;
		r->cls = IO_DEMAND;
		if (d->tail[IO_DEMAND])
			d->tail[IO_DEMAND]->next = r;
		else
			d->head[IO_DEMAND] = r;
		d->tail[IO_DEMAND] = r;
		found = true;
		break;
	}
	pthread_mutex_unlock(&d->lock);
	return found;
}

int dev_start(struct tb_dev *d)
{
	int ret = d->eng->start(d);

	if (ret == 0)
		d->running = true;
	return ret;
}

void dev_stop(struct tb_dev *d)
{
	if (!d->running)
		return;
	pthread_mutex_lock(&d->lock);
	d->stopping = true;
	pthread_mutex_unlock(&d->lock);
	kick_efd(d);
	d->eng->stop(d);
	d->running = false;
}

void dev_close(struct tb_dev *d)
{
	if (!d)
		return;
	dev_stop(d);
	if (d->eng && d->eng->fini)
		d->eng->fini(d);
	if (d->wake_efd >= 0)
		close(d->wake_efd);
	if (d->fd >= 0)
		close(d->fd);
	if (d->dir_fd >= 0)
		close(d->dir_fd);
	slot_alloc_free_all(&d->alloc);
	pthread_mutex_destroy(&d->lock);
	free(d);
}

void dev_forget_identity(struct tb_dev *d)
{
	if (d->id_made && unlinkat(d->dir_fd, ID_NAME, 0) < 0)
		log_warn("%s (%s): cannot remove " ID_NAME ": %s", d->name, d->where,
			 strerror(errno));
	if (d->slab_made && unlinkat(d->dir_fd, SLAB_NAME, 0) < 0)
		log_warn("%s (%s): cannot remove " SLAB_NAME ": %s", d->name, d->where,
			 strerror(errno));
	d->id_made = d->slab_made = false;
}

int dev_sync(struct tb_dev *d)
{
	int ret = fault_inject(d->name, FAULT_SYNC, 0);

	if (ret) {
		log_err("%s: flush failed: %s", d->name, strerror(-ret));
		return ret;
	}
	return d->eng->sync ? d->eng->sync(d) : 0;
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

void dev_free(struct tb_dev *d, uint64_t slot)
{
	pthread_mutex_lock(&d->lock);
	if (d->eng && d->eng->free)
		d->eng->free(d, slot);
	else if (slot_alloc_put(&d->alloc, slot) < 0)
		log_err("%s: freeing slot %llu that is not in use", d->name,
			(unsigned long long)slot);
	/*
	 * A full device may take the slot again at once: one whose room is
	 * followed sees it in its room (usable); any other, here.
	 */
	if (d->full && !d->track_room)
		d->full_ns = 0;
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

int dev_room_parts(struct tb_dev *d, uint64_t *fs_id, uint64_t *fs_free, uint64_t *slab_free)
{
	struct stat st;
	uint64_t slab_bytes, slab_slots;
	int ret;

	pthread_mutex_lock(&d->lock);
	if (!d->track_room || d->fd < 0 || fstat(d->fd, &st) < 0) {
		pthread_mutex_unlock(&d->lock);
		return -ENOTSUP;
	}
	ret = fs_room(d, fs_free, &slab_bytes);
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
	pthread_mutex_unlock(&d->lock);
	if (d->fd >= 0 && !d->eng->alloc && fstat(d->fd, &sb) == 0)
		st->slab_bytes = (uint64_t)sb.st_blocks * 512;
}

/* ---- giving space back ---- */

/*
 * The slab's end, once every slot past the last in use has given its
 * space back: cut off (ftruncate), so the file shrinks and the slab grows
 * again from there ahead of writes (slab_grow). Quick, since nothing is
 * left there to free, and under the device lock, so that no slot past it
 * is handed out meanwhile. Lock held.
 */
static void cut_end(struct tb_dev *d, uint64_t end)
{
	uint64_t high = slot_alloc_high(&d->alloc);

	if (high >= end || !slot_alloc_all_holes(&d->alloc, high, end))
		return;
	if (ftruncate(d->fd, (off_t)(high * d->block_size)) < 0) {
		if (log_ratelimit(&d->err_log_sec, 10))
			log_err("%s: cannot cut the slab's free end: %s", d->name,
				strerror(errno));
		return;
	}
	slot_alloc_no_space(&d->alloc, high, end); /* past the end: no holes, no space */
	__atomic_store_n(&d->slab_end, high * d->block_size, __ATOMIC_RELAXED);
}

bool dev_give_back(struct tb_dev *d, const bool *stop)
{
	uint64_t pos = 0, end, n, max = SLAB_GROW / d->block_size;
	bool more;

	pthread_mutex_lock(&d->lock);
	if (!d->give_back || d->fd < 0 || d->eng->alloc) {
		pthread_mutex_unlock(&d->lock);
		return false;
	}
	end = slab_slots(d);
	while (!__atomic_load_n(stop, __ATOMIC_RELAXED) &&
	       (n = slot_alloc_ripe(&d->alloc, &pos, end)) > 0) {
		/*
		 * SLAB_GROW at a time, and at most half the free slots: the
		 * flusher may want a slot meanwhile, and a held one is not
		 * handed out (it still counts as free, for writers'
		 * reservations). A punch frees extents, and with the discard
		 * mount option waits for the drive to trim them.
		 */
		uint64_t free_slots = d->alloc.nslots - d->alloc.used;
		int ret;

		if (n > max)
			n = max;
		if (n > free_slots / 2)
			n = free_slots / 2;
		if (!n)
			break;
		slot_alloc_hold(&d->alloc, pos, n);
		pthread_mutex_unlock(&d->lock);
		ret = fallocate(d->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
				(off_t)(pos * d->block_size), (off_t)(n * d->block_size)) < 0
			      ? -errno
			      : 0;
		pthread_mutex_lock(&d->lock);
		slot_alloc_unhold(&d->alloc, pos, n, ret == 0);
		if (ret < 0) {
			if (ret == -EOPNOTSUPP || ret == -ENOSYS) {
				log_info("%s: its filesystem cannot punch holes; free slab space "
					 "stays in the slab",
					 d->name);
				d->give_back = false;
			} else if (log_ratelimit(&d->err_log_sec, 10)) {
				log_err("%s: cannot give back %llu bytes of free slab space: %s",
					d->name, (unsigned long long)(n * d->block_size),
					strerror(-ret));
			}
			break;
		}
		d->returned_bytes += n * d->block_size;
		pos += n;
	}
	if (d->give_back)
		cut_end(d, end);
	more = d->give_back && slot_alloc_see(&d->alloc, slab_slots(d)) > 0;
	pthread_mutex_unlock(&d->lock);
	return more;
}

/* ---- slab devices ---- */

static const char *const slab_files[] = {SLAB_NAME, ID_NAME, NULL};

static const char *folder_what(enum tb_kind kind)
{
	return kind == TB_KIND_PFS ? "pfs folder" : "nvme folder";
}

/*
 * The identity in the checked folder dirfd: 0 with its store id, index
 * and binding ("" in one from before bindings; bind may be NULL), -ENOENT
 * when there is none, or -errno with err set.
 */
static int read_identity(int dirfd, const char *what, const char *dir, char id[64], unsigned *idx,
			 char *bind, char *err, size_t errlen)
{
	char line[200], kind[16];
	int fd = storedir_open_file(dirfd, what, dir, ID_NAME, O_RDONLY, false, NULL, err, errlen);
	FILE *f;
	bool ok;

	if (fd < 0)
		return fd;
	f = fdopen(fd, "r");
	if (!f) {
		int e = errno;

		close(fd);
		snprintf(err, errlen, "%s %s: cannot read " ID_NAME ": %s", what, dir, strerror(e));
		return -e;
	}
	ok = fgets(line, sizeof(line), f) &&
	     sscanf(line, "tensorfs-dev store=%63s index=%u kind=%15s", id, idx, kind) >= 2;
	fclose(f);
	if (ok && bind)
		ok = dev_parse_bind(line, bind);
	if (!ok) {
		snprintf(err, errlen, "%s %s: %s is malformed", what, dir, ID_NAME);
		return -EINVAL;
	}
	return 0;
}

int tb_check_folder(enum tb_kind kind, const char *dir, char *err, size_t errlen)
{
	return storedir_check(folder_what(kind), dir, slab_files, err, errlen);
}

int tb_check_unclaimed(enum tb_kind kind, const char *dir, const char *meta, char *err,
		       size_t errlen)
{
	const char *what = folder_what(kind);
	char id[64] = "";
	unsigned idx = 0;
	int fd, ret;

	fd = storedir_open(what, dir, false, NULL, err, errlen);
	if (fd < 0)
		return fd;
	ret = read_identity(fd, what, dir, id, &idx, NULL, err, errlen);
	close(fd);
	if (ret == -ENOENT)
		return 0;
	if (ret)
		return ret;
	snprintf(err, errlen,
		 "%s %s holds " ID_NAME " of store %s but meta folder %s holds no store: remove "
		 "%s/" ID_NAME " and %s/" SLAB_NAME " if that store is gone, or give the meta= "
		 "folder it was created with",
		 what, dir, id, meta, dir, dir);
	return -EEXIST;
}

/*
 * Check that the folder is bound to this store and this position in the
 * list: block locations name devices by position. A folder without an
 * identity is opened without one (d->id_missing), and tb_check_devices
 * decides; but a slab file there without an identity belongs to no store
 * that can be named, and is refused.
 */
static int check_identity(struct tb_dev *d, const char *what, const char *dir, const char *store_id,
			  char *err, size_t errlen)
{
	char id[64] = "";
	unsigned idx = 0;
	struct stat st;
	int ret;

	ret = read_identity(d->dir_fd, what, dir, id, &idx, d->bind, err, errlen);
	if (ret == 0) {
		if (strcmp(id, store_id) != 0) {
			snprintf(err, errlen,
				 "%s %s belongs to another tensorfs store (%s); give the "
				 "meta= folder it was created with",
				 what, dir, id);
			return -EINVAL;
		}
		if (idx != d->index) {
			snprintf(err, errlen,
				 "%s %s was device %u of this store but is now %u; keep the "
				 "nvme= folders in their original order, with remote= after them",
				 what, dir, idx, d->index);
			return -EINVAL;
		}
		return 0;
	}
	if (ret != -ENOENT)
		return ret;
	err[0] = 0;
	if (fstatat(d->dir_fd, SLAB_NAME, &st, AT_SYMLINK_NOFOLLOW) == 0) {
		snprintf(err, errlen,
			 "%s %s holds " SLAB_NAME " but no " ID_NAME ": whose blocks the slab "
			 "holds cannot be told; put back its " ID_NAME ", or remove %s/" SLAB_NAME
			 " if it holds nothing of use",
			 what, dir, dir);
		return -EINVAL;
	}
	d->id_missing = true;
	return 0;
}

/* The identity of a slab folder: one line, flushed. */
static int write_identity(struct tb_dev *d, const char *store_id, char *err, size_t errlen)
{
	const char *what = folder_what(strcmp(d->kind, "pfs") == 0 ? TB_KIND_PFS : TB_KIND_NVME);
	FILE *f;
	int fd, ret;

	fd = storedir_open_file(d->dir_fd, what, d->where, ID_NAME, O_WRONLY, true, &d->id_made,
				err, errlen);
	if (fd < 0)
		return fd;
	if (!d->id_made) { /* made by someone else since we looked: never write into it */
		close(fd);
		snprintf(err, errlen,
			 "%s %s: " ID_NAME " appeared while this mount started; is another "
			 "tensorfs starting on this folder?",
			 what, d->where);
		return -EEXIST;
	}
	f = fdopen(fd, "w");
	if (!f) {
		ret = -errno;
		close(fd);
		dev_err(err, errlen, "folder %s: cannot write " ID_NAME, d->where, -ret);
		return ret;
	}
	fprintf(f, "tensorfs-dev store=%s index=%u kind=%s bind=%s\n", store_id, d->index, d->kind,
		d->bind);
	if (fflush(f) != 0 || fsync(fileno(f)) != 0) {
		ret = -errno;
		dev_err(err, errlen, "folder %s: cannot write " ID_NAME, d->where, -ret);
		fclose(f);
		return ret;
	}
	fclose(f);
	return 0;
}

int dev_bind(struct tb_dev *d, const char *store_id, const char *bind, char *err, size_t errlen)
{
	int ret;

	if (!d->id_missing)
		return 0;
	snprintf(d->bind, sizeof(d->bind), "%s", bind);
	ret = d->eng->bind ? d->eng->bind(d, store_id, err, errlen)
			   : write_identity(d, store_id, err, errlen);
	if (ret == 0)
		d->id_missing = false;
	return ret;
}

void dev_new_bind(char bind[TB_BIND_LEN])
{
	unsigned char r[16];
	size_t got = 0;

	while (got < sizeof(r)) {
		ssize_t n = getrandom(r + got, sizeof(r) - got, 0);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) { /* no getrandom: the clock and the pid are unique enough here */
			uint64_t t = dev_now_ns() ^ ((uint64_t)getpid() << 40);

			for (; got < sizeof(r); got++, t = t * 6364136223846793005ULL + 1)
				r[got] = (unsigned char)(t >> 56);
			break;
		}
		got += (size_t)n;
	}
	snprintf(bind, TB_BIND_LEN,
		 "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", r[0], r[1],
		 r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10], r[11], r[12], r[13], r[14],
		 r[15]);
}

bool dev_parse_bind(const char *line, char bind[TB_BIND_LEN])
{
	const char *p = strstr(line, " bind=");
	size_t n;

	bind[0] = 0;
	if (!p)
		return true; /* an identity from before bindings */
	p += strlen(" bind=");
	n = strcspn(p, " \n");
	if (n == 0 || n >= TB_BIND_LEN)
		return false;
	memcpy(bind, p, n);
	bind[n] = 0;
	return true;
}

void dev_describe(const struct tb_dev *d, char *buf, size_t len)
{
	if (strcmp(d->kind, "s3") == 0)
		snprintf(buf, len, "s3 tier %s", d->where);
	else
		snprintf(buf, len, "%s folder %s", d->kind, d->where);
}

static int open_slab(struct tb_dev *d, const char *what, const char *dir, bool direct,
		     uint64_t cap_bytes, char *err, size_t errlen)
{
	struct statvfs vfs;
	struct stat st;
	uint64_t fs_bytes, free_bytes, reserve, slab_bytes, nslots;

	/* Checked before use: never through a link, ours alone, a regular file. */
	d->fd = storedir_open_file(d->dir_fd, what, dir, SLAB_NAME, O_RDWR, true, &d->slab_made,
				   err, errlen);
	if (d->fd < 0)
		return d->fd;
	/* O_DIRECT where the filesystem has it (EINVAL: it has not). */
	if (direct && fcntl(d->fd, F_SETFL, fcntl(d->fd, F_GETFL) | O_DIRECT) < 0 &&
	    errno != EINVAL) {
		dev_err(err, errlen, "folder %s: cannot use the slab file with O_DIRECT", dir,
			errno);
		return -errno;
	}
	if (fstat(d->fd, &st) < 0 || fstatvfs(d->fd, &vfs) < 0) {
		dev_err(err, errlen, "folder %s", dir, errno);
		return -errno;
	}
	if (vfs.f_flag & ST_RDONLY) {
		snprintf(err, errlen, "%s %s is on a read-only filesystem", what, dir);
		return -EROFS;
	}
	d->slab_end = (uint64_t)st.st_size;
	fs_bytes = (uint64_t)vfs.f_blocks * vfs.f_frsize;
	free_bytes = (uint64_t)vfs.f_bavail * vfs.f_frsize;
	slab_bytes = (uint64_t)st.st_blocks * 512;
	reserve = fs_bytes / 100 * RESERVE_PERCENT;
	if (reserve < RESERVE_MIN_BLOCKS * d->block_size)
		reserve = RESERVE_MIN_BLOCKS * d->block_size;
	nslots = free_bytes + slab_bytes > reserve
			 ? (free_bytes + slab_bytes - reserve) / d->block_size
			 : 0;
	if (cap_bytes && cap_bytes / d->block_size < nslots)
		nslots = cap_bytes / d->block_size;
	/* Slots already in the slab stay addressable even if the disk filled since. */
	if ((uint64_t)st.st_size / d->block_size > nslots && !cap_bytes)
		nslots = (uint64_t)st.st_size / d->block_size;
	if (nslots == 0) {
		if (cap_bytes && cap_bytes < d->block_size)
			snprintf(err, errlen, "%s %s: its cap of %llu bytes holds no block of %zuK",
				 what, dir, (unsigned long long)cap_bytes, d->block_size >> 10);
		else
			snprintf(err, errlen, "%s %s has no free space", what, dir);
		return -ENOSPC;
	}
	return slot_alloc_init(&d->alloc, nslots);
}

static int slab_sync(struct tb_dev *d)
{
	if (fdatasync(d->fd) < 0) {
		int e = errno;

		log_err("%s: fdatasync of the slab failed: %s", d->name, strerror(e));
		return -e;
	}
	return 0;
}

/* ---- engine: io_uring ---- */

struct uring_priv {
	struct io_uring ring;
	bool fixed_bufs;
	pthread_t thread;
};

static int register_buffers(struct tb_dev *d, struct uring_priv *u)
{
	size_t n = (d->arena->bytes + URING_MAX_BUF - 1) / URING_MAX_BUF;
	struct iovec *iov = calloc(n, sizeof(*iov));
	int ret;

	if (!iov)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		iov[i].iov_base = (char *)d->arena->base + i * URING_MAX_BUF;
		iov[i].iov_len = d->arena->bytes - i * URING_MAX_BUF;
		if (iov[i].iov_len > URING_MAX_BUF)
			iov[i].iov_len = URING_MAX_BUF;
	}
	ret = io_uring_register_buffers(&u->ring, iov, (unsigned)n);
	free(iov);
	u->fixed_bufs = ret == 0;
	return ret;
}

/*
 * Raise the slab's size to end. The I/O threads raise it (a pfs pool has
 * many); dev_give_back lowers it (cut_end), under the device lock with no
 * slot in use past the new end, so that no write goes there meanwhile.
 */
static void slab_end_raise(struct tb_dev *d, uint64_t end)
{
	uint64_t at = __atomic_load_n(&d->slab_end, __ATOMIC_RELAXED);

	while (at < end && !__atomic_compare_exchange_n(&d->slab_end, &at, end, false,
							__ATOMIC_RELAXED, __ATOMIC_RELAXED))
		;
}

/*
 * Grow the slab file ahead of a write that would extend it, in SLAB_GROW
 * steps, with fallocate. A write past the end of a file, or into a hole,
 * takes the filesystem's inode lock exclusively (ext4, xfs) and io_uring
 * hands it to a worker thread, so such writes run one at a time; into
 * space allocated ahead they run in parallel, as overwrites do. Called on
 * the device's I/O thread; a failure only costs that speed.
 */
static void slab_grow(struct tb_dev *d, uint64_t end)
{
	uint64_t to, cap = d->alloc.nslots * d->block_size, free_bytes, slab_bytes;
	uint64_t at = __atomic_load_n(&d->slab_end, __ATOMIC_RELAXED);

	if (end <= at)
		return;
	if (!d->prealloc) {
		slab_end_raise(d, end); /* the write extends the slab */
		return;
	}
	to = (end + SLAB_GROW - 1) / SLAB_GROW * SLAB_GROW;
	if (to > cap)
		to = cap > end ? cap : end;
	/*
	 * Never into the filesystem's reserve: the metadata store may share
	 * the filesystem (meta= inside the folder), and a slab grown into all
	 * of a filesystem that others had filled left its commits ENOSPC.
	 */
	if (fs_room(d, &free_bytes, &slab_bytes) < 0)
		free_bytes = UINT64_MAX; /* not known: try */
	if (to - at > free_bytes)
		to = end;
	if (to - at > free_bytes) {
		slab_end_raise(d, end); /* the write itself will say whether it fits */
		return;
	}
	if (fallocate(d->fd, 0, (off_t)at, (off_t)(to - at)) == 0) {
		slab_end_raise(d, to);
		return;
	}
	if (errno == EOPNOTSUPP || errno == ENOSYS)
		d->prealloc = false; /* the filesystem cannot: writes extend the slab */
	slab_end_raise(d, end);
}

/*
 * The run of slots that fill_run found given back is allocated again
 * before the write goes. Within the slab's size, with the write's own
 * slot first; a failure only costs speed (the write fills its hole).
 */
static void slab_fill(struct tb_dev *d, struct tb_io *r)
{
	if (!r->fill)
		return;
	if (fallocate(d->fd, 0, (off_t)(r->slot * d->block_size),
		      (off_t)(r->fill * d->block_size)) < 0 &&
	    (errno == EOPNOTSUPP || errno == ENOSYS))
		d->prealloc = false;
	r->fill = 0;
}

static void uring_prep(struct tb_dev *d, struct uring_priv *u, struct io_uring_sqe *sqe,
		       struct tb_io *r)
{
	char *buf = (char *)r->buf + r->done_bytes;
	unsigned len = (unsigned)(r->len - r->done_bytes);
	off_t off = (off_t)(r->slot * d->block_size + r->done_bytes);
	size_t arena_off = (size_t)((char *)r->buf - (char *)d->arena->base);

	if (r->op == IO_WRITE) {
		slab_fill(d, r);
		slab_grow(d, (uint64_t)off + len);
	}
	if (u->fixed_bufs && (char *)r->buf >= (char *)d->arena->base &&
	    arena_off < d->arena->bytes) {
		int idx = (int)(arena_off / URING_MAX_BUF);

		if (r->op == IO_READ)
			io_uring_prep_read_fixed(sqe, d->fd, buf, len, off, idx);
		else
			io_uring_prep_write_fixed(sqe, d->fd, buf, len, off, idx);
	} else if (r->op == IO_READ) {
		io_uring_prep_read(sqe, d->fd, buf, len, (uint64_t)off);
	} else {
		io_uring_prep_write(sqe, d->fd, buf, len, (uint64_t)off);
	}
	io_uring_sqe_set_data(sqe, r);
}

static struct io_uring_sqe *get_sqe(struct io_uring *ring)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(ring);

	if (!sqe) {
		io_uring_submit(ring);
		sqe = io_uring_get_sqe(ring);
	}
	return sqe;
}

/* Puts what is queued for the device into the ring; returns how much. */
static unsigned uring_feed(struct tb_dev *d, struct uring_priv *u, struct tb_io **batch)
{
	unsigned n = dev_take(d, batch, ENGINE_BATCH);

	for (unsigned i = 0; i < n; i++)
		uring_prep(d, u, get_sqe(&u->ring), batch[i]);
	return n;
}

static void *uring_thread(void *arg)
{
	struct tb_dev *d = arg;
	struct uring_priv *u = d->priv;
	struct tb_io *batch[ENGINE_BATCH];
	bool poll_armed = false;
	dev_name_thread(d);
	for (;;) {
		struct io_uring_cqe *cqe;
		unsigned head, seen = 0;
		uint64_t throttle;

		pthread_mutex_lock(&d->lock);
		bool done = d->stopping && dev_idle_locked(d);
		pthread_mutex_unlock(&d->lock);
		if (done)
			break;
		uring_feed(d, u, batch);
		if (!poll_armed) {
			struct io_uring_sqe *sqe = get_sqe(&u->ring);

			io_uring_prep_poll_add(sqe, d->wake_efd, POLLIN);
			io_uring_sqe_set_data(sqe, NULL);
			poll_armed = true;
		}
		throttle = dev_throttle_ns(d);
		if (throttle) {
			struct __kernel_timespec ts = {(long long)(throttle / 1000000000ULL),
						       (long long)(throttle % 1000000000ULL)};

			io_uring_submit(&u->ring);
			io_uring_wait_cqe_timeout(&u->ring, &cqe, &ts);
		} else {
			io_uring_submit_and_wait(&u->ring, 1);
		}
		io_uring_for_each_cqe(&u->ring, head, cqe)
		{
			struct tb_io *r = io_uring_cqe_get_data(cqe);

			seen++;
			if (!r) {
				dev_drain_efd(d->wake_efd);
				poll_armed = false;
				continue;
			}
			if (dev_finish(d, r, cqe->res))
				dev_requeue(d, r);
			/*
			 * A completion's callbacks can take a while (a reader's
			 * reply copies its block to the kernel): what was queued
			 * meanwhile goes to the device now, not after the batch.
			 * Left for the batch's end, the device sat idle 4 times in
			 * 10 under a sequential reader.
			 */
			if (uring_feed(d, u, batch))
				io_uring_submit(&u->ring);
		}
		io_uring_cq_advance(&u->ring, seen);
	}
	return NULL;
}

static int uring_start(struct tb_dev *d)
{
	struct uring_priv *u = d->priv;

	return -pthread_create(&u->thread, NULL, uring_thread, d);
}

static void uring_stop(struct tb_dev *d)
{
	struct uring_priv *u = d->priv;

	pthread_join(u->thread, NULL);
}

static void uring_fini(struct tb_dev *d)
{
	struct uring_priv *u = d->priv;

	if (u) {
		io_uring_queue_exit(&u->ring);
		free(u);
	}
	d->priv = NULL;
}

static const struct dev_engine uring_engine = {
	.name = "io_uring",
	.start = uring_start,
	.stop = uring_stop,
	.sync = slab_sync,
	.fini = uring_fini,
};

static int uring_setup(struct tb_dev *d)
{
	struct uring_priv *u = calloc(1, sizeof(*u));
	int ret;

	if (!u)
		return -ENOMEM;
	/* Room for a full queue of resubmissions and the eventfd poll. */
	ret = io_uring_queue_init(d->qd * 2 + 2, &u->ring, 0);
	if (ret < 0) {
		free(u);
		return ret;
	}
	d->priv = u;
	d->eng = &uring_engine;
	if (register_buffers(d, u) < 0)
		log_info("%s: cannot register the arena with io_uring; using unregistered "
			 "buffers",
			 d->name);
	return 0;
}

/* ---- engine: libaio ---- */

struct aio_priv {
	io_context_t ctx;
	int efd;
	pthread_t thread;
};

static void aio_prep(struct tb_dev *d, struct aio_priv *a, struct tb_io *r)
{
	char *buf = (char *)r->buf + r->done_bytes;
	size_t len = r->len - r->done_bytes;
	long long off = (long long)(r->slot * d->block_size + r->done_bytes);

	if (r->op == IO_READ) {
		io_prep_pread(&r->iocb, d->fd, buf, len, off);
	} else {
		slab_fill(d, r);
		slab_grow(d, (uint64_t)off + len);
		io_prep_pwrite(&r->iocb, d->fd, buf, len, off);
	}
	io_set_eventfd(&r->iocb, a->efd);
	r->iocb.data = r;
}

static void aio_submit_batch(struct tb_dev *d, struct aio_priv *a, struct tb_io **batch,
			     unsigned n)
{
	struct iocb *iocbs[256];
	unsigned done = 0;

	for (unsigned i = 0; i < n; i++) {
		aio_prep(d, a, batch[i]);
		iocbs[i] = &batch[i]->iocb;
	}
	while (done < n) {
		int ret = io_submit(a->ctx, (long)(n - done), iocbs + done);

		if (ret > 0) {
			done += (unsigned)ret;
			continue;
		}
		if (ret == -EAGAIN || ret == -EINTR) {
			usleep(100);
			continue;
		}
		/* The rest cannot be submitted at all: fail them. */
		for (; done < n; done++)
			dev_finish(d, batch[done], ret ? ret : -EIO);
	}
}

/* Submits what is queued for the device. */
static void aio_feed(struct tb_dev *d, struct aio_priv *a, struct tb_io **batch)
{
	unsigned n = dev_take(d, batch, ENGINE_BATCH);

	if (n)
		aio_submit_batch(d, a, batch, n);
}

static void *aio_thread(void *arg)
{
	struct tb_dev *d = arg;
	struct aio_priv *a = d->priv;
	struct tb_io *batch[ENGINE_BATCH];
	struct io_event events[ENGINE_BATCH];
	dev_name_thread(d);
	for (;;) {
		struct pollfd pfd[2] = {{d->wake_efd, POLLIN, 0}, {a->efd, POLLIN, 0}};
		struct timespec zero = {0, 0};
		uint64_t throttle;
		int got;

		pthread_mutex_lock(&d->lock);
		bool done = d->stopping && dev_idle_locked(d);
		pthread_mutex_unlock(&d->lock);
		if (done)
			break;
		aio_feed(d, a, batch);
		throttle = dev_throttle_ns(d);
		if (poll(pfd, 2, throttle ? (int)(throttle / 1000000 + 1) : -1) < 0 &&
		    errno != EINTR)
			break;
		dev_drain_efd(d->wake_efd);
		dev_drain_efd(a->efd);
		got = io_getevents(a->ctx, 0, ENGINE_BATCH, events, &zero);
		for (int i = 0; i < got; i++) {
			struct tb_io *r = events[i].data;

			if (dev_finish(d, r, (long)events[i].res))
				dev_requeue(d, r);
			aio_feed(d, a, batch); /* as uring_thread does */
		}
	}
	return NULL;
}

static int aio_start(struct tb_dev *d)
{
	struct aio_priv *a = d->priv;

	return -pthread_create(&a->thread, NULL, aio_thread, d);
}

static void aio_stop(struct tb_dev *d)
{
	struct aio_priv *a = d->priv;

	pthread_join(a->thread, NULL);
}

static void aio_fini(struct tb_dev *d)
{
	struct aio_priv *a = d->priv;

	if (a) {
		io_destroy(a->ctx);
		if (a->efd >= 0)
			close(a->efd);
		free(a);
	}
	d->priv = NULL;
}

static const struct dev_engine aio_engine = {
	.name = "libaio",
	.start = aio_start,
	.stop = aio_stop,
	.sync = slab_sync,
	.fini = aio_fini,
};

static int aio_setup(struct tb_dev *d)
{
	struct aio_priv *a = calloc(1, sizeof(*a));
	int ret;

	if (!a)
		return -ENOMEM;
	ret = io_setup((int)d->qd, &a->ctx);
	if (ret < 0) {
		free(a);
		return ret;
	}
	a->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (a->efd < 0) {
		io_destroy(a->ctx);
		free(a);
		return -errno;
	}
	d->priv = a;
	d->eng = &aio_engine;
	return 0;
}

/* ---- engine: a thread pool (pfs) ---- */

/*
 * The pool starts with POOL_THREADS_START threads (or the depth, if lower)
 * and grows by one whenever a request is queued while none is idle, up to
 * the device's depth, which dev_set_readahead raises to cover a reader's
 * whole window: a remote folder's latency is hidden only by as many
 * requests in flight as latency x bandwidth holds.
 */
struct pool_priv {
	pthread_t threads[POOL_THREADS_MAX];
	unsigned n;	   /* started; with d->lock */
	unsigned idle;	   /* waiting for requests; with d->lock */
	pthread_cond_t cv; /* with d->lock: requests queued, or stopping */
};

static void *pool_thread(void *arg)
{
	struct tb_dev *d = arg;
	struct pool_priv *p = d->priv;
	dev_name_thread(d);
	for (;;) {
		struct tb_io *r;
		uint64_t throttle;

		if (dev_take(d, &r, 1) == 0) {
			pthread_mutex_lock(&d->lock);
			if (d->stopping && dev_idle_locked(d)) {
				pthread_mutex_unlock(&d->lock);
				break;
			}
			p->idle++;
			throttle = d->bw_cap && d->tokens <= 0
					   ? (uint64_t)(-d->tokens * 1e9 / (double)d->bw_cap) + 1000
					   : 100000000ULL;
			struct timespec ts;
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_nsec += (long)(throttle % 1000000000ULL);
			ts.tv_sec += (time_t)(throttle / 1000000000ULL) + ts.tv_nsec / 1000000000L;
			ts.tv_nsec %= 1000000000L;
			pthread_cond_timedwait(&p->cv, &d->lock, &ts);
			p->idle--;
			pthread_mutex_unlock(&d->lock);
			continue;
		}
		do {
			char *buf = (char *)r->buf + r->done_bytes;
			size_t len = r->len - r->done_bytes;
			off_t off = (off_t)(r->slot * d->block_size + r->done_bytes);
			ssize_t res = r->op == IO_READ ? pread(d->fd, buf, len, off)
						       : pwrite(d->fd, buf, len, off);

			if (res < 0)
				res = -errno;
			if (!dev_finish(d, r, (long)res))
				break;
			/* short transfer: this thread goes on with the rest */
			pthread_mutex_lock(&d->lock);
			pthread_mutex_unlock(&d->lock);
		} while (1);
	}
	return NULL;
}

static void pool_kick(struct tb_dev *d)
{
	struct pool_priv *p = d->priv;

	/* The new thread waits for d->lock in dev_take until we let it go. */
	pthread_mutex_lock(&d->lock);
	pthread_cond_signal(&p->cv);
	if (d->running && !d->stopping && !p->idle && p->n < d->qd && p->n < POOL_THREADS_MAX &&
	    pthread_create(&p->threads[p->n], NULL, pool_thread, d) == 0)
		p->n++;
	pthread_mutex_unlock(&d->lock);
}

static int pool_start(struct tb_dev *d)
{
	struct pool_priv *p = d->priv;
	unsigned first = d->qd < POOL_THREADS_START ? d->qd : POOL_THREADS_START;
	int ret = 0;

	pthread_mutex_lock(&d->lock);
	for (p->n = 0; p->n < first && !ret;) {
		ret = pthread_create(&p->threads[p->n], NULL, pool_thread, d);
		if (!ret)
			p->n++;
	}
	pthread_mutex_unlock(&d->lock);
	return -ret;
}

static void pool_stop(struct tb_dev *d)
{
	struct pool_priv *p = d->priv;
	unsigned n;

	pthread_mutex_lock(&d->lock);
	pthread_cond_broadcast(&p->cv);
	n = p->n;
	pthread_mutex_unlock(&d->lock);
	for (unsigned i = 0; i < n; i++)
		pthread_join(p->threads[i], NULL);
}

static void pool_fini(struct tb_dev *d)
{
	struct pool_priv *p = d->priv;

	if (p) {
		pthread_cond_destroy(&p->cv);
		free(p);
	}
	d->priv = NULL;
}

static const struct dev_engine pool_engine = {
	.name = "threads",
	.start = pool_start,
	.kick = pool_kick,
	.stop = pool_stop,
	.sync = slab_sync,
	.fini = pool_fini,
};

static int pool_setup(struct tb_dev *d)
{
	struct pool_priv *p = calloc(1, sizeof(*p));

	if (!p)
		return -ENOMEM;
	pthread_cond_init(&p->cv, NULL);
	d->priv = p;
	d->eng = &pool_engine;
	return 0;
}

int dev_open_slab(struct tb_dev **out, const char *kind, unsigned index, const char *dir,
		  const char *store_id, size_t block_size, enum tb_engine engine,
		  unsigned queue_depth, uint64_t bw_cap, uint64_t cap_bytes,
		  const struct dram_arena *arena, char *err, size_t errlen)
{
	struct tb_dev *d = calloc(1, sizeof(*d));
	bool pfs = strcmp(kind, "pfs") == 0;
	const char *what = folder_what(pfs ? TB_KIND_PFS : TB_KIND_NVME);
	int ret;

	if (!d)
		return -ENOMEM;
	ret = dev_init_common(d, kind, index, block_size, queue_depth, bw_cap, arena);
	if (ret)
		goto fail;
	snprintf(d->where, sizeof(d->where), "%s", dir);
	ret = d->dir_fd = storedir_open(what, dir, false, NULL, err, errlen);
	if (ret < 0)
		goto fail;
	if (access(dir, W_OK) < 0) {
		dev_err(err, errlen, "folder %s is not writable", dir, errno);
		ret = -errno;
		goto fail;
	}
	ret = check_identity(d, what, dir, store_id, err, errlen);
	if (ret < 0)
		goto fail;
	ret = open_slab(d, what, dir, true, cap_bytes, err, errlen);
	if (ret < 0)
		goto fail;
	d->prealloc = !pfs; /* a parallel filesystem may not have fallocate, or make it slow */
	d->give_back = true;
	/*
	 * An nvme folder's filesystem is local and may be shared: its free
	 * space is looked at (room_locked). A parallel filesystem's statfs
	 * can take long, asking every server: its capacity is the mount's.
	 */
	d->track_room = !pfs;
	if (pfs) {
		ret = pool_setup(d);
	} else {
		ret = engine == TB_ENGINE_AIO ? -EINVAL : uring_setup(d);
		if (ret < 0 && engine == TB_ENGINE_URING) {
			dev_err(err, errlen, "folder %s: io_uring setup failed", dir, -ret);
			goto fail;
		}
		if (ret < 0 && engine == TB_ENGINE_AUTO)
			log_info("%s: io_uring unavailable (%s); using libaio", d->name,
				 strerror(-ret));
		if (ret < 0)
			ret = aio_setup(d);
	}
	if (ret < 0) {
		dev_err(err, errlen, "folder %s: cannot set up its I/O engine", dir, -ret);
		goto fail;
	}
	*out = d;
	return 0;
fail:
	/* Whatever this open made goes: a later start must not trip on it. */
	dev_forget_identity(d);
	dev_close(d);
	return ret;
}

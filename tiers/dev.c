/*
 * dev.c - the queue of a device of the persistent tiers: its classes, its
 * cap, and the hand-over between the callers and the engine's thread.
 *
 * Producers push requests onto per-class queues under the device lock and
 * kick an eventfd. The engine's thread takes them with dev_take, which
 * applies the class limits (write-back keeps a quarter of the depth while
 * reads want the device) and the bandwidth cap, and hands each finished
 * transfer to dev_finish, which resubmits the rest of a short transfer,
 * counts, measures bandwidth, tracks health and calls the completion.
 *
 * Calls dev_measure.c (the load, the measure, full) and the engine only
 * through d->eng; the engines (dev_engine.c, s3.c) call it.
 */
#include "dev_int.h"
#include "fault.h"
#include "log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <unistd.h>

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

/* Slots of the slab that its file holds, whole or in part. */
uint64_t dev_slab_slots(struct tb_dev *d)
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
	n = slot_alloc_fill(&d->alloc, slot, SLAB_GROW / d->block_size, dev_slab_slots(d));
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
	if (!total)
		d->answer_ns = now; /* idle until now: the wait for an answer starts here */
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

bool dev_idle_locked(struct tb_dev *d)
{
	for (int c = 0; c < IO_NCLASS; c++)
		if (d->head[c] || d->inflight[c])
			return false;
	return true;
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
	d->answer_ns = now;
	if (err) {
		d->errors++;
		err_recent_add(&d->recent, now);
		/*
		 * ENOSPC: full, not failing. No new blocks are placed here for a
		 * while (dev_full_locked); counted towards down, a full device would
		 * turn its writers' ENOSPC into EIO (no_space_err).
		 */
		if (err == -ENOSPC && r->op == IO_WRITE)
			dev_full_locked(d, now);
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
		/*
		 * Room again, where a write sent after the ENOSPC succeeds. One
		 * sent before says nothing of now: into space the slab already
		 * had, it succeeds while a write into new space fails.
		 */
		if (d->full && r->op == IO_WRITE && r->start_ns >= d->full_ns) {
			d->full = false;
			dev_full_note(d, false, NULL);
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
 * cores fio's overwrite through dram= a quarter of the file ran 19% slower
 * with them at the default weight than at this one (1988 against 2462
 * MB/s: docs/benchmarks.md, fio's "What we tried").
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
	int ret = d->eng->start ? d->eng->start(d) : 0;

	if (ret == 0 && d->eng->thread)
		ret = -pthread_create(&d->thread, NULL, d->eng->thread, d);
	if (ret == 0) {
		d->running = true;
		return 0;
	}
	/*
	 * What the start began ends before the error goes up: a pool's
	 * first threads, when a later one or the engine's thread could not
	 * be made, would otherwise run on in a device that is freed.
	 */
	if (d->eng->stop) {
		pthread_mutex_lock(&d->lock);
		d->stopping = true;
		pthread_mutex_unlock(&d->lock);
		d->eng->stop(d);
	}
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
	if (d->eng->thread)
		pthread_join(d->thread, NULL);
	if (d->eng->stop)
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

int dev_sync(struct tb_dev *d)
{
	int ret = fault_inject(d->name, FAULT_SYNC, 0);

	if (ret) {
		log_err("%s: flush failed: %s", d->name, strerror(-ret));
		return ret;
	}
	return d->eng->sync ? d->eng->sync(d) : 0;
}

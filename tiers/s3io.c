/*
 * s3io.c - the s3 tier's engine: one thread runs a libcurl multi handle over
 * a pool of easy handles (connections are reused), sized to keep a reader's
 * deepest readahead in flight.
 *
 * Fewer, larger requests are the point: s3rver spends about 4 ms of CPU per
 * request, whatever its size, so one object per 1 MiB block capped reads
 * near 150 MB/s on two cores. Writes: the allocator hands out an object's
 * slots in a row, the engine holds their write requests until it has them
 * all (or a while passed without another: S3_PACK_WAIT_MAX_NS, less when
 * someone waits for one of them, tb_io.push), and one PUT stores them.
 * Reads: requests for neighbouring blocks of one object, queued together
 * (readers plug, see tb_plug), go as one ranged GET. An object no slot uses
 * is deleted; one half dead is compacted when the device is otherwise idle
 * (s3obj.h).
 *
 * While the device is down, writes get one try (the flusher places them
 * elsewhere) and a HEAD every two seconds tells when it is back. A
 * completed PUT is durable.
 */
#include "s3_int.h"
#include "fault.h"
#include "log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define S3_BLK_DIR "blk/" /* one object per slot: tiers made before packing */
#define S3_PROBE_INTERVAL_NS 2000000000ULL
#define S3_POLL_MAX_MS 1000
#define S3_LOG_INTERVAL_S 10
#define S3_DOWN_AFTER_NO_SERVER 3 /* attempts in a row that found no server */
#define S3_TAKE_MAX 256		  /* requests taken from the queue at once */
/*
 * A partly filled object waits for its next block four times as long as
 * write-back requests have been coming apart, within these bounds: a
 * steady writer fills whole objects, and an fsync's last one waits little.
 */
#define S3_PACK_WAIT_MIN_NS 2000000ULL
#define S3_PACK_WAIT_MAX_NS 50000000ULL
#define S3_PACK_WAIT_GAPS 4
#define S3_PUT_SHARE 4 /* PUTs keep a quarter of the handles while reads wait */
#define S3_DELETE_RETRY_NS 2000000000ULL

/* ---- the engine: bookkeeping shared with the allocator ---- */

static void s3_kick(struct tb_dev *d)
{
	uint64_t one = 1;

	if (write(d->wake_efd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		log_err("%s: cannot wake the I/O thread: %s", d->name, strerror(errno));
}

/* The device's counters, from the objects'. d->lock held. */
void s3_counters(struct s3_priv *p)
{
	struct tb_dev *d = p->d;

	d->held_slots = p->objs.held_slots;
	d->dead_bytes = p->objs.dead_slots * d->block_size;
	d->objects = p->objs.stored;
}

static void pk_key(char *key, size_t len, const struct s3obj_version *v)
{
	snprintf(key, len, S3_PK_DIR "%012llx-%08x-%04llx", (unsigned long long)v->objno, v->gen,
		 (unsigned long long)v->layout);
}

/* Delete version v when it is due. d->lock held. */
void s3_del_queue(struct s3_priv *p, const struct s3obj_version *v)
{
	struct s3_del *dl = calloc(1, sizeof(*dl));

	if (!dl) {
		log_err("%s: no memory to delete object %llx; the next mount will", p->d->name,
			(unsigned long long)v->objno);
		return;
	}
	dl->v = *v;
	if (p->dels_tail)
		p->dels_tail->next = dl;
	else
		p->dels = dl;
	p->dels_tail = dl;
}

/* Do what s3obj said after a change to objno. d->lock held. */
void s3_todo(struct s3_priv *p, uint64_t objno, enum s3obj_todo todo)
{
	struct s3obj *o = s3obj_get(&p->objs, objno);

	if (todo == S3OBJ_TODO_DELETE && o) {
		struct s3obj_version v = {objno, o->gen, o->layout, true, false};

		s3_del_queue(p, &v);
	}
	if (todo != S3OBJ_TODO_NONE)
		s3_kick(p->d);
}

/* ---- the engine: transfers ---- */

static const char *const job_name[] = {
    [S3_JOB_CHECK] = "check",
    [S3_JOB_READ] = "GET",
    [S3_JOB_WRITE] = "PUT",
    [S3_JOB_DELETE] = "DELETE",
    [S3_JOB_COMPACT_GET] = "GET (compaction)",
    [S3_JOB_COMPACT_PUT] = "PUT (compaction)",
};

static void s3_log_failure(struct s3_priv *p, struct s3_xfer *x)
{
	char why[CURL_ERROR_SIZE + 64];

	if (!log_ratelimit(&p->err_log_sec[x->method == S3_GET], S3_LOG_INTERVAL_S))
		return;
	s3_describe(x, why, sizeof(why));
	if (p->pack)
		log_err("%s: %s of slot %llu failed after %u attempt%s (object %llx, generation "
			"%x): %s",
			p->d->name, job_name[x->job], (unsigned long long)x->slot, x->attempts,
			x->attempts == 1 ? "" : "s", (unsigned long long)x->v.objno, x->v.gen, why);
	else
		log_err("%s: %s of slot %llu failed after %u attempt%s: %s", p->d->name,
			job_name[x->job], (unsigned long long)x->slot, x->attempts,
			x->attempts == 1 ? "" : "s", why);
}

static void s3_idle(struct s3_priv *p, struct s3_xfer *x)
{
	s3_xfer_reset(x);
	x->next = p->idle;
	p->idle = x;
}

static void s3_finish_reqs(struct s3_priv *p, struct tb_io **rs, unsigned n, long res)
{
	for (unsigned i = 0; i < n; i++)
		if (dev_finish(p->d, rs[i], res < 0 ? res : (long)rs[i]->len))
			dev_requeue(p->d, rs[i]); /* cannot happen: a transfer is whole or failed */
}

static void s3_launch(struct s3_priv *p, struct s3_xfer *x);

/* A DELETE ended: a key that is gone already is deleted too. */
static void s3_delete_done(struct s3_priv *p, struct s3_xfer *x, long res)
{
	struct tb_dev *d = p->d;
	struct s3obj_version v = x->v;
	bool gone = res >= 0 || (x->code == CURLE_OK && x->status == 404);

	pthread_mutex_lock(&d->lock);
	if (gone && v.whole)
		s3obj_deleted(&p->objs, v.objno);
	if (!gone && !d->stopping) {
		s3_del_queue(p, &v); /* again later; the object stays DELETING */
		if (p->dels_tail)
			p->dels_tail->due_ns = dev_now_ns() + S3_DELETE_RETRY_NS;
	}
	s3_counters(p);
	pthread_mutex_unlock(&d->lock);
}

/* Compaction read the object whole: write its live blocks as a new version. */
static void s3_compact_got(struct s3_priv *p, struct s3_xfer *x, long res)
{
	struct tb_dev *d = p->d;
	struct s3obj_version v = x->v, nv;
	struct s3obj *o;
	size_t bs = d->block_size, to = 0, from = 0;
	char key[64];
	uint64_t live;

	pthread_mutex_lock(&d->lock);
	o = s3obj_get(&p->objs, v.objno);
	o->gets--;
	if (res < 0 || o->state != S3OBJ_STORED || o->gen != v.gen || !o->used) {
		s3_todo(p, v.objno, s3obj_compact_abort(&p->objs, v.objno));
		s3_counters(p);
		pthread_mutex_unlock(&d->lock);
		p->compacting = false;
		s3_idle(p, x);
		return;
	}
	live = o->used & v.layout;
	nv = (struct s3obj_version){v.objno, p->objs.next_gen++, live, false, false};
	pthread_mutex_unlock(&d->lock);
	for (unsigned i = 0; i < p->pack; i++) {
		if (!(v.layout & (1ULL << i)))
			continue;
		if (live & (1ULL << i)) {
			if (to != from)
				memmove(p->compact_buf + to, p->compact_buf + from, bs);
			to += bs;
		}
		from += bs;
	}
	s3_xfer_reset(x);
	x->job = S3_JOB_COMPACT_PUT;
	x->body = p->compact_buf;
	x->len = to;
	x->v = nv;
	pk_key(key, sizeof(key), &nv);
	if (s3_xfer_aim(x, S3_PUT, key, 0) < 0) {
		pthread_mutex_lock(&d->lock);
		s3_todo(p, v.objno, s3obj_compact_abort(&p->objs, v.objno));
		pthread_mutex_unlock(&d->lock);
		p->compacting = false;
		s3_idle(p, x);
		return;
	}
	x->deadline_ns = dev_now_ns() + p->timeout_ns;
	s3_launch(p, x);
}

static void s3_compact_put_done(struct s3_priv *p, struct s3_xfer *x, long res)
{
	struct tb_dev *d = p->d;
	struct s3obj_version nv = x->v, old;

	pthread_mutex_lock(&d->lock);
	if (res >= 0) {
		enum s3obj_todo todo = s3obj_compacted(&p->objs, nv.objno, nv.gen, nv.layout, &old);

		s3_del_queue(p, &old);
		s3_todo(p, nv.objno, todo);
		d->compacted_objects++;
		d->compacted_bytes += x->len;
	} else {
		s3_todo(p, nv.objno, s3obj_compact_abort(&p->objs, nv.objno));
		s3_del_queue(p, &nv); /* it may have been stored all the same */
	}
	s3_counters(p);
	pthread_mutex_unlock(&d->lock);
	p->compacting = false;
	s3_idle(p, x);
}

/* A packed object's GET (one reader fewer) or PUT (stored, or not) ended with res. */
static void s3_object_done(struct s3_priv *p, enum s3_job job, const struct s3obj_version *v,
			   long res)
{
	pthread_mutex_lock(&p->d->lock);
	if (job == S3_JOB_READ)
		s3obj_get(&p->objs, v->objno)->gets--;
	else if (res >= 0)
		s3obj_stored(&p->objs, v->objno, v->gen, v->layout);
	else
		s3obj_put_failed(&p->objs, v->objno);
	s3_counters(p);
	pthread_mutex_unlock(&p->d->lock);
}

/* The job on x ended with res (bytes moved, or -errno). */
static void s3_complete(struct s3_priv *p, struct s3_xfer *x, long res)
{
	struct tb_io *rs[S3OBJ_PACK_MAX];
	struct s3obj_version v = x->v;
	enum s3_job job = x->job;
	unsigned nr = x->nr;

	if (res < 0 && job != S3_JOB_DELETE)
		s3_log_failure(p, x);
	memcpy(rs, x->rs, nr * sizeof(*rs));
	switch (job) {
	case S3_JOB_READ:
	case S3_JOB_WRITE:
		if (job == S3_JOB_WRITE)
			p->nputs--;
		if (p->pack)
			s3_object_done(p, job, &v, res);
		s3_idle(p, x);
		s3_finish_reqs(p, rs, nr, res);
		break;
	case S3_JOB_DELETE:
		p->ndeletes--;
		s3_delete_done(p, x, res);
		s3_idle(p, x);
		break;
	case S3_JOB_COMPACT_GET:
		s3_compact_got(p, x, res);
		break;
	case S3_JOB_COMPACT_PUT:
		s3_compact_put_done(p, x, res);
		break;
	case S3_JOB_CHECK:
		s3_idle(p, x);
		break;
	}
}

static void s3_launch(struct s3_priv *p, struct s3_xfer *x)
{
	s3_attempt_prepare(x, dev_now_ns());
	if (curl_multi_add_handle(p->multi, x->easy) != CURLM_OK) {
		snprintf(x->curl_err, sizeof(x->curl_err), "cannot add a transfer to libcurl");
		x->code = CURLE_OUT_OF_MEMORY;
		if (x == &p->probe)
			p->probing = false;
		else
			s3_complete(p, x, -EIO);
	}
}

/* The earliest deadline of requests rs: each may take timeout after it was taken. */
static uint64_t reqs_deadline(const struct s3_priv *p, struct tb_io **rs, unsigned n)
{
	uint64_t first = rs[0]->start_ns;

	for (unsigned i = 1; i < n; i++)
		if (rs[i]->start_ns < first)
			first = rs[i]->start_ns;
	return first + p->timeout_ns;
}

/* Aim x at its job's key and start it, or fail the job. */
static void s3_go(struct s3_priv *p, struct s3_xfer *x, enum s3_method m, const char *key,
		  size_t off)
{
	int ret = s3_xfer_aim(x, m, key, off);

	if (ret < 0) {
		snprintf(x->curl_err, sizeof(x->curl_err), "%s", strerror(-ret));
		x->code = CURLE_OUT_OF_MEMORY;
		s3_complete(p, x, ret);
		return;
	}
	s3_launch(p, x);
}

/* ---- the engine: what to start ---- */

/* Hold a packed write until its object can go whole. */
static void s3_fill_add(struct s3_priv *p, struct tb_io *r, uint64_t now)
{
	uint64_t k = r->slot / p->pack;
	unsigned i = (unsigned)(r->slot % p->pack);
	struct s3_fill **pp = &p->fills, *f;

	while (*pp && (*pp)->objno != k)
		pp = &(*pp)->next;
	f = *pp;
	if (!f) {
		f = calloc(1, sizeof(*f));
		if (!f) {
			s3_finish_reqs(p, &r, 1, -ENOMEM);
			return;
		}
		f->objno = k;
		*pp = f; /* at the end: objects go in the order they were filled */
	}
	f->r[i] = r;
	f->got |= 1ULL << i;
	f->last_ns = now;
	f->push |= r->push;
	if (p->last_write_ns && now > p->last_write_ns)
		p->write_gap_ns = 0.8 * p->write_gap_ns + 0.2 * (double)(now - p->last_write_ns);
	p->last_write_ns = now;
	pthread_mutex_lock(&p->d->lock);
	s3obj_get(&p->objs, k)->held++;
	pthread_mutex_unlock(&p->d->lock);
}

/* How long partly filled object f waits for its next block. */
static uint64_t pack_wait_ns(const struct s3_priv *p, const struct s3_fill *f)
{
	double w = S3_PACK_WAIT_GAPS * p->write_gap_ns;

	/*
	 * Nobody waits for these (no fsync, no unmount, no age limit): the
	 * most. The flusher sends objects whole when it can, and at 2 ms a
	 * flusher preempted halfway through a batch on a loaded machine
	 * closed objects with part of their blocks: more PUTs, and more GETs
	 * to read them back.
	 */
	if (!f->push)
		return S3_PACK_WAIT_MAX_NS;

	if (w < S3_PACK_WAIT_MIN_NS)
		return S3_PACK_WAIT_MIN_NS;
	return w > S3_PACK_WAIT_MAX_NS ? S3_PACK_WAIT_MAX_NS : (uint64_t)w;
}

/*
 * Whether f's object can go: every slot handed out of it is here (the
 * others were freed), and the allocator has moved on, or has given it
 * nothing for pack_wait_ns (then it moves on now). Otherwise *wait says
 * when to look again. d->lock held.
 */
static bool s3_fill_ready(struct s3_priv *p, struct s3_fill *f, uint64_t now, uint64_t *wait)
{
	struct s3obj *o = s3obj_get(&p->objs, f->objno);
	uint64_t due = f->last_ns + pack_wait_ns(p, f);

	if ((f->got & o->used) != o->used)
		return false; /* more requests to come */
	if (p->objs.open == f->objno) {
		if (now < due) {
			if (due - now < *wait)
				*wait = due - now;
			return false;
		}
		s3obj_close(&p->objs, f->objno);
	}
	return true;
}

static void s3_start_put(struct s3_priv *p, struct s3_xfer *x, struct s3_fill *f)
{
	char key[64];

	pthread_mutex_lock(&p->d->lock);
	x->v = (struct s3obj_version){f->objno, p->objs.next_gen++, f->got, false, false};
	pthread_mutex_unlock(&p->d->lock);
	x->job = S3_JOB_WRITE;
	for (unsigned i = 0; i < p->pack; i++)
		if (f->got & (1ULL << i))
			x->rs[x->nr++] = f->r[i];
	x->len = x->nr * p->d->block_size;
	x->slot = x->rs[0]->slot;
	x->deadline_ns = reqs_deadline(p, x->rs, x->nr);
	free(f);
	pk_key(key, sizeof(key), &x->v);
	p->nputs++;
	s3_go(p, x, S3_PUT, key, 0);
}

/* An unpacked tier: one slot, one object. */
static void s3_start_single(struct s3_priv *p, struct s3_xfer *x, struct tb_io *r)
{
	char key[sizeof(S3_BLK_DIR) + 16];

	snprintf(key, sizeof(key), S3_BLK_DIR "%016llx", (unsigned long long)r->slot);
	x->job = r->op == IO_READ ? S3_JOB_READ : S3_JOB_WRITE;
	x->rs[0] = r;
	x->nr = 1;
	x->len = r->len;
	x->slot = r->slot;
	x->deadline_ns = r->start_ns + p->timeout_ns;
	if (r->op == IO_WRITE)
		p->nputs++;
	s3_go(p, x, r->op == IO_READ ? S3_GET : S3_PUT, key, 0);
}

/* Take q off the list of reads waiting; pp points at the link to it. */
static void unlink_read(struct s3_priv *p, struct tb_io **pp, struct tb_io *prev)
{
	struct tb_io *q = *pp;

	*pp = q->next;
	if (p->reads_tail == q)
		p->reads_tail = prev;
	q->next = NULL;
}

/*
 * Start the first waiting read on x, with every waiting read of the same
 * object that extends its byte range: one ranged GET. False when x was not
 * used (the block is missing from its object: the read failed).
 */
static bool s3_start_read(struct s3_priv *p, struct s3_xfer *x)
{
	struct tb_dev *d = p->d;
	struct tb_io *r = p->reads;
	size_t bs = d->block_size;
	int64_t lo, hi;
	bool grew = true;
	char key[64];
	uint64_t k;

	unlink_read(p, &p->reads, NULL);
	if (!p->pack) {
		s3_start_single(p, x, r);
		return true;
	}
	k = r->slot / p->pack;
	pthread_mutex_lock(&d->lock);
	lo = s3obj_offset(&p->objs, r->slot, bs);
	if (lo < 0) {
		pthread_mutex_unlock(&d->lock);
		if (log_ratelimit(&p->err_log_sec[1], S3_LOG_INTERVAL_S))
			log_err("%s: slot %llu is in no object of the bucket", d->name,
				(unsigned long long)r->slot);
		s3_finish_reqs(p, &r, 1, -EIO);
		return false;
	}
	hi = lo + (int64_t)bs;
	x->rs[0] = r;
	x->nr = 1;
	while (grew && x->nr < p->pack) {
		struct tb_io **pp = &p->reads, *prev = NULL;

		grew = false;
		while (*pp && x->nr < p->pack) {
			struct tb_io *q = *pp;
			int64_t off =
			    q->slot / p->pack == k ? s3obj_offset(&p->objs, q->slot, bs) : -1;

			if (off >= 0 && (off == hi || off + (int64_t)bs == lo)) {
				unlink_read(p, pp, prev);
				if (off == hi) {
					x->rs[x->nr++] = q;
					hi += (int64_t)bs;
				} else {
					memmove(x->rs + 1, x->rs, x->nr * sizeof(*x->rs));
					x->rs[0] = q;
					x->nr++;
					lo -= (int64_t)bs;
				}
				grew = true;
				continue;
			}
			prev = q;
			pp = &q->next;
		}
	}
	struct s3obj *o = s3obj_get(&p->objs, k);
	o->gets++;
	x->v = (struct s3obj_version){k, o->gen, o->layout, false, false};
	pthread_mutex_unlock(&d->lock);
	x->job = S3_JOB_READ;
	x->len = (size_t)(hi - lo);
	x->slot = x->rs[0]->slot;
	x->deadline_ns = reqs_deadline(p, x->rs, x->nr);
	pk_key(key, sizeof(key), &x->v);
	s3_go(p, x, S3_GET, key, (size_t)lo);
	return true;
}

/* The next packed object ready to go, taken off the list; *wait as s3_fill_ready. */
static struct s3_fill *s3_ready_fill(struct s3_priv *p, uint64_t now, uint64_t *wait)
{
	struct s3_fill **pp = &p->fills, *f = NULL;

	pthread_mutex_lock(&p->d->lock);
	while (*pp && !s3_fill_ready(p, *pp, now, wait))
		pp = &(*pp)->next;
	if (*pp) {
		f = *pp;
		*pp = f->next;
	}
	pthread_mutex_unlock(&p->d->lock);
	return f;
}

/* When a partly filled object stops waiting for more, if the allocator still fills it. */
static void s3_fills_wait(struct s3_priv *p, uint64_t now, uint64_t *wait)
{
	pthread_mutex_lock(&p->d->lock);
	for (struct s3_fill *f = p->fills; f; f = f->next) {
		uint64_t due = f->last_ns + pack_wait_ns(p, f), left = due > now ? due - now : 0;

		if (p->objs.open == f->objno && left < *wait)
			*wait = left;
	}
	pthread_mutex_unlock(&p->d->lock);
}

/* A delete that is due and that no running GET could trip over, taken off the queue. */
static struct s3_del *s3_due_delete(struct s3_priv *p, uint64_t now, uint64_t *wait)
{
	struct s3_del **pp = &p->dels, *dl = NULL, *prev = NULL;

	pthread_mutex_lock(&p->d->lock);
	for (; *pp; prev = *pp, pp = &(*pp)->next) {
		struct s3obj *o = s3obj_get(&p->objs, (*pp)->v.objno);

		if ((*pp)->due_ns > now) {
			if ((*pp)->due_ns - now < *wait)
				*wait = (*pp)->due_ns - now;
			continue;
		}
		if (o && o->gets)
			continue;
		dl = *pp;
		*pp = dl->next;
		if (p->dels_tail == dl)
			p->dels_tail = prev;
		break;
	}
	pthread_mutex_unlock(&p->d->lock);
	return dl;
}

static bool s3_queue_empty(struct tb_dev *d)
{
	bool empty = true;

	pthread_mutex_lock(&d->lock);
	for (int c = 0; c < IO_NCLASS; c++)
		if (d->head[c])
			empty = false;
	pthread_mutex_unlock(&d->lock);
	return empty;
}

static bool s3_dev_down(struct tb_dev *d);

/* Compaction, when the device has nothing else to do. */
static bool s3_start_compaction(struct s3_priv *p, struct s3_xfer *x)
{
	struct tb_dev *d = p->d;
	struct s3obj *o;
	char key[64];
	uint64_t k;

	pthread_mutex_lock(&d->lock);
	k = d->stopping ? S3OBJ_NONE : s3obj_compact_next(&p->objs);
	if (k == S3OBJ_NONE) {
		pthread_mutex_unlock(&d->lock);
		return false;
	}
	o = s3obj_get(&p->objs, k);
	o->gets++;
	x->v = (struct s3obj_version){k, o->gen, o->layout, false, false};
	pthread_mutex_unlock(&d->lock);
	x->job = S3_JOB_COMPACT_GET;
	x->dst = p->compact_buf;
	x->len = (size_t)__builtin_popcountll(x->v.layout) * d->block_size;
	x->slot = k * p->pack;
	x->deadline_ns = dev_now_ns() + p->timeout_ns;
	p->compacting = true;
	pk_key(key, sizeof(key), &x->v);
	s3_go(p, x, S3_GET, key, 0);
	return true;
}

static struct s3_xfer *take_idle(struct s3_priv *p)
{
	struct s3_xfer *x = p->idle;

	p->idle = x->next;
	x->next = NULL;
	return x;
}

/*
 * Start what idle handles can: reads first (neighbours in one GET), then
 * whole objects to write (a quarter of the handles while reads wait), then
 * deletes and compaction when no read waits. Returns ns until a partly
 * filled object or a delete is due.
 */
static uint64_t s3_dispatch(struct s3_priv *p, uint64_t now)
{
	uint64_t wait = UINT64_MAX;
	unsigned put_share = (p->nx + S3_PUT_SHARE - 1) / S3_PUT_SHARE;

	while (p->idle && p->reads) {
		struct s3_xfer *x = take_idle(p);

		if (!s3_start_read(p, x)) {
			x->next = p->idle;
			p->idle = x;
		}
	}
	while (p->idle && (!p->reads || p->nputs < put_share)) {
		struct s3_fill *f = NULL;

		if (!p->pack && p->writes) {
			struct tb_io *r = p->writes;

			p->writes = r->next;
			if (!p->writes)
				p->writes_tail = NULL;
			s3_start_single(p, take_idle(p), r);
			continue;
		}
		if (p->pack)
			f = s3_ready_fill(p, now, &wait);
		if (!f)
			break;
		s3_start_put(p, take_idle(p), f);
	}
	if (p->pack && p->fills)
		s3_fills_wait(p, now, &wait);
	if (!p->pack || s3_dev_down(p->d))
		return wait;
	/* While reads wait, one DELETE at a time, so dead objects do not pile up. */
	while (p->idle && (!p->reads || !p->ndeletes)) {
		struct s3_del *dl = s3_due_delete(p, now, &wait);
		struct s3_xfer *x;
		char key[64];

		if (!dl)
			break;
		x = take_idle(p);
		x->job = S3_JOB_DELETE;
		x->v = dl->v;
		x->slot = dl->v.objno * p->pack;
		x->deadline_ns = now + p->timeout_ns;
		free(dl);
		pk_key(key, sizeof(key), &x->v);
		p->ndeletes++;
		s3_go(p, x, S3_DELETE, key, 0);
	}
	if (p->idle && !p->reads && !p->compacting && !p->fills && s3_queue_empty(p->d)) {
		struct s3_xfer *x = take_idle(p);

		if (!s3_start_compaction(p, x)) {
			x->next = p->idle;
			p->idle = x;
		}
	}
	return wait;
}

/*
 * The device is driven hard while the engine holds requests it has no
 * handle for: reads waiting, or objects ready to go. (Its depth is large,
 * so its queue is rarely where they wait.)
 */
static void s3_backlog(struct s3_priv *p, uint64_t now)
{
	unsigned n = 0;
	uint64_t wait = UINT64_MAX;

	for (struct tb_io *r = p->reads; r; r = r->next)
		n++;
	pthread_mutex_lock(&p->d->lock);
	if (!p->idle)
		for (struct s3_fill *f = p->fills; f; f = f->next)
			n += s3_fill_ready(p, f, now, &wait);
	if (n != p->d->backlog) {
		dev_load_tick(p->d, now);
		p->d->backlog = n;
	}
	pthread_mutex_unlock(&p->d->lock);
}

/* Take what the queue allows: reads wait for a handle, writes for their object. */
static void s3_take(struct s3_priv *p, uint64_t now)
{
	struct tb_io *batch[S3_TAKE_MAX];
	unsigned n = dev_take(p->d, batch, S3_TAKE_MAX);

	for (unsigned i = 0; i < n; i++) {
		struct tb_io *r = batch[i];

		r->next = NULL;
		if (r->op == IO_READ) {
			if (p->reads_tail)
				p->reads_tail->next = r;
			else
				p->reads = r;
			p->reads_tail = r;
		} else if (!p->pack) {
			if (p->writes_tail)
				p->writes_tail->next = r;
			else
				p->writes = r;
			p->writes_tail = r;
		} else {
			s3_fill_add(p, r, now);
		}
	}
}

static bool s3_dev_down(struct tb_dev *d)
{
	bool down;

	pthread_mutex_lock(&d->lock);
	down = d->health == DEV_DOWN;
	pthread_mutex_unlock(&d->lock);
	return down;
}

/*
 * Attempts that find no server at all take the device down at once, without
 * waiting for requests to run out of time: writes then go elsewhere and
 * stop holding connections that reads need.
 */
static void s3_count_no_server(struct s3_priv *p, struct s3_xfer *x)
{
	if (x->code != CURLE_COULDNT_CONNECT && x->code != CURLE_COULDNT_RESOLVE_HOST) {
		if (x->code == CURLE_OK)
			p->no_server = 0;
		return;
	}
	if (++p->no_server == S3_DOWN_AFTER_NO_SERVER)
		dev_set_health(p->d, false);
}

/* An attempt of a request ended: finish it, or put it in backoff. */
static void s3_attempt_done(struct s3_priv *p, struct s3_xfer *x)
{
	enum s3_verdict v;
	uint64_t now, wait;
	int err;

	s3_count_no_server(p, x);
	if (x == &p->probe) {
		p->probing = false;
		if (s3_judge(x, &err) == S3_DONE)
			dev_set_health(p->d, true);
		return;
	}
	/* Test builds: an attempt answered as by an overloaded server. */
	if (fault_inject(p->d->name, FAULT_S3_ATTEMPT, x->slot) == -EAGAIN) {
		x->code = CURLE_RECV_ERROR;
		snprintf(x->curl_err, sizeof(x->curl_err), "injected fault: HTTP 503");
	}
	v = s3_judge(x, &err);
	if (v == S3_DONE) {
		s3_complete(p, x, (long)x->len);
		return;
	}
	/* While down, a write goes elsewhere sooner than it would here. */
	if (v == S3_RETRY && !(x->method == S3_PUT && s3_dev_down(p->d))) {
		now = dev_now_ns();
		wait = s3_backoff_ns(p, x->attempts);
		if (now + wait < x->deadline_ns) {
			pthread_mutex_lock(&p->d->lock);
			p->d->retries++;
			pthread_mutex_unlock(&p->d->lock);
			x->retry_ns = now + wait;
			x->next = p->backoff;
			p->backoff = x;
			return;
		}
	}
	s3_complete(p, x, err);
}

/* Reap finished attempts; returns how many. */
static unsigned s3_reap(struct s3_priv *p)
{
	unsigned n = 0;
	CURLMsg *m;
	int left;

	while ((m = curl_multi_info_read(p->multi, &left))) {
		struct s3_xfer *x;
		char *priv = NULL;

		if (m->msg != CURLMSG_DONE)
			continue;
		curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, &priv);
		x = (struct s3_xfer *)priv;
		x->code = m->data.result;
		curl_multi_remove_handle(p->multi, x->easy);
		s3_attempt_done(p, x);
		n++;
	}
	return n;
}

/* Start the attempts whose backoff is over; returns ns to the next one. */
static uint64_t s3_retry_due(struct s3_priv *p, uint64_t now)
{
	struct s3_xfer **pp = &p->backoff;
	uint64_t next = UINT64_MAX;

	while (*pp) {
		struct s3_xfer *x = *pp;

		if (x->retry_ns > now) {
			if (x->retry_ns - now < next)
				next = x->retry_ns - now;
			pp = &x->next;
			continue;
		}
		*pp = x->next;
		s3_launch(p, x);
	}
	return next;
}

/* While the device is down, HEAD the identity object every probe interval. */
static uint64_t s3_probe_due(struct s3_priv *p, uint64_t now)
{
	struct s3_xfer *x = &p->probe;
	uint64_t limit =
	    p->timeout_ns < S3_PROBE_INTERVAL_NS ? p->timeout_ns : S3_PROBE_INTERVAL_NS;

	if (p->probing || !s3_dev_down(p->d))
		return UINT64_MAX;
	if (now < p->next_probe_ns)
		return p->next_probe_ns - now;
	p->next_probe_ns = now + S3_PROBE_INTERVAL_NS;
	if (s3_xfer_set(x, S3_HEAD, S3_ID_OBJ, NULL, NULL, 0) < 0)
		return S3_PROBE_INTERVAL_NS;
	x->deadline_ns = now + limit;
	p->probing = true;
	s3_launch(p, x);
	return S3_PROBE_INTERVAL_NS;
}

/*
 * Stopping, and nothing queued, in flight, held, in backoff or probing;
 * deletes are done first while the bucket answers, so that an unmount
 * leaves no dead object behind.
 */
static bool s3_finished(struct s3_priv *p)
{
	struct tb_dev *d = p->d;
	unsigned idle = 0;
	bool done;

	for (struct s3_xfer *x = p->idle; x; x = x->next)
		idle++;
	pthread_mutex_lock(&d->lock);
	done = d->stopping && !p->probing && idle == p->nx && (!p->dels || d->health == DEV_DOWN);
	for (int c = 0; c < IO_NCLASS; c++)
		if (d->head[c] || d->inflight[c])
			done = false;
	pthread_mutex_unlock(&d->lock);
	return done;
}

void *s3_thread(void *arg)
{
	struct tb_dev *d = arg;
	struct s3_priv *p = d->priv;

	dev_name_thread(d);
	while (!s3_finished(p)) {
		struct curl_waitfd wfd = {d->wake_efd, CURL_WAIT_POLLIN, 0};
		uint64_t now = dev_now_ns(), wait_ns, t;
		int running, nfds;

		wait_ns = s3_retry_due(p, now);
		t = s3_probe_due(p, now);
		wait_ns = t < wait_ns ? t : wait_ns;
		s3_take(p, now);
		t = s3_dispatch(p, now);
		wait_ns = t < wait_ns ? t : wait_ns;
		s3_backlog(p, now);
		t = dev_throttle_ns(d);
		if (t && t < wait_ns)
			wait_ns = t;
		curl_multi_perform(p->multi, &running);
		if (s3_reap(p))
			continue; /* handles came free: take more before waiting */
		t = wait_ns / NS_PER_MS + 1;
		curl_multi_poll(p->multi, &wfd, 1, t < S3_POLL_MAX_MS ? (int)t : S3_POLL_MAX_MS,
				&nfds);
		if (wfd.revents)
			dev_drain_efd(d->wake_efd);
	}
	return NULL;
}

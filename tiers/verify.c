/*
 * verify.c - blocks read from the devices, checked against the hash their
 * records keep (tb.h): the check, the threads that make it for the cache's
 * loads, and the scrub's reads; and tb_hash, the hash itself (xxHash).
 *
 * A load whose device read ended goes from the device's thread to a queue
 * that verifiers take from (one thread per CPU, VERIFY_THREADS_MAX at
 * most): the entry stays LOADING, its bytes seen by no one, until a
 * verifier has hashed the slot and compared, then cache_load_done makes it
 * CLEAN and answers its readers, or drops it and answers EIO. Hashed on the
 * device's thread, a cold 1 MiB block (DMA put it there) held up the
 * completions and submissions behind it for about 130 us. The reads that
 * complete a partial write and dedup's verify wait for their read anyway,
 * and check it on their own thread.
 *
 * Mechanism: it may call entry.c (the end of a load), and the devices for
 * the scrub's reads; load.c and flush.c call it.
 */
#include "cache_int.h"
#include "log.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>
#if defined(__x86_64__)
/*
 * The same hash through the library's dispatcher, which picks the widest
 * vector unit the CPU has (AVX2, AVX-512) at run time: 2.3x the plain
 * entry point's speed on this project's build machine.
 */
#include <xxh_x86dispatch.h>
#endif

#define CHECK_BYTES (16UL << 20) /* the scrub reads this much at once, or one block */
#define SUM_LOG_QUIET_MS 10000	 /* a damaged block is logged once in this long */

/* ---- the check ---- */

void tb_hash(const void *data, size_t len, uint8_t out[TB_HASH_LEN])
{
	XXH128_hash_t h = XXH3_128bits(data, len);

	memcpy(out, &h.low64, 8);
	memcpy(out + 8, &h.high64, 8);
}

/*
 * The hash a block's record keeps, of the whole block (block_size bytes:
 * its stored bytes and the zeros past them). The collision test hook makes
 * every block hash alike, reads included, so that its reads still pass.
 */
void cache_hash(const struct tb_store *s, const void *block, uint8_t out[TB_HASH_LEN])
{
	if (s->cfg.test_collide) {
		uint64_t one = 1; /* every block collides: dedup's verify must hold */

		memcpy(out, &one, 8);
		memcpy(out + 8, &one, 8);
		return;
	}
	tb_hash(block, s->bs, out);
}

/* The hash a read is checked against: none when it has none, or checksum=off. */
const uint8_t *cache_read_sum(const struct tb_store *s, bool hashed, const uint8_t *hash)
{
	return hashed && !s->cfg.no_checksum ? hash : NULL;
}

/*
 * Whether a damaged block at loc is to be logged: not when it was in the
 * last SUM_LOG_QUIET_MS, so that the reads a reader retries (the kernel's
 * readahead, then its own read) leave the log's lines of this format
 * (log.c holds it to a few a second) for the other damaged blocks.
 */
static bool sum_log_first(struct tb_store *s, uint64_t loc)
{
	uint64_t now = now_ms();
	unsigned oldest = 0;

	pthread_mutex_lock(&s->lock);
	for (unsigned i = 0; i < SUM_LOG_RING; i++) {
		if (s->sum_logged[i].loc == loc && s->sum_logged[i].ms &&
		    now - s->sum_logged[i].ms < SUM_LOG_QUIET_MS) {
			pthread_mutex_unlock(&s->lock);
			return false;
		}
		if (s->sum_logged[i].ms < s->sum_logged[oldest].ms)
			oldest = i;
	}
	s->sum_logged[oldest].loc = loc;
	s->sum_logged[oldest].ms = now;
	pthread_mutex_unlock(&s->lock);
	return true;
}

/*
 * Check a whole block read from loc against the hash its record keeps
 * (NULL: it keeps none, or checksum=off: nothing to check). 0, or -EIO
 * when they differ: logged, naming block idx of inode obj unless obj is
 * CACHE_NO_OBJ, and counted. No lock held.
 */
int cache_check(struct tb_store *s, const void *block, const uint8_t *hash, uint64_t loc,
		uint64_t obj, uint64_t idx)
{
	uint8_t got[TB_HASH_LEN];
	unsigned dev = tb_loc_dev(loc);

	if (!hash) {
		__atomic_add_fetch(&s->sum_unverified, 1, __ATOMIC_RELAXED);
		return 0;
	}
	cache_hash(s, block, got);
	__atomic_add_fetch(&s->sum_verified, 1, __ATOMIC_RELAXED);
	if (memcmp(got, hash, TB_HASH_LEN) == 0)
		return 0;
	__atomic_add_fetch(&s->sum_errors, 1, __ATOMIC_RELAXED);
	if (dev < s->n_devs)
		__atomic_add_fetch(&s->sum_dev_errors[dev], 1, __ATOMIC_RELAXED);
	if (!sum_log_first(s, loc))
		return -EIO;
	if (obj != CACHE_NO_OBJ)
		log_err("checksum mismatch: inode %llu block %llu, read from %s slot %llu, does "
			"not match its hash; not served (EIO)",
			(unsigned long long)obj, (unsigned long long)idx,
			dev < s->n_devs ? s->dev[dev]->name : "?",
			(unsigned long long)tb_loc_slot(loc));
	else
		log_err("checksum mismatch: the block read from %s slot %llu does not match "
			"its hash",
			dev < s->n_devs ? s->dev[dev]->name : "?",
			(unsigned long long)tb_loc_slot(loc));
	return -EIO;
}

/* ---- the verifiers ---- */

static void *verify_main(void *arg)
{
	struct tb_store *s = arg;

	pthread_setname_np(pthread_self(), "tfs-verify");
	dev_io_priority(); /* they gate every read, as the devices' threads do */
	pthread_mutex_lock(&s->verify_lock);
	for (;;) {
		struct tb_io *r = s->verify_head;

		if (!r && s->verify_stopping)
			break;
		if (!r) {
			pthread_cond_wait(&s->verify_cv, &s->verify_lock);
			continue;
		}
		s->verify_head = r->next;
		if (!s->verify_head)
			s->verify_tail = NULL;
		pthread_mutex_unlock(&s->verify_lock);

		struct tb_entry *e =
		    (struct tb_entry *)((char *)r - offsetof(struct tb_entry, req));

		cache_load_done(
		    e, cache_check(s, cache_slot_data(s, e), e->hash, e->loc, e->obj, e->idx));
		pthread_mutex_lock(&s->verify_lock);
	}
	pthread_mutex_unlock(&s->verify_lock);
	return NULL;
}

void verify_load(struct tb_store *s, struct tb_entry *e)
{
	pthread_mutex_lock(&s->verify_lock);
	e->req.next = NULL;
	if (s->verify_tail)
		s->verify_tail->next = &e->req;
	else
		s->verify_head = &e->req;
	s->verify_tail = &e->req;
	pthread_cond_signal(&s->verify_cv);
	pthread_mutex_unlock(&s->verify_lock);
}

int verify_start(struct tb_store *s)
{
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	unsigned n = cpus < 1 ? 1 : cpus > VERIFY_THREADS_MAX ? VERIFY_THREADS_MAX : (unsigned)cpus;
	int ret;

	pthread_mutex_init(&s->verify_lock, NULL);
	pthread_cond_init(&s->verify_cv, NULL);
	s->verify_started = true;
	for (s->nverifiers = 0; s->nverifiers < n; s->nverifiers++) {
		ret = pthread_create(&s->verifier[s->nverifiers], NULL, verify_main, s);
		if (ret)
			return -ret;
	}
	return 0;
}

void verify_stop(struct tb_store *s)
{
	if (!s->verify_started)
		return;
	pthread_mutex_lock(&s->verify_lock);
	s->verify_stopping = true; /* each goes once the queue is empty */
	pthread_cond_broadcast(&s->verify_cv);
	pthread_mutex_unlock(&s->verify_lock);
	for (unsigned i = 0; i < s->nverifiers; i++)
		pthread_join(s->verifier[i], NULL);
	pthread_mutex_destroy(&s->verify_lock);
	pthread_cond_destroy(&s->verify_cv);
	s->verify_started = false;
}

/* ---- the scrub's reads ---- */

/* The scrub's reads in flight: tb_check_stored waits until none is left. */
struct check_wait {
	pthread_mutex_t m;
	pthread_cond_t cv;
	size_t left;
};

struct check_io {
	struct tb_io io;
	struct check_wait *w;
	int err;
};

static void check_io_done(struct tb_io *r, int err)
{
	struct check_io *x = (struct check_io *)r;

	pthread_mutex_lock(&x->w->m);
	x->err = err;
	if (--x->w->left == 0)
		pthread_cond_signal(&x->w->cv);
	pthread_mutex_unlock(&x->w->m);
}

/* Read and check v[0..n), n at most CHECK_BYTES / bs, all at once. No lock held. */
static void check_some(struct tb_store *s, struct tb_check *v, size_t n, struct check_io *x,
		       char *bufs)
{
	struct check_wait w = {.left = 0};

	pthread_mutex_init(&w.m, NULL);
	pthread_cond_init(&w.cv, NULL);
	for (size_t i = 0; i < n; i++) {
		v[i].result = cache_stored_ok(s, v[i].loc, v[i].len) ? 0 : -EIO;
		if (v[i].result == 0)
			w.left++;
	}
	for (size_t i = 0; i < n; i++) {
		char *buf = bufs + i * s->bs;
		size_t io = cache_io_len(v[i].len);

		if (v[i].result)
			continue;
		memset(buf + io, 0, s->bs - io);
		x[i] = (struct check_io){.w = &w};
		x[i].io.op = IO_READ;
		x[i].io.cls = IO_PREFETCH; /* below the readers' demand */
		x[i].io.slot = tb_loc_slot(v[i].loc);
		x[i].io.buf = buf;
		x[i].io.len = io;
		x[i].io.done = check_io_done;
		dev_submit(s->dev[tb_loc_dev(v[i].loc)], &x[i].io);
	}
	pthread_mutex_lock(&w.m);
	while (w.left)
		pthread_cond_wait(&w.cv, &w.m);
	pthread_mutex_unlock(&w.m);
	pthread_mutex_destroy(&w.m);
	pthread_cond_destroy(&w.cv);
	for (size_t i = 0; i < n; i++) {
		if (v[i].result)
			continue;
		v[i].result = x[i].err;
		if (!v[i].result && cache_check(s, bufs + i * s->bs, v[i].hashed ? v[i].hash : NULL,
						v[i].loc, CACHE_NO_OBJ, 0) != 0)
			v[i].result = -EBADMSG;
	}
}

int tb_check_stored(struct tb_store *s, struct tb_check *v, size_t n)
{
	size_t most = CHECK_BYTES / s->bs ? CHECK_BYTES / s->bs : 1;
	struct check_io *x = calloc(most, sizeof(*x));
	char *bufs = NULL;
	int ret = -ENOMEM;

	if (!x || posix_memalign((void **)&bufs, IO_ALIGN, most * s->bs))
		goto out;
	for (size_t i = 0; i < n; i += most)
		check_some(s, v + i, n - i < most ? n - i : most, x, bufs);
	ret = 0;
out:
	free(bufs);
	free(x);
	return ret;
}

/*
 * test_flush_starve.c - a writer that needs a slot gets one, with clean
 * blocks pinned.
 *
 * Read pins hold more clean blocks than the flusher's reserve wants, and
 * every other slot is dirty, under the flusher's mark. The reserve once
 * counted the pinned blocks, which cannot be evicted: nothing the flusher
 * did by the marks freed a slot, and a write to a new block waited for
 * ever. Two cases, each on a store of its own over a real nvme folder
 * (O_DIRECT, in TMPDIR or /var/tmp; libaio, since under valgrind, which
 * CI runs the unit tests in too, the io_uring engine's thread waiting in
 * io_uring_enter held every other thread up for good):
 *
 *   1. no learned cycle: the flusher makes the reserve of slots that can
 *      go, and the write takes one;
 *   2. a learned cycle just larger than what the cache keeps, with every
 *      dirty block one that stays (update_keep), those that do not held
 *      by a writer: blocks that stay are not written back for the
 *      reserve, so the write waits, and the flusher cleans one for it
 *      (flush_starved), a block that stays since no other can go.
 *
 * The owner is a block map in memory, as fs/ keeps one in LMDB.
 */
#include "cache_int.h"
#include "tb.h"
#include "test.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BS (64 * 1024)
#define DRAM (16 * 1024 * 1024)
#define OBJ_BLOCKS 64	  /* blocks per object of the fill */
#define MAX_OBJ 16
#define WAIT_S 20	  /* the starved writer must have its slot by then */
#define PINNED_OBJ 1
#define NEW_OBJ (MAX_OBJ - 1)

/* ---- the owner: a block map in memory, and the cycle the case says ---- */

struct owner {
	pthread_mutex_t lock;
	uint64_t loc[MAX_OBJ][OBJ_BLOCKS];
	size_t len[MAX_OBJ][OBJ_BLOCKS];
	bool stored[MAX_OBJ][OBJ_BLOCKS];
	uint64_t cycle_blocks; /* 0: no cycle */
};

static int o_resolve(void *ctx, uint64_t obj, uint64_t idx, struct tb_stored *at)
{
	struct owner *o = ctx;
	int ret = -ENOENT;

	CHECK(obj < MAX_OBJ && idx < OBJ_BLOCKS);
	pthread_mutex_lock(&o->lock);
	if (o->stored[obj][idx]) {
		at->loc = o->loc[obj][idx];
		at->len = o->len[obj][idx];
		ret = 0;
	}
	pthread_mutex_unlock(&o->lock);
	return ret;
}

static int o_commit(void *ctx, const struct tb_commit *c, size_t n)
{
	struct owner *o = ctx;

	pthread_mutex_lock(&o->lock);
	for (size_t i = 0; i < n; i++) {
		CHECK(c[i].obj < MAX_OBJ && c[i].idx < OBJ_BLOCKS && !c[i].share_id);
		o->stored[c[i].obj][c[i].idx] = c[i].loc != TB_LOC_NONE;
		o->loc[c[i].obj][c[i].idx] = c[i].loc;
		o->len[c[i].obj][c[i].idx] = c[i].len;
	}
	pthread_mutex_unlock(&o->lock);
	return 0;
}

static int o_dedup_find(void *ctx, const uint8_t *hash, uint64_t *id, uint64_t *loc, size_t *len)
{
	(void)ctx, (void)hash, (void)id, (void)loc, (void)len;
	return -ENOENT;
}

static int o_sync(void *ctx, int (*flush)(void *arg), void *arg, bool power)
{
	(void)ctx, (void)power;
	return flush ? flush(arg) : 0;
}

static uint64_t o_cycle_period(void *ctx)
{
	struct owner *o = ctx;

	return o->cycle_blocks ? MAX_OBJ : 0;
}

/* Objects are used in the order of their numbers; the pinned one next. */
static void o_next_use(void *ctx, uint64_t obj, struct tb_use *u)
{
	(void)ctx;
	u->dist = obj;
	u->write = false;
	u->now = false;
	u->size = (uint64_t)OBJ_BLOCKS * BS;
}

static void o_cycle_size(void *ctx, uint64_t *blocks, uint64_t *tails, uint64_t *written)
{
	struct owner *o = ctx;

	*blocks = o->cycle_blocks;
	*tails = 0;
	*written = o->cycle_blocks;
}

/* ---- the case ---- */

struct waiter {
	struct tb_store *s;
	int ret;
	struct tb_ref ref;
};

static void *write_new(void *arg)
{
	struct waiter *w = arg;

	w->ret = tb_get_write(w->s, NEW_OBJ, 0, 0, BS, false, &w->ref, NULL, NULL);
	if (!w->ret) {
		memset(w->ref.data, 0x5A, BS);
		tb_put_dirty(w->s, &w->ref, 0, BS);
	}
	return NULL;
}

static uint64_t locked_u64(struct tb_store *s, const uint64_t *field)
{
	uint64_t v;

	pthread_mutex_lock(&s->lock);
	v = *field;
	pthread_mutex_unlock(&s->lock);
	return v;
}

/* Free slots and clean ones not pinned: the test holds npin clean blocks pinned. */
static uint64_t can_go(struct tb_store *s, uint64_t npin)
{
	uint64_t v;

	pthread_mutex_lock(&s->lock);
	v = s->free_list.n + s->nclean - npin;
	pthread_mutex_unlock(&s->lock);
	return v;
}

static void fill_block(struct tb_store *s, uint64_t obj, uint64_t idx, struct tb_ref *ref)
{
	CHECK_EQ(tb_get_write(s, obj, idx, 0, BS, false, ref, NULL, NULL), 0);
	memset(ref->data, (int)(obj * 7 + idx + 1), BS);
}

static void check_block(struct tb_store *s, uint64_t obj, uint64_t idx)
{
	struct tb_ref ref;

	CHECK_EQ(tb_get(s, obj, idx, &ref, NULL), 0);
	for (size_t i = 0; i < BS; i += 4096)
		CHECK_EQ(((unsigned char *)ref.data)[i], (obj * 7 + idx + 1) & 0xFF);
	tb_put(s, &ref, 0);
}

static void run_case(const char *dir, bool cycle)
{
	static struct owner o;
	struct tb_dev_spec dev = {.kind = TB_KIND_NVME, .path = dir};
	struct tb_config cfg = {
		.block_size = BS,
		.dram_bytes = DRAM,
		.store_id = "starve-test",
		.devs = &dev,
		.n_devs = 1,
		.engine = TB_ENGINE_AIO,
		.queue_depth = 8,
		.sync_interval_ms = 1000,
		.max_pinned = 16,
	};
	struct tb_owner own = {
		.ctx = &o,
		.resolve = o_resolve,
		.commit = o_commit,
		.dedup_find = o_dedup_find,
		.sync = o_sync,
		.cycle_period = o_cycle_period,
		.next_use = o_next_use,
		.cycle_size = o_cycle_size,
	};
	struct tb_ref pins[OBJ_BLOCKS], held[MAX_OBJ * OBJ_BLOCKS];
	struct tb_store *s;
	struct waiter w = {0};
	struct timespec until;
	pthread_t t;
	uint64_t npin, nheld = 0, nfill = 0, low;
	char err[256];

	memset(&o, 0, sizeof(o));
	pthread_mutex_init(&o.lock, NULL);
	if (tb_open(&cfg, &own, &s, err, sizeof(err))) {
		fprintf(stderr, "tb_open: %s\n", err);
		exit(1);
	}
	CHECK_EQ(tb_start(s), 0);
	low = s->clean_low;
	/* More than the reserve wants, and enough that the rest is under the mark. */
	npin = 3 * low + 2;
	CHECK(npin <= OBJ_BLOCKS);
	if (cycle) {
		/* Just over what stays: nearly every block stays. */
		o.cycle_blocks = s->dirty_max - s->pf_win.depth + 1;
	}

	/* Clean blocks, read-pinned. */
	for (uint64_t i = 0; i < npin; i++) {
		fill_block(s, PINNED_OBJ, i, &pins[i]);
		tb_put_dirty(s, &pins[i], 0, BS);
	}
	CHECK_EQ(tb_flush_obj(s, PINNED_OBJ), 0);
	for (uint64_t i = 0; i < npin; i++)
		CHECK_EQ(tb_get(s, PINNED_OBJ, i, &pins[i], NULL), 0);
	if (cycle) {
		/* The flusher has looked at the cycle (update_keep) by now. */
		for (int i = 0; i < 500 && !locked_u64(s, &s->keep_den); i++)
			usleep(10000);
		CHECK(locked_u64(s, &s->keep_den) != 0);
	}

	/*
	 * Every other slot dirty. Under the cycle, a block that does not stay
	 * is held by its writer, so that the flusher may not take it.
	 */
	for (uint64_t obj = PINNED_OBJ + 1; obj < NEW_OBJ && locked_u64(s, &s->free_list.n); obj++)
		for (uint64_t i = 0; i < OBJ_BLOCKS && locked_u64(s, &s->free_list.n); i++) {
			struct tb_ref ref;
			bool kept;

			fill_block(s, obj, i, &ref);
			pthread_mutex_lock(&s->lock);
			kept = evict_kept(s, ref.e);
			pthread_mutex_unlock(&s->lock);
			if (!kept) {
				held[nheld++] = ref;
				continue;
			}
			tb_put_dirty(s, &ref, 0, BS);
			nfill++;
		}
	pthread_mutex_lock(&s->lock);
	CHECK(s->ndirty + low <= s->dirty_max); /* under the flusher's mark */
	pthread_mutex_unlock(&s->lock);
	if (!cycle) {
		/* The reserve is made of slots that can go, not of the pinned ones. */
		for (int i = 0; i < 500 && can_go(s, npin) < low; i++)
			usleep(10000);
		CHECK(can_go(s, npin) >= low);
	} else {
		/*
		 * Blocks that stay are not written back for the reserve. A
		 * negative: the flusher has 100 ms to do what it must not.
		 */
		usleep(100000);
		pthread_mutex_lock(&s->lock);
		CHECK_EQ(s->free_list.n, 0);
		CHECK_EQ(s->nclean, npin);
		CHECK_EQ(s->wb_inflight, 0);
		pthread_mutex_unlock(&s->lock);
		CHECK(nheld < nfill / 8);
	}

	/* A write to a new block: before the fix it waited for ever. */
	w.s = s;
	CHECK_EQ(pthread_create(&t, NULL, write_new, &w), 0);
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += WAIT_S;
	if (pthread_timedjoin_np(t, NULL, &until) != 0) {
		fprintf(stderr,
			"case %s: a write waited %d s for a slot (%llu pinned clean, %llu dirty, "
			"%llu held)\n",
			cycle ? "cycle" : "no cycle", WAIT_S, (unsigned long long)npin,
			(unsigned long long)nfill, (unsigned long long)nheld);
		exit(1);
	}
	CHECK_EQ(w.ret, 0);

	for (uint64_t i = 0; i < nheld; i++)
		tb_put_dirty(s, &held[i], 0, BS);
	for (uint64_t i = 0; i < npin; i++)
		tb_put(s, &pins[i], 0);
	/* What every block holds, through eviction and write-back. */
	for (uint64_t i = 0; i < npin; i++)
		check_block(s, PINNED_OBJ, i);
	for (uint64_t obj = PINNED_OBJ + 1, n = 0; n < nfill + nheld; obj++)
		for (uint64_t i = 0; i < OBJ_BLOCKS && n < nfill + nheld; i++, n++)
			check_block(s, obj, i);
	CHECK_EQ(tb_close(s), 0);
	printf("case %s: ok (%llu pinned clean, %llu dirty, %llu held by a writer)\n",
	       cycle ? "cycle" : "no cycle", (unsigned long long)npin, (unsigned long long)nfill,
	       (unsigned long long)nheld);
}

static char dir[4096];

static void remove_dir(void)
{
	char cmd[4200];

	if (dir[0]) {
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
		if (system(cmd) != 0)
			fprintf(stderr, "could not remove %s\n", dir);
	}
}

int main(void)
{
	const char *tmp = getenv("TMPDIR");

	setvbuf(stdout, NULL, _IOLBF, 0);
	for (int cycle = 0; cycle < 2; cycle++) {
		snprintf(dir, sizeof(dir), "%s/tfs-starve-XXXXXX", tmp && *tmp ? tmp : "/var/tmp");
		CHECK(mkdtemp(dir));
		if (cycle == 0)
			atexit(remove_dir);
		run_case(dir, cycle);
		remove_dir();
	}
	dir[0] = 0;
	return 0;
}

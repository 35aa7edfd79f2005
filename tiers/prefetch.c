/*
 * prefetch.c - blocks loaded ahead of their readers, and the window.
 *
 * The owner asks for blocks ahead of use: the next blocks of the learned
 * cycle, readahead, and hints. A prefetch takes a slot only when the block
 * it evicts is needed later than the one it brings in (prefetch_worth), and
 * at most pf_win.depth blocks are loaded ahead and not yet read. After each
 * pass of the cycle, tb_cycle_pass moves that window: it grows while many
 * prefetches are late and the devices idle, and shrinks back when they are
 * busy or the growth did not pay. It never holds less than a few of the
 * readers' own queues (tb_pf_window_readers).
 *
 * Policy: it decides what loads ahead. May call evict.c (whether a block
 * is worth its victim), load.c (the loads), entry.c and marks.c.
 */
#include "cache_int.h"
#include "fault.h"
#include "log.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PF_LATE_SHARE 10      /* a pass whose prefetches were 1/10 late or more wants more */
#define PF_IDLE_PCT 50	      /* ...if the busiest device had requests in flight less of it */
#define PF_BUSY_PCT 90	      /* a pass with a device this busy wants less */
#define PF_PASS_MIN 16	      /* prefetches a pass must issue to judge its window */
#define PF_WORSE_PCT 105      /* a pass this much longer than before a growth undoes it, */
#define PF_BETTER_PCT 80      /* ...unless its late share fell to this much of what it was, */
#define PF_WORSE_GROSS_PCT 125 /* ...or unless it was not this much longer */
#define PF_HOLD_PASSES 8      /* ...and the window does not grow for this many passes */
#define PF_JUDGE_PASSES 2     /* passes after a growth that judge it, by the shorter */
#define PF_READER_QUEUES 4    /* the window holds this many of the readers' queues at least */

/*
 * Whether loading block idx of obj ahead of use is worth evicting v: only
 * if v is needed later than the block brought in (the "do no harm" rule of
 * integrated prefetching and caching, Cao, Felten, Karlin and Li), which
 * the cycle tells; without one, a prefetch never displaces 2q's
 * re-referenced set. An unknown block (outside the cycle: a hint, or a
 * reader of another file) is taken as needed now.
 */
static bool prefetch_worth(struct tb_store *s, const struct tb_entry *v, const struct tb_use *vu,
			   uint64_t obj, uint64_t idx)
{
	struct tb_use u;
	struct tb_obj *o;

	if (!marks_cycle_period(s))
		return !v->hot;
	if (vu->dist == UINT64_MAX || vu->write)
		return true; /* unknown, or rewritten before it is read: no read lost */
	evict_next_use(s, obj, &u);
	if (u.dist == UINT64_MAX)
		return true;
	o = cache_obj_find(s, obj);
	if (o && u.now && idx > o->last_idx)
		u.dist = 0; /* ahead of the reader of an object in use now */
	return vu->dist > u.dist;
}

/*
 * Start loading (obj, idx) ahead of use, in the prefetch class (see tb.h);
 * depth > 0: for a reader of remote blocks, bounded by depth apart from
 * the shallow window. deep_inflight: the loads in flight may reach the
 * deep window's bound rather than the shallow one.
 */
static int prefetch(struct tb_store *s, uint64_t obj, uint64_t idx, bool hint, uint64_t depth,
		    bool deep_inflight)
{
	uint64_t *n_pf = depth ? &s->n_pf_deep : &s->n_pf;
	uint64_t bound = depth ? (depth < s->pf_deep_max ? depth : s->pf_deep_max) : s->pf_win.depth;
	/* A remote reader's whole window may be in flight: latency is what it hides. */
	uint64_t inflight_max = (depth || deep_inflight) && s->pf_deep_max > s->prefetch_max
				    ? s->pf_deep_max
				    : s->prefetch_max;
	struct tb_entry *e;
	struct tb_use vu;
	int ret;

	pthread_mutex_lock(&s->lock);
	if (cache_lookup(s, obj, idx)) {
		pthread_mutex_unlock(&s->lock);
		return 0;
	}
	if (s->prefetch_inflight >= inflight_max || s->ndirty >= s->dirty_max) {
		pthread_mutex_unlock(&s->lock);
		return -EAGAIN; /* try again once some have landed */
	}
	if (!hint && *n_pf >= bound) {
		pthread_mutex_unlock(&s->lock);
		return -ENOBUFS; /* try again once some have been read */
	}
	e = TAILQ_FIRST(&s->free_list.q);
	if (!e) {
		e = evict_pick(s, &vu, WAIT_WB);
		if (!e) {
			flush_kick(s);
			pthread_mutex_unlock(&s->lock);
			return -EAGAIN;
		}
		if (!hint && !prefetch_worth(s, e, &vu, obj, idx)) {
			s->n.prefetch_refused++;
			pthread_mutex_unlock(&s->lock);
			return -EBUSY;
		}
	}
	e = cache_entry_take(s, e);
	e->deep = depth > 0;
	s->n.prefetch_issued++;
	ret = cache_start_load(s, e, obj, idx, NULL, IO_PREFETCH, !hint);
	pthread_mutex_unlock(&s->lock);
	return ret == 1 || ret == -ENOENT ? 0 : ret;
}

/*
 * The next window for the cycle's prefetch, from the pass that ended:
 * issued and late prefetches in it, and pct, the share of its time the
 * busiest local device had a request in flight. A window of a few blocks
 * hides a device's latency; it cannot hide a burst of misses behind the
 * application's compute. With the state twice the DRAM tier and 0.14 s of
 * compute per subgroup (swapbench --compute-gbps 2), 8 blocks were 78%
 * late and the device idled over half of each iteration; at 64-128 blocks
 * under 10% were late and an iteration took 3-4% less, though fewer
 * blocks stay (each slot ahead is one the cycle does not keep: 0.62 of
 * the raw folder's bytes moved against 0.53). With no compute the device
 * is the bound, and deeper windows only moved more bytes. So the window
 * doubles while passes are late and the device idles, and halves back
 * while the device is busy. A growth after which the passes took longer
 * is undone, and the window holds for PF_HOLD_PASSES (tb_pf_grow_undone,
 * tb_pf_window_pass):
 * the device's idle share says what could overlap, not what a smaller
 * kept set costs.
 */
uint64_t tb_pf_depth_next(uint64_t depth, uint64_t min, uint64_t max, uint64_t issued,
			  uint64_t late, unsigned pct)
{
	if (issued >= PF_PASS_MIN && late * PF_LATE_SHARE >= issued && pct < PF_IDLE_PCT)
		return depth * 2 < max ? depth * 2 : max;
	if (pct >= PF_BUSY_PCT)
		return depth / 2 > min ? depth / 2 : min;
	return depth;
}

/*
 * Whether the pass after a growth undoes it: it took PF_WORSE_PCT of the
 * pass before or more, and its late share did not fall to PF_BETTER_PCT
 * of that pass's; or it took PF_WORSE_GROSS_PCT or more. Late shares are
 * in %. A pass that is mostly the application's compute varies by a few
 * percent on its own: undone on time alone, mount-volume's window went
 * 4 to 64 and back to 32 in a CI run under ASan, its last passes 18% late.
 */
bool tb_pf_grow_undone(uint64_t before_ns, unsigned before_late, uint64_t took_ns, unsigned late)
{
	if (took_ns * 100 >= before_ns * PF_WORSE_GROSS_PCT)
		return true;
	return took_ns * 100 >= before_ns * PF_WORSE_PCT && late * 100 >= before_late * PF_BETTER_PCT;
}

/*
 * A growth is judged over PF_JUDGE_PASSES passes, while the window holds,
 * by the shortest of them: a pass only ever takes longer by the noise of
 * a shared machine, and one slow pass undid growths that paid. Under the
 * sanitizer's build beside another suite, mount-volume's window went 4 to
 * 32 and back to 16, and held there with 36% of its prefetches late.
 */
void tb_pf_window_pass(struct tb_pf_window *w, uint64_t took_ns, uint64_t issued, uint64_t late,
		       unsigned pct)
{
	unsigned late_pct = issued ? (unsigned)(late * 100 / issued) : 0;
	uint64_t next, lo;

	/* The floor follows the queue of this pass's readers, down as well as up. */
	w->floor = 0;
	tb_pf_window_readers(w, w->readers);
	w->readers = 0;
	lo = w->floor > w->min ? w->floor : w->min;

	if (w->before_ns) {
		if (!w->judged || took_ns < w->best_ns) {
			w->best_ns = took_ns;
			w->best_late = late_pct;
		}
		if (++w->judged < PF_JUDGE_PASSES)
			return;
		if (tb_pf_grow_undone(w->before_ns, w->before_late, w->best_ns, w->best_late)) {
			w->before_ns = 0;
			w->depth = w->depth / 2 > lo ? w->depth / 2 : lo;
			w->hold = PF_HOLD_PASSES;
			return;
		}
		w->before_ns = 0; /* it paid: this pass is judged as any other */
	}
	next = tb_pf_depth_next(w->depth > lo ? w->depth : lo, lo, w->hold ? w->depth : w->max,
				issued, late, pct);
	if (w->hold)
		w->hold--;
	if (next > w->depth) {
		w->before_ns = took_ns;
		w->before_late = late_pct;
		w->judged = 0;
	}
	w->depth = next;
}

/*
 * The window never holds less than PF_READER_QUEUES of the readers' own
 * queues. A reader that keeps n blocks in flight (an aio queue: 8 requests
 * of 1 MiB, swapbench's and DeepSpeed's default) asks for a block only n
 * blocks ahead of the one it waits on; a window of fewer blocks than that
 * loads nothing its queue has not already asked for, and each of its
 * prefetches is late. The device then drains with each queue: the replies
 * go out, the reader takes them in and asks again, and only then does the
 * next load start. With the state 8x the DRAM tier, a window of 4 blocks
 * left the disk with nothing in flight 18% of the read phases (sampled
 * every millisecond from /sys/block's inflight) against 6% for the raw
 * folder, and 17,669 prefetches were refused at the window. At 16 blocks
 * (two queues) the swap took 8% less time per iteration; at 32 (four)
 * 14% less, and the disk idled 10%. The floor follows the deepest queue
 * seen since the last pass, so one burst of readers does not hold it, and
 * is at most floor_max (store.c: what may be in flight, and a sixteenth
 * of the slots): each block of it is one the cycle does not keep.
 */
void tb_pf_window_readers(struct tb_pf_window *w, uint64_t blocks)
{
	uint64_t floor = blocks * PF_READER_QUEUES;

	if (blocks > w->readers)
		w->readers = blocks;
	if (floor > w->floor_max)
		floor = w->floor_max;
	if (floor > w->floor)
		w->floor = floor;
	if (w->depth < w->floor)
		w->depth = w->floor;
}

void tb_pf_readers(struct tb_store *s, uint64_t blocks)
{
	uint64_t was, depth;

	pthread_mutex_lock(&s->lock);
	was = s->pf_win.depth;
	tb_pf_window_readers(&s->pf_win, blocks);
	depth = s->pf_win.depth;
	/* Logged under the lock, as the passes are: the log then chains the window's moves. */
	if (depth != was)
		log_debug("prefetch window %" PRIu64 " -> %" PRIu64
			  " blocks: readers keep %" PRIu64 " blocks in flight",
			  was, depth, blocks);
	pthread_mutex_unlock(&s->lock);
}

void tb_cycle_pass(struct tb_store *s)
{
	uint64_t now = dev_now_ns(), active[TB_MAX_DEVS], busiest = 0;
	uint64_t took = 0, issued = 0, late = 0, was = 0, depth = 0;
	unsigned n = s->n_devs, pct = 0;

	for (unsigned i = 0; i < n; i++) {
		struct tb_dev *d = s->dev[i];

		pthread_mutex_lock(&d->lock);
		dev_load_tick(d, now);
		active[i] = d->active_ns;
		pthread_mutex_unlock(&d->lock);
	}
	pthread_mutex_lock(&s->lock);
	if (s->pass_ns && now > s->pass_ns) {
		took = now - s->pass_ns;
		issued = s->n.prefetch_issued - s->pass_issued;
		late = s->n.prefetch_late - s->pass_late;
		for (unsigned i = 0; i < n; i++) {
			uint64_t a = active[i] - s->pass_active_ns[i];

			if (strcmp(s->dev[i]->kind, "s3") != 0 && a > busiest)
				busiest = a; /* s3's pool has its own deep window */
		}
		pct = (unsigned)(busiest * 100 / took);
		was = s->pf_win.depth;
		tb_pf_window_pass(&s->pf_win, took, issued, late, pct);
		depth = s->pf_win.depth;
		log_debug("prefetch pass: %.3f s, %" PRIu64 " issued, %" PRIu64
			  " late, busiest device %u%%, window %" PRIu64 " -> %" PRIu64 " blocks",
			  (double)took / 1e9, issued, late, pct, was, depth);
	}
	s->pass_ns = now;
	memcpy(s->pass_active_ns, active, n * sizeof(active[0]));
	s->pass_issued = s->n.prefetch_issued;
	s->pass_late = s->n.prefetch_late;
	pthread_mutex_unlock(&s->lock);
}

int tb_prefetch(struct tb_store *s, uint64_t obj, uint64_t idx, bool hint)
{
	fault_inject("prefetch", FAULT_PREFETCH, idx); /* test builds: op=prefetch */
	return prefetch(s, obj, idx, hint, 0, false);
}

int tb_prefetch_deep(struct tb_store *s, uint64_t obj, uint64_t idx, unsigned depth)
{
	return prefetch(s, obj, idx, false, depth ? depth : 1, false);
}

/*
 * The shallow bound on loads in flight is the devices' queue depth (32
 * blocks by default): enough for a reader that takes a block at a time,
 * not for one that asks for a whole range ahead of a copy. Held to it,
 * a GPU reader's PREFETCH of 96 blocks issued 32 and left the rest to
 * its PINs, as demand loads a window at a time (cuda-stream counts the
 * device's reads). A stream may have the deep window's share in flight:
 * the device's queue then holds the reader's whole range, and the engine
 * keeps the drive at its depth.
 */
int tb_prefetch_stream(struct tb_store *s, uint64_t obj, uint64_t idx)
{
	fault_inject("prefetch", FAULT_PREFETCH, idx); /* test builds: op=prefetch */
	return prefetch(s, obj, idx, true, 0, true);
}

unsigned tb_ahead(struct tb_store *s, uint64_t obj, uint64_t idx, unsigned *run)
{
	struct tb_stored at;
	struct tb_dev *d;

	*run = 1;
	if (cache_resolve(s, obj, idx, &at) != 0)
		return 0;
	d = s->dev[tb_loc_dev(at.loc)];
	*run = d->run;
	return dev_ra_blocks(d);
}

unsigned tb_run_left(struct tb_store *s, uint64_t obj, uint64_t idx)
{
	struct tb_stored at;

	if (cache_resolve(s, obj, idx, &at) != 0)
		return 1;
	return dev_run_left(s->dev[tb_loc_dev(at.loc)], tb_loc_slot(at.loc));
}

/*
 * test_pf_window.c - the cycle's prefetch window, tuned once per pass
 * (tb_pf_depth_next), and the device time it is judged by (active_ns).
 *
 * The window doubles after a pass in which a tenth or more of the
 * prefetches were late while the busiest device idled half the pass or
 * more: the application computed, and a deeper window would have loaded
 * during it. It halves after a pass with the device busy nine tenths of
 * it: there every block the cycle keeps is worth more than a deeper
 * window. It stays between its first depth and its bound, and a pass with
 * too few prefetches to judge moves nothing. A growth is undone when the
 * pass after it took 5% longer and was not a fifth less late, or took 25%
 * longer in any case. Regression: undone on time alone, mount-volume's
 * window went 4 to 64 and back to 32 in a CI run under ASan, when a pass
 * that was mostly compute took a few percent longer by itself, and its
 * last passes were 18% late. A growth is judged by the shorter of the two
 * passes after it, the window holding meanwhile: one slow pass is noise.
 * It never holds less than four of the readers' queues (tb_pf_window_readers).
 *
 * A device's active time counts the time with a request in flight, and
 * nothing while none is: the idle share above. Regression guard: counted
 * by the window that measures bandwidth (busy_ns), it started over at
 * every window and said nothing of a pass.
 */
#include "dev.h"
#include "tb.h"
#include "test.h"

#include <stdlib.h>

#define MS 1000000ULL

static void undo(void)
{
	/* 5% longer, late share not down by a fifth: undone. */
	CHECK(tb_pf_grow_undone(1000, 20, 1050, 17));
	CHECK(tb_pf_grow_undone(1000, 0, 1100, 0));
	/* Late share down by a fifth or more: kept, unless 25% longer. */
	CHECK(!tb_pf_grow_undone(1000, 18, 1100, 6));
	CHECK(!tb_pf_grow_undone(1000, 20, 1249, 15));
	CHECK(tb_pf_grow_undone(1000, 20, 1100, 16));
	CHECK(tb_pf_grow_undone(1000, 18, 1250, 0));
	/* Not longer, or less than 5%: kept. */
	CHECK(!tb_pf_grow_undone(1000, 20, 1049, 20));
	CHECK(!tb_pf_grow_undone(1000, 20, 900, 30));
}

static void window(void)
{
	/* Late and idle: doubles, up to the bound. */
	CHECK_EQ(tb_pf_depth_next(8, 8, 256, 100, 80, 40), 16);
	CHECK_EQ(tb_pf_depth_next(128, 8, 256, 100, 10, 0), 256);
	CHECK_EQ(tb_pf_depth_next(200, 8, 256, 100, 10, 0), 256);
	CHECK_EQ(tb_pf_depth_next(256, 8, 256, 100, 90, 10), 256);
	/* Late, but the device busy more than half the pass: holds. */
	CHECK_EQ(tb_pf_depth_next(8, 8, 256, 100, 80, 50), 8);
	CHECK_EQ(tb_pf_depth_next(32, 8, 256, 100, 80, 89), 32);
	/* Idle, but few late: holds. */
	CHECK_EQ(tb_pf_depth_next(32, 8, 256, 100, 9, 10), 32);
	/* Too few prefetches to judge. */
	CHECK_EQ(tb_pf_depth_next(8, 8, 256, 15, 15, 0), 8);
	/* Busy: halves, down to the first depth. */
	CHECK_EQ(tb_pf_depth_next(64, 8, 256, 100, 80, 90), 32);
	CHECK_EQ(tb_pf_depth_next(12, 8, 256, 100, 0, 99), 8);
	CHECK_EQ(tb_pf_depth_next(8, 8, 256, 100, 80, 100), 8);
}

/*
 * A pass at 1000 ms, 20% late, idle: the window doubles, and the growth is
 * judged by the shorter of the two passes after it, during which it holds.
 */
static void judged(void)
{
	struct tb_pf_window w = {.depth = 8, .min = 8, .max = 256};

	tb_pf_window_pass(&w, 1000, 100, 20, 10);
	CHECK_EQ(w.depth, 16);
	/* One slow pass (the machine's noise), then one as before: kept. */
	tb_pf_window_pass(&w, 1300, 100, 20, 10);
	CHECK_EQ(w.depth, 16); /* holds while judged */
	tb_pf_window_pass(&w, 1000, 100, 20, 10);
	CHECK_EQ(w.depth, 32); /* kept, and this pass grows it again */
	/* Two slow passes: undone, and it holds for 8 passes. */
	tb_pf_window_pass(&w, 1100, 100, 20, 10);
	CHECK_EQ(w.depth, 32);
	tb_pf_window_pass(&w, 1200, 100, 20, 10);
	CHECK_EQ(w.depth, 16);
	for (int i = 0; i < 8; i++) {
		tb_pf_window_pass(&w, 1000, 100, 20, 10);
		CHECK_EQ(w.depth, 16);
	}
	tb_pf_window_pass(&w, 1000, 100, 20, 10);
	CHECK_EQ(w.depth, 32);
	/* Judged, less late: kept though slower (the late share fell a fifth). */
	tb_pf_window_pass(&w, 1100, 100, 5, 10);
	tb_pf_window_pass(&w, 1080, 100, 5, 10);
	CHECK_EQ(w.depth, 32); /* few late now: holds */
	/* Busy after a kept growth: halves, down to its first depth. */
	tb_pf_window_pass(&w, 1000, 100, 10, 95);
	CHECK_EQ(w.depth, 16);
	tb_pf_window_pass(&w, 1000, 100, 10, 95);
	tb_pf_window_pass(&w, 1000, 100, 10, 95);
	CHECK_EQ(w.depth, 8);
}

/*
 * The readers' queue is a floor: a reader with 8 blocks in flight asks only
 * 8 blocks ahead of the one it waits on, so a window of 4 loads nothing it
 * has not asked for (regression: 18% of the read phases with the disk idle
 * at 8x DRAM). The floor holds 4 queues, within its bound, follows the
 * deepest queue of each pass, and the window's own rules move it above.
 */
static void readers(void)
{
	struct tb_pf_window w = {.depth = 4, .min = 4, .max = 100, .floor_max = 50};

	tb_pf_window_readers(&w, 8);
	CHECK_EQ(w.floor, 32);
	CHECK_EQ(w.depth, 32);
	tb_pf_window_readers(&w, 2); /* a shallower queue lowers nothing until the pass */
	CHECK_EQ(w.floor, 32);
	CHECK_EQ(w.depth, 32);
	/* Busy: the window would halve, but not under the queue this pass saw. */
	tb_pf_window_pass(&w, 1000, 100, 90, 95);
	CHECK_EQ(w.depth, 32);
	CHECK_EQ(w.floor, 32);
	CHECK_EQ(w.readers, 0);
	/* A pass with no reader in flight: the floor goes, the window halves to its min. */
	tb_pf_window_pass(&w, 1000, 100, 90, 95);
	CHECK_EQ(w.floor, 0);
	CHECK_EQ(w.depth, 16);
	tb_pf_window_pass(&w, 1000, 100, 90, 95);
	tb_pf_window_pass(&w, 1000, 100, 90, 95);
	CHECK_EQ(w.depth, 4);
	/* A queue deeper than the floor's bound allows (what may be in flight): the bound. */
	tb_pf_window_readers(&w, 40);
	CHECK_EQ(w.floor, 50);
	CHECK_EQ(w.depth, 50);
	/* Late and idle above the floor: the window's own rule, up to its bound. */
	w = (struct tb_pf_window){.depth = 4, .min = 4, .max = 256, .floor_max = 32};
	tb_pf_window_readers(&w, 8);
	tb_pf_window_pass(&w, 1000, 100, 50, 10);
	CHECK_EQ(w.depth, 64);
	/*
	 * While an undone growth holds, the hold's bound is the depth, and a
	 * floor raised in the pass lifts the depth first: the window never
	 * falls under the floor, busy or held.
	 */
	w = (struct tb_pf_window){.depth = 8, .min = 8, .max = 256, .floor_max = 64};
	tb_pf_window_pass(&w, 1000, 100, 20, 10); /* grows to 16 */
	tb_pf_window_pass(&w, 1300, 100, 20, 10);
	tb_pf_window_pass(&w, 1300, 100, 20, 10); /* undone: 8, holding */
	CHECK_EQ(w.depth, 8);
	CHECK(w.hold > 0);
	tb_pf_window_readers(&w, 6); /* a queue of 6: floor 24 */
	tb_pf_window_pass(&w, 1000, 100, 90, 95);
	CHECK_EQ(w.floor, 24);
	CHECK_EQ(w.depth, 24);
	tb_pf_window_readers(&w, 16); /* a deeper queue, the hold still on */
	tb_pf_window_pass(&w, 1000, 100, 90, 10);
	CHECK_EQ(w.depth, 64);
}

/* As dev_measure.c does: the tick closes the time before a change of the counts. */
static void change(struct tb_dev *d, uint64_t at, unsigned demand, unsigned wb)
{
	dev_load_tick(d, at);
	d->inflight[IO_DEMAND] = demand;
	d->inflight[IO_WB] = wb;
}

static void active_time(void)
{
	struct tb_dev *d = calloc(1, sizeof(*d));

	CHECK(d);
	d->qd = 8;
	change(d, 1 * MS, 0, 0); /* the first tick only starts the clock */
	CHECK_EQ(d->active_ns, 0);
	change(d, 5 * MS, 1, 0); /* idle from 1 to 5 */
	CHECK_EQ(d->active_ns, 0);
	change(d, 9 * MS, 1, 2); /* one in flight from 5 to 9 */
	CHECK_EQ(d->active_ns, 4 * MS);
	change(d, 12 * MS, 0, 0); /* three from 9 to 12 */
	CHECK_EQ(d->active_ns, 7 * MS);
	change(d, 40 * MS, 0, 1); /* none from 12 to 40 */
	CHECK_EQ(d->active_ns, 7 * MS);
	dev_load_tick(d, 41 * MS);
	CHECK_EQ(d->active_ns, 8 * MS);
	free(d);
}

int main(void)
{
	window();
	undo();
	judged();
	readers();
	active_time();
	return 0;
}

/*
 * Unit test of the slab slot allocator: fill, free, reuse, marks, bounds,
 * and the bitmaps for giving space back (seen, ripe, held, holes, filled).
 */
#include "alloc.h"
#include "test.h"

#include <errno.h>

int main(void)
{
	struct slot_alloc a;
	const uint64_t n = 200; /* not a multiple of 64: the last word is partial */

	CHECK_EQ(slot_alloc_init(&a, n), 0);
	CHECK_EQ(slot_alloc_high(&a), 0);
	for (uint64_t i = 0; i < n; i++)
		CHECK_EQ(slot_alloc_get(&a), (int64_t)i); /* first fit, in order */
	CHECK_EQ(slot_alloc_get(&a), -ENOSPC);
	CHECK_EQ(a.used, n);
	CHECK_EQ(slot_alloc_high(&a), n);

	CHECK_EQ(slot_alloc_put(&a, 70), 0);
	CHECK_EQ(slot_alloc_put(&a, 70), -EINVAL); /* double free is caught */
	CHECK_EQ(slot_alloc_put(&a, 5), 0);
	CHECK_EQ(slot_alloc_get(&a), 5); /* the hint moved back to the lowest */
	CHECK_EQ(slot_alloc_get(&a), 70);
	CHECK_EQ(slot_alloc_get(&a), -ENOSPC);
	CHECK_EQ(slot_alloc_put(&a, n), -EINVAL);
	CHECK_EQ(slot_alloc_put(&a, n - 1), 0);
	CHECK_EQ(slot_alloc_high(&a), n - 1);
	slot_alloc_free_all(&a);

	/* Rebuild from marks, as at mount: marked slots are skipped. */
	CHECK_EQ(slot_alloc_init(&a, 130), 0);
	CHECK_EQ(slot_alloc_mark(&a, 0), 0);
	CHECK_EQ(slot_alloc_mark(&a, 2), 0);
	CHECK_EQ(slot_alloc_mark(&a, 129), 0);
	CHECK_EQ(slot_alloc_mark(&a, 2), -EEXIST);
	CHECK_EQ(slot_alloc_mark(&a, 130), -ERANGE);
	CHECK_EQ(slot_alloc_get(&a), 1);
	CHECK_EQ(slot_alloc_get(&a), 3);
	CHECK_EQ(a.used, 5);
	CHECK_EQ(slot_alloc_high(&a), 130);
	slot_alloc_free_all(&a);

	/* An empty allocator refuses. */
	CHECK_EQ(slot_alloc_init(&a, 0), 0);
	CHECK_EQ(slot_alloc_get(&a), -ENOSPC);
	slot_alloc_free_all(&a);

	/*
	 * Giving space back: only slots free at one look and still free, and
	 * not handed out, at the next are ripe; a run spans words.
	 */
	uint64_t pos = 0;

	CHECK_EQ(slot_alloc_init(&a, n), 0);
	for (uint64_t i = 0; i < n; i++)
		CHECK_EQ(slot_alloc_get(&a), (int64_t)i);
	CHECK_EQ(slot_alloc_ripe(&a, &pos, n), 0); /* nothing seen yet */
	for (uint64_t i = 60; i < 140; i++)
		CHECK_EQ(slot_alloc_put(&a, i), 0);
	CHECK_EQ(slot_alloc_put(&a, 150), 0);
	CHECK_EQ(slot_alloc_see(&a, 145), 80); /* 150 lies past the slab's end: no space */
	CHECK_EQ(slot_alloc_get(&a), 60);      /* taken since: not free all the while */
	pos = 0;
	CHECK_EQ(slot_alloc_ripe(&a, &pos, n), 79);
	CHECK_EQ(pos, 61);
	slot_alloc_hold(&a, 61, 79);
	CHECK_EQ(a.used, n - 80);	   /* held slots still count as free */
	CHECK_EQ(slot_alloc_get(&a), 150); /* but are not handed out */
	CHECK_EQ(slot_alloc_get(&a), -ENOSPC);
	slot_alloc_unhold(&a, 61, 79, true);
	CHECK_EQ(a.used, n - 79);
	pos = 0;
	CHECK_EQ(slot_alloc_ripe(&a, &pos, n), 0); /* holes are not ripe again */
	CHECK_EQ(slot_alloc_see(&a, n), 0);	   /* nor seen */
	/* A write into a hole fills the run of holes from it, up to max. */
	CHECK_EQ(slot_alloc_get(&a), 61);
	CHECK_EQ(slot_alloc_fill(&a, 61, 16, n), 16);
	CHECK_EQ(slot_alloc_fill(&a, 61, 16, n), 0);
	CHECK_EQ(slot_alloc_fill(&a, 100, 1000, 120), 20); /* stops at the end given */
	CHECK_EQ(slot_alloc_see(&a, n), 15 + 20);	   /* filled and free: seen */
	/* The slab's end: all holes from 120 to 140, not from 61 (in use). */
	CHECK(slot_alloc_all_holes(&a, 120, 140));
	CHECK(!slot_alloc_all_holes(&a, 61, 140));
	CHECK(!slot_alloc_all_holes(&a, 119, 140)); /* filled, so not a hole */
	slot_alloc_no_space(&a, 120, 140);
	CHECK(!slot_alloc_all_holes(&a, 120, 140));
	pos = 120;
	CHECK_EQ(slot_alloc_ripe(&a, &pos, n), 0);
	slot_alloc_free_all(&a);
	return 0;
}

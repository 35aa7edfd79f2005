/*
 * test_fair.c - the dirty budget's share among users (tiers/fair.c).
 *
 * The share's rule alone, on a store structure with no arena or devices:
 * the counts fair.c keeps, and who may make one more block dirty.
 *
 *   1. one user has all of the budget, to the last block;
 *   2. with a second user waiting, the first, over its share, waits, and
 *      the second gets the room; with no one else waiting the first takes
 *      room again, over its share;
 *   3. a writer that does not wait does not pass its own user's waiters;
 *   4. the share never drops under 1/FAIR_FLOOR_DIV of the budget;
 *   5. more users than FAIR_USERS share the table's last slot, and every
 *      count goes back to zero when their blocks are clean.
 */
#include "cache_int.h"
#include "test.h"

#include <stdlib.h>

#define BUDGET 64

static struct tb_entry ents[4 * BUDGET];
static unsigned nents;

/* uid makes one more block dirty, as make_dirty counts it. */
static struct tb_entry *dirty(struct tb_store *s, uint32_t uid)
{
	struct tb_entry *e = &ents[nents++];

	CHECK(nents <= sizeof(ents) / sizeof(ents[0]));
	s->ndirty++;
	fair_dirtied(s, e, uid);
	return e;
}

/* e is written back, as the flusher counts it. */
static void clean(struct tb_store *s, struct tb_entry *e)
{
	s->ndirty--;
	fair_cleaned(s, e);
}

static bool may(struct tb_store *s, uint32_t uid, bool queued)
{
	return fair_may_dirty(s, fair_slot(s, uid), queued);
}

int main(void)
{
	struct tb_store *s = calloc(1, sizeof(*s));
	struct tb_entry *a[BUDGET];
	unsigned wb, i;

	CHECK(s);
	s->dirty_max = BUDGET;

	/* 1 */
	for (i = 0; i < BUDGET; i++) {
		CHECK(may(s, 1000, false));
		a[i] = dirty(s, 1000);
	}
	CHECK(!may(s, 1000, false)); /* the mark */
	CHECK_EQ(s->fair_n, 1);

	/* 2: user 0 (root) waits; a block of user 1000's is written back */
	wb = fair_wait_begin(s, 0);
	CHECK_EQ(s->fair_n, 2);
	clean(s, a[0]);
	CHECK(!may(s, 1000, false)); /* 63 of 64, over its share of 32 */
	CHECK(may(s, 0, true));
	dirty(s, 0);
	fair_wait_end(s, wb);
	CHECK(!may(s, 0, false) && !may(s, 1000, false)); /* full again */
	clean(s, a[1]);
	CHECK(may(s, 1000, false)); /* no one under its share waits */
	/* user 1000 waits too: room goes to root, under its share, first */
	wb = fair_wait_begin(s, 1000);
	unsigned wr = fair_wait_begin(s, 0);
	CHECK(!fair_may_dirty(s, wb, true));
	CHECK(fair_may_dirty(s, wr, true));
	fair_wait_end(s, wr);
	CHECK(fair_may_dirty(s, wb, true));

	/* 3: a new writer of user 1000's waits behind the waiter */
	CHECK(!may(s, 1000, false));
	fair_wait_end(s, wb);
	CHECK(may(s, 1000, false));

	/* 4: 40 users waiting: the share is 64/16 = 4, not 64/41 = 1 */
	unsigned slots[40];
	for (i = 0; i < 40; i++)
		slots[i] = fair_wait_begin(s, 2000 + i);
	for (i = 2; i < BUDGET; i++)
		clean(s, a[i]); /* user 1000 has nothing dirty now */
	for (i = 0; i < 3; i++)
		dirty(s, 2000);
	CHECK(may(s, 2000, true)); /* 3 dirty: under 4 */
	dirty(s, 2000);
	CHECK(!may(s, 2000, true)); /* 4: at its share, others under theirs wait */
	CHECK(may(s, 2001, true));
	for (i = 0; i < 40; i++)
		fair_wait_end(s, slots[i]);

	/* 5: 70 users at once; the last 8 share a slot */
	s->ndirty = 0;
	s->fair_n = 0;
	for (i = 0; i <= FAIR_USERS; i++)
		s->users[i].dirty = s->users[i].waiting = 0;
	nents = 0;
	struct tb_entry *e[70];
	s->dirty_max = 4 * BUDGET;
	for (i = 0; i < 70; i++)
		e[i] = dirty(s, 3000 + i);
	CHECK_EQ(s->fair_n, FAIR_USERS + 1);
	CHECK_EQ(s->users[FAIR_USERS].dirty, 70 - FAIR_USERS);
	clean(s, e[0]); /* a slot of its own comes free */
	CHECK_EQ(s->fair_n, FAIR_USERS);
	struct tb_entry *f = dirty(s, 5000); /* takes the free slot */
	CHECK(f->fair_slot < FAIR_USERS);
	for (i = 1; i < 70; i++)
		clean(s, e[i]);
	clean(s, f);
	CHECK_EQ(s->fair_n, 0);
	for (i = 0; i <= FAIR_USERS; i++)
		CHECK(s->users[i].dirty == 0 && s->users[i].waiting == 0);
	free(s);
	return 0;
}

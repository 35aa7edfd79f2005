/*
 * fair.c - the dirty budget shared among the users who write.
 *
 * Writers wait above the dirty high-water mark (dirty_max blocks) for
 * write-back to make room, and a block of room goes to whichever waiter
 * wakes first: one user with many writers would take nearly all of it, and
 * another user's write would wait behind all of theirs. So each dirty block
 * counts against the user who made it dirty, and a user's share is the
 * budget divided among the users who hold dirty blocks or wait for room,
 * never less than 1/FAIR_FLOOR_DIV of it. A user at or over its share
 * takes room only while no other user under theirs waits for it: with one
 * user writing (a training job's ranks), that user has all of the budget.
 *
 * The users are kept in a table of FAIR_USERS slots, a slot in use while
 * its user holds dirty blocks or waits; more users at once than that share
 * the table's last slot. All under the store lock.
 *
 * Shared accounting at the bottom of the cache: the requests (cache.c)
 * and write-back (flush.c) call it; it calls nothing of the cache.
 */
#include "cache_int.h"

#define FAIR_FLOOR_DIV 16 /* a user's share is never under 1/16 of the dirty budget */

/* The slot of uid, or a free one (its dirty and waiting are 0), or the shared last one. */
unsigned fair_slot(const struct tb_store *s, uint32_t uid)
{
	unsigned free_slot = FAIR_USERS;

	for (unsigned i = 0; i < FAIR_USERS; i++) {
		const struct tb_user *u = &s->users[i];

		if (u->dirty || u->waiting) {
			if (u->uid == uid)
				return i;
		} else if (free_slot == FAIR_USERS) {
			free_slot = i;
		}
	}
	return free_slot;
}

static bool in_use(const struct tb_user *u)
{
	return u->dirty || u->waiting;
}

/* Count a slot's change between unused and used. */
static void add(struct tb_store *s, unsigned i, uint32_t uid, int64_t dirty, int waiting)
{
	struct tb_user *u = &s->users[i];
	bool was = in_use(u);

	if (!was)
		u->uid = uid;
	u->dirty = (uint64_t)((int64_t)u->dirty + dirty);
	u->waiting = (unsigned)((int)u->waiting + waiting);
	if (!was && in_use(u))
		s->fair_n++;
	else if (was && !in_use(u))
		s->fair_n--;
}

/* A user's share of the budget, with n users competing. */
static uint64_t share(const struct tb_store *s, unsigned n)
{
	uint64_t sh = s->dirty_max / (n ? n : 1), floor = s->dirty_max / FAIR_FLOOR_DIV;

	if (sh < floor)
		sh = floor;
	return sh ? sh : 1;
}

/*
 * May the user in slot i make one more block dirty now? queued: the asker
 * is counted among its user's waiters (fair_wait_begin); a writer that is
 * not waits behind them.
 */
bool fair_may_dirty(const struct tb_store *s, unsigned i, bool queued)
{
	const struct tb_user *u = &s->users[i];
	unsigned n = s->fair_n;
	uint64_t sh;

	if (s->ndirty >= s->dirty_max)
		return false;
	/* A new writer does not pass its own user's writers waiting already. */
	if (!queued && u->waiting)
		return false;
	if (!in_use(u))
		n++; /* the asker competes too */
	sh = share(s, n);
	if (u->dirty < sh)
		return true;
	for (unsigned j = 0; j <= FAIR_USERS; j++) {
		const struct tb_user *v = &s->users[j];

		if (j != i && v->waiting && v->dirty < sh)
			return false; /* room goes to a user under its share first */
	}
	return true;
}

/* Count a writer of uid as waiting for room; returns its slot, for the calls below. */
unsigned fair_wait_begin(struct tb_store *s, uint32_t uid)
{
	unsigned i = fair_slot(s, uid);

	add(s, i, uid, 0, 1);
	return i;
}

void fair_wait_end(struct tb_store *s, unsigned i)
{
	add(s, i, s->users[i].uid, 0, -1);
}

void fair_dirtied(struct tb_store *s, struct tb_entry *e, uint32_t uid)
{
	unsigned i = fair_slot(s, uid);

	add(s, i, uid, 1, 0);
	e->fair_slot = (uint16_t)i;
}

void fair_cleaned(struct tb_store *s, struct tb_entry *e)
{
	add(s, e->fair_slot, s->users[e->fair_slot].uid, -1, 0);
}

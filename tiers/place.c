/*
 * place.c - where a written block goes, and the space blocks take.
 *
 * Each DIRTY entry holds one block of space reserved on the devices, so
 * that its write-back can never find them full; a writer that cannot
 * reserve waits for released locations to come back through a sync, then
 * fails with -ENOSPC (or -EIO when a device that is out holds the space).
 * A block written back goes to a fresh location on a device chosen by
 * weighted round-robin (place_block). A location that a rewrite or a
 * truncate releases is reused only after a sync has made its release
 * durable (tb_release, flush.c's sync).
 *
 * Mechanism: the requests (cache.c) reserve, write-back (flush.c) places.
 * It may call marks.c (a writer short of space wakes the flusher, whose
 * sync returns released locations) and the devices; nothing above it.
 */
#include "cache_int.h"
#include "fault.h"
#include "log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SYNC_FREES 256	 /* released slots that call a sync point at once */

/* ---- space ---- */

uint64_t place_avail(struct tb_store *s)
{
	uint64_t free[TB_MAX_DEVS], room[TB_MAX_DEVS], fs[TB_MAX_DEVS], free_slots = 0;
	bool counted[TB_MAX_DEVS] = {false};

	for (unsigned i = 0; i < s->n_devs; i++)
		free[i] = dev_free_parts(s->dev[i], &room[i], &fs[i]);
	/*
	 * Folders on one filesystem each see all of its free space: together
	 * they can take it once, and each slab's own unused space. Each one's
	 * room is the filesystem's free space (as it last looked) and its own
	 * slab's, less what it took since, so the group's is the sum of
	 * theirs less all but one look at the filesystem (the largest, so
	 * that looks at different moments never count too much). Counted
	 * apart, two nvme folders on one disk (a second drive that did not
	 * mount) let writers reserve twice its space, and the blocks over it
	 * waited in DRAM for a write-back that could never be.
	 */
	for (unsigned i = 0; i < s->n_devs; i++) {
		uint64_t sum = free[i], rooms = room[i], fs_max = fs[i], n = 1;

		if (counted[i])
			continue;
		for (unsigned j = i + 1; fs[i] != UINT64_MAX && j < s->n_devs; j++)
			if (!counted[j] && fs[j] != UINT64_MAX &&
			    s->dev[j]->fs_dev == s->dev[i]->fs_dev) {
				counted[j] = true;
				sum += free[j];
				rooms += room[j];
				fs_max = fs[j] > fs_max ? fs[j] : fs_max;
				n++;
			}
		if (n > 1) {
			uint64_t once = rooms > (n - 1) * fs_max ? rooms - (n - 1) * fs_max : 0;

			sum = sum < once ? sum : once;
		}
		free_slots += sum;
	}
	return free_slots > s->reserved ? free_slots - s->reserved : 0;
}

/*
 * Why no block can be had: -EIO when a device that is out after errors
 * holds the missing space (the application should see an I/O error, not
 * a full filesystem), else -ENOSPC.
 */
static int no_space_err(struct tb_store *s)
{
	for (unsigned i = 0; i < s->n_devs; i++)
		if (dev_out(s->dev[i]))
			return -EIO;
	return -ENOSPC;
}

/* Reserve n blocks; waits for pending frees to come back through a sync. */
static int reserve_blocks(struct tb_store *s, uint64_t n)
{
	for (int tries = 0; tries < 4; tries++) {
		uint64_t gen = s->sync_gen;
		struct timespec ts;

		if (place_avail(s) >= n) {
			s->reserved += n;
			return 0;
		}
		if (!s->npending && !s->wb_inflight && !s->commits_since_sync)
			break;
		s->sync_req = true;
		flush_kick(s);
		deadline_in(&ts, 2000);
		while (s->sync_gen == gen)
			if (pthread_cond_timedwait(&s->space_cv, &s->lock, &ts) == ETIMEDOUT)
				break;
	}
	return no_space_err(s);
}

/* ---- writers' reservations ---- */

/*
 * One block of space for an entry becoming dirty: from the request's
 * reservation (already counted in s->reserved) or new. Returns 1 or 0 for
 * which, for place_give, or -ENOSPC.
 */
int place_take(struct tb_store *s, uint64_t *resv)
{
	if (resv && *resv) {
		(*resv)--;
		return 1;
	}
	return reserve_blocks(s, 1);
}

void place_give(struct tb_store *s, uint64_t *resv, int from_resv)
{
	if (from_resv)
		(*resv)++;
	else
		s->reserved--;
}

int tb_reserve(struct tb_store *s, uint64_t n)
{
	int ret;

	pthread_mutex_lock(&s->lock);
	ret = reserve_blocks(s, n);
	pthread_mutex_unlock(&s->lock);
	return ret;
}

void tb_unreserve(struct tb_store *s, uint64_t n)
{
	pthread_mutex_lock(&s->lock);
	s->reserved -= n;
	pthread_cond_broadcast(&s->space_cv);
	pthread_mutex_unlock(&s->lock);
}

/* ---- placement ---- */

/*
 * Place a new block: smooth weighted round-robin over the devices, each
 * weighted by what it can do (its cap, else the bandwidth it showed when
 * driven hard: dev_weight), so that one flush drives every path in
 * proportion. Full and down devices weigh 0. A device that stores several
 * blocks per object (s3) gets its run of them in a row, so that one object
 * holds neighbours, which one ranged GET then reads back; its turn counts
 * as that many rounds, which keeps the proportions. A run goes on only
 * while its device is up, and a device tried again after being down gets
 * one block, not a run: a run begun before an outage and finished after
 * it sent a whole file's blocks to a bucket that was not there. Lock held.
 */
int place_block(struct tb_store *s, uint64_t *loc)
{
	double w[TB_MAX_DEVS], total = 0;
	uint64_t slot;

	if (s->run_left && s->run_dev < s->n_devs && dev_up(s->dev[s->run_dev])) {
		s->run_left--;
		if (dev_alloc(s->dev[s->run_dev], &slot) == 0) {
			*loc = tb_loc(s->run_dev, slot);
			return 0;
		}
		s->run_left = 0;
	}
	for (unsigned i = 0; i < s->n_devs; i++) {
		w[i] = dev_weight(s->dev[i]);
		total += w[i];
	}
	while (total > 0) {
		unsigned run;
		int best = -1;

		for (unsigned i = 0; i < s->n_devs; i++) {
			if (w[i] <= 0)
				continue;
			if (best < 0 || s->credit[i] + w[i] > s->credit[best] + w[best])
				best = (int)i;
		}
		run = s->dev[best]->run && dev_up(s->dev[best]) ? s->dev[best]->run : 1;
		for (unsigned i = 0; i < s->n_devs; i++)
			if (w[i] > 0)
				s->credit[i] += w[i] * run;
		s->credit[best] -= total * run;
		if (dev_alloc(s->dev[best], &slot) == 0) {
			*loc = tb_loc((unsigned)best, slot);
			s->run_dev = (unsigned)best;
			s->run_left = run - 1;
			return 0;
		}
		total -= w[best];
		w[best] = 0;
	}
	return no_space_err(s);
}

/* ---- released locations, and free space ---- */

void tb_release(struct tb_store *s, uint64_t loc)
{
	pthread_mutex_lock(&s->lock);
	if (s->npending == s->cap_pending) {
		size_t cap = s->cap_pending ? s->cap_pending * 2 : 64;
		uint64_t *p = realloc(s->pending, cap * sizeof(*p));

		if (!p) {
			/* Leaking one slot until the next mount beats reusing it early. */
			log_err("out of memory releasing a block; it is reclaimed at next mount");
			pthread_mutex_unlock(&s->lock);
			return;
		}
		s->pending = p;
		s->cap_pending = cap;
	}
	s->pending[s->npending++] = loc;
	/*
	 * A sync point is due: at the flusher's next interval, or now when
	 * many slots wait, so that rewrites reuse the space the slab already
	 * has instead of growing it (fresh extents of the slab file cost the
	 * filesystem an allocation, and the drive more than a rewrite).
	 */
	if (s->npending >= SYNC_FREES) {
		s->sync_req = true;
		flush_kick(s);
	} else if (s->npending == 1) {
		flush_kick(s);
	}
	pthread_mutex_unlock(&s->lock);
}

int tb_space_check(struct tb_store *s, uint64_t nblocks)
{
	int ret;

	pthread_mutex_lock(&s->lock);
	ret = reserve_blocks(s, nblocks);
	if (ret == 0)
		s->reserved -= nblocks;
	pthread_mutex_unlock(&s->lock);
	return ret;
}

void tb_space(struct tb_store *s, uint64_t *total, uint64_t *avail)
{
	struct tb_dev_stats st;

	/*
	 * A device's size is its capacity, less what its filesystem cannot
	 * give any more (space others took, dev_measure.c's room; a device that is
	 * out): so "used" (size less free) is what this store holds, whoever
	 * else fills the disk, and the size shrinks as the disk does.
	 */
	uint64_t can[TB_MAX_DEVS], fs_id[TB_MAX_DEVS], fs_free[TB_MAX_DEVS], slab_free[TB_MAX_DEVS];
	bool shared[TB_MAX_DEVS] = {false}, counted[TB_MAX_DEVS] = {false};
	uint64_t over = 0;

	*total = 0;
	for (unsigned i = 0; i < s->n_devs; i++) {
		dev_get_stats(s->dev[i], &st);
		can[i] = dev_free_slots(s->dev[i]) * s->bs;
		if (st.used + can[i] > st.capacity)
			can[i] = st.capacity > st.used ? st.capacity - st.used : 0;
		*total += st.used + can[i];
		shared[i] = dev_room_parts(s->dev[i], &fs_id[i], &fs_free[i], &slab_free[i]) == 0;
	}
	/*
	 * Devices on one filesystem each see all of its free space: counted
	 * once, a group can take its filesystem's free space and each slab's
	 * own, or what their caps leave, whichever is less.
	 */
	for (unsigned i = 0; i < s->n_devs; i++) {
		uint64_t sum = can[i], room = fs_free[i] + slab_free[i];
		unsigned n = 1;

		if (!shared[i] || counted[i])
			continue;
		for (unsigned j = i + 1; j < s->n_devs; j++)
			if (shared[j] && !counted[j] && fs_id[j] == fs_id[i]) {
				counted[j] = true;
				sum += can[j];
				room += slab_free[j];
				n++;
			}
		if (n > 1 && sum > room)
			over += sum - room;
	}
	if (over > *total)
		over = *total;
	*total -= over;
	/* place_avail counts a shared filesystem once already. */
	pthread_mutex_lock(&s->lock);
	*avail = place_avail(s) * s->bs;
	pthread_mutex_unlock(&s->lock);
}

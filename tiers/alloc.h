/*
 * alloc.h - free-space allocator for the slots of one slab file.
 *
 * A bitmap with one bit per block-size slot. It lives only in memory: at
 * mount it is rebuilt from the block records in the metadata store, which
 * is what reclaims space allocated but never committed before a crash.
 * Two more bitmaps serve the return of free space to the filesystem
 * (dev_give_back): `hole`, a slot whose space was given back (punched) and
 * not filled again since, and `seen`, a free slot that still had its space
 * at the last look and was not handed out since. A slot seen at one look
 * and still seen at the next has been free all the time between.
 * Not thread-safe; the caller holds the device lock.
 */
#ifndef TENSORFS_ALLOC_H
#define TENSORFS_ALLOC_H

#include <stdbool.h>
#include <stdint.h>

struct slot_alloc {
	uint64_t *bits;
	uint64_t *hole;	 /* space given back, not filled again */
	uint64_t *seen;	 /* free with its space at the last look, not handed out since */
	uint64_t nslots; /* capacity in slots */
	uint64_t used;
	uint64_t hint; /* word index to start the next search from */
};

int slot_alloc_init(struct slot_alloc *a, uint64_t nslots);
void slot_alloc_free_all(struct slot_alloc *a);
/* Lowest free slot at or after the hint; -ENOSPC when full. */
int64_t slot_alloc_get(struct slot_alloc *a);
/* Mark a slot used (at mount); -EEXIST if it already was, -ERANGE past the end. */
int slot_alloc_mark(struct slot_alloc *a, uint64_t slot);
/* Return a slot; -EINVAL if it was not in use. */
int slot_alloc_put(struct slot_alloc *a, uint64_t slot);
/* One past the highest used slot: the slab file's useful length in slots. */
uint64_t slot_alloc_high(const struct slot_alloc *a);

/* ---- giving space back ---- */

/*
 * The next run of ripe slots (free, with their space, and seen at the last
 * look) at or after *pos and below end: its first slot in *pos, its length
 * returned; 0 when there is none.
 */
uint64_t slot_alloc_ripe(const struct slot_alloc *a, uint64_t *pos, uint64_t end);
/*
 * Keep free slots [start, start + n) from being handed out while their
 * space goes back. They still count as free (used is unchanged): writers
 * reserve space by that count, and a hold over a slab's free end made a
 * writer's reservation fail with ENOSPC.
 */
void slot_alloc_hold(struct slot_alloc *a, uint64_t start, uint64_t n);
/* Put them back free: as holes when their space went, else as they were. */
void slot_alloc_unhold(struct slot_alloc *a, uint64_t start, uint64_t n, bool hole);
/* Whether every slot of [start, end) is free and gave its space back. */
bool slot_alloc_all_holes(const struct slot_alloc *a, uint64_t start, uint64_t end);
/* Slots [start, end) lie past the slab's end: no holes, and no space. */
void slot_alloc_no_space(struct slot_alloc *a, uint64_t start, uint64_t end);
/* The look: every free slot below end that has its space is seen; how many. */
uint64_t slot_alloc_see(struct slot_alloc *a, uint64_t end);
/*
 * A write to slot is due: if slot is a hole, the run of holes from it (up
 * to max slots, below end) is to be filled again; they are holes no more.
 * Returns the run's length, 0 when slot is no hole.
 */
uint64_t slot_alloc_fill(struct slot_alloc *a, uint64_t slot, uint64_t max, uint64_t end);

#endif

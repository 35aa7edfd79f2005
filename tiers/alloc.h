/*
 * alloc.h - free-space allocator for the slots of one slab file.
 *
 * A bitmap with one bit per block-size slot. It lives only in memory: at
 * mount it is rebuilt from the block records in the metadata store, which
 * is what reclaims space allocated but never committed before a crash.
 * Not thread-safe; the caller holds the store lock.
 */
#ifndef TENSORFS_ALLOC_H
#define TENSORFS_ALLOC_H

#include <stdint.h>

struct slot_alloc {
	uint64_t *bits;
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

#endif

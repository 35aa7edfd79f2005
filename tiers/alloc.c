/*
 * alloc.c - bitmap allocator for slab slots.
 *
 * Allocation is first-fit from a moving hint, so a slab fills from its
 * start and stays compact; a freed slot below the hint pulls the hint back.
 * 64 slots per word keeps a 1 TiB slab of 1 MiB blocks in 128 KiB, and
 * each of the two bitmaps for giving space back (alloc.h) as much.
 */
#include "alloc.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>

#define WORD_BITS 64

static uint64_t nwords(const struct slot_alloc *a)
{
	return (a->nslots + WORD_BITS - 1) / WORD_BITS;
}

static bool bit_test(const uint64_t *map, uint64_t i)
{
	return map[i / WORD_BITS] & (1ULL << (i % WORD_BITS));
}

static void bit_clear(uint64_t *map, uint64_t i)
{
	map[i / WORD_BITS] &= ~(1ULL << (i % WORD_BITS));
}

/* The bits of [start, start + n) within word w. */
static uint64_t range_mask(uint64_t w, uint64_t start, uint64_t n)
{
	uint64_t lo = w * WORD_BITS, hi = lo + WORD_BITS, end = start + n, from, to;

	if (end <= lo || start >= hi)
		return 0;
	from = start > lo ? start - lo : 0;
	to = end < hi ? end - lo : WORD_BITS;
	return (to - from == WORD_BITS ? ~0ULL : ((1ULL << (to - from)) - 1)) << from;
}

int slot_alloc_init(struct slot_alloc *a, uint64_t nslots)
{
	uint64_t words = (nslots + WORD_BITS - 1) / WORD_BITS;

	a->bits = calloc(words ? words : 1, sizeof(uint64_t));
	a->hole = calloc(words ? words : 1, sizeof(uint64_t));
	a->seen = calloc(words ? words : 1, sizeof(uint64_t));
	if (!a->bits || !a->hole || !a->seen) {
		slot_alloc_free_all(a);
		return -ENOMEM;
	}
	a->nslots = nslots;
	a->used = 0;
	a->hint = 0;
	return 0;
}

void slot_alloc_free_all(struct slot_alloc *a)
{
	free(a->bits);
	free(a->hole);
	free(a->seen);
	a->bits = a->hole = a->seen = NULL;
	a->nslots = a->used = a->hint = 0;
}

int64_t slot_alloc_get(struct slot_alloc *a)
{
	uint64_t words = (a->nslots + WORD_BITS - 1) / WORD_BITS;

	if (a->used >= a->nslots)
		return -ENOSPC;
	for (uint64_t n = 0; n < words; n++) {
		uint64_t w = (a->hint + n) % words;
		uint64_t free_bits = ~a->bits[w];

		if (!free_bits)
			continue;
		uint64_t slot = w * WORD_BITS + (uint64_t)__builtin_ctzll(free_bits);
		if (slot >= a->nslots)
			continue;
		a->bits[w] |= 1ULL << (slot % WORD_BITS);
		bit_clear(a->seen, slot); /* no longer free since the look */
		a->used++;
		a->hint = w;
		return (int64_t)slot;
	}
	return -ENOSPC;
}

int slot_alloc_mark(struct slot_alloc *a, uint64_t slot)
{
	if (slot >= a->nslots)
		return -ERANGE;
	uint64_t bit = 1ULL << (slot % WORD_BITS);
	if (a->bits[slot / WORD_BITS] & bit)
		return -EEXIST;
	a->bits[slot / WORD_BITS] |= bit;
	bit_clear(a->seen, slot);
	a->used++;
	return 0;
}

int slot_alloc_put(struct slot_alloc *a, uint64_t slot)
{
	if (slot >= a->nslots)
		return -EINVAL;
	uint64_t bit = 1ULL << (slot % WORD_BITS);
	if (!(a->bits[slot / WORD_BITS] & bit))
		return -EINVAL;
	a->bits[slot / WORD_BITS] &= ~bit;
	a->used--;
	if (slot / WORD_BITS < a->hint)
		a->hint = slot / WORD_BITS;
	return 0;
}

uint64_t slot_alloc_high(const struct slot_alloc *a)
{
	uint64_t words = (a->nslots + WORD_BITS - 1) / WORD_BITS;

	for (uint64_t w = words; w-- > 0;) {
		if (a->bits[w])
			return w * WORD_BITS + (WORD_BITS - (uint64_t)__builtin_clzll(a->bits[w]));
	}
	return 0;
}

/* ---- giving space back ---- */

static uint64_t ripe_word(const struct slot_alloc *a, uint64_t w)
{
	return ~a->bits[w] & ~a->hole[w] & a->seen[w];
}

uint64_t slot_alloc_ripe(const struct slot_alloc *a, uint64_t *pos, uint64_t end)
{
	uint64_t words = nwords(a), start = UINT64_MAX, i;

	if (end > a->nslots)
		end = a->nslots;
	for (uint64_t w = *pos / WORD_BITS; w < words && w * WORD_BITS < end; w++) {
		uint64_t r = ripe_word(a, w) & range_mask(w, *pos, end - *pos);

		if (r) {
			start = w * WORD_BITS + (uint64_t)__builtin_ctzll(r);
			break;
		}
	}
	if (start >= end)
		return 0;
	/* The run goes on while the slots are ripe: a word at a time where it can. */
	for (i = start; i < end;) {
		uint64_t w = i / WORD_BITS;

		if (i % WORD_BITS == 0 && i + WORD_BITS <= end && ripe_word(a, w) == ~0ULL) {
			i += WORD_BITS;
			continue;
		}
		if (!(ripe_word(a, w) & (1ULL << (i % WORD_BITS))))
			break;
		i++;
	}
	*pos = start;
	return i - start;
}

void slot_alloc_hold(struct slot_alloc *a, uint64_t start, uint64_t n)
{
	assert(start + n <= a->nslots);
	for (uint64_t w = start / WORD_BITS; n && w * WORD_BITS < start + n; w++) {
		uint64_t m = range_mask(w, start, n);

		assert(!(a->bits[w] & m)); /* only free slots are held */
		a->bits[w] |= m;
		a->seen[w] &= ~m;
	}
}

void slot_alloc_unhold(struct slot_alloc *a, uint64_t start, uint64_t n, bool hole)
{
	for (uint64_t w = start / WORD_BITS; n && w * WORD_BITS < start + n; w++) {
		uint64_t m = range_mask(w, start, n);

		a->bits[w] &= ~m;
		if (hole)
			a->hole[w] |= m;
		else
			a->hole[w] &= ~m;
	}
	if (n && start / WORD_BITS < a->hint)
		a->hint = start / WORD_BITS;
}

bool slot_alloc_all_holes(const struct slot_alloc *a, uint64_t start, uint64_t end)
{
	if (end > a->nslots)
		end = a->nslots;
	for (uint64_t w = start / WORD_BITS; start < end && w * WORD_BITS < end; w++) {
		uint64_t m = range_mask(w, start, end - start);

		if ((a->hole[w] & ~a->bits[w] & m) != m)
			return false;
	}
	return true;
}

void slot_alloc_no_space(struct slot_alloc *a, uint64_t start, uint64_t end)
{
	if (end > a->nslots)
		end = a->nslots;
	for (uint64_t w = start / WORD_BITS; start < end && w * WORD_BITS < end; w++) {
		uint64_t m = range_mask(w, start, end - start);

		a->hole[w] &= ~m;
		a->seen[w] &= ~m;
	}
}

uint64_t slot_alloc_see(struct slot_alloc *a, uint64_t end)
{
	uint64_t words = nwords(a), n = 0;

	for (uint64_t w = 0; w < words; w++) {
		a->seen[w] =
		    ~a->bits[w] & ~a->hole[w] & range_mask(w, 0, end < a->nslots ? end : a->nslots);
		n += (uint64_t)__builtin_popcountll(a->seen[w]);
	}
	return n;
}

uint64_t slot_alloc_fill(struct slot_alloc *a, uint64_t slot, uint64_t max, uint64_t end)
{
	uint64_t n = 0;

	if (end > a->nslots)
		end = a->nslots;
	while (n < max && slot + n < end && bit_test(a->hole, slot + n))
		bit_clear(a->hole, slot + n++);
	return n;
}

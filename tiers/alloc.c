/*
 * alloc.c - bitmap allocator for slab slots.
 *
 * Allocation is first-fit from a moving hint, so a slab fills from its
 * start and stays compact; a freed slot below the hint pulls the hint back.
 * 64 slots per word keeps a 1 TiB slab of 1 MiB blocks in 128 KiB.
 */
#include "alloc.h"

#include <errno.h>
#include <stdlib.h>

#define WORD_BITS 64

int slot_alloc_init(struct slot_alloc *a, uint64_t nslots)
{
	uint64_t words = (nslots + WORD_BITS - 1) / WORD_BITS;

	a->bits = calloc(words ? words : 1, sizeof(uint64_t));
	if (!a->bits)
		return -ENOMEM;
	a->nslots = nslots;
	a->used = 0;
	a->hint = 0;
	return 0;
}

void slot_alloc_free_all(struct slot_alloc *a)
{
	free(a->bits);
	a->bits = NULL;
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

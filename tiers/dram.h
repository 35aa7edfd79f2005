/*
 * dram.h - the DRAM arena: one mapping of block-size slots.
 *
 * Every block in flight or cached lives in a slot of this arena, so that
 * O_DIRECT and registered-buffer I/O always see aligned memory.
 */
#ifndef TENSORFS_DRAM_H
#define TENSORFS_DRAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct dram_arena {
	void *base;
	size_t bytes; /* mapped length */
	size_t block_size;
	uint32_t nslots;
	bool huge; /* backed by hugetlb pages */
	bool locked;
};

/* Map nslots slots; huge pages where the kernel has them, mlocked. */
int dram_arena_init(struct dram_arena *a, size_t block_size, uint32_t nslots);
void dram_arena_fini(struct dram_arena *a);

static inline void *dram_slot(const struct dram_arena *a, uint32_t slot)
{
	return (char *)a->base + (size_t)slot * a->block_size;
}

#endif

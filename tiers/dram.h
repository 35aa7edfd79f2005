/*
 * dram.h - the DRAM arena: one mapping of block-size slots.
 *
 * Every block in flight or cached lives in a slot of this arena, so that
 * O_DIRECT and registered-buffer I/O always see aligned memory. The arena
 * is a memfd mapped shared, so that the daemon can hand it to a local
 * client (fs/gpu.c) that copies between the slots and a GPU itself.
 */
#ifndef TENSORFS_DRAM_H
#define TENSORFS_DRAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct dram_arena {
	void *base;
	size_t bytes; /* mapped length, a multiple of 2 MiB */
	size_t block_size;
	uint32_t nslots;
	int fd;	   /* the memfd behind the mapping */
	bool huge; /* backed by hugetlb pages */
	bool locked;
	bool sealed; /* fd can be neither shrunk nor grown: safe to hand out */
};

/* Map nslots slots; huge pages where the kernel has them, mlocked. */
int dram_arena_init(struct dram_arena *a, size_t block_size, uint32_t nslots);
void dram_arena_fini(struct dram_arena *a);

static inline void *dram_slot(const struct dram_arena *a, uint32_t slot)
{
	return (char *)a->base + (size_t)slot * a->block_size;
}

#endif

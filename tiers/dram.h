/*
 * dram.h - the DRAM arena: one mapping of block-size slots.
 *
 * Every block in flight or cached lives in a slot of this arena, so that
 * O_DIRECT and registered-buffer I/O always see aligned memory. A shared
 * arena (cuda=on) is a memfd mapped shared, so that the daemon can hand it
 * to a local client (fs/gpu.c) that copies between the slots and a GPU
 * itself; otherwise it is private anonymous memory, which the kernel backs
 * with transparent huge pages where shmem would not get them.
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
	size_t thp_bytes; /* mapped with transparent huge pages, as the kernel says at start */
};

/*
 * Map nslots slots, as a memfd when shared; huge pages where the kernel has
 * them, mlocked.
 */
int dram_arena_init(struct dram_arena *a, size_t block_size, uint32_t nslots, bool shared);
void dram_arena_fini(struct dram_arena *a);

static inline void *dram_slot(const struct dram_arena *a, uint32_t slot)
{
	return (char *)a->base + (size_t)slot * a->block_size;
}

#endif

/*
 * dram.c - the DRAM arena.
 *
 * The arena is mapped once at start. We ask for explicit huge pages first
 * (MAP_HUGETLB, which needs a reserved pool), then fall back to ordinary
 * pages with transparent huge pages advised. The whole arena is mlocked so
 * that cached tensors are never swapped out; without the privilege for that
 * we say so once and go on unlocked.
 */
#include "dram.h"
#include "log.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#define HUGE_2M (2UL << 20)

int dram_arena_init(struct dram_arena *a, size_t block_size, uint32_t nslots)
{
	size_t bytes = (size_t)nslots * block_size;
	size_t rounded = (bytes + HUGE_2M - 1) & ~(HUGE_2M - 1);
	void *p;

	a->block_size = block_size;
	a->nslots = nslots;
	a->huge = false;
	a->locked = false;

	p = mmap(NULL, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB,
		 -1, 0);
	if (p != MAP_FAILED) {
		a->huge = true;
		a->bytes = rounded;
	} else {
		p = mmap(NULL, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
			 0);
		if (p == MAP_FAILED)
			return -errno;
		a->bytes = rounded;
		madvise(p, rounded, MADV_HUGEPAGE);
	}
	a->base = p;
	if (mlock(p, a->bytes) == 0)
		a->locked = true;
	else
		log_warn("cannot mlock the %zu MiB DRAM arena (%s); "
				"it may be swapped",
			a->bytes >> 20, strerror(errno));
	return 0;
}

void dram_arena_fini(struct dram_arena *a)
{
	if (a->base)
		munmap(a->base, a->bytes);
	a->base = NULL;
}

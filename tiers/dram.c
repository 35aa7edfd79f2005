/*
 * dram.c - the DRAM arena.
 *
 * The arena is one memfd, mapped shared once at start, so that a local
 * client can map the same pages (fs/gpu.c hands the fd out). We ask for
 * explicit huge pages first (MFD_HUGETLB, which needs a reserved pool),
 * then fall back to ordinary shmem pages with transparent huge pages
 * advised (honoured where shmem_enabled allows it). The memfd is sealed
 * against shrinking and growing: a client that truncated it would fault
 * the daemon. The whole arena is mlocked so that cached tensors are never
 * swapped out; without the privilege for that we say so once and go on
 * unlocked. Where memfd_create is refused, the arena is private anonymous
 * memory that cannot be shared.
 */
#include "dram.h"
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define HUGE_2M (2UL << 20)
#ifndef MFD_HUGE_2MB
#define MFD_HUGE_2MB (21U << 26) /* log2(2 MiB) << MFD_HUGE_SHIFT */
#endif

/* Map bytes of a fresh memfd; huge asks for hugetlb pages. */
static int map_memfd(struct dram_arena *a, size_t bytes, bool huge)
{
	unsigned flags = MFD_CLOEXEC | MFD_ALLOW_SEALING;
	void *p;
	int fd, err;

	if (huge)
		flags |= MFD_HUGETLB | MFD_HUGE_2MB;
	fd = memfd_create("tensorfs-arena", flags);
	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)bytes) < 0)
		goto fail;
	/* A shared hugetlb mapping reserves its pages here, or fails. */
	p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		goto fail;
	a->sealed = fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0;
	a->base = p;
	a->fd = fd;
	a->huge = huge;
	return 0;
fail:
	err = errno;
	close(fd);
	return -err;
}

int dram_arena_init(struct dram_arena *a, size_t block_size, uint32_t nslots)
{
	size_t bytes = (size_t)nslots * block_size;
	size_t rounded = (bytes + HUGE_2M - 1) & ~(HUGE_2M - 1);
	int ret;

	a->base = NULL;
	a->block_size = block_size;
	a->nslots = nslots;
	a->bytes = rounded;
	a->fd = -1;
	a->huge = false;
	a->locked = false;
	a->sealed = false;

	ret = map_memfd(a, rounded, true);
	if (ret < 0)
		ret = map_memfd(a, rounded, false);
	if (ret < 0) {
		void *p;

		log_warn("cannot create the DRAM arena as a memfd (%s); it cannot be shared",
			 strerror(-ret));
		p = mmap(NULL, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (p == MAP_FAILED)
			return -errno;
		a->base = p;
	}
	if (!a->huge)
		madvise(a->base, rounded, MADV_HUGEPAGE);
	if (mlock(a->base, a->bytes) == 0)
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
	if (a->base && a->fd >= 0)
		close(a->fd);
	a->base = NULL;
	a->fd = -1;
}

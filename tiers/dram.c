/*
 * dram.c - the DRAM arena.
 *
 * A shared arena (cuda=on) is one memfd, mapped shared once at start, so
 * that a local client can map the same pages (fs/gpu.c hands the fd out).
 * We ask for explicit huge pages first (MFD_HUGETLB, which needs a
 * reserved pool), then fall back to ordinary shmem pages with transparent
 * huge pages advised (honoured only where shmem_enabled allows it, and
 * Debian's default is never). The memfd is sealed against shrinking and
 * growing: a client that truncated it would fault the daemon. Where
 * memfd_create is refused, the arena is private anonymous memory that
 * cannot be shared.
 *
 * An arena that no client maps is private anonymous memory from the start:
 * explicit huge pages where a pool is reserved, else transparent huge pages
 * advised, which the default "madvise" setting grants. The page size
 * reaches the devices: a 1 MiB block in 4 KiB pages is 256 segments, more
 * than a virtio disk takes in one request (254), so every block read or
 * written became two requests, and adjacent blocks were never merged into
 * one. In 2 MiB pages it is one segment.
 *
 * The whole arena is mlocked so that cached tensors are never swapped out;
 * without the privilege for that we say so once and go on unlocked.
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
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14; older kernels say EINVAL, and mlock populates */
#endif
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

/* Private anonymous memory; huge asks for hugetlb pages. */
static int map_private(struct dram_arena *a, size_t bytes, bool huge)
{
	void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | (huge ? MAP_HUGETLB : 0), -1, 0);

	if (p == MAP_FAILED)
		return -errno;
	a->base = p;
	a->huge = huge;
	return 0;
}

/*
 * Bytes of [base, base + bytes) that the kernel maps with transparent huge
 * pages: AnonHugePages (private) or ShmemPmdMapped (memfd) of the mapping
 * in /proc/self/smaps. 0 where it cannot tell.
 */
static size_t thp_bytes(const struct dram_arena *a)
{
	FILE *f = fopen("/proc/self/smaps", "re");
	char line[256];
	bool ours = false;
	size_t kb = 0, v;

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f)) {
		unsigned long lo, hi;

		/* A mapping's first line: "lo-hi perms ..."; field lines do not scan as two. */
		if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2) {
			ours = lo >= (unsigned long)a->base &&
			       hi <= (unsigned long)a->base + a->bytes;
			continue;
		}
		if (ours && (sscanf(line, "AnonHugePages: %zu kB", &v) == 1 ||
			     sscanf(line, "ShmemPmdMapped: %zu kB", &v) == 1))
			kb += v;
	}
	fclose(f);
	return kb << 10;
}

int dram_arena_init(struct dram_arena *a, size_t block_size, uint32_t nslots, bool shared)
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
	a->thp_bytes = 0;

	if (shared) {
		ret = map_memfd(a, rounded, true);
		if (ret < 0)
			ret = map_memfd(a, rounded, false);
		if (ret < 0)
			log_warn("cannot create the DRAM arena as a memfd (%s); it cannot be shared",
				 strerror(-ret));
	} else {
		ret = map_private(a, rounded, true);
	}
	if (ret < 0 && (ret = map_private(a, rounded, false)) < 0)
		return ret;
	if (!a->huge)
		madvise(a->base, rounded, MADV_HUGEPAGE);
	/*
	 * Fault every page in now, in huge pages where granted: mlock does
	 * that too, but not where it is refused, or ignored (ASan).
	 */
	madvise(a->base, rounded, MADV_POPULATE_WRITE);
	if (mlock(a->base, a->bytes) == 0)
		a->locked = true;
	else
		log_warn("cannot mlock the %zu MiB DRAM arena (%s); "
			 "it may be swapped",
			 a->bytes >> 20, strerror(errno));
	if (!a->huge)
		a->thp_bytes = thp_bytes(a);
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

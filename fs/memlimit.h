/*
 * memlimit.h - the memory limit of the cgroup the daemon runs in.
 *
 * A container or a service (systemd's MemoryMax) runs under a limit that
 * /proc/meminfo does not show, and the DRAM tier is locked memory charged
 * to it: a tier sized by the host's memory is killed by the cgroup's OOM
 * killer while it fills, without a word on stderr. opts.c sizes the
 * default tier by it and refuses a dram= it cannot hold.
 */
#ifndef TENSORFS_MEMLIMIT_H
#define TENSORFS_MEMLIMIT_H

#include <limits.h>
#include <stdint.h>

struct fs_memlimit {
	uint64_t limit;	      /* bytes, the lowest on the path to the root cgroup */
	uint64_t working_set; /* bytes the cgroup holds now, less file pages it can drop */
	char file[PATH_MAX + 32]; /* the file that sets the limit, to name in an error */
};

/*
 * The limit of the memory cgroup of this process, v2 (memory.max up the
 * tree) or v1 (hierarchical_memory_limit), read under root ("" for the
 * real files; a test gives a tree of its own). 0 when there is one,
 * -ENOENT when there is none or it cannot be read.
 */
int fs_memlimit_read(const char *root, struct fs_memlimit *m);

#endif

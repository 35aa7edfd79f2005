/*
 * ctlcmd.h - the commands written to /.tensorfs/ctl.
 *
 * One command per write(2), at most FS_CTLCMD_MAX bytes, an optional
 * trailing newline:
 *
 *   prefetch PATH   load the file, or every file under the folder, ahead of use
 *   pin PATH        load and keep resident until unpinned, at later mounts too
 *   unpin PATH
 *   evict PATH      write back, then drop from DRAM
 *   flush           write back everything dirty and make it durable
 *   scrub           read every stored block and check it against its hash;
 *                   the report is /.tensorfs/scrub (scrub.c)
 *
 * PATH is absolute from the mount's root ("/" is the root itself) with no
 * empty, "." or ".." components, or "ino:N" for an inode number. Parsing
 * is strict and has no side effects, so that anything a caller writes is
 * either one well-formed command or EINVAL.
 */
#ifndef TENSORFS_CTLCMD_H
#define TENSORFS_CTLCMD_H

#include <stddef.h>
#include <stdint.h>

#define FS_CTLCMD_MAX 4096

enum fs_ctlverb { CTL_PREFETCH, CTL_PIN, CTL_UNPIN, CTL_EVICT, CTL_FLUSH, CTL_SCRUB };

struct fs_ctlcmd {
	enum fs_ctlverb verb;
	uint64_t ino;		      /* non-zero when given as ino:N */
	char path[FS_CTLCMD_MAX + 1]; /* otherwise the absolute path */
};

/* 0 with *out filled, or -EINVAL with a reason in why (static string). */
int fs_ctlcmd_parse(const char *buf, size_t len, struct fs_ctlcmd *out, const char **why);
const char *fs_ctlverb_name(enum fs_ctlverb v);

#endif

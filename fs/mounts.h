/*
 * mounts.h - what is mounted where: the tensorfs mounts that a path lies
 * in, from /proc/self/mountinfo.
 *
 * Used before a mount (fs/main.c: no tensorfs on a tensorfs mount point,
 * no mount point or store folder inside a tensorfs mount), by the lock of
 * a store (fs/meta.c: is its holder's mount still there?) and by tfsctl
 * (which mount a path lies in).
 */
#ifndef TENSORFS_MOUNTS_H
#define TENSORFS_MOUNTS_H

#include <limits.h>
#include <stddef.h>
#include <sys/types.h>

#define FS_MOUNT_TYPE "fuse.tensorfs"

struct fs_mount_ent {
	char point[PATH_MAX]; /* where it is mounted */
	char type[256];	      /* fuse.tensorfs, ext4, ... */
};

/*
 * The mount that holds path (absolute, resolved), which lies on device
 * dev: the entry with that device and the longest mount point above path.
 * 0, -ENOENT when mountinfo names none, or -errno when it cannot be read.
 */
int fs_mount_holding(const char *path, dev_t dev, struct fs_mount_ent *out);

/*
 * 1 when point (absolute) is the mount point of a tensorfs mount, 0 when
 * not, -errno when mountinfo cannot be read. Touches nothing below point,
 * so a hung mount cannot hang the caller.
 */
int fs_mount_is_tensorfs(const char *point);

/*
 * The store and the daemon of the tensorfs mount at point, from its
 * .tensorfs/config, for messages: "meta folder M, pid N"; "" when the
 * mount does not say (too old, or not readable by us).
 */
void fs_mount_describe(const char *point, char *buf, size_t len);

/*
 * No tensorfs on a tensorfs mount point, nor in a folder of a tensorfs
 * mount: the second would hide the first (a second store, with its own
 * mlocked DRAM, where the first one's files were), or keep it from ever
 * being unmounted. 0; -EBUSY with err naming the mount; -ENOTCONN, saying
 * what to do, for a FUSE mount whose daemon is gone.
 */
int fs_mount_check_point(const char *mnt, char *err, size_t errlen);

/*
 * A store folder (what: "nvme folder", "meta folder", ...) must not lie in
 * a tensorfs mount: the daemon's write-back would wait on that mount's
 * daemon, and on itself where two mounts use each other. Nor under mnt,
 * the resolved mount point of the mount to be made (NULL: not checked),
 * which would hide it. dir need not exist yet: its nearest existing
 * parent is looked at. 0, or -ELOOP with err naming the mount.
 */
int fs_mount_check_folder(const char *what, const char *dir, const char *mnt, char *err,
			  size_t errlen);

#endif

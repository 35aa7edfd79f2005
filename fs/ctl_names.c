/*
 * ctl_names.c - the names of the hidden control folder /.tensorfs/: its
 * files and their inode numbers (fs_ctl_ino), their attributes, lookups
 * and the folder's listing; and who may open the files that only the
 * mount's owner or root may open (fs_ctl_may_steer).
 *
 * What each file holds is ctl.c's. This file calls nothing of ops, ctl or
 * gpu, so that each of them may ask it whether an inode is a control file
 * (gpu.c refuses one as a client's file).
 */
#include "ctl_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const struct {
	const char *name;
	uint64_t ino;
} ctl_files[] = {{"stats", FS_CTL_STATS_INO},
		 {"config", FS_CTL_CONFIG_INO},
		 {"ctl", FS_CTL_CTL_INO},
		 {"metrics", FS_CTL_METRICS_INO},
		 {"gpu", FS_CTL_GPU_INO},
		 {"pins", FS_CTL_PINS_INO},
		 {"scrub", FS_CTL_SCRUB_INO}};

#define N_CTL_FILES (sizeof(ctl_files) / sizeof(ctl_files[0]))

bool fs_ctl_ino(uint64_t ino)
{
	return ino >= FS_CTL_DIR_INO && ino <= FS_CTL_DIR_INO + N_CTL_FILES;
}

void fs_ctl_root_stat(struct stat *st, uint64_t ino)
{
	memset(st, 0, sizeof(*st));
	st->st_ino = ino;
	st->st_uid = getuid();
	st->st_gid = getgid();
	if (ino == FS_CTL_DIR_INO) {
		st->st_mode = S_IFDIR | 0555;
		st->st_nlink = 2;
	} else if (ino == FS_CTL_CTL_INO) {
		st->st_mode = S_IFREG | 0200;
		st->st_nlink = 1;
	} else if (ino == FS_CTL_PINS_INO || ino == FS_CTL_SCRUB_INO) {
		st->st_mode = S_IFREG | 0400;
		st->st_nlink = 1;
	} else {
		st->st_mode = S_IFREG | 0444;
		st->st_nlink = 1;
	}
}

static void reply_ctl_entry(struct fs *fs, fuse_req_t req, uint64_t ino)
{
	struct fuse_entry_param e = {0};

	e.ino = ino;
	e.attr_timeout = fs->attr_timeout;
	e.entry_timeout = fs->entry_timeout;
	fs_ctl_root_stat(&e.attr, ino);
	fuse_reply_entry(req, &e);
}

void fs_ctl_lookup(struct fs *fs, fuse_req_t req, uint64_t parent, const char *name)
{
	if (parent == FUSE_ROOT_ID) {
		reply_ctl_entry(fs, req, FS_CTL_DIR_INO);
		return;
	}
	if (parent == FS_CTL_DIR_INO)
		for (size_t i = 0; i < N_CTL_FILES; i++)
			if (strcmp(name, ctl_files[i].name) == 0) {
				reply_ctl_entry(fs, req, ctl_files[i].ino);
				return;
			}
	fuse_reply_err(req, ENOENT);
}

void fs_ctl_getattr(struct fs *fs, fuse_req_t req, uint64_t ino)
{
	struct stat st;

	fs_ctl_root_stat(&st, ino);
	fuse_reply_attr(req, &st, fs->attr_timeout);
}

void fs_ctl_readdir(struct fs *fs, fuse_req_t req, uint64_t ino, size_t size, off_t off,
		    bool plus)
{
	char *buf = calloc(1, size);
	size_t len = 0;

	if (!buf || ino != FS_CTL_DIR_INO) {
		free(buf);
		fuse_reply_err(req, buf ? ENOTDIR : ENOMEM);
		return;
	}
	for (size_t i = (size_t)off; i < N_CTL_FILES + 2; i++) {
		const char *name = i == 0 ? "." : i == 1 ? ".." : ctl_files[i - 2].name;
		uint64_t eino = i < 2 ? FS_CTL_DIR_INO : ctl_files[i - 2].ino;
		struct fuse_entry_param e = {0};
		size_t need;

		fs_ctl_root_stat(&e.attr, eino);
		if (plus) {
			/* Control inodes are not counted: a lookup on them is free. */
			e.ino = i < 2 ? 0 : eino;
			e.attr_timeout = fs->attr_timeout;
			e.entry_timeout = fs->entry_timeout;
			need = fuse_add_direntry_plus(req, buf + len, size - len, name, &e,
						      (off_t)i + 1);
		} else {
			need = fuse_add_direntry(req, buf + len, size - len, name, &e.attr,
						 (off_t)i + 1);
		}
		if (need > size - len)
			break;
		len += need;
	}
	fuse_reply_buf(req, buf, len);
	free(buf);
}

/* Only the mount's owner (the daemon's user) or root may steer it. */
bool fs_ctl_may_steer(fuse_req_t req)
{
	const struct fuse_ctx *ctx = fuse_req_ctx(req);

	return ctx->uid == 0 || ctx->uid == getuid();
}

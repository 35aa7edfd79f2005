/*
 * ops_attr.c - the FUSE ops on attributes: getattr, setattr (a change of
 * size through ops_data.c's fs_truncate_to), and the extended attributes,
 * among them user.tensorfs.prefetch (a hint to load the file ahead) and
 * user.tensorfs.tiers (its bytes per tier, from ctl_run.c).
 *
 * It may call ops_data.c, req.c, the control files (ctl_run.c, ctl_names.c),
 * prefetch.c, the inode table and the store.
 */
#include "ops_int.h"
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <linux/fuse.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#define FS_XATTR_PREFETCH "user.tensorfs.prefetch"
#define FS_XATTR_TIERS "user.tensorfs.tiers"

void fs_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of_req(req);
	struct fs_inode *in;
	struct stat st;
	uint64_t nblocks;
	int ret;

	(void)fi;
	FS_COUNT(fs, getattrs, 1);
	if (fs_ctl_ino(ino)) {
		fs_ctl_getattr(fs, req, ino);
		return;
	}
	ret = fs_iget(fs, ino, &in);
	if (ret) {
		fs_reply_err(fs, req, ret);
		return;
	}
	nblocks = fs_inode_blocks(fs, ino, in->rec.mode);
	pthread_mutex_lock(&in->lock);
	fs_inode_stat(fs, ino, &in->rec, nblocks, &st);
	pthread_mutex_unlock(&in->lock);
	fuse_reply_attr(req, &st, fs->attr_timeout);
	fs_iput(fs, in);
}

/* ---- attributes ---- */

/* A time of the inode's record, to the second and nanosecond of t. */
static void set_time(int64_t *sec, uint32_t *nsec, const struct timespec *t)
{
	*sec = t->tv_sec;
	*nsec = (uint32_t)t->tv_nsec;
}

void fs_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
		struct fuse_file_info *fi)
{
	struct fs *fs = fs_of_req(req);
	struct fs_inode *in;
	struct meta_inode rec;
	MDB_txn *txn;
	struct stat st;
	struct timespec now;
	int64_t s;
	uint32_t ns;
	int ret;

	(void)fi;
	FS_COUNT(fs, setattrs, 1);
	ret = fs_iget_changeable(fs, ino, &in);
	if (ret)
		goto err;
	if (to_set & FUSE_SET_ATTR_SIZE) {
		if (S_ISDIR(in->rec.mode)) {
			ret = -EISDIR;
			goto put;
		}
		ret = fs_io_lock_excl(req, in);
		if (ret)
			goto put;
		fs_watch(req);
		ret = fs_truncate_to(fs, in, (uint64_t)attr->st_size, fuse_req_ctx(req)->uid);
		fs_unwatch();
		pthread_rwlock_unlock(&in->io);
		if (ret)
			goto put;
	}
	fs_now(&s, &ns);
	now.tv_sec = s;
	now.tv_nsec = ns;
	pthread_mutex_lock(&in->lock);
	if (to_set & FUSE_SET_ATTR_MODE)
		in->rec.mode = (in->rec.mode & S_IFMT) | (attr->st_mode & 07777);
	if (to_set & FUSE_SET_ATTR_UID)
		in->rec.uid = attr->st_uid;
	if (to_set & FUSE_SET_ATTR_GID)
		in->rec.gid = attr->st_gid;
	if (to_set & FUSE_SET_ATTR_ATIME_NOW)
		set_time(&in->rec.atime, &in->rec.atime_ns, &now);
	else if (to_set & FUSE_SET_ATTR_ATIME)
		set_time(&in->rec.atime, &in->rec.atime_ns, &attr->st_atim);
	if (to_set & FUSE_SET_ATTR_MTIME_NOW)
		set_time(&in->rec.mtime, &in->rec.mtime_ns, &now);
	else if (to_set & FUSE_SET_ATTR_MTIME)
		set_time(&in->rec.mtime, &in->rec.mtime_ns, &attr->st_mtim);
	set_time(&in->rec.ctime, &in->rec.ctime_ns,
		 to_set & FUSE_SET_ATTR_CTIME ? &attr->st_ctim : &now);
	in->attr_dirty = false;
	rec = in->rec;
	pthread_mutex_unlock(&in->lock);
	ret = meta_begin(fs->meta, true, &txn);
	if (ret)
		goto put;
	ret = meta_inode_put(fs->meta, txn, ino, &rec);
	ret = ret ? (meta_abort(txn), ret) : meta_commit(txn);
	if (ret)
		goto put;
	fs_inode_stat(fs, ino, &rec, fs_inode_blocks(fs, ino, rec.mode), &st);
	fuse_reply_attr(req, &st, fs->attr_timeout);
	fs_iput(fs, in);
	return;
put:
	fs_iput(fs, in);
err:
	fs_reply_err(fs, req, ret);
}

/* ---- xattrs ---- */

static bool xattr_refused(const char *name)
{
	/* POSIX ACLs are not enforced here, so we refuse to store them. */
	return strncmp(name, "system.", 7) == 0;
}

/* After a change of the file's capabilities: the next write looks them up again. */
static void caps_changed(struct fs *fs, fuse_ino_t ino, const char *name)
{
	struct fs_inode *in;

	if (strcmp(name, FS_XATTR_CAPS) != 0 || fs_iget(fs, ino, &in) != 0)
		return;
	pthread_mutex_lock(&in->lock);
	in->caps = FS_CAPS_UNKNOWN;
	pthread_mutex_unlock(&in->lock);
	fs_iput(fs, in);
}

void fs_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value, size_t size,
		 int flags)
{
	struct fs *fs = fs_of_req(req);
	MDB_txn *txn;
	int ret;

	if (fs_ctl_ino(ino) || xattr_refused(name)) {
		fs_reply_err(fs, req, EOPNOTSUPP);
		return;
	}
	if (strcmp(name, FS_XATTR_TIERS) == 0) {
		fs_reply_err(fs, req, EPERM); /* computed, read-only */
		return;
	}
	if (strcmp(name, FS_XATTR_PREFETCH) == 0) {
		/* A hint, not stored: load this file into the DRAM tier now. */
		(void)value;
		(void)size;
		fs_reply_err(fs, req,
			     fs->pf_running ? fs_prefetch_hint(fs, ino, fuse_req_ctx(req)->uid)
					    : -EOPNOTSUPP);
		return;
	}
	ret = meta_begin(fs->meta, true, &txn);
	if (ret)
		goto out;
	ret = meta_xattr_set(fs->meta, txn, ino, name, value, size, flags);
	ret = ret ? (meta_abort(txn), ret) : meta_commit(txn);
	if (ret == 0)
		caps_changed(fs, ino, name);
out:
	fs_reply_err(fs, req, ret);
}

/* Answer a getxattr or listxattr: the size asked for with size 0, else buf. */
static void reply_xattr(struct fs *fs, fuse_req_t req, int ret, const char *buf, size_t len,
			size_t size)
{
	if (ret == 0 && size && len > size)
		ret = -ERANGE;
	if (ret)
		fs_reply_err(fs, req, ret);
	else if (size == 0)
		fuse_reply_xattr(req, len);
	else
		fuse_reply_buf(req, buf, len);
}

/* Answer a getxattr of name, or a listxattr where name is NULL, from the store. */
static void reply_stored_xattr(struct fs *fs, fuse_req_t req, fuse_ino_t ino, const char *name,
			       size_t size)
{
	char *buf = NULL;
	size_t len = 0;
	MDB_txn *txn;
	int ret;

	if (size && !(buf = malloc(size))) {
		fs_reply_err(fs, req, ENOMEM);
		return;
	}
	ret = meta_begin(fs->meta, false, &txn);
	if (ret == 0) {
		ret = name ? meta_xattr_get(fs->meta, txn, ino, name, buf, size, &len)
			   : meta_xattr_list(fs->meta, txn, ino, buf, size, &len);
		meta_abort(txn);
	}
	reply_xattr(fs, req, ret, buf, len, size);
	free(buf);
}

void fs_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size)
{
	struct fs *fs = fs_of_req(req);
	char *buf = NULL;
	size_t len = 0;
	int ret;

	if (fs_ctl_ino(ino)) {
		fs_reply_err(fs, req, ENODATA);
		return;
	}
	if (strcmp(name, FS_XATTR_TIERS) == 0) {
		/* Computed, not stored: where the file's bytes are now. */
		ret = fs_ctl_tiers_xattr(fs, req, ino, &buf, &len);
		reply_xattr(fs, req, ret, buf, len, size);
		free(buf);
		return;
	}
	reply_stored_xattr(fs, req, ino, name, size);
}

void fs_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
	struct fs *fs = fs_of_req(req);

	if (fs_ctl_ino(ino)) {
		if (size == 0)
			fuse_reply_xattr(req, 0);
		else
			fuse_reply_buf(req, NULL, 0);
		return;
	}
	reply_stored_xattr(fs, req, ino, NULL, size);
}

void fs_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name)
{
	struct fs *fs = fs_of_req(req);
	MDB_txn *txn;
	int ret;

	if (fs_ctl_ino(ino)) {
		fs_reply_err(fs, req, EOPNOTSUPP);
		return;
	}
	ret = meta_begin(fs->meta, true, &txn);
	if (ret)
		goto out;
	ret = meta_xattr_del(fs->meta, txn, ino, name);
	ret = ret ? (meta_abort(txn), ret) : meta_commit(txn);
	if (ret == 0)
		caps_changed(fs, ino, name);
out:
	fs_reply_err(fs, req, ret);
}

/*
 * ops_names.c - the FUSE ops on names and folders: lookup and forget,
 * mkdir, mknod, symlink and readlink, create, link, unlink, rmdir, rename,
 * opendir, readdir(plus), releasedir, and statfs. Each change of the
 * namespace is one write transaction of the store; the kernel's lookups
 * are counted on the in-memory inode (reply_entry_of).
 *
 * It may call ops_data.c (fs_open_io, for create), req.c, ctl_names.c (the
 * control folder's names), the inode table and the store (meta*.c).
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

static void fill_entry(struct fs *fs, struct fs_inode *in, struct fuse_entry_param *e)
{
	uint64_t nblocks = fs_inode_blocks(fs, in->ino, in->rec.mode); /* the type never changes */

	memset(e, 0, sizeof(*e));
	e->ino = in->ino;
	e->attr_timeout = fs->attr_timeout;
	e->entry_timeout = fs->entry_timeout;
	pthread_mutex_lock(&in->lock);
	fs_inode_stat(fs, in->ino, &in->rec, nblocks, &e->attr);
	pthread_mutex_unlock(&in->lock);
}

/* Reply with an entry for in and count the kernel's new lookup. */
static void reply_entry_of(struct fs *fs, fuse_req_t req, struct fs_inode *in)
{
	struct fuse_entry_param e;

	fill_entry(fs, in, &e);
	fs_ilookup_add(fs, in, 1);
	if (fuse_reply_entry(req, &e) != 0)
		fs_iforget(fs, in->ino, 1);
}

/* ---- names ---- */

void fs_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct fs *fs = fs_of_req(req);
	struct fs_inode *in;
	MDB_txn *txn;
	uint64_t ino;
	int ret;

	FS_COUNT(fs, lookups, 1);
	if (fs_ctl_ino(parent) || (parent == FUSE_ROOT_ID && strcmp(name, FS_CTL_NAME) == 0)) {
		fs_ctl_lookup(fs, req, parent, name);
		return;
	}
	ret = meta_begin(fs->meta, false, &txn);
	if (ret)
		goto err;
	ret = meta_dirent_lookup(fs->meta, txn, parent, name, &ino);
	meta_abort(txn);
	/*
	 * A name missing from the root ends every path under it: when a create
	 * under a folder that exists fails with ENOENT, this (at log_level=debug;
	 * the kernel looks up every new name first, so it is routine) or
	 * fs_iget's line says where the ENOENT came from.
	 */
	if (ret == -ENOENT && parent == FUSE_ROOT_ID)
		log_debug("lookup of \"%s\" in the root: no such name (ENOENT)", name);
	if (ret)
		goto err;
	ret = fs_iget(fs, ino, &in);
	if (ret)
		goto err;
	__atomic_store_n(&in->parent, parent, __ATOMIC_RELAXED);
	reply_entry_of(fs, req, in);
	fs_iput(fs, in);
	return;
err:
	fs_reply_err(fs, req, ret);
}

void fs_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
	struct fs *fs = fs_of_req(req);

	if (!fs_ctl_ino(ino))
		fs_iforget(fs, ino, nlookup);
	fuse_reply_none(req);
}

void fs_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *forgets)
{
	struct fs *fs = fs_of_req(req);

	for (size_t i = 0; i < count; i++)
		if (!fs_ctl_ino(forgets[i].ino))
			fs_iforget(fs, forgets[i].ino, forgets[i].nlookup);
	fuse_reply_none(req);
}

/*
 * Create a node under parent in one transaction: a file, folder, symlink
 * or device. On success *out holds a referenced inode.
 */
static int make_node(struct fs *fs, fuse_req_t req, uint64_t parent, const char *name,
		     mode_t mode, dev_t rdev, const char *target, struct fs_inode **out)
{
	const struct fuse_ctx *ctx = fuse_req_ctx(req);
	struct fs_inode *dir;
	struct meta_inode rec = {0};
	MDB_txn *txn;
	uint64_t ino, existing;
	int ret;

	if (parent == FUSE_ROOT_ID && strcmp(name, FS_CTL_NAME) == 0)
		return -EEXIST;
	if (strlen(name) > 255)
		return -ENAMETOOLONG;
	ret = fs_iget(fs, parent, &dir);
	if (ret == -ENOENT)
		log_warn("create of \"%s\" in folder inode %llu: the folder is not in the store "
			 "(ENOENT)",
			 name, (unsigned long long)parent);
	if (ret)
		return ret;
	if (!S_ISDIR(dir->rec.mode)) {
		fs_iput(fs, dir);
		return -ENOTDIR;
	}
	rec.mode = mode;
	rec.uid = ctx->uid;
	rec.gid = ctx->gid;
	if (dir->rec.mode & S_ISGID) {
		rec.gid = dir->rec.gid;
		if (S_ISDIR(mode))
			rec.mode |= S_ISGID;
	}
	rec.nlink = S_ISDIR(mode) ? 2 : 1;
	rec.rdev = rdev;
	rec.size = target ? strlen(target) : 0;
	fs_rec_touch(&rec, true);
	rec.atime = rec.mtime;
	rec.atime_ns = rec.mtime_ns;

	ret = meta_begin(fs->meta, true, &txn);
	if (ret)
		goto out;
	ret = meta_dirent_lookup(fs->meta, txn, parent, name, &existing);
	if (ret == 0) {
		ret = -EEXIST;
		goto abort;
	}
	if (ret != -ENOENT)
		goto abort;
	ino = meta_new_ino(fs->meta);
	ret = meta_inode_put(fs->meta, txn, ino, &rec);
	if (!ret)
		ret = meta_dirent_add(fs->meta, txn, parent, name, ino);
	if (!ret && target)
		ret = meta_symlink_put(fs->meta, txn, ino, target);
	if (ret)
		goto abort;
	pthread_mutex_lock(&dir->lock);
	if (S_ISDIR(mode))
		dir->rec.nlink++;
	fs_rec_touch(&dir->rec, true);
	struct meta_inode drec = dir->rec;
	dir->attr_dirty = false;
	pthread_mutex_unlock(&dir->lock);
	ret = meta_inode_put(fs->meta, txn, parent, &drec);
	if (ret)
		goto abort;
	ret = meta_commit(txn);
	if (ret)
		goto out;
	fs_iput(fs, dir);
	ret = fs_iget(fs, ino, out);
	if (ret == 0)
		__atomic_store_n(&(*out)->parent, parent, __ATOMIC_RELAXED);
	return ret;
abort:
	meta_abort(txn);
out:
	fs_iput(fs, dir);
	return ret;
}

static void reply_new_node(struct fs *fs, fuse_req_t req, int ret, struct fs_inode *in)
{
	if (ret) {
		fs_reply_err(fs, req, ret);
		return;
	}
	reply_entry_of(fs, req, in);
	fs_iput(fs, in);
}

void fs_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode)
{
	struct fs *fs = fs_of_req(req);
	struct fs_inode *in = NULL;
	int ret = make_node(fs, req, parent, name, S_IFDIR | (mode & 07777), 0, NULL, &in);

	reply_new_node(fs, req, ret, in);
}

void fs_mknod(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, dev_t rdev)
{
	struct fs *fs = fs_of_req(req);
	struct fs_inode *in = NULL;
	int ret;

	if (!S_ISREG(mode) && !S_ISFIFO(mode) && !S_ISSOCK(mode) && !S_ISCHR(mode) &&
	    !S_ISBLK(mode)) {
		fs_reply_err(fs, req, EINVAL);
		return;
	}
	ret = make_node(fs, req, parent, name, mode, rdev, NULL, &in);
	reply_new_node(fs, req, ret, in);
}

void fs_symlink(fuse_req_t req, const char *link, fuse_ino_t parent, const char *name)
{
	struct fs *fs = fs_of_req(req);
	struct fs_inode *in = NULL;
	int ret;

	if (strlen(link) >= 4096) {
		fs_reply_err(fs, req, ENAMETOOLONG);
		return;
	}
	ret = make_node(fs, req, parent, name, S_IFLNK | 0777, 0, link, &in);
	reply_new_node(fs, req, ret, in);
}

void fs_readlink(fuse_req_t req, fuse_ino_t ino)
{
	struct fs *fs = fs_of_req(req);
	char buf[4097];
	MDB_txn *txn;
	int ret = meta_begin(fs->meta, false, &txn);

	if (ret == 0) {
		ret = meta_symlink_get(fs->meta, txn, ino, buf, sizeof(buf));
		meta_abort(txn);
	}
	if (ret)
		fs_reply_err(fs, req, ret);
	else
		fuse_reply_readlink(req, buf);
}

void fs_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
	       struct fuse_file_info *fi)
{
	struct fs *fs = fs_of_req(req);
	struct fs_inode *in = NULL;
	struct fuse_entry_param e;
	int ret;

	FS_COUNT(fs, creates, 1);
	ret = make_node(fs, req, parent, name, S_IFREG | (mode & 07777), 0, NULL, &in);
	if (ret) {
		fs_reply_err(fs, req, ret);
		return;
	}
	fs_open_io(fi);
	fill_entry(fs, in, &e);
	fs_ilookup_add(fs, in, 1);
	/* The open's reference on in is dropped at release. */
	if (fuse_reply_create(req, &e, fi) != 0) {
		fs_iforget(fs, in->ino, 1);
		fs_iput(fs, in);
	}
}

void fs_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char *newname)
{
	struct fs *fs = fs_of_req(req);
	struct fs_inode *in, *dir;
	MDB_txn *txn;
	uint64_t existing;
	int ret;

	ret = fs_iget_changeable(fs, ino, &in);
	if (ret)
		goto err;
	ret = fs_iget(fs, newparent, &dir);
	if (ret)
		goto put_in;
	ret = meta_begin(fs->meta, true, &txn);
	if (ret)
		goto put_dir;
	ret = meta_dirent_lookup(fs->meta, txn, newparent, newname, &existing);
	if (ret == 0)
		ret = -EEXIST;
	else if (ret == -ENOENT)
		ret = meta_dirent_add(fs->meta, txn, newparent, newname, ino);
	if (ret) {
		meta_abort(txn);
		goto put_dir;
	}
	pthread_mutex_lock(&in->lock);
	in->rec.nlink++;
	fs_rec_touch(&in->rec, false);
	struct meta_inode rec = in->rec;
	pthread_mutex_unlock(&in->lock);
	pthread_mutex_lock(&dir->lock);
	fs_rec_touch(&dir->rec, true);
	struct meta_inode drec = dir->rec;
	pthread_mutex_unlock(&dir->lock);
	ret = meta_inode_put(fs->meta, txn, ino, &rec);
	if (!ret)
		ret = meta_inode_put(fs->meta, txn, newparent, &drec);
	ret = ret ? (meta_abort(txn), ret) : meta_commit(txn);
	if (ret) {
		pthread_mutex_lock(&in->lock);
		in->rec.nlink--;
		pthread_mutex_unlock(&in->lock);
		goto put_dir;
	}
	fs_iput(fs, dir);
	reply_entry_of(fs, req, in);
	fs_iput(fs, in);
	return;
put_dir:
	fs_iput(fs, dir);
put_in:
	fs_iput(fs, in);
err:
	fs_reply_err(fs, req, ret);
}

/*
 * Remove the name (parent, name) inside txn: drops the child's link count
 * and returns the child referenced in *child (the caller puts it after the
 * commit, which may purge it).
 */
static int remove_name(struct fs *fs, MDB_txn *txn, struct fs_inode *dir, const char *name,
		       int want_dir, struct fs_inode **child)
{
	struct fs_inode *in;
	uint64_t ino;
	int ret;

	ret = meta_dirent_lookup(fs->meta, txn, dir->ino, name, &ino);
	if (ret)
		return ret;
	ret = fs_iget(fs, ino, &in);
	if (ret)
		return ret;
	if (want_dir == 1 && !S_ISDIR(in->rec.mode)) {
		ret = -ENOTDIR;
		goto put;
	}
	if (want_dir == 0 && S_ISDIR(in->rec.mode)) {
		ret = -EISDIR;
		goto put;
	}
	if (S_ISDIR(in->rec.mode)) {
		ret = meta_dir_empty(fs->meta, txn, ino);
		if (ret == 0)
			ret = -ENOTEMPTY;
		if (ret < 0)
			goto put;
	}
	ret = meta_dirent_del(fs->meta, txn, dir->ino, name);
	if (ret)
		goto put;
	pthread_mutex_lock(&in->lock);
	if (S_ISDIR(in->rec.mode))
		in->rec.nlink = 0;
	else if (in->rec.nlink)
		in->rec.nlink--;
	fs_rec_touch(&in->rec, false);
	struct meta_inode rec = in->rec;
	pthread_mutex_unlock(&in->lock);
	ret = meta_inode_put(fs->meta, txn, ino, &rec);
	if (ret)
		goto put;
	pthread_mutex_lock(&dir->lock);
	if (S_ISDIR(rec.mode) && dir->rec.nlink > 2)
		dir->rec.nlink--;
	fs_rec_touch(&dir->rec, true);
	struct meta_inode drec = dir->rec;
	pthread_mutex_unlock(&dir->lock);
	ret = meta_inode_put(fs->meta, txn, dir->ino, &drec);
	if (ret)
		goto put;
	*child = in;
	return 0;
put:
	fs_iput(fs, in);
	return ret;
}

/* Undo the in-memory half of a removal whose transaction failed. */
static void reload_attrs(struct fs *fs, struct fs_inode *in)
{
	MDB_txn *txn;
	struct meta_inode rec;

	if (meta_begin(fs->meta, false, &txn))
		return;
	if (meta_inode_get(fs->meta, txn, in->ino, &rec) == 0) {
		pthread_mutex_lock(&in->lock);
		in->rec = rec;
		pthread_mutex_unlock(&in->lock);
	}
	meta_abort(txn);
}

static void do_remove(fuse_req_t req, fuse_ino_t parent, const char *name, int want_dir)
{
	struct fs *fs = fs_of_req(req);
	struct fs_inode *dir, *child = NULL;
	MDB_txn *txn;
	int ret;

	FS_COUNT(fs, unlinks, 1);
	ret = fs_iget(fs, parent, &dir);
	if (ret)
		goto err;
	ret = meta_begin(fs->meta, true, &txn);
	if (ret)
		goto put;
	ret = remove_name(fs, txn, dir, name, want_dir, &child);
	ret = ret ? (meta_abort(txn), ret) : meta_commit(txn);
	if (ret && child) {
		reload_attrs(fs, child);
		reload_attrs(fs, dir);
	}
	if (child)
		fs_iput(fs, child);
put:
	fs_iput(fs, dir);
err:
	fs_reply_err(fs, req, ret);
}

void fs_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	do_remove(req, parent, name, 0);
}

void fs_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	do_remove(req, parent, name, 1);
}

static int exchange(struct fs *fs, MDB_txn *txn, struct fs_inode *dir, const char *name,
		    struct fs_inode *ndir, const char *newname, uint64_t a, uint64_t b)
{
	struct fs_inode *ia, *ib;
	int ret = fs_iget(fs, a, &ia);

	if (ret)
		return ret;
	ret = fs_iget(fs, b, &ib);
	if (ret) {
		fs_iput(fs, ia);
		return ret;
	}
	ret = meta_dirent_del(fs->meta, txn, dir->ino, name);
	if (!ret)
		ret = meta_dirent_del(fs->meta, txn, ndir->ino, newname);
	if (!ret)
		ret = meta_dirent_add(fs->meta, txn, dir->ino, name, b);
	if (!ret)
		ret = meta_dirent_add(fs->meta, txn, ndir->ino, newname, a);
	if (!ret && dir != ndir && S_ISDIR(ia->rec.mode) != S_ISDIR(ib->rec.mode)) {
		/* A folder moves to the other parent: link counts follow it. */
		struct fs_inode *gains = S_ISDIR(ia->rec.mode) ? ndir : dir;
		struct fs_inode *loses = S_ISDIR(ia->rec.mode) ? dir : ndir;

		pthread_mutex_lock(&gains->lock);
		gains->rec.nlink++;
		pthread_mutex_unlock(&gains->lock);
		pthread_mutex_lock(&loses->lock);
		loses->rec.nlink--;
		pthread_mutex_unlock(&loses->lock);
	}
	fs_iput(fs, ia);
	fs_iput(fs, ib);
	return ret;
}

void fs_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent,
	       const char *newname, unsigned int flags)
{
	struct fs *fs = fs_of_req(req);
	struct fs_inode *dir = NULL, *ndir = NULL, *src = NULL, *victim = NULL;
	uint64_t sino, dino;
	bool have_dst;
	MDB_txn *txn = NULL;
	int ret;

	FS_COUNT(fs, renames, 1);
	if (flags & ~(RENAME_NOREPLACE | RENAME_EXCHANGE) ||
	    (flags & RENAME_NOREPLACE && flags & RENAME_EXCHANGE)) {
		fs_reply_err(fs, req, EINVAL);
		return;
	}
	if ((newparent == FUSE_ROOT_ID && strcmp(newname, FS_CTL_NAME) == 0) ||
	    fs_ctl_ino(parent) || fs_ctl_ino(newparent)) {
		fs_reply_err(fs, req, EPERM);
		return;
	}
	ret = fs_iget(fs, parent, &dir);
	if (!ret)
		ret = fs_iget(fs, newparent, &ndir);
	if (ret)
		goto out;
	ret = meta_begin(fs->meta, true, &txn);
	if (ret)
		goto out;
	ret = meta_dirent_lookup(fs->meta, txn, parent, name, &sino);
	if (ret)
		goto abort;
	ret = meta_dirent_lookup(fs->meta, txn, newparent, newname, &dino);
	if (ret && ret != -ENOENT)
		goto abort;
	have_dst = ret == 0;
	ret = 0;
	if (flags & RENAME_EXCHANGE) {
		ret = have_dst ? exchange(fs, txn, dir, name, ndir, newname, sino, dino) : -ENOENT;
		goto store_dirs;
	}
	if (have_dst && (flags & RENAME_NOREPLACE)) {
		ret = -EEXIST;
		goto abort;
	}
	if (have_dst && dino == sino)
		goto abort; /* both names are the same inode: nothing to do */
	ret = fs_iget(fs, sino, &src);
	if (ret)
		goto abort;
	if (have_dst) {
		struct fs_inode *d;

		ret = fs_iget(fs, dino, &d);
		if (ret)
			goto abort;
		bool src_dir = S_ISDIR(src->rec.mode), dst_dir = S_ISDIR(d->rec.mode);
		fs_iput(fs, d);
		if (src_dir && !dst_dir)
			ret = -ENOTDIR;
		else if (!src_dir && dst_dir)
			ret = -EISDIR;
		if (!ret)
			ret = remove_name(fs, txn, ndir, newname, src_dir, &victim);
		if (ret)
			goto abort;
	}
	ret = meta_dirent_del(fs->meta, txn, parent, name);
	if (!ret)
		ret = meta_dirent_add(fs->meta, txn, newparent, newname, sino);
	if (ret)
		goto abort;
	pthread_mutex_lock(&src->lock);
	fs_rec_touch(&src->rec, false);
	struct meta_inode srec = src->rec;
	pthread_mutex_unlock(&src->lock);
	ret = meta_inode_put(fs->meta, txn, sino, &srec);
	if (ret)
		goto abort;
	if (S_ISDIR(srec.mode) && dir != ndir) {
		pthread_mutex_lock(&dir->lock);
		dir->rec.nlink--;
		pthread_mutex_unlock(&dir->lock);
		pthread_mutex_lock(&ndir->lock);
		ndir->rec.nlink++;
		pthread_mutex_unlock(&ndir->lock);
	}
store_dirs:
	if (ret)
		goto abort;
	pthread_mutex_lock(&dir->lock);
	fs_rec_touch(&dir->rec, true);
	struct meta_inode drec = dir->rec;
	pthread_mutex_unlock(&dir->lock);
	ret = meta_inode_put(fs->meta, txn, dir->ino, &drec);
	if (!ret && ndir != dir) {
		pthread_mutex_lock(&ndir->lock);
		fs_rec_touch(&ndir->rec, true);
		struct meta_inode nrec = ndir->rec;
		pthread_mutex_unlock(&ndir->lock);
		ret = meta_inode_put(fs->meta, txn, ndir->ino, &nrec);
	}
	if (ret)
		goto abort;
	ret = meta_commit(txn);
	txn = NULL;
	if (ret)
		goto reload;
	goto out;
abort:
	if (txn)
		meta_abort(txn);
reload:
	if (ret) {
		reload_attrs(fs, dir);
		if (ndir != dir)
			reload_attrs(fs, ndir);
		if (victim)
			reload_attrs(fs, victim);
	}
out:
	if (victim)
		fs_iput(fs, victim);
	if (src)
		fs_iput(fs, src);
	if (ndir)
		fs_iput(fs, ndir);
	if (dir)
		fs_iput(fs, dir);
	fs_reply_err(fs, req, ret);
}

/* ---- folders ---- */

void fs_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of_req(req);
	struct fs_inode *in;
	int ret;

	fi->fh = 0;
	if (fs_ctl_ino(ino)) {
		fuse_reply_open(req, fi);
		return;
	}
	ret = fs_iget(fs, ino, &in);
	if (ret) {
		fs_reply_err(fs, req, ret);
		return;
	}
	bool dir = S_ISDIR(in->rec.mode);
	fs_iput(fs, in);
	if (!dir)
		fs_reply_err(fs, req, ENOTDIR);
	else
		fuse_reply_open(req, fi);
}

struct dir_buf {
	struct fs *fs;
	fuse_req_t req;
	char *buf;
	size_t size, len;
	bool plus;
	int err;
	uint64_t dir; /* the folder read */
};

/* Offsets: "." is followed by 1, ".." by 2, an entry with cookie c by c + 2. */
static int add_dirent(void *arg, const char *name, size_t namelen, uint64_t ino, uint64_t cookie)
{
	struct dir_buf *d = arg;
	size_t need;

	(void)namelen;
	if (d->plus) {
		struct fs_inode *in;
		struct fuse_entry_param e;

		if (fs_iget(d->fs, ino, &in) != 0)
			return 0; /* raced with a removal: skip it */
		fill_entry(d->fs, in, &e);
		need = fuse_add_direntry_plus(d->req, d->buf + d->len, d->size - d->len, name, &e,
					      (off_t)(cookie + 2));
		if (need <= d->size - d->len) {
			fs_ilookup_add(d->fs, in, 1);
			/* The kernel looks it up no more: the learner's stream is known here. */
			__atomic_store_n(&in->parent, d->dir, __ATOMIC_RELAXED);
		}
		fs_iput(d->fs, in);
	} else {
		struct stat st = {0};
		struct fs_inode *in;

		st.st_ino = ino;
		if (fs_iget(d->fs, ino, &in) == 0) {
			st.st_mode = in->rec.mode & S_IFMT;
			fs_iput(d->fs, in);
		}
		need = fuse_add_direntry(d->req, d->buf + d->len, d->size - d->len, name, &st,
					 (off_t)(cookie + 2));
	}
	if (need > d->size - d->len)
		return 1; /* full */
	d->len += need;
	return 0;
}

static bool add_dot(struct dir_buf *d, const char *name, uint64_t ino, off_t next)
{
	size_t need;
	struct stat st = {0};

	st.st_ino = ino;
	st.st_mode = S_IFDIR;
	if (d->plus) {
		struct fuse_entry_param e = {0};

		e.attr = st;
		need = fuse_add_direntry_plus(d->req, d->buf + d->len, d->size - d->len, name, &e,
					      next);
	} else {
		need = fuse_add_direntry(d->req, d->buf + d->len, d->size - d->len, name, &st,
					 next);
	}
	if (need > d->size - d->len)
		return false;
	d->len += need;
	return true;
}

static void do_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, bool plus)
{
	struct fs *fs = fs_of_req(req);
	struct dir_buf d = {fs, req, NULL, size, 0, plus, 0, ino};
	MDB_txn *txn;
	int ret;

	if (fs_ctl_ino(ino)) {
		fs_ctl_readdir(fs, req, ino, size, off, plus);
		return;
	}
	d.buf = malloc(size);
	if (!d.buf) {
		fs_reply_err(fs, req, ENOMEM);
		return;
	}
	if (off == 0 && !add_dot(&d, ".", ino, 1))
		goto reply;
	if (off <= 1 && !add_dot(&d, "..", ino, 2))
		goto reply;
	ret = meta_begin(fs->meta, false, &txn);
	if (ret) {
		free(d.buf);
		fs_reply_err(fs, req, ret);
		return;
	}
	ret = meta_readdir(fs->meta, txn, ino, off >= 2 ? (uint64_t)off - 2 : 0, add_dirent, &d);
	meta_abort(txn);
	if (ret && d.len == 0) {
		free(d.buf);
		fs_reply_err(fs, req, ret);
		return;
	}
reply:
	fuse_reply_buf(req, d.buf, d.len);
	free(d.buf);
}

void fs_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
	(void)fi;
	do_readdir(req, ino, size, off, false);
}

void fs_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		    struct fuse_file_info *fi)
{
	(void)fi;
	do_readdir(req, ino, size, off, true);
}

void fs_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)ino;
	(void)fi;
	fuse_reply_err(req, 0);
}

void fs_statfs(fuse_req_t req, fuse_ino_t ino)
{
	struct fs *fs = fs_of_req(req);
	struct statvfs sv = {0};
	uint64_t total, avail, inodes, blocks, mapped;
	const unsigned long frag = 4096;

	(void)ino;
	tb_space(fs->tb, &total, &avail);
	meta_counts(fs->meta, &inodes, &blocks, &mapped);
	sv.f_bsize = fs->bs;
	sv.f_frsize = frag;
	sv.f_blocks = total / frag;
	sv.f_bfree = avail / frag;
	sv.f_bavail = avail / frag;
	sv.f_files = 1ULL << 40;
	sv.f_ffree = sv.f_files - inodes;
	sv.f_favail = sv.f_ffree;
	sv.f_namemax = 255;
	fuse_reply_statfs(req, &sv);
}

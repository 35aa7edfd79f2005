/*
 * meta_names.c - inodes, names, xattrs and symlinks.
 *
 * An inode record is keyed by its number; a name by its parent and the
 * name, with a cookie per entry (kept in a second table by parent and
 * cookie) so that readdir resumes where it stopped. Xattrs are keyed by
 * inode and name, a symlink's target by inode. Purging an inode drops its
 * block map through meta_blocks.c.
 */
#include "meta_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>

/* ---- inodes ---- */

int meta_inode_get(struct fs_meta *m, MDB_txn *txn, uint64_t ino, struct meta_inode *rec)
{
	MDB_val v;
	int ret = id_get(txn, m->inode, ino, &v);

	if (ret)
		return ret;
	return meta_decode_inode(v.mv_data, v.mv_size, rec);
}

int meta_inode_put(struct fs_meta *m, MDB_txn *txn, uint64_t ino, const struct meta_inode *rec)
{
	return id_put(txn, m->inode, ino, rec, sizeof(*rec));
}

/* Delete every key of db that starts with the 8-byte prefix ino. */
static int del_prefix(MDB_txn *txn, MDB_dbi dbi, uint64_t ino)
{
	unsigned char kb[8];
	MDB_cursor *c;
	MDB_val k = {8, kb}, v;
	int rc;

	put_be64(kb, ino);
	rc = mdb_cursor_open(txn, dbi, &c);
	if (rc)
		return mdb_err(rc);
	rc = mdb_cursor_get(c, &k, &v, MDB_SET_RANGE);
	while (rc == 0 && k.mv_size >= 8 && get_be64(k.mv_data) == ino) {
		rc = mdb_cursor_del(c, 0);
		if (rc)
			break;
		rc = mdb_cursor_get(c, &k, &v, MDB_GET_CURRENT);
		if (rc == EINVAL || rc == MDB_NOTFOUND) {
			k.mv_size = 8;
			k.mv_data = kb;
			rc = mdb_cursor_get(c, &k, &v, MDB_SET_RANGE);
		}
	}
	mdb_cursor_close(c);
	return rc == MDB_NOTFOUND ? 0 : mdb_err(rc);
}

int meta_inode_purge(struct fs_meta *m, MDB_txn *txn, uint64_t ino, struct locvec *freed)
{
	unsigned char kb[8];
	MDB_val k = {8, kb};
	int ret;

	ret = meta_bmap_clear(m, txn, ino, 0, UINT64_MAX, freed);
	if (!ret)
		ret = del_prefix(txn, m->xattr, ino);
	if (ret)
		return ret;
	put_be64(kb, ino);
	mdb_del(txn, m->symlink, &k, NULL);
	mdb_del(txn, m->nblocks, &k, NULL);
	ret = mdb_err(mdb_del(txn, m->inode, &k, NULL));
	return ret == -ENOENT ? 0 : ret;
}

/* ---- names ---- */

static int name_key(unsigned char *kb, uint64_t parent, const char *name, MDB_val *k)
{
	size_t len = strlen(name);

	if (len > 255)
		return -ENAMETOOLONG;
	put_be64(kb, parent);
	memcpy(kb + 8, name, len);
	k->mv_size = 8 + len;
	k->mv_data = kb;
	return 0;
}

/* name's entry in folder parent: its key in k (built in kb), its inode and cookie. */
static int dirent_get(struct fs_meta *m, MDB_txn *txn, uint64_t parent, const char *name,
		      unsigned char *kb, MDB_val *k, uint64_t *ino, uint64_t *cookie)
{
	MDB_val v;
	int ret = name_key(kb, parent, name, k);

	if (ret)
		return ret;
	ret = mdb_err(mdb_get(txn, m->dirent, k, &v));
	if (ret)
		return ret;
	return meta_decode_dirent(v.mv_data, v.mv_size, ino, cookie);
}

/* The key of a folder's entry by cookie (dircook): parent and cookie, in ck (16 bytes). */
static void cookie_key(unsigned char *ck, uint64_t parent, uint64_t cookie, MDB_val *k)
{
	put_be64(ck, parent);
	put_be64(ck + 8, cookie);
	k->mv_size = 16;
	k->mv_data = ck;
}

int meta_dirent_lookup(struct fs_meta *m, MDB_txn *txn, uint64_t parent, const char *name,
		       uint64_t *ino)
{
	unsigned char kb[KEY_MAX];
	MDB_val k;
	uint64_t cookie;

	return dirent_get(m, txn, parent, name, kb, &k, ino, &cookie);
}

/* The next cookie of a folder: one past its highest. */
static int next_cookie(struct fs_meta *m, MDB_txn *txn, uint64_t parent, uint64_t *cookie)
{
	unsigned char kb[16];
	MDB_cursor *c;
	MDB_val k = {16, kb}, v;
	int rc;

	put_be64(kb, parent + 1);
	put_be64(kb + 8, 0);
	rc = mdb_cursor_open(txn, m->dircook, &c);
	if (rc)
		return mdb_err(rc);
	rc = mdb_cursor_get(c, &k, &v, MDB_SET_RANGE);
	if (rc == 0)
		rc = mdb_cursor_get(c, &k, &v, MDB_PREV);
	else if (rc == MDB_NOTFOUND)
		rc = mdb_cursor_get(c, &k, &v, MDB_LAST);
	*cookie = 1;
	if (rc == 0 && k.mv_size == 16 && get_be64(k.mv_data) == parent)
		*cookie = get_be64((unsigned char *)k.mv_data + 8) + 1;
	mdb_cursor_close(c);
	return (rc == 0 || rc == MDB_NOTFOUND) ? 0 : mdb_err(rc);
}

int meta_dirent_add(struct fs_meta *m, MDB_txn *txn, uint64_t parent, const char *name,
		    uint64_t ino)
{
	unsigned char kb[KEY_MAX], ck[16];
	MDB_val k, v, cv;
	struct dirent_val dv = {ino, 0};
	int ret = name_key(kb, parent, name, &k);

	if (ret)
		return ret;
	ret = next_cookie(m, txn, parent, &dv.cookie);
	if (ret)
		return ret;
	v.mv_size = sizeof(dv);
	v.mv_data = &dv;
	ret = mdb_err(mdb_put(txn, m->dirent, &k, &v, MDB_NOOVERWRITE));
	if (ret)
		return ret;
	cookie_key(ck, parent, dv.cookie, &k);
	cv.mv_size = strlen(name);
	cv.mv_data = (void *)name;
	return mdb_err(mdb_put(txn, m->dircook, &k, &cv, 0));
}

int meta_dirent_del(struct fs_meta *m, MDB_txn *txn, uint64_t parent, const char *name)
{
	unsigned char kb[KEY_MAX], ck[16];
	MDB_val k;
	struct dirent_val dv;
	int ret = dirent_get(m, txn, parent, name, kb, &k, &dv.ino, &dv.cookie);

	if (ret)
		return ret;
	ret = mdb_err(mdb_del(txn, m->dirent, &k, NULL));
	if (ret)
		return ret;
	cookie_key(ck, parent, dv.cookie, &k);
	ret = mdb_err(mdb_del(txn, m->dircook, &k, NULL));
	return ret == -ENOENT ? 0 : ret;
}

int meta_dir_empty(struct fs_meta *m, MDB_txn *txn, uint64_t dir)
{
	unsigned char kb[8];
	MDB_cursor *c;
	MDB_val k = {8, kb}, v;
	int rc, ret;

	put_be64(kb, dir);
	rc = mdb_cursor_open(txn, m->dircook, &c);
	if (rc)
		return mdb_err(rc);
	rc = mdb_cursor_get(c, &k, &v, MDB_SET_RANGE);
	if (rc == MDB_NOTFOUND)
		ret = 1;
	else if (rc)
		ret = mdb_err(rc);
	else
		ret = !(k.mv_size == 16 && get_be64(k.mv_data) == dir);
	mdb_cursor_close(c);
	return ret;
}

int meta_readdir(struct fs_meta *m, MDB_txn *txn, uint64_t dir, uint64_t after, meta_dirent_fn fn,
		 void *arg)
{
	unsigned char kb[16];
	MDB_cursor *c;
	MDB_val k = {16, kb}, v;
	int rc;

	put_be64(kb, dir);
	put_be64(kb + 8, after + 1);
	rc = mdb_cursor_open(txn, m->dircook, &c);
	if (rc)
		return mdb_err(rc);
	rc = mdb_cursor_get(c, &k, &v, MDB_SET_RANGE);
	while (rc == 0 && k.mv_size == 16 && get_be64(k.mv_data) == dir) {
		char name[256];
		uint64_t ino, cookie = get_be64((unsigned char *)k.mv_data + 8);
		size_t len = v.mv_size < 255 ? v.mv_size : 255;

		memcpy(name, v.mv_data, len);
		name[len] = 0;
		if (meta_dirent_lookup(m, txn, dir, name, &ino) == 0 &&
		    fn(arg, name, len, ino, cookie))
			break;
		rc = mdb_cursor_get(c, &k, &v, MDB_NEXT);
	}
	mdb_cursor_close(c);
	return (rc == 0 || rc == MDB_NOTFOUND) ? 0 : mdb_err(rc);
}

/* ---- xattrs and symlinks ---- */

int meta_xattr_get(struct fs_meta *m, MDB_txn *txn, uint64_t ino, const char *name, void *buf,
		   size_t size, size_t *len)
{
	unsigned char kb[KEY_MAX];
	MDB_val k, v;
	int ret = name_key(kb, ino, name, &k);

	if (ret)
		return ret == -ENAMETOOLONG ? -ERANGE : ret;
	ret = mdb_err(mdb_get(txn, m->xattr, &k, &v));
	if (ret)
		return ret == -ENOENT ? -ENODATA : ret;
	*len = v.mv_size;
	if (size == 0)
		return 0;
	if (size < v.mv_size)
		return -ERANGE;
	memcpy(buf, v.mv_data, v.mv_size);
	return 0;
}

int meta_xattr_set(struct fs_meta *m, MDB_txn *txn, uint64_t ino, const char *name, const void *val,
		   size_t len, int flags)
{
	unsigned char kb[KEY_MAX];
	MDB_val k, v = {len, (void *)val}, old;
	int ret = name_key(kb, ino, name, &k);

	if (ret)
		return ret == -ENAMETOOLONG ? -ERANGE : ret;
	ret = mdb_get(txn, m->xattr, &k, &old);
	if ((flags & XATTR_CREATE) && ret == 0)
		return -EEXIST;
	if ((flags & XATTR_REPLACE) && ret == MDB_NOTFOUND)
		return -ENODATA;
	return mdb_err(mdb_put(txn, m->xattr, &k, &v, 0));
}

int meta_xattr_list(struct fs_meta *m, MDB_txn *txn, uint64_t ino, char *buf, size_t size,
		    size_t *len)
{
	unsigned char kb[8];
	MDB_cursor *c;
	MDB_val k = {8, kb}, v;
	size_t total = 0;
	int rc, ret = 0;

	put_be64(kb, ino);
	rc = mdb_cursor_open(txn, m->xattr, &c);
	if (rc)
		return mdb_err(rc);
	rc = mdb_cursor_get(c, &k, &v, MDB_SET_RANGE);
	while (rc == 0 && k.mv_size > 8 && get_be64(k.mv_data) == ino) {
		size_t n = k.mv_size - 8;

		if (size) {
			if (total + n + 1 > size) {
				ret = -ERANGE;
				break;
			}
			memcpy(buf + total, (char *)k.mv_data + 8, n);
			buf[total + n] = 0;
		}
		total += n + 1;
		rc = mdb_cursor_get(c, &k, &v, MDB_NEXT);
	}
	mdb_cursor_close(c);
	*len = total;
	if (ret)
		return ret;
	return (rc == 0 || rc == MDB_NOTFOUND) ? 0 : mdb_err(rc);
}

int meta_xattr_del(struct fs_meta *m, MDB_txn *txn, uint64_t ino, const char *name)
{
	unsigned char kb[KEY_MAX];
	MDB_val k;
	int ret = name_key(kb, ino, name, &k);

	if (ret)
		return ret == -ENAMETOOLONG ? -ERANGE : ret;
	ret = mdb_err(mdb_del(txn, m->xattr, &k, NULL));
	return ret == -ENOENT ? -ENODATA : ret;
}

int meta_symlink_get(struct fs_meta *m, MDB_txn *txn, uint64_t ino, char *buf, size_t size)
{
	MDB_val v;
	int ret = id_get(txn, m->symlink, ino, &v);

	if (ret)
		return ret == -ENOENT ? -EIO : ret;
	if (v.mv_size >= size)
		return -ENAMETOOLONG;
	memcpy(buf, v.mv_data, v.mv_size);
	buf[v.mv_size] = 0;
	return 0;
}

int meta_symlink_put(struct fs_meta *m, MDB_txn *txn, uint64_t ino, const char *target)
{
	return id_put(txn, m->symlink, ino, target, strlen(target));
}

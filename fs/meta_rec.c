/*
 * meta_rec.c - raw records, for the offline checker, and stored values decoded.
 *
 * The checker (fs/fsck.c) walks each table as records whose fields are
 * decoded from key and value, and deletes or rewrites one as it is; every
 * stored value read anywhere is decoded here, with its size checked.
 */
#include "meta_int.h"

#include <errno.h>
#include <string.h>

/* ---- raw records, for the offline checker ---- */

static MDB_dbi table_dbi(struct fs_meta *m, enum meta_table t)
{
	switch (t) {
	case META_TAB_INODE:
		return m->inode;
	case META_TAB_DIRENT:
		return m->dirent;
	case META_TAB_DIRCOOK:
		return m->dircook;
	case META_TAB_BMAP:
		return m->bmap;
	case META_TAB_BLOCK:
		return m->block;
	case META_TAB_DEDUP:
		return m->dedup;
	case META_TAB_XATTR:
		return m->xattr;
	case META_TAB_SYMLINK:
		return m->symlink;
	case META_TAB_NBLOCKS:
		return m->nblocks;
	}
	return m->info;
}

/* Decode one record; sizes that no version of this file writes mark it malformed. */
static void rec_decode(enum meta_table t, const MDB_val *k, const MDB_val *v, struct meta_rec *r)
{
	const unsigned char *kb = k->mv_data;
	struct dirent_val dv;

	memset(r, 0, sizeof(*r));
	r->key = k->mv_data;
	r->keylen = k->mv_size;
	if (k->mv_size >= 8)
		r->ino = get_be64(kb);
	switch (t) {
	case META_TAB_INODE:
		r->malformed = k->mv_size != 8 || v->mv_size != sizeof(r->inode);
		if (v->mv_size == sizeof(r->inode))
			memcpy(&r->inode, v->mv_data, sizeof(r->inode));
		break;
	case META_TAB_DIRENT:
	case META_TAB_XATTR:
		r->malformed = k->mv_size <= 8 || k->mv_size > 8 + 255;
		if (k->mv_size > 8) {
			r->name = (const char *)kb + 8;
			r->namelen = k->mv_size - 8;
		}
		if (t == META_TAB_XATTR)
			break;
		r->malformed |= v->mv_size != sizeof(dv);
		if (v->mv_size == sizeof(dv)) {
			memcpy(&dv, v->mv_data, sizeof(dv));
			r->id = dv.ino;
			r->idx = dv.cookie;
		}
		break;
	case META_TAB_DIRCOOK:
		r->malformed = k->mv_size != 16 || v->mv_size == 0 || v->mv_size > 255;
		if (k->mv_size >= 16)
			r->idx = get_be64(kb + 8);
		r->name = v->mv_data;
		r->namelen = v->mv_size;
		break;
	case META_TAB_BMAP:
		r->malformed = k->mv_size != 16 || v->mv_size != sizeof(r->id);
		if (k->mv_size >= 16)
			r->idx = get_be64(kb + 8);
		if (v->mv_size == sizeof(r->id))
			memcpy(&r->id, v->mv_data, sizeof(r->id));
		break;
	case META_TAB_BLOCK:
		/* Records written before blocks carried a hash end after flags; a length, after it.
		 */
		r->malformed = k->mv_size != 8 || v->mv_size < offsetof(struct meta_block, hash) ||
			       v->mv_size > sizeof(r->block);
		r->id = r->ino;
		r->ino = 0;
		memcpy(&r->block, v->mv_data,
		       v->mv_size < sizeof(r->block) ? v->mv_size : sizeof(r->block));
		break;
	case META_TAB_DEDUP:
		r->malformed = k->mv_size != META_HASH_LEN || v->mv_size != sizeof(r->id);
		r->ino = 0;
		r->hash = kb;
		if (v->mv_size == sizeof(r->id))
			memcpy(&r->id, v->mv_data, sizeof(r->id));
		break;
	case META_TAB_SYMLINK:
		r->malformed = k->mv_size != 8;
		r->name = v->mv_data;
		r->namelen = v->mv_size;
		break;
	case META_TAB_NBLOCKS:
		r->malformed = k->mv_size != 8 || v->mv_size != sizeof(r->idx);
		if (v->mv_size == sizeof(r->idx))
			memcpy(&r->idx, v->mv_data, sizeof(r->idx));
		break;
	}
}

int meta_walk(struct fs_meta *m, MDB_txn *txn, enum meta_table t, meta_walk_fn fn, void *arg)
{
	MDB_cursor *c;
	MDB_val k, v;
	int rc, ret = 0;

	rc = mdb_cursor_open(txn, table_dbi(m, t), &c);
	if (rc)
		return mdb_err(rc);
	meta_guard_hold(c); /* fsck reads every page through it: see metaguard.h */
	rc = mdb_cursor_get(c, &k, &v, MDB_FIRST);
	while (rc == 0) {
		struct meta_rec r;

		rec_decode(t, &k, &v, &r);
		ret = fn(arg, &r);
		if (ret)
			break;
		rc = mdb_cursor_get(c, &k, &v, MDB_NEXT);
	}
	meta_guard_release(c);
	mdb_cursor_close(c);
	if (ret)
		return ret;
	return rc == MDB_NOTFOUND ? 0 : mdb_err(rc);
}

/* The key of r in table t, from its fields. */
static int rec_key(enum meta_table t, const struct meta_rec *r, unsigned char *kb, MDB_val *k)
{
	switch (t) {
	case META_TAB_INODE:
	case META_TAB_SYMLINK:
	case META_TAB_NBLOCKS:
	case META_TAB_BLOCK:
		put_be64(kb, t == META_TAB_BLOCK ? r->id : r->ino);
		k->mv_size = 8;
		break;
	case META_TAB_DIRENT:
	case META_TAB_XATTR:
		if (r->namelen == 0 || r->namelen > 255)
			return -EINVAL;
		put_be64(kb, r->ino);
		memcpy(kb + 8, r->name, r->namelen);
		k->mv_size = 8 + r->namelen;
		break;
	case META_TAB_DIRCOOK:
	case META_TAB_BMAP:
		put_be64(kb, r->ino);
		put_be64(kb + 8, r->idx);
		k->mv_size = 16;
		break;
	case META_TAB_DEDUP:
		memcpy(kb, r->hash, META_HASH_LEN);
		k->mv_size = META_HASH_LEN;
		break;
	}
	k->mv_data = kb;
	return 0;
}

int meta_rec_del(struct fs_meta *m, MDB_txn *txn, enum meta_table t, const struct meta_rec *r)
{
	unsigned char kb[KEY_MAX];
	MDB_val k = {r->keylen, (void *)r->key};
	int ret = 0;

	if (!r->key)
		ret = rec_key(t, r, kb, &k);
	if (ret)
		return ret;
	return mdb_err(mdb_del(txn, table_dbi(m, t), &k, NULL));
}

int meta_rec_put(struct fs_meta *m, MDB_txn *txn, enum meta_table t, const struct meta_rec *r)
{
	unsigned char kb[16];
	MDB_val k = {16, kb}, v = {sizeof(r->id), (void *)&r->id};

	switch (t) {
	case META_TAB_INODE:
		return meta_inode_put(m, txn, r->ino, &r->inode);
	case META_TAB_BLOCK:
		return meta_block_put(m, txn, r->id, &r->block);
	case META_TAB_BMAP:
		bmap_key(kb, r->ino, r->idx);
		return mdb_err(mdb_put(txn, m->bmap, &k, &v, 0));
	case META_TAB_NBLOCKS:
		put_be64(kb, r->ino);
		k.mv_size = 8;
		v.mv_data = (void *)&r->idx;
		return mdb_err(mdb_put(txn, m->nblocks, &k, &v, 0));
	default:
		return -EINVAL;
	}
}

/* ---- stored values, decoded with their sizes checked ---- */

int meta_decode_inode(const void *v, size_t len, struct meta_inode *rec)
{
	if (len != sizeof(*rec))
		return -EIO;
	memcpy(rec, v, sizeof(*rec));
	return 0;
}

int meta_decode_dirent(const void *v, size_t len, uint64_t *ino, uint64_t *cookie)
{
	struct dirent_val dv;

	if (len != sizeof(dv))
		return -EIO;
	memcpy(&dv, v, sizeof(dv));
	*ino = dv.ino;
	*cookie = dv.cookie;
	return 0;
}

int meta_decode_id(const void *v, size_t len, uint64_t *id)
{
	if (len != sizeof(*id))
		return -EIO;
	memcpy(id, v, sizeof(*id));
	return 0;
}

int meta_decode_block(const void *v, size_t len, struct meta_block *b)
{
	/* Records written before blocks carried a hash end after flags; a length, after it. */
	if (len < offsetof(struct meta_block, hash) || len > sizeof(*b))
		return -EIO;
	memset(b, 0, sizeof(*b));
	memcpy(b, v, len);
	return 0;
}

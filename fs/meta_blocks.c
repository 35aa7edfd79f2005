/*
 * meta_blocks.c - block maps, block records and their reference counts.
 *
 * A block record is created by the write-back that wrote it, referenced by
 * one or more block-map entries (copy_file_range shares them), and removed
 * when its last reference goes; its location is then handed back to the
 * caller, who releases it to the block store once the transaction commits.
 * The dedup index finds a block by the hash of its bytes. The scans at
 * mount (blocks, flagged inodes, orphans, counts and space) are here too.
 */
#include "meta_int.h"

#include "tb.h"
#include "u64vec.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int meta_locvec_push(struct locvec *v, uint64_t loc)
{
	return u64vec_push(&v->v, &v->n, &v->cap, 16, loc);
}

void meta_locvec_free(struct locvec *v)
{
	free(v->v);
	v->v = NULL;
	v->n = v->cap = 0;
}

/* ---- block maps and blocks ---- */

int meta_inode_blocks(struct fs_meta *m, MDB_txn *txn, uint64_t ino, uint64_t *n)
{
	MDB_val v;
	int ret;

	*n = 0;
	ret = id_get(txn, m->nblocks, ino, &v);
	if (ret)
		return ret == -ENOENT ? 0 : ret;
	return meta_decode_id(v.mv_data, v.mv_size, n);
}

/* ino's block map gained (delta > 0) or lost mappings: keep its count. */
static int blocks_add(struct fs_meta *m, MDB_txn *txn, uint64_t ino, int64_t delta)
{
	unsigned char kb[8];
	MDB_val k = {8, kb}, v;
	uint64_t n;
	int ret;

	if (delta == 0)
		return 0;
	ret = meta_inode_blocks(m, txn, ino, &n);
	if (ret)
		return ret;
	/* A count below what is removed is damage; fsck puts it right. */
	n = delta < 0 && n < (uint64_t)-delta ? 0 : n + (uint64_t)delta;
	put_be64(kb, ino);
	if (n == 0) {
		ret = mdb_err(mdb_del(txn, m->nblocks, &k, NULL));
		return ret == -ENOENT ? 0 : ret;
	}
	v.mv_size = sizeof(n);
	v.mv_data = &n;
	return mdb_err(mdb_put(txn, m->nblocks, &k, &v, 0));
}

int meta_bmap_get(struct fs_meta *m, MDB_txn *txn, uint64_t ino, uint64_t idx, uint64_t *id)
{
	unsigned char kb[16];
	MDB_val k = {16, kb}, v;
	int ret;

	bmap_key(kb, ino, idx);
	ret = mdb_err(mdb_get(txn, m->bmap, &k, &v));
	if (ret)
		return ret;
	return meta_decode_id(v.mv_data, v.mv_size, id);
}

int meta_block_get(struct fs_meta *m, MDB_txn *txn, uint64_t id, struct meta_block *b)
{
	MDB_val v;
	int ret = id_get(txn, m->block, id, &v);

	if (ret)
		return ret == -ENOENT ? -EIO : ret;
	return meta_decode_block(v.mv_data, v.mv_size, b);
}

int meta_block_put(struct fs_meta *m, MDB_txn *txn, uint64_t id, const struct meta_block *b)
{
	return id_put(txn, m->block, id, b, sizeof(*b));
}

/* Drop the index entry of hash if it names block id. */
static int dedup_forget(struct fs_meta *m, MDB_txn *txn, const uint8_t *hash, uint64_t id)
{
	MDB_val k = {META_HASH_LEN, (void *)hash}, v;
	uint64_t have;
	int ret = mdb_err(mdb_get(txn, m->dedup, &k, &v));

	if (ret == -ENOENT)
		return 0;
	if (!ret)
		ret = meta_decode_id(v.mv_data, v.mv_size, &have);
	if (ret)
		return ret;
	if (have != id)
		return 0;
	ret = mdb_err(mdb_del(txn, m->dedup, &k, NULL));
	return ret == -ENOENT ? 0 : ret;
}

int meta_dedup_find(struct fs_meta *m, MDB_txn *txn, const uint8_t *hash, uint64_t *id,
		    struct meta_block *b)
{
	MDB_val k = {META_HASH_LEN, (void *)hash}, v;
	int ret = mdb_err(mdb_get(txn, m->dedup, &k, &v));

	if (!ret)
		ret = meta_decode_id(v.mv_data, v.mv_size, id);
	if (ret)
		return ret;
	ret = meta_block_get(m, txn, *id, b);
	return ret == -EIO ? -ENOENT : ret;
}

static int block_ref(struct fs_meta *m, MDB_txn *txn, uint64_t id, int delta, struct locvec *freed)
{
	struct meta_block b;
	unsigned char kb[8];
	MDB_val k = {8, kb};
	int ret = meta_block_get(m, txn, id, &b);

	if (ret)
		return ret;
	if (delta < 0 && b.refs <= (uint32_t)-delta) {
		put_be64(kb, id);
		ret = mdb_err(mdb_del(txn, m->block, &k, NULL));
		if (!ret && (b.flags & META_BLOCK_HASHED))
			ret = dedup_forget(m, txn, b.hash, id);
		if (!ret)
			ret = meta_locvec_push(freed, b.loc);
		return ret;
	}
	b.refs = (uint32_t)((int64_t)b.refs + delta);
	return meta_block_put(m, txn, id, &b);
}

/* Drop the reference the mapping (ino, idx) holds: 1 if it had one, 0 if a hole. */
static int unref_mapping(struct fs_meta *m, MDB_txn *txn, uint64_t ino, uint64_t idx,
			 struct locvec *freed)
{
	uint64_t old;
	int ret = meta_bmap_get(m, txn, ino, idx, &old);

	if (ret == -ENOENT)
		return 0;
	if (!ret)
		ret = block_ref(m, txn, old, -1, freed);
	return ret ? ret : 1;
}

int meta_bmap_store(struct fs_meta *m, MDB_txn *txn, uint64_t ino, uint64_t idx, uint64_t loc,
		    uint64_t len, const uint8_t *hash, bool index, struct locvec *freed)
{
	unsigned char kb[16];
	MDB_val k = {16, kb}, v;
	uint64_t id;
	int ret, had;

	had = unref_mapping(m, txn, ino, idx, freed);
	if (had < 0)
		return had;
	bmap_key(kb, ino, idx);
	if (loc == TB_LOC_NONE) {
		ret = mdb_err(mdb_del(txn, m->bmap, &k, NULL));
		if (ret && ret != -ENOENT)
			return ret;
		return blocks_add(m, txn, ino, -had);
	}
	ret = blocks_add(m, txn, ino, !had);
	if (ret)
		return ret;
	id = __atomic_fetch_add(&m->next_block, 1, __ATOMIC_RELAXED);
	struct meta_block b = {.loc = loc, .refs = 1, .len = len};
	if (hash) {
		b.flags |= META_BLOCK_HASHED;
		memcpy(b.hash, hash, META_HASH_LEN);
	}
	ret = meta_block_put(m, txn, id, &b);
	if (ret)
		return ret;
	if (hash && index) {
		/* The newest block with this content is the one others share. */
		MDB_val hk = {META_HASH_LEN, (void *)hash}, hv = {sizeof(id), &id};

		ret = mdb_err(mdb_put(txn, m->dedup, &hk, &hv, 0));
		if (ret)
			return ret;
	}
	v.mv_size = sizeof(id);
	v.mv_data = &id;
	return mdb_err(mdb_put(txn, m->bmap, &k, &v, 0));
}

int meta_bmap_share_block(struct fs_meta *m, MDB_txn *txn, uint64_t ino, uint64_t idx, uint64_t id,
			  const uint8_t *hash, struct locvec *freed)
{
	unsigned char kb[16];
	MDB_val k = {16, kb}, v = {sizeof(id), &id};
	struct meta_block b;
	int ret;

	ret = meta_block_get(m, txn, id, &b);
	if (ret == -EIO || (ret == 0 && (!(b.flags & META_BLOCK_HASHED) ||
					 memcmp(b.hash, hash, META_HASH_LEN) != 0)))
		return -ESTALE;
	if (ret)
		return ret;
	/* Take the new reference before dropping the old: they may be one block. */
	ret = block_ref(m, txn, id, 1, freed);
	if (!ret)
		ret = unref_mapping(m, txn, ino, idx, freed);
	if (ret == 0)
		ret = blocks_add(m, txn, ino, 1);
	else if (ret == 1)
		ret = 0;
	if (ret)
		return ret;
	bmap_key(kb, ino, idx);
	return mdb_err(mdb_put(txn, m->bmap, &k, &v, 0));
}

/*
 * A cursor *c on ino's block map, at its first index from or after: that
 * entry in k and v (k's bytes in kb, 16 of them), and LMDB's code for it in
 * *rc (MDB_NOTFOUND: none). 0, or -errno where no cursor could be opened.
 */
static int bmap_open(struct fs_meta *m, MDB_txn *txn, uint64_t ino, uint64_t from,
		     unsigned char *kb, MDB_cursor **c, MDB_val *k, MDB_val *v, int *rc)
{
	bmap_key(kb, ino, from);
	*rc = mdb_cursor_open(txn, m->bmap, c);
	if (*rc)
		return mdb_err(*rc);
	*rc = mdb_cursor_get(*c, k, v, MDB_SET_RANGE);
	return 0;
}

/* The block map key k is ino's, at an index below to. */
static bool bmap_in(const MDB_val *k, uint64_t ino, uint64_t to)
{
	return k->mv_size == 16 && get_be64(k->mv_data) == ino &&
	       get_be64((unsigned char *)k->mv_data + 8) < to;
}

int meta_bmap_clear(struct fs_meta *m, MDB_txn *txn, uint64_t ino, uint64_t from, uint64_t to,
		    struct locvec *freed)
{
	unsigned char kb[16];
	MDB_cursor *c;
	MDB_val k = {16, kb}, v;
	int64_t dropped = 0;
	int rc, ret = 0;

	ret = bmap_open(m, txn, ino, from, kb, &c, &k, &v, &rc);
	if (ret)
		return ret;
	while (rc == 0 && bmap_in(&k, ino, to)) {
		uint64_t id;

		ret = meta_decode_id(v.mv_data, v.mv_size, &id);
		if (!ret)
			ret = block_ref(m, txn, id, -1, freed);
		if (ret)
			break;
		rc = mdb_cursor_del(c, 0);
		if (rc)
			break;
		dropped++;
		rc = mdb_cursor_get(c, &k, &v, MDB_GET_CURRENT);
		if (rc == EINVAL || rc == MDB_NOTFOUND) {
			/* deleting the last item leaves the cursor past the end */
			bmap_key(kb, ino, from);
			k.mv_size = 16;
			k.mv_data = kb;
			rc = mdb_cursor_get(c, &k, &v, MDB_SET_RANGE);
		}
	}
	mdb_cursor_close(c);
	if (ret)
		return ret;
	if (rc != 0 && rc != MDB_NOTFOUND)
		return mdb_err(rc);
	return blocks_add(m, txn, ino, -dropped);
}

/*
 * Drop dst's mappings in the range, then map each block src stores there:
 * the cost follows the blocks the two ranges store, not the range's length.
 * Clearing first is safe even within one file: the ranges do not overlap,
 * so every block src maps keeps src's reference while dst's go.
 */
int meta_bmap_share(struct fs_meta *m, MDB_txn *txn, uint64_t src, uint64_t sidx, uint64_t dst,
		    uint64_t didx, uint64_t n, struct locvec *freed)
{
	unsigned char kb[16];
	MDB_val k = {16, kb}, v;
	uint64_t idx, id;
	int ret;

	if (n == 0)
		return 0;
	ret = meta_bmap_clear(m, txn, dst, didx, didx + n, freed);
	for (uint64_t from = sidx; ret == 0; from = idx + 1) {
		ret = meta_bmap_next(m, txn, src, from, sidx + n, &idx, &id);
		if (ret == -ENOENT)
			return 0;
		if (!ret)
			ret = block_ref(m, txn, id, 1, freed);
		if (ret)
			break;
		bmap_key(kb, dst, didx + (idx - sidx));
		v.mv_size = sizeof(id);
		v.mv_data = &id;
		ret = mdb_err(mdb_put(txn, m->bmap, &k, &v, 0));
		if (!ret)
			ret = blocks_add(m, txn, dst, 1); /* the range was cleared: each is new */
	}
	return ret;
}

/* Position c at the first mapping of ino in [from, to): 0 with *idx and *id, or -ENOENT. */
static int bmap_seek(MDB_cursor *c, uint64_t ino, uint64_t from, uint64_t to, MDB_cursor_op op,
		     uint64_t *idx, uint64_t *id)
{
	unsigned char kb[16];
	MDB_val k = {16, kb}, v;
	int rc;

	bmap_key(kb, ino, from);
	rc = mdb_cursor_get(c, &k, &v, op);
	if (rc)
		return mdb_err(rc);
	if (k.mv_size != 16 || get_be64(k.mv_data) != ino)
		return -ENOENT;
	*idx = get_be64((unsigned char *)k.mv_data + 8);
	if (*idx < from || *idx >= to)
		return -ENOENT;
	return meta_decode_id(v.mv_data, v.mv_size, id);
}

int meta_bmap_next(struct fs_meta *m, MDB_txn *txn, uint64_t ino, uint64_t from, uint64_t to,
		   uint64_t *idx, uint64_t *id)
{
	MDB_cursor *c;
	int ret;

	if (from >= to)
		return -ENOENT;
	ret = mdb_err(mdb_cursor_open(txn, m->bmap, &c));
	if (ret)
		return ret;
	ret = bmap_seek(c, ino, from, to, MDB_SET_RANGE, idx, id);
	mdb_cursor_close(c);
	return ret;
}

int meta_bmap_walk(struct fs_meta *m, MDB_txn *txn, uint64_t ino, uint64_t from, uint64_t to,
		   meta_bmap_fn fn, void *arg)
{
	MDB_cursor *c;
	uint64_t idx, id;
	int ret;

	if (from >= to)
		return 0;
	ret = mdb_err(mdb_cursor_open(txn, m->bmap, &c));
	if (ret)
		return ret;
	ret = bmap_seek(c, ino, from, to, MDB_SET_RANGE, &idx, &id);
	while (ret == 0) {
		ret = fn(arg, idx, id);
		if (ret)
			break;
		/* MDB_NEXT ignores the key: from only bounds the range here. */
		ret = bmap_seek(c, ino, from, to, MDB_NEXT, &idx, &id);
	}
	mdb_cursor_close(c);
	return ret == -ENOENT ? 0 : ret;
}

struct idx_list {
	uint64_t *idx;
	unsigned n, max;
};

static int idx_add(void *arg, uint64_t idx, uint64_t id)
{
	struct idx_list *l = arg;

	(void)id;
	l->idx[l->n++] = idx;
	return l->n == l->max;
}

int meta_bmap_list(struct fs_meta *m, uint64_t ino, uint64_t from, uint64_t to, uint64_t *idx,
		   unsigned max, unsigned *n)
{
	struct idx_list l = {idx, 0, max};
	MDB_txn *txn;
	int ret;

	*n = 0;
	if (max == 0)
		return 0;
	ret = meta_begin(m, false, &txn);
	if (ret)
		return ret;
	ret = meta_bmap_walk(m, txn, ino, from, to, idx_add, &l);
	meta_abort(txn);
	*n = l.n;
	return ret < 0 ? ret : 0;
}

int meta_bmap_count(struct fs_meta *m, MDB_txn *txn, uint64_t ino, uint64_t from, uint64_t to,
		    uint64_t *count)
{
	unsigned char kb[16];
	MDB_cursor *c;
	MDB_val k = {16, kb}, v;
	int rc, ret;

	*count = 0;
	ret = bmap_open(m, txn, ino, from, kb, &c, &k, &v, &rc);
	if (ret)
		return ret;
	while (rc == 0 && bmap_in(&k, ino, to)) {
		(*count)++;
		rc = mdb_cursor_get(c, &k, &v, MDB_NEXT);
	}
	mdb_cursor_close(c);
	return (rc == 0 || rc == MDB_NOTFOUND) ? 0 : mdb_err(rc);
}

/* ---- scans at mount ---- */

/* A transaction begun with flags in *txn, and a cursor on dbi in it in *c. 0 or -errno. */
static int txn_cursor(struct fs_meta *m, unsigned flags, MDB_dbi dbi, MDB_txn **txn, MDB_cursor **c)
{
	int rc = mdb_txn_begin(m->env, NULL, flags, txn);

	if (rc)
		return mdb_err(rc);
	rc = mdb_cursor_open(*txn, dbi, c);
	if (rc) {
		mdb_txn_abort(*txn);
		return mdb_err(rc);
	}
	return 0;
}

int meta_foreach_block(struct fs_meta *m,
		       int (*fn)(void *arg, uint64_t id, const struct meta_block *b), void *arg)
{
	MDB_txn *txn;
	MDB_cursor *c;
	MDB_val k, v;
	int rc, ret = 0;

	ret = txn_cursor(m, MDB_RDONLY, m->block, &txn, &c);
	if (ret)
		return ret;
	/* The mount's scan is guarded: see metaguard.h. */
	meta_guard_hold(txn);
	meta_guard_hold(c);
	rc = mdb_cursor_get(c, &k, &v, MDB_FIRST);
	while (rc == 0) {
		struct meta_block b;

		ret = k.mv_size == 8 ? meta_decode_block(v.mv_data, v.mv_size, &b) : -EIO;
		if (!ret)
			ret = fn(arg, get_be64(k.mv_data), &b);
		if (ret)
			break;
		rc = mdb_cursor_get(c, &k, &v, MDB_NEXT);
	}
	meta_guard_release(c);
	meta_guard_release(txn);
	mdb_cursor_close(c);
	mdb_txn_abort(txn);
	if (ret)
		return ret;
	return rc == MDB_NOTFOUND ? 0 : mdb_err(rc);
}

int meta_blocks_list(struct fs_meta *m, MDB_txn *txn, uint64_t from, uint64_t *ids,
		     struct meta_block *b, unsigned max, unsigned *n)
{
	unsigned char kb[8];
	MDB_val k = {8, kb}, v;
	MDB_cursor *c;
	int rc, ret;

	*n = 0;
	ret = mdb_err(mdb_cursor_open(txn, m->block, &c));
	if (ret)
		return ret;
	put_be64(kb, from);
	rc = mdb_cursor_get(c, &k, &v, MDB_SET_RANGE);
	while (rc == 0 && *n < max) {
		/* A malformed record is fsck's to report: passed over here. */
		if (k.mv_size == 8 && meta_decode_block(v.mv_data, v.mv_size, &b[*n]) == 0)
			ids[(*n)++] = get_be64(k.mv_data);
		rc = mdb_cursor_get(c, &k, &v, MDB_NEXT);
	}
	mdb_cursor_close(c);
	return rc == 0 || rc == MDB_NOTFOUND ? 0 : mdb_err(rc);
}

int meta_inodes_flagged(struct fs_meta *m, MDB_txn *txn, uint32_t flags, meta_inode_fn fn,
			void *arg)
{
	MDB_cursor *c;
	MDB_val k, v;
	int rc, ret = 0;

	rc = mdb_cursor_open(txn, m->inode, &c);
	if (rc)
		return mdb_err(rc);
	for (rc = mdb_cursor_get(c, &k, &v, MDB_FIRST); rc == 0;
	     rc = mdb_cursor_get(c, &k, &v, MDB_NEXT)) {
		struct meta_inode rec;

		/* A damaged record is fsck's to report. */
		if (k.mv_size != 8 || meta_decode_inode(v.mv_data, v.mv_size, &rec) != 0 ||
		    !(rec.flags & flags))
			continue;
		ret = fn(arg, get_be64(k.mv_data), &rec);
		if (ret)
			break;
	}
	mdb_cursor_close(c);
	if (ret)
		return ret;
	return rc == MDB_NOTFOUND ? 0 : mdb_err(rc);
}

int meta_purge_orphans(struct fs_meta *m, struct locvec *freed, uint64_t *count)
{
	MDB_txn *txn;
	MDB_cursor *c;
	MDB_val k, v;
	uint64_t *orphans = NULL;
	size_t n = 0, cap = 0;
	int rc, ret = 0;

	*count = 0;
	ret = txn_cursor(m, 0, m->inode, &txn, &c);
	if (ret)
		return ret;
	rc = mdb_cursor_get(c, &k, &v, MDB_FIRST);
	while (rc == 0) {
		struct meta_inode rec;

		/* A damaged record is fsck's to report, not ours to purge. */
		if (k.mv_size == 8 && meta_decode_inode(v.mv_data, v.mv_size, &rec) == 0 &&
		    rec.nlink == 0) {
			if (n == cap) {
				cap = cap ? cap * 2 : 16;
				/* The purge is guarded: its buffer is held (metaguard.h). */
				meta_guard_release(orphans);
				uint64_t *p = realloc(orphans, cap * sizeof(*p));
				if (!p) {
					meta_guard_hold(orphans);
					ret = -ENOMEM;
					break;
				}
				meta_guard_hold(p);
				orphans = p;
			}
			orphans[n++] = get_be64(k.mv_data);
		}
		rc = mdb_cursor_get(c, &k, &v, MDB_NEXT);
	}
	mdb_cursor_close(c);
	for (size_t i = 0; i < n && !ret; i++)
		ret = meta_inode_purge(m, txn, orphans[i], freed);
	meta_guard_release(orphans);
	free(orphans);
	if (ret) {
		mdb_txn_abort(txn);
		return ret;
	}
	*count = n;
	return meta_commit(txn);
}

void meta_counts(struct fs_meta *m, uint64_t *inodes, uint64_t *blocks, uint64_t *mapped)
{
	MDB_txn *txn;
	MDB_stat st;

	*inodes = *blocks = *mapped = 0;
	if (mdb_txn_begin(m->env, NULL, MDB_RDONLY, &txn))
		return;
	if (mdb_stat(txn, m->inode, &st) == 0)
		*inodes = st.ms_entries;
	if (mdb_stat(txn, m->block, &st) == 0)
		*blocks = st.ms_entries;
	if (mdb_stat(txn, m->bmap, &st) == 0)
		*mapped = st.ms_entries;
	mdb_txn_abort(txn);
}

/* Pages of one tree: branches, leaves and overflow pages. */
static uint64_t tree_pages(const MDB_stat *st)
{
	return st->ms_branch_pages + st->ms_leaf_pages + st->ms_overflow_pages;
}

/*
 * The store's size, from outside LMDB (the file) and inside it: its pages
 * up to the highest in use, the trees' pages (the live metadata), and the
 * pages on LMDB's free list (each free-list record is a list of page
 * numbers led by its count), reused once no reader needs them.
 */
void meta_space(struct fs_meta *m, struct meta_space *sp)
{
	MDB_dbi dbis[] = {m->inode, m->dirent,	m->dircook, m->bmap,  m->block,
			  m->xattr, m->symlink, m->info,    m->dedup, m->nblocks};
	MDB_envinfo info;
	MDB_cursor *c;
	MDB_txn *txn;
	MDB_stat st;
	MDB_val k, v;
	struct stat fst;
	uint64_t psize = m->psize, pages = 0, free_pages = 0;

	memset(sp, 0, sizeof(*sp));
	if (fstat(m->data_fd, &fst) == 0) {
		sp->file_bytes = (uint64_t)fst.st_size;
		sp->disk_bytes = (uint64_t)fst.st_blocks * 512;
	}
	if (mdb_env_info(m->env, &info) == 0)
		sp->used_bytes = ((uint64_t)info.me_last_pgno + 1) * psize;
	if (mdb_txn_begin(m->env, NULL, MDB_RDONLY, &txn))
		return;
	if (mdb_stat(txn, MAIN_DBI_ID, &st) == 0)
		pages += tree_pages(&st);
	for (size_t i = 0; i < sizeof(dbis) / sizeof(dbis[0]); i++)
		if (mdb_stat(txn, dbis[i], &st) == 0)
			pages += tree_pages(&st);
	if (mdb_cursor_open(txn, FREE_DBI_ID, &c) == 0) {
		while (mdb_cursor_get(c, &k, &v, MDB_NEXT) == 0)
			if (v.mv_size >= sizeof(size_t))
				free_pages += *(const size_t *)v.mv_data;
		mdb_cursor_close(c);
	}
	mdb_txn_abort(txn);
	sp->tree_bytes = pages * psize;
	sp->free_bytes = free_pages * psize;
}

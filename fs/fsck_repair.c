/*
 * fsck_repair.c - the repair of the offline checker: the fates the checks
 * decided (drop, relink, rewrite a count) written in the pass's write
 * transaction, all or nothing, so that a crash during repair leaves the
 * store as it was.
 *
 * Calls meta.c's record calls and the lookups of fsck_load.c.
 */
#include "fsck_int.h"

#include <errno.h>
#include <string.h>

/* ---- repair ---- */

int fsck_apply(struct fsck *f, MDB_txn *txn)
{
	struct ck_bad *bad = f->bad.v;
	struct ck_inode *in = f->inodes.v;
	struct ck_name *n = f->names.v;
	struct ck_listing *l = f->listings.v;
	struct ck_map *mp = f->maps.v;
	struct ck_block *b = f->blocks.v;
	struct ck_dedup *d = f->dedups.v;
	struct ck_owned *x = f->xattrs.v, *s = f->links.v;
	struct ck_count *cnt = f->counts.v;
	struct meta_rec r;
	int ret = 0;

#define DEL(table)                                                                                 \
	do {                                                                                       \
		ret = meta_rec_del(f->m, txn, (table), &r);                                        \
		if (ret && ret != -ENOENT)                                                         \
			return ret;                                                                \
	} while (0)

	for (size_t i = 0; i < f->bad.n; i++) {
		r = (struct meta_rec){.key = bad[i].key, .keylen = bad[i].keylen};
		DEL(bad[i].t);
	}
	/* Listing entries first: re-adding a name takes a fresh cookie past them. */
	for (size_t i = 0; i < f->listings.n; i++)
		if (l[i].drop) {
			r = (struct meta_rec){.ino = l[i].parent, .idx = l[i].cookie};
			DEL(META_TAB_DIRCOOK);
		}
	for (size_t i = 0; i < f->names.n; i++) {
		if (!n[i].drop && !n[i].relink)
			continue;
		r = (struct meta_rec){
		    .ino = n[i].parent, .name = n[i].name, .namelen = strlen(n[i].name)};
		DEL(META_TAB_DIRENT);
		if (n[i].relink) {
			ret = meta_dirent_add(f->m, txn, n[i].parent, n[i].name, n[i].child);
			if (ret)
				return ret;
		}
	}
	for (size_t i = 0; i < f->inodes.n; i++) {
		r = (struct meta_rec){.ino = in[i].ino, .inode = in[i].rec};
		if (in[i].purge) {
			DEL(META_TAB_INODE);
			continue;
		}
		uint32_t want = fsck_is_dir(&in[i]) ? 2 + in[i].subdirs_after : in[i].names_after;
		if (in[i].reached && in[i].rec.nlink != want) {
			r.inode.nlink = want;
			ret = meta_rec_put(f->m, txn, META_TAB_INODE, &r);
			if (ret)
				return ret;
		}
	}
	for (size_t i = 0; i < f->maps.n; i++) {
		r = (struct meta_rec){.ino = mp[i].ino, .idx = mp[i].idx, .id = mp[i].to};
		if (mp[i].drop)
			DEL(META_TAB_BMAP);
		else if (mp[i].remap && (ret = meta_rec_put(f->m, txn, META_TAB_BMAP, &r)))
			return ret;
	}
	for (size_t i = 0; i < f->blocks.n; i++) {
		r = (struct meta_rec){.id = b[i].id, .block = b[i].b};
		if (b[i].drop || b[i].merged)
			DEL(META_TAB_BLOCK);
		else if (b[i].rewrite && (ret = meta_rec_put(f->m, txn, META_TAB_BLOCK, &r)))
			return ret;
	}
	for (size_t i = 0; i < f->dedups.n; i++)
		if (d[i].drop) {
			r = (struct meta_rec){.hash = d[i].hash};
			DEL(META_TAB_DEDUP);
		}
	for (size_t i = 0; i < f->xattrs.n; i++)
		if (x[i].drop) {
			r = (struct meta_rec){
			    .ino = x[i].ino, .name = x[i].name, .namelen = strlen(x[i].name)};
			DEL(META_TAB_XATTR);
		}
	for (size_t i = 0; i < f->links.n; i++)
		if (s[i].drop) {
			r = (struct meta_rec){.ino = s[i].ino};
			DEL(META_TAB_SYMLINK);
		}
	for (size_t i = 0; i < f->counts.n; i++)
		if (cnt[i].drop) {
			r = (struct meta_rec){.ino = cnt[i].ino};
			DEL(META_TAB_NBLOCKS);
		}
	for (size_t i = 0; i < f->inodes.n; i++) {
		if (!in[i].fix_count)
			continue;
		r = (struct meta_rec){.ino = in[i].ino, .idx = in[i].maps_after};
		if (in[i].maps_after == 0)
			DEL(META_TAB_NBLOCKS);
		else if ((ret = meta_rec_put(f->m, txn, META_TAB_NBLOCKS, &r)))
			return ret;
	}
#undef DEL
	return 0;
}

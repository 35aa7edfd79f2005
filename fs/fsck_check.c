/*
 * fsck_check.c - the checks of the offline checker, in dependency order:
 * malformed records, the names and the tree from the root folder, the
 * listings, the inodes, the block locations, the block maps, the counts,
 * the block records and their reference counts, the dedup index, xattrs
 * and symlink targets. Each problem is reported once, and each record is
 * given its fate (keep, drop, rewrite) for the repair to apply, so that
 * the counts repair writes are those of the store as it will be.
 *
 * Calls fsck_report.c and the lookups of fsck_load.c.
 */
#include "fsck_int.h"
#include "tb.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *const table_names[] = {
    [META_TAB_INODE] = "inode", [META_TAB_DIRENT] = "dirent",	[META_TAB_DIRCOOK] = "dircook",
    [META_TAB_BMAP] = "bmap",	[META_TAB_BLOCK] = "block",	[META_TAB_DEDUP] = "dedup",
    [META_TAB_XATTR] = "xattr", [META_TAB_SYMLINK] = "symlink", [META_TAB_NBLOCKS] = "nblocks",
};

/* ---- the checks, in dependency order ---- */

static void check_malformed(struct fsck *f)
{
	struct ck_bad *b = f->bad.v;

	for (size_t i = 0; i < f->bad.n; i++) {
		char hex[2 * 24 + 4] = "";
		size_t n = b[i].keylen < 24 ? b[i].keylen : 24;

		for (size_t j = 0; j < n; j++)
			sprintf(hex + 2 * j, "%02x", ((unsigned char *)b[i].key)[j]);
		if (n < b[i].keylen)
			strcat(hex, "...");
		fsck_problem(f, "malformed: %s record with key %s has a size this store never writes",
			table_names[b[i].t], hex);
		fsck_repaired(f, "record deleted");
	}
}

/* Which names are valid, and the counts they give their inodes. */
static void classify_names(struct fsck *f)
{
	struct ck_name *n = f->names.v;

	for (size_t i = 0; i < f->names.n; i++) {
		struct ck_inode *p = fsck_find_inode(f, n[i].parent), *c = fsck_find_inode(f, n[i].child);
		struct ck_listing *l = fsck_find_listing(f, n[i].parent, n[i].cookie);

		if (l && strcmp(l->name, n[i].name) == 0) {
			n[i].listed = true;
			l->used = true;
		}
		n[i].valid = fsck_is_dir(p) && c;
		if (!n[i].valid)
			continue;
		c->names_now++;
		if (fsck_is_dir(c))
			p->subdirs_now++;
	}
}

/* Breadth-first from the root: which inodes a path reaches, and by which name. */
static int walk_tree(struct fsck *f)
{
	struct ck_name *n = f->names.v;
	struct ck_inode *root = fsck_find_inode(f, META_ROOT_INO);
	uint64_t *queue;
	size_t head = 0, tail = 0;

	if (!fsck_is_dir(root))
		return 0;
	queue = malloc((f->inodes.n + 1) * sizeof(*queue));
	if (!queue)
		return -ENOMEM;
	root->reached = true;
	queue[tail++] = META_ROOT_INO;
	while (head < tail) {
		uint64_t dir = queue[head++];

		for (size_t i = fsck_first_name(f, dir); i < f->names.n && n[i].parent == dir; i++) {
			struct ck_inode *c;

			if (!n[i].valid)
				continue;
			c = fsck_find_inode(f, n[i].child);
			if (c->reached) {
				/* A folder's second name makes a loop or a DAG. */
				n[i].extra = fsck_is_dir(c);
				continue;
			}
			c->reached = true;
			c->via = i;
			if (fsck_is_dir(c))
				queue[tail++] = c->ino;
		}
	}
	free(queue);
	return 0;
}

static bool has_link(struct fsck *f, uint64_t ino)
{
	struct ck_owned *s = f->links.v;
	size_t lo = 0, hi = f->links.n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (s[mid].ino == ino)
			return true;
		if (s[mid].ino < ino)
			lo = mid + 1;
		else
			hi = mid;
	}
	return false;
}

/* Which inodes repair purges, and which names it keeps. */
static void decide_fates(struct fsck *f)
{
	struct ck_inode *in = f->inodes.v;
	struct ck_name *n = f->names.v;

	for (size_t i = 0; i < f->inodes.n; i++) {
		in[i].no_target = S_ISLNK(in[i].rec.mode) && !has_link(f, in[i].ino);
		in[i].purge = in[i].ino != META_ROOT_INO && (!in[i].reached || in[i].no_target);
	}
	for (size_t i = 0; i < f->names.n; i++) {
		struct ck_inode *p = fsck_find_inode(f, n[i].parent), *c = fsck_find_inode(f, n[i].child);

		n[i].drop = !n[i].valid || n[i].extra || !p->reached || p->purge || c->purge;
		n[i].relink = !n[i].drop && !n[i].listed;
		if (n[i].drop)
			continue;
		c->names_after++;
		if (fsck_is_dir(c))
			p->subdirs_after++;
	}
}

static void report_names(struct fsck *f)
{
	struct ck_name *n = f->names.v;
	char a[4200], b[4200];

	for (size_t i = 0; i < f->names.n; i++) {
		struct ck_inode *p = fsck_find_inode(f, n[i].parent);

		if (!p || !fsck_is_dir(p)) {
			fsck_problem(f,
				"bad-parent: name \"%s\" for inode %" PRIu64 " is in %s, which %s",
				n[i].name, n[i].child, fsck_describe(f, n[i].parent, a, sizeof(a)),
				p ? "is not a folder" : "does not exist");
			fsck_repaired(f, "name removed");
		} else if (!fsck_find_inode(f, n[i].child)) {
			fsck_describe(f, n[i].parent, a, sizeof(a));
			fsck_problem(f,
				"dangling-name: \"%s\" in %s names inode %" PRIu64
				", which does not exist",
				n[i].name, a, n[i].child);
			fsck_repaired(f, "name removed");
		} else if (n[i].extra) {
			fsck_problem(f, "extra-name: folder %s has a second name \"%s\" in %s",
				fsck_describe(f, n[i].child, a, sizeof(a)), n[i].name,
				fsck_describe(f, n[i].parent, b, sizeof(b)));
			fsck_repaired(f, "second name removed");
		} else if (!n[i].listed && !n[i].drop) {
			fsck_describe(f, n[i].parent, a, sizeof(a));
			fsck_problem(f,
				"unlisted-name: \"%s\" in %s is missing from the folder's listing",
				n[i].name, a);
			fsck_repaired(f, "listing entry added");
		}
	}
}

static void report_listings(struct fsck *f)
{
	struct ck_listing *l = f->listings.v;
	char a[4200];

	for (size_t i = 0; i < f->listings.n; i++) {
		if (l[i].used) {
			struct ck_name *n = fsck_find_name(f, l[i].parent, l[i].name);

			/* The name goes, or gets a fresh entry: this one goes either way. */
			l[i].drop = n && (n->drop || n->relink);
			continue;
		}
		l[i].drop = true;
		fsck_problem(f,
			"stale-listing: %s lists \"%s\" (cookie %" PRIu64
			") with no such name in it",
			fsck_describe(f, l[i].parent, a, sizeof(a)), l[i].name, l[i].cookie);
		fsck_repaired(f, "listing entry removed");
	}
}

static void report_inodes(struct fsck *f)
{
	struct ck_inode *in = f->inodes.v;
	struct ck_inode *root = fsck_find_inode(f, META_ROOT_INO);
	char a[4200];

	if (!fsck_is_dir(root)) {
		f->no_root = true;
		fsck_problem(f, "no-root: the root folder (inode %d) %s", META_ROOT_INO,
			root ? "is not a folder" : "does not exist");
		fsck_repaired(f, "not repairable: every file hangs off the root folder");
		return;
	}
	for (size_t i = 0; i < f->inodes.n; i++) {
		struct ck_inode *c = &in[i];

		if (!c->reached && c->names_now == 0 && c->rec.nlink == 0) {
			/* Unlinked while open at a stop: the next mount purges it. */
			fprintf(f->out,
				"note: inode %" PRIu64 " (%s, %" PRIu64
				" bytes) was deleted while open; the next mount frees it\n",
				c->ino, fsck_kind(c), c->rec.size);
			f->notes++;
			fsck_repaired(f, "inode %" PRIu64 " purged", c->ino);
			continue;
		}
		if (!c->reached && c->names_now == 0) {
			fsck_problem(f,
				"orphan: inode %" PRIu64 " (%s, %" PRIu64
				" bytes, nlink %u) has no name",
				c->ino, fsck_kind(c), c->rec.size, c->rec.nlink);
			fsck_repaired(f, "inode %" PRIu64 " purged with its data", c->ino);
			continue;
		}
		if (!c->reached) {
			fsck_problem(f,
				"unreachable: inode %" PRIu64 " (%s) has %u name%s"
				" but no path from the root folder",
				c->ino, fsck_kind(c), c->names_now, c->names_now == 1 ? "" : "s");
			fsck_repaired(f, "inode %" PRIu64 " and its names purged", c->ino);
			continue;
		}
		fsck_describe(f, c->ino, a, sizeof(a));
		if (c->no_target) {
			fsck_problem(f, "no-target: symlink %s has no target", a);
			fsck_repaired(f, "symlink removed");
			continue;
		}
		/* A folder counts "." and its parent's name of it, and each subfolder's "..". */
		bool dir = fsck_is_dir(c);
		uint32_t now = dir ? 2 + c->subdirs_now : c->names_now;
		uint32_t after = dir ? 2 + c->subdirs_after : c->names_after;

		if (c->rec.nlink != now) {
			if (dir)
				fsck_problem(
				    f, "nlink: folder %s has nlink %u, but %u subfolders (want %u)",
				    a, c->rec.nlink, c->subdirs_now, now);
			else
				fsck_problem(f, "nlink: %s has nlink %u, but %u name%s", a, c->rec.nlink,
					now, now == 1 ? "" : "s");
		}
		if (c->rec.nlink != after)
			fsck_repaired(f, "nlink of %s set to %u", a, after);
	}
}

static int cmp_loc(const void *a, const void *b)
{
	const struct ck_block *x = *(const struct ck_block *const *)a;
	const struct ck_block *y = *(const struct ck_block *const *)b;

	if (x->b.loc != y->b.loc)
		return x->b.loc < y->b.loc ? -1 : 1;
	return x->id < y->id ? -1 : x->id > y->id;
}

/* How many mappings name each block now, whatever else is wrong with them. */
static void count_refs(struct fsck *f)
{
	struct ck_map *mp = f->maps.v;

	for (size_t i = 0; i < f->maps.n; i++) {
		struct ck_block *blk = fsck_find_block(f, mp[i].id);

		if (blk)
			blk->refs_now++;
	}
}

/*
 * Two records at one location would both be freed, and the second free
 * would hand live data to a new block. Every file reads the same bytes from
 * either record, so repair keeps the lowest referenced id and points the
 * mappings of the others at it.
 */
static int check_locations(struct fsck *f)
{
	struct ck_block *b = f->blocks.v;
	struct ck_block **by_loc = malloc((f->blocks.n + 1) * sizeof(*by_loc));

	if (!by_loc)
		return -ENOMEM;
	for (size_t i = 0; i < f->blocks.n; i++) {
		by_loc[i] = &b[i];
		if (b[i].b.loc == TB_LOC_NONE) {
			b[i].bad_loc = true;
			fsck_problem(f, "bad-location: block %" PRIu64 " has no location", b[i].id);
		} else if (b[i].b.len > f->bs || b[i].b.len % TB_LEN_UNIT) {
			/* The daemon refuses to read it (EIO): which bytes are stored is unknown. */
			b[i].bad_loc = true;
			fsck_problem(f,
				"bad-length: block %" PRIu64 " stores %" PRIu64
				" bytes, not whole KiB within its %zu",
				b[i].id, (uint64_t)b[i].b.len, f->bs);
		}
		if (b[i].bad_loc)
			fsck_repaired(f,
				 "block %" PRIu64 " removed; the file ranges that use it, "
				 "listed below, read as zeros",
				 b[i].id);
	}
	qsort(by_loc, f->blocks.n, sizeof(*by_loc), cmp_loc);
	for (size_t i = 0; i < f->blocks.n;) {
		size_t j = i + 1, k;
		struct ck_block *keep = NULL;

		while (j < f->blocks.n && by_loc[j]->b.loc == by_loc[i]->b.loc)
			j++;
		if (j - i == 1 || by_loc[i]->bad_loc) {
			i = j;
			continue;
		}
		for (k = i; k < j && !keep; k++)
			if (by_loc[k]->refs_now)
				keep = by_loc[k];
		for (k = i; k < j; k++) {
			struct ck_block *o = by_loc[k];

			if (o == keep || (keep == NULL && k == i))
				continue;
			fsck_problem(f,
				"shared-location: blocks %" PRIu64 " and %" PRIu64
				" are both at dev %u slot %" PRIu64,
				keep ? keep->id : by_loc[i]->id, o->id, tb_loc_dev(o->b.loc),
				tb_loc_slot(o->b.loc));
			if (!keep || !o->refs_now)
				continue; /* the unreferenced ones are reported as leaked */
			fsck_repaired(f, "mappings of block %" PRIu64 " moved to block %" PRIu64, o->id,
				 keep->id);
			o->merged = true;
			o->keep = (size_t)(keep - b);
			/* Which record's hash is right is unknown: share the block no more. */
			if (!(o->b.flags & META_BLOCK_HASHED) ||
			    memcmp(o->b.hash, keep->b.hash, META_HASH_LEN) != 0)
				keep->unhash = true;
		}
		i = j;
	}
	free(by_loc);
	return 0;
}

/* The record a mapping to blk names after repair. */
static struct ck_block *survivor(struct fsck *f, struct ck_block *blk)
{
	struct ck_block *b = f->blocks.v;

	return blk->merged ? &b[blk->keep] : blk;
}

static void check_maps(struct fsck *f)
{
	struct ck_map *mp = f->maps.v;
	char a[4200];

	for (size_t i = 0; i < f->maps.n; i++) {
		struct ck_inode *in = fsck_find_inode(f, mp[i].ino);
		struct ck_block *blk = fsck_find_block(f, mp[i].id);
		uint64_t from = mp[i].idx * f->bs, to = from + f->bs - 1;

		if (!in) {
			fsck_problem(f,
				"stray: block map entry %" PRIu64 " of inode %" PRIu64
				", which does not exist",
				mp[i].idx, mp[i].ino);
			fsck_repaired(f, "entry removed");
			mp[i].drop = true;
			continue;
		}
		in->maps_now++;
		if (!blk || blk->bad_loc) {
			fsck_describe(f, mp[i].ino, a, sizeof(a));
			fsck_problem(f,
				"missing-block: %s block %" PRIu64 " (bytes %" PRIu64 "..%" PRIu64
				") names block %" PRIu64 ", which %s",
				a, mp[i].idx, from, to, mp[i].id,
				blk ? "has no location" : "does not exist");
			fsck_repaired(f,
				 "mapping removed: bytes %" PRIu64 "..%" PRIu64
				 " of %s now read as zeros",
				 from, to, a);
			mp[i].drop = true;
			continue;
		}
		if (in->purge) {
			mp[i].drop = true;
			continue;
		}
		struct ck_block *to_blk = survivor(f, blk);
		if (to_blk != blk) {
			mp[i].remap = true;
			mp[i].to = to_blk->id;
		}
		to_blk->refs_after++;
		in->maps_after++;
	}
}

/*
 * Each file's recorded count of mapped blocks against its mappings: now,
 * for the report, and as repair leaves them, for the count it writes.
 */
static void check_counts(struct fsck *f)
{
	struct ck_count *c = f->counts.v;
	struct ck_inode *in = f->inodes.v;
	char a[4200];

	for (size_t i = 0; i < f->counts.n; i++) {
		struct ck_inode *owner = fsck_find_inode(f, c[i].ino);

		if (!owner) {
			fsck_problem(f, "stray: block count of inode %" PRIu64 ", which does not exist",
				c[i].ino);
			fsck_repaired(f, "block count removed");
			c[i].drop = true;
			continue;
		}
		owner->nblocks = c[i].n;
		owner->has_count = true;
		c[i].drop = owner->purge;
	}
	for (size_t i = 0; i < f->inodes.n; i++) {
		if (in[i].purge)
			continue;
		if (in[i].nblocks != in[i].maps_now) {
			fsck_describe(f, in[i].ino, a, sizeof(a));
			fsck_problem(f,
				"blocks: %s records %" PRIu64 " mapped block%s, but maps %" PRIu64,
				a, in[i].nblocks, in[i].nblocks == 1 ? "" : "s", in[i].maps_now);
		}
		if (in[i].nblocks != in[i].maps_after) {
			fsck_describe(f, in[i].ino, a, sizeof(a));
			fsck_repaired(f, "block count of %s set to %" PRIu64, a, in[i].maps_after);
			in[i].fix_count = true;
		}
	}
}

static void check_blocks(struct fsck *f)
{
	struct ck_block *b = f->blocks.v;

	for (size_t i = 0; i < f->blocks.n; i++) {
		struct ck_block *blk = &b[i];

		if (blk->bad_loc) {
			blk->drop = true;
			continue;
		}
		if (blk->refs_now == 0) {
			fsck_problem(f,
				"leaked: block %" PRIu64 " (dev %u slot %" PRIu64
				") has no references",
				blk->id, tb_loc_dev(blk->b.loc), tb_loc_slot(blk->b.loc));
			fsck_repaired(f,
				 "block %" PRIu64 " removed; its space is free at the next mount",
				 blk->id);
			blk->drop = true;
			continue;
		}
		if (blk->b.refs != blk->refs_now)
			fsck_problem(f, "refcount: block %" PRIu64 " has refcount %u but %u reference%s",
				blk->id, blk->b.refs, blk->refs_now, blk->refs_now == 1 ? "" : "s");
		if (blk->merged)
			continue;
		if (blk->refs_after == 0) {
			/* Its only users were purged above. */
			blk->drop = true;
			f->freed_blocks++;
			continue;
		}
		if (blk->unhash) {
			blk->b.flags &= ~META_BLOCK_HASHED;
			blk->rewrite = true;
		}
		if (blk->b.refs != blk->refs_after) {
			fsck_repaired(f, "refcount of block %" PRIu64 " set to %u", blk->id,
				 blk->refs_after);
			blk->b.refs = blk->refs_after;
			blk->rewrite = true;
		}
	}
}

static void check_dedup(struct fsck *f)
{
	struct ck_dedup *d = f->dedups.v;
	char hex[2 * META_HASH_LEN + 1];

	for (size_t i = 0; i < f->dedups.n; i++) {
		struct ck_block *blk = fsck_find_block(f, d[i].id);

		fsck_hash_hex(d[i].hash, hex);
		if (!blk) {
			fsck_problem(f, "dedup: hash %s names block %" PRIu64 ", which does not exist",
				hex, d[i].id);
			fsck_repaired(f, "index entry removed");
			d[i].drop = true;
		} else if (blk->bad_loc || memcmp(blk->b.hash, d[i].hash, META_HASH_LEN) != 0 ||
			   (!(blk->b.flags & META_BLOCK_HASHED) && !blk->unhash)) {
			fsck_problem(f, "dedup: hash %s names block %" PRIu64 ", which %s", hex, d[i].id,
				blk->bad_loc ? "has no location" : "holds other bytes");
			fsck_repaired(f, "index entry removed");
			d[i].drop = true;
		} else {
			/* A block that repair removes or merges is shared no more. */
			d[i].drop = blk->drop || blk->merged || blk->unhash;
		}
	}
}

static void check_owned(struct fsck *f, struct vec *v, const char *what)
{
	struct ck_owned *o = v->v;

	for (size_t i = 0; i < v->n; i++) {
		struct ck_inode *in = fsck_find_inode(f, o[i].ino);

		if (!in) {
			if (o[i].name)
				fsck_problem(f,
					"stray: %s \"%s\" of inode %" PRIu64
					", which does not exist",
					what, o[i].name, o[i].ino);
			else
				fsck_problem(f, "stray: %s of inode %" PRIu64 ", which does not exist",
					what, o[i].ino);
			fsck_repaired(f, "%s removed", what);
		}
		o[i].drop = !in || in->purge;
	}
}

int fsck_analyze(struct fsck *f)
{
	int ret;

	check_malformed(f);
	classify_names(f);
	ret = walk_tree(f);
	if (ret)
		return ret;
	decide_fates(f);
	report_inodes(f);
	report_names(f);
	report_listings(f);
	count_refs(f);
	ret = check_locations(f);
	if (ret)
		return ret;
	check_maps(f);
	check_counts(f);
	check_blocks(f);
	check_dedup(f);
	check_owned(f, &f->xattrs, "xattr");
	check_owned(f, &f->links, "symlink target");
	return 0;
}

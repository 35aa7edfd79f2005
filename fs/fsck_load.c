/*
 * fsck_load.c - the store as the offline checker sees it: every table
 * read into an array in one transaction, each array in its table's key
 * order (as meta_walk gives it), and the lookups in them. A record that
 * cannot be decoded is kept aside as malformed, to be dropped.
 *
 * The records are read and written through meta.c (meta_walk, meta_rec_*),
 * which owns their encoding.
 */
#include "fsck_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void *vec_push(struct vec *a)
{
	if (a->n == a->cap) {
		size_t cap = a->cap ? a->cap * 2 : 64;
		void *p = realloc(a->v, cap * a->sz);

		if (!p)
			return NULL;
		a->v = p;
		a->cap = cap;
	}
	void *e = (char *)a->v + a->n++ * a->sz;
	memset(e, 0, a->sz);
	return e;
}

static char *strndup_checked(const char *s, size_t n)
{
	return s ? strndup(s, n) : NULL;
}

/* ---- loading ---- */

static int note_bad(struct fsck *f, enum meta_table t, const struct meta_rec *r)
{
	struct ck_bad *b = vec_push(&f->bad);

	if (!b || !(b->key = malloc(r->keylen ? r->keylen : 1)))
		return -ENOMEM;
	memcpy(b->key, r->key, r->keylen);
	b->keylen = r->keylen;
	b->t = t;
	return 0;
}

static int load_inode(void *arg, const struct meta_rec *r)
{
	struct fsck *f = arg;
	struct ck_inode *in;

	if (r->malformed)
		return note_bad(f, META_TAB_INODE, r);
	in = vec_push(&f->inodes);
	if (!in)
		return -ENOMEM;
	in->ino = r->ino;
	in->rec = r->inode;
	return 0;
}

static int load_name(void *arg, const struct meta_rec *r)
{
	struct fsck *f = arg;
	struct ck_name *n;

	if (r->malformed || memchr(r->name, 0, r->namelen))
		return note_bad(f, META_TAB_DIRENT, r);
	n = vec_push(&f->names);
	if (!n || !(n->name = strndup_checked(r->name, r->namelen)))
		return -ENOMEM;
	n->parent = r->ino;
	n->child = r->id;
	n->cookie = r->idx;
	return 0;
}

static int load_listing(void *arg, const struct meta_rec *r)
{
	struct fsck *f = arg;
	struct ck_listing *l;

	if (r->malformed || memchr(r->name, 0, r->namelen))
		return note_bad(f, META_TAB_DIRCOOK, r);
	l = vec_push(&f->listings);
	if (!l || !(l->name = strndup_checked(r->name, r->namelen)))
		return -ENOMEM;
	l->parent = r->ino;
	l->cookie = r->idx;
	return 0;
}

static int load_map(void *arg, const struct meta_rec *r)
{
	struct fsck *f = arg;
	struct ck_map *mp;

	if (r->malformed)
		return note_bad(f, META_TAB_BMAP, r);
	mp = vec_push(&f->maps);
	if (!mp)
		return -ENOMEM;
	mp->ino = r->ino;
	mp->idx = r->idx;
	mp->id = r->id;
	return 0;
}

static int load_block(void *arg, const struct meta_rec *r)
{
	struct fsck *f = arg;
	struct ck_block *b;

	if (r->malformed)
		return note_bad(f, META_TAB_BLOCK, r);
	b = vec_push(&f->blocks);
	if (!b)
		return -ENOMEM;
	b->id = r->id;
	b->b = r->block;
	return 0;
}

static int load_dedup(void *arg, const struct meta_rec *r)
{
	struct fsck *f = arg;
	struct ck_dedup *d;

	if (r->malformed)
		return note_bad(f, META_TAB_DEDUP, r);
	d = vec_push(&f->dedups);
	if (!d)
		return -ENOMEM;
	memcpy(d->hash, r->hash, META_HASH_LEN);
	d->id = r->id;
	return 0;
}

static int load_xattr(void *arg, const struct meta_rec *r)
{
	struct fsck *f = arg;
	struct ck_owned *x;

	if (r->malformed || memchr(r->name, 0, r->namelen))
		return note_bad(f, META_TAB_XATTR, r);
	x = vec_push(&f->xattrs);
	if (!x || !(x->name = strndup_checked(r->name, r->namelen)))
		return -ENOMEM;
	x->ino = r->ino;
	return 0;
}

static int load_link(void *arg, const struct meta_rec *r)
{
	struct fsck *f = arg;
	struct ck_owned *s;

	if (r->malformed)
		return note_bad(f, META_TAB_SYMLINK, r);
	s = vec_push(&f->links);
	if (!s)
		return -ENOMEM;
	s->ino = r->ino;
	return 0;
}

static int load_count(void *arg, const struct meta_rec *r)
{
	struct fsck *f = arg;
	struct ck_count *c;

	if (r->malformed)
		return note_bad(f, META_TAB_NBLOCKS, r);
	c = vec_push(&f->counts);
	if (!c)
		return -ENOMEM;
	c->ino = r->ino;
	c->n = r->idx;
	return 0;
}

void fsck_free_vecs(struct fsck *f)
{
	struct ck_name *n = f->names.v;
	struct ck_listing *l = f->listings.v;
	struct ck_owned *x = f->xattrs.v;
	struct ck_bad *b = f->bad.v;

	for (size_t i = 0; i < f->names.n; i++)
		free(n[i].name);
	for (size_t i = 0; i < f->listings.n; i++)
		free(l[i].name);
	for (size_t i = 0; i < f->xattrs.n; i++)
		free(x[i].name);
	for (size_t i = 0; i < f->bad.n; i++)
		free(b[i].key);
	struct vec *all[] = {&f->inodes, &f->names,  &f->listings, &f->maps,   &f->blocks,
			     &f->dedups, &f->xattrs, &f->links,	   &f->counts, &f->bad};
	for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
		free(all[i]->v);
		all[i]->v = NULL;
		all[i]->n = all[i]->cap = 0;
	}
}

int fsck_load(struct fsck *f, MDB_txn *txn)
{
	static const struct {
		enum meta_table t;
		meta_walk_fn fn;
	} walks[] = {
	    {META_TAB_INODE, load_inode},     {META_TAB_DIRENT, load_name},
	    {META_TAB_DIRCOOK, load_listing}, {META_TAB_BMAP, load_map},
	    {META_TAB_BLOCK, load_block},     {META_TAB_DEDUP, load_dedup},
	    {META_TAB_XATTR, load_xattr},     {META_TAB_SYMLINK, load_link},
	    {META_TAB_NBLOCKS, load_count},
	};

	f->inodes.sz = sizeof(struct ck_inode);
	f->names.sz = sizeof(struct ck_name);
	f->listings.sz = sizeof(struct ck_listing);
	f->maps.sz = sizeof(struct ck_map);
	f->blocks.sz = sizeof(struct ck_block);
	f->dedups.sz = sizeof(struct ck_dedup);
	f->xattrs.sz = f->links.sz = sizeof(struct ck_owned);
	f->counts.sz = sizeof(struct ck_count);
	f->bad.sz = sizeof(struct ck_bad);
	for (size_t i = 0; i < sizeof(walks) / sizeof(walks[0]); i++) {
		int ret = meta_walk(f->m, txn, walks[i].t, walks[i].fn, f);

		if (ret)
			return ret;
	}
	return 0;
}

/* ---- lookups: every array is in its table's key order, as meta_walk gives it ---- */

struct ck_inode *fsck_find_inode(struct fsck *f, uint64_t ino)
{
	struct ck_inode *v = f->inodes.v;
	size_t lo = 0, hi = f->inodes.n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (v[mid].ino == ino)
			return &v[mid];
		if (v[mid].ino < ino)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

struct ck_block *fsck_find_block(struct fsck *f, uint64_t id)
{
	struct ck_block *v = f->blocks.v;
	size_t lo = 0, hi = f->blocks.n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (v[mid].id == id)
			return &v[mid];
		if (v[mid].id < id)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

struct ck_listing *fsck_find_listing(struct fsck *f, uint64_t parent, uint64_t cookie)
{
	struct ck_listing *v = f->listings.v;
	size_t lo = 0, hi = f->listings.n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (v[mid].parent == parent && v[mid].cookie == cookie)
			return &v[mid];
		if (v[mid].parent < parent || (v[mid].parent == parent && v[mid].cookie < cookie))
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

/* Index of the first name in folder parent (names are in (parent, name) order). */
size_t fsck_first_name(struct fsck *f, uint64_t parent)
{
	struct ck_name *v = f->names.v;
	size_t lo = 0, hi = f->names.n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (v[mid].parent < parent)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/*
 * A name in folder parent. The store orders names bytewise, shorter first
 * on a tie, which for names without NUL is strcmp's order.
 */
struct ck_name *fsck_find_name(struct fsck *f, uint64_t parent, const char *name)
{
	struct ck_name *v = f->names.v;
	size_t lo = fsck_first_name(f, parent), hi = f->names.n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = v[mid].parent != parent ? 1 : strcmp(v[mid].name, name);

		if (c == 0)
			return &v[mid];
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

bool fsck_is_dir(const struct ck_inode *in)
{
	return in && S_ISDIR(in->rec.mode);
}

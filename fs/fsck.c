/*
 * fsck.c - the offline check of a metadata store, and its repair.
 *
 * The whole store is read into arrays in one transaction, then checked as a
 * graph: names lead from the root folder to inodes, inodes own block maps,
 * block maps reference block records, and the dedup index points at block
 * records. Every record that breaks an invariant is reported once, with the
 * file it belongs to where there is one (a file's count of mapped blocks,
 * which st_blocks is made of, must be its number of mappings). Repair
 * decides the fate of every record first (keep, drop, rewrite), so that
 * the counts it writes back (reference counts, link counts, block counts)
 * are those of the store as it will be, and then applies all of it in one
 * write transaction: a crash during repair leaves the store as it was.
 *
 * The records are read and written through meta.c (meta_walk, meta_rec_*),
 * which owns their encoding.
 */
#include "fsck.h"
#include "escape.h"
#include "meta.h"
#include "tb.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A growable array of sz-byte elements. */
struct vec {
	void *v;
	size_t n, cap, sz;
};

struct ck_inode {
	uint64_t ino;
	struct meta_inode rec;
	size_t via;			 /* the name it was first reached by */
	uint32_t names_now, names_after; /* valid names now; names kept by repair */
	uint32_t subdirs_now, subdirs_after;
	uint64_t nblocks;	       /* its recorded count of mapped blocks */
	uint64_t maps_now, maps_after; /* its mappings now; kept by repair */
	bool reached, purge, no_target;
	bool has_count, fix_count;
};

struct ck_name { /* dirent: (parent, name) -> child, cookie */
	uint64_t parent, child, cookie;
	char *name;
	bool valid;  /* parent is an existing folder and child exists */
	bool listed; /* its listing entry exists */
	bool extra;  /* a second name of a folder */
	bool drop, relink;
};

struct ck_listing { /* dircook: (parent, cookie) -> name */
	uint64_t parent, cookie;
	char *name;
	bool used, drop;
};

struct ck_map { /* bmap: (ino, idx) -> block id */
	uint64_t ino, idx, id, to;
	bool drop, remap;
};

struct ck_block {
	uint64_t id;
	struct meta_block b;
	uint32_t refs_now, refs_after; /* mappings that name it now; after repair */
	size_t keep;		       /* merged: the index of the record kept instead */
	bool bad_loc, merged, unhash, drop, rewrite;
};

struct ck_dedup {
	uint8_t hash[META_HASH_LEN];
	uint64_t id;
	bool drop;
};

struct ck_owned { /* xattr (with a name) or symlink target (without) */
	uint64_t ino;
	char *name;
	bool drop;
};

struct ck_count { /* nblocks: ino -> mapped blocks */
	uint64_t ino, n;
	bool drop;
};

struct ck_bad { /* a malformed record: always dropped */
	enum meta_table t;
	void *key;
	size_t keylen;
};

struct fsck {
	struct fs_meta *m;
	FILE *out;
	size_t bs;
	bool repair;
	struct vec inodes, names, listings, maps, blocks, dedups, xattrs, links, counts, bad;
	uint64_t problems, notes;
	uint64_t freed_blocks; /* blocks repair frees as a consequence of purges */
	bool no_root;	       /* nothing can be repaired without the root folder */
};

static const char *const table_names[] = {
    [META_TAB_INODE] = "inode", [META_TAB_DIRENT] = "dirent",	[META_TAB_DIRCOOK] = "dircook",
    [META_TAB_BMAP] = "bmap",	[META_TAB_BLOCK] = "block",	[META_TAB_DEDUP] = "dedup",
    [META_TAB_XATTR] = "xattr", [META_TAB_SYMLINK] = "symlink", [META_TAB_NBLOCKS] = "nblocks",
};

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

/*
 * One line of the report, after lead. Lines name files, whose names may
 * hold any byte but '/': each line is escaped whole (escape.h), so that a
 * name cannot forge a line or send a terminal escape.
 */
static void report_line(FILE *out, const char *lead, const char *fmt, va_list ap)
{
	char *msg = NULL, *buf = NULL;
	int n = vasprintf(&msg, fmt, ap);

	if (n >= 0)
		buf = malloc(ESC_SIZE((size_t)n));
	if (buf)
		esc_bytes(msg, (size_t)n, buf, ESC_SIZE((size_t)n));
	fprintf(out, "%s%s\n", lead, buf ? buf : "(out of memory)");
	free(buf);
	free(msg);
}

static void report(FILE *out, const char *lead, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void report(FILE *out, const char *lead, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	report_line(out, lead, fmt, ap);
	va_end(ap);
}

static void problem(struct fsck *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void problem(struct fsck *f, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	report_line(f->out, "", fmt, ap);
	va_end(ap);
	f->problems++;
}

/* What repair does about the problem just reported; silent without --repair. */
static void repaired(struct fsck *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void repaired(struct fsck *f, const char *fmt, ...)
{
	va_list ap;

	if (!f->repair)
		return;
	va_start(ap, fmt);
	report_line(f->out, "  repair: ", fmt, ap);
	va_end(ap);
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

static void free_vecs(struct fsck *f)
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

static int load(struct fsck *f, MDB_txn *txn)
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

static struct ck_inode *find_inode(struct fsck *f, uint64_t ino)
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

static struct ck_block *find_block(struct fsck *f, uint64_t id)
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

static struct ck_listing *find_listing(struct fsck *f, uint64_t parent, uint64_t cookie)
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
static size_t first_name(struct fsck *f, uint64_t parent)
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
static struct ck_name *find_name(struct fsck *f, uint64_t parent, const char *name)
{
	struct ck_name *v = f->names.v;
	size_t lo = first_name(f, parent), hi = f->names.n;

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

static bool is_dir(const struct ck_inode *in)
{
	return in && S_ISDIR(in->rec.mode);
}

static const char *kind(const struct ck_inode *in)
{
	switch (in->rec.mode & S_IFMT) {
	case S_IFDIR:
		return "folder";
	case S_IFREG:
		return "file";
	case S_IFLNK:
		return "symlink";
	default:
		return "special file";
	}
}

#define PATH_DEPTH 256 /* deeper paths are shown from "..." on */

/* The path of a reached inode, along the names it was reached by. */
static void path_of(struct fsck *f, const struct ck_inode *in, char *buf, size_t len)
{
	struct ck_name *n = f->names.v;
	const char *parts[PATH_DEPTH];
	size_t np = 0, l = 0;

	while (in && in->ino != META_ROOT_INO && np < PATH_DEPTH) {
		parts[np++] = n[in->via].name;
		in = find_inode(f, n[in->via].parent);
	}
	buf[0] = 0;
	if (np == 0)
		snprintf(buf, len, "/");
	else if (in && in->ino != META_ROOT_INO)
		l = (size_t)snprintf(buf, len, "/...");
	while (np > 0 && l < len)
		l += (size_t)snprintf(buf + l, len - l, "/%s", parts[--np]);
}

/* "/path (ino N)" for an inode reached from the root, "inode N" otherwise. */
static const char *describe(struct fsck *f, uint64_t ino, char *buf, size_t len)
{
	struct ck_inode *in = find_inode(f, ino);

	buf[0] = 0;
	if (in && in->reached) {
		path_of(f, in, buf, len);
		size_t l = strlen(buf);
		snprintf(buf + l, len - l, " (ino %" PRIu64 ")", ino);
	} else {
		snprintf(buf, len, "inode %" PRIu64, ino);
	}
	return buf;
}

static void hash_hex(const uint8_t *h, char out[2 * META_HASH_LEN + 1])
{
	for (int i = 0; i < META_HASH_LEN; i++)
		sprintf(out + 2 * i, "%02x", h[i]);
}

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
		problem(f, "malformed: %s record with key %s has a size this store never writes",
			table_names[b[i].t], hex);
		repaired(f, "record deleted");
	}
}

/* Which names are valid, and the counts they give their inodes. */
static void classify_names(struct fsck *f)
{
	struct ck_name *n = f->names.v;

	for (size_t i = 0; i < f->names.n; i++) {
		struct ck_inode *p = find_inode(f, n[i].parent), *c = find_inode(f, n[i].child);
		struct ck_listing *l = find_listing(f, n[i].parent, n[i].cookie);

		if (l && strcmp(l->name, n[i].name) == 0) {
			n[i].listed = true;
			l->used = true;
		}
		n[i].valid = is_dir(p) && c;
		if (!n[i].valid)
			continue;
		c->names_now++;
		if (is_dir(c))
			p->subdirs_now++;
	}
}

/* Breadth-first from the root: which inodes a path reaches, and by which name. */
static int walk_tree(struct fsck *f)
{
	struct ck_name *n = f->names.v;
	struct ck_inode *root = find_inode(f, META_ROOT_INO);
	uint64_t *queue;
	size_t head = 0, tail = 0;

	if (!is_dir(root))
		return 0;
	queue = malloc((f->inodes.n + 1) * sizeof(*queue));
	if (!queue)
		return -ENOMEM;
	root->reached = true;
	queue[tail++] = META_ROOT_INO;
	while (head < tail) {
		uint64_t dir = queue[head++];

		for (size_t i = first_name(f, dir); i < f->names.n && n[i].parent == dir; i++) {
			struct ck_inode *c;

			if (!n[i].valid)
				continue;
			c = find_inode(f, n[i].child);
			if (c->reached) {
				/* A folder's second name makes a loop or a DAG. */
				n[i].extra = is_dir(c);
				continue;
			}
			c->reached = true;
			c->via = i;
			if (is_dir(c))
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
		struct ck_inode *p = find_inode(f, n[i].parent), *c = find_inode(f, n[i].child);

		n[i].drop = !n[i].valid || n[i].extra || !p->reached || p->purge || c->purge;
		n[i].relink = !n[i].drop && !n[i].listed;
		if (n[i].drop)
			continue;
		c->names_after++;
		if (is_dir(c))
			p->subdirs_after++;
	}
}

static void report_names(struct fsck *f)
{
	struct ck_name *n = f->names.v;
	char a[4200], b[4200];

	for (size_t i = 0; i < f->names.n; i++) {
		struct ck_inode *p = find_inode(f, n[i].parent);

		if (!p || !is_dir(p)) {
			problem(f,
				"bad-parent: name \"%s\" for inode %" PRIu64 " is in %s, which %s",
				n[i].name, n[i].child, describe(f, n[i].parent, a, sizeof(a)),
				p ? "is not a folder" : "does not exist");
			repaired(f, "name removed");
		} else if (!find_inode(f, n[i].child)) {
			describe(f, n[i].parent, a, sizeof(a));
			problem(f,
				"dangling-name: \"%s\" in %s names inode %" PRIu64
				", which does not exist",
				n[i].name, a, n[i].child);
			repaired(f, "name removed");
		} else if (n[i].extra) {
			problem(f, "extra-name: folder %s has a second name \"%s\" in %s",
				describe(f, n[i].child, a, sizeof(a)), n[i].name,
				describe(f, n[i].parent, b, sizeof(b)));
			repaired(f, "second name removed");
		} else if (!n[i].listed && !n[i].drop) {
			describe(f, n[i].parent, a, sizeof(a));
			problem(f,
				"unlisted-name: \"%s\" in %s is missing from the folder's listing",
				n[i].name, a);
			repaired(f, "listing entry added");
		}
	}
}

static void report_listings(struct fsck *f)
{
	struct ck_listing *l = f->listings.v;
	char a[4200];

	for (size_t i = 0; i < f->listings.n; i++) {
		if (l[i].used) {
			struct ck_name *n = find_name(f, l[i].parent, l[i].name);

			/* The name goes, or gets a fresh entry: this one goes either way. */
			l[i].drop = n && (n->drop || n->relink);
			continue;
		}
		l[i].drop = true;
		problem(f,
			"stale-listing: %s lists \"%s\" (cookie %" PRIu64
			") with no such name in it",
			describe(f, l[i].parent, a, sizeof(a)), l[i].name, l[i].cookie);
		repaired(f, "listing entry removed");
	}
}

static void report_inodes(struct fsck *f)
{
	struct ck_inode *in = f->inodes.v;
	struct ck_inode *root = find_inode(f, META_ROOT_INO);
	char a[4200];

	if (!is_dir(root)) {
		f->no_root = true;
		problem(f, "no-root: the root folder (inode %d) %s", META_ROOT_INO,
			root ? "is not a folder" : "does not exist");
		repaired(f, "not repairable: every file hangs off the root folder");
		return;
	}
	for (size_t i = 0; i < f->inodes.n; i++) {
		struct ck_inode *c = &in[i];

		if (!c->reached && c->names_now == 0 && c->rec.nlink == 0) {
			/* Unlinked while open at a stop: the next mount purges it. */
			fprintf(f->out,
				"note: inode %" PRIu64 " (%s, %" PRIu64
				" bytes) was deleted while open; the next mount frees it\n",
				c->ino, kind(c), c->rec.size);
			f->notes++;
			repaired(f, "inode %" PRIu64 " purged", c->ino);
			continue;
		}
		if (!c->reached && c->names_now == 0) {
			problem(f,
				"orphan: inode %" PRIu64 " (%s, %" PRIu64
				" bytes, nlink %u) has no name",
				c->ino, kind(c), c->rec.size, c->rec.nlink);
			repaired(f, "inode %" PRIu64 " purged with its data", c->ino);
			continue;
		}
		if (!c->reached) {
			problem(f,
				"unreachable: inode %" PRIu64 " (%s) has %u name%s"
				" but no path from the root folder",
				c->ino, kind(c), c->names_now, c->names_now == 1 ? "" : "s");
			repaired(f, "inode %" PRIu64 " and its names purged", c->ino);
			continue;
		}
		describe(f, c->ino, a, sizeof(a));
		if (c->no_target) {
			problem(f, "no-target: symlink %s has no target", a);
			repaired(f, "symlink removed");
			continue;
		}
		/* A folder counts "." and its parent's name of it, and each subfolder's "..". */
		bool dir = is_dir(c);
		uint32_t now = dir ? 2 + c->subdirs_now : c->names_now;
		uint32_t after = dir ? 2 + c->subdirs_after : c->names_after;

		if (c->rec.nlink != now) {
			if (dir)
				problem(
				    f, "nlink: folder %s has nlink %u, but %u subfolders (want %u)",
				    a, c->rec.nlink, c->subdirs_now, now);
			else
				problem(f, "nlink: %s has nlink %u, but %u name%s", a, c->rec.nlink,
					now, now == 1 ? "" : "s");
		}
		if (c->rec.nlink != after)
			repaired(f, "nlink of %s set to %u", a, after);
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
		struct ck_block *blk = find_block(f, mp[i].id);

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
			problem(f, "bad-location: block %" PRIu64 " has no location", b[i].id);
		} else if (b[i].b.len > f->bs || b[i].b.len % TB_LEN_UNIT) {
			/* The daemon refuses to read it (EIO): which bytes are stored is unknown. */
			b[i].bad_loc = true;
			problem(f,
				"bad-length: block %" PRIu64 " stores %" PRIu64
				" bytes, not whole KiB within its %zu",
				b[i].id, (uint64_t)b[i].b.len, f->bs);
		}
		if (b[i].bad_loc)
			repaired(f,
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
			problem(f,
				"shared-location: blocks %" PRIu64 " and %" PRIu64
				" are both at dev %u slot %" PRIu64,
				keep ? keep->id : by_loc[i]->id, o->id, tb_loc_dev(o->b.loc),
				tb_loc_slot(o->b.loc));
			if (!keep || !o->refs_now)
				continue; /* the unreferenced ones are reported as leaked */
			repaired(f, "mappings of block %" PRIu64 " moved to block %" PRIu64, o->id,
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
		struct ck_inode *in = find_inode(f, mp[i].ino);
		struct ck_block *blk = find_block(f, mp[i].id);
		uint64_t from = mp[i].idx * f->bs, to = from + f->bs - 1;

		if (!in) {
			problem(f,
				"stray: block map entry %" PRIu64 " of inode %" PRIu64
				", which does not exist",
				mp[i].idx, mp[i].ino);
			repaired(f, "entry removed");
			mp[i].drop = true;
			continue;
		}
		in->maps_now++;
		if (!blk || blk->bad_loc) {
			describe(f, mp[i].ino, a, sizeof(a));
			problem(f,
				"missing-block: %s block %" PRIu64 " (bytes %" PRIu64 "..%" PRIu64
				") names block %" PRIu64 ", which %s",
				a, mp[i].idx, from, to, mp[i].id,
				blk ? "has no location" : "does not exist");
			repaired(f,
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
		struct ck_inode *owner = find_inode(f, c[i].ino);

		if (!owner) {
			problem(f, "stray: block count of inode %" PRIu64 ", which does not exist",
				c[i].ino);
			repaired(f, "block count removed");
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
			describe(f, in[i].ino, a, sizeof(a));
			problem(f,
				"blocks: %s records %" PRIu64 " mapped block%s, but maps %" PRIu64,
				a, in[i].nblocks, in[i].nblocks == 1 ? "" : "s", in[i].maps_now);
		}
		if (in[i].nblocks != in[i].maps_after) {
			describe(f, in[i].ino, a, sizeof(a));
			repaired(f, "block count of %s set to %" PRIu64, a, in[i].maps_after);
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
			problem(f,
				"leaked: block %" PRIu64 " (dev %u slot %" PRIu64
				") has no references",
				blk->id, tb_loc_dev(blk->b.loc), tb_loc_slot(blk->b.loc));
			repaired(f,
				 "block %" PRIu64 " removed; its space is free at the next mount",
				 blk->id);
			blk->drop = true;
			continue;
		}
		if (blk->b.refs != blk->refs_now)
			problem(f, "refcount: block %" PRIu64 " has refcount %u but %u reference%s",
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
			repaired(f, "refcount of block %" PRIu64 " set to %u", blk->id,
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
		struct ck_block *blk = find_block(f, d[i].id);

		hash_hex(d[i].hash, hex);
		if (!blk) {
			problem(f, "dedup: hash %s names block %" PRIu64 ", which does not exist",
				hex, d[i].id);
			repaired(f, "index entry removed");
			d[i].drop = true;
		} else if (blk->bad_loc || memcmp(blk->b.hash, d[i].hash, META_HASH_LEN) != 0 ||
			   (!(blk->b.flags & META_BLOCK_HASHED) && !blk->unhash)) {
			problem(f, "dedup: hash %s names block %" PRIu64 ", which %s", hex, d[i].id,
				blk->bad_loc ? "has no location" : "holds other bytes");
			repaired(f, "index entry removed");
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
		struct ck_inode *in = find_inode(f, o[i].ino);

		if (!in) {
			if (o[i].name)
				problem(f,
					"stray: %s \"%s\" of inode %" PRIu64
					", which does not exist",
					what, o[i].name, o[i].ino);
			else
				problem(f, "stray: %s of inode %" PRIu64 ", which does not exist",
					what, o[i].ino);
			repaired(f, "%s removed", what);
		}
		o[i].drop = !in || in->purge;
	}
}

static int analyze(struct fsck *f)
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

/* ---- repair ---- */

static int apply(struct fsck *f, MDB_txn *txn)
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
		uint32_t want = is_dir(&in[i]) ? 2 + in[i].subdirs_after : in[i].names_after;
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

/* ---- the run ---- */

static void summary_counts(struct fsck *f, const char *dir)
{
	struct ck_inode *in = f->inodes.v;
	uint64_t files = 0, dirs = 0;

	for (size_t i = 0; i < f->inodes.n; i++) {
		if (S_ISDIR(in[i].rec.mode))
			dirs++;
		else if (S_ISREG(in[i].rec.mode))
			files++;
	}
	report(f->out, "",
	       "fsck: %s: block size %zu, %zu inodes (%" PRIu64 " files, %" PRIu64
	       " folders), %zu names, %zu blocks, %zu mappings",
	       dir, f->bs, f->inodes.n, files, dirs, f->names.n, f->blocks.n, f->maps.n);
}

/* One pass: load and check in txn; with f->repair, also apply. */
static int pass(struct fsck *f, MDB_txn *txn, const char *dir, bool header)
{
	int ret = load(f, txn);

	if (ret)
		return ret;
	if (header)
		summary_counts(f, dir);
	ret = analyze(f);
	if (!ret && f->repair && !f->no_root && (f->problems || f->notes || f->freed_blocks))
		ret = apply(f, txn);
	return ret;
}

struct guarded_pass {
	struct fsck *f;
	const char *dir;
	bool first; /* the check (and repair); else the check after repair */
};

/*
 * A pass in its own transaction, committed when it repaired something.
 * Run through meta_guarded: a damaged data.mdb that LMDB would read as a
 * fault ends the pass with -EUCLEAN, not the process.
 */
static int run_pass(void *arg)
{
	struct guarded_pass *p = arg;
	struct fsck *f = p->f;
	bool write = p->first && f->repair;
	MDB_txn *txn;
	int ret = meta_begin(f->m, write, &txn);

	if (ret)
		return ret;
	meta_guard_hold(txn); /* kept reachable if a fault abandons it (meta.h) */
	ret = pass(f, txn, p->dir, p->first);
	meta_guard_release(txn);
	if (!ret && write && !f->no_root && (f->problems || f->notes || f->freed_blocks))
		ret = meta_commit(txn);
	else
		meta_abort(txn);
	return ret;
}

int fs_fsck(const char *dir, bool repair, FILE *out, const char *prog)
{
	struct fsck f = {.out = out, .repair = repair};
	struct guarded_pass gp = {&f, dir, true};
	char err[512] = "", store_id[40];
	int ret, status;

	if (meta_check_folder(dir, err, sizeof(err)) < 0) {
		report(stderr, prog, ": %s", err);
		return FSCK_ERROR;
	}
	if (!meta_store_exists(dir)) {
		report(stderr, prog, ": %s: no tensorfs metadata store there", dir);
		return FSCK_ERROR;
	}
	/* A daemon still writing back after its unmount is waited for, as a mount does. */
	ret = meta_wait_holder(dir, META_LOCK_WAIT_S, prog, err, sizeof(err));
	if (!ret)
		ret = meta_open(&f.m, dir, &f.bs, false, getuid(), getgid(), store_id, err,
				sizeof(err));
	if (ret) {
		report(stderr, prog, ": %s", err[0] ? err : strerror(-ret));
		return FSCK_ERROR;
	}
	ret = meta_guarded(f.m, run_pass, &gp, err, sizeof(err));
	if (ret)
		goto error;
	if (repair && f.freed_blocks && !f.no_root)
		fprintf(out, "  repair: %" PRIu64 " blocks of purged inodes freed\n",
			f.freed_blocks);
	if (!repair || f.problems == 0 || f.no_root) {
		if (f.problems)
			fprintf(out, "fsck: %" PRIu64 " problem%s\n", f.problems,
				f.problems == 1 ? "" : "s");
		else
			fprintf(out, "fsck: clean\n");
		status = f.problems ? FSCK_PROBLEMS : FSCK_CLEAN;
		goto out;
	}
	fprintf(out, "fsck: %" PRIu64 " problem%s, repaired; checking again\n", f.problems,
		f.problems == 1 ? "" : "s");

	/* The check after repair: anything it finds, repair could not fix. */
	struct fsck again = {.m = f.m, .out = out, .bs = f.bs};
	struct guarded_pass gp2 = {&again, dir, false};

	free_vecs(&f);
	ret = meta_guarded(again.m, run_pass, &gp2, err, sizeof(err));
	free_vecs(&again);
	if (ret)
		goto error;
	if (again.problems)
		fprintf(out, "fsck: %" PRIu64 " problem%s left after repair\n", again.problems,
			again.problems == 1 ? "" : "s");
	else
		fprintf(out, "fsck: clean\n");
	status = again.problems ? FSCK_PROBLEMS : FSCK_CLEAN;
	goto out;
error:
	if (err[0])
		report(stderr, prog, ": %s", err);
	else
		report(stderr, prog, ": %s: %s", dir, meta_strerror(ret));
	status = FSCK_ERROR;
out:
	free_vecs(&f);
	meta_close(f.m);
	return status;
}

/*
 * meta.c - the metadata store on LMDB: its environment.
 *
 * LMDB gives us atomic, crash-consistent transactions and lock-free
 * readers; we add the record formats and the reference counting of blocks.
 * This file opens and closes the store: the checks of data.mdb's pages
 * before LMDB maps it, the tables and the format record, the map watched
 * for faults (metaguard.h), transactions and their commits, and the info
 * record of the devices the store has used. The other pieces: the lock
 * file (meta_lock.c), the durable record and sync points (meta_durable.c),
 * inodes and names (meta_names.c), block maps and reference counts
 * (meta_blocks.c), raw records for the offline checker (meta_rec.c); what
 * they share is in meta_int.h.
 *
 * The environment runs with MDB_NOSYNC: a kill of the daemon loses nothing
 * committed (the pages are in the kernel), and meta_sync flushes them for
 * fsync and at the periodic sync point (meta_durable.c says how a power
 * cut is survived).
 *
 * LMDB opens data.mdb and lock.mdb by path, through links. The folder is
 * checked first (tiers/storedir.h: ours, writable by nobody else, no link
 * or foreign file under a store file's name), and LMDB is given the path
 * of our descriptor of it (/proc/self/fd/N), so it opens the files of the
 * folder that was checked.
 */
#include "meta_int.h"
#include "log.h"
#include "metaguard.h"
#include "storedir.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#define META_MAP_SIZE (64ULL << 30)
#define META_MAP_MIN (1ULL << 30) /* the least map taken when the whole is refused */
#define META_MAX_DBS 16
#define FORMAT_VERSION_MAX 255 /* a format record naming a higher one is garbage */
#define GUARD_ENVS 8	       /* environments abandoned after a fault, kept (abandon_env) */
/* The info record of the devices the store has used (meta_devices_get). */
#define DEVICES_KEY "devices"

const char *const meta_files[] = {DATA_NAME, LMDB_LOCK_NAME, LOCK_NAME, DURABLE_NAME, SCRATCH_NAME,
				   NULL};

struct meta_format {
	uint32_t version;
	uint32_t pad;
	uint64_t block_size;
	char store_id[40];
};

/* A store id's text (32 hex digits and 4 dashes) as 16 bytes; false if it is not one. */
bool meta_store_id_bytes(const char *id, unsigned char out[STORE_ID_BYTES])
{
	unsigned n = 0;

	for (size_t i = 0; i < STORE_ID_LEN; i++) {
		char c = id[i];
		int v;

		if (i == 8 || i == 13 || i == 18 || i == 23) {
			if (c != '-')
				return false;
			continue;
		}
		if (c >= '0' && c <= '9')
			v = c - '0';
		else if (c >= 'a' && c <= 'f')
			v = c - 'a' + 10;
		else
			return false;
		if (n % 2 == 0)
			out[n / 2] = (unsigned char)(v << 4);
		else
			out[n / 2] |= (unsigned char)v;
		n++;
	}
	return id[STORE_ID_LEN] == 0 || id[STORE_ID_LEN] == '\n';
}

/* ---- a damaged data.mdb, found before LMDB maps it ---- */

/* The fields of an LMDB meta page that the checks use. */
struct lmdb_meta {
	uint32_t psize;
	uint64_t last_pg, txnid;
};

/* What is wrong with meta page p (LMDB_META_END bytes), or NULL. first: page 0, the page size's. */
static const char *lmdb_meta_parse(const unsigned char *p, bool first, struct lmdb_meta *out)
{
	uint16_t flags;
	uint32_t magic, version, psize;

	memcpy(&flags, p + LMDB_PAGE_FLAGS_OFF, sizeof(flags));
	memcpy(&magic, p + LMDB_META_MAGIC_OFF, sizeof(magic));
	memcpy(&version, p + LMDB_META_VERSION_OFF, sizeof(version));
	memcpy(&psize, p + LMDB_META_PSIZE_OFF, sizeof(psize));
	memcpy(&out->last_pg, p + LMDB_META_LAST_PG_OFF, sizeof(out->last_pg));
	memcpy(&out->txnid, p + LMDB_META_TXNID_OFF, sizeof(out->txnid));
	if (!(flags & LMDB_P_META))
		return "is not a meta page";
	if (magic != LMDB_META_MAGIC)
		return "lacks LMDB's magic number";
	if (version != LMDB_DATA_VERSION)
		return "has another LMDB data version than 1";
	if (first && (psize < LMDB_PSIZE_MIN || psize > LMDB_PSIZE_MAX || (psize & (psize - 1))))
		return "names no valid page size";
	out->psize = psize;
	if (out->last_pg < 1)
		return "names fewer pages than the two meta pages";
	return NULL;
}

/*
 * Read data.mdb's two meta pages from fd (size bytes) as LMDB will: page
 * 0, then page 1 at the page size page 0 names, and the one of the newer
 * commit counts. On return, *have is the pages the file holds and *need
 * the pages that meta page names; *psize the page size. 0, or -EUCLEAN
 * with what is wrong in why.
 */
static int read_data_meta(int fd, uint64_t size, uint64_t *have, uint64_t *need, uint32_t *psize,
			  char *why, size_t whylen)
{
	unsigned char p[LMDB_META_END];
	struct lmdb_meta meta[2];
	const char *bad;

	for (int i = 0; i < 2; i++) {
		off_t off = i ? (off_t)meta[0].psize : 0;
		ssize_t n = pread(fd, p, sizeof(p), off);

		if (n != (ssize_t)sizeof(p)) {
			snprintf(why, whylen,
				 "it is %llu bytes, too short for LMDB's two meta pages: "
				 "it was cut short",
				 (unsigned long long)size);
			return n < 0 ? -errno : -EUCLEAN;
		}
		bad = lmdb_meta_parse(p, i == 0, &meta[i]);
		if (bad) {
			snprintf(why, whylen, "its meta page %d %s", i, bad);
			return -EUCLEAN;
		}
		meta[i].psize = meta[0].psize;
	}
	*psize = meta[0].psize;
	*have = size / *psize;
	*need = (meta[1].txnid > meta[0].txnid ? meta[1].last_pg : meta[0].last_pg) + 1;
	if (*have < 2) {
		snprintf(why, whylen,
			 "it is %llu bytes, shorter than its two meta pages of %u bytes: "
			 "it was cut short",
			 (unsigned long long)size, *psize);
		return -EUCLEAN;
	}
	if (*need > META_MAP_SIZE / *psize) {
		snprintf(why, whylen,
			 "its meta page names %llu pages of %u bytes, more than a store holds",
			 (unsigned long long)*need, *psize);
		return -EUCLEAN;
	}
	return 0;
}

/* What a refusal of a damaged data.mdb says to do. */
#define DAMAGED_HINT                                                                               \
	"the store cannot be opened: restore the meta folder from a copy, or move its files away " \
	"to make a new store"

/*
 * Before LMDB maps data.mdb: its meta pages must be LMDB's, and it must
 * hold the pages they name, but for free ones (LMDB leaves free pages at
 * the end of the file unwritten: check_short makes sure of those, once
 * LMDB has opened the file). A missing or empty data.mdb is a new store,
 * unless the durable file records one: then the store was lost or cut
 * short, and making a new one in its place would hide that. 0, or
 * -EUCLEAN with err set.
 */
static int check_data(struct fs_meta *m, char *err, size_t errlen)
{
	unsigned char *rec;
	char why[256];
	struct stat st = {0};
	uint64_t seq, txnid;
	size_t psize;
	uint32_t ps;
	bool created;
	int fd, dfd, ret;

	fd = storedir_open_file(m->dir_fd, META_WHAT, m->dir, DATA_NAME, O_RDONLY, false, &created,
				err, errlen);
	if (fd < 0 && fd != -ENOENT)
		return fd;
	if (fd >= 0 && fstat(fd, &st) < 0) {
		ret = -errno;
		snprintf(err, errlen, "meta folder %s: %s: %s", m->dir, DATA_NAME, strerror(-ret));
		close(fd);
		return ret;
	}
	if (st.st_size > 0) {
		ret = read_data_meta(fd, (uint64_t)st.st_size, &m->have_pages, &m->need_pages, &ps,
				     why, sizeof(why));
		close(fd);
		if (ret < 0)
			snprintf(err, errlen, "meta folder %s: %s is damaged: %s; " DAMAGED_HINT,
				 m->dir, DATA_NAME, why);
		return ret < 0 ? -EUCLEAN : 0;
	}
	if (fd >= 0)
		close(fd);
	ret = meta_durable_open_ro(m, &dfd, err, errlen);
	if (ret || dfd < 0)
		return ret;
	rec = malloc(DURABLE_STRIDE);
	ret = rec ? meta_durable_read(dfd, rec, NULL, &seq, &txnid, &psize, NULL) : -ENOMEM;
	close(dfd);
	if (ret == 0)
		snprintf(err, errlen,
			 "meta folder %s: %s is %s, but %s records commit %llu of a store: "
			 "the store's metadata was lost or cut short, and a new store would "
			 "hide it; restore the meta folder from a copy, or move its files away "
			 "to make a new store (and the tensorfs.dev and tensorfs.slab of its "
			 "nvme folders)",
			 m->dir, DATA_NAME, fd >= 0 ? "empty" : "missing", DURABLE_NAME,
			 (unsigned long long)txnid);
	free(rec);
	if (ret == -ENOENT)
		return 0;
	return ret == 0 ? -EUCLEAN : ret;
}

/*
 * data.mdb holds fewer pages than its meta page names: LMDB leaves free
 * pages at the end unwritten, but a page of the tree past the end would
 * be read as SIGBUS. Every missing page must be in the free list (LMDB's
 * table 0: commit -> count, then page numbers, MDB_ID each, as mdb_stat
 * reads it). 0, or -EUCLEAN with err set.
 */
static int check_short(struct fs_meta *m, char *err, size_t errlen)
{
	uint64_t from = m->have_pages, n = m->need_pages - m->have_pages, nfree = 0;
	unsigned char *seen;
	MDB_cursor *c;
	MDB_txn *txn = NULL;
	MDB_val k, v;
	int rc;

	if (m->need_pages <= m->have_pages)
		return 0;
	seen = calloc((size_t)(n + 7) / 8, 1);
	if (!seen)
		return -ENOMEM;
	meta_guard_hold(seen);
	/* LMDB opens a cursor on the free list in a read-only transaction only. */
	rc = mdb_txn_begin(m->env, NULL, MDB_RDONLY, &txn);
	if (rc == 0) {
		meta_guard_hold(txn);
		rc = mdb_cursor_open(txn, FREE_DBI_ID, &c);
	}
	if (rc == 0) {
		meta_guard_hold(c);
		while ((rc = mdb_cursor_get(c, &k, &v, MDB_NEXT)) == 0) {
			size_t max = v.mv_size / sizeof(size_t), cnt = 0;

			if (max)
				memcpy(&cnt, v.mv_data, sizeof(cnt));
			for (size_t i = 1; i <= cnt && i < max; i++) {
				size_t pg, bit;

				memcpy(&pg, (const unsigned char *)v.mv_data + i * sizeof(pg),
				       sizeof(pg));
				if (pg < from || pg - from >= n)
					continue;
				bit = pg - from;
				if (!(seen[bit / 8] & 1u << bit % 8))
					nfree++;
				seen[bit / 8] |= (unsigned char)(1u << bit % 8);
			}
		}
		meta_guard_release(c);
		mdb_cursor_close(c);
	}
	meta_guard_release(txn);
	if (txn)
		mdb_txn_abort(txn);
	meta_guard_release(seen);
	free(seen);
	if (rc != MDB_NOTFOUND) {
		snprintf(err, errlen,
			 "meta folder %s: %s is damaged: its free list cannot be read: "
			 "%s; " DAMAGED_HINT,
			 m->dir, DATA_NAME, mdb_strerror(rc));
		return -EUCLEAN;
	}
	if (nfree == n)
		return 0;
	snprintf(err, errlen,
		 "meta folder %s: %s is damaged: it holds %llu pages, but its meta page "
		 "names %llu, and %llu of the missing pages are in use: the file was cut "
		 "short; " DAMAGED_HINT,
		 m->dir, DATA_NAME, (unsigned long long)m->have_pages,
		 (unsigned long long)m->need_pages, (unsigned long long)(n - nfree));
	return -EUCLEAN;
}

/*
 * The path LMDB opens: our descriptor of the checked folder, so that a
 * folder above it renamed meanwhile cannot send LMDB elsewhere; the
 * folder's own path only where /proc is not mounted.
 */
static void env_path(const struct fs_meta *m, char *buf, size_t len)
{
	snprintf(buf, len, "/proc/self/fd/%d", m->dir_fd);
	if (access(buf, F_OK) != 0)
		snprintf(buf, len, "%s", m->dir);
}

/* Remove what this open made; store: data.mdb and lock.mdb too. */
static void remove_made(struct fs_meta *m, bool store)
{
	if (m->dir_fd < 0)
		return;
	if (store) {
		/* The durable file first: without data.mdb it says that a store was lost. */
		unlinkat(m->dir_fd, DURABLE_NAME, 0);
		unlinkat(m->dir_fd, DATA_NAME, 0);
		unlinkat(m->dir_fd, LMDB_LOCK_NAME, 0);
		unlinkat(m->dir_fd, SCRATCH_NAME, 0); /* there is no store to say it of */
	}
	if (m->made_lock)
		unlinkat(m->dir_fd, LOCK_NAME, 0);
}

static void make_store_id(char id[40])
{
	unsigned char r[16];
	FILE *f = fopen("/dev/urandom", "r");

	if (!f || fread(r, 1, sizeof(r), f) != sizeof(r)) {
		struct timespec ts;

		clock_gettime(CLOCK_REALTIME, &ts);
		for (int i = 0; i < 16; i++)
			r[i] = (unsigned char)((uint64_t)ts.tv_nsec * 2654435761u >> (i % 8) ^
					       (uint64_t)getpid() >> i);
	}
	if (f)
		fclose(f);
	snprintf(id, 40, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
		 r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10], r[11], r[12],
		 r[13], r[14], r[15]);
}

/* The first 8 bytes of dbi's last key into *last (0: none); 0 or an LMDB error. */
static int last_key(MDB_txn *txn, MDB_dbi dbi, uint64_t *last)
{
	MDB_cursor *c;
	MDB_val k, v;
	int rc = mdb_cursor_open(txn, dbi, &c);

	*last = 0;
	if (rc)
		return rc;
	rc = mdb_cursor_get(c, &k, &v, MDB_LAST);
	if (rc == 0 && k.mv_size >= 8)
		*last = get_be64(k.mv_data);
	mdb_cursor_close(c);
	return rc == MDB_NOTFOUND ? 0 : rc;
}

static int init_root(struct fs_meta *m, MDB_txn *txn, uid_t uid, gid_t gid)
{
	struct meta_inode root = {0};
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	root.mode = S_IFDIR | 0755;
	root.uid = uid;
	root.gid = gid;
	root.nlink = 2;
	root.atime = root.mtime = root.ctime = ts.tv_sec;
	root.atime_ns = root.mtime_ns = root.ctime_ns = (uint32_t)ts.tv_nsec;
	return meta_inode_put(m, txn, META_ROOT_INO, &root);
}

/*
 * The version a store's format record names, or 0 when it has none that
 * reads as one (check_format says what is wrong with it).
 */
static uint32_t format_version(struct fs_meta *m, MDB_txn *txn)
{
	MDB_val k = {6, "format"}, v;
	struct meta_format f;

	if (mdb_get(txn, m->info, &k, &v) || v.mv_size != sizeof(f))
		return 0;
	memcpy(&f, v.mv_data, sizeof(f));
	return f.version;
}

/*
 * The tables. A new store (an empty main tree) gets them all; an existing
 * one must have each, but those a format 1 store may lack (dedup,
 * nblocks), which its upgrade makes. A table missing otherwise is damage,
 * and nothing is made: made afresh, an empty block map read every file as
 * holes, and LMDB, asked to insert a table's name into a main tree of
 * garbage pages, copies a node of garbage size into a page of its own
 * (a heap overflow before any fault that metaguard could refuse).
 */
static int open_dbs(struct fs_meta *m, MDB_txn *txn, char *err, size_t errlen)
{
	struct {
		const char *name;
		MDB_dbi *dbi;
		bool format1_lacks;
	} dbs[] = {{"inode", &m->inode, false},	    {"dirent", &m->dirent, false},
		   {"dircook", &m->dircook, false}, {"bmap", &m->bmap, false},
		   {"block", &m->block, false},	    {"xattr", &m->xattr, false},
		   {"symlink", &m->symlink, false}, {"info", &m->info, false},
		   {"dedup", &m->dedup, true},	    {"nblocks", &m->nblocks, true}};
	MDB_dbi main;
	MDB_stat st;
	uint32_t version = 0;
	bool fresh;
	int rc = mdb_dbi_open(txn, NULL, 0, &main);

	if (rc == 0)
		rc = mdb_stat(txn, main, &st);
	if (rc) {
		snprintf(err, errlen, "meta folder %s: cannot read its main tree: %s", m->dir,
			 mdb_strerror(rc));
		return lmdb_damaged(rc) ? -EUCLEAN : mdb_err(rc);
	}
	fresh = st.ms_entries == 0;
	for (size_t i = 0; i < sizeof(dbs) / sizeof(dbs[0]); i++) {
		bool make = fresh || (dbs[i].format1_lacks && version == 1);

		rc = mdb_dbi_open(txn, dbs[i].name, make ? MDB_CREATE : 0, dbs[i].dbi);
		if (rc == MDB_NOTFOUND) {
			snprintf(
			    err, errlen,
			    "meta folder %s: %s is damaged: its table %s is missing; " DAMAGED_HINT,
			    m->dir, DATA_NAME, dbs[i].name);
			return -EUCLEAN;
		}
		if (rc && lmdb_damaged(rc)) {
			snprintf(err, errlen,
				 "meta folder %s: %s is damaged: its table %s cannot be opened: "
				 "%s; " DAMAGED_HINT,
				 m->dir, DATA_NAME, dbs[i].name, mdb_strerror(rc));
			return -EUCLEAN;
		}
		if (rc) {
			snprintf(err, errlen, "meta folder %s: cannot open its table %s: %s",
				 m->dir, dbs[i].name, mdb_strerror(rc));
			return mdb_err(rc);
		}
		if (dbs[i].dbi == &m->info && !fresh)
			version = format_version(m, txn);
	}
	return 0;
}

/*
 * Format 1 to 2: count each file's mapped blocks into nblocks, in one
 * cursor pass over the block maps (keys sort by inode, then index). Part
 * of meta_open's transaction: a crash leaves the store at format 1.
 */
static int upgrade_v1(struct fs_meta *m, MDB_txn *txn)
{
	MDB_cursor *c;
	MDB_val k, v;
	uint64_t ino = 0, n = 0;
	int rc, ret = 0;

	rc = mdb_cursor_open(txn, m->bmap, &c);
	if (rc)
		return mdb_err(rc);
	rc = mdb_cursor_get(c, &k, &v, MDB_FIRST);
	for (;; rc = mdb_cursor_get(c, &k, &v, MDB_NEXT)) {
		bool more = rc == 0;
		uint64_t owner = more && k.mv_size == 16 ? get_be64(k.mv_data) : 0;

		if (more && k.mv_size != 16)
			continue; /* a damaged key is fsck's to report */
		if (n && (!more || owner != ino)) {
			unsigned char kb[8];
			MDB_val nk = {8, kb}, nv = {sizeof(n), &n};

			put_be64(kb, ino);
			ret = mdb_err(mdb_put(txn, m->nblocks, &nk, &nv, 0));
			if (ret)
				break;
			n = 0;
		}
		if (!more)
			break;
		ino = owner;
		n++;
	}
	mdb_cursor_close(c);
	if (ret)
		return ret;
	return rc == MDB_NOTFOUND ? 0 : mdb_err(rc);
}

/* Read the format record, or write it for a new store. */
static int check_format(struct fs_meta *m, MDB_txn *txn, size_t *block_size, bool block_given,
			uid_t uid, gid_t gid, char store_id[40], char *err, size_t errlen)
{
	MDB_val k = {6, "format"}, v;
	struct meta_format f;
	unsigned char id[STORE_ID_BYTES];
	const char *bad;
	int rc = mdb_get(txn, m->info, &k, &v);

	if (rc == MDB_NOTFOUND) {
		memset(&f, 0, sizeof(f));
		f.version = META_FORMAT_VERSION;
		f.block_size = *block_size ? *block_size : META_BLOCK_DEFAULT;
		*block_size = f.block_size;
		if (m->emptied)
			memcpy(f.store_id, m->last_store, STORE_ID_LEN); /* its devices name it */
		else
			make_store_id(f.store_id);
		v.mv_size = sizeof(f);
		v.mv_data = &f;
		rc = mdb_put(txn, m->info, &k, &v, 0);
		if (rc == 0)
			rc = init_root(m, txn, uid, gid);
		if (rc) {
			snprintf(err, errlen, "cannot initialise the metadata store: %s",
				 mdb_strerror(rc));
			return mdb_err(rc);
		}
		memcpy(store_id, f.store_id, 40);
		m->created = true;
		return 0;
	}
	if (rc || v.mv_size != sizeof(f)) {
		snprintf(err, errlen, "meta folder %s: the store has no valid format record; %s",
			 m->dir, DAMAGED_HINT);
		return -EUCLEAN;
	}
	memcpy(&f, v.mv_data, sizeof(f));
	/* Garbage there would size every buffer and name every device folder: refused. */
	f.store_id[39] = 0;
	bad = !meta_store_id_bytes(f.store_id, id)		 ? "its store id"
	      : f.version == 0 || f.version > FORMAT_VERSION_MAX ? "its version"
	      : f.block_size < META_BLOCK_MIN || f.block_size > META_BLOCK_MAX ||
		      (f.block_size & (f.block_size - 1))
		  ? "its block size"
		  : NULL;
	if (bad) {
		snprintf(err, errlen,
			 "meta folder %s: the store's format record is damaged (%s); " DAMAGED_HINT,
			 m->dir, bad);
		return -EUCLEAN;
	}
	/*
	 * Format 2 to 3 changes no record: a block record without a length
	 * stores the whole block (meta_block.len 0). Format 3 only keeps
	 * older versions, which would read a short block whole, out.
	 */
	if (f.version == 1 || f.version == 2) {
		unsigned from = f.version;

		rc = from == 1 ? upgrade_v1(m, txn) : 0;
		if (rc == 0) {
			f.version = META_FORMAT_VERSION;
			v.mv_size = sizeof(f);
			v.mv_data = &f;
			rc = mdb_err(mdb_put(txn, m->info, &k, &v, 0));
		}
		if (rc) {
			snprintf(err, errlen,
				 "cannot upgrade the metadata store from format %u: %s", from,
				 strerror(-rc));
			return rc;
		}
		m->upgraded_from = from;
	}
	if (f.version != META_FORMAT_VERSION) {
		snprintf(err, errlen,
			 "metadata store has format %u; this tensorfs reads formats 1 to %u (a "
			 "newer tensorfs made it)",
			 f.version, META_FORMAT_VERSION);
		return -EINVAL;
	}
	if (block_given && f.block_size != *block_size) {
		snprintf(err, errlen,
			 "block=%zuK differs from the store's block size %lluK; the block size is "
			 "fixed when a store is created",
			 *block_size >> 10, (unsigned long long)f.block_size >> 10);
		return -EINVAL;
	}
	*block_size = f.block_size;
	memcpy(store_id, f.store_id, 40);
	return 0;
}

/*
 * LMDB found its pages inconsistent and would abort: metaguard.h says what
 * happens instead. The store's folder: its fs_meta's (the environment's
 * user context, meta_open's), else the path LMDB was given.
 */
static void lmdb_check_failed(MDB_env *env, const char *msg)
{
	const struct fs_meta *m = mdb_env_get_userctx(env);
	const char *path = NULL;

	if (!m && mdb_env_get_path(env, &path) != 0)
		path = NULL;
	meta_guard_check(m ? m->dir : path, msg);
}

/*
 * Create and open an LMDB environment. An address-space limit (ulimit -v,
 * as batch schedulers set it, or valgrind's) may refuse a map as large as
 * META_MAP_SIZE: take less, down to a floor. 0 or an LMDB error.
 */
static int env_open(MDB_env **env, const char *path, unsigned flags)
{
	int rc;

	for (uint64_t map = META_MAP_SIZE;; map /= 2) {
		rc = mdb_env_create(env);
		if (!rc)
			rc = mdb_env_set_assert(*env, lmdb_check_failed);
		if (!rc)
			rc = mdb_env_set_maxdbs(*env, META_MAX_DBS);
		if (!rc)
			rc = mdb_env_set_mapsize(*env, map);
		if (!rc)
			rc = mdb_env_open(*env, path, flags, 0600);
		if (!rc || (rc != ENOMEM && rc != EINVAL) || map / 2 < META_MAP_MIN)
			break;
		mdb_env_close(*env);
		*env = NULL;
	}
	return rc;
}

/*
 * LMDB's map of the store, watched for faults (metaguard.h). Where it
 * cannot be found (no /proc), the store goes unwatched, as before.
 */
static void watch_map(struct fs_meta *m)
{
	struct stat st;
	MDB_stat ms;
	int ret = -ENOENT;

	if (fstatat(m->dir_fd, DATA_NAME, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
	    mdb_env_stat(m->env, &ms) == 0)
		ret = meta_guard_add(st.st_dev, st.st_ino, ms.ms_psize, m->dir, &m->map);
	if (ret < 0)
		log_warn("meta folder %s: cannot find LMDB's map of %s (%s): a damaged store "
			 "would crash this process rather than be refused",
			 m->dir, DATA_NAME, strerror(-ret));
}

/* fn(arg), with a fault in the store's map said in err as the damage it is. */
static int guarded(struct fs_meta *m, int (*fn)(void *), void *arg, char *err, size_t errlen)
{
	struct meta_fault fault;
	int ret = meta_guard_run(fn, arg, &fault);

	if (fault.kind != META_FAULT_NONE)
		__atomic_store_n(&m->damaged, true, __ATOMIC_RELEASE);
	if (fault.kind == META_FAULT_CHECK)
		snprintf(err, errlen,
			 "meta folder %s: %s is damaged: LMDB found its pages inconsistent "
			 "(%s); " DAMAGED_HINT,
			 m->dir, DATA_NAME, fault.check);
	else if (fault.kind == META_FAULT_MAP)
		snprintf(err, errlen,
			 "meta folder %s: %s is damaged: reading its page %llu failed "
			 "(%s); " DAMAGED_HINT,
			 m->dir, DATA_NAME, fault.page,
			 fault.page >= m->have_pages ? "it is past the end of the file"
						     : "a bad address");
	else if (fault.kind == META_FAULT_CODE)
		snprintf(err, errlen,
			 "meta folder %s: %s is damaged: LMDB faulted reading it (address "
			 "%p); " DAMAGED_HINT,
			 m->dir, DATA_NAME, fault.addr);
	return ret;
}

int meta_guarded(struct fs_meta *m, int (*fn)(void *), void *arg, char *err, size_t errlen)
{
	return guarded(m, fn, arg, err, errlen);
}

const char *meta_strerror(int ret)
{
	static __thread char buf[160];

	if (ret == -EUCLEAN || lmdb_damaged(ret)) {
		snprintf(buf, sizeof(buf), "%s is damaged (%s)", DATA_NAME,
			 ret == -EUCLEAN ? strerror(EUCLEAN) : mdb_strerror(ret));
		return buf;
	}
	return ret <= MDB_KEYEXIST && ret >= MDB_LAST_ERRCODE ? mdb_strerror(ret)
							      : strerror(ret < 0 ? -ret : ret);
}

struct open_args {
	struct fs_meta *m;
	size_t *block_size;
	bool block_given;
	uid_t uid;
	gid_t gid;
	char *err;
	size_t errlen;
};

/*
 * meta_open's reading of the tree, with faults in the map guarded: the
 * pages a short file lacks, the tables, the format record, the last keys.
 */
static int open_tree(void *arg)
{
	struct open_args *a = arg;
	struct fs_meta *m = a->m;
	MDB_txn *txn;
	int rc, ret;

	ret = check_short(m, a->err, a->errlen);
	if (ret < 0)
		return ret;
	rc = mdb_txn_begin(m->env, NULL, 0, &txn);
	if (rc) {
		snprintf(a->err, a->errlen, "meta folder %s: %s", m->dir, mdb_strerror(rc));
		return mdb_err(rc);
	}
	ret = open_dbs(m, txn, a->err, a->errlen);
	if (ret == 0)
		ret = check_format(m, txn, a->block_size, a->block_given, a->uid, a->gid,
				   m->store_id, a->err, a->errlen);
	if (ret < 0) {
		if (!a->err[0])
			snprintf(a->err, a->errlen, "meta folder %s: %s", m->dir, strerror(-ret));
		mdb_txn_abort(txn);
		return ret;
	}
	rc = last_key(txn, m->inode, &m->next_ino);
	if (rc == 0)
		rc = last_key(txn, m->block, &m->next_block);
	if (rc) {
		mdb_txn_abort(txn);
	} else {
		m->next_ino++;
		m->next_block++;
		rc = mdb_txn_commit(txn);
	}
	if (rc && lmdb_damaged(rc)) {
		snprintf(a->err, a->errlen, "meta folder %s: %s is damaged: %s; " DAMAGED_HINT,
			 m->dir, DATA_NAME, mdb_strerror(rc));
		return -EUCLEAN;
	}
	if (rc) {
		snprintf(a->err, a->errlen, "meta folder %s: %s", m->dir, mdb_strerror(rc));
		return mdb_err(rc);
	}
	return 0;
}

int meta_open(struct fs_meta **out, const char *dir, size_t *block_size, bool block_given,
	      bool scratch, uid_t root_uid, gid_t root_gid, char store_id[40], char *err,
	      size_t errlen)
{
	struct fs_meta *m = calloc(1, sizeof(*m));
	char path[64 + sizeof(m->dir)];
	struct stat st;
	bool had_data = true;
	int rc, ret;

	if (!m)
		return -ENOMEM;
	m->lock_fd = -1;
	m->dir_fd = -1;
	m->data_fd = -1;
	m->durable_fd = -1;
	pthread_mutex_init(&m->sync_lock, NULL);
	meta_read_boot_id(m->boot);
	snprintf(m->dir, sizeof(m->dir), "%s", dir);
	ret = m->dir_fd = storedir_open(META_WHAT, dir, true, &m->made_dir, err, errlen);
	for (size_t i = 0; ret >= 0 && meta_files[i]; i++)
		ret = storedir_check_file(m->dir_fd, META_WHAT, dir, meta_files[i], err, errlen);
	if (ret < 0)
		goto fail;
	m->scratch = scratch;
	ret = meta_take_lock(m, dir, err, errlen);
	if (ret == 0)
		ret = meta_scratch_open(m, err, errlen);
	if (ret == 0 && !m->emptied)
		ret = meta_roll_back(m, err, errlen);
	if (ret == 0)
		ret = meta_write_lock(m);
	if (ret < 0)
		goto fail;
	/* An emptied store's devices are its own still: a failed start leaves its files. */
	had_data = m->emptied || fstatat(m->dir_fd, DATA_NAME, &st, AT_SYMLINK_NOFOLLOW) == 0 ||
		   fstatat(m->dir_fd, DURABLE_NAME, &st, AT_SYMLINK_NOFOLLOW) == 0;
	ret = check_data(m, err, errlen);
	if (ret < 0)
		goto fail;
	env_path(m, path, sizeof(path));
	rc = env_open(&m->env, path, MDB_NOSYNC | MDB_NOTLS);
	if (rc) {
		snprintf(err, errlen, "meta folder %s: cannot open the metadata store: %s", dir,
			 mdb_strerror(rc));
		ret = mdb_err(rc);
		goto fail;
	}
	mdb_env_set_userctx(m->env, m); /* meta_commit finds its store by its environment */
	/* Reader slots of a killed daemon would pin old pages forever. */
	int dead = 0;
	mdb_reader_check(m->env, &dead);
	watch_map(m);
	ret = meta_open_durable(m, err, errlen);
	if (ret < 0)
		goto fail;
	struct open_args a = {m, block_size, block_given, root_uid, root_gid, err, errlen};

	ret = guarded(m, open_tree, &a, err, errlen);
	if (ret < 0)
		goto fail;
	memcpy(store_id, m->store_id, sizeof(m->store_id));
	if (strcmp(m->store_id, m->last_store) != 0)
		ret = meta_write_lock(m); /* now naming this store */
	if (ret < 0) {
		snprintf(err, errlen, "meta folder %s: cannot write %s: %s", dir, LOCK_NAME,
			 strerror(-ret));
		goto fail;
	}
	ret = meta_sync(m, NULL, NULL, true);
	if (ret < 0) {
		snprintf(err, errlen, "meta folder %s: cannot make the store durable: %s", dir,
			 strerror(-ret));
		goto fail;
	}
	m->opened = true;
	*out = m;
	return 0;
fail:
	/* A store this open was making goes: a later start makes it afresh. */
	remove_made(m, m->locked && !had_data);
	if (m->made_dir)
		rmdir(m->dir); /* only if we left it empty */
	meta_close(m);
	return ret;
}

/*
 * An environment whose transaction a fault abandoned is not closed: its
 * write transaction's cursors hang off it, and closing it would free the
 * transaction under them. It stays, reachable from here, until the
 * process ends, which is soon: the store was refused.
 */
static void abandon_env(MDB_env *env)
{
	static MDB_env *abandoned[GUARD_ENVS];
	static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

	pthread_mutex_lock(&lock);
	for (int i = 0; i < GUARD_ENVS; i++) {
		if (!abandoned[i]) {
			abandoned[i] = env;
			env = NULL;
			break;
		}
	}
	pthread_mutex_unlock(&lock);
	if (env)
		mdb_env_close(env); /* a ninth in one process: closed after all */
}

void meta_close(struct fs_meta *m)
{
	if (!m)
		return;
	if (m->env) {
		/*
		 * A clean stop's last state is recorded too, before the lock file
		 * says clean. After a fault in the map nothing more is asked of
		 * LMDB: the faulted transaction was abandoned where it was.
		 */
		if (m->opened && !m->damaged)
			meta_sync(m, NULL, NULL, true);
		else if (!m->damaged)
			mdb_env_sync(m->env, 1);
		if (m->pinned)
			mdb_txn_abort(m->pinned);
		meta_guard_remove(m->map);
		if (m->damaged)
			abandon_env(m->env);
		else
			mdb_env_close(m->env);
	}
	if (m->data_fd >= 0)
		close(m->data_fd);
	if (m->durable_fd >= 0)
		close(m->durable_fd);
	free(m->page);
	pthread_mutex_destroy(&m->sync_lock);
	if (m->lock_fd >= 0) {
		if (m->lock_written && !m->keep_note && ftruncate(m->lock_fd, 0) < 0) {
			/* the lock goes with the fd; a stale pid in the file is harmless */
		}
		close(m->lock_fd);
	}
	if (m->dir_fd >= 0)
		close(m->dir_fd);
	free(m);
}

bool meta_is_new(const struct fs_meta *m)
{
	return m->created && !m->emptied;
}

unsigned meta_upgraded_from(const struct fs_meta *m)
{
	return m->upgraded_from;
}

void meta_discard(struct fs_meta *m)
{
	if (!m)
		return;
	m->made_lock = true; /* the whole store goes, its lock file too */
	m->opened = false;   /* nothing of it stays to record */
	remove_made(m, true);
	/* A folder that was there stays: it may be where a drive mounts. */
	if (m->made_dir)
		rmdir(m->dir); /* only if we left it empty */
	meta_close(m);
}

uint64_t meta_last_commit(struct fs_meta *m)
{
	MDB_envinfo info;

	return mdb_env_info(m->env, &info) == 0 ? info.me_last_txnid : 0;
}

/* fs_monotonic_ms's clock; the metadata part keeps to itself (fsck, tfsctl). */
static uint64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/*
 * A write transaction's end: ret 0 (it committed) or -errno (it could not
 * begin, or commit), for meta_failing. Kept without a lock: the health it
 * feeds may read an error and a time of two failures in a row.
 */
static int note_write(struct fs_meta *m, int ret)
{
	if (!m)
		return ret;
	if (ret == 0) {
		if (__atomic_load_n(&m->fail_err, __ATOMIC_RELAXED))
			__atomic_store_n(&m->fail_err, 0, __ATOMIC_RELAXED);
		return 0;
	}
	uint64_t now = mono_ms();

	if (!__atomic_load_n(&m->fail_err, __ATOMIC_RELAXED))
		__atomic_store_n(&m->fail_ms, now, __ATOMIC_RELAXED);
	__atomic_store_n(&m->fail_last_ms, now, __ATOMIC_RELAXED);
	__atomic_store_n(&m->fail_err, ret, __ATOMIC_RELAXED);
	return ret;
}

int meta_failing(struct fs_meta *m, uint64_t within_ms, uint64_t *for_ms)
{
	int err = __atomic_load_n(&m->fail_err, __ATOMIC_RELAXED);
	uint64_t since = __atomic_load_n(&m->fail_ms, __ATOMIC_RELAXED);
	uint64_t last = __atomic_load_n(&m->fail_last_ms, __ATOMIC_RELAXED), now = mono_ms();

	if (!err || now - last > within_ms)
		err = 0;
	*for_ms = err && now > since ? now - since : 0;
	return err;
}

int meta_begin(struct fs_meta *m, bool write, MDB_txn **txn)
{
	int ret;

	if (__atomic_load_n(&m->damaged, __ATOMIC_ACQUIRE))
		return -EUCLEAN; /* a faulted transaction may hold LMDB's writer lock */
	ret = mdb_err(mdb_txn_begin(m->env, NULL, write ? 0 : MDB_RDONLY, txn));
	return write && ret ? note_write(m, ret) : ret;
}

void meta_on_commit(struct fs_meta *m, void (*fn)(void *arg, bool urgent), void *arg)
{
	m->on_commit = fn;
	m->on_commit_arg = arg;
}

/*
 * Whether the filesystem that holds env has no room left to speak of: LMDB
 * answers a short write with EIO ("short write, filesystem full?"), and a
 * full filesystem makes short writes.
 */
#define META_FULL_BYTES (1 << 20)
static bool env_fs_full(MDB_env *env)
{
	struct statvfs vfs;
	mdb_filehandle_t fd;

	return mdb_env_get_fd(env, &fd) == 0 && fstatvfs(fd, &vfs) == 0 &&
	       (uint64_t)vfs.f_bavail * vfs.f_frsize < META_FULL_BYTES;
}

int meta_commit(MDB_txn *txn)
{
	MDB_env *env = mdb_txn_env(txn);
	struct fs_meta *m = mdb_env_get_userctx(env);
	int rc = mdb_txn_commit(txn);

	if (rc == 0 && m && m->on_commit) {
		uint64_t limit = __atomic_load_n(&m->grow_limit, __ATOMIC_RELAXED);
		MDB_envinfo info;

		m->on_commit(m->on_commit_arg,
			     limit && mdb_env_info(env, &info) == 0 && info.me_last_pgno > limit);
	}
	if (rc == EIO && env_fs_full(env))
		rc = ENOSPC; /* the writer learns the disk is full, not failing */
	return note_write(m, mdb_err(rc));
}

void meta_abort(MDB_txn *txn)
{
	mdb_txn_abort(txn);
}

uint64_t meta_new_ino(struct fs_meta *m)
{
	return __atomic_fetch_add(&m->next_ino, 1, __ATOMIC_RELAXED);
}

struct exists_args {
	MDB_env *env;
	bool found;
};

static int find_format(void *arg)
{
	struct exists_args *a = arg;
	MDB_val k = {6, "format"}, v;
	MDB_txn *txn;
	MDB_dbi dbi;

	int rc = mdb_txn_begin(a->env, NULL, MDB_RDONLY, &txn);

	if (rc == 0) {
		meta_guard_hold(txn);
		rc = mdb_dbi_open(txn, "info", 0, &dbi);
		if (rc == 0)
			rc = mdb_get(txn, dbi, &k, &v);
		meta_guard_release(txn);
		mdb_txn_abort(txn);
	}
	a->found = rc == 0 || lmdb_damaged(rc); /* damaged: meta_open says how */
	return 0;
}

bool meta_store_exists(const char *dir)
{
	char path[4200], err[1024], why[256];
	struct exists_args a = {NULL, false};
	struct stat st;
	uint64_t have, need;
	uint32_t psize;
	const void *map;
	int fd, ret;

	/* LMDB would open its files through links: a folder others can change is none of ours. */
	if (meta_check_folder(dir, err, sizeof(err)) < 0)
		return false;
	snprintf(path, sizeof(path), "%s/%s", dir, DURABLE_NAME);
	if (stat(path, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0)
		return true; /* data.mdb was there once: meta_open says if it is gone */
	snprintf(path, sizeof(path), "%s/%s", dir, DATA_NAME);
	fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0)
		return false;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size == 0) {
		close(fd);
		return false;
	}
	/* Damaged, or short by pages LMDB would map: a store, which meta_open refuses or checks. */
	ret = read_data_meta(fd, (uint64_t)st.st_size, &have, &need, &psize, why, sizeof(why));
	close(fd);
	if (ret < 0 || need > have)
		return true;
	/* Read-only, beside a daemon if there is one: a format record makes a store. */
	if (env_open(&a.env, dir, MDB_RDONLY | MDB_NOTLS) != 0) {
		if (a.env)
			mdb_env_close(a.env);
		return false;
	}
	if (meta_guard_add(st.st_dev, st.st_ino, psize, dir, &map) == 0) {
		if (meta_guard_run(find_format, &a, NULL) == -EUCLEAN)
			a.found = true; /* damaged: meta_open says how */
		meta_guard_remove(map);
	}
	mdb_env_close(a.env);
	return a.found;
}

/* ---- the devices the store has used ---- */

int meta_devices_get(struct fs_meta *m, char bind[][META_BIND_LEN], unsigned max, unsigned *n)
{
	MDB_val k = {sizeof(DEVICES_KEY) - 1, DEVICES_KEY}, v;
	MDB_txn *txn;
	int ret = mdb_err(mdb_txn_begin(m->env, NULL, MDB_RDONLY, &txn));

	*n = 0;
	if (ret)
		return ret;
	ret = mdb_err(mdb_get(txn, m->info, &k, &v));
	if (ret == 0) {
		size_t cnt = v.mv_size / META_BIND_LEN;
		const char *p = v.mv_data;
		bool ok = v.mv_size % META_BIND_LEN == 0 && cnt <= max;

		for (size_t i = 0; ok && i < cnt; i++)
			ok = memchr(p + i * META_BIND_LEN, 0, META_BIND_LEN) != NULL;
		if (ok) {
			memcpy(bind, p, cnt * META_BIND_LEN);
			*n = (unsigned)cnt;
		} else {
			log_warn(
			    "meta folder %s: the record of the store's devices is damaged (%zu "
			    "bytes): each device is checked by its identity and its blocks only, "
			    "and the record is written again",
			    m->dir, v.mv_size);
		}
	}
	mdb_txn_abort(txn);
	return ret == -ENOENT ? 0 : ret;
}

int meta_devices_put(struct fs_meta *m, char bind[][META_BIND_LEN], unsigned n)
{
	MDB_val k = {sizeof(DEVICES_KEY) - 1, DEVICES_KEY}, v = {(size_t)n * META_BIND_LEN, bind};
	MDB_txn *txn;
	int ret = mdb_err(mdb_txn_begin(m->env, NULL, 0, &txn));

	if (ret)
		return ret;
	ret = mdb_err(mdb_put(txn, m->info, &k, &v, 0));
	if (ret) {
		mdb_txn_abort(txn);
		return ret;
	}
	return mdb_err(mdb_txn_commit(txn));
}

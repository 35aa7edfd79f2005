/*
 * Unit test of the metadata store: names and readdir order, block maps
 * with shared blocks and reference counts, xattrs, symlinks, orphans, the
 * store's lock and its fixed block size, and persistence across reopen;
 * block-map walks over a 2^63-byte sparse file that cost what it stores;
 * each file's count of mapped blocks through every change of its map, and
 * the upgrade of a format 1 store, which had none; blocks' stored
 * lengths, and the upgrade of a format 2 store, which had none;
 * which commit a sync point records when commits come in during its
 * device flush; what the lock file says of the store's holder; and a
 * store that lost a table, refused and left as it was.
 */
#include "meta.h"
#include "tb.h"
#include "test.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

static struct fs_meta *open_store(const char *dir, size_t bs, bool given, int expect)
{
	struct fs_meta *m = NULL;
	char id[40], err[512] = "";
	size_t b = bs;
	int ret = meta_open(&m, dir, &b, given, false, 0, 0, id, err, sizeof(err));

	if (ret != expect) {
		fprintf(stderr, "meta_open: %d (%s), expected %d\n", ret, err, expect);
		exit(1);
	}
	return m;
}

struct names {
	char seen[64][32];
	uint64_t cookies[64];
	int n;
};

static int collect(void *arg, const char *name, size_t len, uint64_t ino, uint64_t cookie)
{
	struct names *x = arg;

	(void)len;
	(void)ino;
	snprintf(x->seen[x->n], sizeof(x->seen[0]), "%s", name);
	x->cookies[x->n++] = cookie;
	return 0;
}

static bool has_loc(const struct locvec *v, uint64_t loc)
{
	for (size_t i = 0; i < v->n; i++)
		if (v->v[i] == loc)
			return true;
	return false;
}

struct idxs {
	uint64_t v[8];
	int n, stop_at;
};

static int collect_idx(void *arg, uint64_t idx, uint64_t id)
{
	struct idxs *x = arg;

	(void)id;
	x->v[x->n++] = idx;
	return x->n == x->stop_at ? 7 : 0;
}

/*
 * Block maps of a sparse file as long as a file can be: next, walk, list,
 * count and share visit only the blocks stored, so each call is quick
 * whatever the range. (Share used to step through every index of its range.)
 */
static void check_sparse_maps(struct fs_meta *m)
{
	const uint64_t far = (1ULL << 43) - 1; /* the last block of a 2^63-byte file */
	const uint64_t dbase = 1ULL << 44;
	struct locvec freed = {0};
	struct idxs got = {0};
	struct meta_block b;
	uint64_t f3, f4, idx, id, count;
	MDB_txn *txn;

	alarm(20); /* a walk over the range's length would take hours */
	CHECK_EQ(meta_begin(m, true, &txn), 0);
	f3 = meta_new_ino(m);
	f4 = meta_new_ino(m);
	CHECK_EQ(meta_bmap_store(m, txn, f3, 0, tb_loc(0, 100), 0, NULL, false, &freed), 0);
	CHECK_EQ(meta_bmap_store(m, txn, f3, 7, tb_loc(0, 107), 0, NULL, false, &freed), 0);
	CHECK_EQ(meta_bmap_store(m, txn, f3, far, tb_loc(0, 199), 0, NULL, false, &freed), 0);
	/* f4 maps one block inside the range it will share into, one outside. */
	CHECK_EQ(meta_bmap_store(m, txn, f4, 3, tb_loc(0, 203), 0, NULL, false, &freed), 0);
	CHECK_EQ(meta_bmap_store(m, txn, f4, dbase + 5, tb_loc(0, 205), 0, NULL, false, &freed), 0);

	CHECK_EQ(meta_bmap_next(m, txn, f3, 0, UINT64_MAX, &idx, &id), 0);
	CHECK_EQ(idx, 0);
	CHECK_EQ(meta_bmap_next(m, txn, f3, 1, UINT64_MAX, &idx, &id), 0);
	CHECK_EQ(idx, 7);
	CHECK_EQ(meta_bmap_next(m, txn, f3, 8, far + 1, &idx, &id), 0);
	CHECK_EQ(idx, far);
	CHECK_EQ(meta_bmap_next(m, txn, f3, 8, far, &idx, &id), -ENOENT);
	CHECK_EQ(meta_bmap_next(m, txn, f3, far + 1, UINT64_MAX, &idx, &id), -ENOENT);
	CHECK_EQ(meta_bmap_next(m, txn, f3, 5, 5, &idx, &id), -ENOENT);

	CHECK_EQ(meta_bmap_walk(m, txn, f3, 0, far + 1, collect_idx, &got), 0);
	CHECK_EQ(got.n, 3);
	CHECK(got.v[0] == 0 && got.v[1] == 7 && got.v[2] == far);
	got.n = 0;
	got.stop_at = 2; /* fn's non-zero stops the walk and is returned */
	CHECK_EQ(meta_bmap_walk(m, txn, f3, 0, UINT64_MAX, collect_idx, &got), 7);
	CHECK_EQ(got.n, 2);
	CHECK_EQ(meta_bmap_count(m, txn, f3, 0, far + 1, &count), 0);
	CHECK_EQ(count, 3);

	/* Share all 2^43 blocks of f3 into f4 at dbase: holes clear f4's block there. */
	CHECK_EQ(meta_bmap_share(m, txn, f3, 0, f4, dbase, far + 1, &freed), 0);
	CHECK_EQ(freed.n, 1);
	CHECK(has_loc(&freed, tb_loc(0, 205)));
	CHECK_EQ(meta_bmap_get(m, txn, f4, dbase + 5, &id), -ENOENT);
	CHECK_EQ(meta_bmap_get(m, txn, f4, 3, &id), 0);
	CHECK_EQ(meta_bmap_count(m, txn, f4, 0, UINT64_MAX, &count), 0);
	CHECK_EQ(count, 4);
	CHECK_EQ(meta_bmap_get(m, txn, f4, dbase + far, &id), 0);
	CHECK_EQ(meta_block_get(m, txn, id, &b), 0);
	CHECK_EQ(b.refs, 2);
	CHECK_EQ(b.loc, tb_loc(0, 199));
	CHECK_EQ(meta_commit(txn), 0);

	/* Listing in steps, each in a transaction of its own. */
	uint64_t list[2];
	unsigned n;
	CHECK_EQ(meta_bmap_list(m, f3, 0, far + 1, list, 2, &n), 0);
	CHECK_EQ(n, 2);
	CHECK(list[0] == 0 && list[1] == 7);
	CHECK_EQ(meta_bmap_list(m, f3, list[1] + 1, far + 1, list, 2, &n), 0);
	CHECK_EQ(n, 1);
	CHECK_EQ(list[0], far);
	CHECK_EQ(meta_bmap_list(m, f3, far + 1, UINT64_MAX, list, 2, &n), 0);
	CHECK_EQ(n, 0);
	meta_locvec_free(&freed);
	alarm(0);
}

static uint64_t nblocks(struct fs_meta *m, MDB_txn *txn, uint64_t ino)
{
	uint64_t n = UINT64_MAX;

	CHECK_EQ(meta_inode_blocks(m, txn, ino, &n), 0);
	return n;
}

/* The closed store in dir, opened with LMDB alone (flags: MDB_RDONLY or 0). */
static MDB_env *open_env(const char *dir, unsigned flags)
{
	MDB_env *env;

	CHECK_EQ(mdb_env_create(&env), 0);
	CHECK_EQ(mdb_env_set_maxdbs(env, 16), 0);
	CHECK_EQ(mdb_env_set_mapsize(env, 1ULL << 30), 0);
	CHECK_EQ(mdb_env_open(env, dir, flags, 0600), 0);
	return env;
}

/*
 * Make the closed store in dir what an older format was: 1 kept no block
 * counts, and 1 and 2 no stored length in block records.
 */
static void make_format(const char *dir, uint32_t version)
{
	MDB_env *env;
	MDB_txn *txn;
	MDB_cursor *cur;
	MDB_dbi info, counts, blocks;
	MDB_val k = {6, "format"}, v;
	unsigned char f[64];
	int rc;

	env = open_env(dir, 0);
	CHECK_EQ(mdb_txn_begin(env, NULL, 0, &txn), 0);
	CHECK_EQ(mdb_dbi_open(txn, "info", 0, &info), 0);
	CHECK_EQ(mdb_get(txn, info, &k, &v), 0);
	CHECK(v.mv_size <= sizeof(f));
	memcpy(f, v.mv_data, v.mv_size);
	memcpy(f, &version, sizeof(version)); /* the version comes first */
	v.mv_data = f;
	CHECK_EQ(mdb_put(txn, info, &k, &v, 0), 0);
	if (version == 1) {
		CHECK_EQ(mdb_dbi_open(txn, "nblocks", 0, &counts), 0);
		CHECK_EQ(mdb_drop(txn, counts, 1), 0);
	}
	/* Block records end after the hash. */
	CHECK_EQ(mdb_dbi_open(txn, "block", 0, &blocks), 0);
	CHECK_EQ(mdb_cursor_open(txn, blocks, &cur), 0);
	for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;
	     rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
		struct meta_block b;

		CHECK_EQ(v.mv_size, sizeof(b));
		memcpy(&b, v.mv_data, sizeof(b));
		v.mv_size = offsetof(struct meta_block, len);
		v.mv_data = &b;
		CHECK_EQ(mdb_cursor_put(cur, &k, &v, MDB_CURRENT), 0);
	}
	CHECK_EQ(rc, MDB_NOTFOUND);
	mdb_cursor_close(cur);
	CHECK_EQ(mdb_txn_commit(txn), 0);
	mdb_env_close(env);
}

/* The upgraded store in dir opens again with nothing to upgrade; then it goes. */
static void upgraded_once(const char *dir)
{
	struct fs_meta *m = open_store(dir, 0, false, 0);
	char cmd[128];

	CHECK_EQ(meta_upgraded_from(m), 0);
	meta_close(m);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	CHECK_EQ(system(cmd), 0);
}

/*
 * A block's stored length goes with its record, to a file sharing it by
 * dedup too; a record from format 2, which had none, stores the whole
 * block (0), and the store opens as format 3.
 */
/*
 * Commit txn and close m; make its store format version, as an older tensorfs
 * left it; open it again, which must upgrade it, and begin a read in *rtxn.
 */
static struct fs_meta *reopen_as(struct fs_meta *m, MDB_txn *txn, const char *dir, uint32_t version,
				 MDB_txn **rtxn)
{
	CHECK_EQ(meta_commit(txn), 0);
	meta_close(m);
	make_format(dir, version);
	m = open_store(dir, 0, false, 0);
	CHECK_EQ(meta_upgraded_from(m), version);
	CHECK_EQ(meta_begin(m, false, rtxn), 0);
	return m;
}

static void check_lengths(void)
{
	char dir[] = "/tmp/tfs-meta-lengths.XXXXXX";
	struct meta_inode rec = {.mode = S_IFREG | 0644, .nlink = 1};
	struct locvec freed = {0};
	struct meta_block blk;
	struct fs_meta *m;
	MDB_txn *txn;
	uint64_t a, id, found, ids[2];
	uint8_t hash[META_HASH_LEN] = {9}, other[META_HASH_LEN] = {10};
	struct meta_block recs[2];
	unsigned n;

	CHECK(mkdtemp(dir));
	m = open_store(dir, 1 << 20, true, 0);
	CHECK_EQ(meta_begin(m, true, &txn), 0);
	a = meta_new_ino(m);
	CHECK_EQ(meta_inode_put(m, txn, a, &rec), 0);
	CHECK_EQ(meta_bmap_store(m, txn, a, 0, tb_loc(0, 1), 65536, hash, true, &freed), 0);
	CHECK_EQ(meta_bmap_store(m, txn, a, 1, tb_loc(0, 2), 1 << 20, NULL, false, &freed), 0);
	CHECK_EQ(meta_bmap_get(m, txn, a, 0, &id), 0);
	CHECK_EQ(meta_block_get(m, txn, id, &blk), 0);
	CHECK_EQ(blk.len, 65536);
	CHECK_EQ(meta_dedup_find(m, txn, hash, &found, &blk), 0);
	CHECK_EQ(found, id);
	CHECK_EQ(blk.loc, tb_loc(0, 1));
	CHECK_EQ(blk.len, 65536);
	/* A block kept out of the index keeps its hash, for the reads' check. */
	CHECK_EQ(meta_bmap_store(m, txn, a, 2, tb_loc(0, 3), 4096, other, false, &freed), 0);
	CHECK_EQ(meta_bmap_get(m, txn, a, 2, &id), 0);
	CHECK_EQ(meta_block_get(m, txn, id, &blk), 0);
	CHECK(blk.flags & META_BLOCK_HASHED);
	CHECK(memcmp(blk.hash, other, META_HASH_LEN) == 0);
	CHECK_EQ(meta_dedup_find(m, txn, other, &found, &blk), -ENOENT);
	/* The block records in steps, by id: the scrub's walk. */
	CHECK_EQ(meta_blocks_list(m, txn, 0, ids, recs, 2, &n), 0);
	CHECK_EQ(n, 2);
	CHECK(ids[0] < ids[1]);
	CHECK_EQ(recs[0].loc, tb_loc(0, 1));
	CHECK_EQ(meta_blocks_list(m, txn, ids[1] + 1, ids, recs, 2, &n), 0);
	CHECK_EQ(n, 1);
	CHECK_EQ(ids[0], id);
	CHECK_EQ(recs[0].len, 4096);
	CHECK_EQ(meta_blocks_list(m, txn, id + 1, ids, recs, 2, &n), 0);
	CHECK_EQ(n, 0);
	m = reopen_as(m, txn, dir, 2, &txn);
	CHECK_EQ(meta_bmap_get(m, txn, a, 0, &id), 0);
	CHECK_EQ(meta_block_get(m, txn, id, &blk), 0);
	CHECK_EQ(blk.loc, tb_loc(0, 1));
	CHECK_EQ(blk.len, 0); /* the whole block */
	meta_abort(txn);
	meta_close(m);
	meta_locvec_free(&freed);
	upgraded_once(dir);
}

/*
 * Each file's count of mapped blocks follows every change of its map: a
 * new block, a replaced one, a hole stored, shared blocks (each file
 * counts them), a cleared range, a purge. A format 1 store, which kept no
 * counts, gets them at its next open.
 */
static void check_counts(void)
{
	char dir[] = "/tmp/tfs-meta-counts.XXXXXX";
	struct meta_inode rec = {.mode = S_IFREG | 0644, .nlink = 1};
	struct locvec freed = {0};
	struct fs_meta *m;
	MDB_txn *txn;
	uint64_t a, b, c, id;
	uint8_t hash[META_HASH_LEN] = {7};

	CHECK(mkdtemp(dir));
	m = open_store(dir, 1 << 20, true, 0);
	CHECK_EQ(meta_upgraded_from(m), 0);
	CHECK_EQ(meta_begin(m, true, &txn), 0);
	a = meta_new_ino(m);
	b = meta_new_ino(m);
	c = meta_new_ino(m);
	CHECK_EQ(meta_inode_put(m, txn, a, &rec), 0);
	CHECK_EQ(meta_inode_put(m, txn, b, &rec), 0);
	CHECK_EQ(meta_inode_put(m, txn, c, &rec), 0);
	CHECK_EQ(nblocks(m, txn, a), 0);
	CHECK_EQ(meta_bmap_store(m, txn, a, 0, tb_loc(0, 1), 0, hash, true, &freed), 0);
	CHECK_EQ(meta_bmap_store(m, txn, a, 1, tb_loc(0, 2), 0, NULL, false, &freed), 0);
	CHECK_EQ(meta_bmap_store(m, txn, a, 1000000, tb_loc(0, 3), 0, NULL, false, &freed), 0);
	CHECK_EQ(nblocks(m, txn, a), 3);
	/* replaced */
	CHECK_EQ(meta_bmap_store(m, txn, a, 1, tb_loc(0, 4), 0, NULL, false, &freed), 0);
	CHECK_EQ(nblocks(m, txn, a), 3);
	/* a hole, twice */
	CHECK_EQ(meta_bmap_store(m, txn, a, 1, TB_LOC_NONE, 0, NULL, false, &freed), 0);
	CHECK_EQ(meta_bmap_store(m, txn, a, 7, TB_LOC_NONE, 0, NULL, false, &freed), 0);
	CHECK_EQ(nblocks(m, txn, a), 2);
	/* b shares a's blocks 0..1000000: 2 blocks, whatever the range's length. */
	CHECK_EQ(meta_bmap_share(m, txn, a, 0, b, 0, 1000001, &freed), 0);
	CHECK_EQ(nblocks(m, txn, b), 2);
	CHECK_EQ(nblocks(m, txn, a), 2);
	CHECK_EQ(meta_bmap_share(m, txn, a, 0, b, 0, 1000001, &freed), 0); /* again: same */
	CHECK_EQ(nblocks(m, txn, b), 2);
	/* c shares a's block 0 by hash (dedup), over a block of its own and into a hole. */
	CHECK_EQ(meta_bmap_store(m, txn, c, 5, tb_loc(0, 9), 0, NULL, false, &freed), 0);
	CHECK_EQ(meta_bmap_get(m, txn, a, 0, &id), 0);
	CHECK_EQ(meta_bmap_share_block(m, txn, c, 5, id, hash, &freed), 0);
	CHECK_EQ(meta_bmap_share_block(m, txn, c, 6, id, hash, &freed), 0);
	CHECK_EQ(nblocks(m, txn, c), 2);
	CHECK_EQ(meta_bmap_clear(m, txn, b, 1, UINT64_MAX, &freed), 0);
	CHECK_EQ(nblocks(m, txn, b), 1);
	CHECK_EQ(meta_bmap_clear(m, txn, b, 0, 1, &freed), 0);
	CHECK_EQ(nblocks(m, txn, b), 0);
	CHECK_EQ(meta_inode_purge(m, txn, c, &freed), 0);
	CHECK_EQ(nblocks(m, txn, c), 0);
	/* Format 1 had no counts: the next open makes them from the maps. */
	m = reopen_as(m, txn, dir, 1, &txn);
	CHECK_EQ(nblocks(m, txn, a), 2);
	CHECK_EQ(nblocks(m, txn, b), 0);
	meta_abort(txn);
	meta_close(m);
	meta_locvec_free(&freed);
	upgraded_once(dir);
}

/*
 * The device flush of a sync point: it commits as the flusher does while
 * a sync flushes the devices, and notes what the store had recorded then.
 */
struct during_flush {
	struct fs_meta *m;
	uint64_t ino;
	uint64_t last_at_flush; /* the newest commit when the flush began */
	int calls;
	int ret; /* what the flush returns */
};

static void put_file(struct fs_meta *m, uint64_t ino)
{
	struct meta_inode rec = {.mode = S_IFREG | 0644, .nlink = 1};
	MDB_txn *txn;

	CHECK_EQ(meta_begin(m, true, &txn), 0);
	CHECK_EQ(meta_inode_put(m, txn, ino, &rec), 0);
	CHECK_EQ(meta_commit(txn), 0);
}

static int commit_during_flush(void *arg)
{
	struct during_flush *d = arg;

	d->calls++;
	d->last_at_flush = meta_last_commit(d->m);
	put_file(d->m, d->ino);
	return d->ret;
}

/*
 * A sync point records the commit it chose before the devices' flush,
 * never one made during it: such a commit may name blocks whose writes
 * finished after the flush began, and so are not durable.
 */
static void check_sync_order(struct fs_meta *m)
{
	struct during_flush d = {.m = m, .ino = meta_new_ino(m)};
	uint64_t before;

	CHECK_EQ(meta_sync(m, NULL, NULL, true), 0);
	CHECK_EQ(meta_durable_commit(m), meta_last_commit(m));
	put_file(m, d.ino); /* a commit for the next sync to record */
	before = meta_last_commit(m);
	CHECK(before > meta_durable_commit(m));

	CHECK_EQ(meta_sync(m, commit_during_flush, &d, true), 0);
	CHECK_EQ(d.calls, 1);
	CHECK_EQ(d.last_at_flush, before); /* the flush came after the choice... */
	CHECK_EQ(meta_last_commit(m), before + 1);
	CHECK_EQ(meta_durable_commit(m), before); /* ...and its commit is not recorded */

	/* The next sync records it; with nothing new, none flushes again. */
	d.calls = 0;
	CHECK_EQ(meta_sync(m, NULL, NULL, true), 0);
	CHECK_EQ(meta_durable_commit(m), before + 1);
	d.ino = meta_new_ino(m);
	CHECK_EQ(meta_sync(m, commit_during_flush, &d, true), 0);
	CHECK_EQ(d.calls, 0);

	/* A flush that fails records nothing and says so. */
	d.ret = -EIO;
	put_file(m, d.ino);
	CHECK_EQ(meta_sync(m, commit_during_flush, &d, true), -EIO);
	CHECK_EQ(d.calls, 1);
	CHECK_EQ(meta_durable_commit(m), before + 1);
	d.ret = 0;
	CHECK_EQ(meta_sync(m, NULL, NULL, true), 0);
	CHECK_EQ(meta_durable_commit(m), meta_last_commit(m));
}

/*
 * scratch=on's sync points (power false) record their commit without a
 * flush. The stop's (power true) must still flush the devices when
 * nothing was committed since: the record and the blocks it names were
 * never flushed. After that, with nothing new, none flushes again.
 */
static void check_sync_power(struct fs_meta *m)
{
	struct during_flush d = {.m = m, .ino = meta_new_ino(m)};

	put_file(m, d.ino);
	CHECK_EQ(meta_sync(m, NULL, NULL, false), 0);
	CHECK_EQ(meta_durable_commit(m), meta_last_commit(m));
	d.ino = meta_new_ino(m);
	CHECK_EQ(meta_sync(m, commit_during_flush, &d, true), 0);
	CHECK_EQ(d.calls, 1);
	CHECK_EQ(meta_durable_commit(m), meta_last_commit(m) - 1);
	CHECK_EQ(meta_sync(m, NULL, NULL, true), 0); /* records the flush's commit */
	d.calls = 0;
	CHECK_EQ(meta_sync(m, commit_during_flush, &d, true), 0);
	CHECK_EQ(d.calls, 0);
	/* A sync without power over a flushed record asks for no flush either. */
	CHECK_EQ(meta_sync(m, commit_during_flush, &d, false), 0);
	CHECK_EQ(d.calls, 0);
}

/*
 * The lock file says who holds the store and what it does. A start waits
 * for a holder that is not serving a mount (at most its bound) and then
 * names it; a "failed" note outlives the close, a clean close empties it.
 * flock conflicts between two descriptors of one process, so one process
 * plays both sides.
 */
/* Drop table name from the closed store in dir, as damage would lose it. */
static void drop_table(const char *dir, const char *name)
{
	MDB_env *env;
	MDB_txn *txn;
	MDB_dbi dbi;

	env = open_env(dir, 0);
	CHECK_EQ(mdb_txn_begin(env, NULL, 0, &txn), 0);
	CHECK_EQ(mdb_dbi_open(txn, name, 0, &dbi), 0);
	CHECK_EQ(mdb_drop(txn, dbi, 1), 0);
	CHECK_EQ(mdb_txn_commit(txn), 0);
	mdb_env_close(env);
}

/* Whether the closed store in dir has table name. */
static bool has_table(const char *dir, const char *name)
{
	MDB_env *env;
	MDB_txn *txn;
	MDB_dbi dbi;
	int rc;

	env = open_env(dir, MDB_RDONLY);
	CHECK_EQ(mdb_txn_begin(env, NULL, MDB_RDONLY, &txn), 0);
	rc = mdb_dbi_open(txn, name, 0, &dbi);
	mdb_txn_abort(txn);
	mdb_env_close(env);
	CHECK(rc == 0 || rc == MDB_NOTFOUND);
	return rc == 0;
}

/*
 * A store that lost a table is refused as damaged, and the table is not
 * made afresh: an empty block map read every file as holes (zeros, no
 * error), and on a main tree of garbage pages LMDB's insert of the name
 * overflowed a page of its own. A format 1 store lacks nblocks and dedup,
 * and its upgrade makes them (check_counts).
 */
static void check_missing_table(void)
{
	static const char *const tables[] = {"bmap", "inode", "dedup", "nblocks"};
	struct meta_inode rec = {.mode = S_IFREG | 0644, .nlink = 1};
	struct locvec freed = {0};
	char dir[] = "/tmp/tfs-meta-tables.XXXXXX", cmd[128];

	for (size_t i = 0; i < sizeof(tables) / sizeof(tables[0]); i++) {
		struct fs_meta *m;
		MDB_txn *txn;
		uint64_t ino;

		CHECK(mkdtemp(dir));
		m = open_store(dir, 0, false, 0);
		CHECK_EQ(meta_begin(m, true, &txn), 0);
		ino = meta_new_ino(m);
		CHECK_EQ(meta_inode_put(m, txn, ino, &rec), 0);
		CHECK_EQ(meta_dirent_add(m, txn, META_ROOT_INO, "f", ino), 0);
		CHECK_EQ(meta_bmap_store(m, txn, ino, 0, tb_loc(0, 3), 0, NULL, false, &freed), 0);
		CHECK_EQ(meta_commit(txn), 0);
		meta_close(m);
		drop_table(dir, tables[i]);
		open_store(dir, 0, false, -EUCLEAN);
		CHECK(!has_table(dir, tables[i])); /* refused, and nothing made */
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
		CHECK_EQ(system(cmd), 0);
		memcpy(dir + strlen(dir) - 6, "XXXXXX", 6);
	}
	free(freed.v);
}

static void check_holder(void)
{
	char dir[] = "/tmp/tfs-holder.XXXXXX", path[64], err[512] = "", cmd[128];
	struct meta_holder h;
	struct timespec t0, t1;
	struct fs_meta *m;
	int fd;

	CHECK(mkdtemp(dir));
	CHECK_EQ(meta_wait_holder(dir, 0, "test", err, sizeof(err)), 0); /* no store yet */
	m = open_store(dir, 0, false, 0);
	snprintf(path, sizeof(path), "%s/lock", dir);
	fd = open(path, O_RDONLY);
	CHECK(fd >= 0);
	meta_read_holder(fd, &h);
	CHECK_EQ(h.pid, getpid());
	CHECK(h.state[0] == 0);
	CHECK_EQ(meta_wait_holder(dir, 0, "test", err, sizeof(err)), -EBUSY);
	CHECK(strstr(err, "in use") != NULL);

	CHECK_EQ(meta_lock_note(m, "stopping", "/mnt/a b"), 0);
	meta_read_holder(fd, &h);
	CHECK(strcmp(h.state, "stopping") == 0 && strcmp(h.point, "/mnt/a b") == 0);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	CHECK_EQ(meta_wait_holder(dir, 1, "test", err, sizeof(err)), -EBUSY);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	CHECK((t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000 >= 1000);
	CHECK(strstr(err, "still writing back") && strstr(err, "/mnt/a b") &&
	      strstr(err, "waited 1 s"));

	/* Mounted where no tensorfs is mounted: its mount is gone, so it is stopping. */
	CHECK_EQ(meta_lock_note(m, "mounted", dir), 0);
	CHECK_EQ(meta_wait_holder(dir, 0, "test", err, sizeof(err)), -EBUSY);
	CHECK(strstr(err, "still writing back") != NULL);

	/* A shorter note leaves nothing of the longer one behind. */
	CHECK_EQ(meta_lock_note(m, "failed", "/m"), 0);
	meta_close(m);
	meta_read_holder(fd, &h);
	CHECK_EQ(h.pid, getpid());
	CHECK(strcmp(h.state, "failed") == 0 && strcmp(h.point, "/m") == 0);
	CHECK_EQ(meta_wait_holder(dir, 0, "test", err, sizeof(err)), 0); /* free again */

	m = open_store(dir, 0, false, 0); /* a stale note of a gone holder is taken over */
	meta_close(m);
	meta_read_holder(fd, &h);
	CHECK_EQ(h.pid, 0);
	close(fd);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	CHECK_EQ(system(cmd), 0);
}

int main(void)
{
	char dir[] = "/tmp/tfs-meta.XXXXXX", cmd[128];
	struct fs_meta *m;
	struct meta_inode rec = {0}, got;
	struct locvec freed = {0};
	struct names names = {0};
	MDB_txn *txn;
	uint64_t ino, f1, f2, id, count;
	char buf[256];
	size_t len;

	CHECK(mkdtemp(dir));
	m = open_store(dir, 1 << 20, true, 0);
	open_store(dir, 1 << 20, true, -EBUSY); /* the lock holds */

	/* The root exists. */
	CHECK_EQ(meta_begin(m, false, &txn), 0);
	CHECK_EQ(meta_inode_get(m, txn, META_ROOT_INO, &got), 0);
	CHECK(S_ISDIR(got.mode));
	meta_abort(txn);

	/* Names: add, look up, refuse duplicates, list in creation order. */
	CHECK_EQ(meta_begin(m, true, &txn), 0);
	f1 = meta_new_ino(m);
	f2 = meta_new_ino(m);
	CHECK(f1 > META_ROOT_INO && f2 == f1 + 1);
	rec.mode = S_IFREG | 0644;
	rec.nlink = 1;
	CHECK_EQ(meta_inode_put(m, txn, f1, &rec), 0);
	CHECK_EQ(meta_inode_put(m, txn, f2, &rec), 0);
	CHECK_EQ(meta_dirent_add(m, txn, META_ROOT_INO, "zeta", f1), 0);
	CHECK_EQ(meta_dirent_add(m, txn, META_ROOT_INO, "alpha", f2), 0);
	CHECK_EQ(meta_dirent_add(m, txn, META_ROOT_INO, "alpha", f1), -EEXIST);
	CHECK_EQ(meta_dir_empty(m, txn, META_ROOT_INO), 0);
	CHECK_EQ(meta_dir_empty(m, txn, f1), 1);
	CHECK_EQ(meta_dirent_lookup(m, txn, META_ROOT_INO, "alpha", &ino), 0);
	CHECK_EQ(ino, f2);
	CHECK_EQ(meta_dirent_lookup(m, txn, META_ROOT_INO, "beta", &ino), -ENOENT);
	CHECK_EQ(meta_readdir(m, txn, META_ROOT_INO, 0, collect, &names), 0);
	CHECK_EQ(names.n, 2);
	CHECK(strcmp(names.seen[0], "zeta") == 0 && strcmp(names.seen[1], "alpha") == 0);
	/* Resuming after the first cookie gives only the second. */
	names.n = 0;
	CHECK_EQ(meta_readdir(m, txn, META_ROOT_INO, names.cookies[0], collect, &names), 0);
	CHECK_EQ(names.n, 1);
	CHECK(strcmp(names.seen[0], "alpha") == 0);

	/* Block maps: store, replace (old block freed), share, clear. */
	CHECK_EQ(meta_bmap_store(m, txn, f1, 0, tb_loc(0, 10), 0, NULL, false, &freed), 0);
	CHECK_EQ(meta_bmap_store(m, txn, f1, 1, tb_loc(1, 11), 0, NULL, false, &freed), 0);
	CHECK_EQ(meta_bmap_store(m, txn, f1, 5, tb_loc(0, 15), 0, NULL, false, &freed), 0);
	CHECK_EQ(freed.n, 0);
	CHECK_EQ(meta_bmap_store(m, txn, f1, 0, tb_loc(0, 20), 0, NULL, false, &freed), 0);
	CHECK_EQ(freed.n, 1);
	CHECK(has_loc(&freed, tb_loc(0, 10)));
	freed.n = 0;
	/* f2 shares blocks 0..2 of f1 (2 is a hole). */
	CHECK_EQ(meta_bmap_share(m, txn, f1, 0, f2, 0, 3, &freed), 0);
	CHECK_EQ(meta_bmap_count(m, txn, f2, 0, UINT64_MAX, &count), 0);
	CHECK_EQ(count, 2);
	CHECK_EQ(meta_bmap_get(m, txn, f2, 1, &id), 0);
	struct meta_block b;
	CHECK_EQ(meta_block_get(m, txn, id, &b), 0);
	CHECK_EQ(b.refs, 2);
	CHECK_EQ(b.loc, tb_loc(1, 11));
	/* Clearing f1 frees only its unshared block 5. */
	CHECK_EQ(meta_bmap_clear(m, txn, f1, 0, UINT64_MAX, &freed), 0);
	CHECK_EQ(freed.n, 1);
	CHECK(has_loc(&freed, tb_loc(0, 15)));
	CHECK_EQ(meta_bmap_get(m, txn, f1, 0, &id), -ENOENT);
	CHECK_EQ(meta_bmap_get(m, txn, f2, 1, &id), 0);
	CHECK_EQ(meta_block_get(m, txn, id, &b), 0);
	CHECK_EQ(b.refs, 1);
	freed.n = 0;
	/* A hole stored over a block frees it. */
	CHECK_EQ(meta_bmap_store(m, txn, f2, 1, TB_LOC_NONE, 0, NULL, false, &freed), 0);
	CHECK(has_loc(&freed, tb_loc(1, 11)));
	CHECK_EQ(meta_bmap_get(m, txn, f2, 1, &id), -ENOENT);
	freed.n = 0;

	/* xattrs. */
	CHECK_EQ(meta_xattr_set(m, txn, f1, "user.a", "1", 1, 0), 0);
	CHECK_EQ(meta_xattr_set(m, txn, f1, "user.a", "2", 1, XATTR_CREATE), -EEXIST);
	CHECK_EQ(meta_xattr_set(m, txn, f1, "user.b", "2", 1, XATTR_REPLACE), -ENODATA);
	CHECK_EQ(meta_xattr_set(m, txn, f1, "user.bb", "xyz", 3, 0), 0);
	CHECK_EQ(meta_xattr_get(m, txn, f1, "user.bb", buf, 0, &len), 0);
	CHECK_EQ(len, 3);
	CHECK_EQ(meta_xattr_get(m, txn, f1, "user.bb", buf, 2, &len), -ERANGE);
	CHECK_EQ(meta_xattr_get(m, txn, f1, "user.bb", buf, sizeof(buf), &len), 0);
	CHECK(memcmp(buf, "xyz", 3) == 0);
	CHECK_EQ(meta_xattr_list(m, txn, f1, buf, sizeof(buf), &len), 0);
	CHECK_EQ(len, strlen("user.a") + 1 + strlen("user.bb") + 1);
	CHECK_EQ(meta_xattr_del(m, txn, f1, "user.a"), 0);
	CHECK_EQ(meta_xattr_del(m, txn, f1, "user.a"), -ENODATA);

	/* Symlink targets. */
	CHECK_EQ(meta_symlink_put(m, txn, f2, "../target"), 0);
	CHECK_EQ(meta_symlink_get(m, txn, f2, buf, sizeof(buf)), 0);
	CHECK(strcmp(buf, "../target") == 0);

	/* f1 becomes an orphan: unlinked but still with blocks. */
	CHECK_EQ(meta_bmap_store(m, txn, f1, 3, tb_loc(0, 33), 0, NULL, false, &freed), 0);
	CHECK_EQ(meta_dirent_del(m, txn, META_ROOT_INO, "zeta"), 0);
	rec.nlink = 0;
	CHECK_EQ(meta_inode_put(m, txn, f1, &rec), 0);
	CHECK_EQ(meta_commit(txn), 0);
	meta_close(m);

	/* Reopen: the block size is fixed, the data is back, orphans are purged. */
	open_store(dir, 256 << 10, true, -EINVAL);
	m = open_store(dir, 0, false, 0);
	CHECK_EQ(meta_begin(m, false, &txn), 0);
	CHECK_EQ(meta_dirent_lookup(m, txn, META_ROOT_INO, "alpha", &ino), 0);
	CHECK_EQ(ino, f2);
	CHECK_EQ(meta_bmap_get(m, txn, f2, 0, &id), 0);
	meta_abort(txn);
	CHECK_EQ(meta_new_ino(m), f2 + 1); /* numbers are never reused */
	freed.n = 0;
	CHECK_EQ(meta_purge_orphans(m, &freed, &count), 0);
	CHECK_EQ(count, 1);
	CHECK(has_loc(&freed, tb_loc(0, 33)));
	CHECK_EQ(meta_begin(m, false, &txn), 0);
	CHECK_EQ(meta_inode_get(m, txn, f1, &got), -ENOENT);
	CHECK_EQ(meta_xattr_get(m, txn, f1, "user.bb", buf, sizeof(buf), &len), -ENODATA);
	meta_abort(txn);
	check_sync_order(m);
	check_sync_power(m);
	check_sparse_maps(m);
	meta_close(m);
	meta_locvec_free(&freed);
	check_counts();
	check_lengths();
	check_holder();
	check_missing_table();

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	CHECK_EQ(system(cmd), 0);
	return 0;
}

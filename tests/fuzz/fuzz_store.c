/*
 * fuzz_store.c - libFuzzer target: a damaged metadata store, as fsck and a
 * mount meet it.
 *
 * Each input makes a fresh store (meta_open: format record and root
 * folder), then writes records of its own into the store's tables behind
 * meta.c's back: a record is a table byte, a key length byte and a value
 * length byte, then the key and the value. The store is then checked by
 * tfsctl's fsck (fs_fsck), repaired, checked again, and opened the way a
 * mount opens it (the block scan, the orphan purge, a readdir of the root).
 * Whatever the records, none of it may crash, hang or leak, and the checker
 * must end with one of its documented statuses (a repair that leaves
 * problems behind is allowed: fsck says so).
 */
#include "fsck.h"
#include "log.h"
#include "meta.h"

#include <lmdb.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FUZZ_MAX_RECORDS 64

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const tables[] = {"inode", "dirent", "dircook", "bmap",
				     "block", "xattr",	"symlink", "dedup"};
static FILE *devnull;
static char base[] = "/dev/shm/tfs-fuzz-store.XXXXXX";

/* Each input's store is removed after it; the folder goes at exit. */
static void remove_base(void)
{
	rmdir(base);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	if (!mkdtemp(base) && !mkdtemp(strcpy(base, "/tmp/tfs-fuzz-store.XXXXXX")))
		abort();
	atexit(remove_base);
	devnull = fopen("/dev/null", "w");
	if (!devnull)
		abort();
	log_set_level(LOG_LVL_ERR);
	return 0;
}

static void remove_store(const char *dir)
{
	static const char *const files[] = {"data.mdb", "lock.mdb", "lock", "durable"};
	char path[512];

	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
		snprintf(path, sizeof(path), "%s/%s", dir, files[i]);
		unlink(path);
	}
	rmdir(dir);
}

/* Write the input's records into the closed store in dir. */
static void damage(const char *dir, const uint8_t *data, size_t size)
{
	MDB_env *env;
	MDB_txn *txn;
	size_t pos = 0;

	if (mdb_env_create(&env) || mdb_env_set_maxdbs(env, 16) ||
	    mdb_env_set_mapsize(env, 1ULL << 30) || mdb_env_open(env, dir, MDB_NOSYNC, 0600))
		abort();
	if (mdb_txn_begin(env, NULL, 0, &txn))
		abort();
	for (int n = 0; n < FUZZ_MAX_RECORDS && pos + 3 <= size; n++) {
		size_t klen = (size_t)data[pos + 1] % 64 + 1, vlen = (size_t)data[pos + 2] % 96;
		const char *table = tables[data[pos] % 8];
		MDB_dbi dbi;

		pos += 3;
		if (pos + klen + vlen > size)
			break;
		MDB_val k = {klen, (void *)(data + pos)}, v = {vlen, (void *)(data + pos + klen)};

		pos += klen + vlen;
		if (mdb_dbi_open(txn, table, 0, &dbi) == 0)
			mdb_put(txn, dbi, &k, &v, 0);
	}
	if (mdb_txn_commit(txn))
		abort();
	mdb_env_close(env);
}

static int count_block(void *arg, uint64_t id, const struct meta_block *b)
{
	(void)id;
	(void)b;
	(*(uint64_t *)arg)++;
	return 0;
}

static int count_name(void *arg, const char *name, size_t len, uint64_t ino, uint64_t cookie)
{
	(void)name;
	(void)len;
	(void)ino;
	(void)cookie;
	(*(uint64_t *)arg)++;
	return 0;
}

static bool known_status(int st)
{
	return st == FSCK_CLEAN || st == FSCK_PROBLEMS || st == FSCK_ERROR;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static unsigned seq;
	char dir[600], err[512] = "", id[40];
	struct fs_meta *m = NULL;
	struct locvec freed = {0};
	uint64_t n = 0, orphans = 0;
	size_t bs = 1 << 20;
	MDB_txn *txn;

	snprintf(dir, sizeof(dir), "%s/s%u", base, seq++);
	if (meta_open(&m, dir, &bs, false, false, 0, 0, id, err, sizeof(err)))
		abort();
	meta_close(m);
	damage(dir, data, size);

	if (!known_status(fs_fsck(dir, false, devnull, "fuzz")))
		abort();
	if (!known_status(fs_fsck(dir, true, devnull, "fuzz")))
		abort();
	if (!known_status(fs_fsck(dir, false, devnull, "fuzz")))
		abort();

	/* The mount-time scans: they may refuse the store, never crash on it. */
	m = NULL;
	if (meta_open(&m, dir, &bs, false, false, 0, 0, id, err, sizeof(err)) == 0) {
		meta_foreach_block(m, count_block, &n);
		if (meta_purge_orphans(m, &freed, &orphans) == 0 &&
		    meta_begin(m, false, &txn) == 0) {
			meta_readdir(m, txn, META_ROOT_INO, 0, count_name, &n);
			meta_abort(txn);
		}
		meta_close(m);
	}
	meta_locvec_free(&freed);
	remove_store(dir);
	return 0;
}

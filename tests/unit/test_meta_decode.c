/*
 * test_meta_decode.c - stored values are decoded with their sizes checked.
 *
 * A value of a size the store never writes (a damaged store) must give
 * -EIO. Before the meta_decode_* functions, the readers copied a fixed size
 * out of whatever the value was, reading past its end: a bmap value of 3
 * bytes gave a block id made of the next record's bytes, and a shorter old
 * block record was read past its end at every mount. The decoders are
 * tested on buffers of exact size (so AddressSanitizer sees any over-read),
 * then through a store whose records were damaged behind its back. Last,
 * the store must open under an address-space limit.
 */
#include "meta.h"
#include "tb.h"
#include "test.h"

#include <errno.h>
#include <lmdb.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef __SANITIZE_ADDRESS__ /* gcc */
#define UNDER_ASAN 1
#elif defined(__has_feature) /* clang */
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif

/* A copy of n bytes in a buffer of exactly n bytes. */
static void *exact(const void *src, size_t n)
{
	void *p = malloc(n ? n : 1);

	CHECK(p);
	memcpy(p, src, n);
	return p;
}

static void decoders(void)
{
	unsigned char raw[sizeof(struct meta_block) + 8];
	struct meta_inode ino;
	struct meta_block b;
	uint64_t a, c;

	for (size_t i = 0; i < sizeof(raw); i++)
		raw[i] = (unsigned char)(i + 1);
	for (size_t n = 0; n <= sizeof(raw); n++) {
		void *p = exact(raw, n);

		CHECK_EQ(meta_decode_inode(p, n, &ino), n == sizeof(ino) ? 0 : -EIO);
		CHECK_EQ(meta_decode_dirent(p, n, &a, &c), n == 16 ? 0 : -EIO);
		CHECK_EQ(meta_decode_id(p, n, &a), n == 8 ? 0 : -EIO);
		CHECK_EQ(meta_decode_block(p, n, &b),
			 n >= offsetof(struct meta_block, hash) && n <= sizeof(b) ? 0 : -EIO);
		free(p);
	}
	/* an old block record (no hash) decodes with a zero hash */
	struct meta_block in = {.loc = 42, .refs = 3, .flags = 0};
	void *p = exact(&in, offsetof(struct meta_block, hash));

	memset(&b, 0xff, sizeof(b));
	CHECK_EQ(meta_decode_block(p, offsetof(struct meta_block, hash), &b), 0);
	CHECK_EQ(b.loc, 42);
	CHECK_EQ(b.refs, 3);
	for (int i = 0; i < META_HASH_LEN; i++)
		CHECK_EQ(b.hash[i], 0);
	free(p);
}

/* Put a raw value into a table of the (closed) store in dir. */
static void damage(const char *dir, const char *table, const void *key, size_t klen,
		   const void *val, size_t vlen)
{
	MDB_env *env;
	MDB_txn *txn;
	MDB_dbi dbi;
	MDB_val k = {klen, (void *)key}, v = {vlen, (void *)val};

	CHECK_EQ(mdb_env_create(&env), 0);
	CHECK_EQ(mdb_env_set_maxdbs(env, 16), 0);
	CHECK_EQ(mdb_env_set_mapsize(env, 1ULL << 30), 0);
	CHECK_EQ(mdb_env_open(env, dir, 0, 0600), 0);
	CHECK_EQ(mdb_txn_begin(env, NULL, 0, &txn), 0);
	CHECK_EQ(mdb_dbi_open(txn, table, 0, &dbi), 0);
	CHECK_EQ(mdb_put(txn, dbi, &k, &v, 0), 0);
	CHECK_EQ(mdb_txn_commit(txn), 0);
	mdb_env_close(env);
}

static void be64(unsigned char *p, uint64_t v)
{
	for (int i = 7; i >= 0; i--, v >>= 8)
		p[i] = (unsigned char)v;
}

static int count_block(void *arg, uint64_t id, const struct meta_block *b)
{
	(void)id;
	(void)b;
	(*(int *)arg)++;
	return 0;
}

static struct fs_meta *open_store(const char *dir)
{
	struct fs_meta *m = NULL;
	char id[40], err[512] = "";
	size_t bs = 1 << 20;

	if (meta_open(&m, dir, &bs, false, false, 0, 0, id, err, sizeof(err)) != 0) {
		fprintf(stderr, "meta_open %s: %s\n", dir, err);
		exit(1);
	}
	return m;
}

static void damaged_store(void)
{
	char dir[] = "/tmp/tfs-meta-decode.XXXXXX";
	unsigned char key[16];
	struct locvec freed = {0};
	struct meta_block b;
	struct fs_meta *m;
	MDB_txn *txn;
	uint64_t id, ino;
	int n = 0;

	CHECK(mkdtemp(dir));
	m = open_store(dir);
	CHECK_EQ(meta_begin(m, true, &txn), 0);
	CHECK_EQ(meta_dirent_add(m, txn, META_ROOT_INO, "f", 7), 0);
	CHECK_EQ(meta_bmap_store(m, txn, 7, 0, tb_loc(0, 5), 0, NULL, false, &freed), 0);
	CHECK_EQ(meta_bmap_store(m, txn, 7, 1, tb_loc(0, 6), 0, NULL, false, &freed), 0);
	CHECK_EQ(meta_commit(txn), 0);
	CHECK_EQ(meta_foreach_block(m, count_block, &n), 0);
	CHECK_EQ(n, 2);
	meta_close(m);

	/* block 1 of inode 7 maps to a 3-byte id; "f" names a 5-byte value */
	be64(key, 7);
	be64(key + 8, 1);
	damage(dir, "bmap", key, 16, "\x01\x02\x03", 3);
	be64(key, META_ROOT_INO);
	memcpy(key + 8, "f", 1);
	damage(dir, "dirent", key, 9, "\x07\x00\x00\x00\x00", 5);

	m = open_store(dir);
	CHECK_EQ(meta_begin(m, false, &txn), 0);
	CHECK_EQ(meta_bmap_get(m, txn, 7, 0, &id), 0); /* the sound one still reads */
	CHECK_EQ(meta_block_get(m, txn, id, &b), 0);
	CHECK_EQ(b.loc, tb_loc(0, 5));
	CHECK_EQ(meta_bmap_get(m, txn, 7, 1, &id), -EIO);
	CHECK_EQ(meta_dirent_lookup(m, txn, META_ROOT_INO, "f", &ino), -EIO);
	meta_abort(txn);
	meta_close(m);

	/* a block record of 4 bytes: the mount-time scan refuses it */
	be64(key, 999);
	damage(dir, "block", key, 8, "\x01\x02\x03\x04", 4);
	m = open_store(dir);
	n = 0;
	CHECK_EQ(meta_foreach_block(m, count_block, &n), -EIO);
	meta_close(m);

	meta_locvec_free(&freed);
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	CHECK_EQ(system(cmd), 0);
}

/*
 * The store opens under an address-space limit smaller than its 64 GiB map
 * (ulimit -v, as batch schedulers set it; valgrind's is 32 GiB) by taking a
 * smaller map. Regression: meta_open failed with EINVAL. Not under ASan,
 * whose shadow memory alone is past any such limit.
 */
static void address_space_limit(void)
{
#ifndef UNDER_ASAN
	char dir[] = "/tmp/tfs-meta-aslimit.XXXXXX", cmd[128];
	struct rlimit rl = {16ULL << 30, 16ULL << 30};
	pid_t pid;
	int ws;

	CHECK(mkdtemp(dir));
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		if (setrlimit(RLIMIT_AS, &rl) != 0)
			_exit(2);
		meta_close(open_store(dir)); /* exits 1 if it cannot open */
		_exit(0);
	}
	CHECK(waitpid(pid, &ws, 0) == pid);
	CHECK(WIFEXITED(ws));
	CHECK_EQ(WEXITSTATUS(ws), 0);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	CHECK_EQ(system(cmd), 0);
#endif
}

int main(void)
{
	decoders();
	damaged_store();
	address_space_limit();
	return 0;
}

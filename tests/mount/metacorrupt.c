/*
 * metacorrupt.c - damage a stopped metadata store on purpose, for the fsck
 * test. Each action breaks one invariant that tfsctl fsck checks:
 *
 *   metacorrupt META_DIR del-block INO IDX   delete the block record that
 *                                            block IDX of inode INO maps to
 *   metacorrupt META_DIR bump-refs INO IDX   add one to that block's refcount
 *   metacorrupt META_DIR share-loc INO IDX INO2 IDX2
 *                                            move the second block to the
 *                                            first one's location
 *   metacorrupt META_DIR leak                add a block record nothing maps
 *   metacorrupt META_DIR del-name NAME       delete the root folder's name
 *                                            NAME (not its listing entry)
 *   metacorrupt META_DIR set-count INO N     record N mapped blocks for INO
 *
 * It goes through meta.c, so it writes records as the daemon does. Exit
 * status 0 done, 1 failed, 2 usage.
 */
#include "meta.h"
#include "tb.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int usage(void)
{
	fprintf(stderr, "usage: metacorrupt META_DIR del-block|bump-refs INO IDX\n"
			"       metacorrupt META_DIR share-loc INO IDX INO2 IDX2\n"
			"       metacorrupt META_DIR leak | del-name NAME\n"
			"       metacorrupt META_DIR set-count INO N\n"
			"       metacorrupt META_DIR set-len INO IDX LEN\n");
	return 2;
}

/* The block record that (ino, idx) maps to. */
static int block_of(struct fs_meta *m, MDB_txn *txn, const char *ino, const char *idx,
		    struct meta_rec *r)
{
	uint64_t id;
	int ret = meta_bmap_get(m, txn, strtoull(ino, NULL, 10), strtoull(idx, NULL, 10), &id);

	if (ret) {
		fprintf(stderr, "metacorrupt: inode %s block %s is not mapped\n", ino, idx);
		return ret;
	}
	memset(r, 0, sizeof(*r));
	r->id = id;
	return meta_block_get(m, txn, id, &r->block);
}

static int last_block(void *arg, const struct meta_rec *r)
{
	struct meta_rec *last = arg;

	*last = *r;
	return 0;
}

static int run(struct fs_meta *m, MDB_txn *txn, int argc, char **argv)
{
	const char *what = argv[2];
	struct meta_rec r, o;
	int ret;

	if (strcmp(what, "del-block") == 0 && argc == 5) {
		ret = block_of(m, txn, argv[3], argv[4], &r);
		if (!ret)
			ret = meta_rec_del(m, txn, META_TAB_BLOCK, &r);
		if (!ret)
			printf("deleted block %llu\n", (unsigned long long)r.id);
	} else if (strcmp(what, "bump-refs") == 0 && argc == 5) {
		ret = block_of(m, txn, argv[3], argv[4], &r);
		r.block.refs++;
		if (!ret)
			ret = meta_rec_put(m, txn, META_TAB_BLOCK, &r);
		if (!ret)
			printf("block %llu refcount now %u\n", (unsigned long long)r.id,
			       r.block.refs);
	} else if (strcmp(what, "share-loc") == 0 && argc == 7) {
		ret = block_of(m, txn, argv[3], argv[4], &r);
		if (!ret)
			ret = block_of(m, txn, argv[5], argv[6], &o);
		o.block.loc = r.block.loc;
		if (!ret)
			ret = meta_rec_put(m, txn, META_TAB_BLOCK, &o);
		if (!ret)
			printf("block %llu now at block %llu's location\n",
			       (unsigned long long)o.id, (unsigned long long)r.id);
	} else if (strcmp(what, "leak") == 0 && argc == 3) {
		memset(&r, 0, sizeof(r));
		ret = meta_walk(m, txn, META_TAB_BLOCK, last_block, &r);
		/* A fresh id, and a slot past the last block's: nobody's location. */
		r.id++;
		r.block.loc = tb_loc(tb_loc_dev(r.block.loc), tb_loc_slot(r.block.loc) + 1000);
		r.block.refs = 1;
		r.block.flags = 0;
		if (!ret)
			ret = meta_rec_put(m, txn, META_TAB_BLOCK, &r);
		if (!ret)
			printf("added block %llu\n", (unsigned long long)r.id);
	} else if (strcmp(what, "del-name") == 0 && argc == 4) {
		memset(&r, 0, sizeof(r));
		r.ino = META_ROOT_INO;
		r.name = argv[3];
		r.namelen = strlen(argv[3]);
		ret = meta_rec_del(m, txn, META_TAB_DIRENT, &r);
		if (!ret)
			printf("deleted name /%s\n", argv[3]);
	} else if (strcmp(what, "set-len") == 0 && argc == 6) {
		ret = block_of(m, txn, argv[3], argv[4], &r);
		r.block.len = strtoull(argv[5], NULL, 10);
		if (!ret)
			ret = meta_rec_put(m, txn, META_TAB_BLOCK, &r);
		if (!ret)
			printf("block %llu now stores %s bytes\n", (unsigned long long)r.id,
			       argv[5]);
	} else if (strcmp(what, "set-count") == 0 && argc == 5) {
		memset(&r, 0, sizeof(r));
		r.ino = strtoull(argv[3], NULL, 10);
		r.idx = strtoull(argv[4], NULL, 10);
		ret = meta_rec_put(m, txn, META_TAB_NBLOCKS, &r);
		if (!ret)
			printf("inode %s now records %s mapped blocks\n", argv[3], argv[4]);
	} else {
		return -EINVAL;
	}
	return ret;
}

int main(int argc, char **argv)
{
	struct fs_meta *m;
	MDB_txn *txn;
	char err[512] = "", id[40];
	size_t bs = 0;
	int ret;

	if (argc < 3)
		return usage();
	if (!meta_store_exists(argv[1])) {
		fprintf(stderr, "metacorrupt: %s: no store\n", argv[1]);
		return 1;
	}
	ret = meta_open(&m, argv[1], &bs, false, false, getuid(), getgid(), id, err, sizeof(err));
	if (ret) {
		fprintf(stderr, "metacorrupt: %s\n", err[0] ? err : strerror(-ret));
		return 1;
	}
	ret = meta_begin(m, true, &txn);
	if (!ret) {
		ret = run(m, txn, argc, argv);
		if (ret)
			meta_abort(txn);
		else
			ret = meta_commit(txn);
	}
	meta_close(m);
	if (ret == -EINVAL)
		return usage();
	if (ret)
		fprintf(stderr, "metacorrupt: %s\n", strerror(-ret));
	return ret ? 1 : 0;
}

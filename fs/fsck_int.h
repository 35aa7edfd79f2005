/*
 * fsck_int.h - what the files of the offline checker share, inside fs/:
 * the store as fsck holds it in memory (one array per table, in key
 * order, and a record per row with what the checks decided for it), and
 * the calls from one file to another. Not for callers of fsck (fsck.h).
 *
 * The files, from the top down; each calls only those below it:
 *   fsck.c         the run: passes in guarded transactions, the verdict
 *   fsck_check.c   the checks, which decide each record's fate
 *   fsck_repair.c  the repair, which applies those fates in one transaction
 *   fsck_report.c  the report's lines, and how a record is named in them
 *   fsck_load.c    the store read into arrays, and the lookups in them
 */
#ifndef TENSORFS_FSCK_INT_H
#define TENSORFS_FSCK_INT_H

#include "meta.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

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

/* fsck_load.c */
int fsck_load(struct fsck *f, MDB_txn *txn);
void fsck_free_vecs(struct fsck *f);
struct ck_inode *fsck_find_inode(struct fsck *f, uint64_t ino);
struct ck_block *fsck_find_block(struct fsck *f, uint64_t id);
struct ck_listing *fsck_find_listing(struct fsck *f, uint64_t parent, uint64_t cookie);
/* Index of the first name in folder parent (names are in (parent, name) order). */
size_t fsck_first_name(struct fsck *f, uint64_t parent);
struct ck_name *fsck_find_name(struct fsck *f, uint64_t parent, const char *name);
bool fsck_is_dir(const struct ck_inode *in);

/* fsck_report.c */
void fsck_report(FILE *out, const char *lead, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void fsck_problem(struct fsck *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void fsck_repaired(struct fsck *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *fsck_kind(const struct ck_inode *in);
/* "/path (ino N)" for an inode reached from the root, "inode N" otherwise. */
const char *fsck_describe(struct fsck *f, uint64_t ino, char *buf, size_t len);
void fsck_hash_hex(const uint8_t *h, char out[2 * META_HASH_LEN + 1]);

/* fsck_check.c: every check, in dependency order; 0 or -errno. */
int fsck_analyze(struct fsck *f);

/* fsck_repair.c: the fates the checks decided, written in txn; 0 or -errno. */
int fsck_apply(struct fsck *f, MDB_txn *txn);

#endif

/*
 * meta.h - the metadata store: inodes, names, block maps and block records
 * in LMDB.
 *
 * Every change to the namespace or to a block map is one LMDB write
 * transaction, so the store is consistent after any crash. Transactions
 * commit without an fsync; meta_sync makes all of them durable and is
 * called at fsync, periodically by the flusher, and at unmount.
 *
 * Sub-databases, keys big-endian so that cursors walk them in order:
 *   inode   ino                   -> struct meta_inode
 *   dirent  parent, name          -> struct meta_dirent (child ino, cookie)
 *   dircook parent, cookie        -> name (readdir order and offsets)
 *   bmap    ino, block index      -> block id
 *   block   block id              -> struct meta_block (location, refcount, hash)
 *   dedup   hash                  -> block id (blocks written with a hash)
 *   xattr   ino, name             -> value
 *   symlink ino                   -> target
 *   nblocks ino                   -> blocks its block map holds (absent: none)
 *   info    "format"              -> struct meta_format
 *           "devices"             -> each device's binding (meta_devices_get)
 *
 * Format 2 added nblocks, so that stat's st_blocks costs one lookup and not
 * a walk of the block map; a format 1 store is upgraded when it is opened.
 */
#ifndef TENSORFS_META_H
#define TENSORFS_META_H

#include <limits.h>
#include <lmdb.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define META_FORMAT_VERSION 3 /* 2: nblocks; 3: a block's stored length */
#define META_ROOT_INO 1
#define META_BLOCK_DEFAULT (1UL << 20) /* a new store's, when none is asked for */
#define META_BLOCK_MIN (4UL << 10)     /* block=, and what a format record may name */
#define META_BLOCK_MAX (64UL << 20)

struct meta_inode {
	uint32_t mode, uid, gid, nlink;
	uint64_t size;
	uint64_t rdev;
	int64_t atime, mtime, ctime;
	uint32_t atime_ns, mtime_ns, ctime_ns;
	uint32_t flags; /* META_INODE_* */
};

/* The file is pinned in DRAM (tfsctl pin): pinned again at every mount. */
#define META_INODE_PINNED 1u

#define META_HASH_LEN 16 /* XXH3-128 of the block's bytes */

struct meta_block {
	uint64_t loc;
	uint32_t refs;
	uint32_t flags; /* META_BLOCK_HASHED when hash is set */
	uint8_t hash[META_HASH_LEN]; /* of the whole block: every read of it is checked */
	/*
	 * Bytes stored at loc, from the block's start: the rest of the block
	 * is zeros and was not written (a file's last block). 0: all of it,
	 * as in records written before blocks carried a length.
	 */
	uint64_t len;
};

#define META_BLOCK_HASHED 1u

/* Locations whose last reference went away in a transaction. */
struct locvec {
	uint64_t *v;
	size_t n, cap;
};

struct fs_meta;

/*
 * Before anything is made: refuse a meta folder that another user owns or
 * can write, or whose store files (data.mdb, lock.mdb, lock) are links, not
 * regular files, or not ours alone. A missing folder passes. 0 or -errno,
 * with err set.
 */
int meta_check_folder(const char *dir, char *err, size_t errlen);
/*
 * Open (or create) the store in dir and take its exclusive lock. The
 * folder is checked as meta_check_folder does, and made 0700 if missing;
 * a failed open of a store it was making removes what it made.
 * *block_size: the requested block size, 0 for the default; on return the
 * store's own. store_id receives the store's identity (36 chars + NUL).
 * scratch: the store need outlive its daemon, not its machine
 * (meta_scratch.c, and meta_sync's power).
 */
int meta_open(struct fs_meta **out, const char *dir, size_t *block_size, bool block_given,
	      bool scratch, uid_t root_uid, gid_t root_gid, char store_id[40], char *err,
	      size_t errlen);
void meta_close(struct fs_meta *m);
/*
 * How long a start waits, by default, for the daemon that still holds its
 * store after an unmount: that daemon writes back all that is dirty first.
 */
#define META_LOCK_WAIT_S 600
/*
 * Before meta_open: when another process holds the store in dir, wait for
 * it (wait_s seconds at most, polling) unless it serves a mount that this
 * process can see. Says once on stderr, as prog, whom it waits for. 0 when
 * the store is free (or there is none: meta_open says what is wrong),
 * -EBUSY with err naming the holder, its pid and its mount otherwise.
 */
int meta_wait_holder(const char *dir, unsigned wait_s, const char *prog, char *err, size_t errlen);
/*
 * Say in the lock file what this daemon does with the store: "mounted",
 * "stopping" (the mount is gone, write-back runs) or "failed" (write-back
 * failed: kept in the file after meta_close), and at which mount point.
 * A start that finds the store locked reads it (meta_wait_holder), and so
 * does tfsctl unmount once the daemon has exited.
 */
int meta_lock_note(struct fs_meta *m, const char *state, const char *point);
/* What a lock file (an open descriptor of it) says of its holder. */
struct meta_holder {
	long pid;	      /* 0: it names none (a clean stop, or never used) */
	char state[16];	      /* mounted, stopping, failed; "": none said */
	char point[PATH_MAX]; /* the mount point the state is about */
};
void meta_read_holder(int fd, struct meta_holder *h);
/*
 * True when meta_open created the store; not when it emptied one that ran
 * with scratch=on and the machine stopped under (meta_scratch.c): that
 * store's devices are still its own.
 */
bool meta_is_new(const struct fs_meta *m);
/* The format meta_open found, when it upgraded the store from it; else 0. */
unsigned meta_upgraded_from(const struct fs_meta *m);
/* Close and delete a store this start created, after a failed start. */
void meta_discard(struct fs_meta *m);
/*
 * Make every commit so far durable, and record it as the point a power
 * cut rolls back to. The newest commit is chosen first; flush (when not
 * NULL) is called after that and must make the devices' data durable:
 * so every block that a recorded commit names was written before the
 * flush began. A commit made during the flush is left for the next sync.
 * power false (scratch=on): no file is flushed; the point then outlives
 * a kill of the daemon, not a power cut.
 */
int meta_sync(struct fs_meta *m, int (*flush)(void *arg), void *arg, bool power);
/* The commit the last sync point recorded (0: none), and the newest commit. */
uint64_t meta_durable_commit(struct fs_meta *m);
uint64_t meta_last_commit(struct fs_meta *m);

int meta_begin(struct fs_meta *m, bool write, MDB_txn **txn);
/*
 * Why write transactions fail now (-errno: the last one that could not
 * begin or commit, a read-only or full filesystem, a failing disk), with
 * *for_ms since the first failure after the last commit; 0 once one
 * commits again, or when none has failed for within_ms (an idle mount
 * whose filesystem came back commits nothing to say so).
 */
int meta_failing(struct fs_meta *m, uint64_t within_ms, uint64_t *for_ms);
/*
 * Commit a write transaction (read ones are aborted). fn, when set by
 * meta_on_commit, is called after each that succeeded, so that a sync
 * point follows (tb_meta_committed): it must be cheap and take no lock
 * that a committer may hold. urgent: the store grew past its bound since
 * the last sync point (meta_sync), and the pages it keeps for that point
 * come free only at the next one.
 */
int meta_commit(MDB_txn *txn);
void meta_on_commit(struct fs_meta *m, void (*fn)(void *arg, bool urgent), void *arg);
void meta_abort(MDB_txn *txn);

uint64_t meta_new_ino(struct fs_meta *m);

int meta_inode_get(struct fs_meta *m, MDB_txn *txn, uint64_t ino, struct meta_inode *rec);
int meta_inode_put(struct fs_meta *m, MDB_txn *txn, uint64_t ino, const struct meta_inode *rec);
/* Remove an inode and everything it owns: blocks, xattrs, symlink target. */
int meta_inode_purge(struct fs_meta *m, MDB_txn *txn, uint64_t ino, struct locvec *freed);

int meta_dirent_lookup(struct fs_meta *m, MDB_txn *txn, uint64_t parent, const char *name,
		       uint64_t *ino);
int meta_dirent_add(struct fs_meta *m, MDB_txn *txn, uint64_t parent, const char *name,
		    uint64_t ino);
int meta_dirent_del(struct fs_meta *m, MDB_txn *txn, uint64_t parent, const char *name);
/* 1 if the folder has no entries, 0 if it has, -errno. */
int meta_dir_empty(struct fs_meta *m, MDB_txn *txn, uint64_t dir);
/*
 * Entries of dir with cookie > after, in cookie order, until fn returns
 * non-zero.
 */
typedef int (*meta_dirent_fn)(void *arg, const char *name, size_t namelen, uint64_t ino,
			      uint64_t cookie);
int meta_readdir(struct fs_meta *m, MDB_txn *txn, uint64_t dir, uint64_t after,
		 meta_dirent_fn fn, void *arg);

/* Block id of (ino, idx): 0, or -ENOENT for a hole. */
int meta_bmap_get(struct fs_meta *m, MDB_txn *txn, uint64_t ino, uint64_t idx, uint64_t *id);
int meta_block_get(struct fs_meta *m, MDB_txn *txn, uint64_t id, struct meta_block *b);
/*
 * Point (ino, idx) at a new block at loc (or a hole for TB_LOC_NONE) that
 * stores len bytes (struct meta_block) and whose bytes have hash (NULL:
 * unknown); index enters the new block in the dedup index under it.
 */
int meta_bmap_store(struct fs_meta *m, MDB_txn *txn, uint64_t ino, uint64_t idx, uint64_t loc,
		    uint64_t len, const uint8_t *hash, bool index, struct locvec *freed);
/*
 * Point (ino, idx) at the existing block id, which must still hold hash:
 * -ESTALE if it went away since it was found.
 */
int meta_bmap_share_block(struct fs_meta *m, MDB_txn *txn, uint64_t ino, uint64_t idx,
			  uint64_t id, const uint8_t *hash, struct locvec *freed);
/* A stored block with this hash: 0 with its id and record, or -ENOENT. */
int meta_dedup_find(struct fs_meta *m, MDB_txn *txn, const uint8_t *hash, uint64_t *id,
		    struct meta_block *b);
/* Drop the mappings of blocks [from, to) of ino. */
int meta_bmap_clear(struct fs_meta *m, MDB_txn *txn, uint64_t ino, uint64_t from, uint64_t to,
		    struct locvec *freed);
/*
 * Make blocks [didx, didx+n) of dst share the blocks [sidx, sidx+n) of src
 * (holes of src become holes of dst). The ranges must not overlap.
 */
int meta_bmap_share(struct fs_meta *m, MDB_txn *txn, uint64_t src, uint64_t sidx, uint64_t dst,
		    uint64_t didx, uint64_t n, struct locvec *freed);
/*
 * The block map walked by cursor, so that the cost follows the blocks a file
 * stores and never its size (a sparse file may be 2^63 bytes long).
 *
 * meta_bmap_next: the first mapped block of ino in [from, to): 0 with its
 * index and block id, or -ENOENT when there is none.
 * meta_bmap_walk: each mapped block of ino in [from, to), in index order,
 * until fn returns non-zero, which is returned; 0 at the end.
 */
int meta_bmap_next(struct fs_meta *m, MDB_txn *txn, uint64_t ino, uint64_t from, uint64_t to,
		   uint64_t *idx, uint64_t *id);
typedef int (*meta_bmap_fn)(void *arg, uint64_t idx, uint64_t id);
int meta_bmap_walk(struct fs_meta *m, MDB_txn *txn, uint64_t ino, uint64_t from, uint64_t to,
		   meta_bmap_fn fn, void *arg);
/*
 * Up to max indexes of the blocks ino maps in [from, to), in order, in *n;
 * fewer than max means there are no more. In a read transaction of its
 * own, over when it returns, so that the caller may then wait on I/O.
 */
int meta_bmap_list(struct fs_meta *m, uint64_t ino, uint64_t from, uint64_t to, uint64_t *idx,
		   unsigned max, unsigned *n);
/*
 * Blocks ino's block map holds, holes not counted and a block shared with
 * other files counted in each: kept in the same transaction as every change
 * of the map, so it costs one lookup whatever the file's size.
 */
int meta_inode_blocks(struct fs_meta *m, MDB_txn *txn, uint64_t ino, uint64_t *n);
/* Number of mapped blocks of ino in [from, to). */
int meta_bmap_count(struct fs_meta *m, MDB_txn *txn, uint64_t ino, uint64_t from, uint64_t to,
		    uint64_t *count);

int meta_xattr_get(struct fs_meta *m, MDB_txn *txn, uint64_t ino, const char *name, void *buf,
		   size_t size, size_t *len);
int meta_xattr_set(struct fs_meta *m, MDB_txn *txn, uint64_t ino, const char *name,
		   const void *val, size_t len, int flags);
int meta_xattr_list(struct fs_meta *m, MDB_txn *txn, uint64_t ino, char *buf, size_t size,
		    size_t *len);
int meta_xattr_del(struct fs_meta *m, MDB_txn *txn, uint64_t ino, const char *name);

int meta_symlink_get(struct fs_meta *m, MDB_txn *txn, uint64_t ino, char *buf, size_t size);
int meta_symlink_put(struct fs_meta *m, MDB_txn *txn, uint64_t ino, const char *target);

/* Every block location in use, for rebuilding the allocators. */
int meta_foreach_block(struct fs_meta *m, int (*fn)(void *arg, uint64_t id,
						    const struct meta_block *b),
		       void *arg);
/*
 * Up to max block records with ids from from on, in id order: their ids in
 * ids and records in b, and how many in *n (fewer than max: no more). A
 * walk of every stored block in steps, each in a transaction of its own.
 */
int meta_blocks_list(struct fs_meta *m, MDB_txn *txn, uint64_t from, uint64_t *ids,
		     struct meta_block *b, unsigned max, unsigned *n);
/*
 * Each inode with one of flags (META_INODE_*) set, in inode order, until fn
 * returns non-zero (which is returned); a walk of the whole inode table, for
 * the mount and the listing of pins.
 */
typedef int (*meta_inode_fn)(void *arg, uint64_t ino, const struct meta_inode *rec);
int meta_inodes_flagged(struct fs_meta *m, MDB_txn *txn, uint32_t flags, meta_inode_fn fn,
			void *arg);
/* Inodes with no name left (open-unlinked at a crash): purge them. */
int meta_purge_orphans(struct fs_meta *m, struct locvec *freed, uint64_t *count);
/* Totals for statfs and stats: inodes, stored blocks, mapped blocks. */
void meta_counts(struct fs_meta *m, uint64_t *inodes, uint64_t *blocks, uint64_t *mapped);

/* The store's size, for stats (meta_space). */
struct meta_space {
	uint64_t file_bytes; /* data.mdb's size */
	uint64_t disk_bytes; /* what data.mdb takes on its filesystem */
	uint64_t used_bytes; /* LMDB's pages up to the highest in use */
	uint64_t tree_bytes; /* of those, the trees' pages: the live metadata */
	uint64_t free_bytes; /* on LMDB's free list: reused once no reader needs them */
};
void meta_space(struct fs_meta *m, struct meta_space *sp);

int meta_locvec_push(struct locvec *v, uint64_t loc);
void meta_locvec_free(struct locvec *v);

/*
 * Raw access for the offline checker (tfsctl fsck), which must see and
 * repair records that the functions above refuse: a mapping to a block that
 * is gone, a name without its listing entry, a wrong reference count.
 * Nothing in the daemon uses these.
 */
enum meta_table {
	META_TAB_INODE,
	META_TAB_DIRENT,
	META_TAB_DIRCOOK,
	META_TAB_BMAP,
	META_TAB_BLOCK,
	META_TAB_DEDUP,
	META_TAB_XATTR,
	META_TAB_SYMLINK,
	META_TAB_NBLOCKS,
};

/* One record, decoded; the fields a table does not use are zero. */
struct meta_rec {
	uint64_t ino;	   /* owner: inode, bmap, xattr, symlink, nblocks; parent: dirent, dircook */
	uint64_t idx;	   /* bmap: block index; dirent, dircook: cookie; nblocks: the count */
	uint64_t id;	   /* bmap, dedup, block: block id; dirent: the child inode */
	const char *name;  /* dirent, dircook, xattr; not NUL-terminated */
	size_t namelen;
	const uint8_t *hash; /* dedup: the key */
	struct meta_inode inode;
	struct meta_block block;
	bool malformed; /* key or value has a size the store never writes */
	const void *key; /* the raw key: meta_rec_del uses it when set */
	size_t keylen;
};

/*
 * Every record of table t in key order, until fn returns non-zero (which is
 * returned). Pointers in the record are valid until txn changes or ends.
 */
typedef int (*meta_walk_fn)(void *arg, const struct meta_rec *r);
int meta_walk(struct fs_meta *m, MDB_txn *txn, enum meta_table t, meta_walk_fn fn, void *arg);
/* Delete the record that meta_walk gave as r, and nothing else: -ENOENT if gone. */
int meta_rec_del(struct fs_meta *m, MDB_txn *txn, enum meta_table t, const struct meta_rec *r);
/*
 * Write r as is, with no reference counting and no block counts: bmap,
 * block, inode and nblocks records only.
 */
int meta_rec_put(struct fs_meta *m, MDB_txn *txn, enum meta_table t, const struct meta_rec *r);
/*
 * True when dir holds a metadata store with its format record (meta_open
 * will not make one), or a damaged one (meta_open says what is wrong).
 */
bool meta_store_exists(const char *dir);
/*
 * fn(arg) with a fault in the store's map (a damaged data.mdb: see
 * metaguard.h) turned into -EUCLEAN and a message in err. After one the
 * store is only fit for meta_close.
 */
int meta_guarded(struct fs_meta *m, int (*fn)(void *arg), void *arg, char *err, size_t errlen);
/*
 * What a guarded call may abandon (a read transaction), kept reachable
 * while it may (see metaguard.h): for the callers of meta_guarded.
 */
void meta_guard_hold(const void *p);
void meta_guard_release(const void *p);
/* What a meta function's error (-errno, or LMDB's own code) means, in words; damage says so. */
const char *meta_strerror(int ret);

/*
 * The store's record of its devices. Device i (its place in nvme= and
 * then remote=) has the binding id that the store wrote into its identity
 * when it took the device; "" where none is known (a device taken before
 * bindings were recorded). A folder whose identity carries another
 * binding is not the one the store's blocks on device i went to. *n: the
 * entries, 0 without a record; a damaged record is logged and read as
 * none. 0 or -errno.
 */
#define META_BIND_LEN 40
int meta_devices_get(struct fs_meta *m, char bind[][META_BIND_LEN], unsigned max, unsigned *n);
int meta_devices_put(struct fs_meta *m, char bind[][META_BIND_LEN], unsigned n);

/*
 * Stored values, decoded with their sizes checked: a damaged store gives
 * -EIO, never bytes read past the end of a record. Every read of a value
 * above goes through these; they take raw bytes, so a fuzz target can
 * call them (tests/fuzz/fuzz_meta.c).
 */
int meta_decode_inode(const void *v, size_t len, struct meta_inode *rec);
/* A dirent value: the child inode and the cookie of its listing entry. */
int meta_decode_dirent(const void *v, size_t len, uint64_t *ino, uint64_t *cookie);
/* A bmap or dedup value: a block id. */
int meta_decode_id(const void *v, size_t len, uint64_t *id);
int meta_decode_block(const void *v, size_t len, struct meta_block *b);

#endif

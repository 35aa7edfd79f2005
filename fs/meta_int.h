/*
 * meta_int.h - what the pieces of the metadata store share, and nothing
 * else: the store's state (struct fs_meta), the names and layout of its
 * files, the small helpers every piece uses on LMDB's keys and results,
 * and the few functions one piece calls in another. Callers outside
 * fs/meta*.c use meta.h.
 */
#ifndef TENSORFS_META_INT_H
#define TENSORFS_META_INT_H

#include "meta.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The store's files in its folder, and the longest key of a name. */
#define KEY_MAX 520 /* 8 bytes of parent + NAME_MAX and then some */
#define META_WHAT "meta folder"
#define DATA_NAME "data.mdb"
#define LMDB_LOCK_NAME "lock.mdb"
#define LOCK_NAME "lock"
#define DURABLE_NAME "durable"
#define SCRATCH_NAME "scratch" /* there while the store runs with scratch=on (meta_scratch.c) */
#define BOOT_ID_LEN 36

/*
 * A record of the durable file: the header, then LMDB's meta page of the
 * commit that the sync point made durable. Two slots, DURABLE_STRIDE
 * apart (room for a 64 KiB page), written in turn; all numbers big-endian.
 * The header: magic, version, sequence, commit, page size, checksum, and
 * (version 2) the store's id, as 16 bytes, so that a record is only ever
 * applied to its own store.
 */
#define DURABLE_MAGIC 0x7466732d64757261ULL /* "tfs-dura" */
#define DURABLE_VERSION 2		    /* 1: no store id */
#define DURABLE_HDR 64
#define DURABLE_ID_OFF 48
#define DURABLE_STRIDE (128 * 1024)
#define DURABLE_PAGE_MAX (DURABLE_STRIDE - DURABLE_HDR)
#define STORE_ID_LEN 36	  /* the text form of a store id */
#define STORE_ID_BYTES 16 /* and its bytes */
/*
 * LMDB 0.9's meta page (64-bit), read before LMDB maps the file: the page
 * header (pgno 8 bytes, pad 2, flags 2, lower 2, upper 2), then MDB_meta:
 * magic 4, version 4, address 8, mapsize 8, two MDB_db of 48 bytes (the
 * free list's first field holds the page size), last page 8, commit 8.
 * Pages 0 and 1 are the meta pages; LMDB opens the one with the newer
 * commit, and reads the second at the page size the first names.
 */
#define LMDB_PAGE_FLAGS_OFF 10
#define LMDB_P_META 0x08
#define LMDB_META_MAGIC 0xBEEFC0DEU
#define LMDB_META_MAGIC_OFF 16
#define LMDB_META_VERSION_OFF 20
#define LMDB_DATA_VERSION 1
#define LMDB_META_PSIZE_OFF 40
#define LMDB_META_LAST_PG_OFF (16 + 120)
#define LMDB_META_TXNID_OFF (16 + 128)
/* LMDB's own trees, by their fixed handles: the free list and the main tree. */
#define FREE_DBI_ID 0
#define MAIN_DBI_ID 1
#define LMDB_META_END (16 + 136)
#define LMDB_PSIZE_MIN 512
#define LMDB_PSIZE_MAX 65536

/* A name's value in the dirent table: its inode and its readdir cookie. */
struct dirent_val {
	uint64_t ino;
	uint64_t cookie;
};

extern const char *const meta_files[]; /* the store's files, checked at open */

struct fs_meta {
	MDB_env *env;
	MDB_dbi inode, dirent, dircook, bmap, block, xattr, symlink, info, dedup, nblocks;
	int lock_fd;
	int dir_fd;  /* the folder, checked */
	int data_fd; /* data.mdb, to copy its meta pages */
	int durable_fd;
	bool unclean; /* the last stop left its pid in the lock file */
	bool opened;  /* meta_open succeeded: meta_close records the last state */
	char boot[BOOT_ID_LEN + 1], last_boot[BOOT_ID_LEN + 1]; /* this boot's id; that stop's */
	char store_id[40];		   /* this store's, once its format record is read */
	char last_store[STORE_ID_LEN + 1]; /* the store the lock file names: "" when none */
	const void *map;		   /* LMDB's map, watched for faults (metaguard.h) */
	bool damaged;			   /* a guarded call faulted: LMDB is asked nothing more */
	uint64_t have_pages, need_pages;   /* data.mdb's pages; those its meta page names */
	pthread_mutex_t sync_lock;	   /* one meta_sync at a time */
	MDB_txn *pinned;		   /* a reader on the last sync point's commit */
	uint64_t durable_seq;		   /* records written to the durable file */
	uint64_t durable_txnid;		   /* the commit of the newest one */
	unsigned char *page;		   /* scratch: a meta page */
	size_t psize;
	bool locked;		  /* we hold the flock */
	bool lock_written;	  /* and the pid in the file is ours */
	bool keep_note;		  /* the stop failed: the lock file keeps saying so */
	bool created;		  /* this open made the store */
	bool scratch;		  /* scratch=on: sync points before the stop flush nothing */
	bool emptied;		  /* scratch: a power cut lost the store; this open empties it */
	bool record_power;	  /* the durable record is flushed (not so after scratch sync points) */
	bool made_dir, made_lock; /* this open made the folder, the lock file */
	unsigned upgraded_from;	  /* the format this open upgraded the store from, or 0 */
	char dir[4096];
	void (*on_commit)(void *arg, bool urgent); /* told of every commit (meta_on_commit) */
	uint64_t grow_limit; /* atomic: past this last page, a commit wants a sync point now (0: none) */
	void *on_commit_arg;
	uint64_t next_ino;   /* atomic */
	uint64_t next_block; /* atomic */
	int fail_err;	     /* atomic: why the last write transaction failed (-errno); 0 once one commits */
	uint64_t fail_ms;    /* atomic: the first failure since a commit went through (CLOCK_MONOTONIC) */
	uint64_t fail_last_ms; /* atomic: the latest failure */
};

static inline void put_be64(unsigned char *p, uint64_t v)
{
	for (int i = 7; i >= 0; i--) {
		p[i] = (unsigned char)v;
		v >>= 8;
	}
}

static inline uint64_t get_be64(const unsigned char *p)
{
	uint64_t v = 0;

	for (int i = 0; i < 8; i++)
		v = v << 8 | p[i];
	return v;
}

/*
 * LMDB's result as -errno. LMDB passes the system's errors on as they are
 * (positive errnos: ENOSPC when the metadata's filesystem is full, EIO,
 * ENOMEM...): they keep their errno, so that a full disk reads as one to
 * the writer and in the log, not as an I/O error. Its own codes (negative)
 * that say its pages are damaged are EUCLEAN, as a filesystem says of its
 * own damage; the others, which have no errno of their own, are misuse:
 * EIO.
 */
static inline int mdb_err(int rc)
{
	switch (rc) {
	case MDB_SUCCESS:
		return 0;
	case MDB_NOTFOUND:
		return -ENOENT;
	case MDB_KEYEXIST:
		return -EEXIST;
	case MDB_MAP_FULL:
	case MDB_TXN_FULL:
		return -ENOSPC;
	case MDB_CORRUPTED:
	case MDB_PAGE_NOTFOUND:
	case MDB_INVALID:
	case MDB_VERSION_MISMATCH:
		return -EUCLEAN;
	default:
		return rc > 0 ? -rc : -EIO;
	}
}

/* LMDB's word for a damaged file. */
static inline bool lmdb_damaged(int rc)
{
	return rc == MDB_CORRUPTED || rc == MDB_PAGE_NOTFOUND || rc == MDB_INVALID ||
	       rc == MDB_VERSION_MISMATCH || rc == MDB_INCOMPATIBLE;
}

/* ---- records under an 8-byte id (inode number, block id) ---- */

/* id's value in dbi (its key: id big-endian): 0, -ENOENT where it has none, or -errno. */
static inline int id_get(MDB_txn *txn, MDB_dbi dbi, uint64_t id, MDB_val *v)
{
	unsigned char kb[8];
	MDB_val k = {8, kb};

	put_be64(kb, id);
	return mdb_err(mdb_get(txn, dbi, &k, v));
}

/* Store size bytes at data as id's value in dbi. 0 or -errno. */
static inline int id_put(MDB_txn *txn, MDB_dbi dbi, uint64_t id, const void *data, size_t size)
{
	unsigned char kb[8];
	MDB_val k = {8, kb}, v = {size, (void *)data};

	put_be64(kb, id);
	return mdb_err(mdb_put(txn, dbi, &k, &v, 0));
}

/* The key of ino's block-map entry idx: both big-endian. */
static inline void bmap_key(unsigned char *kb, uint64_t ino, uint64_t idx)
{
	put_be64(kb, ino);
	put_be64(kb + 8, idx);
}

/* meta.c: the store id's text (32 hex digits and 4 dashes) as 16 bytes; false if it is not one. */
bool meta_store_id_bytes(const char *id, unsigned char out[STORE_ID_BYTES]);

/* meta_lock.c: the lock file and this boot's id. */
int meta_take_lock(struct fs_meta *m, const char *dir, char *err, size_t errlen);
int meta_write_lock(struct fs_meta *m);
void meta_read_boot_id(char id[BOOT_ID_LEN + 1]);

/* meta_durable.c: the durable record, read at open and written by meta_sync. */
int meta_durable_read(int fd, unsigned char *rec, const unsigned char *store, uint64_t *seq,
		      uint64_t *txnid, size_t *psize, unsigned *foreign);
int meta_durable_open_ro(struct fs_meta *m, int *fd, char *err, size_t errlen);
int meta_roll_back(struct fs_meta *m, char *err, size_t errlen);
int meta_open_durable(struct fs_meta *m, char *err, size_t errlen);

/* meta_scratch.c: at open, after the lock is taken: scratch=on's mark, and a store it lost emptied. */
int meta_scratch_open(struct fs_meta *m, char *err, size_t errlen);

/* meta_blocks.c: a block record stored as it is, without its references counted. */
int meta_block_put(struct fs_meta *m, MDB_txn *txn, uint64_t id, const struct meta_block *b);

#endif

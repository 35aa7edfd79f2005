/*
 * meta.c - the metadata store on LMDB.
 *
 * LMDB gives us atomic, crash-consistent transactions and lock-free
 * readers; we add the record formats and the reference counting of blocks.
 * A block record is created by the write-back that wrote it, referenced by
 * one or more block-map entries (copy_file_range shares them), and removed
 * when its last reference goes; its location is then handed back to the
 * caller, who releases it to the block store once the transaction commits.
 *
 * The environment runs with MDB_NOSYNC: a kill of the daemon loses nothing
 * committed (the pages are in the kernel), and meta_sync flushes them for
 * fsync and at the periodic sync point.
 *
 * A power cut is another matter. Without a flush per commit, the kernel
 * may write a commit's meta page before the pages it names (a flush writes
 * a file's dirty pages in any order; LMDB's meta pages are its first two),
 * and LMDB opens the newest meta page it finds: the whole tree, fsynced
 * files too, could be lost. So each sync point records its durable state:
 * meta_sync pins a reader on the newest commit, so that LMDB reuses none of
 * its pages, copies that commit's meta page, has the caller flush the
 * devices (after the pin, so every block the commit names is on them),
 * flushes the environment, and
 * writes the copy to the `durable` file with a checksum (two slots, the
 * newer valid one counts), flushed too; then the reader of the sync point
 * before is let go. When the last stop was unclean and the machine has
 * started since (the boot id in the lock file is another), meta_open
 * writes the recorded meta page over both of LMDB's before opening it:
 * the store is as it was at its last sync point, whose pages are all
 * there. A daemon killed on a running machine lost no page cache, so its
 * store opens as it is.
 *
 * LMDB opens data.mdb and lock.mdb by path, through links. The folder is
 * checked first (tiers/storedir.h: ours, writable by nobody else, no link
 * or foreign file under a store file's name), and LMDB is given the path
 * of our descriptor of it (/proc/self/fd/N), so it opens the files of the
 * folder that was checked.
 */
#include "meta.h"
#include "escape.h"
#include "log.h"
#include "metaguard.h"
#include "mounts.h"
#include "storedir.h"
#include "tb.h"
#include "u64vec.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#define META_MAP_SIZE (64ULL << 30)
#define META_MAP_MIN (1ULL << 30) /* the least map taken when the whole is refused */
#define META_MAX_DBS 16
#define KEY_MAX 520 /* 8 bytes of parent + NAME_MAX and then some */
#define META_WHAT "meta folder"
#define DATA_NAME "data.mdb"
#define LMDB_LOCK_NAME "lock.mdb"
#define LOCK_NAME "lock"
#define DURABLE_NAME "durable"
#define BOOT_ID_LEN 36
#define BOOT_ID_PATH "/proc/sys/kernel/random/boot_id"
#define LOCK_POLL_MS 100 /* how often a start waiting for the store looks again */

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
#define FORMAT_VERSION_MAX 255 /* a format record naming a higher one is garbage */
#define GUARD_ENVS 8	       /* environments abandoned after a fault, kept (abandon_env) */
/* The info record of the devices the store has used (meta_devices_get). */
#define DEVICES_KEY "devices"

static const char *const meta_files[] = {DATA_NAME, LMDB_LOCK_NAME, LOCK_NAME, DURABLE_NAME,
					 NULL};

struct meta_format {
	uint32_t version;
	uint32_t pad;
	uint64_t block_size;
	char store_id[40];
};

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
	pthread_mutex_t sync_lock;  /* one meta_sync at a time */
	MDB_txn *pinned;	    /* a reader on the last sync point's commit */
	uint64_t durable_seq;	    /* records written to the durable file */
	uint64_t durable_txnid;	    /* the commit of the newest one */
	unsigned char *page;	    /* scratch: a meta page */
	size_t psize;
	bool locked; /* we hold the flock */
	bool lock_written; /* and the pid in the file is ours */
	bool keep_note;		  /* the stop failed: the lock file keeps saying so */
	bool created; /* this open made the store */
	bool made_dir, made_lock; /* this open made the folder, the lock file */
	unsigned upgraded_from; /* the format this open upgraded the store from, or 0 */
	char dir[4096];
	void (*on_commit)(void *arg); /* told of every commit (meta_on_commit) */
	void *on_commit_arg;
	uint64_t next_ino;   /* atomic */
	uint64_t next_block; /* atomic */
};

static void put_be64(unsigned char *p, uint64_t v)
{
	for (int i = 7; i >= 0; i--) {
		p[i] = (unsigned char)v;
		v >>= 8;
	}
}

static uint64_t get_be64(const unsigned char *p)
{
	uint64_t v = 0;

	for (int i = 0; i < 8; i++)
		v = v << 8 | p[i];
	return v;
}

/* A store id's text (32 hex digits and 4 dashes) as 16 bytes; false if it is not one. */
static bool store_id_bytes(const char *id, unsigned char out[STORE_ID_BYTES])
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

/*
 * LMDB's result as -errno. LMDB passes the system's errors on as they are
 * (positive errnos: ENOSPC when the metadata's filesystem is full, EIO,
 * ENOMEM...): they keep their errno, so that a full disk reads as one to
 * the writer and in the log, not as an I/O error. Its own codes (negative)
 * that say its pages are damaged are EUCLEAN, as a filesystem says of its
 * own damage; the others, which have no errno of their own, are misuse:
 * EIO.
 */
static int mdb_err(int rc)
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

int locvec_push(struct locvec *v, uint64_t loc)
{
	return u64vec_push(&v->v, &v->n, &v->cap, 16, loc);
}

void locvec_free(struct locvec *v)
{
	free(v->v);
	v->v = NULL;
	v->n = v->cap = 0;
}

/* ---- open ---- */

int meta_check_folder(const char *dir, char *err, size_t errlen)
{
	return storedir_check(META_WHAT, dir, meta_files, err, errlen);
}

/*
 * ---- the holder of a store ----
 *
 * The lock file holds the holder's pid, the boot id it runs under, the id
 * of the store it has open (once it has read it: roll_back applies only a
 * durable record of that store), and a
 * line that says what it is doing: "mounted MOUNTPOINT" while its mount is
 * live; "stopping MOUNTPOINT" once the mount is gone and it writes back
 * what is dirty (fusermount3 -u and umount return before that ends);
 * "failed MOUNTPOINT" when that write-back failed, which stays after the
 * daemon has exited, for tfsctl unmount to tell. No line: it is starting,
 * or it is tfsctl fsck. A clean stop empties the file.
 */
/* A line of the lock file that holds a store id. */
static bool is_store_line(const char *line)
{
	unsigned char id[STORE_ID_BYTES];

	return strlen(line) >= STORE_ID_LEN &&
	       (line[STORE_ID_LEN] == '\n' || !line[STORE_ID_LEN]) && store_id_bytes(line, id);
}

void meta_read_holder(int fd, struct meta_holder *h)
{
	char buf[PATH_MAX + 128], *line;
	ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);

	memset(h, 0, sizeof(*h));
	buf[n > 0 ? n : 0] = 0;
	h->pid = strtol(buf, NULL, 10);
	line = strchr(buf, '\n');
	line = line ? strchr(line + 1, '\n') : NULL; /* past the boot id */
	if (line && is_store_line(line + 1))
		line = strchr(line + 1, '\n'); /* and the store id */
	if (!line || sscanf(line + 1, "%15s", h->state) != 1)
		return;
	line += 1 + strlen(h->state);
	if (*line == ' ')
		snprintf(h->point, sizeof(h->point), "%.*s", (int)strcspn(line + 1, "\n"),
			 line + 1);
}

/* Its mount is live, where we can see: then the store is in use, not waited for. */
static bool holder_serves(const struct meta_holder *h)
{
	return strcmp(h->state, "mounted") == 0 && fs_mount_is_tensorfs(h->point) == 1;
}

/* Why the store in dir cannot be taken now, for a message. */
static void describe_holder(const struct meta_holder *h, const char *dir, char *buf, size_t len)
{
	char pid[32] = "pid unknown";

	if (h->pid > 0)
		snprintf(pid, sizeof(pid), "pid %ld", h->pid);
	if (holder_serves(h))
		snprintf(buf, len,
			 "meta folder %s is in use by tensorfs %s, mounted on %s; unmount it first "
			 "(tfsctl unmount %s)",
			 dir, pid, h->point, h->point);
	else if (h->state[0])
		snprintf(buf, len,
			 "meta folder %s is in use by tensorfs %s, which is still writing back "
			 "after the unmount of %s; wait for it to exit (tfsctl unmount waits)",
			 dir, pid, h->point);
	else
		snprintf(buf, len,
			 "meta folder %s is in use by another tensorfs or tfsctl fsck (%s)", dir,
			 pid);
}

static int take_lock(struct fs_meta *m, const char *dir, char *err, size_t errlen)
{
	char buf[2 * PATH_MAX + 256];
	int fd;

	fd = storedir_open_file(m->dir_fd, META_WHAT, dir, LOCK_NAME, O_RDWR, true, &m->made_lock,
				err, errlen);
	if (fd < 0)
		return fd;
	m->lock_fd = fd;
	if (flock(m->lock_fd, LOCK_EX | LOCK_NB) < 0) {
		struct meta_holder h;

		meta_read_holder(m->lock_fd, &h);
		describe_holder(&h, dir, buf, sizeof(buf));
		snprintf(err, errlen, "%s", buf);
		return -EBUSY;
	}
	m->locked = true;
	/*
	 * A clean stop empties the file. What the last one left: its pid, and
	 * the boot id it ran under (none from before the durable file).
	 */
	char prev[128];
	ssize_t n = pread(m->lock_fd, prev, sizeof(prev) - 1, 0);

	prev[n > 0 ? n : 0] = 0;
	m->unclean = n > 0;
	char *boot = strchr(prev, '\n');

	if (boot && strcspn(boot + 1, "\n") == BOOT_ID_LEN)
		snprintf(m->last_boot, sizeof(m->last_boot), "%.*s", BOOT_ID_LEN, boot + 1);
	/* The store it had open, on the third line (none from before store ids were kept there). */
	char *store = boot ? strchr(boot + 1, '\n') : NULL;

	if (store && is_store_line(store + 1))
		snprintf(m->last_store, sizeof(m->last_store), "%.*s", STORE_ID_LEN, store + 1);
	return 0;
}

/*
 * Our pid, boot and store in the lock file, once the last stop's are
 * dealt with (roll_back): an open that failed before leaves them for the
 * next one. The store is the one the lock named until this open has read
 * its own. Flushed: after a power cut the file must still say that the
 * stop was unclean, or the store would open without its roll-back.
 */
static int write_lock(struct fs_meta *m)
{
	char line[32 + sizeof(m->boot) + sizeof(m->store_id)];
	const char *store = m->store_id[0] ? m->store_id : m->last_store;

	snprintf(line, sizeof(line), "%ld\n%s\n%s%s", (long)getpid(), m->boot, store,
		 store[0] ? "\n" : "");
	if (ftruncate(m->lock_fd, 0) < 0 || pwrite(m->lock_fd, line, strlen(line), 0) < 0 ||
	    fdatasync(m->lock_fd) < 0)
		return -errno;
	m->lock_written = true;
	return 0;
}

int meta_lock_note(struct fs_meta *m, const char *state, const char *point)
{
	char *line;
	int len, ret = 0;

	if (!m->lock_written)
		return 0;
	if (strchr(point, '\n'))
		point = ""; /* the note is one line; such a mount point goes unnamed */
	len = asprintf(&line, "%ld\n%s\n%s%s%s %s\n", (long)getpid(), m->boot, m->store_id,
		       m->store_id[0] ? "\n" : "", state, point);
	if (len < 0)
		return -ENOMEM;
	/* Over the old content, then cut: a reader never finds the file empty. */
	errno = 0;
	if (pwrite(m->lock_fd, line, (size_t)len, 0) != len || ftruncate(m->lock_fd, len) < 0)
		ret = errno ? -errno : -EIO;
	free(line);
	m->keep_note = ret == 0 && strcmp(state, "failed") == 0;
	return ret;
}

/* One line on stderr: whom a start waits for. Paths escaped (escape.h). */
static void say_waiting(const struct meta_holder *h, const char *dir, const char *prog,
			unsigned wait_s)
{
	char esc[ESC_SIZE(PATH_MAX)];

	if (h->pid > 0 && h->state[0])
		fprintf(stderr,
			"%s: waiting for tensorfs pid %ld to finish writing back after the unmount "
			"of %s (up to %u s)\n",
			prog, h->pid, esc_name(h->point, esc, sizeof(esc)), wait_s);
	else
		fprintf(stderr,
			"%s: waiting for pid %ld, which holds meta folder %s (up to %u s)\n", prog,
			h->pid, esc_name(dir, esc, sizeof(esc)), wait_s);
}

/*
 * Wait, polling, until no daemon holds the store in dir, as long as the one
 * that does is not serving a mount that we can see. Its lock goes with its
 * descriptor, so a dead daemon's is free at once.
 */
int meta_wait_holder(const char *dir, unsigned wait_s, const char *prog, char *err, size_t errlen)
{
	char ignored[512];
	struct meta_holder h;
	bool said = false;
	int dfd, fd, ret = 0;

	dfd = storedir_open(META_WHAT, dir, false, NULL, ignored, sizeof(ignored));
	if (dfd < 0)
		return 0; /* no store yet, or one meta_open refuses, saying why */
	fd = storedir_open_file(dfd, META_WHAT, dir, LOCK_NAME, O_RDONLY, false, NULL, ignored,
				sizeof(ignored));
	close(dfd);
	if (fd < 0)
		return 0;
	for (uint64_t ms = 0; flock(fd, LOCK_EX | LOCK_NB) < 0; ms += LOCK_POLL_MS) {
		if (errno != EWOULDBLOCK)
			break; /* meta_open tries again, and says why it cannot */
		meta_read_holder(fd, &h);
		if (holder_serves(&h) || ms >= (uint64_t)wait_s * 1000) {
			describe_holder(&h, dir, err, errlen);
			if (!holder_serves(&h) && wait_s)
				snprintf(err + strlen(err), errlen - strlen(err), " (waited %u s)",
					 wait_s);
			ret = -EBUSY;
			break;
		}
		if (!said)
			say_waiting(&h, dir, prog, wait_s);
		said = true;
		usleep(LOCK_POLL_MS * 1000);
	}
	close(fd); /* and the lock, if we took it: meta_open takes it again */
	return ret;
}

/* This boot's id, or "" where the kernel does not say. */
static void read_boot_id(char id[BOOT_ID_LEN + 1])
{
	FILE *f = fopen(BOOT_ID_PATH, "re");

	id[0] = 0;
	if (!f)
		return;
	if (!fgets(id, BOOT_ID_LEN + 1, f) || strlen(id) != BOOT_ID_LEN)
		id[0] = 0;
	fclose(f);
}

/* ---- the durable file: the last sync point's meta page ---- */

/*
 * A record's checksum: its page, seeded with the hash of the header's
 * first 40 bytes and, from version 2, of its store id.
 */
static uint64_t record_hash(const unsigned char *rec, size_t psize)
{
	uint64_t seed = XXH3_64bits(rec, 40);

	if (get_be64(rec + 8) >= 2)
		seed = XXH3_64bits_withSeed(rec + DURABLE_ID_OFF, STORE_ID_BYTES, seed);
	return XXH3_64bits_withSeed(rec + DURABLE_HDR, psize, seed);
}

/*
 * The newer valid record of fd into rec (DURABLE_STRIDE bytes): 0 with its
 * sequence, commit and page size, -ENOENT when neither slot holds one.
 * With store, only a record that names that store counts; *foreign (when
 * not NULL) counts the valid records passed over, of another store or of
 * none (version 1).
 */
static int durable_read(int fd, unsigned char *rec, const unsigned char *store, uint64_t *seq,
			uint64_t *txnid, size_t *psize, unsigned *foreign)
{
	unsigned char *slot = malloc(DURABLE_STRIDE);
	bool found = false;

	if (!slot)
		return -ENOMEM;
	for (int i = 0; i < 2; i++) {
		ssize_t n = pread(fd, slot, DURABLE_STRIDE, (off_t)i * DURABLE_STRIDE);
		uint64_t ps, version;

		if (n < DURABLE_HDR || get_be64(slot) != DURABLE_MAGIC)
			continue;
		version = get_be64(slot + 8);
		if (version < 1 || version > DURABLE_VERSION)
			continue;
		ps = get_be64(slot + 32);
		if (!ps || ps > DURABLE_PAGE_MAX || (size_t)n < DURABLE_HDR + ps ||
		    get_be64(slot + 40) != record_hash(slot, ps))
			continue;
		if (store &&
		    (version < 2 || memcmp(slot + DURABLE_ID_OFF, store, STORE_ID_BYTES))) {
			if (foreign)
				(*foreign)++;
			continue;
		}
		if (found && get_be64(slot + 16) <= *seq)
			continue;
		found = true;
		*seq = get_be64(slot + 16);
		*txnid = get_be64(slot + 24);
		*psize = ps;
		memcpy(rec, slot, DURABLE_HDR + ps);
	}
	free(slot);
	return found ? 0 : -ENOENT;
}

/* Record page (commit txnid) in the slot after the last one, and flush it. */
static int durable_write(struct fs_meta *m, uint64_t txnid)
{
	size_t len = DURABLE_HDR + m->psize;
	unsigned char *rec = calloc(1, len);
	uint64_t seq = m->durable_seq + 1;
	int ret = 0;

	if (!rec)
		return -ENOMEM;
	put_be64(rec, DURABLE_MAGIC);
	put_be64(rec + 8, DURABLE_VERSION);
	put_be64(rec + 16, seq);
	put_be64(rec + 24, txnid);
	put_be64(rec + 32, m->psize);
	if (!store_id_bytes(m->store_id, rec + DURABLE_ID_OFF))
		memset(rec + DURABLE_ID_OFF, 0, STORE_ID_BYTES); /* names no store */
	memcpy(rec + DURABLE_HDR, m->page, m->psize);
	put_be64(rec + 40, record_hash(rec, m->psize));
	if (pwrite(m->durable_fd, rec, len, (off_t)(seq & 1) * DURABLE_STRIDE) != (ssize_t)len ||
	    fdatasync(m->durable_fd) < 0)
		ret = errno ? -errno : -EIO;
	else
		m->durable_seq = seq;
	free(rec);
	return ret;
}

/* The commit an LMDB 0.9 meta page names, or 0 when it is not one. */
static uint64_t meta_page_txnid(const unsigned char *page)
{
	uint32_t magic;
	uint64_t txnid;

	memcpy(&magic, page + LMDB_META_MAGIC_OFF, sizeof(magic));
	memcpy(&txnid, page + LMDB_META_TXNID_OFF, sizeof(txnid));
	return magic == LMDB_META_MAGIC ? txnid : 0;
}

/* The durable record, opened to read, in *fd (-1 where there is none). 0 or -errno. */
static int durable_open_ro(struct fs_meta *m, int *fd, char *err, size_t errlen)
{
	bool created;

	*fd = storedir_open_file(m->dir_fd, META_WHAT, m->dir, DURABLE_NAME, O_RDONLY, false,
				 &created, err, errlen);
	if (*fd == -ENOENT) {
		err[0] = 0;
		*fd = -1;
		return 0;
	}
	return *fd < 0 ? *fd : 0;
}

/*
 * After an unclean stop on an earlier boot, put the recorded meta page in
 * both of LMDB's slots (see the top of this file). Nothing to do after a
 * clean stop, a kill on this boot, or with no record (a store from before
 * the durable file, or one never synced). Only a record of the store that
 * the lock file names is applied (any record, where it names none: a lock
 * file from before store ids were kept there): a durable file of another
 * store, copied or restored here, would write its meta page over this
 * store's and leave it unreadable.
 */
static int roll_back(struct fs_meta *m, char *err, size_t errlen)
{
	unsigned char *rec = NULL, *cur = NULL, want[STORE_ID_BYTES];
	uint64_t seq, txnid;
	size_t psize;
	bool created, changed = false;
	bool named = m->last_store[0] && store_id_bytes(m->last_store, want);
	unsigned foreign = 0;
	int dfd = -1, fd, ret;

	if (!m->unclean || (m->boot[0] && !strcmp(m->boot, m->last_boot)))
		return 0;
	ret = durable_open_ro(m, &fd, err, errlen);
	if (ret || fd < 0)
		return ret;
	rec = malloc(DURABLE_STRIDE);
	cur = malloc(DURABLE_PAGE_MAX);
	ret = rec && cur
		  ? durable_read(fd, rec, named ? want : NULL, &seq, &txnid, &psize, &foreign)
		  : -ENOMEM;
	close(fd);
	if (ret < 0 && ret != -ENOENT)
		snprintf(err, errlen, "meta folder %s: cannot read %s: %s", m->dir, DURABLE_NAME,
			 strerror(-ret));
	if (ret == -ENOENT && foreign) {
		log_warn("meta folder %s: the last stop was unclean and the machine has started "
			 "since, but %s holds no record of this store (%s), only %u of another "
			 "store or of none: not applied; opening the store as it is",
			 m->dir, DURABLE_NAME, m->last_store, foreign);
		ret = 0;
		goto out;
	}
	if (ret == -ENOENT) {
		log_warn("meta folder %s: the last stop was unclean and the machine has started "
			 "since, but no durable point is recorded: opening the store as it is",
			 m->dir);
		ret = 0;
		goto out;
	}
	if (ret < 0)
		goto out;
	dfd = storedir_open_file(m->dir_fd, META_WHAT, m->dir, DATA_NAME, O_RDWR, false, &created,
				 err, errlen);
	if (dfd == -ENOENT) {
		err[0] = 0;
		ret = 0;
		goto out;
	}
	if (dfd < 0) {
		char why[512];

		snprintf(why, sizeof(why), "%s", err);
		snprintf(err, errlen, "%s; so the store cannot roll back to its last durable point",
			 why);
		ret = dfd;
		goto out;
	}
	/*
	 * The record's commit was flushed before the record was written, and
	 * LMDB's slots only move forward: one of them names it or a later one.
	 * A record newer than both belongs to some other copy of the store.
	 */
	uint64_t newest = 0;

	for (int i = 0; i < 2; i++)
		if (pread(dfd, cur, psize, (off_t)(i * psize)) == (ssize_t)psize &&
		    meta_page_txnid(cur) > newest)
			newest = meta_page_txnid(cur);
	if (!meta_page_txnid(rec + DURABLE_HDR) || meta_page_txnid(rec + DURABLE_HDR) != txnid ||
	    txnid > newest) {
		log_warn("meta folder %s: the last stop was unclean and the machine has started "
			 "since, but its durable record (commit %llu) does not belong to this store "
			 "(its newest commit is %llu): opening the store as it is",
			 m->dir, (unsigned long long)txnid, (unsigned long long)newest);
		goto out;
	}
	for (int i = 0; i < 2 && ret == 0; i++) {
		ssize_t n = pread(dfd, cur, psize, (off_t)(i * psize));

		if (n == (ssize_t)psize && !memcmp(cur, rec + DURABLE_HDR, psize))
			continue;
		if (pwrite(dfd, rec + DURABLE_HDR, psize, (off_t)(i * psize)) != (ssize_t)psize)
			ret = errno ? -errno : -EIO;
		changed = true;
	}
	if (ret == 0 && changed && fdatasync(dfd) < 0)
		ret = -errno;
	if (ret < 0) {
		snprintf(err, errlen, "meta folder %s: cannot roll the store back to its last "
			 "durable point: %s", m->dir, strerror(-ret));
		goto out;
	}
	if (changed)
		log_warn("meta folder %s: the last stop was unclean and the machine has started "
			 "since; the store is rolled back to its last durable point (commit %llu): "
			 "what was not fsynced or flushed before it is gone",
			 m->dir, (unsigned long long)txnid);
out:
	if (dfd >= 0)
		close(dfd);
	free(rec);
	free(cur);
	return ret;
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
	ret = durable_open_ro(m, &dfd, err, errlen);
	if (ret || dfd < 0)
		return ret;
	rec = malloc(DURABLE_STRIDE);
	ret = rec ? durable_read(dfd, rec, NULL, &seq, &txnid, &psize, NULL) : -ENOMEM;
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

/* LMDB's word for a damaged file. */
static bool lmdb_damaged(int rc)
{
	return rc == MDB_CORRUPTED || rc == MDB_PAGE_NOTFOUND || rc == MDB_INVALID ||
	       rc == MDB_VERSION_MISMATCH || rc == MDB_INCOMPATIBLE;
}

/* The tables, made where missing; with err set, as damage where LMDB calls it that. */
static int open_dbs(struct fs_meta *m, MDB_txn *txn, char *err, size_t errlen)
{
	struct {
		const char *name;
		MDB_dbi *dbi;
	} dbs[] = {{"inode", &m->inode},	 {"dirent", &m->dirent}, {"dircook", &m->dircook},
		   {"bmap", &m->bmap},		 {"block", &m->block},	 {"xattr", &m->xattr},
		   {"symlink", &m->symlink}, {"info", &m->info},	 {"dedup", &m->dedup},
		   {"nblocks", &m->nblocks}};

	for (size_t i = 0; i < sizeof(dbs) / sizeof(dbs[0]); i++) {
		int rc = mdb_dbi_open(txn, dbs[i].name, MDB_CREATE, dbs[i].dbi);

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
	bad = !store_id_bytes(f.store_id, id)			 ? "its store id"
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
			snprintf(err, errlen, "cannot upgrade the metadata store from format %u: %s",
				 from, strerror(-rc));
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
 * The files meta_sync needs beside LMDB: data.mdb, to copy meta pages from,
 * and the durable file, made if missing, with the sequence of its newer
 * record. LMDB's page size comes from the environment.
 */
static int open_durable(struct fs_meta *m, char *err, size_t errlen)
{
	unsigned char *rec;
	uint64_t seq, txnid;
	size_t psize;
	MDB_stat st;
	bool created;

	if (mdb_env_stat(m->env, &st) != 0 || !st.ms_psize || st.ms_psize > DURABLE_PAGE_MAX) {
		snprintf(err, errlen, "meta folder %s: LMDB's page size is not one we can record",
			 m->dir);
		return -EINVAL;
	}
	m->psize = st.ms_psize;
	m->data_fd = storedir_open_file(m->dir_fd, META_WHAT, m->dir, DATA_NAME, O_RDONLY, false,
					&created, err, errlen);
	if (m->data_fd < 0)
		return m->data_fd;
	m->durable_fd = storedir_open_file(m->dir_fd, META_WHAT, m->dir, DURABLE_NAME, O_RDWR,
					   true, &created, err, errlen);
	if (m->durable_fd < 0)
		return m->durable_fd;
	rec = malloc(DURABLE_STRIDE);
	if (!rec)
		return -ENOMEM;
	if (durable_read(m->durable_fd, rec, NULL, &seq, &txnid, &psize, NULL) == 0) {
		m->durable_seq = seq;
		m->durable_txnid = txnid;
	}
	free(rec);
	m->page = malloc(m->psize);
	return m->page ? 0 : -ENOMEM;
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
	      uid_t root_uid, gid_t root_gid, char store_id[40], char *err, size_t errlen)
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
	read_boot_id(m->boot);
	snprintf(m->dir, sizeof(m->dir), "%s", dir);
	ret = m->dir_fd = storedir_open(META_WHAT, dir, true, &m->made_dir, err, errlen);
	for (size_t i = 0; ret >= 0 && meta_files[i]; i++)
		ret = storedir_check_file(m->dir_fd, META_WHAT, dir, meta_files[i], err, errlen);
	if (ret < 0)
		goto fail;
	ret = take_lock(m, dir, err, errlen);
	if (ret == 0)
		ret = roll_back(m, err, errlen);
	if (ret == 0)
		ret = write_lock(m);
	if (ret < 0)
		goto fail;
	had_data = fstatat(m->dir_fd, DATA_NAME, &st, AT_SYMLINK_NOFOLLOW) == 0 ||
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
	ret = open_durable(m, err, errlen);
	if (ret < 0)
		goto fail;
	struct open_args a = {m, block_size, block_given, root_uid, root_gid, err, errlen};

	ret = guarded(m, open_tree, &a, err, errlen);
	if (ret < 0)
		goto fail;
	memcpy(store_id, m->store_id, sizeof(m->store_id));
	if (strcmp(m->store_id, m->last_store) != 0)
		ret = write_lock(m); /* now naming this store */
	if (ret < 0) {
		snprintf(err, errlen, "meta folder %s: cannot write %s: %s", dir, LOCK_NAME,
			 strerror(-ret));
		goto fail;
	}
	ret = meta_sync(m, NULL, NULL);
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
			meta_sync(m, NULL, NULL);
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
	return m->created;
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
	m->opened = false; /* nothing of it stays to record */
	remove_made(m, true);
	/* A folder that was there stays: it may be where a drive mounts. */
	if (m->made_dir)
		rmdir(m->dir); /* only if we left it empty */
	meta_close(m);
}

/*
 * The newest commit: a reader pinned on it, and its meta page copied into
 * m->page. Writers are held off meanwhile, so that the page is that
 * commit's. Returns the commit, or 0 when the page does not look like
 * LMDB 0.9's meta page of it (nothing is recorded then), or when it could
 * not be had (*err set): then the sync point fails, and the locations
 * released since the last one stay held (tiers/flush.c), since the record
 * a power cut rolls back to may still name them.
 */
static uint64_t pin_newest(struct fs_meta *m, MDB_txn **reader, int *err)
{
	MDB_txn *w = NULL;
	MDB_envinfo info;
	uint64_t txnid = 0;
	int rc;

	*reader = NULL;
	*err = 0;
	rc = mdb_txn_begin(m->env, NULL, 0, &w);
	if (rc) {
		*err = mdb_err(rc);
		return 0;
	}
	rc = mdb_txn_begin(m->env, NULL, MDB_RDONLY, reader);
	if (rc == 0)
		rc = mdb_env_info(m->env, &info);
	if (rc == 0) {
		txnid = info.me_last_txnid;
		if (pread(m->data_fd, m->page, m->psize, (off_t)((txnid & 1) * m->psize)) !=
		    (ssize_t)m->psize)
			txnid = 0;
	}
	mdb_txn_abort(w);
	if (!txnid) {
		*err = rc ? mdb_err(rc) : -EIO;
		return 0;
	}
	if (meta_page_txnid(m->page) != txnid) {
		static bool said;

		if (!said)
			log_err("meta folder %s: LMDB's meta page is not as expected; sync points "
				"are not recorded, and a power cut may damage the store", m->dir);
		said = true;
		return 0;
	}
	return txnid;
}

int meta_sync(struct fs_meta *m, int (*flush)(void *arg), void *arg)
{
	MDB_txn *reader = NULL;
	uint64_t txnid;
	int ret = 0;

	if (__atomic_load_n(&m->damaged, __ATOMIC_ACQUIRE))
		return -EUCLEAN;
	pthread_mutex_lock(&m->sync_lock);
	txnid = m->page ? pin_newest(m, &reader, &ret) : 0;
	if (ret < 0) {
		if (reader)
			mdb_txn_abort(reader);
		pthread_mutex_unlock(&m->sync_lock);
		return ret;
	}
	if (txnid && txnid == m->durable_txnid && m->pinned) {
		/* Nothing committed since the last record: it and its reader stand. */
		mdb_txn_abort(reader);
		pthread_mutex_unlock(&m->sync_lock);
		return 0;
	}
	/*
	 * The devices are flushed only now that the commit to record is
	 * chosen. Flushed first, a block written back during the flush and
	 * committed before the pin was named by the record without being
	 * durable: after a power cut its slot could hold another file's
	 * bytes.
	 */
	ret = flush ? flush(arg) : 0;
	if (ret == 0)
		ret = mdb_err(mdb_env_sync(m->env, 1));
	if (ret == 0 && txnid)
		ret = durable_write(m, txnid);
	if (ret == 0 && txnid) {
		m->durable_txnid = txnid;
		/* The new point is durable: the pages of the one before may go. */
		if (m->pinned)
			mdb_txn_abort(m->pinned);
		m->pinned = reader;
	} else if (reader) {
		mdb_txn_abort(reader);
	}
	pthread_mutex_unlock(&m->sync_lock);
	return ret;
}

uint64_t meta_durable_commit(struct fs_meta *m)
{
	uint64_t txnid;

	pthread_mutex_lock(&m->sync_lock);
	txnid = m->durable_txnid;
	pthread_mutex_unlock(&m->sync_lock);
	return txnid;
}

uint64_t meta_last_commit(struct fs_meta *m)
{
	MDB_envinfo info;

	return mdb_env_info(m->env, &info) == 0 ? info.me_last_txnid : 0;
}

int meta_begin(struct fs_meta *m, bool write, MDB_txn **txn)
{
	if (__atomic_load_n(&m->damaged, __ATOMIC_ACQUIRE))
		return -EUCLEAN; /* a faulted transaction may hold LMDB's writer lock */
	return mdb_err(mdb_txn_begin(m->env, NULL, write ? 0 : MDB_RDONLY, txn));
}

void meta_on_commit(struct fs_meta *m, void (*fn)(void *arg), void *arg)
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

	if (rc == 0 && m && m->on_commit)
		m->on_commit(m->on_commit_arg);
	if (rc == EIO && env_fs_full(env))
		rc = ENOSPC; /* the writer learns the disk is full, not failing */
	return mdb_err(rc);
}

void meta_abort(MDB_txn *txn)
{
	mdb_txn_abort(txn);
}

uint64_t meta_new_ino(struct fs_meta *m)
{
	return __atomic_fetch_add(&m->next_ino, 1, __ATOMIC_RELAXED);
}

/* ---- records under an 8-byte id (inode number, block id) ---- */

/* id's value in dbi (its key: id big-endian): 0, -ENOENT where it has none, or -errno. */
static int id_get(MDB_txn *txn, MDB_dbi dbi, uint64_t id, MDB_val *v)
{
	unsigned char kb[8];
	MDB_val k = {8, kb};

	put_be64(kb, id);
	return mdb_err(mdb_get(txn, dbi, &k, v));
}

/* Store size bytes at data as id's value in dbi. 0 or -errno. */
static int id_put(MDB_txn *txn, MDB_dbi dbi, uint64_t id, const void *data, size_t size)
{
	unsigned char kb[8];
	MDB_val k = {8, kb}, v = {size, (void *)data};

	put_be64(kb, id);
	return mdb_err(mdb_put(txn, dbi, &k, &v, 0));
}

/* ---- inodes ---- */

int meta_inode_get(struct fs_meta *m, MDB_txn *txn, uint64_t ino, struct meta_inode *rec)
{
	MDB_val v;
	int ret = id_get(txn, m->inode, ino, &v);

	if (ret)
		return ret;
	return meta_decode_inode(v.mv_data, v.mv_size, rec);
}

int meta_inode_put(struct fs_meta *m, MDB_txn *txn, uint64_t ino, const struct meta_inode *rec)
{
	return id_put(txn, m->inode, ino, rec, sizeof(*rec));
}

/* Delete every key of db that starts with the 8-byte prefix ino. */
static int del_prefix(MDB_txn *txn, MDB_dbi dbi, uint64_t ino)
{
	unsigned char kb[8];
	MDB_cursor *c;
	MDB_val k = {8, kb}, v;
	int rc;

	put_be64(kb, ino);
	rc = mdb_cursor_open(txn, dbi, &c);
	if (rc)
		return mdb_err(rc);
	rc = mdb_cursor_get(c, &k, &v, MDB_SET_RANGE);
	while (rc == 0 && k.mv_size >= 8 && get_be64(k.mv_data) == ino) {
		rc = mdb_cursor_del(c, 0);
		if (rc)
			break;
		rc = mdb_cursor_get(c, &k, &v, MDB_GET_CURRENT);
		if (rc == EINVAL || rc == MDB_NOTFOUND) {
			k.mv_size = 8;
			k.mv_data = kb;
			rc = mdb_cursor_get(c, &k, &v, MDB_SET_RANGE);
		}
	}
	mdb_cursor_close(c);
	return rc == MDB_NOTFOUND ? 0 : mdb_err(rc);
}

int meta_inode_purge(struct fs_meta *m, MDB_txn *txn, uint64_t ino, struct locvec *freed)
{
	unsigned char kb[8];
	MDB_val k = {8, kb};
	int ret;

	ret = meta_bmap_clear(m, txn, ino, 0, UINT64_MAX, freed);
	if (!ret)
		ret = del_prefix(txn, m->xattr, ino);
	if (ret)
		return ret;
	put_be64(kb, ino);
	mdb_del(txn, m->symlink, &k, NULL);
	mdb_del(txn, m->nblocks, &k, NULL);
	ret = mdb_err(mdb_del(txn, m->inode, &k, NULL));
	return ret == -ENOENT ? 0 : ret;
}

/* ---- names ---- */

struct dirent_val {
	uint64_t ino;
	uint64_t cookie;
};

static int name_key(unsigned char *kb, uint64_t parent, const char *name, MDB_val *k)
{
	size_t len = strlen(name);

	if (len > 255)
		return -ENAMETOOLONG;
	put_be64(kb, parent);
	memcpy(kb + 8, name, len);
	k->mv_size = 8 + len;
	k->mv_data = kb;
	return 0;
}

/* name's entry in folder parent: its key in k (built in kb), its inode and cookie. */
static int dirent_get(struct fs_meta *m, MDB_txn *txn, uint64_t parent, const char *name,
		      unsigned char *kb, MDB_val *k, uint64_t *ino, uint64_t *cookie)
{
	MDB_val v;
	int ret = name_key(kb, parent, name, k);

	if (ret)
		return ret;
	ret = mdb_err(mdb_get(txn, m->dirent, k, &v));
	if (ret)
		return ret;
	return meta_decode_dirent(v.mv_data, v.mv_size, ino, cookie);
}

/* The key of a folder's entry by cookie (dircook): parent and cookie, in ck (16 bytes). */
static void cookie_key(unsigned char *ck, uint64_t parent, uint64_t cookie, MDB_val *k)
{
	put_be64(ck, parent);
	put_be64(ck + 8, cookie);
	k->mv_size = 16;
	k->mv_data = ck;
}

int meta_dirent_lookup(struct fs_meta *m, MDB_txn *txn, uint64_t parent, const char *name,
		       uint64_t *ino)
{
	unsigned char kb[KEY_MAX];
	MDB_val k;
	uint64_t cookie;

	return dirent_get(m, txn, parent, name, kb, &k, ino, &cookie);
}

/* The next cookie of a folder: one past its highest. */
static int next_cookie(struct fs_meta *m, MDB_txn *txn, uint64_t parent, uint64_t *cookie)
{
	unsigned char kb[16];
	MDB_cursor *c;
	MDB_val k = {16, kb}, v;
	int rc;

	put_be64(kb, parent + 1);
	put_be64(kb + 8, 0);
	rc = mdb_cursor_open(txn, m->dircook, &c);
	if (rc)
		return mdb_err(rc);
	rc = mdb_cursor_get(c, &k, &v, MDB_SET_RANGE);
	if (rc == 0)
		rc = mdb_cursor_get(c, &k, &v, MDB_PREV);
	else if (rc == MDB_NOTFOUND)
		rc = mdb_cursor_get(c, &k, &v, MDB_LAST);
	*cookie = 1;
	if (rc == 0 && k.mv_size == 16 && get_be64(k.mv_data) == parent)
		*cookie = get_be64((unsigned char *)k.mv_data + 8) + 1;
	mdb_cursor_close(c);
	return (rc == 0 || rc == MDB_NOTFOUND) ? 0 : mdb_err(rc);
}

int meta_dirent_add(struct fs_meta *m, MDB_txn *txn, uint64_t parent, const char *name,
		    uint64_t ino)
{
	unsigned char kb[KEY_MAX], ck[16];
	MDB_val k, v, cv;
	struct dirent_val dv = {ino, 0};
	int ret = name_key(kb, parent, name, &k);

	if (ret)
		return ret;
	ret = next_cookie(m, txn, parent, &dv.cookie);
	if (ret)
		return ret;
	v.mv_size = sizeof(dv);
	v.mv_data = &dv;
	ret = mdb_err(mdb_put(txn, m->dirent, &k, &v, MDB_NOOVERWRITE));
	if (ret)
		return ret;
	cookie_key(ck, parent, dv.cookie, &k);
	cv.mv_size = strlen(name);
	cv.mv_data = (void *)name;
	return mdb_err(mdb_put(txn, m->dircook, &k, &cv, 0));
}

int meta_dirent_del(struct fs_meta *m, MDB_txn *txn, uint64_t parent, const char *name)
{
	unsigned char kb[KEY_MAX], ck[16];
	MDB_val k;
	struct dirent_val dv;
	int ret = dirent_get(m, txn, parent, name, kb, &k, &dv.ino, &dv.cookie);

	if (ret)
		return ret;
	ret = mdb_err(mdb_del(txn, m->dirent, &k, NULL));
	if (ret)
		return ret;
	cookie_key(ck, parent, dv.cookie, &k);
	ret = mdb_err(mdb_del(txn, m->dircook, &k, NULL));
	return ret == -ENOENT ? 0 : ret;
}

int meta_dir_empty(struct fs_meta *m, MDB_txn *txn, uint64_t dir)
{
	unsigned char kb[8];
	MDB_cursor *c;
	MDB_val k = {8, kb}, v;
	int rc, ret;

	put_be64(kb, dir);
	rc = mdb_cursor_open(txn, m->dircook, &c);
	if (rc)
		return mdb_err(rc);
	rc = mdb_cursor_get(c, &k, &v, MDB_SET_RANGE);
	if (rc == MDB_NOTFOUND)
		ret = 1;
	else if (rc)
		ret = mdb_err(rc);
	else
		ret = !(k.mv_size == 16 && get_be64(k.mv_data) == dir);
	mdb_cursor_close(c);
	return ret;
}

int meta_readdir(struct fs_meta *m, MDB_txn *txn, uint64_t dir, uint64_t after,
		 meta_dirent_fn fn, void *arg)
{
	unsigned char kb[16];
	MDB_cursor *c;
	MDB_val k = {16, kb}, v;
	int rc;

	put_be64(kb, dir);
	put_be64(kb + 8, after + 1);
	rc = mdb_cursor_open(txn, m->dircook, &c);
	if (rc)
		return mdb_err(rc);
	rc = mdb_cursor_get(c, &k, &v, MDB_SET_RANGE);
	while (rc == 0 && k.mv_size == 16 && get_be64(k.mv_data) == dir) {
		char name[256];
		uint64_t ino, cookie = get_be64((unsigned char *)k.mv_data + 8);
		size_t len = v.mv_size < 255 ? v.mv_size : 255;

		memcpy(name, v.mv_data, len);
		name[len] = 0;
		if (meta_dirent_lookup(m, txn, dir, name, &ino) == 0 &&
		    fn(arg, name, len, ino, cookie))
			break;
		rc = mdb_cursor_get(c, &k, &v, MDB_NEXT);
	}
	mdb_cursor_close(c);
	return (rc == 0 || rc == MDB_NOTFOUND) ? 0 : mdb_err(rc);
}

/* ---- block maps and blocks ---- */

static void bmap_key(unsigned char *kb, uint64_t ino, uint64_t idx)
{
	put_be64(kb, ino);
	put_be64(kb + 8, idx);
}

int meta_inode_blocks(struct fs_meta *m, MDB_txn *txn, uint64_t ino, uint64_t *n)
{
	MDB_val v;
	int ret;

	*n = 0;
	ret = id_get(txn, m->nblocks, ino, &v);
	if (ret)
		return ret == -ENOENT ? 0 : ret;
	return meta_decode_id(v.mv_data, v.mv_size, n);
}

/* ino's block map gained (delta > 0) or lost mappings: keep its count. */
static int blocks_add(struct fs_meta *m, MDB_txn *txn, uint64_t ino, int64_t delta)
{
	unsigned char kb[8];
	MDB_val k = {8, kb}, v;
	uint64_t n;
	int ret;

	if (delta == 0)
		return 0;
	ret = meta_inode_blocks(m, txn, ino, &n);
	if (ret)
		return ret;
	/* A count below what is removed is damage; fsck puts it right. */
	n = delta < 0 && n < (uint64_t)-delta ? 0 : n + (uint64_t)delta;
	put_be64(kb, ino);
	if (n == 0) {
		ret = mdb_err(mdb_del(txn, m->nblocks, &k, NULL));
		return ret == -ENOENT ? 0 : ret;
	}
	v.mv_size = sizeof(n);
	v.mv_data = &n;
	return mdb_err(mdb_put(txn, m->nblocks, &k, &v, 0));
}

int meta_bmap_get(struct fs_meta *m, MDB_txn *txn, uint64_t ino, uint64_t idx, uint64_t *id)
{
	unsigned char kb[16];
	MDB_val k = {16, kb}, v;
	int ret;

	bmap_key(kb, ino, idx);
	ret = mdb_err(mdb_get(txn, m->bmap, &k, &v));
	if (ret)
		return ret;
	return meta_decode_id(v.mv_data, v.mv_size, id);
}

int meta_block_get(struct fs_meta *m, MDB_txn *txn, uint64_t id, struct meta_block *b)
{
	MDB_val v;
	int ret = id_get(txn, m->block, id, &v);

	if (ret)
		return ret == -ENOENT ? -EIO : ret;
	return meta_decode_block(v.mv_data, v.mv_size, b);
}

static int block_put(struct fs_meta *m, MDB_txn *txn, uint64_t id, const struct meta_block *b)
{
	return id_put(txn, m->block, id, b, sizeof(*b));
}

/* Drop the index entry of hash if it names block id. */
static int dedup_forget(struct fs_meta *m, MDB_txn *txn, const uint8_t *hash, uint64_t id)
{
	MDB_val k = {META_HASH_LEN, (void *)hash}, v;
	uint64_t have;
	int ret = mdb_err(mdb_get(txn, m->dedup, &k, &v));

	if (ret == -ENOENT)
		return 0;
	if (!ret)
		ret = meta_decode_id(v.mv_data, v.mv_size, &have);
	if (ret)
		return ret;
	if (have != id)
		return 0;
	ret = mdb_err(mdb_del(txn, m->dedup, &k, NULL));
	return ret == -ENOENT ? 0 : ret;
}

int meta_dedup_find(struct fs_meta *m, MDB_txn *txn, const uint8_t *hash, uint64_t *id,
		    struct meta_block *b)
{
	MDB_val k = {META_HASH_LEN, (void *)hash}, v;
	int ret = mdb_err(mdb_get(txn, m->dedup, &k, &v));

	if (!ret)
		ret = meta_decode_id(v.mv_data, v.mv_size, id);
	if (ret)
		return ret;
	ret = meta_block_get(m, txn, *id, b);
	return ret == -EIO ? -ENOENT : ret;
}

static int block_ref(struct fs_meta *m, MDB_txn *txn, uint64_t id, int delta,
		     struct locvec *freed)
{
	struct meta_block b;
	unsigned char kb[8];
	MDB_val k = {8, kb};
	int ret = meta_block_get(m, txn, id, &b);

	if (ret)
		return ret;
	if (delta < 0 && b.refs <= (uint32_t)-delta) {
		put_be64(kb, id);
		ret = mdb_err(mdb_del(txn, m->block, &k, NULL));
		if (!ret && (b.flags & META_BLOCK_HASHED))
			ret = dedup_forget(m, txn, b.hash, id);
		if (!ret)
			ret = locvec_push(freed, b.loc);
		return ret;
	}
	b.refs = (uint32_t)((int64_t)b.refs + delta);
	return block_put(m, txn, id, &b);
}

/* Drop the reference the mapping (ino, idx) holds: 1 if it had one, 0 if a hole. */
static int unref_mapping(struct fs_meta *m, MDB_txn *txn, uint64_t ino, uint64_t idx,
			 struct locvec *freed)
{
	uint64_t old;
	int ret = meta_bmap_get(m, txn, ino, idx, &old);

	if (ret == -ENOENT)
		return 0;
	if (!ret)
		ret = block_ref(m, txn, old, -1, freed);
	return ret ? ret : 1;
}

int meta_bmap_store(struct fs_meta *m, MDB_txn *txn, uint64_t ino, uint64_t idx, uint64_t loc,
		    uint64_t len, const uint8_t *hash, bool index, struct locvec *freed)
{
	unsigned char kb[16];
	MDB_val k = {16, kb}, v;
	uint64_t id;
	int ret, had;

	had = unref_mapping(m, txn, ino, idx, freed);
	if (had < 0)
		return had;
	bmap_key(kb, ino, idx);
	if (loc == TB_LOC_NONE) {
		ret = mdb_err(mdb_del(txn, m->bmap, &k, NULL));
		if (ret && ret != -ENOENT)
			return ret;
		return blocks_add(m, txn, ino, -had);
	}
	ret = blocks_add(m, txn, ino, !had);
	if (ret)
		return ret;
	id = __atomic_fetch_add(&m->next_block, 1, __ATOMIC_RELAXED);
	struct meta_block b = {.loc = loc, .refs = 1, .len = len};
	if (hash) {
		b.flags |= META_BLOCK_HASHED;
		memcpy(b.hash, hash, META_HASH_LEN);
	}
	ret = block_put(m, txn, id, &b);
	if (ret)
		return ret;
	if (hash && index) {
		/* The newest block with this content is the one others share. */
		MDB_val hk = {META_HASH_LEN, (void *)hash}, hv = {sizeof(id), &id};

		ret = mdb_err(mdb_put(txn, m->dedup, &hk, &hv, 0));
		if (ret)
			return ret;
	}
	v.mv_size = sizeof(id);
	v.mv_data = &id;
	return mdb_err(mdb_put(txn, m->bmap, &k, &v, 0));
}

int meta_bmap_share_block(struct fs_meta *m, MDB_txn *txn, uint64_t ino, uint64_t idx,
			  uint64_t id, const uint8_t *hash, struct locvec *freed)
{
	unsigned char kb[16];
	MDB_val k = {16, kb}, v = {sizeof(id), &id};
	struct meta_block b;
	int ret;

	ret = meta_block_get(m, txn, id, &b);
	if (ret == -EIO || (ret == 0 && (!(b.flags & META_BLOCK_HASHED) ||
					 memcmp(b.hash, hash, META_HASH_LEN) != 0)))
		return -ESTALE;
	if (ret)
		return ret;
	/* Take the new reference before dropping the old: they may be one block. */
	ret = block_ref(m, txn, id, 1, freed);
	if (!ret)
		ret = unref_mapping(m, txn, ino, idx, freed);
	if (ret == 0)
		ret = blocks_add(m, txn, ino, 1);
	else if (ret == 1)
		ret = 0;
	if (ret)
		return ret;
	bmap_key(kb, ino, idx);
	return mdb_err(mdb_put(txn, m->bmap, &k, &v, 0));
}

/*
 * A cursor *c on ino's block map, at its first index from or after: that
 * entry in k and v (k's bytes in kb, 16 of them), and LMDB's code for it in
 * *rc (MDB_NOTFOUND: none). 0, or -errno where no cursor could be opened.
 */
static int bmap_open(struct fs_meta *m, MDB_txn *txn, uint64_t ino, uint64_t from,
		     unsigned char *kb, MDB_cursor **c, MDB_val *k, MDB_val *v, int *rc)
{
	bmap_key(kb, ino, from);
	*rc = mdb_cursor_open(txn, m->bmap, c);
	if (*rc)
		return mdb_err(*rc);
	*rc = mdb_cursor_get(*c, k, v, MDB_SET_RANGE);
	return 0;
}

/* The block map key k is ino's, at an index below to. */
static bool bmap_in(const MDB_val *k, uint64_t ino, uint64_t to)
{
	return k->mv_size == 16 && get_be64(k->mv_data) == ino &&
	       get_be64((unsigned char *)k->mv_data + 8) < to;
}

int meta_bmap_clear(struct fs_meta *m, MDB_txn *txn, uint64_t ino, uint64_t from, uint64_t to,
		    struct locvec *freed)
{
	unsigned char kb[16];
	MDB_cursor *c;
	MDB_val k = {16, kb}, v;
	int64_t dropped = 0;
	int rc, ret = 0;

	ret = bmap_open(m, txn, ino, from, kb, &c, &k, &v, &rc);
	if (ret)
		return ret;
	while (rc == 0 && bmap_in(&k, ino, to)) {
		uint64_t id;

		ret = meta_decode_id(v.mv_data, v.mv_size, &id);
		if (!ret)
			ret = block_ref(m, txn, id, -1, freed);
		if (ret)
			break;
		rc = mdb_cursor_del(c, 0);
		if (rc)
			break;
		dropped++;
		rc = mdb_cursor_get(c, &k, &v, MDB_GET_CURRENT);
		if (rc == EINVAL || rc == MDB_NOTFOUND) {
			/* deleting the last item leaves the cursor past the end */
			bmap_key(kb, ino, from);
			k.mv_size = 16;
			k.mv_data = kb;
			rc = mdb_cursor_get(c, &k, &v, MDB_SET_RANGE);
		}
	}
	mdb_cursor_close(c);
	if (ret)
		return ret;
	if (rc != 0 && rc != MDB_NOTFOUND)
		return mdb_err(rc);
	return blocks_add(m, txn, ino, -dropped);
}

/*
 * Drop dst's mappings in the range, then map each block src stores there:
 * the cost follows the blocks the two ranges store, not the range's length.
 * Clearing first is safe even within one file: the ranges do not overlap,
 * so every block src maps keeps src's reference while dst's go.
 */
int meta_bmap_share(struct fs_meta *m, MDB_txn *txn, uint64_t src, uint64_t sidx, uint64_t dst,
		    uint64_t didx, uint64_t n, struct locvec *freed)
{
	unsigned char kb[16];
	MDB_val k = {16, kb}, v;
	uint64_t idx, id;
	int ret;

	if (n == 0)
		return 0;
	ret = meta_bmap_clear(m, txn, dst, didx, didx + n, freed);
	for (uint64_t from = sidx; ret == 0; from = idx + 1) {
		ret = meta_bmap_next(m, txn, src, from, sidx + n, &idx, &id);
		if (ret == -ENOENT)
			return 0;
		if (!ret)
			ret = block_ref(m, txn, id, 1, freed);
		if (ret)
			break;
		bmap_key(kb, dst, didx + (idx - sidx));
		v.mv_size = sizeof(id);
		v.mv_data = &id;
		ret = mdb_err(mdb_put(txn, m->bmap, &k, &v, 0));
		if (!ret)
			ret = blocks_add(m, txn, dst, 1); /* the range was cleared: each is new */
	}
	return ret;
}

/* Position c at the first mapping of ino in [from, to): 0 with *idx and *id, or -ENOENT. */
static int bmap_seek(MDB_cursor *c, uint64_t ino, uint64_t from, uint64_t to, MDB_cursor_op op,
		     uint64_t *idx, uint64_t *id)
{
	unsigned char kb[16];
	MDB_val k = {16, kb}, v;
	int rc;

	bmap_key(kb, ino, from);
	rc = mdb_cursor_get(c, &k, &v, op);
	if (rc)
		return mdb_err(rc);
	if (k.mv_size != 16 || get_be64(k.mv_data) != ino)
		return -ENOENT;
	*idx = get_be64((unsigned char *)k.mv_data + 8);
	if (*idx < from || *idx >= to)
		return -ENOENT;
	return meta_decode_id(v.mv_data, v.mv_size, id);
}

int meta_bmap_next(struct fs_meta *m, MDB_txn *txn, uint64_t ino, uint64_t from, uint64_t to,
		   uint64_t *idx, uint64_t *id)
{
	MDB_cursor *c;
	int ret;

	if (from >= to)
		return -ENOENT;
	ret = mdb_err(mdb_cursor_open(txn, m->bmap, &c));
	if (ret)
		return ret;
	ret = bmap_seek(c, ino, from, to, MDB_SET_RANGE, idx, id);
	mdb_cursor_close(c);
	return ret;
}

int meta_bmap_walk(struct fs_meta *m, MDB_txn *txn, uint64_t ino, uint64_t from, uint64_t to,
		   meta_bmap_fn fn, void *arg)
{
	MDB_cursor *c;
	uint64_t idx, id;
	int ret;

	if (from >= to)
		return 0;
	ret = mdb_err(mdb_cursor_open(txn, m->bmap, &c));
	if (ret)
		return ret;
	ret = bmap_seek(c, ino, from, to, MDB_SET_RANGE, &idx, &id);
	while (ret == 0) {
		ret = fn(arg, idx, id);
		if (ret)
			break;
		/* MDB_NEXT ignores the key: from only bounds the range here. */
		ret = bmap_seek(c, ino, from, to, MDB_NEXT, &idx, &id);
	}
	mdb_cursor_close(c);
	return ret == -ENOENT ? 0 : ret;
}

struct idx_list {
	uint64_t *idx;
	unsigned n, max;
};

static int idx_add(void *arg, uint64_t idx, uint64_t id)
{
	struct idx_list *l = arg;

	(void)id;
	l->idx[l->n++] = idx;
	return l->n == l->max;
}

int meta_bmap_list(struct fs_meta *m, uint64_t ino, uint64_t from, uint64_t to, uint64_t *idx,
		   unsigned max, unsigned *n)
{
	struct idx_list l = {idx, 0, max};
	MDB_txn *txn;
	int ret;

	*n = 0;
	if (max == 0)
		return 0;
	ret = meta_begin(m, false, &txn);
	if (ret)
		return ret;
	ret = meta_bmap_walk(m, txn, ino, from, to, idx_add, &l);
	meta_abort(txn);
	*n = l.n;
	return ret < 0 ? ret : 0;
}

int meta_bmap_count(struct fs_meta *m, MDB_txn *txn, uint64_t ino, uint64_t from, uint64_t to,
		    uint64_t *count)
{
	unsigned char kb[16];
	MDB_cursor *c;
	MDB_val k = {16, kb}, v;
	int rc, ret;

	*count = 0;
	ret = bmap_open(m, txn, ino, from, kb, &c, &k, &v, &rc);
	if (ret)
		return ret;
	while (rc == 0 && bmap_in(&k, ino, to)) {
		(*count)++;
		rc = mdb_cursor_get(c, &k, &v, MDB_NEXT);
	}
	mdb_cursor_close(c);
	return (rc == 0 || rc == MDB_NOTFOUND) ? 0 : mdb_err(rc);
}

/* ---- xattrs and symlinks ---- */

int meta_xattr_get(struct fs_meta *m, MDB_txn *txn, uint64_t ino, const char *name, void *buf,
		   size_t size, size_t *len)
{
	unsigned char kb[KEY_MAX];
	MDB_val k, v;
	int ret = name_key(kb, ino, name, &k);

	if (ret)
		return ret == -ENAMETOOLONG ? -ERANGE : ret;
	ret = mdb_err(mdb_get(txn, m->xattr, &k, &v));
	if (ret)
		return ret == -ENOENT ? -ENODATA : ret;
	*len = v.mv_size;
	if (size == 0)
		return 0;
	if (size < v.mv_size)
		return -ERANGE;
	memcpy(buf, v.mv_data, v.mv_size);
	return 0;
}

int meta_xattr_set(struct fs_meta *m, MDB_txn *txn, uint64_t ino, const char *name,
		   const void *val, size_t len, int flags)
{
	unsigned char kb[KEY_MAX];
	MDB_val k, v = {len, (void *)val}, old;
	int ret = name_key(kb, ino, name, &k);

	if (ret)
		return ret == -ENAMETOOLONG ? -ERANGE : ret;
	ret = mdb_get(txn, m->xattr, &k, &old);
	if ((flags & XATTR_CREATE) && ret == 0)
		return -EEXIST;
	if ((flags & XATTR_REPLACE) && ret == MDB_NOTFOUND)
		return -ENODATA;
	return mdb_err(mdb_put(txn, m->xattr, &k, &v, 0));
}

int meta_xattr_list(struct fs_meta *m, MDB_txn *txn, uint64_t ino, char *buf, size_t size,
		    size_t *len)
{
	unsigned char kb[8];
	MDB_cursor *c;
	MDB_val k = {8, kb}, v;
	size_t total = 0;
	int rc, ret = 0;

	put_be64(kb, ino);
	rc = mdb_cursor_open(txn, m->xattr, &c);
	if (rc)
		return mdb_err(rc);
	rc = mdb_cursor_get(c, &k, &v, MDB_SET_RANGE);
	while (rc == 0 && k.mv_size > 8 && get_be64(k.mv_data) == ino) {
		size_t n = k.mv_size - 8;

		if (size) {
			if (total + n + 1 > size) {
				ret = -ERANGE;
				break;
			}
			memcpy(buf + total, (char *)k.mv_data + 8, n);
			buf[total + n] = 0;
		}
		total += n + 1;
		rc = mdb_cursor_get(c, &k, &v, MDB_NEXT);
	}
	mdb_cursor_close(c);
	*len = total;
	if (ret)
		return ret;
	return (rc == 0 || rc == MDB_NOTFOUND) ? 0 : mdb_err(rc);
}

int meta_xattr_del(struct fs_meta *m, MDB_txn *txn, uint64_t ino, const char *name)
{
	unsigned char kb[KEY_MAX];
	MDB_val k;
	int ret = name_key(kb, ino, name, &k);

	if (ret)
		return ret == -ENAMETOOLONG ? -ERANGE : ret;
	ret = mdb_err(mdb_del(txn, m->xattr, &k, NULL));
	return ret == -ENOENT ? -ENODATA : ret;
}

int meta_symlink_get(struct fs_meta *m, MDB_txn *txn, uint64_t ino, char *buf, size_t size)
{
	MDB_val v;
	int ret = id_get(txn, m->symlink, ino, &v);

	if (ret)
		return ret == -ENOENT ? -EIO : ret;
	if (v.mv_size >= size)
		return -ENAMETOOLONG;
	memcpy(buf, v.mv_data, v.mv_size);
	buf[v.mv_size] = 0;
	return 0;
}

int meta_symlink_put(struct fs_meta *m, MDB_txn *txn, uint64_t ino, const char *target)
{
	return id_put(txn, m->symlink, ino, target, strlen(target));
}

/* ---- scans at mount ---- */

/* A transaction begun with flags in *txn, and a cursor on dbi in it in *c. 0 or -errno. */
static int txn_cursor(struct fs_meta *m, unsigned flags, MDB_dbi dbi, MDB_txn **txn, MDB_cursor **c)
{
	int rc = mdb_txn_begin(m->env, NULL, flags, txn);

	if (rc)
		return mdb_err(rc);
	rc = mdb_cursor_open(*txn, dbi, c);
	if (rc) {
		mdb_txn_abort(*txn);
		return mdb_err(rc);
	}
	return 0;
}

int meta_foreach_block(struct fs_meta *m,
		       int (*fn)(void *arg, uint64_t id, const struct meta_block *b), void *arg)
{
	MDB_txn *txn;
	MDB_cursor *c;
	MDB_val k, v;
	int rc, ret = 0;

	ret = txn_cursor(m, MDB_RDONLY, m->block, &txn, &c);
	if (ret)
		return ret;
	/* The mount's scan is guarded: see metaguard.h. */
	meta_guard_hold(txn);
	meta_guard_hold(c);
	rc = mdb_cursor_get(c, &k, &v, MDB_FIRST);
	while (rc == 0) {
		struct meta_block b;

		ret = k.mv_size == 8 ? meta_decode_block(v.mv_data, v.mv_size, &b) : -EIO;
		if (!ret)
			ret = fn(arg, get_be64(k.mv_data), &b);
		if (ret)
			break;
		rc = mdb_cursor_get(c, &k, &v, MDB_NEXT);
	}
	meta_guard_release(c);
	meta_guard_release(txn);
	mdb_cursor_close(c);
	mdb_txn_abort(txn);
	if (ret)
		return ret;
	return rc == MDB_NOTFOUND ? 0 : mdb_err(rc);
}

int meta_blocks_list(struct fs_meta *m, MDB_txn *txn, uint64_t from, uint64_t *ids,
		     struct meta_block *b, unsigned max, unsigned *n)
{
	unsigned char kb[8];
	MDB_val k = {8, kb}, v;
	MDB_cursor *c;
	int rc, ret;

	*n = 0;
	ret = mdb_err(mdb_cursor_open(txn, m->block, &c));
	if (ret)
		return ret;
	put_be64(kb, from);
	rc = mdb_cursor_get(c, &k, &v, MDB_SET_RANGE);
	while (rc == 0 && *n < max) {
		/* A malformed record is fsck's to report: passed over here. */
		if (k.mv_size == 8 && meta_decode_block(v.mv_data, v.mv_size, &b[*n]) == 0)
			ids[(*n)++] = get_be64(k.mv_data);
		rc = mdb_cursor_get(c, &k, &v, MDB_NEXT);
	}
	mdb_cursor_close(c);
	return rc == 0 || rc == MDB_NOTFOUND ? 0 : mdb_err(rc);
}

int meta_inodes_flagged(struct fs_meta *m, MDB_txn *txn, uint32_t flags, meta_inode_fn fn,
			void *arg)
{
	MDB_cursor *c;
	MDB_val k, v;
	int rc, ret = 0;

	rc = mdb_cursor_open(txn, m->inode, &c);
	if (rc)
		return mdb_err(rc);
	for (rc = mdb_cursor_get(c, &k, &v, MDB_FIRST); rc == 0;
	     rc = mdb_cursor_get(c, &k, &v, MDB_NEXT)) {
		struct meta_inode rec;

		/* A damaged record is fsck's to report. */
		if (k.mv_size != 8 || meta_decode_inode(v.mv_data, v.mv_size, &rec) != 0 ||
		    !(rec.flags & flags))
			continue;
		ret = fn(arg, get_be64(k.mv_data), &rec);
		if (ret)
			break;
	}
	mdb_cursor_close(c);
	if (ret)
		return ret;
	return rc == MDB_NOTFOUND ? 0 : mdb_err(rc);
}

int meta_purge_orphans(struct fs_meta *m, struct locvec *freed, uint64_t *count)
{
	MDB_txn *txn;
	MDB_cursor *c;
	MDB_val k, v;
	uint64_t *orphans = NULL;
	size_t n = 0, cap = 0;
	int rc, ret = 0;

	*count = 0;
	ret = txn_cursor(m, 0, m->inode, &txn, &c);
	if (ret)
		return ret;
	rc = mdb_cursor_get(c, &k, &v, MDB_FIRST);
	while (rc == 0) {
		struct meta_inode rec;

		/* A damaged record is fsck's to report, not ours to purge. */
		if (k.mv_size == 8 && meta_decode_inode(v.mv_data, v.mv_size, &rec) == 0 &&
		    rec.nlink == 0) {
			if (n == cap) {
				cap = cap ? cap * 2 : 16;
				/* The purge is guarded: its buffer is held (metaguard.h). */
				meta_guard_release(orphans);
				uint64_t *p = realloc(orphans, cap * sizeof(*p));
				if (!p) {
					meta_guard_hold(orphans);
					ret = -ENOMEM;
					break;
				}
				meta_guard_hold(p);
				orphans = p;
			}
			orphans[n++] = get_be64(k.mv_data);
		}
		rc = mdb_cursor_get(c, &k, &v, MDB_NEXT);
	}
	mdb_cursor_close(c);
	for (size_t i = 0; i < n && !ret; i++)
		ret = meta_inode_purge(m, txn, orphans[i], freed);
	meta_guard_release(orphans);
	free(orphans);
	if (ret) {
		mdb_txn_abort(txn);
		return ret;
	}
	*count = n;
	return meta_commit(txn);
}

void meta_counts(struct fs_meta *m, uint64_t *inodes, uint64_t *blocks, uint64_t *mapped)
{
	MDB_txn *txn;
	MDB_stat st;

	*inodes = *blocks = *mapped = 0;
	if (mdb_txn_begin(m->env, NULL, MDB_RDONLY, &txn))
		return;
	if (mdb_stat(txn, m->inode, &st) == 0)
		*inodes = st.ms_entries;
	if (mdb_stat(txn, m->block, &st) == 0)
		*blocks = st.ms_entries;
	if (mdb_stat(txn, m->bmap, &st) == 0)
		*mapped = st.ms_entries;
	mdb_txn_abort(txn);
}

/* Pages of one tree: branches, leaves and overflow pages. */
static uint64_t tree_pages(const MDB_stat *st)
{
	return st->ms_branch_pages + st->ms_leaf_pages + st->ms_overflow_pages;
}

/*
 * The store's size, from outside LMDB (the file) and inside it: its pages
 * up to the highest in use, the trees' pages (the live metadata), and the
 * pages on LMDB's free list (each free-list record is a list of page
 * numbers led by its count), reused once no reader needs them.
 */
void meta_space(struct fs_meta *m, struct meta_space *sp)
{
	MDB_dbi dbis[] = {m->inode, m->dirent, m->dircook, m->bmap,   m->block,
			  m->xattr, m->symlink, m->info,    m->dedup, m->nblocks};
	MDB_envinfo info;
	MDB_cursor *c;
	MDB_txn *txn;
	MDB_stat st;
	MDB_val k, v;
	struct stat fst;
	uint64_t psize = m->psize, pages = 0, free_pages = 0;

	memset(sp, 0, sizeof(*sp));
	if (fstat(m->data_fd, &fst) == 0) {
		sp->file_bytes = (uint64_t)fst.st_size;
		sp->disk_bytes = (uint64_t)fst.st_blocks * 512;
	}
	if (mdb_env_info(m->env, &info) == 0)
		sp->used_bytes = ((uint64_t)info.me_last_pgno + 1) * psize;
	if (mdb_txn_begin(m->env, NULL, MDB_RDONLY, &txn))
		return;
	if (mdb_stat(txn, MAIN_DBI_ID, &st) == 0)
		pages += tree_pages(&st);
	for (size_t i = 0; i < sizeof(dbis) / sizeof(dbis[0]); i++)
		if (mdb_stat(txn, dbis[i], &st) == 0)
			pages += tree_pages(&st);
	if (mdb_cursor_open(txn, FREE_DBI_ID, &c) == 0) {
		while (mdb_cursor_get(c, &k, &v, MDB_NEXT) == 0)
			if (v.mv_size >= sizeof(size_t))
				free_pages += *(const size_t *)v.mv_data;
		mdb_cursor_close(c);
	}
	mdb_txn_abort(txn);
	sp->tree_bytes = pages * psize;
	sp->free_bytes = free_pages * psize;
}

/* ---- raw records, for the offline checker ---- */

static MDB_dbi table_dbi(struct fs_meta *m, enum meta_table t)
{
	switch (t) {
	case META_TAB_INODE:
		return m->inode;
	case META_TAB_DIRENT:
		return m->dirent;
	case META_TAB_DIRCOOK:
		return m->dircook;
	case META_TAB_BMAP:
		return m->bmap;
	case META_TAB_BLOCK:
		return m->block;
	case META_TAB_DEDUP:
		return m->dedup;
	case META_TAB_XATTR:
		return m->xattr;
	case META_TAB_SYMLINK:
		return m->symlink;
	case META_TAB_NBLOCKS:
		return m->nblocks;
	}
	return m->info;
}

/* Decode one record; sizes that no version of this file writes mark it malformed. */
static void rec_decode(enum meta_table t, const MDB_val *k, const MDB_val *v, struct meta_rec *r)
{
	const unsigned char *kb = k->mv_data;
	struct dirent_val dv;

	memset(r, 0, sizeof(*r));
	r->key = k->mv_data;
	r->keylen = k->mv_size;
	if (k->mv_size >= 8)
		r->ino = get_be64(kb);
	switch (t) {
	case META_TAB_INODE:
		r->malformed = k->mv_size != 8 || v->mv_size != sizeof(r->inode);
		if (v->mv_size == sizeof(r->inode))
			memcpy(&r->inode, v->mv_data, sizeof(r->inode));
		break;
	case META_TAB_DIRENT:
	case META_TAB_XATTR:
		r->malformed = k->mv_size <= 8 || k->mv_size > 8 + 255;
		if (k->mv_size > 8) {
			r->name = (const char *)kb + 8;
			r->namelen = k->mv_size - 8;
		}
		if (t == META_TAB_XATTR)
			break;
		r->malformed |= v->mv_size != sizeof(dv);
		if (v->mv_size == sizeof(dv)) {
			memcpy(&dv, v->mv_data, sizeof(dv));
			r->id = dv.ino;
			r->idx = dv.cookie;
		}
		break;
	case META_TAB_DIRCOOK:
		r->malformed = k->mv_size != 16 || v->mv_size == 0 || v->mv_size > 255;
		if (k->mv_size >= 16)
			r->idx = get_be64(kb + 8);
		r->name = v->mv_data;
		r->namelen = v->mv_size;
		break;
	case META_TAB_BMAP:
		r->malformed = k->mv_size != 16 || v->mv_size != sizeof(r->id);
		if (k->mv_size >= 16)
			r->idx = get_be64(kb + 8);
		if (v->mv_size == sizeof(r->id))
			memcpy(&r->id, v->mv_data, sizeof(r->id));
		break;
	case META_TAB_BLOCK:
		/* Records written before blocks carried a hash end after flags; a length, after it. */
		r->malformed = k->mv_size != 8 || v->mv_size < offsetof(struct meta_block, hash) ||
			       v->mv_size > sizeof(r->block);
		r->id = r->ino;
		r->ino = 0;
		memcpy(&r->block, v->mv_data,
		       v->mv_size < sizeof(r->block) ? v->mv_size : sizeof(r->block));
		break;
	case META_TAB_DEDUP:
		r->malformed = k->mv_size != META_HASH_LEN || v->mv_size != sizeof(r->id);
		r->ino = 0;
		r->hash = kb;
		if (v->mv_size == sizeof(r->id))
			memcpy(&r->id, v->mv_data, sizeof(r->id));
		break;
	case META_TAB_SYMLINK:
		r->malformed = k->mv_size != 8;
		r->name = v->mv_data;
		r->namelen = v->mv_size;
		break;
	case META_TAB_NBLOCKS:
		r->malformed = k->mv_size != 8 || v->mv_size != sizeof(r->idx);
		if (v->mv_size == sizeof(r->idx))
			memcpy(&r->idx, v->mv_data, sizeof(r->idx));
		break;
	}
}

int meta_walk(struct fs_meta *m, MDB_txn *txn, enum meta_table t, meta_walk_fn fn, void *arg)
{
	MDB_cursor *c;
	MDB_val k, v;
	int rc, ret = 0;

	rc = mdb_cursor_open(txn, table_dbi(m, t), &c);
	if (rc)
		return mdb_err(rc);
	meta_guard_hold(c); /* fsck reads every page through it: see metaguard.h */
	rc = mdb_cursor_get(c, &k, &v, MDB_FIRST);
	while (rc == 0) {
		struct meta_rec r;

		rec_decode(t, &k, &v, &r);
		ret = fn(arg, &r);
		if (ret)
			break;
		rc = mdb_cursor_get(c, &k, &v, MDB_NEXT);
	}
	meta_guard_release(c);
	mdb_cursor_close(c);
	if (ret)
		return ret;
	return rc == MDB_NOTFOUND ? 0 : mdb_err(rc);
}

/* The key of r in table t, from its fields. */
static int rec_key(enum meta_table t, const struct meta_rec *r, unsigned char *kb, MDB_val *k)
{
	switch (t) {
	case META_TAB_INODE:
	case META_TAB_SYMLINK:
	case META_TAB_NBLOCKS:
	case META_TAB_BLOCK:
		put_be64(kb, t == META_TAB_BLOCK ? r->id : r->ino);
		k->mv_size = 8;
		break;
	case META_TAB_DIRENT:
	case META_TAB_XATTR:
		if (r->namelen == 0 || r->namelen > 255)
			return -EINVAL;
		put_be64(kb, r->ino);
		memcpy(kb + 8, r->name, r->namelen);
		k->mv_size = 8 + r->namelen;
		break;
	case META_TAB_DIRCOOK:
	case META_TAB_BMAP:
		put_be64(kb, r->ino);
		put_be64(kb + 8, r->idx);
		k->mv_size = 16;
		break;
	case META_TAB_DEDUP:
		memcpy(kb, r->hash, META_HASH_LEN);
		k->mv_size = META_HASH_LEN;
		break;
	}
	k->mv_data = kb;
	return 0;
}

int meta_rec_del(struct fs_meta *m, MDB_txn *txn, enum meta_table t, const struct meta_rec *r)
{
	unsigned char kb[KEY_MAX];
	MDB_val k = {r->keylen, (void *)r->key};
	int ret = 0;

	if (!r->key)
		ret = rec_key(t, r, kb, &k);
	if (ret)
		return ret;
	return mdb_err(mdb_del(txn, table_dbi(m, t), &k, NULL));
}

int meta_rec_put(struct fs_meta *m, MDB_txn *txn, enum meta_table t, const struct meta_rec *r)
{
	unsigned char kb[16];
	MDB_val k = {16, kb}, v = {sizeof(r->id), (void *)&r->id};

	switch (t) {
	case META_TAB_INODE:
		return meta_inode_put(m, txn, r->ino, &r->inode);
	case META_TAB_BLOCK:
		return block_put(m, txn, r->id, &r->block);
	case META_TAB_BMAP:
		bmap_key(kb, r->ino, r->idx);
		return mdb_err(mdb_put(txn, m->bmap, &k, &v, 0));
	case META_TAB_NBLOCKS:
		put_be64(kb, r->ino);
		k.mv_size = 8;
		v.mv_data = (void *)&r->idx;
		return mdb_err(mdb_put(txn, m->nblocks, &k, &v, 0));
	default:
		return -EINVAL;
	}
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

/* ---- stored values, decoded with their sizes checked ---- */

int meta_decode_inode(const void *v, size_t len, struct meta_inode *rec)
{
	if (len != sizeof(*rec))
		return -EIO;
	memcpy(rec, v, sizeof(*rec));
	return 0;
}

int meta_decode_dirent(const void *v, size_t len, uint64_t *ino, uint64_t *cookie)
{
	struct dirent_val dv;

	if (len != sizeof(dv))
		return -EIO;
	memcpy(&dv, v, sizeof(dv));
	*ino = dv.ino;
	*cookie = dv.cookie;
	return 0;
}

int meta_decode_id(const void *v, size_t len, uint64_t *id)
{
	if (len != sizeof(*id))
		return -EIO;
	memcpy(id, v, sizeof(*id));
	return 0;
}

int meta_decode_block(const void *v, size_t len, struct meta_block *b)
{
	/* Records written before blocks carried a hash end after flags; a length, after it. */
	if (len < offsetof(struct meta_block, hash) || len > sizeof(*b))
		return -EIO;
	memset(b, 0, sizeof(*b));
	memcpy(b, v, len);
	return 0;
}

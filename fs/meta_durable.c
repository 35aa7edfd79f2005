/*
 * meta_durable.c - the durable record, roll-back and sync points.
 *
 * A power cut is another matter than a kill. Without a flush per commit,
 * the kernel may write a commit's meta page before the pages it names (a
 * flush writes a file's dirty pages in any order; LMDB's meta pages are
 * its first two), and LMDB opens the newest meta page it finds: the whole
 * tree, fsynced files too, could be lost. So each sync point records its
 * durable state: meta_sync pins a reader on the newest commit, so that
 * LMDB reuses none of its pages, copies that commit's meta page, has the
 * caller flush the devices (after the pin, so every block the commit
 * names is on them), flushes the environment, and writes the copy to the
 * `durable` file with a checksum (two slots, the newer valid one counts),
 * flushed too; then the reader of the sync point before is let go. When
 * the last stop was unclean and the machine has started since (the boot
 * id in the lock file is another), meta_open writes the recorded meta page
 * over both of LMDB's before opening it (meta_roll_back): the store is as
 * it was at its last sync point, whose pages are all there. A daemon
 * killed on a running machine lost no page cache, so its store opens as
 * it is.
 */
#include "meta_int.h"

#include "log.h"
#include "storedir.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <xxhash.h>

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
int meta_durable_read(int fd, unsigned char *rec, const unsigned char *store, uint64_t *seq,
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

/* Record page (commit txnid) in the slot after the last one, and flush it when power. */
static int durable_write(struct fs_meta *m, uint64_t txnid, bool power)
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
	if (!meta_store_id_bytes(m->store_id, rec + DURABLE_ID_OFF))
		memset(rec + DURABLE_ID_OFF, 0, STORE_ID_BYTES); /* names no store */
	memcpy(rec + DURABLE_HDR, m->page, m->psize);
	put_be64(rec + 40, record_hash(rec, m->psize));
	if (pwrite(m->durable_fd, rec, len, (off_t)(seq & 1) * DURABLE_STRIDE) != (ssize_t)len ||
	    (power && fdatasync(m->durable_fd) < 0))
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
int meta_durable_open_ro(struct fs_meta *m, int *fd, char *err, size_t errlen)
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
int meta_roll_back(struct fs_meta *m, char *err, size_t errlen)
{
	unsigned char *rec = NULL, *cur = NULL, want[STORE_ID_BYTES];
	uint64_t seq, txnid;
	size_t psize;
	bool created, changed = false;
	bool named = m->last_store[0] && meta_store_id_bytes(m->last_store, want);
	unsigned foreign = 0;
	int dfd = -1, fd, ret;

	if (!m->unclean || (m->boot[0] && !strcmp(m->boot, m->last_boot)))
		return 0;
	ret = meta_durable_open_ro(m, &fd, err, errlen);
	if (ret || fd < 0)
		return ret;
	rec = malloc(DURABLE_STRIDE);
	cur = malloc(DURABLE_PAGE_MAX);
	ret = rec && cur
		  ? meta_durable_read(fd, rec, named ? want : NULL, &seq, &txnid, &psize, &foreign)
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
		log_warn(
		    "meta folder %s: the last stop was unclean and the machine has started "
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
		snprintf(err, errlen,
			 "meta folder %s: cannot roll the store back to its last "
			 "durable point: %s",
			 m->dir, strerror(-ret));
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

/*
 * The files meta_sync needs beside LMDB: data.mdb, to copy meta pages from,
 * and the durable file, made if missing, with the sequence of its newer
 * record. LMDB's page size comes from the environment.
 */
int meta_open_durable(struct fs_meta *m, char *err, size_t errlen)
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
	m->durable_fd = storedir_open_file(m->dir_fd, META_WHAT, m->dir, DURABLE_NAME, O_RDWR, true,
					   &created, err, errlen);
	if (m->durable_fd < 0)
		return m->durable_fd;
	rec = malloc(DURABLE_STRIDE);
	if (!rec)
		return -ENOMEM;
	if (meta_durable_read(m->durable_fd, rec, NULL, &seq, &txnid, &psize, NULL) == 0) {
		m->durable_seq = seq;
		m->durable_txnid = txnid;
	}
	free(rec);
	m->page = malloc(m->psize);
	return m->page ? 0 : -ENOMEM;
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
static uint64_t pin_newest(struct fs_meta *m, MDB_txn **reader, uint64_t *last_pg, int *err)
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
		*last_pg = info.me_last_pgno;
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
				"are not recorded, and a power cut may damage the store",
				m->dir);
		said = true;
		return 0;
	}
	return txnid;
}

/*
 * The last page past which a commit wants the next sync point at once: the
 * store may grow by an eighth of its filesystem's room until then (it grows by
 * two or three such windows before the pages it keeps come back). Every
 * page that the commits after a sync point replace stays kept until the
 * next one (its reader is pinned there), about 10 pages a commit; counted
 * in commits alone (sync_commits), a window of them grew a store on a
 * small filesystem, room left, until it was full: rm then failed with
 * ENOSPC on 20 MB free, all of it LMDB's kept pages.
 */
#define GROW_MIN_BYTES (64 << 10)
#define GROW_MAX_BYTES (64ull << 20)
static uint64_t grow_limit(struct fs_meta *m, uint64_t last_pg)
{
	struct statvfs vfs;
	uint64_t room = GROW_MAX_BYTES * 8;

	if (fstatvfs(m->data_fd, &vfs) == 0)
		room = (uint64_t)vfs.f_bavail * vfs.f_frsize;
	room /= 8;
	if (room < GROW_MIN_BYTES)
		room = GROW_MIN_BYTES;
	if (room > GROW_MAX_BYTES)
		room = GROW_MAX_BYTES;
	return last_pg + room / m->psize;
}

int meta_sync(struct fs_meta *m, int (*flush)(void *arg), void *arg, bool power)
{
	MDB_txn *reader = NULL;
	uint64_t txnid, last_pg = 0;
	int ret = 0;

	if (__atomic_load_n(&m->damaged, __ATOMIC_ACQUIRE))
		return -EUCLEAN;
	pthread_mutex_lock(&m->sync_lock);
	txnid = m->page ? pin_newest(m, &reader, &last_pg, &ret) : 0;
	if (ret < 0) {
		if (reader)
			mdb_txn_abort(reader);
		pthread_mutex_unlock(&m->sync_lock);
		return ret;
	}
	if (txnid && txnid == m->durable_txnid && m->pinned && (m->record_power || !power)) {
		/*
		 * Nothing committed since the last record: it and its reader
		 * stand. A record that scratch=on did not flush is flushed now,
		 * with the devices: the stop's sync point comes here.
		 */
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
	if (ret == 0 && power)
		ret = mdb_err(mdb_env_sync(m->env, 1));
	if (ret == 0 && txnid)
		ret = durable_write(m, txnid, power);
	if (ret == 0 && txnid) {
		m->record_power = power;
		m->durable_txnid = txnid;
		/* The new point is durable: the pages of the one before may go. */
		if (m->pinned)
			mdb_txn_abort(m->pinned);
		m->pinned = reader;
		__atomic_store_n(&m->grow_limit, grow_limit(m, last_pg), __ATOMIC_RELAXED);
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

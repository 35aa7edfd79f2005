/*
 * inode.c - the in-memory inode table.
 *
 * An inode is loaded from the store on first use and stays while the
 * kernel holds lookups on it or an operation holds a reference. When both
 * reach zero its dirty attributes are written back; if it has no name
 * left, its data and records are purged then, which is what keeps
 * open-unlinked files readable until the last close.
 */
#include "fs.h"
#include "log.h"
#include "u64vec.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define ITAB_BUCKETS 4096

int fs_itab_init(struct fs *fs)
{
	fs->itab_mask = ITAB_BUCKETS - 1;
	fs->itab = calloc(ITAB_BUCKETS, sizeof(*fs->itab));
	pthread_mutex_init(&fs->itab_lock, NULL);
	return fs->itab ? 0 : -ENOMEM;
}

void fs_itab_fini(struct fs *fs)
{
	for (size_t b = 0; fs->itab && b <= fs->itab_mask; b++) {
		while (fs->itab[b]) {
			struct fs_inode *in = fs->itab[b];

			fs->itab[b] = in->next;
			pthread_rwlock_destroy(&in->io);
			pthread_mutex_destroy(&in->lock);
			free(in);
		}
	}
	free(fs->itab);
	fs->itab = NULL;
}

int fs_ino_push(struct fs_ino_list *l, uint64_t ino)
{
	return u64vec_push(&l->v, &l->n, &l->cap, 64, ino);
}

void fs_now(int64_t *sec, uint32_t *nsec)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	*sec = ts.tv_sec;
	*nsec = (uint32_t)ts.tv_nsec;
}

void fs_inode_written(struct fs_inode *in, uint64_t end, uint64_t len)
{
	int64_t s;
	uint32_t ns;

	fs_now(&s, &ns);
	pthread_mutex_lock(&in->lock);
	if (end > in->rec.size)
		in->rec.size = end;
	in->unread += len;
	in->rec.mtime = in->rec.ctime = s;
	in->rec.mtime_ns = in->rec.ctime_ns = ns;
	in->attr_dirty = true;
	pthread_mutex_unlock(&in->lock);
}

uint64_t fs_monotonic_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static struct fs_inode **bucket(struct fs *fs, uint64_t ino)
{
	return &fs->itab[(ino * 0x9E3779B97F4A7C15ULL >> 40) & fs->itab_mask];
}

static struct fs_inode *find(struct fs *fs, uint64_t ino)
{
	struct fs_inode *in = *bucket(fs, ino);

	while (in && in->ino != ino)
		in = in->next;
	return in;
}

/* ino's table entry with a reference taken, or NULL where the table has none. */
static struct fs_inode *find_ref(struct fs *fs, uint64_t ino)
{
	struct fs_inode *in;

	pthread_mutex_lock(&fs->itab_lock);
	in = find(fs, ino);
	if (in)
		in->refs++;
	pthread_mutex_unlock(&fs->itab_lock);
	return in;
}

int fs_iget(struct fs *fs, uint64_t ino, struct fs_inode **out)
{
	struct fs_inode *in, *raced;
	struct meta_inode rec;
	MDB_txn *txn;
	int ret;

	in = find_ref(fs, ino);
	if (in) {
		*out = in;
		return 0;
	}

	ret = meta_begin(fs->meta, false, &txn);
	if (ret)
		return ret;
	ret = meta_inode_get(fs->meta, txn, ino, &rec);
	meta_abort(txn);
	if (ret == -ENOENT) {
		static long log_sec;

		/*
		 * The kernel names only inodes it holds a lookup on, and those stay
		 * in the table: one in neither is a record gone from under a name
		 * (or a lookup that raced an unlink). Said, so that an ENOENT a
		 * caller did not expect names its source.
		 */
		if (log_ratelimit(&log_sec, 1))
			log_info("inode %llu is not in the store (MDB_NOTFOUND): its request "
				 "fails with ENOENT",
				 (unsigned long long)ino);
	}
	if (ret)
		return ret;

	in = calloc(1, sizeof(*in));
	if (!in)
		return -ENOMEM;
	in->ino = ino;
	in->rec = rec;
	in->refs = 1;
	pthread_rwlock_init(&in->io, NULL);
	pthread_mutex_init(&in->lock, NULL);

	pthread_mutex_lock(&fs->itab_lock);
	raced = find(fs, ino);
	if (raced) {
		raced->refs++;
		pthread_mutex_unlock(&fs->itab_lock);
		pthread_rwlock_destroy(&in->io);
		pthread_mutex_destroy(&in->lock);
		free(in);
		*out = raced;
		return 0;
	}
	in->next = *bucket(fs, ino);
	*bucket(fs, ino) = in;
	pthread_mutex_unlock(&fs->itab_lock);
	*out = in;
	return 0;
}

int fs_release_locs(struct fs *fs, struct locvec *freed)
{
	for (size_t i = 0; i < freed->n; i++)
		tb_release(fs->tb, freed->v[i]);
	meta_locvec_free(freed);
	return 0;
}

/* End a write txn: committed where ret (its work's result) is 0, else aborted. */
static int commit_or_abort(MDB_txn *txn, int ret)
{
	if (ret == 0)
		return meta_commit(txn);
	meta_abort(txn);
	return ret;
}

int fs_iflush_attr(struct fs *fs, struct fs_inode *in)
{
	MDB_txn *txn;
	struct meta_inode rec;
	int ret;

	pthread_mutex_lock(&in->lock);
	if (!in->attr_dirty) {
		pthread_mutex_unlock(&in->lock);
		return 0;
	}
	pthread_mutex_unlock(&in->lock);

	ret = meta_begin(fs->meta, true, &txn);
	if (ret)
		return ret;
	pthread_mutex_lock(&in->lock);
	rec = in->rec;
	in->attr_dirty = false;
	pthread_mutex_unlock(&in->lock);
	ret = commit_or_abort(txn, meta_inode_put(fs->meta, txn, in->ino, &rec));
	if (ret) {
		pthread_mutex_lock(&in->lock);
		in->attr_dirty = true;
		pthread_mutex_unlock(&in->lock);
		log_err("cannot store the attributes of inode %llu: %s",
			(unsigned long long)in->ino, strerror(-ret));
	}
	return ret;
}

int fs_iflush_all(struct fs *fs)
{
	int ret = 0;

	for (size_t b = 0; b <= fs->itab_mask; b++) {
		pthread_mutex_lock(&fs->itab_lock);
		for (struct fs_inode *in = fs->itab[b]; in; in = in->next) {
			in->refs++;
			pthread_mutex_unlock(&fs->itab_lock);
			int r = fs_iflush_attr(fs, in);
			if (r && !ret)
				ret = r;
			pthread_mutex_lock(&fs->itab_lock);
			in->refs--;
		}
		pthread_mutex_unlock(&fs->itab_lock);
	}
	return ret;
}

/* The inode has no name and no user: drop its cache and its records. */
static void purge(struct fs *fs, struct fs_inode *in)
{
	struct locvec freed = {0};
	MDB_txn *txn;
	int ret;

	tb_drop(fs->tb, in->ino, 0, UINT64_MAX);
	tb_unpin_obj(fs->tb, in->ino); /* its pin goes with its inode record */
	fs_learn_forget(&fs->learn, in->ino);
	ret = meta_begin(fs->meta, true, &txn);
	if (ret == 0)
		ret = commit_or_abort(txn, meta_inode_purge(fs->meta, txn, in->ino, &freed));
	if (ret) {
		/* Left for the orphan scan at the next mount. */
		log_err("cannot purge deleted inode %llu: %s", (unsigned long long)in->ino,
			strerror(-ret));
		meta_locvec_free(&freed);
		return;
	}
	fs_release_locs(fs, &freed);
}

/* Unlink from the table if unused; the caller then finishes with it. */
static bool detach_if_unused(struct fs *fs, struct fs_inode *in)
{
	struct fs_inode **p;

	if (in->refs || in->nlookup)
		return false;
	for (p = bucket(fs, in->ino); *p != in; p = &(*p)->next)
		;
	*p = in->next;
	return true;
}

static void finish(struct fs *fs, struct fs_inode *in)
{
	if (in->rec.nlink == 0)
		purge(fs, in);
	else
		fs_iflush_attr(fs, in);
	pthread_rwlock_destroy(&in->io);
	pthread_mutex_destroy(&in->lock);
	free(in);
}

void fs_iput(struct fs *fs, struct fs_inode *in)
{
	bool gone;

	pthread_mutex_lock(&fs->itab_lock);
	in->refs--;
	gone = detach_if_unused(fs, in);
	pthread_mutex_unlock(&fs->itab_lock);
	if (gone)
		finish(fs, in);
}

void fs_ilookup_add(struct fs *fs, struct fs_inode *in, uint64_t n)
{
	pthread_mutex_lock(&fs->itab_lock);
	in->nlookup += n;
	pthread_mutex_unlock(&fs->itab_lock);
}

void fs_iforget(struct fs *fs, uint64_t ino, uint64_t n)
{
	struct fs_inode *in;
	bool gone = false;

	pthread_mutex_lock(&fs->itab_lock);
	in = find(fs, ino);
	if (in) {
		in->nlookup = in->nlookup > n ? in->nlookup - n : 0;
		gone = detach_if_unused(fs, in);
	}
	pthread_mutex_unlock(&fs->itab_lock);
	if (gone)
		finish(fs, in);
}

uint64_t fs_inode_blocks(struct fs *fs, uint64_t ino, mode_t mode)
{
	uint64_t stored = 0;
	MDB_txn *txn;

	if (!S_ISREG(mode))
		return 0;
	if (meta_begin(fs->meta, false, &txn) == 0) {
		if (meta_inode_blocks(fs->meta, txn, ino, &stored) < 0)
			stored = 0; /* a damaged count: fsck's to report */
		meta_abort(txn);
	}
	return stored + tb_unstored(fs->tb, ino);
}

void fs_inode_stat(const struct fs *fs, uint64_t ino, const struct meta_inode *rec,
		   uint64_t nblocks, struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_ino = ino;
	st->st_mode = rec->mode;
	st->st_nlink = rec->nlink;
	st->st_uid = rec->uid;
	st->st_gid = rec->gid;
	st->st_rdev = rec->rdev;
	st->st_size = (off_t)rec->size;
	st->st_blksize = (blksize_t)fs->bs;
	st->st_blocks = (blkcnt_t)(nblocks * (fs->bs / 512)); /* st_blocks counts 512 bytes */
	st->st_atim.tv_sec = rec->atime;
	st->st_atim.tv_nsec = rec->atime_ns;
	st->st_mtim.tv_sec = rec->mtime;
	st->st_mtim.tv_nsec = rec->mtime_ns;
	st->st_ctim.tv_sec = rec->ctime;
	st->st_ctim.tv_nsec = rec->ctime_ns;
}

/*
 * pins.c - files pinned in DRAM, kept across mounts.
 *
 * A pin loads the blocks a file stores and marks its cached object pinned
 * (tb_pin_obj), so that no policy evicts them; then META_INODE_PINNED is
 * set in the file's inode record, with the rest of its metadata. At mount
 * a thread (tfs-pins) finds the files so marked, pins each again and has
 * the prefetcher load it in the background (fs_prefetch_hint), waiting
 * while the hint queue is full, so the mount does not wait for the loads.
 * unpin and evict clear the mark; an unlinked file takes it with its
 * inode. pin_lock orders the changes of a pin against each other and
 * against the thread. The list of pins (/.tensorfs/pins) names each
 * pinned file by its path (paths.c).
 */
#include "fs.h"
#include "log.h"
#include "worker.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define PIN_STEP_BLOCKS 64 /* blocks a pin takes from the block map between loads */
#define PIN_RETRY_MS 50	   /* the restore thread asks again this often for a hint slot */

/* Blocks ino's block map holds: what a pin of it loads. */
static uint64_t stored_blocks(struct fs *fs, uint64_t ino)
{
	uint64_t n = 0;
	MDB_txn *txn;

	if (meta_begin(fs->meta, false, &txn) == 0) {
		if (meta_inode_blocks(fs->meta, txn, ino, &n) < 0)
			n = 0;
		meta_abort(txn);
	}
	return n;
}

bool fs_pin_marked(struct fs *fs, uint64_t ino)
{
	struct fs_inode *in;
	bool marked;

	if (fs_iget(fs, ino, &in) != 0)
		return false;
	pthread_mutex_lock(&in->lock);
	marked = in->rec.flags & META_INODE_PINNED;
	pthread_mutex_unlock(&in->lock);
	fs_iput(fs, in);
	return marked;
}

/*
 * Load every stored block of ino into DRAM and keep it there. Holes take
 * no DRAM, and a dirty block not yet written back is resident already, so
 * only the block map's entries are visited. A pin that fails leaves the
 * file pinned only if it was marked pinned before.
 */
int fs_pin(struct fs *fs, uint64_t ino)
{
	struct fs_inode *in;
	uint64_t idx[PIN_STEP_BLOCKS], nblk, from = 0;
	unsigned n;
	int ret = fs_iget(fs, ino, &in);

	if (ret)
		return ret;
	pthread_mutex_lock(&in->lock);
	nblk = (in->rec.size + fs->bs - 1) / fs->bs;
	pthread_mutex_unlock(&in->lock);
	ret = tb_pin_obj(fs->tb, ino, stored_blocks(fs, ino));
	while (!ret) {
		ret = meta_bmap_list(fs->meta, ino, from, nblk, idx, PIN_STEP_BLOCKS, &n);
		for (unsigned i = 0; i < n && !ret; i++) {
			struct tb_ref ref;

			pthread_rwlock_rdlock(&in->io);
			ret = tb_get(fs->tb, ino, idx[i], &ref, NULL);
			pthread_rwlock_unlock(&in->io);
			if (ret == 0)
				tb_put(fs->tb, &ref, 0);
			else if (ret == -ENOENT)
				ret = 0; /* became a hole meanwhile */
		}
		if (ret || n < PIN_STEP_BLOCKS)
			break;
		from = idx[n - 1] + 1;
	}
	if (ret && !fs_pin_marked(fs, ino))
		tb_unpin_obj(fs->tb, ino);
	fs_iput(fs, in);
	return ret;
}

int fs_pin_mark(struct fs *fs, uint64_t ino, bool pinned)
{
	struct fs_inode *in;
	struct meta_inode rec;
	uint32_t flags;
	MDB_txn *txn;
	int ret = fs_iget(fs, ino, &in);

	if (ret)
		return ret;
	pthread_mutex_lock(&in->lock);
	flags = pinned ? in->rec.flags | META_INODE_PINNED : in->rec.flags & ~META_INODE_PINNED;
	if (flags == in->rec.flags) {
		pthread_mutex_unlock(&in->lock);
		fs_iput(fs, in);
		return 0;
	}
	in->rec.flags = flags;
	in->attr_dirty = false; /* the whole record goes now */
	rec = in->rec;
	pthread_mutex_unlock(&in->lock);
	ret = meta_begin(fs->meta, true, &txn);
	if (!ret) {
		ret = meta_inode_put(fs->meta, txn, ino, &rec);
		ret = ret ? (meta_abort(txn), ret) : meta_commit(txn);
	}
	if (ret) {
		pthread_mutex_lock(&in->lock);
		in->attr_dirty = true; /* written with the next change, or at release */
		pthread_mutex_unlock(&in->lock);
		log_err("inode %llu: cannot record its pin: %s", (unsigned long long)ino,
			strerror(-ret));
	}
	fs_iput(fs, in);
	return ret;
}

/* ---- at mount: pin the marked files again ---- */

static int collect_file(void *arg, uint64_t ino, const struct meta_inode *rec)
{
	return S_ISREG(rec->mode) ? fs_ino_push(arg, ino) : 0;
}

/* Wait up to ms for the stop; pin_lock held. True when stopping. */
static bool pins_wait(struct fs *fs, unsigned ms)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_nsec += (long)ms * 1000000L;
	ts.tv_sec += ts.tv_nsec / 1000000000L;
	ts.tv_nsec %= 1000000000L;
	if (!fs->pin_stop)
		pthread_cond_timedwait(&fs->pin_cv, &fs->pin_lock, &ts);
	return fs->pin_stop;
}

/* Pin ino again and queue its load; pin_lock held. False when it does not fit. */
static bool restore_one(struct fs *fs, uint64_t ino)
{
	uint64_t nblocks = stored_blocks(fs, ino);
	int ret;

	if (!fs_pin_marked(fs, ino))
		return true; /* unpinned since the list was made */
	ret = tb_pin_obj(fs->tb, ino, nblocks);
	if (ret) {
		log_warn("pinned inode %llu (%llu blocks) %s; not pinned at this mount (tfsctl "
			 "unpin forgets it)",
			 (unsigned long long)ino, (unsigned long long)nblocks,
			 ret == -ENOSPC ? "does not fit next to the other pins" : strerror(-ret));
		return false;
	}
	while (fs_prefetch_hint(fs, ino, (uint32_t)getuid()) == -EBUSY)
		if (pins_wait(fs, PIN_RETRY_MS))
			break;
	return true;
}

static void *pins_main(void *arg)
{
	struct fs *fs = arg;
	struct fs_ino_list files = {0};
	size_t done = 0, refused = 0;
	MDB_txn *txn;
	int ret;

	pthread_setname_np(pthread_self(), "tfs-pins");
	ret = meta_begin(fs->meta, false, &txn);
	if (!ret) {
		ret = meta_inodes_flagged(fs->meta, txn, META_INODE_PINNED, collect_file, &files);
		meta_abort(txn);
	}
	if (ret)
		log_err("cannot list the pinned files: %s", strerror(-ret));
	pthread_mutex_lock(&fs->pin_lock);
	for (; done < files.n && !fs->pin_stop; done++)
		refused += !restore_one(fs, files.v[done]);
	pthread_mutex_unlock(&fs->pin_lock);
	if (files.n)
		log_info(
		    "%zu pinned files pinned again, loading in the background; %zu did not fit",
		    done - refused, refused);
	free(files.v);
	return NULL;
}

int fs_pins_start(struct fs *fs)
{
	return fs_worker_start(&fs->pin_thread, &fs->pin_stop, &fs->pin_running, pins_main, fs);
}

void fs_pins_stop(struct fs *fs)
{
	fs_worker_stop(fs->pin_thread, &fs->pin_lock, &fs->pin_cv, &fs->pin_stop, &fs->pin_running);
}

/* ---- the list ---- */

/* The pinned files, in inode order; their paths come from fs_paths_find. */
struct pin_list {
	struct fs_path *v;
	size_t n;
};

static int collect_pin(void *arg, uint64_t ino, const struct meta_inode *rec)
{
	struct pin_list *l = arg;
	struct fs_path *p;

	/*
	 * An unlinked file's pin goes with its last name, though the inode
	 * waits for its last reference (the pin's own load, an open): listed
	 * then, it had no path (seen once in mount-pins, under load).
	 */
	if (!S_ISREG(rec->mode) || rec->nlink == 0)
		return 0;
	p = realloc(l->v, (l->n + 1) * sizeof(*p));
	if (!p)
		return -ENOMEM;
	l->v = p;
	l->v[l->n++] = (struct fs_path){.ino = ino};
	return 0;
}

static json_t *pin_json(struct fs *fs, const struct fs_path *p)
{
	uint64_t size = 0, resident;
	struct fs_inode *in;
	bool active = false;

	if (fs_iget(fs, p->ino, &in) == 0) {
		pthread_mutex_lock(&in->lock);
		size = in->rec.size;
		pthread_mutex_unlock(&in->lock);
		fs_iput(fs, in);
	}
	resident = tb_resident(fs->tb, p->ino, &active);
	return json_pack("{sssIsIsIsIsb}", "path", p->path ? p->path : "", "ino",
			 (json_int_t)p->ino, "size", (json_int_t)size, "stored",
			 (json_int_t)(stored_blocks(fs, p->ino) * fs->bs), "resident",
			 (json_int_t)(resident * fs->bs), "active", active);
}

json_t *fs_pins_json(struct fs *fs)
{
	struct pin_list pins = {0};
	json_t *list = NULL, *j = NULL;
	MDB_txn *txn;
	int ret = meta_begin(fs->meta, false, &txn);

	if (ret)
		return NULL;
	ret = meta_inodes_flagged(fs->meta, txn, META_INODE_PINNED, collect_pin, &pins);
	if (!ret)
		ret = fs_paths_find(fs, txn, pins.v, pins.n);
	meta_abort(txn);
	if (!ret)
		list = json_array();
	for (size_t i = 0; list && i < pins.n; i++)
		json_array_append_new(list, pin_json(fs, &pins.v[i]));
	if (list)
		j = json_pack("{so}", "pins", list);
	for (size_t i = 0; i < pins.n; i++)
		free(pins.v[i].path);
	free(pins.v);
	return j;
}

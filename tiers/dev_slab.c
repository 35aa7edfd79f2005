/*
 * dev_slab.c - a slab device's folder: its identity, its slab file,
 * opening it, and giving the slab's free space back.
 *
 * A slab device is a folder holding `tensorfs.slab`, a file of block-size
 * slots, and `tensorfs.dev`, which binds the folder to the store and to
 * its position so that reordered or foreign folders are caught at mount.
 * The folder and both files are checked against other users (storedir.h)
 * and opened through one descriptor of the folder.
 * Capacity is the filesystem's free space plus what the slab holds, less
 * a 1% reserve for the metadata store, or the cap if smaller. Space free
 * in the slab for a while goes back to the filesystem (dev_give_back): a
 * free end is cut off, free runs within are punched, and a write into a
 * punched slot allocates its run again first, as the slab's growth does.
 *
 * Calls the engines (dev_engine.c) to set one up, the queue (dev.c) and
 * dev_measure.c; nothing in the device calls it.
 */
#include "dev_int.h"
#include "log.h"
#include "storedir.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

static void dev_err(char *err, size_t errlen, const char *fmt, const char *dir, int e)
{
	char what[600];

	snprintf(what, sizeof(what), fmt, dir);
	snprintf(err, errlen, "%s: %s", what, strerror(e));
}

void dev_forget_identity(struct tb_dev *d)
{
	if (d->id_made && unlinkat(d->dir_fd, ID_NAME, 0) < 0)
		log_warn("%s (%s): cannot remove " ID_NAME ": %s", d->name, d->where,
			 strerror(errno));
	if (d->slab_made && unlinkat(d->dir_fd, SLAB_NAME, 0) < 0)
		log_warn("%s (%s): cannot remove " SLAB_NAME ": %s", d->name, d->where,
			 strerror(errno));
	d->id_made = d->slab_made = false;
}

/* ---- giving space back ---- */

/*
 * The slab's end, once every slot past the last in use has given its
 * space back: cut off (ftruncate), so the file shrinks and the slab grows
 * again from there ahead of writes (slab_grow). Quick, since nothing is
 * left there to free, and under the device lock, so that no slot past it
 * is handed out meanwhile. Lock held.
 */
static void cut_end(struct tb_dev *d, uint64_t end)
{
	uint64_t high = slot_alloc_high(&d->alloc);

	if (high >= end || !slot_alloc_all_holes(&d->alloc, high, end))
		return;
	if (ftruncate(d->fd, (off_t)(high * d->block_size)) < 0) {
		if (log_ratelimit(&d->err_log_sec, 10))
			log_err("%s: cannot cut the slab's free end: %s", d->name,
				strerror(errno));
		return;
	}
	slot_alloc_no_space(&d->alloc, high, end); /* past the end: no holes, no space */
	__atomic_store_n(&d->slab_end, high * d->block_size, __ATOMIC_RELAXED);
}

bool dev_give_back(struct tb_dev *d, const bool *stop)
{
	uint64_t pos = 0, end, n, max = SLAB_GROW / d->block_size;
	bool more;

	pthread_mutex_lock(&d->lock);
	if (!d->give_back || d->fd < 0 || d->eng->alloc) {
		pthread_mutex_unlock(&d->lock);
		return false;
	}
	end = dev_slab_slots(d);
	while (!__atomic_load_n(stop, __ATOMIC_RELAXED) &&
	       (n = slot_alloc_ripe(&d->alloc, &pos, end)) > 0) {
		/*
		 * SLAB_GROW at a time, and at most half the free slots: the
		 * flusher may want a slot meanwhile, and a held one is not
		 * handed out (it still counts as free, for writers'
		 * reservations). A punch frees extents, and with the discard
		 * mount option waits for the drive to trim them.
		 */
		uint64_t free_slots = d->alloc.nslots - d->alloc.used;
		int ret;

		if (n > max)
			n = max;
		if (n > free_slots / 2)
			n = free_slots / 2;
		if (!n)
			break;
		slot_alloc_hold(&d->alloc, pos, n);
		pthread_mutex_unlock(&d->lock);
		ret = fallocate(d->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
				(off_t)(pos * d->block_size), (off_t)(n * d->block_size)) < 0
			      ? -errno
			      : 0;
		pthread_mutex_lock(&d->lock);
		slot_alloc_unhold(&d->alloc, pos, n, ret == 0);
		if (ret < 0) {
			if (ret == -EOPNOTSUPP || ret == -ENOSYS) {
				log_info("%s: its filesystem cannot punch holes; free slab space "
					 "stays in the slab",
					 d->name);
				d->give_back = false;
			} else if (log_ratelimit(&d->err_log_sec, 10)) {
				log_err("%s: cannot give back %llu bytes of free slab space: %s",
					d->name, (unsigned long long)(n * d->block_size),
					strerror(-ret));
			}
			break;
		}
		d->returned_bytes += n * d->block_size;
		pos += n;
	}
	if (d->give_back)
		cut_end(d, end);
	more = d->give_back && slot_alloc_see(&d->alloc, dev_slab_slots(d)) > 0;
	pthread_mutex_unlock(&d->lock);
	return more;
}

/* ---- slab devices ---- */

static const char *const slab_files[] = {SLAB_NAME, ID_NAME, NULL};

static const char *folder_what(enum tb_kind kind)
{
	return kind == TB_KIND_PFS ? "pfs folder" : "nvme folder";
}

/*
 * The identity in the checked folder dirfd: 0 with its store id, index
 * and binding ("" in one from before bindings; bind may be NULL), -ENOENT
 * when there is none, or -errno with err set.
 */
static int read_identity(int dirfd, const char *what, const char *dir, char id[64], unsigned *idx,
			 char *bind, char *err, size_t errlen)
{
	char line[200], kind[16];
	int fd = storedir_open_file(dirfd, what, dir, ID_NAME, O_RDONLY, false, NULL, err, errlen);
	FILE *f;
	bool ok;

	if (fd < 0)
		return fd;
	f = fdopen(fd, "r");
	if (!f) {
		int e = errno;

		close(fd);
		snprintf(err, errlen, "%s %s: cannot read " ID_NAME ": %s", what, dir, strerror(e));
		return -e;
	}
	ok = fgets(line, sizeof(line), f) &&
	     sscanf(line, "tensorfs-dev store=%63s index=%u kind=%15s", id, idx, kind) >= 2;
	fclose(f);
	if (ok && bind)
		ok = dev_parse_bind(line, bind);
	if (!ok) {
		snprintf(err, errlen, "%s %s: %s is malformed", what, dir, ID_NAME);
		return -EINVAL;
	}
	return 0;
}

int tb_check_folder(enum tb_kind kind, const char *dir, char *err, size_t errlen)
{
	return storedir_check(folder_what(kind), dir, slab_files, err, errlen);
}

int tb_check_unclaimed(enum tb_kind kind, const char *dir, const char *meta, char *err,
		       size_t errlen)
{
	const char *what = folder_what(kind);
	char id[64] = "";
	unsigned idx = 0;
	int fd, ret;

	fd = storedir_open(what, dir, false, NULL, err, errlen);
	if (fd < 0)
		return fd;
	ret = read_identity(fd, what, dir, id, &idx, NULL, err, errlen);
	close(fd);
	if (ret == -ENOENT)
		return 0;
	if (ret)
		return ret;
	snprintf(err, errlen,
		 "%s %s holds " ID_NAME " of store %s but meta folder %s holds no store: remove "
		 "%s/" ID_NAME " and %s/" SLAB_NAME " if that store is gone, or give the meta= "
		 "folder it was created with",
		 what, dir, id, meta, dir, dir);
	return -EEXIST;
}

/*
 * Check that the folder is bound to this store and this position in the
 * list: block locations name devices by position. A folder without an
 * identity is opened without one (d->id_missing), and tb_check_devices
 * decides; but a slab file there without an identity belongs to no store
 * that can be named, and is refused.
 */
static int check_identity(struct tb_dev *d, const char *what, const char *dir, const char *store_id,
			  char *err, size_t errlen)
{
	char id[64] = "";
	unsigned idx = 0;
	struct stat st;
	int ret;

	ret = read_identity(d->dir_fd, what, dir, id, &idx, d->bind, err, errlen);
	if (ret == 0) {
		if (strcmp(id, store_id) != 0) {
			snprintf(err, errlen,
				 "%s %s belongs to another tensorfs store (%s); give the "
				 "meta= folder it was created with",
				 what, dir, id);
			return -EINVAL;
		}
		if (idx != d->index) {
			snprintf(err, errlen,
				 "%s %s was device %u of this store but is now %u; keep the "
				 "nvme= folders in their original order, with remote= after them",
				 what, dir, idx, d->index);
			return -EINVAL;
		}
		return 0;
	}
	if (ret != -ENOENT)
		return ret;
	err[0] = 0;
	if (fstatat(d->dir_fd, SLAB_NAME, &st, AT_SYMLINK_NOFOLLOW) == 0) {
		snprintf(err, errlen,
			 "%s %s holds " SLAB_NAME " but no " ID_NAME ": whose blocks the slab "
			 "holds cannot be told; put back its " ID_NAME ", or remove %s/" SLAB_NAME
			 " if it holds nothing of use",
			 what, dir, dir);
		return -EINVAL;
	}
	d->id_missing = true;
	return 0;
}

/* The identity of a slab folder: one line, flushed. */
static int write_identity(struct tb_dev *d, const char *store_id, char *err, size_t errlen)
{
	const char *what = folder_what(strcmp(d->kind, "pfs") == 0 ? TB_KIND_PFS : TB_KIND_NVME);
	FILE *f;
	int fd, ret;

	fd = storedir_open_file(d->dir_fd, what, d->where, ID_NAME, O_WRONLY, true, &d->id_made,
				err, errlen);
	if (fd < 0)
		return fd;
	if (!d->id_made) { /* made by someone else since we looked: never write into it */
		close(fd);
		snprintf(err, errlen,
			 "%s %s: " ID_NAME " appeared while this mount started; is another "
			 "tensorfs starting on this folder?",
			 what, d->where);
		return -EEXIST;
	}
	f = fdopen(fd, "w");
	if (!f) {
		ret = -errno;
		close(fd);
		dev_err(err, errlen, "folder %s: cannot write " ID_NAME, d->where, -ret);
		return ret;
	}
	fprintf(f, "tensorfs-dev store=%s index=%u kind=%s bind=%s\n", store_id, d->index, d->kind,
		d->bind);
	if (fflush(f) != 0 || fsync(fileno(f)) != 0) {
		ret = -errno;
		dev_err(err, errlen, "folder %s: cannot write " ID_NAME, d->where, -ret);
		fclose(f);
		return ret;
	}
	fclose(f);
	return 0;
}

int dev_bind(struct tb_dev *d, const char *store_id, const char *bind, char *err, size_t errlen)
{
	int ret;

	if (!d->id_missing)
		return 0;
	snprintf(d->bind, sizeof(d->bind), "%s", bind);
	ret = d->eng->bind ? d->eng->bind(d, store_id, err, errlen)
			   : write_identity(d, store_id, err, errlen);
	if (ret == 0)
		d->id_missing = false;
	return ret;
}

void dev_new_bind(char bind[TB_BIND_LEN])
{
	unsigned char r[16];
	size_t got = 0;

	while (got < sizeof(r)) {
		ssize_t n = getrandom(r + got, sizeof(r) - got, 0);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) { /* no getrandom: the clock and the pid are unique enough here */
			uint64_t t = dev_now_ns() ^ ((uint64_t)getpid() << 40);

			for (; got < sizeof(r); got++, t = t * 6364136223846793005ULL + 1)
				r[got] = (unsigned char)(t >> 56);
			break;
		}
		got += (size_t)n;
	}
	snprintf(bind, TB_BIND_LEN,
		 "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", r[0], r[1],
		 r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10], r[11], r[12], r[13], r[14],
		 r[15]);
}

bool dev_parse_bind(const char *line, char bind[TB_BIND_LEN])
{
	const char *p = strstr(line, " bind=");
	size_t n;

	bind[0] = 0;
	if (!p)
		return true; /* an identity from before bindings */
	p += strlen(" bind=");
	n = strcspn(p, " \n");
	if (n == 0 || n >= TB_BIND_LEN)
		return false;
	memcpy(bind, p, n);
	bind[n] = 0;
	return true;
}

void dev_describe(const struct tb_dev *d, char *buf, size_t len)
{
	if (strcmp(d->kind, "s3") == 0)
		snprintf(buf, len, "s3 tier %s", d->where);
	else
		snprintf(buf, len, "%s folder %s", d->kind, d->where);
}

static int open_slab(struct tb_dev *d, const char *what, const char *dir, bool direct,
		     uint64_t cap_bytes, char *err, size_t errlen)
{
	struct statvfs vfs;
	struct stat st;
	uint64_t fs_bytes, free_bytes, reserve, slab_bytes, nslots;

	/* Checked before use: never through a link, ours alone, a regular file. */
	d->fd = storedir_open_file(d->dir_fd, what, dir, SLAB_NAME, O_RDWR, true, &d->slab_made,
				   err, errlen);
	if (d->fd < 0)
		return d->fd;
	/* O_DIRECT where the filesystem has it (EINVAL: it has not). */
	if (direct && fcntl(d->fd, F_SETFL, fcntl(d->fd, F_GETFL) | O_DIRECT) < 0 &&
	    errno != EINVAL) {
		dev_err(err, errlen, "folder %s: cannot use the slab file with O_DIRECT", dir,
			errno);
		return -errno;
	}
	if (fstat(d->fd, &st) < 0 || fstatvfs(d->fd, &vfs) < 0) {
		dev_err(err, errlen, "folder %s", dir, errno);
		return -errno;
	}
	if (vfs.f_flag & ST_RDONLY) {
		snprintf(err, errlen, "%s %s is on a read-only filesystem", what, dir);
		return -EROFS;
	}
	d->slab_end = (uint64_t)st.st_size;
	d->fs_dev = (uint64_t)st.st_dev;
	fs_bytes = (uint64_t)vfs.f_blocks * vfs.f_frsize;
	free_bytes = (uint64_t)vfs.f_bavail * vfs.f_frsize;
	slab_bytes = (uint64_t)st.st_blocks * 512;
	reserve = fs_bytes / 100 * RESERVE_PERCENT;
	if (reserve < RESERVE_MIN_BLOCKS * d->block_size)
		reserve = RESERVE_MIN_BLOCKS * d->block_size;
	nslots = free_bytes + slab_bytes > reserve
			 ? (free_bytes + slab_bytes - reserve) / d->block_size
			 : 0;
	if (cap_bytes && cap_bytes / d->block_size < nslots)
		nslots = cap_bytes / d->block_size;
	/* Slots already in the slab stay addressable even if the disk filled since. */
	if ((uint64_t)st.st_size / d->block_size > nslots && !cap_bytes)
		nslots = (uint64_t)st.st_size / d->block_size;
	if (nslots == 0) {
		if (cap_bytes && cap_bytes < d->block_size)
			snprintf(err, errlen, "%s %s: its cap of %llu bytes holds no block of %zuK",
				 what, dir, (unsigned long long)cap_bytes, d->block_size >> 10);
		else
			snprintf(err, errlen, "%s %s has no free space", what, dir);
		return -ENOSPC;
	}
	return slot_alloc_init(&d->alloc, nslots);
}

int dev_open_slab(struct tb_dev **out, const char *kind, unsigned index, const char *dir,
		  const char *store_id, size_t block_size, enum tb_engine engine,
		  unsigned queue_depth, uint64_t bw_cap, uint64_t cap_bytes,
		  const struct dram_arena *arena, char *err, size_t errlen)
{
	struct tb_dev *d = calloc(1, sizeof(*d));
	bool pfs = strcmp(kind, "pfs") == 0;
	const char *what = folder_what(pfs ? TB_KIND_PFS : TB_KIND_NVME);
	int ret;

	if (!d)
		return -ENOMEM;
	ret = dev_init_common(d, kind, index, block_size, queue_depth, bw_cap, arena);
	if (ret)
		goto fail;
	snprintf(d->where, sizeof(d->where), "%s", dir);
	ret = d->dir_fd = storedir_open(what, dir, false, NULL, err, errlen);
	if (ret < 0)
		goto fail;
	if (access(dir, W_OK) < 0) {
		dev_err(err, errlen, "folder %s is not writable", dir, errno);
		ret = -errno;
		goto fail;
	}
	ret = check_identity(d, what, dir, store_id, err, errlen);
	if (ret < 0)
		goto fail;
	ret = open_slab(d, what, dir, true, cap_bytes, err, errlen);
	if (ret < 0)
		goto fail;
	d->prealloc = !pfs; /* a parallel filesystem may not have fallocate, or make it slow */
	d->give_back = true;
	/*
	 * A folder's filesystem may be shared, and filled by others: its free
	 * space is followed (room_locked). A parallel filesystem's statfs can
	 * take long, asking every server: its pool threads look, at most once
	 * a second, and placement uses what they saw (dev_room_look).
	 */
	d->track_room = true;
	d->room_async = pfs;
	ret = dev_room_first(d);
	if (ret < 0) {
		dev_err(err, errlen, "folder %s: cannot see its filesystem's free space", dir, -ret);
		goto fail;
	}
	if (pfs) {
		ret = dev_pool_setup(d);
	} else {
		ret = engine == TB_ENGINE_AIO ? -EINVAL : dev_uring_setup(d);
		if (ret < 0 && engine == TB_ENGINE_URING) {
			dev_err(err, errlen, "folder %s: io_uring setup failed", dir, -ret);
			goto fail;
		}
		if (ret < 0 && engine == TB_ENGINE_AUTO)
			log_info("%s: io_uring unavailable (%s); using libaio", d->name,
				 strerror(-ret));
		if (ret < 0)
			ret = dev_aio_setup(d);
	}
	if (ret < 0) {
		dev_err(err, errlen, "folder %s: cannot set up its I/O engine", dir, -ret);
		goto fail;
	}
	*out = d;
	return 0;
fail:
	/* Whatever this open made goes: a later start must not trip on it. */
	dev_forget_identity(d);
	dev_close(d);
	return ret;
}

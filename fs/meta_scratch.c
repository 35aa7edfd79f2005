/*
 * meta_scratch.c - scratch=on: a store that outlives its daemon, not its
 * machine.
 *
 * With scratch=on the sync points before the stop flush no file (the
 * devices, data.mdb, the durable record: tiers/flush.c, meta_sync's
 * power). A killed daemon loses nothing by that, since the kernel keeps
 * what it wrote, and a clean stop flushes everything; but after a power
 * cut or a crash of the kernel, no part of the store can be trusted. A
 * swap folder wants no more: its files are written afresh when the job
 * restarts from its checkpoint. Where a drive's cache is deep, a flush
 * holds up every request for as long as the cache takes to write out,
 * which cost the swap a third of its speed (docs/benchmarks.md).
 *
 * The file SCRATCH_NAME in the meta folder says that the store runs so: an
 * open with scratch=on makes it, flushed with the folder, before the store
 * opens; an open without removes it, once everything that a killed
 * scratch daemon left unflushed is flushed. When the last stop was unclean
 * and the machine has started since (the test of meta_roll_back), an open
 * that finds the file empties the store: data.mdb and the durable record
 * go, and the store is made afresh under its old id, so that its device
 * folders are still its own, with every slot free (the s3 tier's sweep
 * deletes its objects). An unclean stop on this boot lost no page cache:
 * the store opens as it is.
 */
#include "meta_int.h"

#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SCRATCH_TEXT                                                                              \
	"This store runs with scratch=on: it outlives its daemon, not a power cut.\n"

/* The folder's entries, flushed: a made or removed file is there after a power cut. */
static int sync_dir(struct fs_meta *m, const char *what, char *err, size_t errlen)
{
	if (fsync(m->dir_fd) == 0)
		return 0;
	int e = errno;

	snprintf(err, errlen, "meta folder %s: cannot flush the folder after %s: %s", m->dir, what,
		 strerror(e));
	return -e;
}

static int mark(struct fs_meta *m, char *err, size_t errlen)
{
	int fd = openat(m->dir_fd, SCRATCH_NAME, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
			0600);
	size_t len = strlen(SCRATCH_TEXT);

	if (fd < 0 || write(fd, SCRATCH_TEXT, len) != (ssize_t)len || fdatasync(fd) < 0) {
		int e = errno ? errno : EIO;

		snprintf(err, errlen, "meta folder %s: cannot write %s: %s", m->dir, SCRATCH_NAME,
			 strerror(e));
		if (fd >= 0)
			close(fd);
		unlinkat(m->dir_fd, SCRATCH_NAME, 0);
		return -e;
	}
	close(fd);
	return sync_dir(m, "making " SCRATCH_NAME, err, errlen);
}

static int unmark(struct fs_meta *m, char *err, size_t errlen)
{
	if (unlinkat(m->dir_fd, SCRATCH_NAME, 0) < 0 && errno != ENOENT) {
		int e = errno;

		snprintf(err, errlen, "meta folder %s: cannot remove %s: %s", m->dir, SCRATCH_NAME,
			 strerror(e));
		return -e;
	}
	return sync_dir(m, "removing " SCRATCH_NAME, err, errlen);
}

/* The store's files go; check_format makes it afresh under the id the lock file names. */
static int empty_store(struct fs_meta *m, char *err, size_t errlen)
{
	static const char *const names[] = {DURABLE_NAME, DATA_NAME, LMDB_LOCK_NAME};

	if (!m->last_store[0]) {
		snprintf(err, errlen,
			 "meta folder %s: the store ran with scratch=on and the machine stopped "
			 "under it, so its files are lost, but the lock file names no store to make "
			 "afresh: remove the meta folder, and tensorfs.slab and tensorfs.dev of its "
			 "nvme folders",
			 m->dir);
		return -EUCLEAN;
	}
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		if (unlinkat(m->dir_fd, names[i], 0) < 0 && errno != ENOENT) {
			int e = errno;

			snprintf(err, errlen, "meta folder %s: cannot remove %s to empty the store: %s",
				 m->dir, names[i], strerror(e));
			return -e;
		}
	}
	m->emptied = true;
	log_warn("meta folder %s: the store ran with scratch=on and the machine stopped under it "
		 "(a power cut or a crash of the kernel): its files are lost, and it starts empty",
		 m->dir);
	return sync_dir(m, "emptying the store", err, errlen);
}

int meta_scratch_open(struct fs_meta *m, char *err, size_t errlen)
{
	struct stat st;
	bool marked = fstatat(m->dir_fd, SCRATCH_NAME, &st, AT_SYMLINK_NOFOLLOW) == 0;
	bool restarted = !m->boot[0] || strcmp(m->boot, m->last_boot) != 0;
	int ret;

	if (marked && m->unclean && restarted) {
		ret = empty_store(m, err, errlen);
		if (ret)
			return ret;
	} else if (marked && m->unclean && !m->scratch) {
		/*
		 * A scratch daemon killed on this boot: what it wrote is in the
		 * page cache and the drives' caches. Flushed before the mark goes,
		 * or a power cut would roll back to a point it never flushed.
		 */
		sync();
	}
	if (m->scratch && !marked)
		return mark(m, err, errlen);
	if (!m->scratch && marked)
		return unmark(m, err, errlen);
	return 0;
}

/*
 * req.c - what the FUSE ops (ops*.c), the control files (ctl*.c) and the
 * GPU server (gpu*.c) all use while they serve a request, kept below all
 * three so that the calls between them go one way: the ops call ctl,
 * ctl.c calls gpu.c, and none calls back.
 *
 * A request's waits in the block store end with EINTR once the kernel
 * interrupts it (fs_watch); a read or write that reached a file, through
 * FUSE or from a GPU client, is told to the learner (fs_touch). The ops'
 * own helpers (fs_of_req, fs_reply_err, fs_rec_touch, fs_iget_changeable) are here too,
 * declared in ops_int.h.
 *
 * It may call the inode table (fs_now, fs_iget), ctl_names.c (whether an
 * inode is a control file), the learner (learn.c) and the block store;
 * nothing of ops, ctl or gpu.
 */
#include "ops_int.h"

#include <errno.h>

static bool req_interrupted(void *req)
{
	return fuse_req_interrupted(req);
}

void fs_watch(fuse_req_t req)
{
	tb_interruptible(req_interrupted, req);
}

void fs_unwatch(void)
{
	tb_interruptible(NULL, NULL);
}

/*
 * Tell the learner, in the stream of the file's folder; when it records a
 * step of a known cycle, wake the prefetcher.
 */
bool fs_touch(struct fs *fs, struct fs_inode *in, uint64_t size, uint64_t off, uint64_t len,
	      bool write)
{
	uint64_t gen = __atomic_load_n(&fs->learn.generation, __ATOMIC_RELAXED);

	fs_learn_touch(&fs->learn, in->ino, __atomic_load_n(&in->parent, __ATOMIC_RELAXED), size,
		       off, len, write);
	return __atomic_load_n(&fs->learn.generation, __ATOMIC_RELAXED) != gen &&
	       __atomic_load_n(&fs->learn.period, __ATOMIC_RELAXED);
}

struct fs *fs_of_req(fuse_req_t req)
{
	return fuse_req_userdata(req);
}

void fs_reply_err(struct fs *fs, fuse_req_t req, int err)
{
	if (err < 0)
		err = -err;
	if (err && err != ENOENT && err != EEXIST && err != ENODATA && err != ENOTEMPTY)
		FS_COUNT(fs, errors, 1);
	fuse_reply_err(req, err);
}

void fs_rec_touch(struct meta_inode *rec, bool mtime)
{
	int64_t s;
	uint32_t ns;

	fs_now(&s, &ns);
	rec->ctime = s;
	rec->ctime_ns = ns;
	if (mtime) {
		rec->mtime = s;
		rec->mtime_ns = ns;
	}
}

int fs_iget_changeable(struct fs *fs, fuse_ino_t ino, struct fs_inode **in)
{
	if (fs_ctl_ino(ino))
		return -EPERM;
	return fs_iget(fs, ino, in);
}

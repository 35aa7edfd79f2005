/*
 * wjob.c - a write job carried out, and the ends of a write and of an
 * fsync: the code that both the FUSE thread (ops_data.c) and defer.c's
 * threads run. A write is stored by fs_write_run; one that would wait for
 * dirty room is parked in defer.c, whose thread goes on with it
 * (fs_write_resume) and answers it (fs_write_end), as it runs an fsync
 * parked there (fs_fsync_run).
 *
 * Kept below both ops_data.c and defer.c so that the calls between them go
 * one way (ops_data.c parks, defer.c resumes, and neither calls back). It
 * may call req.c, the inode table and the block store.
 */
#include "ops_int.h"

#include <string.h>

/*
 * Store the rest of job j (from j->done on) in the block store, extending
 * the size; the caller holds j->in->io shared. A file written over its
 * whole size since it was last read is written blind: its writer streams
 * over it and does not read it back (tb_get_write). -EAGAIN where a nowait
 * job would wait (struct tb_writer), with j->done telling how far it came.
 */
int fs_write_run(struct fs *fs, struct fs_wjob *j)
{
	struct fs_inode *in = j->in;
	size_t done0 = j->done;
	bool blind;
	int ret = 0;

	pthread_mutex_lock(&in->lock);
	blind = in->rec.size && in->unread >= in->rec.size;
	pthread_mutex_unlock(&in->lock);
	while (j->done < j->len) {
		uint64_t pos = j->off + j->done;
		uint64_t idx = pos / fs->bs;
		size_t bo = pos % fs->bs, n = fs->bs - bo;
		struct tb_ref ref;

		if (n > j->len - j->done)
			n = j->len - j->done;
		ret = tb_get_write(fs->tb, in->ino, idx, bo, n, blind, &ref, &j->resv, &j->who);
		if (ret)
			break;
		if (j->slot && j->done == 0 && n == j->len && n == fs->bs &&
		    tb_swap_slot(fs->tb, &ref, j->slot))
			; /* the block's slot holds the bytes now; *j->slot is another spare */
		else if (j->data)
			memcpy((char *)ref.data + bo, j->data + j->done, n);
		else
			memset((char *)ref.data + bo, 0, n);
		tb_put_dirty(fs->tb, &ref, bo, n);
		j->done += n;
	}
	if (j->done > done0)
		fs_inode_written(in, j->off + j->done, j->done - done0);
	return ret;
}

void fs_fsync_run(struct fs *fs, fuse_req_t req, struct fs_inode *in, int err)
{
	int ret = err, r;

	if (!ret) {
		fs_watch(req);
		ret = tb_flush_obj(fs->tb, in->ino);
		fs_unwatch();
	}
	if (!err) {
		r = fs_iflush_attr(fs, in);
		if (!ret)
			ret = r;
		r = tb_durable(fs->tb);
		if (!ret)
			ret = r;
	}
	fs_iput(fs, in);
	fs_reply_err(fs, req, ret);
}

void fs_write_resume(struct fs *fs, struct fs_wjob *j)
{
	int ret;

	j->who.nowait = false;
	pthread_rwlock_rdlock(&j->in->io);
	fs_watch(j->req); /* the waits end with EINTR if its writer goes */
	ret = fs_write_run(fs, j);
	fs_unwatch();
	pthread_rwlock_unlock(&j->in->io);
	fs_write_end(fs, j, ret);
}

void fs_write_end(struct fs *fs, struct fs_wjob *j, int ret)
{
	tb_unreserve(fs->tb, j->resv);
	j->resv = 0;
	fs_iput(fs, j->in);
	j->in = NULL;
	if (ret) {
		/* Never a short count: the writer learns the whole request failed. */
		fs_reply_err(fs, j->req, ret);
		return;
	}
	FS_COUNT(fs, write_bytes, j->reply);
	fuse_reply_write(j->req, j->reply);
}

/*
 * ops.c - the FUSE low-level operations.
 *
 * Names, attributes and block maps go to the metadata store, one write
 * transaction per namespace change. File data goes through the block
 * store: a write copies into DRAM slots and is answered at once, or, where
 * it would wait for dirty room, from defer.c's threads, as an fsync is; a
 * read is answered straight from the slots with an iovec, and a read that
 * misses is answered from the I/O completion, so no worker thread waits on
 * a device; nor long on a GPU client's write pin: a change of size gives up
 * with ETXTBSY (fs_io_lock_excl). Every op replies exactly once on every
 * path.
 *
 * This file holds the connection's start (fs_init) and the table of ops at
 * the bottom, so the reader sees the whole surface at once; the ops live
 * by concept in ops_names.c (names and folders), ops_data.c (file data)
 * and ops_attr.c (attributes and xattrs), sharing ops_int.h. The ops are
 * the top of fs/: they call the control files (ctl*.c), the helpers every
 * request uses (req.c), the inode table, the store and the block store;
 * nothing in fs/ calls them but the table's user (main.c); a parked
 * write or fsync goes on in defer.c's threads through wjob.c.
 */
#include "ops_int.h"
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <linux/fuse.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#define FS_MAX_READAHEAD (1U << 20)
#define FS_MAX_BACKGROUND 256
#define FS_CONGESTION 192

/* ---- init and life cycle ---- */

static void fs_init(void *userdata, struct fuse_conn_info *conn)
{
	(void)userdata;
	conn->max_write = FS_MAX_WRITE;
	if (conn->max_readahead > FS_MAX_READAHEAD)
		conn->max_readahead = FS_MAX_READAHEAD;
	conn->max_background = FS_MAX_BACKGROUND;
	conn->congestion_threshold = FS_CONGESTION;
	if (conn->capable & FUSE_CAP_ASYNC_DIO)
		conn->want |= FUSE_CAP_ASYNC_DIO;
	if (conn->capable & FUSE_CAP_ASYNC_READ)
		conn->want |= FUSE_CAP_ASYNC_READ;
	if (conn->capable & FUSE_CAP_PARALLEL_DIROPS)
		conn->want |= FUSE_CAP_PARALLEL_DIROPS;
	if (conn->capable & FUSE_CAP_READDIRPLUS)
		conn->want |= FUSE_CAP_READDIRPLUS;
	/* The kernel would write back its own pages behind our cache: keep it simple. */
	conn->want &= ~FUSE_CAP_WRITEBACK_CACHE;
}

const struct fuse_lowlevel_ops fs_ops = {
	.init = fs_init,
	.lookup = fs_lookup,
	.forget = fs_forget,
	.forget_multi = fs_forget_multi,
	.getattr = fs_getattr,
	.setattr = fs_setattr,
	.readlink = fs_readlink,
	.mknod = fs_mknod,
	.mkdir = fs_mkdir,
	.unlink = fs_unlink,
	.rmdir = fs_rmdir,
	.symlink = fs_symlink,
	.rename = fs_rename,
	.link = fs_link,
	.open = fs_open,
	.read = fs_read,
	.write = fs_write,
	.flush = fs_flush,
	.release = fs_release,
	.fsync = fs_fsync,
	.opendir = fs_opendir,
	.readdir = fs_readdir,
	.readdirplus = fs_readdirplus,
	.releasedir = fs_releasedir,
	.fsyncdir = fs_fsyncdir,
	.statfs = fs_statfs,
	.setxattr = fs_setxattr,
	.getxattr = fs_getxattr,
	.listxattr = fs_listxattr,
	.removexattr = fs_removexattr,
	.create = fs_create,
	.fallocate = fs_fallocate,
	.copy_file_range = fs_copy_file_range,
};

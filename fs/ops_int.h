/*
 * ops_int.h - what the files of the FUSE ops share, for them only: the
 * ops that the table in ops.c names, the reply helpers every op uses
 * (req.c), and the data helpers that setattr and create use (ops_data.c).
 * Other parts of fs/ call none of these.
 */
#ifndef TENSORFS_OPS_INT_H
#define TENSORFS_OPS_INT_H

#include "fs.h"

/*
 * req.c: the fs of a request; an error reply, counted; a record's times set
 * to now; the inode of a file an op changes (-EPERM for a control file).
 */
struct fs *fs_of_req(fuse_req_t req);
void fs_reply_err(struct fs *fs, fuse_req_t req, int err);
void fs_rec_touch(struct meta_inode *rec, bool mtime);
int fs_iget_changeable(struct fs *fs, fuse_ino_t ino, struct fs_inode **in);

/* ops_names.c: names and folders */
void fs_lookup(fuse_req_t req, fuse_ino_t parent, const char *name);
void fs_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup);
void fs_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *forgets);
void fs_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode);
void fs_mknod(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, dev_t rdev);
void fs_symlink(fuse_req_t req, const char *link, fuse_ino_t parent, const char *name);
void fs_readlink(fuse_req_t req, fuse_ino_t ino);
void fs_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
	       struct fuse_file_info *fi);
void fs_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char *newname);
void fs_unlink(fuse_req_t req, fuse_ino_t parent, const char *name);
void fs_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name);
void fs_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent,
	       const char *newname, unsigned int flags);
void fs_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void fs_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi);
void fs_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		    struct fuse_file_info *fi);
void fs_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void fs_statfs(fuse_req_t req, fuse_ino_t ino);

/*
 * ops_data.c: file data. fs_io_lock_excl and fs_truncate_to: a change of size,
 * for setattr; fs_open_io: how an open's I/O goes, for create.
 */
int fs_io_lock_excl(fuse_req_t req, struct fs_inode *in);
int fs_truncate_to(struct fs *fs, struct fs_inode *in, uint64_t size, uint32_t uid);
void fs_open_io(struct fuse_file_info *fi);
void fs_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void fs_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void fs_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void fs_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi);
void fs_fsyncdir(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi);
void fs_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi);
void fs_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
	      struct fuse_file_info *fi);
void fs_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off, off_t len,
		  struct fuse_file_info *fi);
void fs_copy_file_range(fuse_req_t req, fuse_ino_t ino_in, off_t off_in,
			struct fuse_file_info *fi_in, fuse_ino_t ino_out, off_t off_out,
			struct fuse_file_info *fi_out, size_t len, int flags);

/* wjob.c: a write job stored, for write, fallocate and copy_file_range */
int fs_write_run(struct fs *fs, struct fs_wjob *j);

/* ops_attr.c: attributes and extended attributes */
void fs_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void fs_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
		struct fuse_file_info *fi);
void fs_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value, size_t size,
		 int flags);
void fs_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size);
void fs_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size);
void fs_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name);

#endif

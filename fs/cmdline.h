/*
 * cmdline.h - the daemon's command line (cmdline.c).
 */
#ifndef TENSORFS_CMDLINE_H
#define TENSORFS_CMDLINE_H

#include <fuse_opt.h>

struct fs_config;

int fs_cmdline_parse(struct fuse_args *args, struct fs_config *c);
void fs_cmdline_usage(const char *prog);
void fs_cmdline_hints(const struct fuse_args *args);
int fs_cmdline_fsname(struct fuse_args *args, const char *source);

#endif

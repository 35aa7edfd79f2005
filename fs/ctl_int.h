/*
 * ctl_int.h - what the files of the control folder (ctl.c, ctl_names.c,
 * ctl_metrics.c, ctl_run.c) share, for them only.
 */
#ifndef TENSORFS_CTL_INT_H
#define TENSORFS_CTL_INT_H

#include "fs.h"

/* ctl_names.c: only the mount's owner or root may open ctl, pins and scrub */
bool fs_ctl_may_steer(fuse_req_t req);

/* ctl_metrics.c: the text of /.tensorfs/metrics, len bytes; NULL: no memory */
char *fs_ctl_metrics_text(struct fs *fs, size_t *len);

#endif

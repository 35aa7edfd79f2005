/*
 * fsck.h - the offline check and repair of a metadata store (tfsctl fsck).
 *
 * The store must not be in use: fs_fsck takes the store's lock as a mount
 * does, and refuses when a daemon holds it.
 */
#ifndef TENSORFS_FSCK_H
#define TENSORFS_FSCK_H

#include <stdbool.h>
#include <stdio.h>

/* Exit statuses, after e2fsck's: usage errors are the caller's to report. */
enum {
	FSCK_CLEAN = 0,	   /* nothing wrong, or --repair fixed all of it */
	FSCK_PROBLEMS = 1, /* problems found (and, with repair, some left) */
	FSCK_USAGE = 2,
	FSCK_ERROR = 8, /* could not check: no store, store in use, I/O error */
};

/*
 * Check the store in dir; with repair, fix every problem in one
 * transaction and check again. Problems and repairs go to out, one line
 * each, then a summary line; operational errors go to stderr, prefixed with
 * prog. Returns an FSCK_ status.
 */
int fs_fsck(const char *dir, bool repair, FILE *out, const char *prog);

#endif

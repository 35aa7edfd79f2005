/*
 * storedir.c - folders that hold store files, checked against other users.
 *
 * See storedir.h for the rules. The checks use fstat and fstatat with
 * AT_SYMLINK_NOFOLLOW on a descriptor of the folder, and files are opened
 * with O_NOFOLLOW | O_NONBLOCK and checked with fstat before use, so a
 * link is never followed and a FIFO or a device never blocks the start.
 * LMDB has no O_NOFOLLOW: for its files the folder check is what makes
 * them safe, since nobody else can put anything into a checked folder.
 */
#include "storedir.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NEW_FOLDER_MODE 0700
#define NEW_FILE_MODE 0600
#define FOLDER_FORBIDDEN (S_IWGRP | S_IWOTH) /* others may read and enter, not change */
#define FILE_FORBIDDEN (S_IRWXG | S_IRWXO)   /* store data is for us alone */

static bool owner_ok(uid_t uid)
{
	return uid == geteuid() || uid == 0;
}

/* Who may own a store folder or file, for messages: "root" or "uid N (...) or root". */
static const char *owners(char *buf, size_t len)
{
	if (geteuid() == 0)
		return "root";
	snprintf(buf, len, "uid %u (the user tensorfs runs as) or root", (unsigned)geteuid());
	return buf;
}

const char *storedir_file_type(mode_t mode)
{
	switch (mode & S_IFMT) {
	case S_IFDIR:
		return "a folder";
	case S_IFIFO:
		return "a FIFO";
	case S_IFCHR:
		return "a character device";
	case S_IFBLK:
		return "a block device";
	case S_IFSOCK:
		return "a socket";
	case S_IFLNK:
		return "a symbolic link";
	default:
		return "not a regular file";
	}
}

static int check_folder_stat(const char *what, const char *dir, const struct stat *st, char *err,
			     size_t errlen)
{
	char who[64];

	if (!S_ISDIR(st->st_mode)) {
		snprintf(err, errlen, "%s %s is not a directory", what, dir);
		return -ENOTDIR;
	}
	if (!owner_ok(st->st_uid)) {
		snprintf(err, errlen,
			 "%s %s is owned by uid %u, not by %s: that user could plant links or "
			 "files under the store's names; use a folder of your own",
			 what, dir, (unsigned)st->st_uid, owners(who, sizeof(who)));
		return -EPERM;
	}
	if (st->st_mode & FOLDER_FORBIDDEN) {
		snprintf(err, errlen,
			 "%s %s is writable by group or others (mode %04o): they could plant links "
			 "or files under the store's names; chmod go-w it, or use another folder",
			 what, dir, (unsigned)(st->st_mode & 07777));
		return -EPERM;
	}
	return 0;
}

static int check_file_stat(const char *what, const char *dir, const char *name,
			   const struct stat *st, char *err, size_t errlen)
{
	char who[64];

	if (S_ISLNK(st->st_mode)) {
		snprintf(err, errlen,
			 "%s %s: %s is a symbolic link; store files are never opened through "
			 "links: remove it",
			 what, dir, name);
		return -ELOOP;
	}
	if (!S_ISREG(st->st_mode)) {
		snprintf(err, errlen, "%s %s: %s is %s, not a regular file: remove it", what, dir,
			 name, storedir_file_type(st->st_mode));
		return -EINVAL;
	}
	if (!owner_ok(st->st_uid)) {
		snprintf(err, errlen,
			 "%s %s: %s is owned by uid %u, not by %s: remove it if it is not yours",
			 what, dir, name, (unsigned)st->st_uid, owners(who, sizeof(who)));
		return -EPERM;
	}
	if (st->st_mode & FILE_FORBIDDEN) {
		snprintf(err, errlen,
			 "%s %s: %s is open to group or others (mode %04o): chmod 600 it if it is "
			 "yours, else remove it",
			 what, dir, name, (unsigned)(st->st_mode & 07777));
		return -EPERM;
	}
	return 0;
}

int storedir_check_file(int dirfd, const char *what, const char *dir, const char *name, char *err,
			size_t errlen)
{
	struct stat st;

	if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
		if (errno == ENOENT)
			return 0;
		snprintf(err, errlen, "%s %s: %s: %s", what, dir, name, strerror(errno));
		return -errno;
	}
	return check_file_stat(what, dir, name, &st, err, errlen);
}

/* Open dir without making it: a descriptor, or -errno with err set. */
static int open_folder(const char *what, const char *dir, char *err, size_t errlen)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	if (fd < 0) {
		int e = errno;

		if (e == ENOTDIR)
			snprintf(err, errlen, "%s %s is not a directory", what, dir);
		else
			snprintf(err, errlen, "%s %s: %s", what, dir, strerror(e));
		return -e;
	}
	return fd;
}

int storedir_open(const char *what, const char *dir, bool make, bool *made, char *err,
		  size_t errlen)
{
	struct stat st;
	int fd, ret;

	if (made)
		*made = false;
	if (make) {
		if (mkdir(dir, NEW_FOLDER_MODE) == 0) {
			if (made)
				*made = true;
		} else if (errno != EEXIST) {
			snprintf(err, errlen, "%s %s: %s", what, dir, strerror(errno));
			return -errno;
		}
	}
	fd = open_folder(what, dir, err, errlen);
	if (fd < 0)
		return fd;
	if (fstat(fd, &st) < 0) {
		ret = -errno;
		snprintf(err, errlen, "%s %s: %s", what, dir, strerror(-ret));
		close(fd);
		return ret;
	}
	ret = check_folder_stat(what, dir, &st, err, errlen);
	if (ret) {
		close(fd);
		return ret;
	}
	return fd;
}

int storedir_check(const char *what, const char *dir, const char *const *names, char *err,
		   size_t errlen)
{
	struct stat st;
	int fd, ret = 0;

	if (stat(dir, &st) < 0 && errno == ENOENT)
		return 0; /* made 0700 by us when opened */
	fd = storedir_open(what, dir, false, NULL, err, errlen);
	if (fd < 0)
		return fd;
	for (size_t i = 0; names && names[i] && !ret; i++)
		ret = storedir_check_file(fd, what, dir, names[i], err, errlen);
	close(fd);
	return ret;
}

int storedir_open_file(int dirfd, const char *what, const char *dir, const char *name, int flags,
		       bool create, bool *created, char *err, size_t errlen)
{
	struct stat st;
	int fd, ret;

	if (created)
		*created = false;
	if (create) {
		/* O_EXCL creates a file of our own, or fails on whatever is there, links too. */
		fd = openat(dirfd, name, flags | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
			    NEW_FILE_MODE);
		if (fd >= 0) {
			if (created)
				*created = true;
			return fd;
		}
		if (errno != EEXIST) {
			snprintf(err, errlen, "%s %s: cannot create %s: %s", what, dir, name,
				 strerror(errno));
			return -errno;
		}
	}
	fd = openat(dirfd, name, flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0) {
		ret = -errno;
		if (ret == -ENOENT)
			return ret; /* the caller says what a missing file means */
		/* A link (ELOOP), a FIFO without a writer (ENXIO): say which. */
		if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
		    check_file_stat(what, dir, name, &st, err, errlen) == 0)
			snprintf(err, errlen, "%s %s: cannot open %s: %s", what, dir, name,
				 strerror(-ret));
		return ret;
	}
	if (fstat(fd, &st) < 0 || fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) < 0) {
		ret = -errno;
		snprintf(err, errlen, "%s %s: %s: %s", what, dir, name, strerror(-ret));
	} else {
		ret = check_file_stat(what, dir, name, &st, err, errlen);
	}
	if (ret) {
		close(fd);
		return ret;
	}
	return fd;
}

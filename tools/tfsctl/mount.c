/*
 * mount.c - find the tensorfs mount a path lies in, and use its control
 * files.
 *
 * The mount is the entry of /proc/self/mountinfo with the longest mount
 * point above the path and the path's device; its type must be
 * fuse.tensorfs. Where /proc is not mounted, the folders above the path are
 * walked up, on the same device, to the one that holds .tensorfs/stats.
 */
#include "tfsctl.h"
#include "mounts.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* path is at or below folder dir (both resolved). */
static bool is_below(const char *path, const char *dir)
{
	size_t n = strlen(dir);

	if (strcmp(dir, "/") == 0)
		return true;
	return strncmp(path, dir, n) == 0 && (path[n] == 0 || path[n] == '/');
}

/*
 * The mount holding path (on device dev): 0 with its point and type, or -1
 * when mountinfo cannot be read or names no such mount.
 */
static int from_mountinfo(const char *path, dev_t dev, char *point, size_t plen, char *type,
			  size_t tlen)
{
	struct fs_mount_ent e;

	if (fs_mount_holding(path, dev, &e) < 0)
		return -1;
	snprintf(point, plen, "%s", e.point);
	snprintf(type, tlen, "%s", e.type);
	return 0;
}

/* Without /proc: the folder above path, on its device, that has .tensorfs/stats. */
static int from_walk(const char *path, bool is_dir, dev_t dev, char *point, size_t plen)
{
	char dir[PATH_MAX], probe[PATH_MAX + 32];
	struct stat st;

	snprintf(dir, sizeof(dir), "%s", path);
	if (!is_dir)
		snprintf(dir, sizeof(dir), "%s", dirname(strcpy(probe, path)));
	for (;;) {
		snprintf(probe, sizeof(probe), "%s/" CTL_DIR "/stats", strcmp(dir, "/") ? dir : "");
		if (stat(probe, &st) == 0 && st.st_dev == dev) {
			snprintf(point, plen, "%s", dir);
			return 0;
		}
		if (strcmp(dir, "/") == 0)
			return -1;
		snprintf(probe, sizeof(probe), "%s", dir);
		snprintf(dir, sizeof(dir), "%s", dirname(probe));
		if (stat(dir, &st) < 0 || st.st_dev != dev)
			return -1;
	}
}

int tfs_find_mount(const char *mopt, const char *near, struct tfs_mount *m)
{
	const char *start = mopt ? mopt : near ? near : ".";
	char real[PATH_MAX], type[256] = "", probe[PATH_MAX + 32];
	struct stat st, cst;

	if (!realpath(start, real) || stat(real, &st) < 0) {
		errmsg("%s: %s", start, strerror(errno));
		return -1;
	}
	if (mopt && !S_ISDIR(st.st_mode)) {
		errmsg("%s: not a folder, so not a tensorfs mount point", mopt);
		return -1;
	}
	if (from_mountinfo(real, st.st_dev, m->root, sizeof(m->root), type, sizeof(type)) == 0) {
		if (strcmp(type, FS_MOUNT_TYPE) != 0) {
			errmsg("%s is not on a tensorfs mount (it is on %s, of type %s)%s",
			       mopt || near ? start : "the current folder", m->root, type,
			       mopt || near ? "" : "; name one with -m MOUNTPOINT");
			return -1;
		}
	} else if (from_walk(real, S_ISDIR(st.st_mode), st.st_dev, m->root, sizeof(m->root)) < 0) {
		errmsg("%s is not on a tensorfs mount%s",
		       mopt || near ? start : "the current folder",
		       mopt || near ? "" : "; name one with -m MOUNTPOINT");
		return -1;
	}
	m->dev = st.st_dev;
	/* A tensorfs too old for control files, or a mount that died. */
	snprintf(probe, sizeof(probe), "%s/" CTL_DIR "/stats", m->root);
	errno = 0;
	if (stat(probe, &cst) < 0 || cst.st_dev != m->dev) {
		errmsg("%s: the tensorfs mount has no control files (%s: %s)", m->root, probe,
		       errno ? strerror(errno) : "on another device");
		return -1;
	}
	return 0;
}

char *tfs_read_ctl(const struct tfs_mount *m, const char *name, size_t *len)
{
	char path[PATH_MAX + 32], *buf = NULL;
	size_t n = 0, cap = 0;
	int fd, saved;

	snprintf(path, sizeof(path), "%s/" CTL_DIR "/%s", m->root, name);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return NULL;
	/* The files have no size: each open makes a fresh snapshot. Read to EOF. */
	for (;;) {
		if (cap - n < 65536) {
			char *p = realloc(buf, cap + 262144 + 1);

			if (!p) {
				errno = ENOMEM;
				goto fail;
			}
			buf = p;
			cap += 262144;
		}
		ssize_t r = read(fd, buf + n, cap - n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			goto fail;
		if (r == 0)
			break;
		n += (size_t)r;
	}
	close(fd);
	buf[n] = 0;
	if (len)
		*len = n;
	return buf;
fail:
	saved = errno;
	free(buf);
	close(fd);
	errno = saved;
	return NULL;
}

json_t *tfs_read_json(const struct tfs_mount *m, const char *name)
{
	json_error_t jerr;
	size_t len;
	char *text = tfs_read_ctl(m, name, &len);
	json_t *j;

	if (!text) {
		errmsg("%s/" CTL_DIR "/%s: %s", m->root, name, strerror(errno));
		return NULL;
	}
	j = json_loadb(text, len, 0, &jerr);
	free(text);
	if (!j || !json_is_object(j)) {
		errmsg("%s/" CTL_DIR "/%s: not the JSON object expected: %s", m->root, name,
		       j ? "another type" : jerr.text);
		json_decref(j);
		return NULL;
	}
	return j;
}

int tfs_print_json(json_t *j)
{
	json_dumpf(j, stdout, JSON_OUT);
	putchar('\n');
	json_decref(j);
	return 0;
}

int tfs_ctl_write(const struct tfs_mount *m, const char *cmd, bool *opened)
{
	char path[PATH_MAX + 32];
	size_t len = strlen(cmd);
	ssize_t r;
	int fd, ret = 0;

	snprintf(path, sizeof(path), "%s/" CTL_DIR "/ctl", m->root);
	*opened = false;
	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	*opened = true;
	/* One command per write(2): the daemon parses each write whole. */
	do
		r = write(fd, cmd, len);
	while (r < 0 && errno == EINTR);
	if (r < 0)
		ret = -errno;
	else if ((size_t)r != len)
		ret = -EIO;
	close(fd);
	return ret;
}

int tfs_ctl_target(const struct tfs_mount *m, const char *path, char *out, size_t len)
{
	char real[PATH_MAX];
	struct stat st;
	const char *rel;

	if (!realpath(path, real) || stat(real, &st) < 0) {
		errmsg("%s: %s", path, strerror(errno));
		return -1;
	}
	if (st.st_dev != m->dev || !is_below(real, m->root)) {
		errmsg("%s is not inside the tensorfs mount at %s", path, m->root);
		return -1;
	}
	rel = real + strlen(m->root);
	if (strcmp(m->root, "/") == 0)
		rel = real;
	if (!rel[0])
		rel = "/";
	/* The grammar takes no control characters: name such a file by its inode. */
	bool plain = strlen(rel) < 4000;
	for (const unsigned char *p = (const unsigned char *)rel; *p && plain; p++)
		plain = *p >= 0x20 && *p != 0x7f;
	if (plain)
		snprintf(out, len, "%s", rel);
	else
		snprintf(out, len, "ino:%llu", (unsigned long long)st.st_ino);
	return 0;
}

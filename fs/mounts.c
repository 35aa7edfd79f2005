/*
 * mounts.c - what is mounted where, read from /proc/self/mountinfo.
 *
 * A path's mount is the entry with the path's device and the longest mount
 * point above it (a later line wins a tie: it is mounted over the earlier
 * one). Mount points are matched as mountinfo writes them, octal escapes
 * undone. Where /proc is not mounted nothing is known, and callers go on
 * as if no tensorfs mount were involved: these checks guard against
 * mistakes, not against an adversary, who could not mount anyway.
 */
#include "mounts.h"
#include "escape.h"

#include <errno.h>
#include <jansson.h>
#include <libgen.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#define MOUNTINFO "/proc/self/mountinfo"

/* Undo mountinfo's octal escapes (\040 for a space) in place. */
static void unescape(char *s)
{
	char *w = s;

	for (char *r = s; *r; r++) {
		if (r[0] == '\\' && r[1] >= '0' && r[1] <= '3' && r[2] >= '0' && r[2] <= '7' &&
		    r[3] >= '0' && r[3] <= '7') {
			*w++ = (char)((r[1] - '0') << 6 | (r[2] - '0') << 3 | (r[3] - '0'));
			r += 3;
		} else {
			*w++ = *r;
		}
	}
	*w = 0;
}

/* path is at or below folder dir (both absolute). */
static bool is_below(const char *path, const char *dir)
{
	size_t n = strlen(dir);

	if (strcmp(dir, "/") == 0)
		return true;
	return strncmp(path, dir, n) == 0 && (path[n] == 0 || path[n] == '/');
}

/* One line of mountinfo: its device, mount point and type; false if malformed. */
static bool parse_line(char *line, dev_t *dev, struct fs_mount_ent *e)
{
	unsigned maj, min;
	char *dash = strstr(line, " - ");

	if (!dash || sscanf(line, "%*u %*u %u:%u %*s %4095s", &maj, &min, e->point) != 3 ||
	    sscanf(dash + 3, "%255s", e->type) != 1)
		return false;
	unescape(e->point);
	*dev = makedev(maj, min);
	return true;
}

int fs_mount_holding(const char *path, dev_t dev, struct fs_mount_ent *out)
{
	FILE *f = fopen(MOUNTINFO, "re");
	struct fs_mount_ent e;
	char *line = NULL;
	size_t cap = 0, best = 0;
	int ret = -ENOENT;
	dev_t d;

	if (!f)
		return -errno;
	while (getline(&line, &cap, f) > 0) {
		if (!parse_line(line, &d, &e) || d != dev || !is_below(path, e.point) ||
		    strlen(e.point) < best)
			continue;
		best = strlen(e.point);
		*out = e;
		ret = 0;
	}
	free(line);
	fclose(f);
	return ret;
}

int fs_mount_is_tensorfs(const char *point)
{
	FILE *f = fopen(MOUNTINFO, "re");
	struct fs_mount_ent e;
	char *line = NULL;
	size_t cap = 0;
	int ret = 0;
	dev_t d;

	if (!f)
		return -errno;
	/* The last entry at point is the one on top. */
	while (getline(&line, &cap, f) > 0)
		if (parse_line(line, &d, &e) && strcmp(e.point, point) == 0)
			ret = strcmp(e.type, FS_MOUNT_TYPE) == 0;
	free(line);
	fclose(f);
	return ret;
}

void fs_mount_describe(const char *point, char *buf, size_t len)
{
	char path[PATH_MAX + 32], esc[ESC_SIZE(PATH_MAX)];
	json_t *j, *meta, *pid;

	buf[0] = 0;
	snprintf(path, sizeof(path), "%s/.tensorfs/config", strcmp(point, "/") ? point : "");
	j = json_load_file(path, 0, NULL);
	if (!j)
		return;
	meta = json_object_get(j, "meta");
	pid = json_object_get(j, "pid");
	/* The name comes from another daemon, and goes to a terminal: escaped. */
	if (json_is_string(meta))
		esc_name(json_string_value(meta), esc, sizeof(esc));
	if (json_is_string(meta) && json_is_integer(pid))
		snprintf(buf, len, "meta folder %s, pid %lld", esc,
			 (long long)json_integer_value(pid));
	else if (json_is_string(meta))
		snprintf(buf, len, "meta folder %s", esc);
	json_decref(j);
}

int fs_mount_check_folder(const char *what, const char *dir, const char *mnt, char *err,
			  size_t errlen)
{
	char probe[PATH_MAX], real[PATH_MAX], desc[PATH_MAX + 64];
	struct fs_mount_ent e;
	struct stat st;

	if (!dir)
		return 0;
	/* The folder, or where it will be made: its nearest existing parent. */
	snprintf(probe, sizeof(probe), "%s", dir);
	while (stat(probe, &st) < 0) {
		char tmp[PATH_MAX];

		if (errno != ENOENT || strcmp(probe, "/") == 0 || strcmp(probe, ".") == 0)
			return 0; /* the folder checks that follow say what is wrong */
		snprintf(tmp, sizeof(tmp), "%s", probe);
		snprintf(probe, sizeof(probe), "%s", dirname(tmp));
	}
	if (!realpath(probe, real))
		return 0;
	if (mnt && is_below(real, mnt)) {
		snprintf(err, errlen,
			 "%s %s lies under the mount point %s: the mount would hide it, and the "
			 "next start would find the mount point not empty",
			 what, dir, mnt);
		return -ELOOP;
	}
	if (fs_mount_holding(real, st.st_dev, &e) < 0 || strcmp(e.type, FS_MOUNT_TYPE) != 0)
		return 0;
	fs_mount_describe(e.point, desc, sizeof(desc));
	snprintf(err, errlen,
		 "%s %s lies in the tensorfs mount at %s%s%s%s: a store cannot live on a "
		 "tensorfs mount (its write-back would wait on that mount, or on itself)",
		 what, dir, e.point, desc[0] ? " (" : "", desc, desc[0] ? ")" : "");
	return -ELOOP;
}

int fs_mount_check_point(const char *mnt, char *err, size_t errlen)
{
	char real[PATH_MAX], desc[PATH_MAX + 64];
	struct fs_mount_ent e;
	struct statfs sfs;
	struct stat st;

	/* statfs always asks the daemon; stat may be answered from the kernel's cache. */
	if (statfs(mnt, &sfs) < 0 && errno == ENOTCONN) {
		snprintf(err, errlen,
			 "mount point %s is a FUSE mount whose daemon has ended without "
			 "unmounting (killed?); detach it with fusermount3 -u %s (or tfsctl "
			 "unmount %s), then mount again",
			 mnt, mnt, mnt);
		return -ENOTCONN;
	}
	if (stat(mnt, &st) < 0 || !realpath(mnt, real) ||
	    fs_mount_holding(real, st.st_dev, &e) < 0 || strcmp(e.type, FS_MOUNT_TYPE) != 0)
		return 0; /* what is wrong with it, the caller's checks say */
	fs_mount_describe(e.point, desc, sizeof(desc));
	if (strcmp(e.point, real) == 0)
		snprintf(err, errlen,
			 "mount point %s is already a tensorfs mount%s%s%s; unmount it first "
			 "(tfsctl unmount %s)",
			 mnt, desc[0] ? " (" : "", desc, desc[0] ? ")" : "", e.point);
	else
		snprintf(err, errlen,
			 "mount point %s lies in the tensorfs mount at %s%s%s%s: a mount there "
			 "would keep that one from unmounting; mount elsewhere",
			 mnt, e.point, desc[0] ? " (" : "", desc, desc[0] ? ")" : "");
	return -EBUSY;
}

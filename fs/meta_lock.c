/*
 * meta_lock.c - the store's folder and its lock file.
 *
 * The folder is checked before anything in it is opened. The lock file is
 * flocked by the daemon that holds the store and says, in lines, its pid,
 * this boot's id and the store it has open, so that the next open knows
 * whether the last stop was clean and whether the machine has started
 * since (meta_durable.c rolls back then); a start may wait for a holder
 * to let the store go (meta_wait_holder).
 */
#include "meta_int.h"

#include "escape.h"
#include "log.h"
#include "mounts.h"
#include "storedir.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define BOOT_ID_PATH "/proc/sys/kernel/random/boot_id"
#define LOCK_POLL_MS 100 /* how often a start waiting for the store looks again */

/* ---- the folder and its lock file ---- */

int meta_check_folder(const char *dir, char *err, size_t errlen)
{
	return storedir_check(META_WHAT, dir, meta_files, err, errlen);
}

/*
 * ---- the holder of a store ----
 *
 * The lock file holds the holder's pid, the boot id it runs under, the id
 * of the store it has open (once it has read it: meta_roll_back applies only a
 * durable record of that store), and a
 * line that says what it is doing: "mounted MOUNTPOINT" while its mount is
 * live; "stopping MOUNTPOINT" once the mount is gone and it writes back
 * what is dirty (fusermount3 -u and umount return before that ends);
 * "failed MOUNTPOINT" when that write-back failed, which stays after the
 * daemon has exited, for tfsctl unmount to tell. No line: it is starting,
 * or it is tfsctl fsck. A clean stop empties the file.
 */
/* A line of the lock file that holds a store id. */
static bool is_store_line(const char *line)
{
	unsigned char id[STORE_ID_BYTES];

	return strlen(line) >= STORE_ID_LEN &&
	       (line[STORE_ID_LEN] == '\n' || !line[STORE_ID_LEN]) && meta_store_id_bytes(line, id);
}

void meta_read_holder(int fd, struct meta_holder *h)
{
	char buf[PATH_MAX + 128], *line;
	ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);

	memset(h, 0, sizeof(*h));
	buf[n > 0 ? n : 0] = 0;
	h->pid = strtol(buf, NULL, 10);
	line = strchr(buf, '\n');
	line = line ? strchr(line + 1, '\n') : NULL; /* past the boot id */
	if (line && is_store_line(line + 1))
		line = strchr(line + 1, '\n'); /* and the store id */
	if (!line || sscanf(line + 1, "%15s", h->state) != 1)
		return;
	line += 1 + strlen(h->state);
	if (*line == ' ')
		snprintf(h->point, sizeof(h->point), "%.*s", (int)strcspn(line + 1, "\n"),
			 line + 1);
}

/* Its mount is live, where we can see: then the store is in use, not waited for. */
static bool holder_serves(const struct meta_holder *h)
{
	return strcmp(h->state, "mounted") == 0 && fs_mount_is_tensorfs(h->point) == 1;
}

/* Why the store in dir cannot be taken now, for a message. */
static void describe_holder(const struct meta_holder *h, const char *dir, char *buf, size_t len)
{
	char pid[32] = "pid unknown";

	if (h->pid > 0)
		snprintf(pid, sizeof(pid), "pid %ld", h->pid);
	if (holder_serves(h))
		snprintf(buf, len,
			 "meta folder %s is in use by tensorfs %s, mounted on %s; unmount it first "
			 "(tfsctl unmount %s)",
			 dir, pid, h->point, h->point);
	else if (h->state[0])
		snprintf(buf, len,
			 "meta folder %s is in use by tensorfs %s, which is still writing back "
			 "after the unmount of %s; wait for it to exit (tfsctl unmount waits)",
			 dir, pid, h->point);
	else
		snprintf(buf, len,
			 "meta folder %s is in use by another tensorfs or tfsctl fsck (%s)", dir,
			 pid);
}

int meta_take_lock(struct fs_meta *m, const char *dir, char *err, size_t errlen)
{
	char buf[2 * PATH_MAX + 256];
	int fd;

	fd = storedir_open_file(m->dir_fd, META_WHAT, dir, LOCK_NAME, O_RDWR, true, &m->made_lock,
				err, errlen);
	if (fd < 0)
		return fd;
	m->lock_fd = fd;
	if (flock(m->lock_fd, LOCK_EX | LOCK_NB) < 0) {
		struct meta_holder h;

		meta_read_holder(m->lock_fd, &h);
		describe_holder(&h, dir, buf, sizeof(buf));
		snprintf(err, errlen, "%s", buf);
		return -EBUSY;
	}
	m->locked = true;
	/*
	 * A clean stop empties the file. What the last one left: its pid, and
	 * the boot id it ran under (none from before the durable file).
	 */
	char prev[128];
	ssize_t n = pread(m->lock_fd, prev, sizeof(prev) - 1, 0);

	prev[n > 0 ? n : 0] = 0;
	m->unclean = n > 0;
	char *boot = strchr(prev, '\n');

	if (boot && strcspn(boot + 1, "\n") == BOOT_ID_LEN)
		snprintf(m->last_boot, sizeof(m->last_boot), "%.*s", BOOT_ID_LEN, boot + 1);
	/* The store it had open, on the third line (none from before store ids were kept there). */
	char *store = boot ? strchr(boot + 1, '\n') : NULL;

	if (store && is_store_line(store + 1))
		snprintf(m->last_store, sizeof(m->last_store), "%.*s", STORE_ID_LEN, store + 1);
	return 0;
}

/*
 * Our pid, boot and store in the lock file, once the last stop's are
 * dealt with (meta_roll_back): an open that failed before leaves them for the
 * next one. The store is the one the lock named until this open has read
 * its own. Flushed: after a power cut the file must still say that the
 * stop was unclean, or the store would open without its roll-back.
 */
int meta_write_lock(struct fs_meta *m)
{
	char line[32 + sizeof(m->boot) + sizeof(m->store_id)];
	const char *store = m->store_id[0] ? m->store_id : m->last_store;

	snprintf(line, sizeof(line), "%ld\n%s\n%s%s", (long)getpid(), m->boot, store,
		 store[0] ? "\n" : "");
	if (ftruncate(m->lock_fd, 0) < 0 || pwrite(m->lock_fd, line, strlen(line), 0) < 0 ||
	    fdatasync(m->lock_fd) < 0)
		return -errno;
	m->lock_written = true;
	return 0;
}

int meta_lock_note(struct fs_meta *m, const char *state, const char *point)
{
	char *line;
	int len, ret = 0;

	if (!m->lock_written)
		return 0;
	if (strchr(point, '\n'))
		point = ""; /* the note is one line; such a mount point goes unnamed */
	len = asprintf(&line, "%ld\n%s\n%s%s%s %s\n", (long)getpid(), m->boot, m->store_id,
		       m->store_id[0] ? "\n" : "", state, point);
	if (len < 0)
		return -ENOMEM;
	/* Over the old content, then cut: a reader never finds the file empty. */
	errno = 0;
	if (pwrite(m->lock_fd, line, (size_t)len, 0) != len || ftruncate(m->lock_fd, len) < 0)
		ret = errno ? -errno : -EIO;
	free(line);
	m->keep_note = ret == 0 && strcmp(state, "failed") == 0;
	return ret;
}

/* One line on stderr: whom a start waits for. Paths escaped (escape.h). */
static void say_waiting(const struct meta_holder *h, const char *dir, const char *prog,
			unsigned wait_s)
{
	char esc[ESC_SIZE(PATH_MAX)];

	if (h->pid > 0 && h->state[0])
		fprintf(stderr,
			"%s: waiting for tensorfs pid %ld to finish writing back after the unmount "
			"of %s (up to %u s)\n",
			prog, h->pid, esc_name(h->point, esc, sizeof(esc)), wait_s);
	else
		fprintf(stderr,
			"%s: waiting for pid %ld, which holds meta folder %s (up to %u s)\n", prog,
			h->pid, esc_name(dir, esc, sizeof(esc)), wait_s);
}

/*
 * Wait, polling, until no daemon holds the store in dir, as long as the one
 * that does is not serving a mount that we can see. Its lock goes with its
 * descriptor, so a dead daemon's is free at once.
 */
int meta_wait_holder(const char *dir, unsigned wait_s, const char *prog, char *err, size_t errlen)
{
	char ignored[512];
	struct meta_holder h;
	bool said = false;
	int dfd, fd, ret = 0;

	dfd = storedir_open(META_WHAT, dir, false, NULL, ignored, sizeof(ignored));
	if (dfd < 0)
		return 0; /* no store yet, or one meta_open refuses, saying why */
	fd = storedir_open_file(dfd, META_WHAT, dir, LOCK_NAME, O_RDONLY, false, NULL, ignored,
				sizeof(ignored));
	close(dfd);
	if (fd < 0)
		return 0;
	for (uint64_t ms = 0; flock(fd, LOCK_EX | LOCK_NB) < 0; ms += LOCK_POLL_MS) {
		if (errno != EWOULDBLOCK)
			break; /* meta_open tries again, and says why it cannot */
		meta_read_holder(fd, &h);
		if (holder_serves(&h) || ms >= (uint64_t)wait_s * 1000) {
			describe_holder(&h, dir, err, errlen);
			if (!holder_serves(&h) && wait_s)
				snprintf(err + strlen(err), errlen - strlen(err), " (waited %u s)",
					 wait_s);
			ret = -EBUSY;
			break;
		}
		if (!said)
			say_waiting(&h, dir, prog, wait_s);
		said = true;
		usleep(LOCK_POLL_MS * 1000);
	}
	close(fd); /* and the lock, if we took it: meta_open takes it again */
	return ret;
}

/* This boot's id, or "" where the kernel does not say. */
void meta_read_boot_id(char id[BOOT_ID_LEN + 1])
{
	FILE *f = fopen(BOOT_ID_PATH, "re");

	id[0] = 0;
	if (!f)
		return;
	if (!fgets(id, BOOT_ID_LEN + 1, f) || strlen(id) != BOOT_ID_LEN)
		id[0] = 0;
	fclose(f);
}

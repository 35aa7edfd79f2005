/*
 * unmount.c - tfsctl unmount: unmount a tensorfs mount and return once its
 * daemon has written back everything dirty, synced, and exited.
 *
 * fusermount3 -u and umount return as soon as the kernel lets go of the
 * mount; the daemon then goes on writing back what is dirty in DRAM, and
 * holds its store until that is done. This command names the daemon before
 * the unmount (its pid, from .tensorfs/config, held as a pidfd so that no
 * later process can be taken for it), unmounts, and waits for that process
 * to end. How its stop went its store's lock file says (fs/meta.c): empty
 * after a clean stop, "failed" after a failed write-back, and what it was
 * doing when it was killed.
 */
#include "tfsctl.h"
#include "meta.h"
#include "mounts.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define SAY_WAIT_MS 2000 /* say that we wait once the daemon takes this long */
#define POLL_MS 100	 /* without pidfd_open: how often to look for the process */

extern char **environ;

/* Unmount point: umount2 as root, else fusermount3 (setuid), as the mount's owner. */
static int do_unmount(const char *point)
{
	char *argv[] = {"fusermount3", "-u", (char *)point, NULL};
	pid_t pid;
	int st, e;

	if (geteuid() == 0) {
		if (umount2(point, 0) == 0)
			return 0;
		if (errno == EBUSY)
			errmsg("%s is busy: a process has a file or its working folder in it "
			       "(fuser -vm %s shows which)",
			       point, point);
		else
			errmsg("cannot unmount %s: %s", point, strerror(errno));
		return -1;
	}
	e = posix_spawnp(&pid, "fusermount3", NULL, NULL, argv, environ);
	if (e) {
		errmsg("cannot run fusermount3 to unmount %s: %s", point, strerror(e));
		return -1;
	}
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return -1;
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		errmsg("fusermount3 -u %s failed (see its message above)", point);
		return -1;
	}
	return 0;
}

/* Wait for process pid (held as pidfd, or -1 where the kernel has none) to end. */
static void wait_exit(pid_t pid, int pidfd)
{
	struct pollfd p = {.fd = pidfd, .events = POLLIN};
	unsigned ms = 0;
	bool said = false;

	for (;;) {
		if (pidfd >= 0) {
			int n = poll(&p, 1, said ? -1 : SAY_WAIT_MS);

			if (n > 0)
				return;
			if (n < 0 && errno != EINTR)
				pidfd = -1; /* look for the process instead */
		} else {
			if (kill(pid, 0) < 0 && errno == ESRCH)
				return;
			usleep(POLL_MS * 1000);
			ms += POLL_MS;
			if (ms < SAY_WAIT_MS)
				continue;
		}
		if (!said)
			fprintf(stderr, "%s: waiting for tensorfs pid %ld to write back and exit\n",
				prog, (long)pid);
		said = true;
	}
}

/*
 * The mount's daemon ended without unmounting (kill -9, a crash): the
 * kernel answers ENOTCONN. Detach the dead mount, and say what it means.
 */
static int unmount_dead(const char *arg)
{
	char point[PATH_MAX];

	if (arg[0] == '/')
		snprintf(point, sizeof(point), "%s", arg);
	else if (!getcwd(point, sizeof(point)) || strlen(point) + strlen(arg) + 2 > sizeof(point))
		return EXIT_RUNTIME;
	else
		snprintf(point + strlen(point), sizeof(point) - strlen(point), "/%s", arg);
	if (fs_mount_is_tensorfs(point) != 1) {
		errmsg("%s: %s", arg, strerror(ENOTCONN));
		return EXIT_RUNTIME;
	}
	if (do_unmount(point) < 0)
		return EXIT_RUNTIME;
	errmsg("the daemon of %s had ended without unmounting it (killed?); detached the dead "
	       "mount. What it had not written back is lost",
	       point);
	return EXIT_RUNTIME;
}

/* The daemon's pid and meta folder, from the mount's .tensorfs/config. */
static int mount_daemon(const struct tfs_mount *m, pid_t *pid, char *meta, size_t len)
{
	json_t *j = tfs_read_json(m, "config");
	const char *dir;

	if (!j)
		return -1;
	*pid = (pid_t)jint(j, "pid");
	dir = json_string_value(json_object_get(j, "meta"));
	snprintf(meta, len, "%s", dir ? dir : "");
	json_decref(j);
	if (*pid <= 0) {
		errmsg("%s: this tensorfs does not say its pid (it is older than tfsctl "
		       "unmount); unmount it with fusermount3 -u and wait for the daemon",
		       m->root);
		return -1;
	}
	return 0;
}

/* After the daemon has exited: 0 when its lock file says the stop was clean. */
static int stop_result(pid_t pid, int lockfd, const char *point)
{
	struct meta_holder h;

	if (lockfd < 0)
		return 0; /* not ours to read: the daemon's exit is all we know */
	meta_read_holder(lockfd, &h);
	if (h.pid != pid)
		return 0; /* emptied by a clean stop, or a later mount's */
	if (strcmp(h.state, "failed") == 0)
		errmsg("tensorfs pid %ld could not write back everything after %s was unmounted "
		       "(a device error; its log says which): what was not written back is lost",
		       (long)pid, point);
	else
		errmsg("tensorfs pid %ld ended before it had written back everything (killed?): "
		       "what it had not written back is lost",
		       (long)pid);
	return -1;
}

int cmd_unmount(int argc, char **argv, const struct tfs_args *a)
{
	const char *arg = argc == 1 ? argv[0] : a->mopt;
	char real[PATH_MAX], meta[PATH_MAX], lock[PATH_MAX + 16];
	struct tfs_mount m;
	struct statfs sfs;
	struct stat st;
	pid_t pid;
	int pidfd, lockfd, status = 0;

	if (argc > 1 || !arg) {
		errmsg("unmount takes one MOUNTPOINT");
		fprintf(stderr, "usage: tfsctl unmount MOUNTPOINT\n");
		return EXIT_USAGE;
	}
	/* statfs always asks the daemon; stat may be answered from the kernel's cache. */
	if (statfs(arg, &sfs) < 0 && errno == ENOTCONN)
		return unmount_dead(arg);
	if (tfs_find_mount(arg, NULL, &m) < 0)
		return EXIT_RUNTIME;
	if (!realpath(arg, real) || strcmp(real, m.root) != 0) {
		errmsg("%s is not a mount point: it lies in the tensorfs mount at %s", arg, m.root);
		return EXIT_RUNTIME;
	}
	if (mount_daemon(&m, &pid, meta, sizeof(meta)) < 0)
		return EXIT_RUNTIME;
	pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
	if (pidfd < 0 && errno != ENOSYS) {
		errmsg("%s: tensorfs pid %ld: %s", m.root, (long)pid, strerror(errno));
		return EXIT_RUNTIME;
	}
	/* Opened while the mount is there to say whose file it is; read after the exit. */
	snprintf(lock, sizeof(lock), "%s/lock", meta);
	lockfd = meta[0] ? open(lock, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC) : -1;
	if (lockfd >= 0 && (fstat(lockfd, &st) < 0 || !S_ISREG(st.st_mode))) {
		close(lockfd);
		lockfd = -1;
	}
	if (do_unmount(m.root) < 0) {
		status = EXIT_RUNTIME;
		goto out;
	}
	wait_exit(pid, pidfd);
	if (stop_result(pid, lockfd, m.root) < 0)
		status = EXIT_RUNTIME;
out:
	if (lockfd >= 0)
		close(lockfd);
	if (pidfd >= 0)
		close(pidfd);
	return status;
}

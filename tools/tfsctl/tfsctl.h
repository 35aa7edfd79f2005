/*
 * tfsctl.h - shared parts of tfsctl, the admin tool of a tensorfs mount.
 *
 * tfsctl talks to a mount only through the files of its hidden control
 * folder (MOUNT/.tensorfs/: stats, config, metrics, ctl) and the
 * user.tensorfs.tiers xattr, so it needs no socket and no server; fsck
 * reads the metadata store of a stopped mount directly, and unmount
 * waits for the daemon's exit.
 */
#ifndef TENSORFS_TFSCTL_H
#define TENSORFS_TFSCTL_H

#include <jansson.h>
#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Exit statuses: 0 success, runtime errors, and wrong usage. */
#define EXIT_RUNTIME 1
#define EXIT_USAGE 2

#define CTL_DIR ".tensorfs"
#define TIERS_XATTR "user.tensorfs.tiers"

struct tfs_mount {
	char root[PATH_MAX]; /* the mount point, resolved */
	dev_t dev;
};

/* msg.c: the name messages start with, and a message on stderr. */
extern const char *prog; /* "tfsctl" or "tfsctl COMMAND", for messages */

void errmsg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/*
 * mount.c: find the mount. mopt is -m's argument or NULL; near is a path
 * that must lie in the mount (a command's PATH) or NULL for the current
 * folder. Reports what is wrong and returns -1, or 0.
 */
int tfs_find_mount(const char *mopt, const char *near, struct tfs_mount *m);
/* The whole of a control file, NUL-terminated; NULL with errno set. */
char *tfs_read_ctl(const struct tfs_mount *m, const char *name, size_t *len);
/* A control file parsed as JSON; reports errors, NULL on failure. */
json_t *tfs_read_json(const struct tfs_mount *m, const char *name);
/* --json: print j (as JSON_OUT says) and a newline, and drop it; returns 0. */
int tfs_print_json(json_t *j);
/*
 * Write one command to the ctl file: 0 or -errno, not reported; *opened
 * says whether the error came from the command rather than the open.
 */
int tfs_ctl_write(const struct tfs_mount *m, const char *cmd, bool *opened);
/*
 * The argument a ctl command takes for path: its path from the mount's
 * root, or ino:N where the name has bytes the grammar refuses. Reports
 * errors (missing, outside the mount) and returns -1, or 0.
 */
int tfs_ctl_target(const struct tfs_mount *m, const char *path, char *out, size_t len);

/*
 * --json output: ASCII only, so that a name's control or bidirectional
 * characters reach the terminal as \u escapes, never raw.
 */
#define JSON_OUT (JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_ENSURE_ASCII)

/* format.c: numbers for people */
void fmt_bytes(uint64_t v, char *buf, size_t len); /* 1.5G, 512.0M, 12K, 7 */
void fmt_rate(double bps, char *buf, size_t len);  /* 1.23G/s, 45.6M/s */
void fmt_pct(double frac, char *buf, size_t len);  /* 93.1% */
uint64_t jint(json_t *obj, const char *key);	   /* 0 when absent */
/* format.c: names (paths, file names) printed escaped (escape.h), after before */
void print_name(const char *before, const char *name);
double jreal(json_t *obj, const char *key);

/* What the command line says besides a command's operands. */
struct tfs_args {
	const char *cmd;  /* the command's name */
	const char *mopt; /* -m MOUNTPOINT, or NULL */
	bool json;	  /* --json: stats, where, config */
	bool repair;	  /* --repair: fsck */
	long iterations;  /* -n N, --once: top; 0 runs until q */
};

/* The commands: argv holds the operands left after the options. */
int cmd_stats(int argc, char **argv, const struct tfs_args *a);
int cmd_top(int argc, char **argv, const struct tfs_args *a);
int cmd_where(int argc, char **argv, const struct tfs_args *a);
int cmd_unmount(int argc, char **argv, const struct tfs_args *a);

#endif

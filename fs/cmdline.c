/*
 * cmdline.c - the daemon's command line: the -o options it knows (the
 * table tests/test_docs.sh reads), --help, the hints for a mistyped or
 * misjoined option, SOURCE MOUNTPOINT, and the fsname= SOURCE becomes.
 * What the options' values mean and their checks are opts.c's; main.c
 * calls this file and nothing here calls back.
 */
#include "cmdline.h"
#include "fs.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OPT(t, p) {t, offsetof(struct fs_config, p), 1}

enum { KEY_HELP, KEY_VERSION, KEY_REMOTE, KEY_ALLOW_OTHER };

static const struct fuse_opt tfs_opts[] = {
	OPT("dram=%s", dram_s),
	OPT("nvme=%s", nvme_s),
	OPT("block=%s", block_s),
	OPT("meta=%s", meta_s),
	OPT("threads=%s", threads_s),
	OPT("config=%s", config_file),
	OPT("nvme_engine=%s", engine_s),
	OPT("dirty=%s", dirty_s),
	OPT("queue_depth=%s", qd_s),
	OPT("flush_delay_ms=%s", flush_delay_s),
	OPT("sync_interval_ms=%s", sync_interval_s),
	OPT("punch_after_ms=%s", punch_after_s),
	OPT("sync_commits=%s", sync_commits_s),
	OPT("dirty_expire_ms=%s", dirty_expire_s),
	OPT("stall_wait_ms=%s", stall_wait_s),
	OPT("logfile=%s", logfile),
	OPT("lock_wait=%s", lock_wait_s),
	OPT("log_level=%s", log_level_s),
	FUSE_OPT_KEY("remote=", KEY_REMOTE),
	OPT("endpoint=%s", endpoint_s),
	OPT("region=%s", region_s),
	OPT("s3_addressing=%s", s3_addressing_s),
	OPT("remote_timeout=%s", remote_timeout_s),
	OPT("nvme_bw=%s", nvme_bw_s),
	OPT("nvme_cap=%s", nvme_cap_s),
	OPT("remote_bw=%s", remote_bw_s),
	OPT("remote_cap=%s", remote_cap_s),
	OPT("s3_bw=%s", s3_bw_s),
	OPT("s3_cap=%s", s3_cap_s),
	OPT("pfs_bw=%s", pfs_bw_s),
	OPT("pfs_cap=%s", pfs_cap_s),
	OPT("dedup=%s", dedup_s),
	OPT("cache_policy=%s", policy_s),
	OPT("readahead=%s", readahead_s),
	OPT("remote_readahead=%s", remote_readahead_s),
	OPT("s3_object=%s", s3_object_s),
	OPT("prefetch=%s", prefetch_s),
	OPT("cuda=%s", cuda_s),
	OPT("checksum=%s", checksum_s),
	OPT("scratch=%s", scratch_s),
	{"no_default_permissions", offsetof(struct fs_config, no_default_permissions), 1},
	{"syslog", offsetof(struct fs_config, use_syslog), 1},
	FUSE_OPT_KEY("allow_other", KEY_ALLOW_OTHER),
	FUSE_OPT_KEY("-h", KEY_HELP),
	FUSE_OPT_KEY("--help", KEY_HELP),
	FUSE_OPT_KEY("-V", KEY_VERSION),
	FUSE_OPT_KEY("--version", KEY_VERSION),
	FUSE_OPT_END,
};

/* Edits (insert, delete, change, swap of neighbours) that turn a into b. */
static unsigned edit_distance(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b);
	unsigned d[40][40];

	if (la >= 40 || lb >= 40)
		return 99;
	for (size_t i = 0; i <= la; i++)
		d[i][0] = (unsigned)i;
	for (size_t j = 0; j <= lb; j++)
		d[0][j] = (unsigned)j;
	for (size_t i = 1; i <= la; i++)
		for (size_t j = 1; j <= lb; j++) {
			unsigned best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);

			if (d[i - 1][j] + 1 < best)
				best = d[i - 1][j] + 1;
			if (d[i][j - 1] + 1 < best)
				best = d[i][j - 1] + 1;
			if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
			    d[i - 2][j - 2] + 1 < best)
				best = d[i - 2][j - 2] + 1;
			d[i][j] = best;
		}
	return d[la][lb];
}

/*
 * A hint for one option that libfuse refused: the tensorfs option it is
 * probably a typo of, or the second folder of an nvme= list written with
 * commas (nvme=A,B reaches libfuse as the option B).
 */
static void hint_option(const char *opt)
{
	size_t n = strcspn(opt, "=");
	char name[64];
	const char *best = NULL;
	unsigned best_d; /* more edits than this is another word, not a typo */

	if (!*opt || n >= sizeof(name))
		return;
	if (!opt[n] && strchr(opt, '/')) {
		fprintf(stderr,
			"tensorfs: '%s' is not an option: nvme folders are separated by ':' "
			"(nvme=A:B), not ','\n",
			opt);
		return;
	}
	memcpy(name, opt, n);
	name[n] = '\0';
	best_d = n < 6 ? 2 : 3;
	for (const struct fuse_opt *o = tfs_opts; o->templ; o++) {
		char t[64];
		size_t tn = strcspn(o->templ, "=");
		unsigned d;

		if (o->templ[0] == '-' || tn >= sizeof(t))
			continue;
		memcpy(t, o->templ, tn);
		t[tn] = '\0';
		d = edit_distance(name, t);
		if (!d)
			return; /* one of ours (allow_other, also libfuse's): not the one refused */
		if (d < best_d) {
			best_d = d;
			best = o->templ;
		}
	}
	if (best)
		fprintf(stderr, "tensorfs: unknown option '%s': did you mean '%.*s'?\n", name,
			(int)strcspn(best, "="), best);
}

/* Hints for the options left in args after ours were taken (see hint_option). */
void fs_cmdline_hints(const struct fuse_args *args)
{
	for (int i = 1; i < args->argc; i++) {
		const char *a = args->argv[i];
		char *list, *save = NULL;

		if (!strcmp(a, "-o") && i + 1 < args->argc)
			a = args->argv[++i];
		else if (!strncmp(a, "-o", 2))
			a += 2;
		else
			continue;
		list = strdup(a);
		if (!list)
			return;
		for (char *o = strtok_r(list, ",", &save); o; o = strtok_r(NULL, ",", &save))
			hint_option(o);
		free(list);
	}
}

void fs_cmdline_usage(const char *prog)
{
	printf("usage: %s [SOURCE] MOUNTPOINT [options]\n\n"
	       "tensorfs keeps the files that training offloaders swap out of GPU memory in\n"
	       "a DRAM cache and on NVMe folders, with metadata in LMDB.\n\n"
	       "tensorfs options (-o name=value, or the same keys in [tensorfs] of a config "
	       "file):\n"
	       "    -o dram=SIZE           DRAM cache size (default: a quarter of available "
	       "memory);\n"
	       "                           at least (2 x threads + 16) MiB with 1M blocks,\n"
	       "                           at most 90%% of the host's memory (MemTotal);\n"
	       "                           in a memory cgroup, dram + 64 MiB + 3 MiB per\n"
	       "                           thread at most 90%% of its limit\n"
	       "    -o nvme=DIR[:DIR...]   nvme tier folders; blocks are spread across them by\n"
	       "                           measured bandwidth\n"
	       "                           (default: $XDG_DATA_HOME/tensorfs, /var/lib/tensorfs "
	       "for root,\n"
	       "                           else ~/.local/share/tensorfs); nvme=none with\n"
	       "                           remote= and meta=: blocks on the remote tier only\n"
	       "    -o block=SIZE          block size, a power of two from 4K to 64M (default "
	       "1M);\n"
	       "                           fixed when the store is created\n"
	       "    -o meta=DIR            metadata folder (default: FIRST_NVME_DIR/meta)\n"
	       "    -o threads=N           FUSE worker threads (default 32); with 1M blocks\n"
	       "                           each of the first 64 holds one more MiB of DRAM\n"
	       "                           that writes land in, so a whole-block write is\n"
	       "                           not copied\n"
	       "    -o config=FILE         INI file with a [tensorfs] section; -o wins over it;\n"
	       "                           a regular file (not a link) of yours or root's\n"
	       "                           that nobody else can write\n"
	       "    -o nvme_engine=E       auto, io_uring or libaio (default auto: io_uring, "
	       "else libaio)\n"
	       "    -o dirty=SIZE          dirty data high-water mark; writers wait above it\n"
	       "                           (default: all of dram but a clean reserve of 1/32)\n"
	       "    -o dirty_expire_ms=N   write back a block dirty this long even if it could\n"
	       "                           stay in DRAM: bounds what a crash loses without fsync\n"
	       "                           (30000; 0: only fsync, eviction and unmount)\n"
	       "    -o stall_wait_ms=N     while every write-back fails (a full disk), a\n"
	       "                           writer held at the dirty mark gets ENOSPC (else\n"
	       "                           EIO) once the failures have lasted this long (5000)\n"
	       "    -o queue_depth=N       I/Os in flight per nvme folder (default 32)\n"
	       "    -o flush_delay_ms=N    how long a partly written block waits before "
	       "write-back (100)\n"
	       "    -o sync_interval_ms=N  how often changes are made durable (1000)\n"
	       "    -o sync_commits=N      commits that bring a sync point at once (256)\n"
	       "    -o punch_after_ms=N    slab space free this long goes back to the filesystem\n"
	       "                           (10000; 0: never)\n"
	       "    -o logfile=FILE        log here when running in the background\n"
	       "    -o lock_wait=SECONDS   wait this long for the daemon of the store's last\n"
	       "                           mount to finish writing back after its unmount\n"
	       "                           (600; 0: refuse at once)\n"
	       "    -o log_level=L         error, warning, info (default) or debug\n"
	       "    -o syslog              log to syslog (facility daemon), not stderr\n"
	       "    -o remote=URL          remote tier: s3://BUCKET[/PREFIX] or /pfs/folder;\n"
	       "                           repeat it for several (one s3 at most)\n"
	       "    -o endpoint=URL        S3 endpoint, http(s)://host[:port][/path]\n"
	       "                           (default: AWS); no user, password, query or\n"
	       "                           fragment in it\n"
	       "    -o region=R            S3 region (default us-east-1)\n"
	       "    -o s3_addressing=A     path or virtual (default: path with endpoint=)\n"
	       "    -o remote_timeout=T    give up on a remote request after T seconds (30)\n"
	       "    -o nvme_bw=SIZE        cap each nvme folder at SIZE bytes per second\n"
	       "    -o nvme_cap=SIZE       store at most SIZE bytes in each nvme folder\n"
	       "    -o remote_bw=SIZE      cap the remote tier at SIZE bytes per second\n"
	       "    -o remote_cap=SIZE     store at most SIZE bytes in the remote tier\n"
	       "    -o s3_bw= s3_cap= pfs_bw= pfs_cap=  the same for one kind of remote\n"
	       "    -o dedup=MODE          verify (default), trust or off: store a block whose\n"
	       "                           XXH3-128 hash is already stored as a reference to\n"
	       "                           it; verify compares the bytes first\n"
	       "    -o checksum=off        do not check blocks read from the devices against\n"
	       "                           their hash (on: the default; an EIO when they differ)\n"
	       "    -o scratch=on|off      on: the files outlive the daemon, not the machine:\n"
	       "                           sync points flush no drive (a swap folder); after a\n"
	       "                           power cut or kernel crash the store starts empty (off)\n"
	       "    -o cache_policy=P      auto (default: Belady on the learned access cycle,\n"
	       "                           else 2q), 2q, clock, or lru (sampled)\n"
	       "    -o readahead=SIZE      load this far ahead of a sequential reader (8M; 0: off)\n"
	       "    -o remote_readahead=SIZE  at most this far ahead of a reader of blocks on a\n"
	       "                           remote tier, as its latency x bandwidth asks (64M,\n"
	       "                           two s3 objects at least; 0: readahead= for them too)\n"
	       "    -o s3_object=SIZE      blocks packed into one S3 object, for a new s3 tier\n"
	       "                           (dram/16 from 8M to 64M, at most 64 blocks)\n"
	       "    -o prefetch=on|off     load the next files of the learned cycle (on);\n"
	       "                           hints (xattr, ctl) work either way\n"
	       "    -o cuda=on|off         share the DRAM arena with GPU clients "
	       "(libtensorfs-cuda)\n"
	       "                           and pin it with CUDA where a GPU is present (off)\n"
	       "    -o no_default_permissions  do not let the kernel check permissions\n"
	       "\n"
	       "SIZE is a number with an optional K, M, G or T suffix (powers of 1024).\n"
	       "The nvme, remote and meta folders must be yours or root's and writable by\n"
	       "nobody else, and hold no link or file of another user under the store's\n"
	       "file names; the store's files are mode 600.\n"
	       "S3 credentials come from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and\n"
	       "AWS_SESSION_TOKEN, or from an [s3] section of the config file (mode 600).\n"
	       "Statistics: MOUNTPOINT/.tensorfs/stats (JSON); configuration: "
	       "MOUNTPOINT/.tensorfs/config.\n\n",
	       prog);
}

static int opt_proc(void *data, const char *arg, int key, struct fuse_args *outargs)
{
	struct fs_config *c = data;

	(void)outargs;
	switch (key) {
	case KEY_HELP:
		c->show_help = 1;
		return 0;
	case KEY_VERSION:
		c->show_version = 1;
		return 0;
	case KEY_REMOTE:
		if (fs_config_add_remote(c, arg + strlen("remote=")) < 0)
			return -1;
		return 0;
	case KEY_ALLOW_OTHER:
		c->allow_other = 1;
		return 1; /* noted, and left for libfuse */
	case FUSE_OPT_KEY_NONOPT:
		/* mount.fuse3 passes SOURCE MOUNTPOINT: the last one is the mount point. */
		if (c->mountpoint) {
			if (c->source) {
				fprintf(stderr, "tensorfs: too many arguments: '%s'\n", arg);
				return -1;
			}
			c->source = c->mountpoint;
		}
		c->mountpoint = strdup(arg);
		return 0;
	default:
		return 1;
	}
}

/*
 * SOURCE names the mount (fsname=, what /proc/mounts and df show), and
 * reaches libfuse inside an -o list: its commas and backslashes are
 * escaped, so that a SOURCE of "x,allow_other" or "x,ro" is a name, not
 * options that the checks on allow_other never saw.
 */
int fs_cmdline_fsname(struct fuse_args *args, const char *source)
{
	char *opts = NULL, *name;
	int ret = -1;

	if (asprintf(&name, "fsname=%s", source) < 0)
		return -1;
	if (fuse_opt_add_opt_escaped(&opts, name) == 0 &&
	    fuse_opt_add_opt(&opts, "subtype=tensorfs") == 0 && fuse_opt_add_arg(args, "-o") == 0 &&
	    fuse_opt_add_arg(args, opts) == 0)
		ret = 0;
	free(name);
	free(opts);
	return ret;
}

/* Parse argv's options into c; -1 when one is refused (said on stderr). */
int fs_cmdline_parse(struct fuse_args *args, struct fs_config *c)
{
	return fuse_opt_parse(args, c, tfs_opts, opt_proc);
}

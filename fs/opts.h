/*
 * opts.h - the daemon's configuration: mount options, the INI file and
 * the defaults, in one struct.
 *
 * Precedence: -o options, then the config file, then the defaults in
 * fs_config_defaults. Every value is checked here, so the rest of the
 * daemon can trust it; an error names the option and the bad value.
 */
#ifndef TENSORFS_OPTS_H
#define TENSORFS_OPTS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/stat.h>

#include "tb.h"

#define FS_MAX_NVME (TB_MAX_DEVS - FS_MAX_REMOTES)
#define FS_MAX_REMOTES 4

struct fs_config {
	/* as given: strings from -o and the file, NULL when unset */
	char *dram_s, *nvme_s, *block_s, *meta_s, *threads_s, *engine_s, *dirty_s, *qd_s;
	char *flush_delay_s, *dirty_expire_s, *sync_interval_s, *config_file, *logfile, *log_level_s;
	char *punch_after_s, *sync_commits_s;
	char *stall_wait_s;
	char *remote_s; /* one or more, separated by ';' (remote= may be repeated) */
	char *endpoint_s, *region_s, *s3_addressing_s, *remote_timeout_s;
	char *nvme_bw_s, *nvme_cap_s, *remote_bw_s, *remote_cap_s;
	char *s3_bw_s, *s3_cap_s, *pfs_bw_s, *pfs_cap_s, *dedup_s, *policy_s, *readahead_s;
	char *prefetch_s;
	char *cuda_s;
	char *checksum_s, *scratch_s;
	char *remote_readahead_s, *s3_object_s;
	char *lock_wait_s;
	char *s3_key, *s3_secret, *s3_token; /* from the file's [s3] or AWS_* only */
	char *source, *mountpoint;
	int no_default_permissions;
	int use_syslog; /* -o syslog */
	int allow_other; /* seen in -o, and passed on to libfuse */
	int show_help, show_version;

	/* resolved */
	size_t dram, block, dirty;
	bool block_given;
	char *nvme[FS_MAX_NVME];
	unsigned n_nvme;
	char *meta;
	unsigned threads, queue_depth, flush_delay_ms, dirty_expire_ms, sync_interval_ms;
	unsigned punch_after_ms; /* free slab space goes back after this long; 0: never */
	unsigned sync_commits;   /* metadata commits that bring a sync point at once */
	unsigned stall_wait_ms; /* tb_config.stall_wait_ms */
	enum tb_engine engine;
	enum tb_dedup dedup;
	enum tb_policy policy;
	size_t readahead;
	size_t remote_readahead; /* deepest window ahead of a reader of remote blocks */
	size_t s3_object;	 /* bytes of blocks per object, for a new s3 tier */
	bool prefetch;
	bool cuda;     /* share the arena with GPU clients (fs/gpu.c) */
	bool checksum; /* check each block read from a device against its hash */
	bool scratch;  /* the store outlives the daemon, not the machine (meta_scratch.c) */
	int log_level;
	unsigned lock_wait_secs; /* a start waits this long for the store's last daemon */
	bool default_nvme;	 /* the folder is ours to create */
	/* persistent devices: the nvme folders, then the remote tier if any */
	struct tb_dev_spec devs[FS_MAX_NVME + FS_MAX_REMOTES];
	unsigned n_devs;
	bool has_s3;
	char *remote_path[FS_MAX_REMOTES]; /* pfs folders */
	unsigned n_pfs;
	char *s3_bucket, *s3_prefix;
	struct tb_s3_config s3;
};

/* Add one remote= value (repeatable) to the list. */
int fs_config_add_remote(struct fs_config *c, const char *value);
/* Parse a size: digits with an optional K, M, G or T (powers of 1024). */
int fs_parse_size(const char *s, size_t *out);
/* Read the INI file into the fields -o left unset. */
int fs_config_load_file(struct fs_config *c, const char *path, char *err, size_t errlen);
/* Check every value and fill the rest from the defaults. */
int fs_config_resolve(struct fs_config *c, char *err, size_t errlen);
void fs_config_free(struct fs_config *c);

/*
 * The checks on a file just opened with O_NOFOLLOW | O_NONBLOCK from a path
 * another user may have had a hand in (the config file, the log file): it
 * must be a regular file (a FIFO or a device would hang the start), owned
 * by the user tensorfs runs as (or root with FS_OPENED_ROOT_MAY_OWN), of
 * one link with FS_OPENED_ONE_LINK (else it may be another user's file
 * under a second name), and writable by nobody else. Clears O_NONBLOCK
 * and returns fd with *st filled in; else closes fd and returns -errno
 * with err naming what and path.
 */
enum { FS_OPENED_ROOT_MAY_OWN = 1, FS_OPENED_ONE_LINK = 2 };
int fs_check_opened(int fd, const char *what, const char *path, unsigned rules, struct stat *st,
		    char *err, size_t errlen);

#endif

/*
 * main.c - the tensorfs daemon: start-up, the FUSE loop, shutdown (its
 * command line is cmdline.c's).
 *
 * Start-up checks everything that can be checked before the mount exists
 * (options, mount point, folders, the metadata store, the DRAM arena), so
 * that a bad start leaves nothing mounted. Without -f the process forks
 * first; the child reports success or failure through a pipe and the
 * parent exits with that status, so `tensorfs ... && use-the-mount` works.
 * On unmount or a signal the loop ends, every dirty block is written back
 * and synced, and the daemon exits 0.
 */
#include "cmdline.h"
#include "fs.h"
#include "log.h"
#include "mounts.h"
#include "storedir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <malloc.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define ATTR_TIMEOUT 1.0
#define ENTRY_TIMEOUT 1.0
#define READS_PINNED_PER_THREAD 2 /* a 1 MiB read may straddle two blocks */
#define MMAP_THRESHOLD (128 * 1024) /* glibc's default, kept fixed (see main) */

static int check_mountpoint(struct fs_config *c, char *err, size_t errlen)
{
	char real[PATH_MAX];
	struct stat st;
	DIR *d;
	struct dirent *de;
	int ret;

	if (!c->mountpoint) {
		snprintf(err, errlen, "no mount point given (see --help)");
		return -EINVAL;
	}
	ret = fs_mount_check_point(c->mountpoint, err, errlen);
	if (ret < 0)
		return ret;
	if (stat(c->mountpoint, &st) < 0) {
		snprintf(err, errlen, "mount point %s: %s", c->mountpoint, strerror(errno));
		return -errno;
	}
	if (!S_ISDIR(st.st_mode)) {
		snprintf(err, errlen, "mount point %s is not a directory", c->mountpoint);
		return -ENOTDIR;
	}
	d = opendir(c->mountpoint);
	if (!d) {
		snprintf(err, errlen, "mount point %s: %s", c->mountpoint, strerror(errno));
		return -errno;
	}
	while ((de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
			closedir(d);
			snprintf(err, errlen, "mount point %s is not empty", c->mountpoint);
			return -ENOTEMPTY;
		}
	closedir(d);
	if (realpath(c->mountpoint, real)) {
		free(c->mountpoint);
		c->mountpoint = strdup(real);
	}
	return 0;
}

/*
 * The mount's scan of the block records: each location marked used (this
 * rebuilds the allocators and reclaims lost space), and counted by device.
 */
struct mark_scan {
	struct fs *fs;
	uint64_t blocks[TB_MAX_DEVS]; /* records per device */
	int err;		      /* the first location that could not be marked */
};

/*
 * After the first location that cannot be marked, the scan only counts:
 * a folder that lacks its identity is the likelier cause, and
 * tb_check_devices says so better.
 */
static int mark_block(void *arg, uint64_t id, const struct meta_block *b)
{
	struct mark_scan *ms = arg;
	int ret;

	if (tb_loc_dev(b->loc) < TB_MAX_DEVS)
		ms->blocks[tb_loc_dev(b->loc)]++;
	if (ms->err)
		return 0;
	ret = tb_mark_used(ms->fs->tb, b->loc);
	if (ret && ret != -ENODEV) /* a device not given: bind_devices names it */
		log_err("block %llu names location %llx, which is %s",
			(unsigned long long)id, (unsigned long long)b->loc, "invalid or used twice");
	ms->err = ret;
	return 0;
}

static int scan_blocks(void *arg)
{
	struct mark_scan *ms = arg;

	return meta_foreach_block(ms->fs->meta, mark_block, ms);
}

struct purge_args {
	struct fs *fs;
	struct locvec *freed;
	uint64_t *orphans;
};

static int purge_orphans(void *arg)
{
	struct purge_args *a = arg;

	return meta_purge_orphans(a->fs->meta, a->freed, a->orphans);
}

/*
 * Each device against the blocks the store holds on it and the binding it
 * recorded (tb_check_devices); a new binding is recorded before it is
 * written into the device's identity, so that a crash between the two
 * leaves a device the next start takes afresh.
 */
static int bind_devices(struct fs *fs, const struct mark_scan *ms, const char *store_id, char *err,
			size_t errlen)
{
	char bind[TB_MAX_DEVS][TB_BIND_LEN] = {{0}};
	unsigned n_bind = 0, n;
	bool changed;
	int ret;

	_Static_assert(TB_BIND_LEN == META_BIND_LEN, "a binding is the same size in both");
	ret = meta_devices_get(fs->meta, bind, TB_MAX_DEVS, &n_bind);
	if (ret) {
		snprintf(err, errlen, "cannot read the store's record of its devices: %s",
			 meta_strerror(ret));
		return ret;
	}
	for (unsigned i = tb_n_devs(fs->tb); i < TB_MAX_DEVS; i++)
		if (ms->blocks[i]) {
			snprintf(err, errlen,
				 "the store in %s has %u devices (nvme folders, then remotes) and "
				 "%llu blocks on device %u; this mount gives %u: give every nvme "
				 "folder of the store, in the order they were given, separated by "
				 "':'",
				 fs->cfg->meta, n_bind > i ? n_bind : i + 1,
				 (unsigned long long)ms->blocks[i], i + 1, tb_n_devs(fs->tb));
			return -ENODEV;
		}
	ret = tb_check_devices(fs->tb, ms->blocks, bind, n_bind, &changed, err, errlen);
	if (ret || !changed)
		return ret;
	n = tb_n_devs(fs->tb) > n_bind ? tb_n_devs(fs->tb) : n_bind;
	ret = meta_devices_put(fs->meta, bind, n);
	if (ret) {
		snprintf(err, errlen, "cannot record the store's devices: %s", meta_strerror(ret));
		return ret;
	}
	return tb_bind_devices(fs->tb, bind, store_id, err, errlen);
}

/* A block record's stored bytes: 0 in records that predate the length means all of them. */
static size_t block_len(const struct fs *fs, const struct meta_block *b)
{
	return b->len ? (size_t)b->len : fs->bs;
}

static int owner_resolve(void *ctx, uint64_t obj, uint64_t idx, struct tb_stored *at)
{
	struct fs *fs = ctx;
	struct meta_block b;
	MDB_txn *txn;
	uint64_t id;
	int ret = meta_begin(fs->meta, false, &txn);

	if (ret)
		return ret;
	ret = meta_bmap_get(fs->meta, txn, obj, idx, &id);
	if (ret == 0)
		ret = meta_block_get(fs->meta, txn, id, &b);
	meta_abort(txn);
	if (ret == 0) {
		at->loc = b.loc;
		at->len = block_len(fs, &b);
		at->hashed = b.flags & META_BLOCK_HASHED;
		memcpy(at->hash, b.hash, TB_HASH_LEN);
	}
	return ret;
}

/*
 * A failed commit is retried with its blocks (flush.c, flush_wb_failed), for as
 * long as the metadata's filesystem stays full: said once every 10 s.
 */
static void commit_failed(size_t n, int err)
{
	static long log_sec;

	if (log_ratelimit(&log_sec, 10))
		log_err("cannot commit %zu written blocks: %s%s", n, strerror(-err),
			err == -ENOSPC ? " (the metadata store or its filesystem is full)" : "");
}

static int owner_commit(void *ctx, const struct tb_commit *c, size_t n)
{
	struct fs *fs = ctx;
	struct locvec freed = {0};
	MDB_txn *txn;
	int ret = meta_begin(fs->meta, true, &txn);

	if (ret)
		return ret;
	/*
	 * The blocks that share a stored block first: a block written in the
	 * same batch (a hole, say) may drop the last reference that the
	 * shared block had, and after it the share found the block gone
	 * (-ESTALE, and the whole batch written again).
	 */
	for (size_t i = 0; i < n && !ret; i++)
		if (c[i].share_id)
			ret = meta_bmap_share_block(fs->meta, txn, c[i].obj, c[i].idx,
						    c[i].share_id, c[i].hash, &freed);
	for (size_t i = 0; i < n && !ret; i++)
		if (!c[i].share_id)
			ret = meta_bmap_store(fs->meta, txn, c[i].obj, c[i].idx, c[i].loc,
					      c[i].len, c[i].hashed ? c[i].hash : NULL,
					      c[i].hashed && c[i].index, &freed);
	if (ret) {
		meta_abort(txn);
		meta_locvec_free(&freed);
		if (ret != -ESTALE)
			commit_failed(n, ret);
		return ret;
	}
	ret = meta_commit(txn);
	if (ret) {
		meta_locvec_free(&freed);
		commit_failed(n, ret);
		return ret;
	}
	return fs_release_locs(fs, &freed);
}

static int owner_dedup_find(void *ctx, const uint8_t *hash, uint64_t *id, uint64_t *loc,
			    size_t *len)
{
	struct fs *fs = ctx;
	struct meta_block b;
	MDB_txn *txn;
	int ret = meta_begin(fs->meta, false, &txn);

	if (ret)
		return ret;
	ret = meta_dedup_find(fs->meta, txn, hash, id, &b);
	meta_abort(txn);
	if (ret == 0) {
		*loc = b.loc;
		*len = block_len(fs, &b);
	}
	return ret;
}

static uint64_t owner_cycle_period(void *ctx)
{
	struct fs *fs = ctx;

	return __atomic_load_n(&fs->learn.period, __ATOMIC_RELAXED);
}

static void owner_cycle_size(void *ctx, uint64_t *blocks, uint64_t *tails, uint64_t *written)
{
	struct fs *fs = ctx;
	struct fs_learn_stats st;

	fs_learn_stats(&fs->learn, &st);
	*blocks = st.blocks;
	*tails = st.tails;
	*written = st.written;
}

static void owner_next_use(void *ctx, uint64_t obj, struct tb_use *u)
{
	struct fs *fs = ctx;
	struct fs_learn_use lu;

	fs_learn_next_use(&fs->learn, obj, &lu);
	u->dist = lu.dist;
	u->write = lu.write;
	u->now = lu.now;
	u->size = lu.size;
}

static int owner_sync(void *ctx, int (*flush)(void *arg), void *arg, bool power)
{
	struct fs *fs = ctx;

	return meta_sync(fs->meta, flush, arg, power);
}

/* Threads past this many receive writes into their own buffer and copy them (loop.c). */
#define SPARES_MAX 64

/* Blocks that reads in flight may pin at once: the DRAM tier's floor. */
static unsigned max_pinned(const struct fs_config *c, size_t bs)
{
	return c->threads * READS_PINNED_PER_THREAD *
	       (unsigned)((1U << 20) / bs > 1 ? (1U << 20) / bs : 1);
}

/* No store folder on a tensorfs mount, nor under the mount point (mounts.c). */
static int check_off_tensorfs(const struct fs_config *c, char *err, size_t errlen)
{
	for (unsigned i = 0; i < c->n_devs; i++) {
		int ret;

		if (c->devs[i].kind == TB_KIND_S3)
			continue;
		ret = fs_mount_check_folder(c->devs[i].kind == TB_KIND_NVME ? "nvme folder"
									    : "remote folder",
					    c->devs[i].path, c->mountpoint, err, errlen);
		if (ret)
			return ret;
	}
	return fs_mount_check_folder("meta folder", c->meta, c->mountpoint, err, errlen);
}

/*
 * What can be checked before the store is touched, so that a refused start
 * creates nothing. (The store's block size, if it exists, is checked again.)
 * The folders the store's files go into must be beyond other users' reach:
 * the folder checks are made again, on the descriptors used, when the
 * files are opened.
 */
static int precheck(const struct fs_config *c, char *err, size_t errlen)
{
	uint64_t need = ((uint64_t)max_pinned(c, c->block) + 16) * c->block;
	int ret;

	if (c->dram < need) {
		snprintf(err, errlen,
			 "dram=%zuM is too small: with block=%zuK and threads=%u it needs at least "
			 "%lluM",
			 c->dram >> 20, c->block >> 10, c->threads,
			 (unsigned long long)((need + (1 << 20) - 1) >> 20));
		return -EINVAL;
	}
	for (unsigned i = 0; i < c->n_devs; i++) {
		if (c->devs[i].kind == TB_KIND_S3)
			continue;
		ret = tb_check_folder(c->devs[i].kind, c->devs[i].path, err, errlen);
		if (ret)
			return ret;
	}
	ret = check_off_tensorfs(c, err, errlen);
	if (ret)
		return ret;
	return meta_check_folder(c->meta, err, errlen);
}

/*
 * A new store in device folders that hold another store's identity: the
 * metadata that named their blocks is elsewhere, or gone. Say so, rather
 * than that the folders belong to a store that nobody can name.
 */
static int check_unclaimed(const struct fs_config *c, char *err, size_t errlen)
{
	for (unsigned i = 0; i < c->n_devs; i++) {
		int ret;

		if (c->devs[i].kind == TB_KIND_S3)
			continue; /* its identity is under the store's own id */
		ret = tb_check_unclaimed(c->devs[i].kind, c->devs[i].path, c->meta, err, errlen);
		if (ret)
			return ret;
	}
	return 0;
}

static void meta_committed(void *arg, bool urgent)
{
	tb_meta_committed(arg, urgent);
}

/* What to add to a thread's start failing with ret: EAGAIN is mostly a limit on tasks. */
static const char *task_limit_hint(int ret)
{
	return ret == -EAGAIN ? " (a limit on tasks: a cgroup's pids.max, systemd's TasksMax, "
				"or ulimit -u?)"
			      : "";
}

static int open_stores(struct fs *fs, unsigned nthreads, char *err, size_t errlen)
{
	struct fs_config *c = fs->cfg;
	struct tb_config tc = {0};
	struct tb_owner owner = {fs,	     owner_resolve,	 owner_commit, owner_dedup_find,
				 owner_sync, owner_cycle_period, owner_next_use, owner_cycle_size};
	struct locvec freed = {0};
	char store_id[40];
	uint64_t orphans;
	size_t bs = c->block;
	int ret;

	ret = meta_wait_holder(c->meta, c->lock_wait_secs, "tensorfs", err, errlen);
	if (ret)
		return ret;
	ret = meta_open(&fs->meta, c->meta, &bs, c->block_given, c->scratch, getuid(), getgid(),
			store_id, err, errlen);
	if (ret)
		return ret;
	fs->new_store = meta_is_new(fs->meta);
	if (meta_upgraded_from(fs->meta))
		log_info("upgraded the metadata store in %s from format %u to %u (a count of "
			 "mapped blocks per file; blocks stored short); older tensorfs versions "
			 "cannot open it",
			 c->meta, meta_upgraded_from(fs->meta), META_FORMAT_VERSION);
	if (fs->new_store) {
		ret = check_unclaimed(c, err, errlen);
		if (ret)
			return ret;
	}
	fs->bs = bs;
	fs->learn.block = bs;
	tc.block_size = bs;
	tc.dram_bytes = c->dram;
	tc.dirty_bytes = c->dirty;
	tc.store_id = store_id;
	tc.devs = c->devs;
	tc.n_devs = c->n_devs;
	tc.s3 = c->has_s3 ? &c->s3 : NULL;
	tc.engine = c->engine;
	tc.queue_depth = c->queue_depth;
	tc.flush_delay_ms = c->flush_delay_ms;
	tc.dirty_expire_ms = c->dirty_expire_ms;
	tc.sync_interval_ms = c->sync_interval_ms;
	tc.punch_after_ms = c->punch_after_ms;
	tc.sync_commits = c->sync_commits;
	tc.stall_wait_ms = c->stall_wait_ms;
	tc.max_pinned = max_pinned(c, bs);
	/*
	 * Where one write fills a block (loop.c): one per thread that serves
	 * requests, and as many again for writes parked with their bytes in one
	 * while they wait for room (defer.c).
	 */
	tc.spare_slots = bs == FS_MAX_WRITE ? 2 * (nthreads < SPARES_MAX ? nthreads : SPARES_MAX) : 0;
	tc.remote_readahead = c->remote_readahead;
	tc.dedup = c->dedup;
	tc.no_checksum = !c->checksum;
	tc.scratch = c->scratch;
	tc.policy = c->policy;
	tc.share_arena = c->cuda;
	/* Test hook only: makes every block's hash collide, to prove verify. */
	tc.test_collide = getenv("TENSORFS_TEST_HASH_COLLIDE") != NULL;
	ret = tb_open(&tc, &owner, &fs->tb, err, errlen);
	if (ret)
		return ret;
	meta_on_commit(fs->meta, meta_committed, fs->tb); /* metadata commits lead to sync points */
	/* Read with faults in a damaged data.mdb guarded: refused, not a crash (metaguard.h). */
	struct mark_scan *ms = calloc(1, sizeof(*ms));
	struct purge_args pa = {fs, &freed, &orphans};

	if (!ms)
		return -ENOMEM;
	ms->fs = fs;
	ret = meta_guarded(fs->meta, scan_blocks, ms, err, errlen);
	if (ret == 0)
		ret = bind_devices(fs, ms, store_id, err, errlen);
	if (ret == 0 && ms->err) {
		ret = ms->err;
		snprintf(err, errlen,
			 "the metadata store in %s does not match the nvme folders (see the log "
			 "above)",
			 c->meta);
	}
	free(ms);
	if (ret) {
		/* What this start made in the device folders goes: the next start decides again. */
		tb_forget_identity(fs->tb);
		if (!err[0])
			snprintf(err, errlen, "cannot read the block records in %s: %s", c->meta,
				 meta_strerror(ret));
		return ret;
	}
	/* Orphans are purged before the allocators start, so their space is free now. */
	ret = meta_guarded(fs->meta, purge_orphans, &pa, err, errlen);
	if (ret) {
		if (!err[0])
			snprintf(err, errlen, "cannot purge deleted files in %s: %s", c->meta,
				 meta_strerror(ret));
		return ret;
	}
	if (orphans)
		log_info("purged %llu deleted files left open at the last stop",
			 (unsigned long long)orphans);
	ret = tb_start(fs->tb);
	if (ret) {
		snprintf(err, errlen, "cannot start the I/O threads: %s%s", strerror(-ret),
			 task_limit_hint(ret));
		return ret;
	}
	fs_release_locs(fs, &freed);
	return meta_sync(fs->meta, NULL, NULL, true);
}

/* What the store's lock file says this daemon does (meta_lock_note). */
static void note_state(struct fs *fs, const char *state)
{
	int ret = fs->meta ? meta_lock_note(fs->meta, state, fs->cfg->mountpoint) : 0;

	if (ret)
		log_warn("meta folder %s: cannot note \"%s\" in the lock file: %s", fs->cfg->meta,
			 state, strerror(-ret));
}

/*
 * The mount is gone; what is dirty goes to the devices before the exit.
 * Say so in the lock file, for a start that waits for the store. A signal
 * no longer ends anything that matters: it would only lose the data, so
 * only SIGKILL does that now.
 */
static void begin_stop(struct fs *fs, uint64_t *dirty)
{
	struct tb_stats st = {0};

	note_state(fs, "stopping");
	signal(SIGINT, SIG_IGN);
	signal(SIGTERM, SIG_IGN);
	signal(SIGHUP, SIG_IGN);
	if (fs->tb)
		tb_get_stats(fs->tb, &st);
	*dirty = st.dirty_bytes;
	log_info("unmounted %s; writing back the %.1f MiB that are dirty before the exit "
		 "(signals other than SIGKILL wait for it)",
		 fs->cfg->mountpoint, (double)st.dirty_bytes / (1 << 20));
}

/*
 * Two nvme folders on one filesystem share one disk's bandwidth and free
 * space: allowed (a test or a small machine), but said, since it is more
 * often a drive that did not mount under one of them.
 */
static void warn_shared_folders(const struct fs_config *c)
{
	struct stat a, b;

	for (unsigned i = 0; i < c->n_nvme; i++)
		for (unsigned j = i + 1; j < c->n_nvme; j++)
			if (stat(c->nvme[i], &a) == 0 && stat(c->nvme[j], &b) == 0 &&
			    a.st_dev == b.st_dev)
				log_warn("nvme folders %s and %s are on one filesystem: they share "
					 "its disk's bandwidth, and its free space counts once; "
					 "give one folder per drive",
					 c->nvme[i], c->nvme[j]);
}

/* The mount's line in the log (stderr, and the logfile once detached). */
static void log_mounted(const struct fs *fs)
{
	const struct fs_config *c = fs->cfg;

	log_info("mounted %s: dram %zu MiB, block %zu KiB, %u nvme folder(s), meta %s",
		 c->mountpoint, c->dram >> 20, fs->bs >> 10, c->n_nvme, c->meta);
}

static double secs_since(const struct timespec *t0)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) / 1e9;
}

/*
 * failed: the start did not finish, so a store it created is removed again.
 * Returns -EIO when dirty blocks could not be written back.
 */
static int close_stores(struct fs *fs, bool failed)
{
	bool discard = failed && fs->new_store;
	int ret = 0;

	fs_gpu_stop(fs);
	fs_ctl_stop(fs);
	fs_pins_stop(fs);
	fs_prefetch_stop(fs);
	if (fs->tb) {
		if (discard)
			tb_forget_identity(fs->tb);
		if (fs->meta && !discard)
			fs_iflush_all(fs);
		if (tb_close(fs->tb)) {
			log_err("errors while writing back at unmount; see above: "
				"what was not written back is lost");
			ret = -EIO;
			if (!failed)
				note_state(fs, "failed");
		}
		if (fs->meta)
			meta_on_commit(fs->meta, NULL, NULL);
		fs->tb = NULL;
	}
	if (discard)
		meta_discard(fs->meta);
	else
		meta_close(fs->meta);
	fs->meta = NULL;
	return ret;
}

static void report(int fd, char status)
{
	if (fd >= 0) {
		if (write(fd, &status, 1) != 1) {
			/* the parent is gone; nothing to tell */
		}
		close(fd);
	}
}

/*
 * Open logfile= (resolved in fs_config_resolve, so no other user's link
 * leads to it) before the mount is reported, so that a failed open
 * refuses the start. A root daemon appends to it, and it may lie in a
 * folder others can write, such as /tmp: a link in its place is not
 * followed (O_NOFOLLOW), a FIFO does not block the start (O_NONBLOCK,
 * cleared once checked), and what was opened must be a regular file of
 * the daemon's user, with one link, that nobody else can write (else
 * another user's file, or a link to one of root's, would receive root's
 * log, and others could forge its lines). A descriptor, or -errno.
 */
static int open_logfile(const char *path, char *err, size_t errlen)
{
	int fd =
	    open(path, O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
	struct stat st;
	int ret;

	if (fd < 0) {
		ret = -errno;
		if (lstat(path, &st) == 0 && !S_ISREG(st.st_mode))
			snprintf(err, errlen,
				 "logfile %s is not a regular file (it is %s): remove it, or log "
				 "elsewhere",
				 path, storedir_file_type(st.st_mode));
		else
			snprintf(err, errlen, "logfile %s: %s", path, strerror(-ret));
		return ret;
	}
	return fs_check_opened(fd, "logfile", path, FS_OPENED_ONE_LINK, &st, err, errlen);
}

/* Detach from the terminal once the mount is live; logfd (or -1) becomes stderr. */
static void detach(int logfd)
{
	int null = open("/dev/null", O_RDWR);

	if (setsid() < 0)
		log_warn("setsid: %s", strerror(errno));
	if (chdir("/") < 0)
		log_warn("chdir /: %s", strerror(errno));
	if (null >= 0) {
		dup2(null, STDIN_FILENO);
		dup2(null, STDOUT_FILENO);
		dup2(logfd >= 0 ? logfd : null, STDERR_FILENO);
		if (null > STDERR_FILENO)
			close(null);
	}
}

/*
 * Once the stores are open the daemon has its own copies of the S3
 * credentials: wipe them from the environment block, which stays readable
 * in /proc/PID/environ, and keep the process from dumping core or being
 * traced by its user while it holds them.
 */
static void hide_secrets(const struct fs_config *c)
{
	static const char *const vars[] = {"AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"};

	for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
		char *v = getenv(vars[i]);

		if (v)
			explicit_bzero(v, strlen(v));
	}
	if (c->s3_secret && prctl(PR_SET_DUMPABLE, 0) != 0)
		log_warn("cannot turn off core dumps: %s", strerror(errno));
}

static int run(struct fs *fs, struct fuse_session *se, struct fuse_cmdline_opts *fo, int report_fd,
	       int logfd)
{
	struct fs_config *c = fs->cfg;
	struct fs_loop *loop = NULL;
	struct timespec t_stop;
	uint64_t dirty;
	char err[1024] = "";
	int ret;

	ret = open_stores(fs, fo->singlethread ? 1 : c->threads, err, sizeof(err));
	if (ret)
		goto fail;
	hide_secrets(c);
	if (c->no_default_permissions && c->allow_other)
		log_warn("allow_other with no_default_permissions: tensorfs checks no "
			 "permissions itself, so every local user can read and write every file");
	if (fs_prefetch_start(fs) < 0 || fs_ctl_start(fs) < 0 || fs_pins_start(fs) < 0) {
		ret = -EAGAIN;
		snprintf(err, sizeof(err), "cannot start the prefetch, rates or pins thread: %s%s",
			 strerror(-ret), task_limit_hint(ret));
		goto fail;
	}
	ret = fs_gpu_start(fs, se, err, sizeof(err));
	if (ret)
		goto fail;
	if (fuse_set_signal_handlers(se) != 0) {
		snprintf(err, sizeof(err), "cannot install signal handlers");
		ret = -EIO;
		goto fail;
	}
	ret = fs_loop_start(fs, se, fo->singlethread ? 1 : c->threads, &loop);
	if (ret) {
		snprintf(err, sizeof(err), "cannot start a thread to serve /dev/fuse: %s%s",
			 strerror(-ret), task_limit_hint(ret));
		fuse_remove_signal_handlers(se);
		goto fail;
	}
	if (fuse_session_mount(se, c->mountpoint) != 0) {
		snprintf(err, sizeof(err), "cannot mount on %s (see the message above)",
			 c->mountpoint);
		ret = -EIO;
		fs_loop_cancel(loop);
		fuse_remove_signal_handlers(se);
		goto fail;
	}
	note_state(fs, "mounted");
	warn_shared_folders(c);
	log_mounted(fs);
	report(report_fd, 0);
	if (!fo->foreground) {
		detach(logfd);
		if (logfd >= 0)
			log_mounted(fs);
	}

	ret = fs_loop_run(loop);
	fuse_session_unmount(se);
	fuse_remove_signal_handlers(se);
	clock_gettime(CLOCK_MONOTONIC, &t_stop);
	begin_stop(fs, &dirty);
	if (close_stores(fs, false) < 0 && ret == 0)
		ret = -EIO; /* exit 1: the unmount lost data */
	if (ret)
		log_info("stopped: with errors (see above)");
	else
		log_info("stopped: all written back and synced (%.1f MiB dirty at the unmount, "
			 "%.1f s)",
			 (double)dirty / (1 << 20), secs_since(&t_stop));
	return ret < 0 ? 1 : 0;
fail:
	fprintf(stderr, "tensorfs: %s\n", err[0] ? err : strerror(-ret));
	close_stores(fs, true);
	report(report_fd, 1);
	return 1;
}

/* Fork; the parent waits for the child's word on the mount and exits with it. */
static int daemonize(int *report_fd)
{
	int p[2];
	pid_t pid;
	char status = 1;

	if (pipe(p) < 0)
		return -errno;
	pid = fork();
	if (pid < 0)
		return -errno;
	if (pid > 0) {
		close(p[1]);
		if (read(p[0], &status, 1) != 1)
			status = 1;
		_exit(status ? 1 : 0);
	}
	close(p[0]);
	*report_fd = p[1];
	return 0;
}

int main(int argc, char *argv[])
{
	struct fuse_args args = FUSE_ARGS_INIT(argc, argv), left = FUSE_ARGS_INIT(0, NULL);
	struct fs_config cfg = {0};
	struct fuse_cmdline_opts fo = {0};
	struct fuse_session *se = NULL;
	struct fs fs = {0};
	char err[1024] = "";
	int report_fd = -1, logfd = -1, ret = 1;

	signal(SIGPIPE, SIG_IGN);
	{
		/* Only the threads that serve requests take FS_SIGWAKE (loop.c). */
		sigset_t wake;

		sigemptyset(&wake);
		sigaddset(&wake, FS_SIGWAKE);
		pthread_sigmask(SIG_BLOCK, &wake, NULL);
	}
	/*
	 * Block-size buffers (bounces, copies, s3 bodies) are allocated and
	 * freed on many threads. glibc raises its mmap threshold each time such
	 * a buffer is freed, after which they come from per-thread arenas that
	 * keep what was freed: the daemon's memory then creeps up by tens of
	 * MiB under load. A fixed threshold keeps them mmapped and returned.
	 */
	mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD);
	if (fs_cmdline_parse(&args, &cfg) == -1)
		goto out;
	if (cfg.show_help) {
		fs_cmdline_usage(argv[0]);
		printf("FUSE options:\n");
		fuse_cmdline_help();
		fuse_lowlevel_help();
		ret = 0;
		goto out;
	}
	if (cfg.show_version) {
		printf("tensorfs %s (libfuse %s)\n", TFS_VERSION, fuse_pkgversion());
		ret = 0;
		goto out;
	}
	if (fuse_parse_cmdline(&args, &fo) != 0)
		goto out;
	if (check_mountpoint(&cfg, err, sizeof(err)) < 0)
		goto fail;
	if (cfg.config_file && fs_config_load_file(&cfg, cfg.config_file, err, sizeof(err)) < 0)
		goto fail;
	if (fs_config_resolve(&cfg, err, sizeof(err)) < 0 || precheck(&cfg, err, sizeof(err)) < 0)
		goto fail;
	/* logfile= is the log once detached; in the foreground it is stderr. */
	if (!fo.foreground && cfg.logfile &&
	    (logfd = open_logfile(cfg.logfile, err, sizeof(err))) < 0)
		goto fail;
	log_set_level((enum log_level)cfg.log_level);
	if (cfg.use_syslog)
		log_use_syslog();

	if (fs_cmdline_fsname(&args, cfg.source ? cfg.source : "tensorfs") < 0 ||
	    (!cfg.no_default_permissions && fuse_opt_add_arg(&args, "-odefault_permissions")))
		goto out;

	fs.cfg = &cfg;
	fs.attr_timeout = ATTR_TIMEOUT;
	fs.entry_timeout = ENTRY_TIMEOUT;
	pthread_mutex_init(&fs.rate_lock, NULL);
	pthread_mutex_init(&fs.ctl_lock, NULL);
	pthread_mutex_init(&fs.pin_lock, NULL);
	pthread_cond_init(&fs.pin_cv, NULL);
	fs_scrub_init(&fs);
	if (fs_itab_init(&fs) < 0 || fs_learn_init(&fs.learn) < 0)
		goto out;
	/* libfuse frees args when it refuses them: the hints read a copy */
	for (int i = 0; i < args.argc; i++)
		if (fuse_opt_add_arg(&left, args.argv[i]) != 0)
			goto out;
	se = fuse_session_new(&args, &fs_ops, sizeof(fs_ops), &fs);
	if (!se) {
		fs_cmdline_hints(&left);
		fprintf(stderr, "tensorfs: bad FUSE options (see the message above)\n");
		goto out;
	}
	fs.se = se;
	if (!fo.foreground && daemonize(&report_fd) < 0) {
		snprintf(err, sizeof(err), "cannot fork: %s", strerror(errno));
		goto fail;
	}
	ret = run(&fs, se, &fo, report_fd, logfd);
	goto out;
fail:
	fprintf(stderr, "tensorfs: %s\n", err);
	ret = 1;
out:
	if (logfd >= 0)
		close(logfd);
	if (se)
		fuse_session_destroy(se);
	fs_itab_fini(&fs);
	fs_scrub_fini(&fs);
	if (fs.learn.files)
		fs_learn_fini(&fs.learn);
	free(fo.mountpoint);
	fuse_opt_free_args(&args);
	fuse_opt_free_args(&left);
	fs_config_free(&cfg);
	return ret;
}

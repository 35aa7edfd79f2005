/*
 * fs.h - the filesystem's shared state, for the files of fs/ only.
 *
 * struct fs holds the metadata store, the block store and the in-memory
 * inode table. An in-memory inode exists while the kernel holds lookups on
 * it or an operation is using it; its attributes are authoritative while it
 * exists and are written to the store when they change.
 */
#ifndef TENSORFS_FS_H
#define TENSORFS_FS_H

#define FUSE_USE_VERSION 314
#include <fuse_lowlevel.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "learn.h"
#include "meta.h"
#include "opts.h"
#include "tb.h"

/*
 * A change of size or block map (truncate, O_TRUNC, fallocate,
 * copy_file_range) fails with ETXTBSY rather than wait for a GPU client's
 * write pins on the file once they have held it FS_PIN_WAIT_MS, or it has
 * waited that long for them; it looks every FS_PIN_WAIT_STEP_MS whether
 * the kernel has interrupted it (ops_data.c fs_io_lock_excl). A pin lives as long
 * as its client wants; a FUSE worker must not wait on it for long.
 */
#define FS_PIN_WAIT_MS 2000
#define FS_PIN_WAIT_STEP_MS 20

/* The hidden control folder and its files live above every real inode. */
#define FS_CTL_DIR_INO (1ULL << 62)
#define FS_CTL_STATS_INO (FS_CTL_DIR_INO + 1)
#define FS_CTL_CONFIG_INO (FS_CTL_DIR_INO + 2)
#define FS_CTL_CTL_INO (FS_CTL_DIR_INO + 3)
#define FS_CTL_METRICS_INO (FS_CTL_DIR_INO + 4)
#define FS_CTL_GPU_INO (FS_CTL_DIR_INO + 5) /* gpu.c's socket, for GPU clients */
#define FS_CTL_PINS_INO (FS_CTL_DIR_INO + 6) /* pins.c: the pinned files, for the owner */
#define FS_CTL_SCRUB_INO (FS_CTL_DIR_INO + 7) /* scrub.c: the last scrub's report */
#define FS_CTL_NAME ".tensorfs"

struct fs_inode {
	uint64_t ino;
	uint64_t nlookup; /* kernel lookups; itab lock */
	unsigned refs;	  /* operations and opens; itab lock */
	pthread_rwlock_t io; /* shared: reads and writes; exclusive: size and map changes */
	pthread_mutex_t lock; /* guards rec and attr_dirty */
	struct meta_inode rec;
	bool attr_dirty;
	uint8_t caps; /* FS_CAPS_*: whether it has file capabilities, as last looked up; lock */
	uint64_t ra_next; /* where a sequential reader reads next; lock */
	uint64_t unread;  /* bytes written since the file was last read; lock */
	/* The deep window of a reader of remote blocks (fs_readahead_deep); lock. */
	uint64_t ra_seen;	   /* block whose home was looked up last, plus one */
	uint64_t ra_end;	   /* first block not yet issued */
	uint64_t ra_end_run;	   /* where the run (s3 object) at ra_end ends; 0: unknown */
	uint32_t ra_remote;	   /* bit per block entered, newest lowest: its home is remote */
	unsigned ra_depth, ra_run; /* the remote home's window and run, in blocks */
	unsigned gpu_wpins;   /* GPU write pins holding io shared (gpu_pin.c); lock */
	uint64_t gpu_wpin_ms; /* since when some have (fs_monotonic_ms); lock */
	uint64_t parent; /* atomic: the folder it was last looked up or made in; 0: none */
	struct fs_inode *next;
};

/* fs_inode.caps: a write drops the file's capabilities (ops_data.c, drop_privs). */
enum { FS_CAPS_UNKNOWN, FS_CAPS_NONE, FS_CAPS_SET };
#define FS_XATTR_CAPS "security.capability"

/* prefetch.c: a file being loaded ahead of use, a few blocks per turn. */
struct fs_pf_file {
	uint64_t ino;
	uint64_t next; /* block index its next turn starts from */
	uint64_t left; /* blocks it may still issue: at most what the DRAM tier holds */
	uint32_t uid;  /* who hinted it: turns go round the users */
};

#define FS_PF_HINTS 1024	 /* hints queued at once; more get EBUSY */
#define FS_PF_HINTS_PER_USER 256 /* so that one user cannot fill the queue */

struct fs_counters {
	uint64_t lookups, getattrs, setattrs, opens, creates, reads, writes, read_bytes,
	    write_bytes, fsyncs, unlinks, renames, copies, copy_shared_bytes, fallocates, errors,
	    writes_parked;
};

struct fs {
	struct fs_config *cfg;
	struct fuse_session *se; /* for notices to the kernel */
	struct fs_meta *meta;
	struct tb_store *tb;
	size_t bs;
	double attr_timeout, entry_timeout;
	pthread_mutex_t itab_lock;
	struct fs_inode **itab;
	size_t itab_mask;
	struct fs_counters cnt; /* atomic adds */
	bool new_store; /* created by this start: removed again if the start fails */
	struct fs_learner learn;
	/* prefetch.c */
	pthread_t pf_thread;
	pthread_mutex_t pf_lock; /* guards the hints, pf_last_uid, pf_stop and pf_kicks */
	pthread_cond_t pf_cv;
	uint64_t pf_kicks; /* wake-ups asked for: one that comes mid-turn is not lost */
	struct fs_pf_file pf_hints[FS_PF_HINTS]; /* in the order they came */
	unsigned pf_nhints;
	uint32_t pf_last_uid; /* the user whose hint had the last turn */
	bool pf_stop, pf_running;
	bool pf_room_wait; /* atomic: the cycle's pass waits for readers to catch up */
	uint64_t rd_blocks; /* atomic: the blocks of the reads in flight */
	uint64_t rd_told;   /* atomic: the most of them told to the cache since its last pass */
	struct fs_gpu *gpu; /* gpu.c: the shared-arena server, NULL unless cuda=on */
	struct fs_defer *defer; /* defer.c: writes waiting for room, while fs_loop runs */
	/* pins.c: the thread that pins the marked files again at mount */
	pthread_t pin_thread;
	pthread_mutex_t pin_lock; /* guards pin_stop; held across each change of a pin */
	pthread_cond_t pin_cv;
	bool pin_stop, pin_running;
	/* ctl.c: per-tier byte counts of the last rate sample, taken each second */
	pthread_t rate_thread;
	pthread_cond_t rate_cv;
	bool rate_stop, rate_running;
	pthread_mutex_t rate_lock;
	uint64_t rate_ms, rate_rb[TB_MAX_DEVS + 1], rate_wb[TB_MAX_DEVS + 1];
	double rate_rbps[TB_MAX_DEVS + 1], rate_wbps[TB_MAX_DEVS + 1];
	/*
	 * ctl.c: the control files' open snapshots, freed at release, or at the
	 * unmount when the kernel's release did not reach the daemon before it
	 */
	pthread_mutex_t ctl_lock;
	struct ctl_buf *ctl_open;
	/* scrub.c: the last scrub's report, and whether one runs; scrub_lock */
	pthread_mutex_t scrub_lock;
	struct json_t *scrub_report;
	bool scrub_running;
};

#define FS_COUNT(fs, field, n) __atomic_fetch_add(&(fs)->cnt.field, (n), __ATOMIC_RELAXED)

/* The largest write the kernel sends (max_write): one request's bytes. */
#define FS_MAX_WRITE (1U << 20)

/* loop.c */
/*
 * Where the request being served on this thread has its write bytes, when
 * they are not behind its header (expect, what libfuse hands fs_write):
 * size bytes at data, in the arena's spare slot *slot, which
 * tb_swap_slot may trade for the block's own, or a parked write (defer.c)
 * for another spare.
 */
struct fs_landing {
	const char *expect;
	char *data;
	size_t size;
	uint32_t *slot;
};
extern __thread struct fs_landing *fs_landing;
/* The write_flags of the FUSE_WRITE being served on this thread, else 0. */
extern __thread uint32_t fs_write_flags;
/*
 * Wakes a serving thread out of its read at exit. Blocked in every other
 * thread (main blocks it before any starts), so that one sent to the
 * process ends a read at most, and never another thread's system call.
 */
#define FS_SIGWAKE SIGUSR2
struct fs_loop;
/*
 * Start nthreads threads to serve se (at least one, else -errno; fewer
 * than asked is logged) and the pool of writes that wait for room, before
 * the mount: a daemon that cannot make its threads fails there, not after
 * it has said it mounted. They wait for fs_loop_run, or fs_loop_cancel.
 */
int fs_loop_start(struct fs *fs, struct fuse_session *se, unsigned nthreads, struct fs_loop **l);
/* After the mount: serve the session until it exits, then end the threads; 0 or -errno. */
int fs_loop_run(struct fs_loop *l);
/* The mount failed: end the threads of fs_loop_start. */
void fs_loop_cancel(struct fs_loop *l);

/* wjob.c: one write's progress, while it runs and while it is parked (defer.c) */
struct fs_wjob {
	fuse_req_t req;	     /* NULL: not a FUSE write of its own */
	struct fs_inode *in; /* a reference of its own, while parked */
	const char *data;    /* the bytes, NULL: zeros */
	size_t len, done;    /* bytes at off, and of them written */
	uint64_t off;
	size_t reply;	/* the count to answer with: the request's whole size */
	uint64_t resv;	/* blocks of space still reserved for it (tb_reserve) */
	uint32_t *slot; /* data is this spare slot of the arena (tb_swap_slot), or NULL */
	struct tb_writer who;
};
/* Write the rest of a parked job, waiting for room, and answer it. */
void fs_write_resume(struct fs *fs, struct fs_wjob *j);
/* Answer a write job with ret or its count, giving back what it holds. */
void fs_write_end(struct fs *fs, struct fs_wjob *j, int ret);
/* Do an fsync of in, unless err says why not, answer it and drop the reference on in. */
void fs_fsync_run(struct fs *fs, fuse_req_t req, struct fs_inode *in, int err);

/* defer.c */
int fs_defer_start(struct fs *fs, unsigned nthreads);
/* Answer every parked write, then end the threads. */
void fs_defer_stop(struct fs *fs);
/*
 * Park write job j, which would wait for room: 0 when parked (the pool
 * writes and answers it; j's reference and reservation went with it, and
 * the spare slot *j->slot, if the bytes are there, for another spare),
 * else -errno, and j is still the caller's.
 */
int fs_defer_write(struct fs *fs, struct fs_wjob *j);
/* Answer an fsync of in from the pool: 0 when queued (in's reference went with it), else -errno. */
int fs_defer_fsync(struct fs *fs, fuse_req_t req, struct fs_inode *in);

/* inode.c */
/* A growable list of inode numbers; free v when done. */
struct fs_ino_list {
	uint64_t *v;
	size_t n, cap;
};
int fs_ino_push(struct fs_ino_list *l, uint64_t ino);
int fs_itab_init(struct fs *fs);
void fs_itab_fini(struct fs *fs);
/* Take a reference on ino, loading it from the store; -ENOENT if it has gone. */
int fs_iget(struct fs *fs, uint64_t ino, struct fs_inode **out);
void fs_iput(struct fs *fs, struct fs_inode *in);
void fs_ilookup_add(struct fs *fs, struct fs_inode *in, uint64_t n);
void fs_iforget(struct fs *fs, uint64_t ino, uint64_t n);
/* Write dirty attributes (size, times) of one inode, or of all. */
int fs_iflush_attr(struct fs *fs, struct fs_inode *in);
int fs_iflush_all(struct fs *fs);
/*
 * The blocks a file holds, for st_blocks: those its block map holds (a
 * block shared with other files counts in each) and its dirty blocks not
 * yet stored. Holes count nothing; a partly written block counts whole.
 * One lookup, whatever the file's size. 0 for anything but a file.
 */
uint64_t fs_inode_blocks(struct fs *fs, uint64_t ino, mode_t mode);
/* nblocks: fs_inode_blocks of the inode. */
void fs_inode_stat(const struct fs *fs, uint64_t ino, const struct meta_inode *rec,
		   uint64_t nblocks, struct stat *st);
void fs_now(int64_t *sec, uint32_t *nsec);
/* Milliseconds of CLOCK_MONOTONIC, for waits and ages. */
uint64_t fs_monotonic_ms(void);
/*
 * Bytes up to end were just written, by a FUSE write or a GPU client's
 * commit: the size grows to end, mtime and ctime become now. end 0 sets
 * only the times, for a write that failed part way (bytes changed, not the
 * size). The caller holds in->io, not in->lock.
 */
void fs_inode_written(struct fs_inode *in, uint64_t end, uint64_t len);
/* Make committed changes durable; returns -errno. */
int fs_release_locs(struct fs *fs, struct locvec *freed);

/*
 * req.c: the block store's waits on this thread end with EINTR once the
 * kernel interrupts req (tb_interruptible), until fs_unwatch: a request
 * whose process was killed while a full device held it must not stay.
 */
void fs_watch(fuse_req_t req);
void fs_unwatch(void);

/* ctl_names.c: the names of the /.tensorfs control files */
bool fs_ctl_ino(uint64_t ino);
void fs_ctl_lookup(struct fs *fs, fuse_req_t req, uint64_t parent, const char *name);
void fs_ctl_getattr(struct fs *fs, fuse_req_t req, uint64_t ino);
void fs_ctl_readdir(struct fs *fs, fuse_req_t req, uint64_t ino, size_t size, off_t off,
		    bool plus);
void fs_ctl_root_stat(struct stat *st, uint64_t ino);

/* ctl.c: what the /.tensorfs control files hold */
void fs_ctl_open(struct fs *fs, fuse_req_t req, uint64_t ino, struct fuse_file_info *fi);
void fs_ctl_read(fuse_req_t req, size_t size, off_t off, struct fuse_file_info *fi);
void fs_ctl_release(struct fs *fs, fuse_req_t req, struct fuse_file_info *fi);
/* The thread that samples each tier's byte counts once a second, for rates. */
int fs_ctl_start(struct fs *fs);
void fs_ctl_stop(struct fs *fs);

/* ctl_run.c: a write to /.tensorfs/ctl, one command (ctlcmd.h), run and answered */
void fs_ctl_write(struct fs *fs, fuse_req_t req, uint64_t ino, const char *buf, size_t size);
/*
 * user.tensorfs.tiers: JSON of the bytes per tier of a file, or of the
 * files under a folder that req's caller may search. Costs what the files
 * store, not their sizes.
 */
int fs_ctl_tiers_xattr(struct fs *fs, fuse_req_t req, uint64_t ino, char **out, size_t *len);

/*
 * req.c: a read or write of len bytes at off reached ino (now size bytes long):
 * tell the learner. True when it recorded a step of a known cycle: the
 * caller then wakes the prefetcher (fs_prefetch_kick).
 */
bool fs_touch(struct fs *fs, struct fs_inode *in, uint64_t size, uint64_t off, uint64_t len,
	      bool write);

/* prefetch.c: the next files of the learned cycle, and hints */
int fs_prefetch_start(struct fs *fs);
void fs_prefetch_stop(struct fs *fs);
void fs_prefetch_kick(struct fs *fs);
/*
 * Readahead for a sequential reader now in block first - 1, of a file of
 * end_blk blocks, when its blocks live on a remote tier; false when they
 * are local, and readahead= applies.
 */
bool fs_readahead_deep(struct fs *fs, struct fs_inode *in, uint64_t first, uint64_t end_blk);
/* Load ino ahead of use, for user uid; -EBUSY when the queue, or uid's share of it, is full. */
int fs_prefetch_hint(struct fs *fs, uint64_t ino, uint32_t uid);

struct json_t;

/*
 * pins.c: files pinned in DRAM, marked in their inode records so that each
 * mount pins them again. The caller of fs_pin and fs_pin_mark holds
 * pin_lock.
 */
/* Load ino's stored blocks and keep them resident; -ENOSPC when they do not fit. */
int fs_pin(struct fs *fs, uint64_t ino);
/* Mark ino pinned or not in its inode record; durable at the next sync. */
int fs_pin_mark(struct fs *fs, uint64_t ino, bool pinned);
bool fs_pin_marked(struct fs *fs, uint64_t ino);
/* The thread that pins the marked files again and loads them, in the background. */
int fs_pins_start(struct fs *fs);
void fs_pins_stop(struct fs *fs);
/* The contents of /.tensorfs/pins: each pinned file, its path and residency. */
struct json_t *fs_pins_json(struct fs *fs);

/* paths.c: the names of files given by inode number */
struct fs_path {
	uint64_t ino;
	char *path; /* NULL until found; the caller frees it */
};
/*
 * Find a path of each of v[0..n), sorted by inode and none twice, by
 * walking the folders from the root in txn; one with no name keeps NULL.
 */
int fs_paths_find(struct fs *fs, MDB_txn *txn, struct fs_path *v, size_t n);

/*
 * scrub.c: read every stored block and check it against its hash, in the
 * request req (which may be interrupted: -EINTR); -EBUSY while another
 * scrub runs. Damaged blocks are logged with the files that map them and
 * listed in the report, fs_scrub_json (/.tensorfs/scrub).
 */
void fs_scrub_init(struct fs *fs);
void fs_scrub_fini(struct fs *fs);
int fs_scrub(struct fs *fs, fuse_req_t req);
struct json_t *fs_scrub_json(struct fs *fs);

/* gpu.c: the shared DRAM arena for GPU clients (cuda=on) */
/* With cuda=on: register the arena with CUDA if a GPU is there, serve the socket. */
int fs_gpu_start(struct fs *fs, struct fuse_session *se, char *err, size_t errlen);
/* Hang up on every client, releasing what they pinned; before the store closes. */
void fs_gpu_stop(struct fs *fs);
/* The contents of /.tensorfs/gpu. */
struct json_t *fs_gpu_json(struct fs *fs);

/* ops.c */
extern const struct fuse_lowlevel_ops fs_ops;

#endif

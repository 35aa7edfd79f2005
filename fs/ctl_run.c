/*
 * ctl_run.c - what the control side does with the user's files: the
 * commands written to /.tensorfs/ctl, one per write (fs_ctl_write), and
 * the bytes per tier that user.tensorfs.tiers reports (fs_ctl_tiers_xattr).
 * Both name a file, or a folder and the files under it that the caller may
 * search (ctl_files_under). A command is parsed by ctlcmd.c, its files
 * resolved (a path walked from the root, or ino:N) and run: pin, unpin,
 * evict, flush, prefetch, scrub; the block store's waits end when the
 * kernel interrupts the request (fs_watch).
 *
 * It may call ctlcmd.c, ctl_names.c, req.c, pins.c, scrub.c, prefetch.c,
 * the inode table, the store and the block store; nothing of ops, ctl.c
 * or gpu.
 */
#include "ctlcmd.h"
#include "ctl_int.h"
#include "log.h"
#include "worker.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

/* ---- ctl: commands ---- */

/* The inode a command names: a path walked from the root, or ino:N. */
static int ctl_resolve(struct fs *fs, const struct fs_ctlcmd *cmd, uint64_t *ino)
{
	char path[FS_CTLCMD_MAX + 1], *save = NULL;
	uint64_t cur = META_ROOT_INO;
	MDB_txn *txn;
	int ret;

	if (cmd->ino) {
		struct meta_inode rec;

		if (fs_ctl_ino(cmd->ino))
			return -ENOENT;
		ret = meta_begin(fs->meta, false, &txn);
		if (ret)
			return ret;
		ret = meta_inode_get(fs->meta, txn, cmd->ino, &rec);
		meta_abort(txn);
		*ino = cmd->ino;
		return ret;
	}
	snprintf(path, sizeof(path), "%s", cmd->path);
	ret = meta_begin(fs->meta, false, &txn);
	if (ret)
		return ret;
	for (char *name = strtok_r(path, "/", &save); name && !ret;
	     name = strtok_r(NULL, "/", &save))
		ret = meta_dirent_lookup(fs->meta, txn, cur, name, &cur);
	meta_abort(txn);
	*ino = cur;
	return ret;
}

static int collect_child(void *arg, const char *name, size_t namelen, uint64_t ino,
			 uint64_t cookie)
{
	(void)name;
	(void)namelen;
	(void)cookie;
	return fs_ino_push(arg, ino);
}

/*
 * Who asks for a walk under a folder. The ctl commands come from the
 * mount's owner or root and walk everything (no caller); a getxattr may
 * come from any user, who must not learn what lies in folders it cannot
 * enter, so each folder is checked for its search permission.
 */
struct ctl_caller {
	fuse_req_t req;
	uid_t uid;
	gid_t gid;
	gid_t *groups; /* supplementary groups, read at the first need */
	int ngroups;   /* -1 until read */
};

static void caller_init(struct ctl_caller *c, fuse_req_t req)
{
	const struct fuse_ctx *ctx = fuse_req_ctx(req);

	c->req = req;
	c->uid = ctx->uid;
	c->gid = ctx->gid;
	c->groups = NULL;
	c->ngroups = -1;
}

/* The caller's supplementary groups; none when they cannot be read (grants less, never more). */
static void caller_read_groups(struct ctl_caller *c)
{
	int n = fuse_req_getgroups(c->req, 0, NULL);

	c->ngroups = 0;
	if (n <= 0)
		return;
	c->groups = calloc((size_t)n, sizeof(*c->groups));
	if (!c->groups)
		return;
	c->ngroups = fuse_req_getgroups(c->req, n, c->groups);
	if (c->ngroups > n)
		c->ngroups = n; /* it changed meanwhile: use what fitted */
	if (c->ngroups < 0)
		c->ngroups = 0;
}

static bool caller_in_group(struct ctl_caller *c, gid_t gid)
{
	if (c->gid == gid)
		return true;
	if (c->ngroups < 0)
		caller_read_groups(c);
	for (int i = 0; i < c->ngroups; i++)
		if (c->groups[i] == gid)
			return true;
	return false;
}

/* Whether the caller may search (enter) a folder: the kernel's rule for x, root passes. */
static bool may_search(struct ctl_caller *c, const struct meta_inode *rec)
{
	if (!c || c->uid == 0)
		return true;
	if (rec->uid == c->uid)
		return rec->mode & S_IXUSR;
	if (caller_in_group(c, rec->gid))
		return rec->mode & S_IXGRP;
	return rec->mode & S_IXOTH;
}

/*
 * The regular files at or under ino, breadth first, in one read
 * transaction; the list of folders to visit is the same array, so a deep
 * tree needs no recursion. With a caller, a folder it may not search is
 * left out (-EACCES when that is ino itself).
 */
static int ctl_files_under(struct fs *fs, MDB_txn *txn, uint64_t ino, struct ctl_caller *who,
			   struct fs_ino_list *files)
{
	struct fs_ino_list todo = {0};
	int ret = fs_ino_push(&todo, ino);

	for (size_t i = 0; i < todo.n && !ret; i++) {
		struct meta_inode rec;

		ret = meta_inode_get(fs->meta, txn, todo.v[i], &rec);
		if (ret == -ENOENT && i > 0) {
			ret = 0; /* a name without its inode: fsck's business */
			continue;
		}
		if (ret)
			break;
		if (S_ISDIR(rec.mode) && may_search(who, &rec))
			ret = meta_readdir(fs->meta, txn, todo.v[i], 0, collect_child, &todo);
		else if (S_ISDIR(rec.mode) && i == 0)
			ret = -EACCES;
		else if (S_ISREG(rec.mode))
			ret = fs_ino_push(files, todo.v[i]);
	}
	free(todo.v);
	return ret;
}

/*
 * Pin every file of a command, then mark them all pinned, so that the pins
 * a mount restores are those of commands that succeeded. A file that does
 * not fit undoes the pins this command made; files pinned before stay.
 * Caller holds pin_lock.
 */
static int ctl_pin_files(struct fs *fs, const struct fs_ino_list *files)
{
	bool *was = calloc(files->n + 1, sizeof(*was));
	size_t i, done = 0;
	int ret = was ? 0 : -ENOMEM;

	for (i = 0; i < files->n && !ret; i++)
		was[i] = fs_pin_marked(fs, files->v[i]);
	for (; done < files->n && !ret; done++)
		ret = fs_pin(fs, files->v[done]);
	for (i = 0; i < files->n && !ret; i++)
		ret = fs_pin_mark(fs, files->v[i], true);
	if (ret)
		for (i = 0; was && i < done; i++)
			if (!was[i]) {
				tb_unpin_obj(fs->tb, files->v[i]);
				fs_pin_mark(fs, files->v[i], false);
			}
	free(was);
	return ret;
}

/* unpin and evict: the files are pinned no more, at this mount or the next. */
static int ctl_unpin_files(struct fs *fs, const struct fs_ino_list *files, bool evict)
{
	int ret = 0;

	for (size_t i = 0; i < files->n && !ret; i++) {
		if (evict)
			ret = tb_evict_obj(fs->tb, files->v[i]);
		else
			tb_unpin_obj(fs->tb, files->v[i]);
		if (!ret)
			ret = fs_pin_mark(fs, files->v[i], false);
	}
	return ret;
}

/* A command on the files at or under a path; pin changes are made durable. */
static int ctl_apply(struct fs *fs, enum fs_ctlverb verb, const struct fs_ino_list *files,
		     uint32_t uid)
{
	int ret = 0, r;

	if (verb == CTL_PREFETCH) {
		for (size_t i = 0; i < files->n && !ret; i++)
			ret = fs_prefetch_hint(fs, files->v[i], uid);
		return ret;
	}
	if (verb != CTL_PIN && verb != CTL_UNPIN && verb != CTL_EVICT)
		return -EINVAL;
	pthread_mutex_lock(&fs->pin_lock);
	if (verb == CTL_PIN)
		ret = ctl_pin_files(fs, files);
	else
		ret = ctl_unpin_files(fs, files, verb == CTL_EVICT);
	pthread_mutex_unlock(&fs->pin_lock);
	r = tb_durable(fs->tb); /* a pin, once answered, outlives a crash */
	return ret ? ret : r;
}

/* Run one command of request req, for user uid (the mount's owner or root). */
static int ctl_run(struct fs *fs, fuse_req_t req, const struct fs_ctlcmd *cmd, uint32_t uid)
{
	struct fs_ino_list files = {0};
	MDB_txn *txn;
	uint64_t ino;
	int ret;

	if (cmd->verb == CTL_FLUSH) {
		ret = fs_iflush_all(fs);
		int r = tb_sync(fs->tb);

		return ret ? ret : r;
	}
	if (cmd->verb == CTL_SCRUB)
		return fs_scrub(fs, req);
	ret = ctl_resolve(fs, cmd, &ino);
	if (ret == 0)
		ret = meta_begin(fs->meta, false, &txn);
	if (ret == 0) {
		ret = ctl_files_under(fs, txn, ino, NULL, &files);
		meta_abort(txn);
	}
	if (ret == 0)
		ret = ctl_apply(fs, cmd->verb, &files, uid);
	free(files.v);
	return ret;
}

void fs_ctl_write(struct fs *fs, fuse_req_t req, uint64_t ino, const char *buf, size_t size)
{
	static long bad_log_sec;
	struct fs_ctlcmd *cmd;
	const char *why = "";
	int ret;

	if (ino != FS_CTL_CTL_INO || !fs_ctl_may_steer(req)) {
		fuse_reply_err(req, EACCES);
		return;
	}
	cmd = malloc(sizeof(*cmd));
	if (!cmd) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	ret = fs_ctlcmd_parse(buf, size, cmd, &why);
	if (ret) {
		if (log_ratelimit(&bad_log_sec, 1))
			log_warn("ctl: rejected a command from uid %u: %s",
				 (unsigned)fuse_req_ctx(req)->uid, why);
	} else {
		fs_watch(req); /* flush and evict wait for write-back */
		ret = ctl_run(fs, req, cmd, fuse_req_ctx(req)->uid);
		fs_unwatch();
		if (cmd->ino)
			log_info("ctl: %s ino:%llu: %s", fs_ctlverb_name(cmd->verb),
				 (unsigned long long)cmd->ino, ret ? strerror(-ret) : "done");
		else
			log_info("ctl: %s%s%s: %s", fs_ctlverb_name(cmd->verb),
				 cmd->path[0] ? " " : "", cmd->path, ret ? strerror(-ret) : "done");
	}
	free(cmd);
	if (ret)
		fuse_reply_err(req, -ret);
	else
		fuse_reply_write(req, size);
}

/* ---- user.tensorfs.tiers ---- */

/*
 * Bytes per tier of the files a getxattr sums. A block counts once in each
 * tier that holds it: in DRAM if resident, on its device if stored (a
 * clean cached block is in both), never twice in one tier. "allocated"
 * counts whole blocks, each once, as st_blocks does, but found by walking
 * the block map rather than from the file's count.
 */
struct tally {
	struct fs *fs;
	MDB_txn *txn;
	unsigned ndev;
	uint64_t size; /* of the file being counted */
	uint64_t per_dev[TB_MAX_DEVS];
	uint64_t dram;
	uint64_t blocks; /* stored or dirty and not yet stored */
};

/* The bytes of block idx that lie inside the file: the last one may be short. */
static uint64_t in_file(const struct tally *t, uint64_t idx)
{
	uint64_t start = idx * t->fs->bs; /* offsets stay below 2^63: no overflow */

	if (start >= t->size)
		return 0;
	return t->size - start < t->fs->bs ? t->size - start : t->fs->bs;
}

static int tally_stored(void *arg, uint64_t idx, uint64_t id)
{
	struct tally *t = arg;
	struct meta_block blk;
	int ret = meta_block_get(t->fs->meta, t->txn, id, &blk);

	if (ret)
		return ret;
	t->blocks++;
	if (blk.loc != TB_LOC_NONE && tb_loc_dev(blk.loc) < t->ndev)
		t->per_dev[tb_loc_dev(blk.loc)] += in_file(t, idx);
	return 0;
}

static void tally_resident(void *arg, uint64_t idx)
{
	struct tally *t = arg;

	t->dram += in_file(t, idx);
}

/*
 * Add one regular file's bytes: stored blocks from the block map's cursor,
 * resident ones from the cache's list of the object. Both cost what the
 * file holds, not its size.
 */
static int tally_file(struct tally *t, uint64_t ino)
{
	struct meta_inode rec;
	int ret = meta_inode_get(t->fs->meta, t->txn, ino, &rec);

	if (ret)
		return ret;
	t->size = rec.size;
	ret = meta_bmap_walk(t->fs->meta, t->txn, ino, 0, (rec.size + t->fs->bs - 1) / t->fs->bs,
			     tally_stored, t);
	if (ret)
		return ret;
	tb_resident_each(t->fs->tb, ino, tally_resident, t);
	t->blocks += tb_unstored(t->fs->tb, ino);
	return 0;
}

static json_t *tally_json(const struct tally *t, const struct tb_stats *st)
{
	json_t *j = json_object();

	json_object_set_new(j, "dram", json_integer((json_int_t)t->dram));
	for (unsigned i = 0; i < st->n_devs; i++)
		json_object_set_new(j, st->dev[i].name, json_integer((json_int_t)t->per_dev[i]));
	json_object_set_new(j, "allocated", json_integer((json_int_t)(t->blocks * t->fs->bs)));
	return j;
}

int fs_ctl_tiers_xattr(struct fs *fs, fuse_req_t req, uint64_t ino, char **out, size_t *len)
{
	struct tb_stats *st = calloc(1, sizeof(*st));
	struct tally *t = calloc(1, sizeof(*t));
	struct fs_ino_list files = {0};
	struct ctl_caller who;
	struct meta_inode rec;
	json_t *j;
	int ret = st && t ? 0 : -ENOMEM;

	caller_init(&who, req);
	if (ret)
		goto out;
	tb_get_stats(fs->tb, st);
	t->fs = fs;
	t->ndev = st->n_devs;
	/* One read transaction for the whole walk: one snapshot, one reader slot. */
	ret = meta_begin(fs->meta, false, &t->txn);
	if (ret)
		goto out;
	ret = ctl_files_under(fs, t->txn, ino, &who, &files);
	for (size_t i = 0; i < files.n && ret == 0; i++)
		ret = tally_file(t, files.v[i]);
	if (ret == 0 && files.n == 0) {
		/* A symlink or device: no data of its own. An empty folder: zeros. */
		ret = meta_inode_get(fs->meta, t->txn, ino, &rec);
		if (ret == 0 && !S_ISDIR(rec.mode))
			ret = -ENODATA;
	}
	meta_abort(t->txn);
	if (ret)
		goto out;
	j = tally_json(t, st);
	*out = json_dumps(j, JSON_COMPACT);
	json_decref(j);
	ret = *out ? 0 : -ENOMEM;
	if (*out)
		*len = strlen(*out);
out:
	free(files.v);
	free(who.groups);
	free(t);
	free(st);
	return ret;
}

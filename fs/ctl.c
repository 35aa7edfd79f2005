/*
 * ctl.c - the hidden control folder /.tensorfs/.
 *
 * It is not listed in the root folder but is reachable by name. Each file
 * is generated whole at open into a buffer that the open file owns, so a
 * reader sees one consistent snapshot; the files are opened with direct_io
 * because their size is only known then.
 *
 *   stats   JSON: per tier, the cache, FUSE operations, the store
 *   config  JSON: the effective configuration (never a secret)
 */
#include "fs.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>

struct ctl_buf {
	char *data;
	size_t len;
};

static const struct {
	const char *name;
	uint64_t ino;
} ctl_files[] = {{"stats", FS_CTL_STATS_INO}, {"config", FS_CTL_CONFIG_INO}};

#define N_CTL_FILES (sizeof(ctl_files) / sizeof(ctl_files[0]))

bool fs_ctl_ino(uint64_t ino)
{
	return ino >= FS_CTL_DIR_INO && ino <= FS_CTL_DIR_INO + N_CTL_FILES;
}

void fs_ctl_root_stat(struct stat *st, uint64_t ino)
{
	memset(st, 0, sizeof(*st));
	st->st_ino = ino;
	st->st_uid = getuid();
	st->st_gid = getgid();
	if (ino == FS_CTL_DIR_INO) {
		st->st_mode = S_IFDIR | 0555;
		st->st_nlink = 2;
	} else {
		st->st_mode = S_IFREG | 0444;
		st->st_nlink = 1;
	}
}

static void reply_ctl_entry(struct fs *fs, fuse_req_t req, uint64_t ino)
{
	struct fuse_entry_param e = {0};

	e.ino = ino;
	e.attr_timeout = fs->attr_timeout;
	e.entry_timeout = fs->entry_timeout;
	fs_ctl_root_stat(&e.attr, ino);
	fuse_reply_entry(req, &e);
}

void fs_ctl_lookup(struct fs *fs, fuse_req_t req, uint64_t parent, const char *name)
{
	if (parent == FUSE_ROOT_ID) {
		reply_ctl_entry(fs, req, FS_CTL_DIR_INO);
		return;
	}
	if (parent == FS_CTL_DIR_INO)
		for (size_t i = 0; i < N_CTL_FILES; i++)
			if (strcmp(name, ctl_files[i].name) == 0) {
				reply_ctl_entry(fs, req, ctl_files[i].ino);
				return;
			}
	fuse_reply_err(req, ENOENT);
}

void fs_ctl_getattr(struct fs *fs, fuse_req_t req, uint64_t ino)
{
	struct stat st;

	fs_ctl_root_stat(&st, ino);
	fuse_reply_attr(req, &st, fs->attr_timeout);
}

static json_t *tier_json(uint64_t cap, uint64_t used, uint64_t rb, uint64_t wb, uint64_t ro,
			 uint64_t wo, uint64_t errors)
{
	return json_pack("{sIsIsIsIsIsIsI}", "capacity", (json_int_t)cap, "used", (json_int_t)used,
			 "read_bytes", (json_int_t)rb, "write_bytes", (json_int_t)wb, "read_ops",
			 (json_int_t)ro, "write_ops", (json_int_t)wo, "errors", (json_int_t)errors);
}

static json_t *stats_json(struct fs *fs)
{
	struct tb_stats *st = calloc(1, sizeof(*st));
	struct fs_counters c;
	uint64_t inodes, blocks, mapped;
	json_t *root, *tiers, *t;

	if (!st)
		return NULL;
	tb_get_stats(fs->tb, st);
	meta_counts(fs->meta, &inodes, &blocks, &mapped);
	memcpy(&c, &fs->cnt, sizeof(c));

	root = json_object();
	tiers = json_object();
	json_object_set_new(root, "version", json_string(TFS_VERSION));
	json_object_set_new(root, "block_size", json_integer((json_int_t)st->block_size));
	t = tier_json(st->dram_capacity, st->dram_used, st->dram_read_bytes, st->dram_write_bytes,
		      st->dram_read_ops, st->dram_write_ops, 0);
	json_object_set_new(t, "huge_pages", json_boolean(st->huge_pages));
	json_object_set_new(t, "locked", json_boolean(st->locked));
	json_object_set_new(tiers, "dram", t);
	for (unsigned i = 0; i < st->n_devs; i++) {
		struct tb_dev_stats *d = &st->dev[i];

		t = tier_json(d->capacity, d->used, d->read_bytes, d->write_bytes, d->read_ops,
			      d->write_ops, d->errors);
		json_object_set_new(t, "kind", json_string(d->kind));
		json_object_set_new(t, "path", json_string(d->path));
		json_object_set_new(t, "engine", json_string(d->engine));
		json_object_set_new(t, "state", json_string(d->up ? "up" : "down"));
		json_object_set_new(t, "bw_cap", json_integer((json_int_t)d->bw_cap));
		json_object_set_new(t, "bw_measured", json_integer((json_int_t)d->bw_measured));
		json_object_set_new(t, "queued", json_integer(d->queued));
		json_object_set_new(t, "inflight_demand", json_integer(d->inflight_demand));
		json_object_set_new(t, "inflight_prefetch", json_integer(d->inflight_prefetch));
		json_object_set_new(t, "inflight_writeback", json_integer(d->inflight_wb));
		json_object_set_new(tiers, d->name, t);
	}
	json_object_set_new(root, "tiers", tiers);
	json_object_set_new(
		root, "cache",
		json_pack("{sIsIsIsIsIsIsIsIsI}", "hits", (json_int_t)st->hits, "misses",
			  (json_int_t)st->misses, "evictions", (json_int_t)st->evictions,
			  "dirty_bytes", (json_int_t)st->dirty_bytes, "writeback_bytes",
			  (json_int_t)st->writeback_bytes, "holes_written",
			  (json_int_t)st->holes_written, "writeback_errors",
			  (json_int_t)st->wb_errors, "syncs", (json_int_t)st->syncs,
			  "backpressure_waits", (json_int_t)st->backpressure_waits));
	json_object_set_new(json_object_get(root, "cache"), "partial_blocks",
			    json_integer((json_int_t)st->partial_created));
	json_object_set_new(json_object_get(root, "cache"), "partial_merged",
			    json_integer((json_int_t)st->partial_merged));
	json_object_set_new(
		root, "prefetch",
		json_pack("{sIsIsIsI}", "issued", (json_int_t)st->prefetch_issued, "used",
			  (json_int_t)st->prefetch_used, "wasted", (json_int_t)st->prefetch_wasted,
			  "late", (json_int_t)st->prefetch_late));
	struct fs_learn_stats ls;
	static const char *const policies[] = {"auto", "clock", "lru"};
	fs_learn_stats(&fs->learn, &ls);
	json_object_set_new(root, "learner",
			    json_pack("{sssIsIsfsIsI}", "policy", policies[fs->cfg->policy],
				      "cycle_files", (json_int_t)ls.period, "cycle_bytes",
				      (json_int_t)ls.bytes, "confidence", ls.confidence,
				      "position", (json_int_t)ls.position, "records",
				      (json_int_t)ls.records));
	json_t *f = json_object();
	struct {
		const char *name;
		uint64_t v;
	} ops[] = {{"lookup", c.lookups},
		   {"getattr", c.getattrs},
		   {"setattr", c.setattrs},
		   {"open", c.opens},
		   {"create", c.creates},
		   {"read", c.reads},
		   {"write", c.writes},
		   {"read_bytes", c.read_bytes},
		   {"write_bytes", c.write_bytes},
		   {"fsync", c.fsyncs},
		   {"unlink", c.unlinks},
		   {"rename", c.renames},
		   {"copy_file_range", c.copies},
		   {"copy_shared_bytes", c.copy_shared_bytes},
		   {"fallocate", c.fallocates},
		   {"errors", c.errors}};
	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++)
		json_object_set_new(f, ops[i].name, json_integer((json_int_t)ops[i].v));
	json_object_set_new(root, "fuse", f);
	json_object_set_new(root, "meta", json_pack("{sIsI}", "inodes", (json_int_t)inodes,
						    "blocks", (json_int_t)blocks));
	/* Committed blocks: mapped by files (logical) against stored (physical). */
	json_object_set_new(
		root, "dedup",
		json_pack("{sIsIsfsIsI}", "logical_bytes", (json_int_t)(mapped * st->block_size),
			  "physical_bytes", (json_int_t)(blocks * st->block_size), "ratio",
			  blocks ? (double)mapped / (double)blocks : 1.0, "hits",
			  (json_int_t)st->dedup_hits, "verify_mismatches",
			  (json_int_t)st->dedup_verify_mismatch));
	free(st);
	return root;
}

static json_t *config_json(struct fs *fs)
{
	const struct fs_config *c = fs->cfg;
	static const char *const engines[] = {"auto", "io_uring", "libaio"};
	json_t *root = json_object(), *nvme = json_array();

	for (unsigned i = 0; i < c->n_nvme; i++)
		json_array_append_new(nvme, json_string(c->nvme[i]));
	json_object_set_new(root, "dram", json_integer((json_int_t)c->dram));
	json_object_set_new(root, "nvme", nvme);
	json_object_set_new(root, "block", json_integer((json_int_t)fs->bs));
	json_object_set_new(root, "meta", json_string(c->meta));
	json_object_set_new(root, "threads", json_integer(c->threads));
	json_object_set_new(root, "nvme_engine", json_string(engines[c->engine]));
	json_object_set_new(root, "dirty", json_integer((json_int_t)c->dirty));
	json_object_set_new(root, "queue_depth", json_integer(c->queue_depth));
	json_object_set_new(root, "flush_delay_ms", json_integer(c->flush_delay_ms));
	json_object_set_new(root, "sync_interval_ms", json_integer(c->sync_interval_ms));
	json_object_set_new(root, "default_permissions", json_boolean(!c->no_default_permissions));
	static const char *const dedups[] = {"off", "trust", "verify"};
	json_object_set_new(root, "dedup", json_string(dedups[c->dedup]));
	if (c->config_file)
		json_object_set_new(root, "config", json_string(c->config_file));
	if (c->has_s3) {
		json_t *r = json_object();

		/* Never the secret: only whether credentials were given. */
		json_object_set_new(r, "bucket", json_string(c->s3.bucket));
		json_object_set_new(r, "prefix", json_string(c->s3.prefix));
		json_object_set_new(r, "endpoint",
				    c->s3.endpoint ? json_string(c->s3.endpoint) : json_null());
		json_object_set_new(r, "region", json_string(c->s3.region));
		json_object_set_new(r, "addressing",
				    json_string(c->s3.path_style ? "path" : "virtual"));
		json_object_set_new(r, "timeout_ms", json_integer(c->s3.timeout_ms));
		json_object_set_new(r, "credentials", json_boolean(c->s3.access_key != NULL));
		json_object_set_new(root, "s3", r);
	}
	if (c->n_pfs) {
		json_t *p = json_array();

		for (unsigned i = 0; i < c->n_pfs; i++)
			json_array_append_new(p, json_string(c->remote_path[i]));
		json_object_set_new(root, "pfs", p);
	}
	json_t *caps = json_object();
	for (unsigned i = 0; i < c->n_devs; i++) {
		const struct tb_dev_spec *d = &c->devs[i];
		if (d->bw || d->cap) {
			char name[32];
			snprintf(name, sizeof(name), "dev%u", i);
			json_object_set_new(caps, name, json_pack("{sIsI}", "bw", (json_int_t)d->bw,
								  "cap", (json_int_t)d->cap));
		}
	}
	json_object_set_new(root, "caps", caps);
	return root;
}

void fs_ctl_open(struct fs *fs, fuse_req_t req, uint64_t ino, struct fuse_file_info *fi)
{
	struct ctl_buf *b;
	json_t *j;

	if (ino == FS_CTL_DIR_INO) {
		fuse_reply_err(req, EISDIR);
		return;
	}
	if ((fi->flags & O_ACCMODE) != O_RDONLY) {
		fuse_reply_err(req, EACCES);
		return;
	}
	j = ino == FS_CTL_STATS_INO ? stats_json(fs) : config_json(fs);
	b = calloc(1, sizeof(*b));
	if (!j || !b) {
		json_decref(j);
		free(b);
		fuse_reply_err(req, ENOMEM);
		return;
	}
	b->data = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
	json_decref(j);
	if (!b->data) {
		free(b);
		fuse_reply_err(req, ENOMEM);
		return;
	}
	b->len = strlen(b->data);
	b->data[b->len] = 0;
	fi->fh = (uint64_t)(uintptr_t)b;
	fi->direct_io = 1;
	if (fuse_reply_open(req, fi) != 0) {
		free(b->data);
		free(b);
	}
}

void fs_ctl_read(fuse_req_t req, size_t size, off_t off, struct fuse_file_info *fi)
{
	struct ctl_buf *b = (struct ctl_buf *)(uintptr_t)fi->fh;

	if (!b || off < 0 || (size_t)off >= b->len) {
		fuse_reply_buf(req, NULL, 0);
		return;
	}
	if (size > b->len - (size_t)off)
		size = b->len - (size_t)off;
	/*
	 * Reply from a copy: once the kernel has the reply, a concurrent
	 * release may free b while this thread is still returning from writev.
	 */
	char *copy = malloc(size);
	if (!copy) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	memcpy(copy, b->data + off, size);
	fuse_reply_buf(req, copy, size);
	free(copy);
}

void fs_ctl_release(fuse_req_t req, struct fuse_file_info *fi)
{
	struct ctl_buf *b = (struct ctl_buf *)(uintptr_t)fi->fh;

	if (b) {
		free(b->data);
		free(b);
	}
	fuse_reply_err(req, 0);
}

void fs_ctl_readdir(struct fs *fs, fuse_req_t req, uint64_t ino, size_t size, off_t off,
		    bool plus)
{
	char *buf = calloc(1, size);
	size_t len = 0;

	if (!buf || ino != FS_CTL_DIR_INO) {
		free(buf);
		fuse_reply_err(req, buf ? ENOTDIR : ENOMEM);
		return;
	}
	for (size_t i = (size_t)off; i < N_CTL_FILES + 2; i++) {
		const char *name = i == 0 ? "." : i == 1 ? ".." : ctl_files[i - 2].name;
		uint64_t eino = i < 2 ? FS_CTL_DIR_INO : ctl_files[i - 2].ino;
		struct fuse_entry_param e = {0};
		size_t need;

		fs_ctl_root_stat(&e.attr, eino);
		if (plus) {
			/* Control inodes are not counted: a lookup on them is free. */
			e.ino = i < 2 ? 0 : eino;
			e.attr_timeout = fs->attr_timeout;
			e.entry_timeout = fs->entry_timeout;
			need = fuse_add_direntry_plus(req, buf + len, size - len, name, &e,
						      (off_t)i + 1);
		} else {
			need = fuse_add_direntry(req, buf + len, size - len, name, &e.attr,
						 (off_t)i + 1);
		}
		if (need > size - len)
			break;
		len += need;
	}
	fuse_reply_buf(req, buf, len);
	free(buf);
}

/*
 * ctl.c - what the files of the hidden control folder /.tensorfs/ hold.
 *
 * The folder is not listed in the root folder but is reachable by name;
 * its names are ctl_names.c's. Each file is generated whole at open into a
 * buffer that the open file owns, so a reader sees one consistent
 * snapshot; the files are opened with direct_io because their size is only
 * known then. The FUSE ops (ops.c) call in here; this file may call the
 * GPU server (gpu.c, for the gpu file), pins.c, scrub.c, prefetch.c,
 * ctl_names.c and req.c, and never calls back into ops.c.
 *
 *   stats   JSON: per tier, the cache, FUSE operations, the store
 *   config  JSON: the effective configuration (never a secret)
 *   metrics the same counters in Prometheus' text exposition format
 *   ctl     write-only: one command per write (see ctlcmd.h); only the
 *           mount's owner or root may open it
 *   pins    JSON: the pinned files (pins.c), for the owner or root only,
 *           since it names files in folders others may not search
 *   scrub   JSON: the report of the last scrub (scrub.c), for the owner or
 *           root only, for the same reason
 */
#include "ctlcmd.h"
#include "fs.h"
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

struct ctl_buf {
	char *data;
	size_t len;
};

/* Requests made per 10^9 bytes moved; 0 before any byte moved. */
static double requests_per_gb(uint64_t requests, uint64_t bytes)
{
	return bytes ? (double)requests * 1e9 / (double)bytes : 0.0;
}

static json_t *tier_json(uint64_t cap, uint64_t used, uint64_t rb, uint64_t wb, uint64_t ro,
			 uint64_t wo, uint64_t errors)
{
	return json_pack("{sIsIsIsIsIsIsI}", "capacity", (json_int_t)cap, "used", (json_int_t)used,
			 "read_bytes", (json_int_t)rb, "write_bytes", (json_int_t)wb, "read_ops",
			 (json_int_t)ro, "write_ops", (json_int_t)wo, "errors", (json_int_t)errors);
}

static uint64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/*
 * Current bytes per second of each tier (0: dram, i + 1: device i): the
 * change over the last second, sampled by the tfs-rates thread.
 */
static void update_rates(struct fs *fs, const struct tb_stats *st)
{
	uint64_t now = mono_ms(), rb[TB_MAX_DEVS + 1], wb[TB_MAX_DEVS + 1];
	unsigned n = st->n_devs + 1;

	rb[0] = st->dram_read_bytes;
	wb[0] = st->dram_write_bytes;
	for (unsigned i = 0; i < st->n_devs; i++) {
		rb[i + 1] = st->dev[i].read_bytes;
		wb[i + 1] = st->dev[i].write_bytes;
	}
	pthread_mutex_lock(&fs->rate_lock);
	if (fs->rate_ms == 0 || now - fs->rate_ms >= 900) {
		double dt = fs->rate_ms ? (double)(now - fs->rate_ms) / 1000.0 : 0;

		for (unsigned i = 0; i < n; i++) {
			fs->rate_rbps[i] = dt > 0 ? (double)(rb[i] - fs->rate_rb[i]) / dt : 0;
			fs->rate_wbps[i] = dt > 0 ? (double)(wb[i] - fs->rate_wb[i]) / dt : 0;
			fs->rate_rb[i] = rb[i];
			fs->rate_wb[i] = wb[i];
		}
		fs->rate_ms = now;
	}
	pthread_mutex_unlock(&fs->rate_lock);
}

static void *rates_main(void *arg)
{
	struct fs *fs = arg;
	struct tb_stats *st = calloc(1, sizeof(*st));

	pthread_setname_np(pthread_self(), "tfs-rates");
	pthread_mutex_lock(&fs->rate_lock);
	while (!fs->rate_stop) {
		struct timespec ts;

		pthread_mutex_unlock(&fs->rate_lock);
		if (st) {
			tb_get_stats(fs->tb, st);
			update_rates(fs, st);
		}
		pthread_mutex_lock(&fs->rate_lock);
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_sec += 1;
		while (!fs->rate_stop &&
		       pthread_cond_timedwait(&fs->rate_cv, &fs->rate_lock, &ts) == 0)
			;
	}
	pthread_mutex_unlock(&fs->rate_lock);
	free(st);
	return NULL;
}

int fs_ctl_start(struct fs *fs)
{
	pthread_condattr_t ca;

	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&fs->rate_cv, &ca);
	pthread_condattr_destroy(&ca);
	return fs_worker_start(&fs->rate_thread, &fs->rate_stop, &fs->rate_running, rates_main, fs);
}

void fs_ctl_stop(struct fs *fs)
{
	fs_worker_stop(fs->rate_thread, &fs->rate_lock, &fs->rate_cv, &fs->rate_stop,
		       &fs->rate_running);
}

static void set_rates(struct fs *fs, json_t *t, unsigned i)
{
	pthread_mutex_lock(&fs->rate_lock);
	json_object_set_new(t, "read_bps", json_integer((json_int_t)fs->rate_rbps[i]));
	json_object_set_new(t, "write_bps", json_integer((json_int_t)fs->rate_wbps[i]));
	pthread_mutex_unlock(&fs->rate_lock);
}

static const char *const policy_names[] = {"auto", "clock", "lru", "2q"};

/* A device's state: down after errors, full (no room, or a write said ENOSPC), or up. */
static const char *dev_state(const struct tb_dev_stats *d)
{
	return !d->up ? "down" : d->full ? "full" : "up";
}

/*
 * Health now, from what is wrong now: "ok", or a list of the devices down
 * or full, those with errors in the last health window, and write-back
 * failures in it. It recovers as the faults end (a write that succeeds
 * ends "full"; errors age out of the window). The lifetime counts
 * ("errors", "writeback_errors") are reported apart.
 */
static void health_text(const struct tb_stats *st, char *buf, size_t len)
{
	size_t n = 0;

	buf[0] = 0;
	for (unsigned i = 0; i < st->n_devs; i++) {
		const struct tb_dev_stats *d = &st->dev[i];

		if (strcmp(dev_state(d), "up") != 0)
			n += (size_t)snprintf(buf + n, n < len ? len - n : 0, "%s%s %s",
					      n ? ", " : "", d->name, dev_state(d));
		if (d->recent_errors)
			n += (size_t)snprintf(buf + n, n < len ? len - n : 0,
					      "%s%s: %llu errors in the last %u s", n ? ", " : "",
					      d->name, (unsigned long long)d->recent_errors,
					      st->health_window_s);
	}
	if (st->recent_wb_errors)
		n += (size_t)snprintf(
		    buf + n, n < len ? len - n : 0, "%s%llu write-back errors in the last %u s",
		    n ? ", " : "", (unsigned long long)st->recent_wb_errors, st->health_window_s);
	if (st->stall_err)
		n += (size_t)snprintf(buf + n, n < len ? len - n : 0,
				      "%swrite-back failing for %llu s (%s%s)", n ? ", " : "",
				      (unsigned long long)(st->stall_ms / 1000),
				      st->stall_commit ? "metadata commit: " : "",
				      strerror(-st->stall_err));
	if (n == 0)
		snprintf(buf, len, "ok");
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
	json_object_set_new(t, "thp_bytes", json_integer((json_int_t)st->thp_bytes));
	json_object_set_new(t, "locked", json_boolean(st->locked));
	json_object_set_new(t, "zero_copy_write_bytes",
			    json_integer((json_int_t)st->swapped_write_bytes));
	set_rates(fs, t, 0);
	json_object_set_new(tiers, "dram", t);
	for (unsigned i = 0; i < st->n_devs; i++) {
		struct tb_dev_stats *d = &st->dev[i];
		json_t *v;

		t = tier_json(d->capacity, d->used, d->read_bytes, d->write_bytes, d->read_ops,
			      d->write_ops, d->errors);
		json_object_set_new(t, "kind", json_string(d->kind));
		json_object_set_new(t, "path", json_string(d->path));
		json_object_set_new(t, "engine", json_string(d->engine));
		json_object_set_new(t, "state", json_string(dev_state(d)));
		v = json_pack(
		    "{sIsIsIsIsIsIsIsIsIsI}", "avail", (json_int_t)d->avail, "recent_errors",
		    (json_int_t)d->recent_errors, "bw_cap", (json_int_t)d->bw_cap, "bw_measured",
		    (json_int_t)d->bw_measured, "bw_capable", (json_int_t)d->bw_capable, "weight",
		    (json_int_t)d->weight, "read_latency_us", (json_int_t)d->read_latency_us,
		    "active_ms", (json_int_t)(d->active_ns / 1000000), "readahead_bytes",
		    (json_int_t)d->readahead_bytes, "requests", (json_int_t)d->requests);
		json_object_update(t, v);
		json_decref(v);
		if (strcmp(d->kind, "s3") != 0) {
			json_object_set_new(t, "slab_bytes",
					    json_integer((json_int_t)d->slab_bytes));
			json_object_set_new(t, "returned_bytes",
					    json_integer((json_int_t)d->returned_bytes));
		}
		json_object_set_new(
		    t, "requests_per_gb",
		    json_real(requests_per_gb(d->requests, d->read_bytes + d->write_bytes)));
		if (strcmp(d->kind, "s3") == 0) {
			json_object_set_new(t, "objects", json_integer((json_int_t)d->objects));
			json_object_set_new(t, "dead_bytes",
					    json_integer((json_int_t)d->dead_bytes));
			json_object_set_new(t, "compacted_objects",
					    json_integer((json_int_t)d->compacted_objects));
			json_object_set_new(t, "compacted_bytes",
					    json_integer((json_int_t)d->compacted_bytes));
		}
		json_object_set_new(t, "checksum_errors",
				    json_integer((json_int_t)d->checksum_errors));
		json_object_set_new(t, "queued", json_integer(d->queued));
		json_object_set_new(t, "inflight_demand", json_integer(d->inflight_demand));
		json_object_set_new(t, "inflight_prefetch", json_integer(d->inflight_prefetch));
		json_object_set_new(t, "inflight_writeback", json_integer(d->inflight_wb));
		set_rates(fs, t, i + 1);
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
	json_object_set_new(json_object_get(root, "cache"), "recent_writeback_errors",
			    json_integer((json_int_t)st->recent_wb_errors));
	json_object_set_new(json_object_get(root, "cache"), "writeback_stall_ms",
			    json_integer((json_int_t)st->stall_ms));
	char health[1024];
	health_text(st, health, sizeof(health));
	json_object_set_new(root, "health", json_string(health));
	json_object_set_new(root, "health_window_s", json_integer(st->health_window_s));
	json_object_set_new(json_object_get(root, "cache"), "partial_blocks",
			    json_integer((json_int_t)st->partial_created));
	json_object_set_new(json_object_get(root, "cache"), "partial_merged",
			    json_integer((json_int_t)st->partial_merged));
	json_t *cj = json_object_get(root, "cache");
	uint64_t lookups = st->hits + st->misses;
	json_object_set_new(cj, "hit_rate",
			    json_real(lookups ? (double)st->hits / (double)lookups : 0.0));
	json_object_set_new(cj, "pinned_bytes", json_integer((json_int_t)st->pinned_bytes));
	json_object_set_new(cj, "pin_limit_bytes", json_integer((json_int_t)st->pin_limit_bytes));
	json_object_set_new(cj, "policy", json_string(policy_names[fs->cfg->policy]));
	json_object_set_new(cj, "hot_bytes", json_integer((json_int_t)st->hot_bytes));
	json_object_set_new(cj, "ghost_hits", json_integer((json_int_t)st->ghost_hits));
	json_object_set_new(cj, "unsynced_blocks", json_integer((json_int_t)st->unsynced_blocks));
	json_object_set_new(cj, "expired_bytes", json_integer((json_int_t)st->expired_bytes));
	json_object_set_new(cj, "rewritten_bytes", json_integer((json_int_t)st->rewritten_bytes));
	json_object_set_new(cj, "dirty_limit_bytes", json_integer((json_int_t)st->dirty_limit_bytes));
	json_object_set_new(cj, "dirty_background_bytes",
			    json_integer((json_int_t)st->dirty_background_bytes));
	json_object_set_new(cj, "kept_bytes", json_integer((json_int_t)st->kept_bytes));
	json_object_set_new(cj, "kept_evicted_bytes",
			    json_integer((json_int_t)st->kept_evicted_bytes));
	json_object_set_new(
		root, "prefetch",
		json_pack("{sIsIsIsIsIsIsIsf}", "issued", (json_int_t)st->prefetch_issued, "used",
			  (json_int_t)st->prefetch_used, "wasted", (json_int_t)st->prefetch_wasted,
			  "late", (json_int_t)st->prefetch_late, "promoted",
			  (json_int_t)st->prefetch_promoted, "refused",
			  (json_int_t)st->prefetch_refused, "depth_blocks",
			  (json_int_t)st->prefetch_depth, "accuracy",
			  st->prefetch_issued
				  ? (double)st->prefetch_used / (double)st->prefetch_issued
				  : 0.0));
	struct fs_learn_stats ls;
	fs_learn_stats(&fs->learn, &ls);
	json_object_set_new(root, "learner",
			    json_pack("{sssIsIsfsIsIsIsI}", "policy", policy_names[fs->cfg->policy],
				      "cycle_files", (json_int_t)ls.period, "cycle_bytes",
				      (json_int_t)ls.bytes, "confidence", ls.confidence,
				      "position", (json_int_t)ls.position, "records",
				      (json_int_t)ls.records, "streams", (json_int_t)ls.streams,
				      "files", (json_int_t)ls.files));
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
		   {"errors", c.errors},
		   {"write_parked", c.writes_parked}};
	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++)
		json_object_set_new(f, ops[i].name, json_integer((json_int_t)ops[i].v));
	json_object_set_new(root, "fuse", f);
	struct meta_space sp;
	meta_space(fs->meta, &sp);
	json_object_set_new(root, "meta",
			    json_pack("{sIsIsIsIsIsIsIsI}", "inodes", (json_int_t)inodes, "blocks",
				      (json_int_t)blocks, "file_bytes", (json_int_t)sp.file_bytes,
				      "disk_bytes", (json_int_t)sp.disk_bytes, "used_bytes",
				      (json_int_t)sp.used_bytes, "tree_bytes",
				      (json_int_t)sp.tree_bytes, "free_bytes",
				      (json_int_t)sp.free_bytes, "unsynced_commits",
				      (json_int_t)st->unsynced_commits));
	/* Committed blocks: mapped by files (logical) against stored (physical). */
	json_object_set_new(
		root, "dedup",
		json_pack("{sIsIsfsIsIsI}", "logical_bytes", (json_int_t)(mapped * st->block_size),
			  "physical_bytes", (json_int_t)(blocks * st->block_size), "ratio",
			  blocks ? (double)mapped / (double)blocks : 1.0, "hits",
			  (json_int_t)st->dedup_hits, "verify_mismatches",
			  (json_int_t)st->dedup_verify_mismatch, "verify_from_dram",
			  (json_int_t)st->dedup_verify_cached));
	/* Blocks read from the devices, checked against the hash their records keep. */
	json_object_set_new(root, "checksum",
			    json_pack("{sIsIsI}", "verified", (json_int_t)st->checksum_verified,
				      "unverified", (json_int_t)st->checksum_unverified, "errors",
				      (json_int_t)st->checksum_errors));
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
	json_object_set_new(root, "pid", json_integer(getpid()));
	json_object_set_new(root, "lock_wait", json_integer(c->lock_wait_secs));
	json_object_set_new(root, "threads", json_integer(c->threads));
	json_object_set_new(root, "nvme_engine", json_string(engines[c->engine]));
	/* dirty= unset (0) asks for the default: the limit in force is the store's */
	struct tb_stats *st = calloc(1, sizeof(*st));

	if (st)
		tb_get_stats(fs->tb, st);
	json_object_set_new(root, "dirty",
			    json_integer((json_int_t)(st ? st->dirty_limit_bytes : c->dirty)));
	free(st);
	json_object_set_new(root, "queue_depth", json_integer(c->queue_depth));
	json_object_set_new(root, "flush_delay_ms", json_integer(c->flush_delay_ms));
	json_object_set_new(root, "dirty_expire_ms", json_integer(c->dirty_expire_ms));
	json_object_set_new(root, "sync_interval_ms", json_integer(c->sync_interval_ms));
	json_object_set_new(root, "sync_commits", json_integer(c->sync_commits));
	json_object_set_new(root, "punch_after_ms", json_integer(c->punch_after_ms));
	json_object_set_new(root, "stall_wait_ms", json_integer(c->stall_wait_ms));
	json_object_set_new(root, "default_permissions", json_boolean(!c->no_default_permissions));
	static const char *const dedups[] = {"off", "trust", "verify"};
	json_object_set_new(root, "dedup", json_string(dedups[c->dedup]));
	json_object_set_new(root, "checksum", json_boolean(c->checksum));
	static const char *const policies[] = {"auto", "clock", "lru", "2q"};
	json_object_set_new(root, "cache_policy", json_string(policies[c->policy]));
	json_object_set_new(root, "prefetch", json_string(c->prefetch ? "on" : "off"));
	static const char *const levels[] = {"error", "warning", "info", "debug"};
	json_object_set_new(root, "log_level", json_string(levels[c->log_level]));
	json_object_set_new(root, "logfile", c->logfile ? json_string(c->logfile) : json_null());
	json_object_set_new(root, "cuda", json_boolean(c->cuda));
	json_object_set_new(root, "readahead", json_integer((json_int_t)c->readahead));
	json_object_set_new(root, "remote_readahead",
			    json_integer((json_int_t)c->remote_readahead));
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
		json_object_set_new(r, "object", json_integer((json_int_t)c->s3.object_bytes));
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

/* ---- metrics: Prometheus text exposition format, version 0.0.4 ---- */

/*
 * Where the samples go, and the label every sample carries: the mount
 * point, so that two mounts on one node (scraped as one instance through
 * node_exporter's textfile collector) stay apart.
 */
struct mout {
	FILE *f;
	char mount[2 * PATH_MAX + 16]; /* mount="..." with the value escaped */
};

/* mount="POINT", escaped as the text format wants: \\, \" and \n. */
static void mount_label(struct mout *o, const char *point)
{
	size_t n = 0, cap = sizeof(o->mount);

	n += (size_t)snprintf(o->mount, cap, "mount=\"");
	for (const char *p = point; *p && n + 4 < cap; p++) {
		if (*p == '\\' || *p == '"') {
			o->mount[n++] = '\\';
			o->mount[n++] = *p;
		} else if (*p == '\n') {
			o->mount[n++] = '\\';
			o->mount[n++] = 'n';
		} else {
			o->mount[n++] = *p;
		}
	}
	o->mount[n++] = '"';
	o->mount[n] = '\0';
}

static void metric_head(struct mout *o, const char *name, const char *type, const char *help)
{
	fprintf(o->f, "# HELP tensorfs_%s %s\n# TYPE tensorfs_%s %s\n", name, help, name, type);
}

/* One sample; label is "" or 'key="value"' (values here need no escaping). */
static void metric(struct mout *o, const char *name, const char *label, double v)
{
	fprintf(o->f, "tensorfs_%s{%s%s%s} %.17g\n", name, o->mount, label[0] ? "," : "", label, v);
}

static void metric1(struct mout *o, const char *name, const char *type, const char *help, double v)
{
	metric_head(o, name, type, help);
	metric(o, name, "", v);
}

/* A metric with one sample per tier, from a field of struct tier_row. */
struct tier_row {
	char label[48];
	double cap, used, rb, wb, ro, wo, err, up, rbps, wbps;
	double full, avail, recent_err;
	double q, in_demand, in_prefetch, in_wb;
	double requests, weight, capable, objects, dead, slab, returned, sum_err, lat;
	bool dev;
};

#define TIER_METRIC(f, rows, n, name, type, help, field, devs_only)                       \
	do {                                                                               \
		metric_head(f, name, type, help);                                          \
		for (unsigned i_ = 0; i_ < (n); i_++)                                      \
			if (!(devs_only) || (rows)[i_].dev)                                \
				metric(f, name, (rows)[i_].label, (rows)[i_].field);       \
	} while (0)

static char *metrics_text(struct fs *fs, size_t *len)
{
	struct tb_stats *st = calloc(1, sizeof(*st));
	struct tier_row rows[TB_MAX_DEVS + 1];
	struct fs_counters c;
	struct fs_learn_stats ls;
	struct meta_space sp;
	uint64_t inodes, blocks, mapped;
	char *buf = NULL;
	unsigned n;
	struct mout out, *f = &out; /* what the metric calls write to */

	if (!st)
		return NULL;
	out.f = open_memstream(&buf, len);
	if (!out.f) {
		free(st);
		return NULL;
	}
	mount_label(&out, fs->cfg->mountpoint ? fs->cfg->mountpoint : "");
	tb_get_stats(fs->tb, st);
	meta_counts(fs->meta, &inodes, &blocks, &mapped);
	meta_space(fs->meta, &sp);
	memcpy(&c, &fs->cnt, sizeof(c));
	fs_learn_stats(&fs->learn, &ls);

	memset(rows, 0, sizeof(rows));
	snprintf(rows[0].label, sizeof(rows[0].label), "tier=\"dram\"");
	rows[0].cap = (double)st->dram_capacity;
	rows[0].used = (double)st->dram_used;
	rows[0].rb = (double)st->dram_read_bytes;
	rows[0].wb = (double)st->dram_write_bytes;
	rows[0].ro = (double)st->dram_read_ops;
	rows[0].wo = (double)st->dram_write_ops;
	rows[0].up = 1;
	for (unsigned i = 0; i < st->n_devs; i++) {
		struct tb_dev_stats *d = &st->dev[i];
		struct tier_row *r = &rows[i + 1];

		snprintf(r->label, sizeof(r->label), "tier=\"%s\"", d->name);
		r->dev = true;
		r->cap = (double)d->capacity;
		r->used = (double)d->used;
		r->rb = (double)d->read_bytes;
		r->wb = (double)d->write_bytes;
		r->ro = (double)d->read_ops;
		r->wo = (double)d->write_ops;
		r->err = (double)d->errors;
		r->up = d->up;
		r->full = d->full;
		r->avail = (double)d->avail;
		r->recent_err = (double)d->recent_errors;
		r->q = d->queued;
		r->in_demand = d->inflight_demand;
		r->in_prefetch = d->inflight_prefetch;
		r->in_wb = d->inflight_wb;
		r->requests = (double)d->requests;
		r->weight = d->weight;
		r->capable = (double)d->bw_capable;
		r->objects = (double)d->objects;
		r->dead = (double)d->dead_bytes;
		r->slab = (double)d->slab_bytes;
		r->returned = (double)d->returned_bytes;
		r->sum_err = (double)d->checksum_errors;
		r->lat = (double)d->read_latency_us / 1e6;
	}
	n = st->n_devs + 1;
	pthread_mutex_lock(&fs->rate_lock);
	for (unsigned i = 0; i < n; i++) {
		rows[i].rbps = fs->rate_rbps[i];
		rows[i].wbps = fs->rate_wbps[i];
	}
	pthread_mutex_unlock(&fs->rate_lock);

	metric_head(f, "build_info", "gauge", "Version of the running tensorfs.");
	metric(f, "build_info", "version=\"" TFS_VERSION "\"", 1);
	metric1(f, "block_size_bytes", "gauge", "Block size of the store.",
		(double)st->block_size);
	TIER_METRIC(f, rows, n, "tier_capacity_bytes", "gauge", "Capacity of the tier.", cap, 0);
	TIER_METRIC(f, rows, n, "tier_used_bytes", "gauge", "Bytes in use in the tier.", used, 0);
	TIER_METRIC(f, rows, n, "tier_read_bytes_total", "counter", "Bytes read from the tier.",
		    rb, 0);
	TIER_METRIC(f, rows, n, "tier_write_bytes_total", "counter", "Bytes written to the tier.",
		    wb, 0);
	TIER_METRIC(f, rows, n, "tier_read_ops_total", "counter", "Reads served by the tier.", ro,
		    0);
	TIER_METRIC(f, rows, n, "tier_write_ops_total", "counter", "Writes made to the tier.", wo,
		    0);
	TIER_METRIC(f, rows, n, "tier_read_bytes_per_second", "gauge",
		    "Read rate of the tier over about the last second.", rbps, 0);
	TIER_METRIC(f, rows, n, "tier_write_bytes_per_second", "gauge",
		    "Write rate of the tier over about the last second.", wbps, 0);
	TIER_METRIC(f, rows, n, "tier_errors_total", "counter", "I/O errors of the device.", err,
		    1);
	TIER_METRIC(f, rows, n, "tier_up", "gauge", "1 while the device is not down.", up, 1);
	TIER_METRIC(f, rows, n, "tier_full", "gauge",
		    "1 while the device is full: no room left, or a write said ENOSPC since the "
		    "last that succeeded.",
		    full, 1);
	TIER_METRIC(f, rows, n, "tier_avail_bytes", "gauge",
		    "Bytes the device can still take (its filesystem's free space counts).", avail,
		    1);
	TIER_METRIC(f, rows, n, "tier_recent_errors", "gauge",
		    "I/O errors of the device in the last health window (60 s).", recent_err, 1);
	TIER_METRIC(f, rows, n, "tier_checksum_errors_total", "counter",
		    "Blocks read from the device that did not match their hash.", sum_err, 1);
	TIER_METRIC(f, rows, n, "tier_queued", "gauge", "Requests waiting for the device.", q, 1);
	TIER_METRIC(f, rows, n, "tier_requests_total", "counter",
		    "Requests made to the device (HTTP requests for s3).", requests, 1);
	/* Requests per GB: tier_requests_total over the byte counters, in the query. */
	TIER_METRIC(f, rows, n, "tier_read_latency_seconds", "gauge",
		    "Recent read latency of the device (a moving average of its reads).", lat, 1);
	TIER_METRIC(f, rows, n, "tier_placement_weight", "gauge",
		    "Weight of the device in placing new blocks.", weight, 1);
	TIER_METRIC(f, rows, n, "tier_capable_bytes_per_second", "gauge",
		    "What the device moved when driven hard.", capable, 1);
	TIER_METRIC(f, rows, n, "tier_objects", "gauge", "Objects the device stores (s3).", objects,
		    1);
	TIER_METRIC(f, rows, n, "tier_dead_bytes", "gauge",
		    "Bytes in stored objects that no block uses (s3).", dead, 1);
	TIER_METRIC(f, rows, n, "tier_slab_bytes", "gauge",
		    "What the slab file takes on its filesystem (nvme, pfs).", slab, 1);
	TIER_METRIC(f, rows, n, "tier_returned_bytes_total", "counter",
		    "Free slab space given back to the filesystem (nvme, pfs).", returned, 1);
	metric_head(f, "tier_inflight", "gauge", "Requests in flight, by scheduling class.");
	for (unsigned i = 1; i < n; i++) {
		static const char *const cls[] = {"demand", "prefetch", "writeback"};
		double v[] = {rows[i].in_demand, rows[i].in_prefetch, rows[i].in_wb};

		for (unsigned k = 0; k < 3; k++) {
			char label[96];

			snprintf(label, sizeof(label), "%s,class=\"%s\"", rows[i].label, cls[k]);
			metric(f, "tier_inflight", label, v[k]);
		}
	}

	metric1(f, "cache_hits_total", "counter", "Block lookups served from DRAM.",
		(double)st->hits);
	metric1(f, "cache_misses_total", "counter", "Block lookups that had to load.",
		(double)st->misses);
	metric1(f, "cache_evictions_total", "counter", "Blocks evicted from DRAM.",
		(double)st->evictions);
	metric1(f, "cache_dirty_bytes", "gauge", "Bytes written and not yet written back.",
		(double)st->dirty_bytes);
	metric1(f, "cache_dirty_limit_bytes", "gauge",
		"The dirty mark: writers wait above it (dirty=).", (double)st->dirty_limit_bytes);
	metric1(f, "cache_pinned_bytes", "gauge", "Resident bytes of pinned files.",
		(double)st->pinned_bytes);
	metric1(f, "cache_kept_bytes", "gauge",
		"Bytes the learned cycle keeps resident from one use to the next.",
		(double)st->kept_bytes);
	metric1(f, "cache_writeback_bytes_total", "counter", "Bytes written back from DRAM.",
		(double)st->writeback_bytes);
	metric1(f, "cache_writeback_errors_total", "counter", "Failed write-backs.",
		(double)st->wb_errors);
	metric1(f, "cache_writeback_recent_errors", "gauge",
		"Failed write-backs in the last health window (60 s).",
		(double)st->recent_wb_errors);
	metric1(f, "cache_writeback_stall_seconds", "gauge",
		"How long every write-back has failed, none succeeding; 0: not stalled.",
		(double)st->stall_ms / 1000);
	metric1(f, "cache_syncs_total", "counter", "Sync points made durable.",
		(double)st->syncs);
	metric1(f, "cache_backpressure_waits_total", "counter",
		"Writers that waited at the dirty mark.", (double)st->backpressure_waits);
	metric1(f, "prefetch_issued_total", "counter", "Blocks loaded ahead of use.",
		(double)st->prefetch_issued);
	metric1(f, "prefetch_used_total", "counter", "Prefetched blocks read before eviction.",
		(double)st->prefetch_used);
	metric1(f, "prefetch_wasted_total", "counter", "Prefetched blocks evicted unread.",
		(double)st->prefetch_wasted);
	metric1(f, "prefetch_late_total", "counter",
		"Demand reads that waited for a prefetch in flight.", (double)st->prefetch_late);
	metric1(f, "prefetch_promoted_total", "counter",
		"Late prefetches still queued, moved to the demand class.",
		(double)st->prefetch_promoted);
	metric1(f, "prefetch_refused_total", "counter",
		"Prefetches not issued: every slot held a block needed sooner.",
		(double)st->prefetch_refused);
	metric1(f, "learner_cycle_files", "gauge", "Files in the learned access cycle.",
		(double)ls.period);
	metric1(f, "learner_cycle_bytes", "gauge", "Bytes in the learned access cycle.",
		(double)ls.bytes);
	metric1(f, "learner_confidence", "gauge", "Confidence in the learned cycle, 0 to 1.",
		ls.confidence);
	metric1(f, "dedup_logical_bytes", "gauge", "Bytes of committed blocks mapped by files.",
		(double)mapped * (double)st->block_size);
	metric1(f, "dedup_physical_bytes", "gauge", "Bytes of committed blocks stored.",
		(double)blocks * (double)st->block_size);
	metric1(f, "dedup_hits_total", "counter", "Blocks stored as a reference at write-back.",
		(double)st->dedup_hits);
	metric1(f, "meta_inodes", "gauge", "Inodes in the metadata store.", (double)inodes);
	metric1(f, "meta_file_bytes", "gauge", "Size of the metadata store's file (data.mdb).",
		(double)sp.file_bytes);
	metric1(f, "meta_disk_bytes", "gauge",
		"What the metadata store's file takes on its filesystem.", (double)sp.disk_bytes);
	metric1(f, "meta_used_bytes", "gauge",
		"The metadata store's pages up to the highest in use.", (double)sp.used_bytes);
	metric1(f, "meta_tree_bytes", "gauge",
		"The metadata store's pages in its trees: the live metadata.",
		(double)sp.tree_bytes);
	metric1(f, "meta_free_bytes", "gauge",
		"The metadata store's pages free for reuse once no reader needs them.",
		(double)sp.free_bytes);
	metric1(f, "meta_unsynced_commits", "gauge",
		"Metadata commits since the last sync point.", (double)st->unsynced_commits);
	metric1(f, "checksum_verified_total", "counter",
		"Blocks read from the devices and checked against their hash.",
		(double)st->checksum_verified);
	metric1(f, "checksum_unverified_total", "counter",
		"Blocks read from the devices unchecked (no hash stored, or checksum=off).",
		(double)st->checksum_unverified);
	metric1(f, "checksum_errors_total", "counter",
		"Blocks read from the devices that did not match their hash (EIO).",
		(double)st->checksum_errors);

	struct {
		const char *name;
		uint64_t v;
	} ops[] = {{"lookup", c.lookups},	  {"getattr", c.getattrs}, {"setattr", c.setattrs},
		   {"open", c.opens},		  {"create", c.creates},   {"read", c.reads},
		   {"write", c.writes},		  {"fsync", c.fsyncs},	   {"unlink", c.unlinks},
		   {"rename", c.renames},	  {"copy_file_range", c.copies},
		   {"fallocate", c.fallocates}};
	metric_head(f, "fuse_ops_total", "counter", "FUSE requests, by operation.");
	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
		char label[48];

		snprintf(label, sizeof(label), "op=\"%s\"", ops[i].name);
		metric(f, "fuse_ops_total", label, (double)ops[i].v);
	}
	metric1(f, "fuse_read_bytes_total", "counter", "Bytes read through FUSE.",
		(double)c.read_bytes);
	metric1(f, "fuse_write_bytes_total", "counter", "Bytes written through FUSE.",
		(double)c.write_bytes);
	metric1(f, "fuse_errors_total", "counter", "FUSE requests answered with an error.",
		(double)c.errors);
	metric1(f, "fuse_write_parked_total", "counter",
		"Writes that waited for dirty room off the threads serving /dev/fuse.",
		(double)c.writes_parked);
	free(st);
	if (fclose(out.f) != 0) {
		free(buf);
		return NULL;
	}
	return buf;
}

/* Only the mount's owner (the daemon's user) or root may steer it. */
static bool caller_may_steer(fuse_req_t req)
{
	const struct fuse_ctx *ctx = fuse_req_ctx(req);

	return ctx->uid == 0 || ctx->uid == getuid();
}

void fs_ctl_open(struct fs *fs, fuse_req_t req, uint64_t ino, struct fuse_file_info *fi)
{
	struct ctl_buf *b;
	json_t *j = NULL;

	if (ino == FS_CTL_DIR_INO) {
		fuse_reply_err(req, EISDIR);
		return;
	}
	if (ino == FS_CTL_CTL_INO) {
		if ((fi->flags & O_ACCMODE) != O_WRONLY || !caller_may_steer(req)) {
			fuse_reply_err(req, EACCES);
			return;
		}
		fi->fh = 0;
		fi->direct_io = 1;
		fi->nonseekable = 1;
		fuse_reply_open(req, fi);
		return;
	}
	if ((fi->flags & O_ACCMODE) != O_RDONLY ||
	    ((ino == FS_CTL_PINS_INO || ino == FS_CTL_SCRUB_INO) && !caller_may_steer(req))) {
		fuse_reply_err(req, EACCES);
		return;
	}
	b = calloc(1, sizeof(*b));
	if (!b) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	if (ino == FS_CTL_METRICS_INO) {
		b->data = metrics_text(fs, &b->len);
	} else {
		j = ino == FS_CTL_STATS_INO   ? stats_json(fs)
		    : ino == FS_CTL_GPU_INO   ? fs_gpu_json(fs)
		    : ino == FS_CTL_PINS_INO  ? fs_pins_json(fs)
		    : ino == FS_CTL_SCRUB_INO ? fs_scrub_json(fs)
					       : config_json(fs);
		/* ASCII: a name's control characters come out as \u escapes, never raw. */
		b->data =
		    j ? json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_ENSURE_ASCII)
		      : NULL;
		json_decref(j);
		if (b->data)
			b->len = strlen(b->data);
	}
	if (!b->data) {
		free(b);
		fuse_reply_err(req, ENOMEM);
		return;
	}
	fi->fh = (uint64_t)(uintptr_t)b;
	fi->direct_io = 1;
	if (fuse_reply_open(req, fi) != 0) {
		free(b->data);
		free(b);
	}
}

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

	if (ino != FS_CTL_CTL_INO || !caller_may_steer(req)) {
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


/*
 * ctl.c - what the files of the hidden control folder /.tensorfs/ hold.
 *
 * The folder is not listed in the root folder but is reachable by name;
 * its names are ctl_names.c's. Each file is generated whole at open into a
 * buffer that the open file owns, so a reader sees one consistent
 * snapshot; the files are opened with direct_io because their size is only
 * known then. The FUSE ops call in here; this file may call the GPU
 * server (gpu.c, for the gpu file), ctl_metrics.c (the metrics file),
 * ctl_names.c, pins.c, scrub.c, the learner, the store and the block
 * store, and never calls back into the ops. The commands and
 * user.tensorfs.tiers are ctl_run.c's.
 *
 *   stats   JSON: per tier, the cache, FUSE operations, the store
 *   config  JSON: the effective configuration (never a secret)
 *   metrics the same counters in Prometheus' text exposition format
 *   ctl     write-only: one command per write (see ctlcmd.h, ctl_run.c);
 *           only the mount's owner or root may open it
 *   pins    JSON: the pinned files (pins.c), for the owner or root only,
 *           since it names files in folders others may not search
 *   scrub   JSON: the report of the last scrub (scrub.c), for the owner or
 *           root only, for the same reason
 */
#include "ctlcmd.h"
#include "ctl_int.h"
#include "json_count.h"
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

/* A control file's snapshot, taken at open; on fs->ctl_open until its release. */
struct ctl_buf {
	char *data;
	size_t len;
	struct ctl_buf *prev, *next;
};

static void ctl_buf_link(struct fs *fs, struct ctl_buf *b)
{
	pthread_mutex_lock(&fs->ctl_lock);
	b->next = fs->ctl_open;
	if (b->next)
		b->next->prev = b;
	fs->ctl_open = b;
	pthread_mutex_unlock(&fs->ctl_lock);
}

static void ctl_buf_free(struct fs *fs, struct ctl_buf *b)
{
	pthread_mutex_lock(&fs->ctl_lock);
	if (b->prev)
		b->prev->next = b->next;
	else
		fs->ctl_open = b->next;
	if (b->next)
		b->next->prev = b->prev;
	pthread_mutex_unlock(&fs->ctl_lock);
	free(b->data);
	free(b);
}

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

/*
 * Current bytes per second of each tier (0: dram, i + 1: device i): the
 * change over the last second, sampled by the tfs-rates thread.
 */
static void update_rates(struct fs *fs, const struct tb_stats *st)
{
	uint64_t now = fs_monotonic_ms(), rb[TB_MAX_DEVS + 1], wb[TB_MAX_DEVS + 1];
	unsigned n = st->n_devs + 1;

	rb[0] = st->n.dram_read_bytes;
	wb[0] = st->n.dram_write_bytes;
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
	/*
	 * After the loop: a file closed just before the unmount may have had
	 * its release still in the kernel's queue (LeakSanitizer saw one once,
	 * a stats snapshot read right before the unmount).
	 */
	while (fs->ctl_open)
		ctl_buf_free(fs, fs->ctl_open);
}

static void set_rates(struct fs *fs, json_t *t, unsigned i)
{
	pthread_mutex_lock(&fs->rate_lock);
	json_object_set_new(t, "read_bps", json_integer((json_int_t)fs->rate_rbps[i]));
	json_object_set_new(t, "write_bps", json_integer((json_int_t)fs->rate_wbps[i]));
	pthread_mutex_unlock(&fs->rate_lock);
}

static const char *const policy_names[] = {"auto", "clock", "lru", "2q"};

/*
 * A device with requests in flight and none finished for this long is
 * named in health: a parallel filesystem that stalls (its requests wait,
 * and so do the fsyncs behind them, until it answers). An s3 object put
 * at a low bandwidth cap may take as long, and is named as well: what it
 * says is only what is so.
 */
#define HEALTH_UNANSWERED_MS 10000

/* A device's state: down after errors, full (no room, or a write said ENOSPC), or up. */
static const char *dev_state(const struct tb_dev_stats *d)
{
	return !d->up ? "down" : d->full ? "full" : "up";
}

/*
 * Health now, from what is wrong now: "ok", or a list of the metadata's
 * failing write transactions (a read-only or full filesystem under meta=),
 * the devices down or full, those with errors in the last health window
 * or no request finished for HEALTH_UNANSWERED_MS, and write-back
 * failures in the window. It recovers as the faults end (a write that succeeds
 * ends "full"; errors age out of the window). The lifetime counts
 * ("errors", "writeback_errors") are reported apart.
 */
static void health_text(const struct tb_stats *st, struct fs_meta *meta, char *buf, size_t len)
{
	uint64_t meta_ms;
	int meta_err = meta_failing(meta, (uint64_t)st->health_window_s * 1000, &meta_ms);
	size_t n = 0;

	buf[0] = 0;
	if (meta_err)
		n += (size_t)snprintf(buf, len, "metadata commits failing for %llu s (%s)",
				      (unsigned long long)(meta_ms / 1000), strerror(-meta_err));
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
		if (d->unanswered_ms >= HEALTH_UNANSWERED_MS)
			n += (size_t)snprintf(
			    buf + n, n < len ? len - n : 0,
			    "%s%s: no request finished for %llu s (%u in flight)", n ? ", " : "",
			    d->name, (unsigned long long)(d->unanswered_ms / 1000),
			    d->inflight_demand + d->inflight_prefetch + d->inflight_wb);
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
	t = tier_json(st->dram_capacity, st->dram_used, st->n.dram_read_bytes,
		      st->n.dram_write_bytes, st->n.dram_read_ops, st->n.dram_write_ops, 0);
	json_object_set_new(t, "huge_pages", json_boolean(st->huge_pages));
	json_object_set_new(t, "thp_bytes", json_integer((json_int_t)st->thp_bytes));
	json_object_set_new(t, "locked", json_boolean(st->locked));
	json_object_set_new(t, "zero_copy_write_bytes",
			    json_integer((json_int_t)st->n.swapped_write_bytes));
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
		json_object_set_new(v, "unanswered_ms", json_integer((json_int_t)d->unanswered_ms));
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
	const struct fs_count cache[] = {
	    {"hits", st->n.hits},
	    {"misses", st->n.misses},
	    {"evictions", st->n.evictions},
	    {"dirty_bytes", st->dirty_bytes},
	    {"writeback_bytes", st->n.writeback_bytes},
	    {"holes_written", st->n.holes_written},
	    {"writeback_errors", st->n.wb_errors},
	    {"syncs", st->n.syncs},
	    {"backpressure_waits", st->n.backpressure_waits},
	    {"recent_writeback_errors", st->recent_wb_errors},
	    {"writeback_stall_ms", st->stall_ms},
	    {"partial_blocks", st->n.partial_created},
	    {"partial_merged", st->n.partial_merged},
	    {"pinned_bytes", st->pinned_bytes},
	    {"pin_limit_bytes", st->pin_limit_bytes},
	    {"hot_bytes", st->hot_bytes},
	    {"ghost_hits", st->n.ghost_hits},
	    {"unsynced_blocks", st->unsynced_blocks},
	    {"expired_bytes", st->expired_bytes},
	    {"rewritten_bytes", st->rewritten_bytes},
	    {"dirty_limit_bytes", st->dirty_limit_bytes},
	    {"dirty_background_bytes", st->dirty_background_bytes},
	    {"kept_bytes", st->kept_bytes},
	    {"kept_evicted_bytes", st->kept_evicted_bytes},
	};
	json_t *cj = json_object();
	uint64_t lookups = st->n.hits + st->n.misses;
	fs_json_counts(cj, cache, sizeof(cache) / sizeof(cache[0]));
	json_object_set_new(cj, "hit_rate",
			    json_real(lookups ? (double)st->n.hits / (double)lookups : 0.0));
	json_object_set_new(cj, "policy", json_string(policy_names[fs->cfg->policy]));
	json_object_set_new(root, "cache", cj);
	char health[1024];
	health_text(st, fs->meta, health, sizeof(health));
	json_object_set_new(root, "health", json_string(health));
	json_object_set_new(root, "health_window_s", json_integer(st->health_window_s));
	json_object_set_new(
	    root, "prefetch",
	    json_pack(
		"{sIsIsIsIsIsIsIsf}", "issued", (json_int_t)st->n.prefetch_issued, "used",
		(json_int_t)st->n.prefetch_used, "wasted", (json_int_t)st->n.prefetch_wasted,
		"late", (json_int_t)st->n.prefetch_late, "promoted",
		(json_int_t)st->n.prefetch_promoted, "refused", (json_int_t)st->n.prefetch_refused,
		"depth_blocks", (json_int_t)st->prefetch_depth, "accuracy",
		st->n.prefetch_issued ? (double)st->n.prefetch_used / (double)st->n.prefetch_issued
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
	const struct fs_count ops[] = {{"lookup", c.lookups},
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
	fs_json_counts(f, ops, sizeof(ops) / sizeof(ops[0]));
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
	json_object_set_new(root, "dedup",
			    json_pack("{sIsIsfsIsIsI}", "logical_bytes",
				      (json_int_t)(mapped * st->block_size), "physical_bytes",
				      (json_int_t)(blocks * st->block_size), "ratio",
				      blocks ? (double)mapped / (double)blocks : 1.0, "hits",
				      (json_int_t)st->n.dedup_hits, "verify_mismatches",
				      (json_int_t)st->n.dedup_verify_mismatch, "verify_from_dram",
				      (json_int_t)st->n.dedup_verify_cached));
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
	json_object_set_new(root, "scratch", json_boolean(c->scratch));
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

void fs_ctl_open(struct fs *fs, fuse_req_t req, uint64_t ino, struct fuse_file_info *fi)
{
	struct ctl_buf *b;
	json_t *j = NULL;

	if (ino == FS_CTL_DIR_INO) {
		fuse_reply_err(req, EISDIR);
		return;
	}
	if (ino == FS_CTL_CTL_INO) {
		if ((fi->flags & O_ACCMODE) != O_WRONLY || !fs_ctl_may_steer(req)) {
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
	    ((ino == FS_CTL_PINS_INO || ino == FS_CTL_SCRUB_INO) && !fs_ctl_may_steer(req))) {
		fuse_reply_err(req, EACCES);
		return;
	}
	b = calloc(1, sizeof(*b));
	if (!b) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	if (ino == FS_CTL_METRICS_INO) {
		b->data = fs_ctl_metrics_text(fs, &b->len);
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
	ctl_buf_link(fs, b);
	if (fuse_reply_open(req, fi) != 0)
		ctl_buf_free(fs, b);
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

void fs_ctl_release(struct fs *fs, fuse_req_t req, struct fuse_file_info *fi)
{
	struct ctl_buf *b = (struct ctl_buf *)(uintptr_t)fi->fh;

	if (b)
		ctl_buf_free(fs, b);
	fuse_reply_err(req, 0);
}


/*
 * ctl_metrics.c - /.tensorfs/metrics: the counters of stats in Prometheus'
 * text exposition format (version 0.0.4), each sample labelled with the
 * mount point, generated whole at open (ctl.c calls metrics_text).
 *
 * It may call the block store's and the learner's stats and the store's
 * counts; nothing of ops, ctl.c, ctl_run.c or gpu.
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

char *metrics_text(struct fs *fs, size_t *len)
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

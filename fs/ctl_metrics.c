/*
 * ctl_metrics.c - /.tensorfs/metrics: the counters of stats in Prometheus'
 * text exposition format (version 0.0.4), each sample labelled with the
 * mount point, generated whole at open (ctl.c calls fs_ctl_metrics_text).
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
#include <stddef.h>
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

/* What each tier's samples are made of: the dram tier's, or a device's. */
struct tier_row {
	char label[48];
	double cap, used, rb, wb, ro, wo, err, up, rbps, wbps;
	double full, avail, recent_err;
	double q, in_demand, in_prefetch, in_wb;
	double requests, weight, capable, objects, dead, slab, returned, sum_err, lat;
	bool dev;
};

/* A metric with one sample per tier (per device: devs_only), from a field of tier_row. */
struct tier_metric {
	const char *name, *type, *help;
	size_t field; /* offsetof(struct tier_row, ...) */
	bool devs_only;
};

#define ROW(f) offsetof(struct tier_row, f)

static const struct tier_metric tier_metrics[] = {
    {"tier_capacity_bytes", "gauge", "Capacity of the tier.", ROW(cap), false},
    {"tier_used_bytes", "gauge", "Bytes in use in the tier.", ROW(used), false},
    {"tier_read_bytes_total", "counter", "Bytes read from the tier.", ROW(rb), false},
    {"tier_write_bytes_total", "counter", "Bytes written to the tier.", ROW(wb), false},
    {"tier_read_ops_total", "counter", "Reads served by the tier.", ROW(ro), false},
    {"tier_write_ops_total", "counter", "Writes made to the tier.", ROW(wo), false},
    {"tier_read_bytes_per_second", "gauge", "Read rate of the tier over about the last second.",
     ROW(rbps), false},
    {"tier_write_bytes_per_second", "gauge", "Write rate of the tier over about the last second.",
     ROW(wbps), false},
    {"tier_errors_total", "counter", "I/O errors of the device.", ROW(err), true},
    {"tier_up", "gauge", "1 while the device is not down.", ROW(up), true},
    {"tier_full", "gauge",
     "1 while the device is full: no room left, or a write said ENOSPC since the last that "
     "succeeded.",
     ROW(full), true},
    {"tier_avail_bytes", "gauge",
     "Bytes the device can still take (its filesystem's free space counts).", ROW(avail), true},
    {"tier_recent_errors", "gauge", "I/O errors of the device in the last health window (60 s).",
     ROW(recent_err), true},
    {"tier_checksum_errors_total", "counter",
     "Blocks read from the device that did not match their hash.", ROW(sum_err), true},
    {"tier_queued", "gauge", "Requests waiting for the device.", ROW(q), true},
    {"tier_requests_total", "counter", "Requests made to the device (HTTP requests for s3).",
     ROW(requests), true},
    /* Requests per GB: tier_requests_total over the byte counters, in the query. */
    {"tier_read_latency_seconds", "gauge",
     "Recent read latency of the device (a moving average of its reads).", ROW(lat), true},
    {"tier_placement_weight", "gauge", "Weight of the device in placing new blocks.", ROW(weight),
     true},
    {"tier_capable_bytes_per_second", "gauge", "What the device moved when driven hard.",
     ROW(capable), true},
    {"tier_objects", "gauge", "Objects the device stores (s3).", ROW(objects), true},
    {"tier_dead_bytes", "gauge", "Bytes in stored objects that no block uses (s3).", ROW(dead),
     true},
    {"tier_slab_bytes", "gauge", "What the slab file takes on its filesystem (nvme, pfs).",
     ROW(slab), true},
    {"tier_returned_bytes_total", "counter",
     "Free slab space given back to the filesystem (nvme, pfs).", ROW(returned), true},
};

/* Each metric of tier_metrics, with a sample per row of rows[0..n). */
static void tier_metrics_out(struct mout *o, const struct tier_row *rows, unsigned n)
{
	for (size_t m = 0; m < sizeof(tier_metrics) / sizeof(tier_metrics[0]); m++) {
		const struct tier_metric *t = &tier_metrics[m];

		metric_head(o, t->name, t->type, t->help);
		for (unsigned i = 0; i < n; i++) {
			double v;

			if (t->devs_only && !rows[i].dev)
				continue;
			/* the row's double that t names */
			memcpy(&v, (const char *)&rows[i] + t->field, sizeof(v));
			metric(o, t->name, rows[i].label, v);
		}
	}
}

/* A metric of one sample, its value taken at the scrape. */
struct scalar {
	const char *name, *type;
	double v;
	const char *help;
};

/* Each metric of s[0..n). */
static void scalars_out(struct mout *o, const struct scalar *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		metric1(o, s[i].name, s[i].type, s[i].help, s[i].v);
}

/* The rows of the dram tier and of each device in st, their rates left 0. */
static void tier_rows(const struct tb_stats *st, struct tier_row *rows)
{
	rows[0] = (struct tier_row){
	    .cap = (double)st->dram_capacity,
	    .used = (double)st->dram_used,
	    .rb = (double)st->n.dram_read_bytes,
	    .wb = (double)st->n.dram_write_bytes,
	    .ro = (double)st->n.dram_read_ops,
	    .wo = (double)st->n.dram_write_ops,
	    .up = 1,
	};
	snprintf(rows[0].label, sizeof(rows[0].label), "tier=\"dram\"");
	for (unsigned i = 0; i < st->n_devs; i++) {
		const struct tb_dev_stats *d = &st->dev[i];
		struct tier_row *r = &rows[i + 1];

		*r = (struct tier_row){
		    .dev = true,
		    .cap = (double)d->capacity,
		    .used = (double)d->used,
		    .rb = (double)d->read_bytes,
		    .wb = (double)d->write_bytes,
		    .ro = (double)d->read_ops,
		    .wo = (double)d->write_ops,
		    .err = (double)d->errors,
		    .avail = (double)d->avail,
		    .recent_err = (double)d->recent_errors,
		    .requests = (double)d->requests,
		    .capable = (double)d->bw_capable,
		    .objects = (double)d->objects,
		    .dead = (double)d->dead_bytes,
		    .slab = (double)d->slab_bytes,
		    .returned = (double)d->returned_bytes,
		    .sum_err = (double)d->checksum_errors,
		    .lat = (double)d->read_latency_us / 1e6,
		    .up = d->up,
		    .full = d->full,
		    .q = d->queued,
		    .in_demand = d->inflight_demand,
		    .in_prefetch = d->inflight_prefetch,
		    .in_wb = d->inflight_wb,
		    .weight = d->weight,
		};
		snprintf(r->label, sizeof(r->label), "tier=\"%s\"", d->name);
	}
}

char *fs_ctl_metrics_text(struct fs *fs, size_t *len)
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

	tier_rows(st, rows);
	n = st->n_devs + 1;
	pthread_mutex_lock(&fs->rate_lock);
	for (unsigned i = 0; i < n; i++) {
		rows[i].rbps = fs->rate_rbps[i];
		rows[i].wbps = fs->rate_wbps[i];
	}
	pthread_mutex_unlock(&fs->rate_lock);

	metric_head(f, "build_info", "gauge", "Version of the running tensorfs.");
	metric(f, "build_info", "version=\"" TFS_VERSION "\"", 1);
	metric1(f, "block_size_bytes", "gauge", "Block size of the store.", (double)st->block_size);
	tier_metrics_out(f, rows, n);
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

	const struct scalar store[] = {
	    {"cache_hits_total", "counter", (double)st->n.hits, "Block lookups served from DRAM."},
	    {"cache_misses_total", "counter", (double)st->n.misses,
	     "Block lookups that had to load."},
	    {"cache_evictions_total", "counter", (double)st->n.evictions,
	     "Blocks evicted from DRAM."},
	    {"cache_dirty_bytes", "gauge", (double)st->dirty_bytes,
	     "Bytes written and not yet written back."},
	    {"cache_dirty_limit_bytes", "gauge", (double)st->dirty_limit_bytes,
	     "The dirty mark: writers wait above it (dirty=)."},
	    {"cache_pinned_bytes", "gauge", (double)st->pinned_bytes,
	     "Resident bytes of pinned files."},
	    {"cache_kept_bytes", "gauge", (double)st->kept_bytes,
	     "Bytes the learned cycle keeps resident from one use to the next."},
	    {"cache_writeback_bytes_total", "counter", (double)st->n.writeback_bytes,
	     "Bytes written back from DRAM."},
	    {"cache_writeback_errors_total", "counter", (double)st->n.wb_errors,
	     "Failed write-backs."},
	    {"cache_writeback_recent_errors", "gauge", (double)st->recent_wb_errors,
	     "Failed write-backs in the last health window (60 s)."},
	    {"cache_writeback_stall_seconds", "gauge", (double)st->stall_ms / 1000,
	     "How long every write-back has failed, none succeeding; 0: not stalled."},
	    {"cache_syncs_total", "counter", (double)st->n.syncs, "Sync points made durable."},
	    {"cache_backpressure_waits_total", "counter", (double)st->n.backpressure_waits,
	     "Writers that waited at the dirty mark."},
	    {"prefetch_issued_total", "counter", (double)st->n.prefetch_issued,
	     "Blocks loaded ahead of use."},
	    {"prefetch_used_total", "counter", (double)st->n.prefetch_used,
	     "Prefetched blocks read before eviction."},
	    {"prefetch_wasted_total", "counter", (double)st->n.prefetch_wasted,
	     "Prefetched blocks evicted unread."},
	    {"prefetch_late_total", "counter", (double)st->n.prefetch_late,
	     "Demand reads that waited for a prefetch in flight."},
	    {"prefetch_promoted_total", "counter", (double)st->n.prefetch_promoted,
	     "Late prefetches still queued, moved to the demand class."},
	    {"prefetch_refused_total", "counter", (double)st->n.prefetch_refused,
	     "Prefetches not issued: every slot held a block needed sooner."},
	    {"learner_cycle_files", "gauge", (double)ls.period,
	     "Files in the learned access cycle."},
	    {"learner_cycle_bytes", "gauge", (double)ls.bytes,
	     "Bytes in the learned access cycle."},
	    {"learner_confidence", "gauge", ls.confidence,
	     "Confidence in the learned cycle, 0 to 1."},
	    {"dedup_logical_bytes", "gauge", (double)mapped * (double)st->block_size,
	     "Bytes of committed blocks mapped by files."},
	    {"dedup_physical_bytes", "gauge", (double)blocks * (double)st->block_size,
	     "Bytes of committed blocks stored."},
	    {"dedup_hits_total", "counter", (double)st->n.dedup_hits,
	     "Blocks stored as a reference at write-back."},
	    {"meta_inodes", "gauge", (double)inodes, "Inodes in the metadata store."},
	    {"meta_file_bytes", "gauge", (double)sp.file_bytes,
	     "Size of the metadata store's file (data.mdb)."},
	    {"meta_disk_bytes", "gauge", (double)sp.disk_bytes,
	     "What the metadata store's file takes on its filesystem."},
	    {"meta_used_bytes", "gauge", (double)sp.used_bytes,
	     "The metadata store's pages up to the highest in use."},
	    {"meta_tree_bytes", "gauge", (double)sp.tree_bytes,
	     "The metadata store's pages in its trees: the live metadata."},
	    {"meta_free_bytes", "gauge", (double)sp.free_bytes,
	     "The metadata store's pages free for reuse once no reader needs them."},
	    {"meta_unsynced_commits", "gauge", (double)st->unsynced_commits,
	     "Metadata commits since the last sync point."},
	    {"checksum_verified_total", "counter", (double)st->checksum_verified,
	     "Blocks read from the devices and checked against their hash."},
	    {"checksum_unverified_total", "counter", (double)st->checksum_unverified,
	     "Blocks read from the devices unchecked (no hash stored, or checksum=off)."},
	    {"checksum_errors_total", "counter", (double)st->checksum_errors,
	     "Blocks read from the devices that did not match their hash (EIO)."},
	};
	scalars_out(f, store, sizeof(store) / sizeof(store[0]));

	struct {
		const char *name;
		uint64_t v;
	} ops[] = {
	    {"lookup", c.lookups}, {"getattr", c.getattrs},	  {"setattr", c.setattrs},
	    {"open", c.opens},	   {"create", c.creates},	  {"read", c.reads},
	    {"write", c.writes},   {"fsync", c.fsyncs},		  {"unlink", c.unlinks},
	    {"rename", c.renames}, {"copy_file_range", c.copies}, {"fallocate", c.fallocates}};
	metric_head(f, "fuse_ops_total", "counter", "FUSE requests, by operation.");
	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
		char label[48];

		snprintf(label, sizeof(label), "op=\"%s\"", ops[i].name);
		metric(f, "fuse_ops_total", label, (double)ops[i].v);
	}
	const struct scalar fuse[] = {
	    {"fuse_read_bytes_total", "counter", (double)c.read_bytes, "Bytes read through FUSE."},
	    {"fuse_write_bytes_total", "counter", (double)c.write_bytes,
	     "Bytes written through FUSE."},
	    {"fuse_errors_total", "counter", (double)c.errors,
	     "FUSE requests answered with an error."},
	    {"fuse_write_parked_total", "counter", (double)c.writes_parked,
	     "Writes that waited for dirty room off the threads serving /dev/fuse."},
	};
	scalars_out(f, fuse, sizeof(fuse) / sizeof(fuse[0]));
	free(st);
	if (fclose(out.f) != 0) {
		free(buf);
		return NULL;
	}
	return buf;
}

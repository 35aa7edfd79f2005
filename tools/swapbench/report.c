/*
 * report.c - swapbench's output.
 *
 * Ranks run at once, so a phase of the run is summed over them: bytes add
 * up, times are the slowest rank's, and a rate is the sum of each rank's
 * bytes over its own time with transfers in flight.  The steady state is the
 * median of iterations 2..N (iteration 1 writes files for the first time and
 * creates m and v).  JSON goes out through jansson.
 */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "report.h"

#define RP_GB 1e9
#define RP_MB 1e6
#define RP_KB 1e3
#define RP_KIB 1024u

/* One phase over all ranks. */
struct rp_agg {
	double read_s, write_s, compute_s, verify_s, total_s;
	uint64_t read_bytes, write_bytes;
	double read_gbps, write_gbps;
};

static double rate(uint64_t bytes, double s)
{
	return s > 0 ? (double)bytes / s / RP_GB : 0;
}

static double max2(double a, double b)
{
	return a > b ? a : b;
}

static struct rp_agg aggregate(const struct sb_config *cfg, const struct sb_rank *ranks, int k)
{
	struct rp_agg a = {0};

	for (int i = 0; i < cfg->ranks; i++) {
		const struct sb_phase *p = k ? &ranks[i].iters[k - 1] : &ranks[i].init;

		a.read_s = max2(a.read_s, p->read_s);
		a.write_s = max2(a.write_s, p->write_s);
		a.compute_s = max2(a.compute_s, p->compute_s);
		a.verify_s = max2(a.verify_s, p->verify_s);
		a.total_s = max2(a.total_s, p->total_s);
		a.read_bytes += p->read_bytes;
		a.write_bytes += p->write_bytes;
		a.read_gbps += rate(p->read_bytes, p->read_s);
		a.write_gbps += rate(p->write_bytes, p->write_s);
	}
	return a;
}

/*
 * v in decimal units: "1.23 G" with 2 decimals, "4.5 M" (and "6.7 k" where
 * kilo) with 1, else whole; sp between the number and the unit, then unit.
 */
static const char *fmt_si(char *buf, size_t n, uint64_t v, const char *sp, const char *unit,
			  bool kilo)
{
	if (v >= RP_GB)
		snprintf(buf, n, "%.2f%sG%s", (double)v / RP_GB, sp, unit);
	else if (v >= RP_MB)
		snprintf(buf, n, "%.1f%sM%s", (double)v / RP_MB, sp, unit);
	else if (kilo && v >= RP_KB)
		snprintf(buf, n, "%.1f%sk%s", (double)v / RP_KB, sp, unit);
	else
		snprintf(buf, n, "%" PRIu64 "%s%s", v, sp, unit);
	return buf;
}

static const char *fmt_bytes(char *buf, size_t n, uint64_t b)
{
	return fmt_si(buf, n, b, " ", "B", true);
}

static const char *fmt_binary(char *buf, size_t n, uint64_t b)
{
	static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
	unsigned u = 0;

	while (u + 1 < sizeof(units) / sizeof(units[0]) && b >= RP_KIB && b % RP_KIB == 0) {
		b /= RP_KIB;
		u++;
	}
	snprintf(buf, n, "%" PRIu64 " %s", b, units[u]);
	return buf;
}

static const char *fmt_count(char *buf, size_t n, uint64_t c)
{
	return fmt_si(buf, n, c, "", "", false);
}

static const char *swapper_name(const struct sb_config *cfg)
{
	return cfg->swapper == SB_SWAPPER_PIPELINED ? "pipelined" : "partitioned";
}

static const char *workload_name(const struct sb_config *cfg)
{
	return cfg->workload == SB_WORKLOAD_ZERO ? "zero" : "activations";
}

static const char *verify_mode(const struct sb_config *cfg)
{
	if (!cfg->verify)
		return "off";
	return cfg->verify_full ? "full" : "sparse";
}

void report_header(const struct sb_config *cfg, const struct sb_plan *plan)
{
	char a[32], b[32], c[32];
	uint64_t ranks = (uint64_t)cfg->ranks;

	if (cfg->json)
		return;
	printf("swapbench %s: %s, %d rank%s, folder %s\n", TFS_VERSION,
	       cfg->workload == SB_WORKLOAD_ZERO ? "ZeRO-Infinity" : "activation offloading",
	       cfg->ranks, cfg->ranks > 1 ? "s" : "", cfg->dir);
	if (cfg->workload == SB_WORKLOAD_ZERO) {
		printf("model:    %s parameters (hidden %" PRIu64 ", %" PRIu64 " layers, %" PRIu64
		       " tensors), sub-group %s elements\n",
		       fmt_count(a, sizeof(a), plan->model_params), plan->hidden,
		       plan->model_layers, plan->tensors,
		       fmt_count(b, sizeof(b), cfg->sub_group_size));
		printf("swapper:  %s%s\n", swapper_name(cfg),
		       cfg->offload_params ? ", parameters on NVMe" : "");
		printf("per rank: %" PRIu64 " subgroups (%" PRIu64 " on disk), %" PRIu64
		       " files (%" PRIu64 " state, %" PRIu64 " gradient, %" PRIu64 " parameter)\n",
		       plan->subgroups, plan->swapped_groups, plan->files, plan->swapped_groups * 3,
		       plan->grad_files, plan->param_files);
	} else {
		printf("per rank: %d micro-batches x %d layers of %s, %s after use, %" PRIu64
		       " files\n",
		       cfg->micro_batches, cfg->layers, fmt_binary(a, sizeof(a), cfg->act_size),
		       cfg->act_reuse == SB_ACT_DELETE ? "deleted" : "overwritten", plan->files);
	}
	printf("aio:      %d thread%s, queue depth %d, block %s, %s, %s\n", cfg->threads,
	       cfg->threads > 1 ? "s" : "", cfg->queue_depth,
	       fmt_binary(a, sizeof(a), cfg->block_size),
	       cfg->overlap_events ? "overlap events" : "no overlap events",
	       cfg->single_submit ? "single submit" : "block submit");
	printf("per iteration (all ranks): read %s, write %s; buffers %s per rank\n",
	       fmt_bytes(a, sizeof(a), plan->read_bytes * ranks),
	       fmt_bytes(b, sizeof(b), plan->write_bytes * ranks),
	       fmt_bytes(c, sizeof(c), plan->buffer_bytes));
	printf("verify:   %s\n\n", verify_mode(cfg));
	printf("%5s %9s %9s %9s %9s %10s %10s\n", "iter", "read_s", "write_s", "compute_s",
	       "total_s", "read GB/s", "write GB/s");
	fflush(stdout);
}

void report_phase(const struct sb_config *cfg, const struct sb_rank *ranks, int k)
{
	struct rp_agg a = aggregate(cfg, ranks, k);
	char it[16];

	if (cfg->json)
		return;
	if (k == 0 && cfg->workload != SB_WORKLOAD_ZERO)
		return;
	if (k == 0)
		snprintf(it, sizeof(it), "init");
	else
		snprintf(it, sizeof(it), "%d", k);
	printf("%5s %9.3f %9.3f %9.3f %9.3f %10.2f %10.2f\n", it, a.read_s, a.write_s, a.compute_s,
	       a.total_s, a.read_gbps, a.write_gbps);
	fflush(stdout);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static double median(double *v, int n)
{
	if (n == 0)
		return 0;
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

struct rp_steady {
	int first, last; /* iterations the medians cover */
	double total_s, read_gbps, write_gbps;
	/*
	 * Each rank's own median over the same iterations, and the slowest
	 * and fastest of those: ranks that share one mount and its DRAM tier
	 * should take about as long (an iteration waits for the slowest).
	 */
	double *rank_s;
	double rank_min_s, rank_max_s;
};

/* Each rank's median iteration time over s->first..s->last. */
static int rank_medians(const struct sb_config *cfg, const struct sb_rank *ranks,
			struct rp_steady *s)
{
	int n = s->last - s->first + 1;
	double *t = calloc((size_t)(n > 0 ? n : 1), sizeof(double));

	s->rank_s = calloc((size_t)cfg->ranks, sizeof(double));
	if (!t || !s->rank_s) {
		free(t);
		free(s->rank_s);
		s->rank_s = NULL;
		return -ENOMEM;
	}
	for (int i = 0; i < cfg->ranks; i++) {
		for (int k = s->first; k <= s->last; k++)
			t[k - s->first] = ranks[i].iters[k - 1].total_s;
		s->rank_s[i] = median(t, n > 0 ? n : 0);
		if (!i || s->rank_s[i] < s->rank_min_s)
			s->rank_min_s = s->rank_s[i];
		if (!i || s->rank_s[i] > s->rank_max_s)
			s->rank_max_s = s->rank_s[i];
	}
	free(t);
	return 0;
}

static int steady(const struct sb_config *cfg, const struct sb_rank *ranks, int done,
		  struct rp_steady *s)
{
	int n = 0;
	double *t = calloc((size_t)done + 1, sizeof(double));
	double *r = calloc((size_t)done + 1, sizeof(double));
	double *w = calloc((size_t)done + 1, sizeof(double));

	memset(s, 0, sizeof(*s));
	if (!t || !r || !w) {
		free(t);
		free(r);
		free(w);
		return -ENOMEM;
	}
	s->first = done >= 2 ? 2 : 1;
	s->last = done;
	for (int k = s->first; k <= done; k++, n++) {
		struct rp_agg a = aggregate(cfg, ranks, k);

		t[n] = a.total_s;
		r[n] = a.read_gbps;
		w[n] = a.write_gbps;
	}
	s->total_s = median(t, n);
	s->read_gbps = median(r, n);
	s->write_gbps = median(w, n);
	free(t);
	free(r);
	free(w);
	return done > 0 ? rank_medians(cfg, ranks, s) : 0;
}

static struct sb_verify verify_total(const struct sb_config *cfg, const struct sb_rank *ranks)
{
	struct sb_verify v = {0};

	for (int i = 0; i < cfg->ranks; i++) {
		v.checked_bytes += ranks[i].verify.checked_bytes;
		v.errors += ranks[i].verify.errors;
	}
	return v;
}

/* Phase k's figures; "iter": k first, for an iteration (k > 0). */
static json_t *json_phase(const struct rp_agg *a, int k)
{
	json_t *o = k > 0 ? json_pack("{si}", "iter", k) : json_object();
	json_t *v = json_pack("{sfsfsfsfsfsIsIsfsf}", "read_s", a->read_s, "write_s", a->write_s,
			      "compute_s", a->compute_s, "verify_s", a->verify_s, "total_s",
			      a->total_s, "read_bytes", (json_int_t)a->read_bytes, "write_bytes",
			      (json_int_t)a->write_bytes, "read_gbps", a->read_gbps, "write_gbps",
			      a->write_gbps);

	json_object_update(o, v);
	json_decref(v);
	return o;
}

static json_t *json_config(const struct sb_config *cfg, const struct sb_plan *plan)
{
	json_t *o = json_object();
	json_int_t ranks = cfg->ranks;

	json_object_set_new(o, "version", json_string(TFS_VERSION));
	json_object_set_new(o, "workload", json_string(workload_name(cfg)));
	json_object_set_new(o, "dir", json_string(cfg->dir));
	json_object_set_new(o, "iters", json_integer(cfg->iters));
	json_object_set_new(o, "ranks", json_integer(cfg->ranks));
	json_object_set_new(o, "threads", json_integer(cfg->threads));
	json_object_set_new(o, "queue_depth", json_integer(cfg->queue_depth));
	json_object_set_new(o, "block_size", json_integer((json_int_t)cfg->block_size));
	json_object_set_new(o, "overlap_events", json_boolean(cfg->overlap_events));
	json_object_set_new(o, "single_submit", json_boolean(cfg->single_submit));
	json_object_set_new(o, "verify", json_string(verify_mode(cfg)));
	json_object_set_new(o, "compute_ms", json_real(cfg->compute_ms));
	json_object_set_new(o, "compute_gbps", json_real(cfg->compute_gbps));
	json_object_set_new(o, "files", json_integer((json_int_t)plan->files * ranks));
	json_object_set_new(o, "read_bytes_per_iter",
			    json_integer((json_int_t)plan->read_bytes * ranks));
	json_object_set_new(o, "write_bytes_per_iter",
			    json_integer((json_int_t)plan->write_bytes * ranks));
	json_object_set_new(o, "buffer_bytes_per_rank",
			    json_integer((json_int_t)plan->buffer_bytes));
	if (cfg->workload == SB_WORKLOAD_ACTIVATIONS) {
		json_object_set_new(o, "layers", json_integer(cfg->layers));
		json_object_set_new(o, "act_size", json_integer((json_int_t)cfg->act_size));
		json_object_set_new(o, "micro_batches", json_integer(cfg->micro_batches));
		json_object_set_new(
		    o, "act_reuse",
		    json_string(cfg->act_reuse == SB_ACT_DELETE ? "delete" : "overwrite"));
		return o;
	}
	json_object_set_new(o, "swapper", json_string(swapper_name(cfg)));
	json_object_set_new(o, "params", json_integer((json_int_t)cfg->params));
	json_object_set_new(o, "model_params", json_integer((json_int_t)plan->model_params));
	json_object_set_new(o, "hidden", json_integer((json_int_t)plan->hidden));
	json_object_set_new(o, "model_layers", json_integer((json_int_t)plan->model_layers));
	json_object_set_new(o, "tensors", json_integer((json_int_t)plan->tensors));
	json_object_set_new(o, "sub_group_size", json_integer((json_int_t)cfg->sub_group_size));
	json_object_set_new(o, "subgroups", json_integer((json_int_t)plan->subgroups));
	json_object_set_new(o, "swapped_subgroups", json_integer((json_int_t)plan->swapped_groups));
	json_object_set_new(o, "gradient_files", json_integer((json_int_t)plan->grad_files));
	json_object_set_new(o, "offload_params", json_boolean(cfg->offload_params));
	json_object_set_new(o, "param_dtype", json_string(cfg->param_dtype));
	json_object_set_new(o, "param_files", json_integer((json_int_t)plan->param_files));
	json_object_set_new(o, "buffer_count", json_integer(cfg->optimizer_buffers));
	json_object_set_new(o, "param_buffer_count", json_integer(cfg->param_buffers));
	json_object_set_new(o, "init_bytes", json_integer((json_int_t)plan->init_bytes * ranks));
	return o;
}

static int summary_json(const struct sb_config *cfg, const struct sb_plan *plan,
			const struct sb_rank *ranks, int done, int status,
			const struct rp_steady *s, const struct sb_verify *v)
{
	json_t *root = json_object();
	json_t *iters = json_array();
	json_t *st = json_object();
	json_t *ver = json_object();
	int ret = 0;

	if (!root || !iters || !st || !ver) {
		ret = -ENOMEM;
		goto cleanup;
	}
	json_object_set_new(root, "config", json_config(cfg, plan));
	if (cfg->workload == SB_WORKLOAD_ZERO && done >= 0) {
		struct rp_agg a = aggregate(cfg, ranks, 0);

		json_object_set_new(root, "init", json_phase(&a, 0));
	}
	for (int k = 1; k <= done; k++) {
		struct rp_agg a = aggregate(cfg, ranks, k);
		json_t *it = json_phase(&a, k), *rt = json_array();

		/* each rank's own time, where the phase's is the slowest one's */
		for (int i = 0; rt && i < cfg->ranks; i++)
			json_array_append_new(rt, json_real(ranks[i].iters[k - 1].total_s));
		json_object_set_new(it, "rank_total_s", rt);
		json_array_append_new(iters, it);
	}
	json_object_set(root, "iterations", iters);
	json_object_set_new(st, "first_iter", json_integer(s->first));
	json_object_set_new(st, "last_iter", json_integer(s->last));
	json_object_set_new(st, "median_total_s", json_real(s->total_s));
	json_object_set_new(st, "median_read_gbps", json_real(s->read_gbps));
	json_object_set_new(st, "median_write_gbps", json_real(s->write_gbps));
	if (s->rank_s) {
		json_t *rs = json_array();

		for (int i = 0; rs && i < cfg->ranks; i++)
			json_array_append_new(rs, json_real(s->rank_s[i]));
		json_object_set_new(st, "rank_median_total_s", rs);
		json_object_set_new(
		    st, "rank_spread",
		    json_real(s->rank_min_s > 0 ? s->rank_max_s / s->rank_min_s - 1 : 0));
	}
	json_object_set(root, "steady", st);
	json_object_set_new(ver, "checked_bytes", json_integer((json_int_t)v->checked_bytes));
	json_object_set_new(ver, "errors", json_integer((json_int_t)v->errors));
	json_object_set(root, "verify", ver);
	json_object_set_new(root, "exit_status", json_integer(status));
	if (json_dumpf(root, stdout, JSON_INDENT(2)) || fputc('\n', stdout) == EOF)
		ret = -EIO;
	fflush(stdout);
cleanup:
	json_decref(ver);
	json_decref(st);
	json_decref(iters);
	json_decref(root);
	return ret;
}

int report_summary(const struct sb_config *cfg, const struct sb_plan *plan,
		   const struct sb_rank *ranks, int done, int status)
{
	struct rp_steady s;
	struct sb_verify v = verify_total(cfg, ranks);
	char a[32];
	int ret;

	ret = steady(cfg, ranks, done > 0 ? done : 0, &s);
	if (ret)
		return ret;
	if (cfg->json) {
		ret = summary_json(cfg, plan, ranks, done, status, &s, &v);
		free(s.rank_s);
		return ret;
	}
	if (done > 0)
		printf("\nsteady (median of iterations %d-%d): total %.3f s, read %.2f GB/s, "
		       "write %.2f GB/s\n",
		       s.first, s.last, s.total_s, s.read_gbps, s.write_gbps);
	if (done > 0 && cfg->ranks > 1 && s.rank_s)
		printf("ranks (each one's median): fastest %.3f s, slowest %.3f s (+%.0f%%)\n",
		       s.rank_min_s, s.rank_max_s,
		       s.rank_min_s > 0 ? (s.rank_max_s / s.rank_min_s - 1) * 100 : 0.0);
	free(s.rank_s);
	printf("verify: %s checked, %" PRIu64 " error%s\n",
	       fmt_bytes(a, sizeof(a), v.checked_bytes), v.errors, v.errors == 1 ? "" : "s");
	fflush(stdout);
	return 0;
}

/*
 * activations.c - activation offloading as SSDTrain and TBA do it, for one
 * rank.
 *
 * One file per activation tensor, <dir>/activations/rank<R>/mb<M>_layer<L>.act.
 * For each micro-batch the forward pass writes the activation of layers
 * 0..L-1 in order, each write in flight while the next layer computes; the
 * backward pass reads them back in reverse order, each read prefetched while
 * the layer above computes.  Then the files are deleted, or (overwrite) the
 * next micro-batch writes the same files again in place.  I/O goes through
 * the same aio handle as the ZeRO workload; every read is checked.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "aio_handle.h"
#include "stamp.h"
#include "swapbench.h"

/* Buffers: one being produced or consumed while the other is in flight. */
#define ACT_BUFFERS 2
#define ACT_MS_PER_S 1e3
#define ACT_BYTES_PER_GB 1e9

struct act {
	const struct sb_config *cfg;
	struct sb_rank *r;
	char *dir;
	struct sb_file *files; /* [slot * layers + layer] */
	int nslots;	       /* micro-batches with their own files */
	uint64_t bytes;	       /* one activation, padded */
	struct ah_handle *h;
	char *buf[ACT_BUFFERS];
	struct sb_phase *ph;
	int iter;
};

static uint64_t act_bytes(const struct sb_config *cfg)
{
	return sb_align_up(cfg->act_size, (uint64_t)SB_AIO_ALIGNED_BYTES * (uint64_t)cfg->threads);
}

static double layer_time(const struct act *a)
{
	if (a->cfg->compute_gbps > 0)
		return (double)a->bytes / (a->cfg->compute_gbps * ACT_BYTES_PER_GB);
	return a->cfg->compute_ms / ACT_MS_PER_S;
}

static struct sb_file *act_file(struct act *a, int mb, int layer)
{
	return &a->files[(mb % a->nslots) * a->cfg->layers + layer];
}

static int finish(struct act *a, bool read)
{
	return sb_finish(a->h, read, a->ph, &a->r->verify);
}

/* Schedule a read of @f; a file that is gone or of the wrong size counts as an error. */
static int sched_read(struct act *a, const struct sb_file *f, char *buf)
{
	int ret = ah_pread(a->h, f->path, buf, f->bytes);

	if (ret == -EIO || ret == -ENOENT)
		a->r->verify.errors++;
	return ret;
}

/* The forward pass of layer @layer: produce its activation in @buf. */
static void produce(struct act *a, struct sb_file *f, int mb, char *buf)
{
	double t0 = sb_now();

	f->last_iter = a->iter;
	f->last_gen = (uint32_t)mb;
	if (a->cfg->verify) {
		stamp_fill(buf, f->bytes,
			   &(struct stamp_key){f->id, (uint32_t)a->iter, (uint32_t)mb});
		a->ph->verify_s += sb_now() - t0;
	}
	sb_sleep_until(t0 + layer_time(a));
	a->ph->compute_s += sb_now() - t0;
}

/* The backward pass of a layer: use the activation read back into @buf. */
static int consume(struct act *a, const struct sb_file *f, const char *buf)
{
	double t0 = sb_now();
	int ret = 0;

	if (a->cfg->verify) {
		struct stamp_key key = {f->id, (uint32_t)f->last_iter, f->last_gen};

		ret = stamp_check(buf, f->bytes, &key, f->path, &a->r->verify);
		a->ph->verify_s += sb_now() - t0;
	}
	if (!ret)
		sb_sleep_until(t0 + layer_time(a));
	a->ph->compute_s += sb_now() - t0;
	return ret;
}

static int forward(struct act *a, int mb)
{
	int ret = 0;

	for (int l = 0; l < a->cfg->layers && !ret; l++) {
		struct sb_file *f = act_file(a, mb, l);
		char *buf = a->buf[l % ACT_BUFFERS];

		produce(a, f, mb, buf);
		ret = finish(a, false);
		if (!ret)
			ret = ah_pwrite(a->h, f->path, buf, f->bytes);
	}
	if (!ret)
		ret = finish(a, false);
	return ret;
}

static int backward(struct act *a, int mb)
{
	int top = a->cfg->layers - 1;
	int ret;

	ret = sched_read(a, act_file(a, mb, top), a->buf[top % ACT_BUFFERS]);
	for (int l = top; l >= 0 && !ret; l--) {
		struct sb_file *f = act_file(a, mb, l);

		ret = finish(a, true);
		if (!ret && l > 0)
			ret = sched_read(a, act_file(a, mb, l - 1), a->buf[(l - 1) % ACT_BUFFERS]);
		if (!ret)
			ret = consume(a, f, a->buf[l % ACT_BUFFERS]);
		if (!ret && a->cfg->act_reuse == SB_ACT_DELETE && unlink(f->path)) {
			ret = -errno;
			sb_err("unlink %s: %s", f->path, strerror(errno));
		}
	}
	return ret;
}

static int iteration(struct act *a, int k)
{
	double t0 = sb_now();
	int ret = 0;

	a->iter = k;
	a->ph = &a->r->iters[k - 1];
	memset(a->ph, 0, sizeof(*a->ph));
	for (int mb = 0; mb < a->cfg->micro_batches && !ret; mb++) {
		ret = forward(a, mb);
		if (!ret)
			ret = backward(a, mb);
	}
	a->ph->total_s = sb_now() - t0;
	return ret;
}

static int setup(struct act *a)
{
	const struct sb_config *cfg = a->cfg;
	struct ah_config ac = {cfg->threads, cfg->queue_depth, cfg->block_size, cfg->single_submit,
			       cfg->overlap_events};
	int n;
	int ret;

	a->bytes = act_bytes(cfg);
	a->nslots = cfg->act_reuse == SB_ACT_DELETE ? cfg->micro_batches : 1;
	a->dir = sb_path("%s/activations/rank%d", cfg->dir, a->r->rank);
	n = a->nslots * cfg->layers;
	a->files = calloc((size_t)n, sizeof(*a->files));
	if (!a->dir || !a->files)
		return -ENOMEM;
	for (int i = 0; i < n; i++) {
		struct sb_file *f = &a->files[i];

		f->path = sb_path("%s/mb%d_layer%d.act", a->dir, i / cfg->layers, i % cfg->layers);
		if (!f->path)
			return -ENOMEM;
		f->bytes = a->bytes;
		f->id = (uint32_t)a->r->rank << SB_FILE_ID_RANK_SHIFT | (uint32_t)i;
		f->last_iter = -1;
	}
	ret = sb_mkdirs(a->dir);
	if (ret) {
		sb_err("mkdir %s: %s", a->dir, strerror(-ret));
		return ret;
	}
	for (int i = 0; i < ACT_BUFFERS; i++) {
		a->buf[i] = sb_buf_alloc(a->bytes);
		if (!a->buf[i]) {
			sb_err("cannot allocate %llu bytes", (unsigned long long)a->bytes);
			return -ENOMEM;
		}
	}
	return ah_create(&a->h, &ac, "act");
}

static void teardown(struct act *a)
{
	int n = a->nslots * a->cfg->layers;

	ah_destroy(a->h);
	for (int i = 0; i < ACT_BUFFERS; i++)
		free(a->buf[i]);
	for (int i = 0; a->files && i < n; i++)
		free(a->files[i].path);
	free(a->files);
	free(a->dir);
}

static int run_iteration(void *a, int k)
{
	return iteration(a, k);
}

int act_run(const struct sb_config *cfg, struct sb_rank *r)
{
	struct act a = {.cfg = cfg, .r = r};
	int ret;

	ret = setup(&a);
	if (ret)
		goto cleanup;
	r->running = true;
	ret = sb_rank_sync(r, 0);
	if (!ret)
		ret = sb_run_iters(cfg, r, run_iteration, &a);
cleanup:
	teardown(&a);
	return ret;
}

int act_plan(const struct sb_config *cfg, struct sb_plan *plan)
{
	uint64_t per_iter = act_bytes(cfg) * (uint64_t)cfg->layers * (uint64_t)cfg->micro_batches;

	memset(plan, 0, sizeof(*plan));
	plan->files = (uint64_t)cfg->layers *
		      (uint64_t)(cfg->act_reuse == SB_ACT_DELETE ? cfg->micro_batches : 1);
	plan->read_bytes = per_iter;
	plan->write_bytes = per_iter;
	plan->buffer_bytes = ACT_BUFFERS * act_bytes(cfg);
	return 0;
}

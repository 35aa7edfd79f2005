/*
 * zero.c - the ZeRO-Infinity workload of one rank, as stage3.py drives it.
 *
 * Init writes the NVMe-resident parameters, then each subgroup's weights.
 * Each iteration: forward reads the parameters layer by layer; backward reads
 * them again, last layer first, and writes the gradient partitions; the step
 * runs subgroups 0..S-1 with the partitioned swapper (read, compute, write,
 * one after the other) or the pipelined one (i+1 read and i-1 written while
 * i computes).  Every write is stamped, every read checked.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "aio_handle.h"
#include "layout.h"
#include "stamp.h"
#include "swapbench.h"

/* Buffers the partitioned swapper needs at once: weights, m, v, gradients. */
#define ZR_GROUP_BUFFERS 4
/* The pipelined swapper holds three subgroups: reading, computing, writing. */
#define ZR_PIPELINE_SLOTS 3
/* Bytes the optimizer touches per element in a step: weights, m, v, gradient. */
#define ZR_ADAM_BYTES_PER_ELEMENT 16u
#define ZR_MS_PER_S 1e3
#define ZR_BYTES_PER_GB 1e9

struct zr {
	const struct sb_config *cfg;
	struct sb_rank *r;
	struct zl_layout l;
	struct ah_handle *rd;  /* optimizer reads; the only handle when partitioned */
	struct ah_handle *wr;  /* optimizer writes; == rd when partitioned */
	struct ah_handle *prd; /* parameter swapper's read handle */
	struct ah_handle *pwr; /* parameter swapper's write handle */
	char **pool;	       /* optimizer swap buffers, l.state_buffer_bytes each */
	int npool;
	char **pbuf; /* parameter swap buffers, l.largest_param_bytes each */
	int *pfile;  /* file read into each of them */
	int npbuf;
	struct sb_phase *ph; /* phase being measured */
	int iter;	     /* 0: init */
	bool in_compute;     /* a compute phase is timing itself */
	int trace_fd;	     /* --trace, or -1 */
};

/* --trace: one line, in one write, as phase @what of subgroup @group starts. */
static void trace(struct zr *z, const char *what, int group)
{
	char line[128];
	int n;

	if (z->trace_fd < 0)
		return;
	n = snprintf(line, sizeof(line), "%.6f %d %d %s %d\n", sb_now(), z->r->rank, z->iter,
		     what, group);
	if (write(z->trace_fd, line, (size_t)n) != n) {
		sb_err("--trace: %s; no more lines", strerror(errno));
		close(z->trace_fd); /* the log is best effort; the run goes on */
		z->trace_fd = -1;
	}
}

/* Copy of AsyncTensorSwapper: gradients packed into buffers, written async. */
struct grad_swapper {
	struct zr *z;
	int nbufs;
	int cur; /* buffer being filled, -1: none */
	uint64_t used;
	struct sb_file **files; /* tensors in the buffer being filled */
	char **ptrs;
	int nqueued;
};

static int pool_count(const struct sb_config *cfg)
{
	int need = cfg->swapper == SB_SWAPPER_PIPELINED ? ZR_PIPELINE_SLOTS * ZR_GROUP_BUFFERS
							: ZR_GROUP_BUFFERS;

	return cfg->optimizer_buffers > need ? cfg->optimizer_buffers : need;
}

static void account_cpu(struct zr *z, double dt)
{
	z->ph->verify_s += dt;
	if (!z->in_compute)
		z->ph->compute_s += dt;
}

/* Stamp @buf as the next write of @f, and record that write. */
static void stamp_write(struct zr *z, struct sb_file *f, void *buf)
{
	double t0;

	f->last_iter = z->iter;
	f->last_gen = 0;
	if (!z->cfg->verify)
		return;
	t0 = sb_now();
	stamp_fill(buf, f->bytes, &(struct stamp_key){f->id, (uint32_t)z->iter, 0});
	account_cpu(z, sb_now() - t0);
}

/* Check that @buf holds what the last write of @f put there. */
static int check_read(struct zr *z, const struct sb_file *f, const void *buf)
{
	double t0;
	int ret;

	assert(f->last_iter >= 0);
	if (!z->cfg->verify)
		return 0;
	t0 = sb_now();
	ret = stamp_check(buf, f->bytes, &(struct stamp_key){f->id, (uint32_t)f->last_iter, 0},
			  f->path, &z->r->verify);
	account_cpu(z, sb_now() - t0);
	return ret;
}

/* Wait for everything scheduled on @h and account it as reads or writes. */
static int finish(struct zr *z, struct ah_handle *h, bool read)
{
	return sb_finish(h, read, z->ph, &z->r->verify);
}

/* Schedule a read of @f; a file that is gone or of the wrong size counts as an error. */
static int sched_read(struct zr *z, struct ah_handle *h, const struct sb_file *f, void *buf)
{
	int ret = ah_pread(h, f->path, buf, f->bytes);

	if (ret == -EIO || ret == -ENOENT)
		z->r->verify.errors++;
	return ret;
}

static int sched_write(struct ah_handle *h, const struct sb_file *f, const void *buf)
{
	return ah_pwrite(h, f->path, buf, f->bytes);
}

/*
 * Read the NVMe-resident parameters among params [first, last] on @h,
 * buffer_count files at a time, and check each.
 */
static int read_params(struct zr *z, struct ah_handle *h, int first, int last)
{
	const struct zl_layout *l = &z->l;
	int i = first;
	int ret;

	while (i <= last) {
		int n = 0;

		for (; i <= last && n < z->npbuf; i++) {
			if (l->params[i].file < 0)
				continue;
			z->pfile[n] = l->params[i].file;
			ret = sched_read(z, h, &l->files[z->pfile[n]], z->pbuf[n]);
			if (ret)
				return ret;
			n++;
		}
		ret = finish(z, h, true);
		for (int k = 0; !ret && k < n; k++)
			ret = check_read(z, &l->files[z->pfile[k]], z->pbuf[k]);
		if (ret)
			return ret;
	}
	return 0;
}

/* Read the parameters of one layer, as the forward and backward passes do. */
static int read_layer_params(struct zr *z, int layer)
{
	const struct zl_layout *l = &z->l;
	int first = 0, last;

	while (first < l->nparams && l->params[first].layer != layer)
		first++;
	for (last = first; last + 1 < l->nparams && l->params[last + 1].layer == layer; last++)
		;
	return first < l->nparams ? read_params(z, z->prd, first, last) : 0;
}

/* Write the NVMe-resident parameters of params [first, last], as the step does. */
static int write_params(struct zr *z, struct ah_handle *h, int first, int last)
{
	const struct zl_layout *l = &z->l;
	int n = 0;
	int ret;

	for (int i = first; i <= last; i++) {
		struct sb_file *f;

		if (l->params[i].file < 0)
			continue;
		f = &l->files[l->params[i].file];
		stamp_write(z, f, z->pbuf[n]);
		ret = sched_write(h, f, z->pbuf[n]);
		if (ret)
			return ret;
		if (++n < z->npbuf)
			continue;
		ret = finish(z, h, false);
		if (ret)
			return ret;
		n = 0;
	}
	return finish(z, h, false);
}

static int gs_submit(struct grad_swapper *gs)
{
	for (int i = 0; i < gs->nqueued; i++) {
		int ret = sched_write(gs->z->wr, gs->files[i], gs->ptrs[i]);

		if (ret)
			return ret;
	}
	gs->nqueued = 0;
	return 0;
}

/* _swap_out_tensor(): pack into the current buffer, move on when it is full. */
static int gs_swap_out(struct grad_swapper *gs, struct sb_file *f)
{
	struct zr *z = gs->z;
	int ret;

	if (gs->cur < 0) {
		gs->cur = 0;
		gs->used = 0;
	} else if (gs->used + f->bytes > z->l.state_buffer_bytes) {
		ret = gs_submit(gs);
		if (ret)
			return ret;
		if (gs->cur + 1 < gs->nbufs) {
			gs->cur++;
		} else {
			ret = finish(z, z->wr, false);
			if (ret)
				return ret;
			gs->cur = 0;
		}
		gs->used = 0;
	}
	gs->files[gs->nqueued] = f;
	gs->ptrs[gs->nqueued] = z->pool[gs->cur] + gs->used;
	stamp_write(z, f, gs->ptrs[gs->nqueued]);
	gs->nqueued++;
	gs->used += f->bytes;
	return 0;
}

/* release_buffers(): write what is left and wait for all of it. */
static int gs_flush(struct grad_swapper *gs)
{
	int ret = gs_submit(gs);

	if (ret)
		return ret;
	gs->cur = -1;
	return finish(gs->z, gs->z->wr, false);
}

static int forward(struct zr *z)
{
	int ret;

	if (!z->cfg->offload_params)
		return 0;
	for (int layer = 0; layer <= z->l.model_layers; layer++) {
		ret = read_layer_params(z, layer);
		if (ret)
			return ret;
	}
	return 0;
}

static int backward(struct zr *z)
{
	struct zl_layout *l = &z->l;
	struct grad_swapper gs = {.z = z, .cur = -1};
	int next = 0;
	int ret = 0;

	gs.nbufs = z->cfg->optimizer_buffers < z->npool ? z->cfg->optimizer_buffers : z->npool;
	gs.files = calloc((size_t)l->ngrads + 1, sizeof(*gs.files));
	gs.ptrs = calloc((size_t)l->ngrads + 1, sizeof(*gs.ptrs));
	if (!gs.files || !gs.ptrs) {
		ret = -ENOMEM;
		goto cleanup;
	}
	for (int layer = l->model_layers; layer >= 0; layer--) {
		if (z->cfg->offload_params) {
			ret = read_layer_params(z, layer);
			if (ret)
				goto cleanup;
		}
		while (next < l->ngrads && l->params[l->grads[next].param].layer == layer) {
			ret = gs_swap_out(&gs, &l->files[l->grads[next++].file]);
			if (ret)
				goto cleanup;
		}
	}
	ret = gs_flush(&gs);
cleanup:
	free(gs.files);
	free(gs.ptrs);
	return ret;
}

/* The buffers of a subgroup: weights, m, v, gradients. */
struct group_bufs {
	char *w, *m, *v, *g;
};

static struct group_bufs group_bufs(const struct zr *z, int slot)
{
	char **p = z->pool + slot * ZR_GROUP_BUFFERS;

	return (struct group_bufs){p[0], p[1], p[2], p[3]};
}

/* Where gradient file @k of a subgroup lands in its gradient buffer. */
static char *grad_slot(const struct zl_layout *l, const struct zl_group *g, char *buf, int k)
{
	uint64_t off = 0;

	for (int i = 0; i < k; i++)
		off += sb_align_up(l->files[l->grads[g->grad_first + i].file].bytes, SB_BUF_ALIGN);
	return buf + off;
}

static int read_state(struct zr *z, struct ah_handle *h, const struct zl_group *g,
		      struct group_bufs b)
{
	int ret = sched_read(z, h, &z->l.files[g->weights], b.w);

	/* m and v exist from the end of the first step on */
	if (!ret && z->iter > 1)
		ret = sched_read(z, h, &z->l.files[g->exp_avg], b.m);
	if (!ret && z->iter > 1)
		ret = sched_read(z, h, &z->l.files[g->exp_avg_sq], b.v);
	return ret;
}

static int read_grads(struct zr *z, struct ah_handle *h, const struct zl_group *g, char *buf)
{
	for (int k = 0; k < g->grad_count; k++) {
		const struct sb_file *f = &z->l.files[z->l.grads[g->grad_first + k].file];
		int ret = sched_read(z, h, f, grad_slot(&z->l, g, buf, k));

		if (ret)
			return ret;
	}
	return 0;
}

static int write_state(struct zr *z, struct ah_handle *h, const struct zl_group *g,
		       struct group_bufs b)
{
	int ret = sched_write(h, &z->l.files[g->weights], b.w);

	if (!ret)
		ret = sched_write(h, &z->l.files[g->exp_avg], b.m);
	if (!ret)
		ret = sched_write(h, &z->l.files[g->exp_avg_sq], b.v);
	return ret;
}

static double compute_target(const struct sb_config *cfg, uint64_t numel)
{
	if (cfg->compute_gbps > 0)
		return (double)(numel * ZR_ADAM_BYTES_PER_ELEMENT) /
		       (cfg->compute_gbps * ZR_BYTES_PER_GB);
	return cfg->compute_ms / ZR_MS_PER_S;
}

/*
 * CPU Adam on one subgroup: check what was read, produce (stamp) the new
 * weights, m and v, and sleep out the rest of the simulated compute time.
 */
static int compute(struct zr *z, const struct zl_group *g, struct group_bufs b)
{
	struct zl_layout *l = &z->l;
	double t0 = sb_now();
	int ret = 0;

	z->in_compute = true;
	if (g->swapped) {
		ret = check_read(z, &l->files[g->weights], b.w);
		if (!ret && z->iter > 1)
			ret = check_read(z, &l->files[g->exp_avg], b.m);
		if (!ret && z->iter > 1)
			ret = check_read(z, &l->files[g->exp_avg_sq], b.v);
		for (int k = 0; !ret && k < g->grad_count; k++)
			ret = check_read(z, &l->files[l->grads[g->grad_first + k].file],
					 grad_slot(l, g, b.g, k));
		if (!ret) {
			stamp_write(z, &l->files[g->weights], b.w);
			stamp_write(z, &l->files[g->exp_avg], b.m);
			stamp_write(z, &l->files[g->exp_avg_sq], b.v);
		}
	}
	if (!ret)
		sb_sleep_until(t0 + compute_target(z->cfg, g->numel));
	z->in_compute = false;
	z->ph->compute_s += sb_now() - t0;
	return ret;
}

/* The step of subgroup @g: compute, then write its parameters where they are offloaded. */
static int step(struct zr *z, const struct zl_group *g, struct group_bufs b)
{
	int ret = compute(z, g, b);

	if (!ret && z->cfg->offload_params)
		ret = write_params(z, z->pwr, g->first_param, g->last_param);
	return ret;
}

/* PartitionedOptimizerSwapper: each step waits for the one before it. */
static int step_partitioned(struct zr *z)
{
	struct group_bufs b = group_bufs(z, 0);
	int ret = 0;

	for (int i = 0; i < z->l.ngroups && !ret; i++) {
		const struct zl_group *g = &z->l.groups[i];

		if (g->swapped) {
			trace(z, "read_state", i);
			ret = read_state(z, z->rd, g, b);
			if (!ret)
				ret = finish(z, z->rd, true);
			trace(z, "read_grads", i);
			if (!ret)
				ret = read_grads(z, z->rd, g, b.g);
			if (!ret)
				ret = finish(z, z->rd, true);
		}
		trace(z, "compute", i);
		if (!ret)
			ret = step(z, g, b);
		trace(z, "write_state", i);
		if (!ret && g->swapped)
			ret = write_state(z, z->wr, g, b);
		if (!ret)
			ret = finish(z, z->wr, false);
	}
	trace(z, "end", z->l.ngroups);
	return ret;
}

static int pipelined_read(struct zr *z, int i)
{
	const struct zl_group *g = &z->l.groups[i];
	struct group_bufs b = group_bufs(z, i % ZR_PIPELINE_SLOTS);
	int ret;

	if (!g->swapped)
		return 0;
	ret = read_state(z, z->rd, g, b);
	if (!ret)
		ret = read_grads(z, z->rd, g, b.g);
	return ret;
}

/*
 * PipelinedOptimizerSwapper: while subgroup i computes, i+1 is being read on
 * the read handle and i-1 written on the write handle.
 */
static int step_pipelined(struct zr *z)
{
	int n = z->l.ngroups;
	int ret = n > 0 ? pipelined_read(z, 0) : 0;

	for (int i = 0; i < n && !ret; i++) {
		const struct zl_group *g = &z->l.groups[i];
		struct group_bufs b = group_bufs(z, i % ZR_PIPELINE_SLOTS);

		trace(z, "wait_read", i);
		ret = finish(z, z->rd, true);
		if (!ret && i + 1 < n)
			ret = pipelined_read(z, i + 1);
		trace(z, "compute", i);
		if (!ret)
			ret = step(z, g, b);
		trace(z, "wait_write", i);
		if (!ret)
			ret = finish(z, z->wr, false);
		if (!ret && g->swapped)
			ret = write_state(z, z->wr, g, b);
	}
	trace(z, "wait_write", n);
	if (!ret)
		ret = finish(z, z->wr, false);
	trace(z, "end", n);
	return ret;
}

/*
 * Start-up: parameters go to NVMe as the model is built, then the optimizer
 * writes each subgroup's fp32 weights, from the fp16 files when there are.
 */
static int init_phase(struct zr *z)
{
	struct zl_layout *l = &z->l;
	double t0 = sb_now();
	int n = 0;
	int ret = 0;

	z->iter = 0;
	z->ph = &z->r->init;
	if (z->cfg->offload_params)
		ret = write_params(z, z->pwr, 0, l->nparams - 1);
	for (int i = 0; i < l->ngroups && !ret; i++) {
		const struct zl_group *g = &l->groups[i];
		struct sb_file *f;

		if (!g->swapped)
			continue;
		if (z->cfg->offload_params) {
			/* _initialize_from_swapped_fp16_params() */
			ret = read_params(z, z->wr, g->first_param, g->last_param);
			if (ret)
				break;
		}
		f = &l->files[g->weights];
		stamp_write(z, f, z->pool[n]);
		ret = sched_write(z->wr, f, z->pool[n]);
		if (!ret && (++n == z->npool || z->cfg->offload_params)) {
			ret = finish(z, z->wr, false);
			n = 0;
		}
	}
	if (!ret)
		ret = finish(z, z->wr, false);
	z->ph->total_s = sb_now() - t0;
	return ret;
}

static int iteration(struct zr *z, int k)
{
	double t0 = sb_now();
	int ret;

	z->iter = k;
	z->ph = &z->r->iters[k - 1];
	memset(z->ph, 0, sizeof(*z->ph));
	trace(z, "forward", 0);
	ret = forward(z);
	trace(z, "backward", 0);
	if (!ret)
		ret = backward(z);
	if (!ret)
		ret = z->cfg->swapper == SB_SWAPPER_PIPELINED ? step_pipelined(z)
							      : step_partitioned(z);
	z->ph->total_s = sb_now() - t0;
	return ret;
}

static char **alloc_bufs(int n, uint64_t bytes)
{
	char **v = calloc((size_t)n, sizeof(*v));

	for (int i = 0; v && i < n; i++) {
		v[i] = sb_buf_alloc(bytes);
		if (!v[i]) {
			sb_err("cannot allocate %d buffers of %llu bytes", n,
			       (unsigned long long)bytes);
			while (i--)
				free(v[i]);
			free(v);
			return NULL;
		}
	}
	return v;
}

static void free_bufs(char **v, int n)
{
	for (int i = 0; v && i < n; i++)
		free(v[i]);
	free(v);
}

static int setup(struct zr *z)
{
	const struct sb_config *cfg = z->cfg;
	struct ah_config ac = {cfg->threads, cfg->queue_depth, cfg->block_size, cfg->single_submit,
			       cfg->overlap_events};
	bool pipelined = cfg->swapper == SB_SWAPPER_PIPELINED;
	int ret;

	ret = zl_build(&z->l, cfg, z->r->rank);
	if (ret)
		return ret;
	ret = sb_mkdirs(z->l.optimizer_dir);
	if (ret) {
		sb_err("mkdir %s: %s", z->l.optimizer_dir, strerror(-ret));
		return ret;
	}
	if (cfg->offload_params) {
		/* as AsyncPartitionedParameterSwapper: rmtree, then makedirs */
		ret = sb_rmtree(z->l.param_dir);
		if (!ret)
			ret = sb_mkdirs(z->l.param_dir);
		if (ret) {
			sb_err("recreate %s: %s", z->l.param_dir, strerror(-ret));
			return ret;
		}
		z->npbuf = cfg->param_buffers;
		z->pbuf = alloc_bufs(z->npbuf, z->l.largest_param_bytes);
		z->pfile = calloc((size_t)z->npbuf, sizeof(*z->pfile));
		if (!z->pbuf || !z->pfile)
			return -ENOMEM;
	}
	z->npool = pool_count(cfg);
	z->pool = alloc_bufs(z->npool, z->l.state_buffer_bytes);
	if (!z->pool)
		return -ENOMEM;
	ret = ah_create(&z->rd, &ac, pipelined ? "rd" : "opt");
	if (!ret && pipelined)
		ret = ah_create(&z->wr, &ac, "wr");
	else
		z->wr = z->rd;
	if (!ret && cfg->offload_params)
		ret = ah_create(&z->prd, &ac, "prd");
	if (!ret && cfg->offload_params)
		ret = ah_create(&z->pwr, &ac, "pwr");
	return ret;
}

static void teardown(struct zr *z)
{
	ah_destroy(z->pwr);
	ah_destroy(z->prd);
	if (z->wr != z->rd)
		ah_destroy(z->wr);
	ah_destroy(z->rd);
	free_bufs(z->pool, z->npool);
	free_bufs(z->pbuf, z->npbuf);
	free(z->pfile);
	zl_free(&z->l);
}

static int run_iteration(void *z, int k)
{
	return iteration(z, k);
}

int zero_run(const struct sb_config *cfg, struct sb_rank *r)
{
	struct zr z = {.cfg = cfg, .r = r, .trace_fd = -1};
	int ret;

	if (cfg->trace) {
		z.trace_fd = open(cfg->trace, O_WRONLY | O_APPEND | O_CLOEXEC);
		if (z.trace_fd < 0) {
			ret = -errno;
			sb_err("--trace %s: %s", cfg->trace, strerror(errno));
			return ret;
		}
	}
	ret = setup(&z);
	if (ret)
		goto cleanup;
	r->running = true;
	trace(&z, "init", 0);
	ret = init_phase(&z);
	if (!ret)
		ret = sb_rank_sync(r, 0);
	if (!ret)
		ret = sb_run_iters(cfg, r, run_iteration, &z);
cleanup:
	teardown(&z);
	if (z.trace_fd >= 0)
		close(z.trace_fd);
	return ret;
}

int zero_plan(const struct sb_config *cfg, struct sb_plan *plan)
{
	struct zl_layout l;
	uint64_t state = 0, grads = 0, params = 0;
	int ret;

	ret = zl_build(&l, cfg, 0);
	if (ret)
		return ret;
	memset(plan, 0, sizeof(*plan));
	for (int i = 0; i < l.ngroups; i++) {
		if (!l.groups[i].swapped)
			continue;
		plan->swapped_groups++;
		state += l.files[l.groups[i].weights].bytes;
	}
	for (int i = 0; i < l.ngrads; i++)
		grads += l.files[l.grads[i].file].bytes;
	for (int i = 0; i < l.nparams; i++)
		if (l.params[i].file >= 0)
			params += l.files[l.params[i].file].bytes;
	plan->files = (uint64_t)l.nfiles;
	plan->read_bytes = 3 * state + grads + 2 * params;
	plan->write_bytes = 3 * state + grads + params;
	plan->init_bytes = state + params;
	plan->buffer_bytes = (uint64_t)pool_count(cfg) * l.state_buffer_bytes;
	if (cfg->offload_params)
		plan->buffer_bytes += (uint64_t)cfg->param_buffers * l.largest_param_bytes;
	plan->model_params = l.model_numel;
	plan->hidden = l.hidden;
	plan->model_layers = (uint64_t)l.model_layers;
	plan->tensors = (uint64_t)l.nparams;
	plan->subgroups = (uint64_t)l.ngroups;
	plan->grad_files = (uint64_t)l.ngrads;
	plan->param_files = (uint64_t)l.nparam_files;
	zl_free(&l);
	return 0;
}

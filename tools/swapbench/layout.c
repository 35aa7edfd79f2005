/*
 * layout.c - the synthetic model and the ZeRO-Infinity files of one rank.
 *
 * The model is GPT-like (12h^2 + 13h elements per layer, then a final norm);
 * parameter ids are their index.  A rank holds ceil(numel / ranks) elements
 * of each (ZeRO-3).  Subgroups are cut as _create_fp16_sub_groups() cuts
 * them, and sizes padded and small tensors left in RAM as optimizer_utils.py
 * and partitioned_param_swapper.py do.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layout.h"

/* Elements of one transformer layer, in units of h^2 and of h. */
#define ZL_LAYER_H2 12u
#define ZL_LAYER_H 13u
/* The final norm: weight and bias of h elements each. */
#define ZL_FINAL_TENSORS 2
#define ZL_GRAD_SLOT_ALIGN 4096u

/* Shapes of one layer's tensors: numel = a * h^2 + b * h. */
static const struct {
	unsigned a, b;
} zl_layer_tensors[] = {
    {0, 1}, {0, 1}, /* input norm weight, bias */
    {1, 0}, {0, 1}, /* query weight, bias */
    {1, 0}, {0, 1}, /* key */
    {1, 0}, {0, 1}, /* value */
    {1, 0}, {0, 1}, /* attention output */
    {0, 1}, {0, 1}, /* post-attention norm */
    {4, 0}, {0, 4}, /* MLP up, h -> 4h */
    {4, 0}, {0, 1}, /* MLP down, 4h -> h */
};

#define ZL_LAYER_TENSORS ((int)(sizeof(zl_layer_tensors) / sizeof(zl_layer_tensors[0])))

/* A GPT-like hidden size for @params elements: layers = h / 128. */
static uint64_t derive_hidden(uint64_t params)
{
	uint64_t h = SB_HIDDEN_STEP;

	for (;;) {
		uint64_t next = h + SB_HIDDEN_STEP;
		uint64_t size = ZL_LAYER_H2 * next * next * (next / SB_HIDDEN_PER_LAYER);

		if (size > params) {
			uint64_t cur = ZL_LAYER_H2 * h * h * (h / SB_HIDDEN_PER_LAYER);

			return params - cur < size - params ? h : next;
		}
		h = next;
	}
}

static int add_file(struct zl_layout *l, int rank, char *path, uint64_t bytes)
{
	struct sb_file *f;

	if (!path)
		return -ENOMEM;
	/* The array is full whenever nfiles is 0 or a power of two. */
	if ((l->nfiles & (l->nfiles - 1)) == 0) {
		size_t cap = l->nfiles ? (size_t)l->nfiles * 2 : 1;
		struct sb_file *files = realloc(l->files, cap * sizeof(*files));

		if (!files) {
			free(path);
			return -ENOMEM;
		}
		l->files = files;
	}
	f = &l->files[l->nfiles];
	f->path = path;
	f->bytes = bytes;
	f->id = (uint32_t)rank << SB_FILE_ID_RANK_SHIFT | (uint32_t)l->nfiles;
	f->last_iter = -1;
	f->last_gen = 0;
	return l->nfiles++;
}

static int build_params(struct zl_layout *l, const struct sb_config *cfg)
{
	uint64_t h = cfg->hidden ? cfg->hidden : derive_hidden(cfg->params);
	uint64_t per_layer = ZL_LAYER_H2 * h * h + ZL_LAYER_H * h;
	uint64_t rest = cfg->params > ZL_FINAL_TENSORS * h ? cfg->params - ZL_FINAL_TENSORS * h : 0;
	uint64_t layers = (rest + per_layer / 2) / per_layer;
	int n = 0;

	if (layers < 1)
		layers = 1;
	l->hidden = h;
	l->model_layers = (int)layers;
	l->nparams = (int)layers * ZL_LAYER_TENSORS + ZL_FINAL_TENSORS;
	l->params = calloc((size_t)l->nparams, sizeof(*l->params));
	if (!l->params)
		return -ENOMEM;
	for (int layer = 0; layer < (int)layers; layer++) {
		for (int t = 0; t < ZL_LAYER_TENSORS; t++) {
			l->params[n].numel =
			    zl_layer_tensors[t].a * h * h + zl_layer_tensors[t].b * h;
			l->params[n++].layer = layer;
		}
	}
	for (int t = 0; t < ZL_FINAL_TENSORS; t++) {
		l->params[n].numel = h;
		l->params[n++].layer = (int)layers;
	}
	for (int i = 0; i < n; i++) {
		struct zl_param *p = &l->params[i];

		p->part_numel = (p->numel + (uint64_t)cfg->ranks - 1) / (uint64_t)cfg->ranks;
		p->file = -1;
		l->model_numel += p->numel;
	}
	return 0;
}

/* stage3.py _create_fp16_sub_groups(): close a group once it is big enough. */
static int build_groups(struct zl_layout *l, const struct sb_config *cfg)
{
	uint64_t size = 0;
	int first = 0;

	l->groups = calloc((size_t)l->nparams, sizeof(*l->groups));
	if (!l->groups)
		return -ENOMEM;
	for (int i = 0; i < l->nparams; i++) {
		l->params[i].group = l->ngroups;
		l->params[i].offset = size;
		size += l->params[i].part_numel;
		if (size < cfg->sub_group_size && i != l->nparams - 1)
			continue;
		struct zl_group *g = &l->groups[l->ngroups++];

		g->first_param = first;
		g->last_param = i;
		g->numel = size;
		g->weights = g->exp_avg = g->exp_avg_sq = -1;
		first = i + 1;
		size = 0;
	}
	return 0;
}

static int build_state_files(struct zl_layout *l, int rank, uint64_t min_aio_bytes, uint64_t align)
{
	for (int i = 0; i < l->ngroups; i++) {
		struct zl_group *g = &l->groups[i];
		const char *d = l->optimizer_dir;
		int a = g->first_param, b = g->last_param;
		uint64_t bytes;

		g->aligned_numel = sb_align_up(g->numel, align);
		g->swapped = g->numel * SB_FP32_BYTES >= min_aio_bytes;
		if (!g->swapped)
			continue;
		bytes = g->aligned_numel * SB_FP32_BYTES;
		g->weights = add_file(l, rank, sb_path("%s/%d_%d.tensor.swp", d, a, b), bytes);
		g->exp_avg =
		    add_file(l, rank, sb_path("%s/exp_avg-%d_%d.tensor.swp", d, a, b), bytes);
		g->exp_avg_sq =
		    add_file(l, rank, sb_path("%s/exp_avg_sq-%d_%d.tensor.swp", d, a, b), bytes);
		if (g->weights < 0 || g->exp_avg < 0 || g->exp_avg_sq < 0)
			return -ENOMEM;
		if (bytes > l->largest_aligned_bytes)
			l->largest_aligned_bytes = bytes;
	}
	return 0;
}

static int add_grad(struct zl_layout *l, int rank, int param, uint64_t offset, uint64_t numel)
{
	const struct zl_param *p = &l->params[param];
	struct zl_group *g = &l->groups[p->group];
	uint64_t bytes = numel * SB_FP32_BYTES;
	int f;

	f = add_file(l, rank,
		     sb_path("%s/%d_%d_gradient_%" PRIu64 "_%" PRIu64 ".tensor.swp",
			     l->optimizer_dir, g->first_param, g->last_param, offset, numel),
		     bytes);
	if (f < 0)
		return f;
	if (g->grad_count++ == 0)
		g->grad_first = l->ngrads;
	g->grad_slot_bytes += sb_align_up(bytes, ZL_GRAD_SLOT_ALIGN);
	l->grads[l->ngrads++] = (struct zl_grad){f, param, offset, numel};
	return 0;
}

/*
 * Gradient files in the order backward writes them (last parameter first),
 * split as _adjust_for_misaligned_lengths() splits them; pieces under
 * min_aio_bytes stay in RAM.
 */
static int build_grad_files(struct zl_layout *l, int rank, uint64_t min_aio_bytes, uint64_t align)
{
	l->grads = calloc((size_t)l->nparams * 2, sizeof(*l->grads));
	if (!l->grads)
		return -ENOMEM;
	for (int i = l->nparams - 1; i >= 0; i--) {
		const struct zl_param *p = &l->params[i];
		uint64_t aligned = p->part_numel / align * align;
		uint64_t rest = p->part_numel - aligned;
		int ret;

		if (!l->groups[p->group].swapped || p->part_numel * SB_FP32_BYTES < min_aio_bytes)
			continue;
		if (aligned * SB_FP32_BYTES >= min_aio_bytes) {
			ret = add_grad(l, rank, i, p->offset, aligned);
			if (ret)
				return ret;
		}
		if (rest * SB_FP32_BYTES >= min_aio_bytes) {
			ret = add_grad(l, rank, i, p->offset + aligned, rest);
			if (ret)
				return ret;
		}
	}
	return 0;
}

/* partitioned_param_swapper.py: one file per parameter partition. */
static int build_param_files(struct zl_layout *l, int rank, uint64_t min_aio_bytes, uint64_t align)
{
	for (int i = 0; i < l->nparams; i++) {
		struct zl_param *p = &l->params[i];
		uint64_t bytes = sb_align_up(p->part_numel, align) * SB_PARAM_BYTES;

		if (p->part_numel * SB_PARAM_BYTES < min_aio_bytes)
			continue;
		p->file =
		    add_file(l, rank, sb_path("%s/%d_param.tensor.swp", l->param_dir, i), bytes);
		if (p->file < 0)
			return p->file;
		l->nparam_files++;
		if (bytes > l->largest_param_bytes)
			l->largest_param_bytes = bytes;
	}
	return 0;
}

int zl_build(struct zl_layout *l, const struct sb_config *cfg, int rank)
{
	uint64_t min_aio_bytes =
	    cfg->block_size > SB_MIN_AIO_BYTES ? cfg->block_size : SB_MIN_AIO_BYTES;
	uint64_t aligned_bytes = (uint64_t)SB_AIO_ALIGNED_BYTES * (uint64_t)cfg->threads;
	int ret;

	memset(l, 0, sizeof(*l));
	l->optimizer_dir = sb_path("%s/zero_stage_3/optimizer/rank%d", cfg->dir, rank);
	l->param_dir = sb_path("%s/zero_stage_3/%sparams/rank%d", cfg->dir, cfg->param_dtype, rank);
	if (!l->optimizer_dir || !l->param_dir) {
		ret = -ENOMEM;
		goto fail;
	}
	ret = build_params(l, cfg);
	if (!ret)
		ret = build_groups(l, cfg);
	if (!ret)
		ret = build_state_files(l, rank, min_aio_bytes, aligned_bytes / SB_FP32_BYTES);
	if (!ret)
		ret = build_grad_files(l, rank, min_aio_bytes, aligned_bytes / SB_FP32_BYTES);
	if (!ret && cfg->offload_params)
		ret = build_param_files(l, rank, min_aio_bytes, aligned_bytes / SB_PARAM_BYTES);
	if (ret)
		goto fail;
	for (int i = 0; i < l->ngroups; i++) {
		uint64_t b = l->groups[i].aligned_numel * SB_FP32_BYTES;

		if (l->groups[i].grad_slot_bytes > b)
			b = l->groups[i].grad_slot_bytes;
		if (b > l->state_buffer_bytes)
			l->state_buffer_bytes = b;
	}
	l->state_buffer_bytes = sb_align_up(l->state_buffer_bytes, SB_BUF_ALIGN);
	if ((uint64_t)l->nfiles >= 1ull << SB_FILE_ID_RANK_SHIFT) {
		sb_err("%d files per rank: too many", l->nfiles);
		ret = -E2BIG;
		goto fail;
	}
	return 0;
fail:
	if (ret == -ENOMEM)
		sb_err("out of memory building the layout");
	zl_free(l);
	return ret;
}

void zl_free(struct zl_layout *l)
{
	for (int i = 0; i < l->nfiles; i++)
		free(l->files[i].path);
	free(l->files);
	free(l->grads);
	free(l->groups);
	free(l->params);
	free(l->optimizer_dir);
	free(l->param_dir);
	memset(l, 0, sizeof(*l));
}

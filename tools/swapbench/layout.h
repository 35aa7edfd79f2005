/*
 * layout.h - the files ZeRO-Infinity keeps for one rank of a synthetic
 * GPT-like model: parameters partitioned as ZeRO-3 partitions them, grouped
 * into optimizer subgroups, and the swap files (names and padded sizes) of
 * each subgroup's state, gradients and NVMe-resident parameters.
 */
#ifndef SWAPBENCH_LAYOUT_H
#define SWAPBENCH_LAYOUT_H

#include <stdbool.h>
#include <stdint.h>

#include "swapbench.h"

/* One model parameter tensor and this rank's partition of it. */
struct zl_param {
	uint64_t numel;	     /* whole tensor */
	uint64_t part_numel; /* this rank's partition: ceil(numel / ranks) */
	int layer;	     /* transformer layer; model layers for the final norm */
	int group;	     /* optimizer subgroup */
	uint64_t offset;     /* element offset of the partition in its subgroup */
	int file;	     /* NVMe-resident parameter file, or -1 (stays in RAM) */
};

/* One gradient partition file, `<sg>_gradient_<offset>_<numel>.tensor.swp`. */
struct zl_grad {
	int file;
	int param;
	uint64_t offset; /* elements, in the subgroup's flat partition */
	uint64_t numel;
};

/* One optimizer subgroup: whole parameters, about sub_group_size elements. */
struct zl_group {
	int first_param;
	int last_param;
	uint64_t numel;
	uint64_t aligned_numel; /* padded to 1 KiB x threads */
	bool swapped;		/* false: the state stays in RAM */
	int weights;		/* files, or -1 */
	int exp_avg;
	int exp_avg_sq;
	int grad_first; /* its gradient files: grads[grad_first, +grad_count) */
	int grad_count;
	uint64_t grad_slot_bytes; /* its gradient files, each at a 4 KiB aligned slot */
};

struct zl_layout {
	uint64_t hidden;
	int model_layers;
	uint64_t model_numel;
	struct zl_param *params;
	int nparams;
	struct zl_group *groups;
	int ngroups;
	struct zl_grad *grads; /* in the order backward writes them: last layer first */
	int ngrads;
	struct sb_file *files;
	int nfiles;
	int nparam_files;
	uint64_t largest_aligned_bytes; /* largest subgroup file */
	uint64_t largest_param_bytes;	/* largest parameter file */
	uint64_t state_buffer_bytes;	/* one optimizer swap buffer */
	char *optimizer_dir;
	char *param_dir;
};

/* Build rank @rank's layout; 0 or -errno (with a message). */
int zl_build(struct zl_layout *l, const struct sb_config *cfg, int rank);
void zl_free(struct zl_layout *l);

#endif

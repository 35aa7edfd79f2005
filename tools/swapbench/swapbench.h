/*
 * swapbench.h - what the parts of swapbench share: the run configuration, the
 * per-rank measurements, and small helpers (clock, page-aligned buffers,
 * folder handling, messages).
 *
 * swapbench replays, against any folder, the I/O that DeepSpeed ZeRO-Infinity
 * issues on its swap folder (see docs/deepspeed-swap-io.md), or the I/O of
 * activation offloading, and checks every byte it reads back.  The constants
 * below that come from DeepSpeed carry DeepSpeed's name in their comment.
 */
#ifndef SWAPBENCH_H
#define SWAPBENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifndef TFS_VERSION
#define TFS_VERSION "unknown"
#endif

/* DeepSpeed swap_tensor/utils.py MIN_AIO_BYTES: smaller tensors stay in RAM. */
#define SB_MIN_AIO_BYTES (1024u * 1024u)
/* DeepSpeed AIO_ALIGNED_BYTES: swap sizes are padded to this times threads. */
#define SB_AIO_ALIGNED_BYTES 1024u
/* Buffers are page aligned, as ds_page_aligned_alloc() makes them. */
#define SB_BUF_ALIGN 4096u
/* Bytes per element of the fp32 optimizer state and gradients. */
#define SB_FP32_BYTES 4u
/* Bytes per element of NVMe-resident parameters (fp16 or bf16). */
#define SB_PARAM_BYTES 2u
/* Hidden size granularity of the synthetic model when derived from --params. */
#define SB_HIDDEN_STEP 128u
/* Hidden size per layer of GPT-like shapes (7B: hidden 4096, 32 layers). */
#define SB_HIDDEN_PER_LAYER 128u
/* File ids are rank << SB_FILE_ID_RANK_SHIFT | index of the file in the rank. */
#define SB_FILE_ID_RANK_SHIFT 20u
/* Most verify messages a rank prints before it only counts. */
#define SB_MAX_REPORTED_ERRORS 16u

/* Exit statuses. */
#define SB_EXIT_OK 0
#define SB_EXIT_SETUP 1 /* usage, setup or environment error */
#define SB_EXIT_DATA 2	/* data mismatch, short or failed transfer, lost file */

enum sb_workload {
	SB_WORKLOAD_ZERO,
	SB_WORKLOAD_ACTIVATIONS,
};

enum sb_swapper {
	SB_SWAPPER_PARTITIONED,
	SB_SWAPPER_PIPELINED,
};

enum sb_act_reuse {
	SB_ACT_DELETE,
	SB_ACT_OVERWRITE,
};

/* Everything a run is told on the command line; defaults live in main.c. */
struct sb_config {
	const char *dir;
	enum sb_workload workload;
	int iters;
	int ranks;
	bool verify;
	bool verify_full; /* stamp and check every word, not a few per 4 KiB */
	bool json;
	const char *between; /* shell command run between iterations */
	const char *trace;   /* file that --workload zero's phases are logged to */

	/* libaio handle, as DeepSpeed's "aio" section */
	int threads; /* intra_op_parallelism */
	int queue_depth;
	uint64_t block_size;
	bool overlap_events;
	bool single_submit;

	/* ZeRO-Infinity model and optimizer */
	enum sb_swapper swapper;
	uint64_t params;	 /* total model parameter elements */
	uint64_t hidden;	 /* 0: derived from params */
	uint64_t sub_group_size; /* elements per subgroup (per rank) */
	bool offload_params;
	const char *param_dtype; /* torch dtype name: float16 or bfloat16 */
	int optimizer_buffers;	 /* offload_optimizer.buffer_count */
	int param_buffers;	 /* offload_param.buffer_count */
	double compute_ms;	 /* simulated CPU Adam time per subgroup */
	double compute_gbps;	 /* or: simulated CPU Adam rate */

	/* activation offloading */
	int layers;
	uint64_t act_size;
	int micro_batches;
	enum sb_act_reuse act_reuse;
};

/* One swap file of a rank, and the last write that went to it. */
struct sb_file {
	char *path;
	uint64_t bytes;	   /* file size, padded as DeepSpeed pads it */
	uint32_t id;	   /* stamped into every block */
	int last_iter;	   /* iteration of the last write; -1: never written */
	uint32_t last_gen; /* generation (micro-batch) of the last write */
};

/* What one rank measured in one iteration (or in the init phase). */
struct sb_phase {
	double read_s;	  /* time with reads in flight */
	double write_s;	  /* time with writes in flight */
	double compute_s; /* simulated compute, stamping and checking */
	double verify_s;  /* CPU time spent stamping and checking */
	double total_s;	  /* wall time of the iteration */
	uint64_t read_bytes;
	uint64_t write_bytes;
};

/* Verification counters of one rank. */
struct sb_verify {
	uint64_t checked_bytes;
	uint64_t errors;
	uint64_t reported;
};

/*
 * One rank's slot in the memory shared with the parent process.  The rank
 * fills init, iters[k-1] and verify, then calls sb_rank_sync().
 */
struct sb_rank {
	int rank;
	struct sb_phase init;
	struct sb_phase *iters; /* cfg->iters entries, also shared */
	struct sb_verify verify;
	bool running; /* setup is done: failures from here on are data errors */
	void *sync;   /* struct sb_shared (rank.h), mapped by main.c */
};

/*
 * rank.c: wait for everything scheduled on @h; add its busy time and bytes
 * to @ph's reads (@read) or writes, and its errors to @v. 0 or -errno.
 */
struct ah_handle;
int sb_finish(struct ah_handle *h, bool read, struct sb_phase *ph, struct sb_verify *v);

/*
 * rank.c: a workload's iterations 1 to cfg->iters, each run by iteration(w, k)
 * and then published (sb_rank_sync); 0, or the first error, which ends them.
 */
int sb_run_iters(const struct sb_config *cfg, struct sb_rank *r, int (*iteration)(void *w, int k),
		 void *w);

/* rank.c: publish phase k (0 = init) and wait until the next may start. */
int sb_rank_sync(struct sb_rank *r, int k);

/* Workloads: run all iterations of one rank; 0 or -errno. */
int zero_run(const struct sb_config *cfg, struct sb_rank *r);
int act_run(const struct sb_config *cfg, struct sb_rank *r);

/* Description of a workload for the report, filled without doing I/O. */
struct sb_plan {
	uint64_t files;		 /* files per rank */
	uint64_t read_bytes;	 /* per rank, steady iteration */
	uint64_t write_bytes;	 /* per rank, steady iteration */
	uint64_t init_bytes;	 /* per rank, written before iteration 1 */
	uint64_t buffer_bytes;	 /* per rank, I/O buffers allocated */
	uint64_t model_params;	 /* elements, as built */
	uint64_t hidden;	 /* model hidden size */
	uint64_t model_layers;	 /* transformer layers */
	uint64_t tensors;	 /* parameter tensors */
	uint64_t subgroups;	 /* per rank */
	uint64_t swapped_groups; /* subgroups whose state is on disk */
	uint64_t grad_files;	 /* per rank */
	uint64_t param_files;	 /* per rank */
};
int zero_plan(const struct sb_config *cfg, struct sb_plan *plan);
int act_plan(const struct sb_config *cfg, struct sb_plan *plan);

/* util.c */
double sb_now(void);
void sb_sleep_until(double deadline);
void *sb_buf_alloc(uint64_t bytes);
int sb_mkdirs(const char *path);
int sb_rmtree(const char *path);
char *sb_path(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void sb_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
uint64_t sb_align_up(uint64_t v, uint64_t a);

#endif

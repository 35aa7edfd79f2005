/*
 * main.c - swapbench's command line, and the parent process of the ranks.
 *
 * The parent parses the options (their defaults are sb_defaults below),
 * prints the configuration, and forks one process per rank, as N GPUs of one
 * node would run.  Ranks share a memory segment with the parent: each
 * publishes its measurements of a phase (init, then each iteration) and posts
 * "done"; once every rank is done the parent prints the phase, runs the
 * --between command, and posts "go" for the next one.  If a rank fails, the
 * parent stops the others and exits with the worst status.
 *
 * main.c calls the workloads (zero.c, activations.c), the report and the
 * helpers; none of them calls back: a rank's half of the handshake is
 * rank.c's.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <semaphore.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "report.h"
#include "stamp.h"
#include "swapbench.h"
#include "rank.h"

#define SB_KIB 1024ull
#define SB_COUNT_UNIT 1000ull /* K, M, G, T of element counts */
#define SB_MAX_RANKS 1024
#define SB_MAX_THREADS 1024
#define SB_MAX_QUEUE_DEPTH 65536
#define SB_MAX_ITERS 1000000
#define SB_MAX_BUFFERS 1024
#define SB_MAX_COUNT (1ull << 50)
/* How often the parent looks for ranks that died while it waits. */
#define SB_POLL_NS 100000000L
#define SB_NS_PER_S 1000000000L

/* Every default in one place; --help prints them from here. */
static const struct sb_config sb_defaults = {
    .dir = NULL,
    .workload = SB_WORKLOAD_ZERO,
    .iters = 3,
    .ranks = 1,
    .verify = true,
    .verify_full = false,
    .json = false,
    .between = NULL,
    .threads = 1,		       /* DeepSpeed aio.thread_count */
    .queue_depth = 8,		       /* aio.queue_depth */
    .block_size = SB_KIB * SB_KIB,     /* aio.block_size */
    .overlap_events = true,	       /* aio.overlap_events */
    .single_submit = false,	       /* aio.single_submit */
    .swapper = SB_SWAPPER_PARTITIONED, /* offload_optimizer.pipeline: false */
    .params = 100000000,
    .hidden = 0,
    .sub_group_size = 1000000000, /* zero_optimization.sub_group_size */
    .offload_params = false,
    .param_dtype = "fp16",
    .optimizer_buffers = 4, /* offload_optimizer.buffer_count */
    .param_buffers = 5,	    /* offload_param.buffer_count */
    .compute_ms = 0,
    .compute_gbps = 0,
    .layers = 8,
    .act_size = 64 * SB_KIB * SB_KIB,
    .micro_batches = 4,
    .act_reuse = SB_ACT_DELETE,
};

enum {
	OPT_WORKLOAD = 256,
	OPT_SWAPPER,
	OPT_PARAMS,
	OPT_HIDDEN,
	OPT_SUB_GROUP,
	OPT_RANKS,
	OPT_THREADS,
	OPT_QUEUE_DEPTH,
	OPT_BLOCK_SIZE,
	OPT_NO_OVERLAP,
	OPT_SINGLE_SUBMIT,
	OPT_OFFLOAD_PARAMS,
	OPT_PARAM_DTYPE,
	OPT_BUFFER_COUNT,
	OPT_PARAM_BUFFER_COUNT,
	OPT_ITERS,
	OPT_COMPUTE_MS,
	OPT_COMPUTE_GBPS,
	OPT_LAYERS,
	OPT_ACT_SIZE,
	OPT_MICRO_BATCHES,
	OPT_ACT_REUSE,
	OPT_NO_VERIFY,
	OPT_VERIFY_FULL,
	OPT_BETWEEN,
	OPT_TRACE,
	OPT_JSON,
};

static const struct option sb_options[] = {
    {"dir", required_argument, NULL, 'd'},
    {"workload", required_argument, NULL, OPT_WORKLOAD},
    {"swapper", required_argument, NULL, OPT_SWAPPER},
    {"params", required_argument, NULL, OPT_PARAMS},
    {"hidden", required_argument, NULL, OPT_HIDDEN},
    {"sub-group-size", required_argument, NULL, OPT_SUB_GROUP},
    {"ranks", required_argument, NULL, OPT_RANKS},
    {"threads", required_argument, NULL, OPT_THREADS},
    {"queue-depth", required_argument, NULL, OPT_QUEUE_DEPTH},
    {"block-size", required_argument, NULL, OPT_BLOCK_SIZE},
    {"no-overlap-events", no_argument, NULL, OPT_NO_OVERLAP},
    {"single-submit", no_argument, NULL, OPT_SINGLE_SUBMIT},
    {"offload-params", no_argument, NULL, OPT_OFFLOAD_PARAMS},
    {"param-dtype", required_argument, NULL, OPT_PARAM_DTYPE},
    {"buffer-count", required_argument, NULL, OPT_BUFFER_COUNT},
    {"param-buffer-count", required_argument, NULL, OPT_PARAM_BUFFER_COUNT},
    {"iters", required_argument, NULL, OPT_ITERS},
    {"compute-ms", required_argument, NULL, OPT_COMPUTE_MS},
    {"compute-gbps", required_argument, NULL, OPT_COMPUTE_GBPS},
    {"layers", required_argument, NULL, OPT_LAYERS},
    {"act-size", required_argument, NULL, OPT_ACT_SIZE},
    {"micro-batches", required_argument, NULL, OPT_MICRO_BATCHES},
    {"act-reuse", required_argument, NULL, OPT_ACT_REUSE},
    {"no-verify", no_argument, NULL, OPT_NO_VERIFY},
    {"verify-full", no_argument, NULL, OPT_VERIFY_FULL},
    {"between", required_argument, NULL, OPT_BETWEEN},
    {"trace", required_argument, NULL, OPT_TRACE},
    {"json", no_argument, NULL, OPT_JSON},
    {"help", no_argument, NULL, 'h'},
    {"version", no_argument, NULL, 'V'},
    {NULL, 0, NULL, 0},
};

static void usage(FILE *out)
{
	const struct sb_config *d = &sb_defaults;

	fprintf(
	    out,
	    "Usage: swapbench [OPTION]... DIR\n"
	    "Replay DeepSpeed ZeRO-Infinity's swap I/O (or activation offloading) on DIR\n"
	    "and check every byte read back.\n"
	    "\n"
	    "General:\n"
	    "  -d, --dir DIR              folder to swap to (or give DIR as the argument)\n"
	    "      --workload W           zero or activations (default zero)\n"
	    "      --iters N              iterations (default %d)\n"
	    "      --ranks N              processes at once, one per GPU (default %d)\n"
	    "      --between CMD          run sh -c CMD between iterations, with\n"
	    "                             SWAPBENCH_ITER and SWAPBENCH_DIR set (default none)\n"
	    "      --trace FILE           log when each phase of --workload zero starts: one\n"
	    "                             line of CLOCK_MONOTONIC seconds, rank, iteration,\n"
	    "                             phase, subgroup (default none)\n"
	    "      --no-verify            do not stamp or check data (sizes are still checked)\n"
	    "      --verify-full          stamp and check every byte (default: a header and\n"
	    "                             4 words per 4 KiB)\n"
	    "      --json                 print one JSON object instead of text\n"
	    "  -h, --help                 print this help\n"
	    "  -V, --version              print the version\n"
	    "\n"
	    "libaio, as DeepSpeed's \"aio\" section:\n"
	    "      --threads N            threads per handle, each with its own context\n"
	    "                             (intra_op_parallelism, default %d)\n"
	    "      --queue-depth N        requests in flight per thread (default %d)\n"
	    "      --block-size SIZE      bytes per request, a multiple of 4 KiB\n"
	    "                             (default %llu KiB)\n"
	    "      --no-overlap-events    submit a queue's worth, wait for all of it\n"
	    "                             (default: sliding window)\n"
	    "      --single-submit        one io_submit per request (default off)\n"
	    "\n"
	    "ZeRO-Infinity (--workload zero):\n"
	    "      --swapper S            partitioned or pipelined (default partitioned)\n"
	    "      --params N             model parameter elements, e.g. 1e9, 500M, 7G\n"
	    "                             (default %llu)\n"
	    "      --hidden H             hidden size (default: from --params)\n"
	    "      --sub-group-size N     elements per optimizer subgroup (default %llu)\n"
	    "      --offload-params       parameters on NVMe too (default off)\n"
	    "      --param-dtype T        fp16, float16 or bfloat16: names the folder\n"
	    "                             <T>params (default %s)\n"
	    "      --buffer-count N       optimizer swap buffers (default %d)\n"
	    "      --param-buffer-count N parameter swap buffers (default %d)\n"
	    "      --compute-ms MS        simulated CPU Adam time per subgroup (default %g)\n"
	    "      --compute-gbps G       or a simulated CPU Adam rate, in GB of state per\n"
	    "                             second (16 bytes per element; default %g: off)\n"
	    "\n"
	    "Activation offloading (--workload activations):\n"
	    "      --layers N             activations per micro-batch (default %d)\n"
	    "      --act-size SIZE        bytes per activation (default %llu MiB)\n"
	    "      --micro-batches M      micro-batches per iteration (default %d)\n"
	    "      --act-reuse R          delete or overwrite (default delete)\n"
	    "      --compute-ms, --compute-gbps also set the time of each layer.\n"
	    "\n"
	    "Counts take K, M, G, T (powers of 1000) or exponents; sizes take K, M, G, T\n"
	    "(powers of 1024, KiB also accepted).  Exit status: 0 success, 1 usage or\n"
	    "setup error, 2 data mismatch, short or failed transfer.\n",
	    d->iters, d->ranks, d->threads, d->queue_depth,
	    (unsigned long long)(d->block_size / SB_KIB), (unsigned long long)d->params,
	    (unsigned long long)d->sub_group_size, d->param_dtype, d->optimizer_buffers,
	    d->param_buffers, d->compute_ms, d->compute_gbps, d->layers,
	    (unsigned long long)(d->act_size / SB_KIB / SB_KIB), d->micro_batches);
}

/* A number with an optional suffix; @unit is SB_COUNT_UNIT or SB_KIB. */
static int parse_scaled(const char *s, uint64_t unit, uint64_t *out)
{
	static const char suffixes[] = "kmgt";
	const char *p;
	char *end;
	double v, mult = 1;

	errno = 0;
	v = strtod(s, &end);
	if (end == s || errno || !(v > 0))
		return -EINVAL;
	p = strchr(suffixes, *end >= 'A' && *end <= 'Z' ? *end - 'A' + 'a' : *end);
	if (*end && p) {
		for (const char *q = suffixes; q <= p; q++)
			mult *= (double)unit;
		end++;
		if (unit == SB_KIB && *end == 'i')
			end++;
		if (unit == SB_KIB && (*end == 'B' || *end == 'b'))
			end++;
	}
	if (*end)
		return -EINVAL;
	v *= mult;
	if (v > (double)SB_MAX_COUNT || v < 1)
		return -ERANGE;
	*out = (uint64_t)(v + 0.5);
	if ((double)*out - v > 1e-6 * v || v - (double)*out > 1e-6 * v)
		return -EINVAL;
	return 0;
}

static int parse_int(const char *s, int min, int max, int *out)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (end == s || *end || errno || v < min || v > max)
		return -EINVAL;
	*out = (int)v;
	return 0;
}

static int parse_double(const char *s, double *out)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (end == s || *end || errno || !(v >= 0) || v > (double)SB_MAX_COUNT)
		return -EINVAL;
	*out = v;
	return 0;
}

static int bad_arg(const char *opt, const char *arg, const char *want)
{
	sb_err("invalid argument '%s' for --%s: %s", arg, opt, want);
	return -EINVAL;
}

/* A number option: 0 when opt is none of them, 1 when parsed, -EINVAL when bad. */
static int parse_number(struct sb_config *c, int opt, const char *arg, const char *name)
{
	/* Counts and sizes: K, M, G, T suffixes (unit), at least 1. */
	const struct {
		int opt;
		uint64_t unit;
		uint64_t *dst;
		const char *want;
	} scaled[] = {
	    {OPT_PARAMS, SB_COUNT_UNIT, &c->params, "a count"},
	    {OPT_HIDDEN, SB_COUNT_UNIT, &c->hidden, "a count"},
	    {OPT_SUB_GROUP, SB_COUNT_UNIT, &c->sub_group_size, "a count"},
	    {OPT_ACT_SIZE, SB_KIB, &c->act_size, "a size"},
	};
	/* Whole numbers from 1 to max. */
	const struct {
		int opt;
		int max;
		int *dst;
		const char *want;
	} ints[] = {
	    {OPT_RANKS, SB_MAX_RANKS, &c->ranks, "1 to 1024"},
	    {OPT_THREADS, SB_MAX_THREADS, &c->threads, "1 to 1024"},
	    {OPT_QUEUE_DEPTH, SB_MAX_QUEUE_DEPTH, &c->queue_depth, "1 to 65536"},
	    {OPT_BUFFER_COUNT, SB_MAX_BUFFERS, &c->optimizer_buffers, "1 to 1024"},
	    {OPT_PARAM_BUFFER_COUNT, SB_MAX_BUFFERS, &c->param_buffers, "1 to 1024"},
	    {OPT_ITERS, SB_MAX_ITERS, &c->iters, "at least 1"},
	    {OPT_LAYERS, SB_MAX_ITERS, &c->layers, "at least 1"},
	    {OPT_MICRO_BATCHES, SB_MAX_ITERS, &c->micro_batches, "at least 1"},
	};

	for (size_t i = 0; i < sizeof(scaled) / sizeof(scaled[0]); i++)
		if (scaled[i].opt == opt)
			return parse_scaled(arg, scaled[i].unit, scaled[i].dst)
				   ? bad_arg(name, arg, scaled[i].want)
				   : 1;
	for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++)
		if (ints[i].opt == opt)
			return parse_int(arg, 1, ints[i].max, ints[i].dst)
				   ? bad_arg(name, arg, ints[i].want)
				   : 1;
	return 0;
}

/*
 * A word option: the index of the word given, -ENOENT when opt is none of
 * them, or -EINVAL (said) when arg is none of its words.
 */
static int parse_word(int opt, const char *arg, const char *name)
{
	static const struct {
		int opt;
		const char *words[4];
	} choices[] = {
	    {OPT_WORKLOAD, {"zero", "activations"}},	 /* enum sb_workload */
	    {OPT_SWAPPER, {"partitioned", "pipelined"}}, /* enum sb_swapper */
	    {OPT_ACT_REUSE, {"delete", "overwrite"}},	 /* enum sb_act_reuse */
	    {OPT_PARAM_DTYPE, {"fp16", "float16", "bfloat16"}},
	};

	for (size_t i = 0; i < sizeof(choices) / sizeof(choices[0]); i++) {
		const char *const *w = choices[i].words;
		char want[128] = "";

		if (choices[i].opt != opt)
			continue;
		for (int k = 0; w[k]; k++) {
			if (!strcmp(arg, w[k]))
				return k;
			snprintf(want + strlen(want), sizeof(want) - strlen(want), "%s%s",
				 !k	    ? ""
				 : w[k + 1] ? ", "
					    : " or ",
				 w[k]);
		}
		return bad_arg(name, arg, want);
	}
	return -ENOENT;
}

static int parse_option(struct sb_config *c, int opt, const char *arg, const char *name)
{
	/* Switches: the value each gives its field. */
	const struct {
		int opt;
		bool *dst, val;
	} switches[] = {
	    {OPT_NO_OVERLAP, &c->overlap_events, false},
	    {OPT_SINGLE_SUBMIT, &c->single_submit, true},
	    {OPT_OFFLOAD_PARAMS, &c->offload_params, true},
	    {OPT_NO_VERIFY, &c->verify, false},
	    {OPT_VERIFY_FULL, &c->verify_full, true},
	    {OPT_JSON, &c->json, true},
	};
	/* Strings kept as given (--param-dtype once parse_word has checked it). */
	const struct {
		int opt;
		const char **dst;
	} strings[] = {
	    {'d', &c->dir},
	    {OPT_BETWEEN, &c->between},
	    {OPT_TRACE, &c->trace},
	    {OPT_PARAM_DTYPE, &c->param_dtype},
	};
	int ret = parse_number(c, opt, arg, name);
	int word;

	if (ret)
		return ret < 0 ? ret : 0;
	word = parse_word(opt, arg, name);
	if (word == -EINVAL)
		return word;
	for (size_t i = 0; i < sizeof(switches) / sizeof(switches[0]); i++)
		if (switches[i].opt == opt) {
			*switches[i].dst = switches[i].val;
			return 0;
		}
	for (size_t i = 0; i < sizeof(strings) / sizeof(strings[0]); i++)
		if (strings[i].opt == opt) {
			*strings[i].dst = arg;
			return 0;
		}
	switch (opt) {
	case OPT_WORKLOAD:
		c->workload = (enum sb_workload)word;
		return 0;
	case OPT_SWAPPER:
		c->swapper = (enum sb_swapper)word;
		return 0;
	case OPT_ACT_REUSE:
		c->act_reuse = (enum sb_act_reuse)word;
		return 0;
	case OPT_BLOCK_SIZE:
		if (parse_scaled(arg, SB_KIB, &c->block_size) || c->block_size % SB_BUF_ALIGN)
			return bad_arg(name, arg, "a size, a multiple of 4 KiB");
		return 0;
	case OPT_COMPUTE_MS:
		return parse_double(arg, &c->compute_ms) ? bad_arg(name, arg, "milliseconds") : 0;
	case OPT_COMPUTE_GBPS:
		return parse_double(arg, &c->compute_gbps) ? bad_arg(name, arg, "GB/s") : 0;
	default:
		return -EINVAL;
	}
}

/* 0 to run, 1 when --help or --version was answered, -EINVAL on bad usage. */
static int parse_args(struct sb_config *c, int argc, char **argv)
{
	struct stat st;
	int opt, idx;

	*c = sb_defaults;
	opterr = 0;
	while ((opt = getopt_long(argc, argv, ":d:hV", sb_options, &idx)) != -1) {
		if (opt == 'h') {
			usage(stdout);
			return 1;
		}
		if (opt == 'V') {
			printf("swapbench %s\n", TFS_VERSION);
			return 1;
		}
		if (opt == '?' || opt == ':') {
			sb_err("%s option '%s'; see --help",
			       opt == '?' ? "unknown" : "missing argument to", argv[optind - 1]);
			return -EINVAL;
		}
		const char *name = opt == 'd' ? "dir" : sb_options[idx].name;

		if (parse_option(c, opt, optarg, name))
			return -EINVAL;
	}
	if (optind < argc && !c->dir)
		c->dir = argv[optind++];
	if (optind < argc) {
		sb_err("unexpected argument '%s'; see --help", argv[optind]);
		return -EINVAL;
	}
	if (!c->dir) {
		sb_err("no folder given; see --help");
		return -EINVAL;
	}
	if (c->compute_ms > 0 && c->compute_gbps > 0) {
		sb_err("--compute-ms and --compute-gbps exclude each other");
		return -EINVAL;
	}
	if (stat(c->dir, &st) || !S_ISDIR(st.st_mode)) {
		sb_err("%s: not a folder", c->dir);
		return -EINVAL;
	}
	return 0;
}

/* Refuse to start a run whose buffers cannot fit in memory. */
static int check_memory(const struct sb_config *cfg, const struct sb_plan *plan)
{
	long pages = sysconf(_SC_PHYS_PAGES);
	long page = sysconf(_SC_PAGESIZE);
	uint64_t need = plan->buffer_bytes * (uint64_t)cfg->ranks;

	if (pages <= 0 || page <= 0 || need <= (uint64_t)pages * (uint64_t)page)
		return 0;
	sb_err("the buffers need %llu MB (%llu MB per rank), more than the %llu MB of memory; "
	       "use a smaller --sub-group-size or fewer --ranks",
	       (unsigned long long)(need >> 20), (unsigned long long)(plan->buffer_bytes >> 20),
	       (unsigned long long)(((uint64_t)pages * (uint64_t)page) >> 20));
	return -ENOMEM;
}

static int rank_main(const struct sb_config *cfg, struct sb_rank *r)
{
	int ret;

	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (cfg->workload == SB_WORKLOAD_ZERO)
		ret = zero_run(cfg, r);
	else
		ret = act_run(cfg, r);
	if (!ret)
		return SB_EXIT_OK;
	if (ret == -ECANCELED)
		return SB_EXIT_SETUP;
	return r->running ? SB_EXIT_DATA : SB_EXIT_SETUP;
}

/* The parent's view of the ranks. */
struct sb_run {
	const struct sb_config *cfg;
	struct sb_shared *sh;
	struct sb_rank *ranks;
	pid_t *pids; /* 0 once reaped */
	int status;  /* worst exit status so far */
};

static int exit_status(int ws)
{
	if (WIFEXITED(ws))
		return WEXITSTATUS(ws);
	return SB_EXIT_SETUP;
}

static void note_exit(struct sb_run *run, int i, int ws)
{
	int st = exit_status(ws);

	run->pids[i] = 0;
	if (WIFSIGNALED(ws))
		sb_err("rank %d killed by signal %d", i, WTERMSIG(ws));
	else if (st && run->cfg->ranks > 1)
		sb_err("rank %d failed (exit status %d)", i, st);
	if (st > run->status)
		run->status = st;
}

/* Reap ranks that exited; -ECHILD if one of them failed. */
static int reap_some(struct sb_run *run, bool block)
{
	int ret = 0;

	for (int i = 0; i < run->cfg->ranks; i++) {
		int ws;

		if (!run->pids[i] || waitpid(run->pids[i], &ws, block ? 0 : WNOHANG) <= 0)
			continue;
		note_exit(run, i, ws);
		if (exit_status(ws) != SB_EXIT_OK)
			ret = -ECHILD;
	}
	return ret;
}

/* Wait until one more rank posts done; -ECHILD if a rank failed meanwhile. */
static int wait_done(struct sb_run *run)
{
	int ret;

	for (;;) {
		struct timespec ts;

		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += SB_POLL_NS;
		if (ts.tv_nsec >= SB_NS_PER_S) {
			ts.tv_sec++;
			ts.tv_nsec -= SB_NS_PER_S;
		}
		if (!sem_timedwait(&run->sh->done, &ts))
			return 0;
		if (errno != ETIMEDOUT && errno != EINTR) {
			ret = -errno;
			sb_err("sem_timedwait: %s", strerror(errno));
			return ret;
		}
		ret = reap_some(run, false);
		if (ret)
			return ret;
	}
}

static int run_between(const struct sb_config *cfg, int k)
{
	char iter[16];
	int ws;

	snprintf(iter, sizeof(iter), "%d", k);
	setenv("SWAPBENCH_ITER", iter, 1);
	setenv("SWAPBENCH_DIR", cfg->dir, 1);
	fflush(stdout);
	ws = system(cfg->between);
	if (ws != -1 && WIFEXITED(ws) && WEXITSTATUS(ws) == 0)
		return 0;
	sb_err("--between command failed after iteration %d (status %d)", k,
	       ws != -1 && WIFEXITED(ws) ? WEXITSTATUS(ws) : -1);
	return -ECANCELED;
}

static void stop_ranks(struct sb_run *run)
{
	run->sh->abort = 1;
	for (int i = 0; i < run->cfg->ranks; i++)
		if (run->pids[i])
			kill(run->pids[i], SIGTERM);
	for (int i = 0; i < run->cfg->ranks; i++) {
		int ws;

		if (run->pids[i] && waitpid(run->pids[i], &ws, 0) > 0)
			run->pids[i] = 0;
	}
}

/* Drive the phases; returns the last phase every rank finished (-1: none). */
static int monitor(struct sb_run *run)
{
	const struct sb_config *cfg = run->cfg;
	int done = -1;

	for (int k = 0; k <= cfg->iters; k++) {
		for (int n = 0; n < cfg->ranks; n++) {
			if (wait_done(run))
				goto fail;
		}
		done = k;
		report_phase(cfg, run->ranks, k);
		if (k == cfg->iters)
			break;
		if (k > 0 && cfg->between && run_between(cfg, k)) {
			if (run->status < SB_EXIT_SETUP)
				run->status = SB_EXIT_SETUP;
			goto fail;
		}
		for (int n = 0; n < cfg->ranks; n++)
			sem_post(&run->sh->go);
	}
	reap_some(run, true);
	return done;
fail:
	stop_ranks(run);
	return done;
}

static int start_ranks(struct sb_run *run)
{
	fflush(stdout);
	fflush(stderr);
	for (int i = 0; i < run->cfg->ranks; i++) {
		pid_t pid = fork();

		if (pid < 0) {
			sb_err("fork: %s", strerror(errno));
			stop_ranks(run);
			return -errno;
		}
		if (pid == 0)
			_exit(rank_main(run->cfg, &run->ranks[i]));
		run->pids[i] = pid;
	}
	return 0;
}

/* The shared segment: header, ranks, then every rank's iterations. */
static int map_shared(struct sb_run *run)
{
	const struct sb_config *cfg = run->cfg;
	size_t ranks_off = sb_align_up(sizeof(struct sb_shared), SB_BUF_ALIGN);
	size_t iters_off = ranks_off + (size_t)cfg->ranks * sizeof(struct sb_rank);
	size_t len = iters_off + (size_t)cfg->ranks * (size_t)cfg->iters * sizeof(struct sb_phase);
	char *base;

	base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (base == MAP_FAILED) {
		sb_err("mmap %zu bytes: %s", len, strerror(errno));
		return -ENOMEM;
	}
	run->sh = (struct sb_shared *)base;
	run->ranks = (struct sb_rank *)(base + ranks_off);
	run->sh->iters = cfg->iters;
	if (sem_init(&run->sh->done, 1, 0) || sem_init(&run->sh->go, 1, 0)) {
		sb_err("sem_init: %s", strerror(errno));
		return -errno;
	}
	for (int i = 0; i < cfg->ranks; i++) {
		run->ranks[i].rank = i;
		run->ranks[i].sync = run->sh;
		run->ranks[i].iters =
		    (struct sb_phase *)(base + iters_off) + (size_t)i * (size_t)cfg->iters;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct sb_config cfg;
	struct sb_plan plan;
	struct sb_run run = {.cfg = &cfg};
	int done;
	int ret;

	ret = parse_args(&cfg, argc, argv);
	if (ret)
		return ret > 0 ? SB_EXIT_OK : SB_EXIT_SETUP;
	stamp_set_full(cfg.verify_full);
	ret = cfg.workload == SB_WORKLOAD_ZERO ? zero_plan(&cfg, &plan) : act_plan(&cfg, &plan);
	if (ret || check_memory(&cfg, &plan))
		return SB_EXIT_SETUP;
	if (cfg.trace) {
		/* Emptied once here; each rank appends its own lines. */
		int fd = open(cfg.trace, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);

		if (fd < 0) {
			sb_err("--trace %s: %s", cfg.trace, strerror(errno));
			return SB_EXIT_SETUP;
		}
		close(fd);
	}
	run.pids = calloc((size_t)cfg.ranks, sizeof(*run.pids));
	if (!run.pids || map_shared(&run))
		return SB_EXIT_SETUP;
	report_header(&cfg, &plan);
	if (start_ranks(&run))
		return SB_EXIT_SETUP;
	done = monitor(&run);
	if (report_summary(&cfg, &plan, run.ranks, done, run.status) && !run.status)
		run.status = SB_EXIT_SETUP;
	free(run.pids);
	return run.status;
}

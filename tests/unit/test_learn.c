/*
 * Unit test of the access-trace learner: it finds the cycle of a
 * DeepSpeed-like optimizer step (gradients written, then per subgroup the
 * weights and Adam states read, gradients read, states written back), ranks
 * files by their next use, survives a skipped file, and drops the cycle when
 * the workload changes; and the same for eight ranks at once, each in a
 * folder of its own, whose records interleave differently every time;
 * a cycle of more uses than the ring first keeps; and deleted files
 * forgotten.
 */
#include "learn.h"
#include "test.h"

#define SGS 6
#define GRADS 3 /* gradient files per subgroup */

static uint64_t file_id(int sg, int kind)
{
	return 100 + (uint64_t)sg * 10 + (uint64_t)kind; /* kind 0..2 state, 3.. grads */
}

#define FILE_BYTES (64ULL << 20)

/* One use of a file: read or written whole. */
static void use(struct fs_learner *l, uint64_t ino, bool write)
{
	fs_learn_touch(l, ino, 0, FILE_BYTES, 0, FILE_BYTES, write);
}

static void touch(struct fs_learner *l, uint64_t ino)
{
	use(l, ino, false);
}

/* One training iteration; skip_sg >= 0 leaves one subgroup's grads out. */
static void iteration(struct fs_learner *l, int skip_sg)
{
	for (int sg = SGS - 1; sg >= 0; sg--) /* backward: last layer first */
		for (int g = 0; g < GRADS; g++)
			if (sg != skip_sg)
				use(l, file_id(sg, 3 + g), true);
	for (int sg = 0; sg < SGS; sg++) {
		for (int k = 0; k < 3; k++)
			use(l, file_id(sg, k), false);
		for (int g = 0; g < GRADS; g++)
			if (sg != skip_sg)
				use(l, file_id(sg, 3 + g), false);
		for (int k = 0; k < 3; k++)
			use(l, file_id(sg, k), true);
	}
}

/* ---- the pipelined swapper: two streams of 1 MiB requests taking turns ---- */

#define CHUNK (1ULL << 20)
#define PIPE_FILE (16ULL << 20)
#define MAX_RUN 3 /* requests of one stream in a row, at most */

struct stream {
	uint64_t files[3 + GRADS];
	int nfiles, file;
	bool write;
	uint64_t done; /* bytes of the current file */
};

static bool stream_step(struct fs_learner *l, struct stream *st)
{
	if (st->file == st->nfiles)
		return false;
	fs_learn_touch(l, st->files[st->file], 0, PIPE_FILE, st->done, CHUNK, st->write);
	st->done += CHUNK;
	if (st->done == PIPE_FILE) {
		st->done = 0;
		st->file++;
	}
	return true;
}

/* Subgroup sg's state files, and its gradients when grads is set. */
static void stream_init(struct stream *st, int sg, bool grads)
{
	st->nfiles = st->file = 0;
	st->write = !grads;
	st->done = 0;
	if (sg < 0 || sg >= SGS)
		return;
	for (int k = 0; k < 3; k++)
		st->files[st->nfiles++] = file_id(sg, k);
	for (int g = 0; grads && g < GRADS; g++)
		st->files[st->nfiles++] = file_id(sg, 3 + g);
}

/*
 * While sg computes, sg + 1 is read and sg - 1 written, in a jittered order.
 * stall: after each write, the reads take that many requests in a row (a
 * write slowed down, as the first iteration's, whose files are new).
 */
static void pipelined_iteration_stalls(struct fs_learner *l, unsigned *seed, int stall)
{
	for (int sg = SGS - 1; sg >= 0; sg--) {
		struct stream g;

		stream_init(&g, sg, true);
		g.file = 3; /* the backward pass writes the gradients only */
		while (stream_step(l, &g))
			;
	}
	for (int sg = -1; sg <= SGS; sg++) {
		struct stream rd, wr;
		int run = 0, last = 0;

		stream_init(&rd, sg + 1, true);
		stream_init(&wr, sg - 1, false);
		for (;;) {
			int pick = (int)(rand_r(seed) % 2);

			if (run >= MAX_RUN)
				pick = !last;
			if (!(pick ? stream_step(l, &wr) : stream_step(l, &rd)) &&
			    !(pick ? stream_step(l, &rd) : stream_step(l, &wr)))
				break;
			run = pick == last ? run + 1 : 1;
			last = pick;
			for (int k = 0; pick && k < stall; k++)
				stream_step(l, &rd);
		}
	}
}

static void pipelined_iteration(struct fs_learner *l, unsigned *seed)
{
	pipelined_iteration_stalls(l, seed, 0);
}

static void test_pipelined(void)
{
	struct fs_learner l;
	struct fs_learn_stats st;
	unsigned seed = 12345;

	CHECK_EQ(fs_learn_init(&l), 0);
	for (int i = 0; i < 4; i++)
		pipelined_iteration(&l, &seed);
	fs_learn_stats(&l, &st);
	CHECK(st.period != 0);
	CHECK(st.confidence > 0.7);
	/* The last subgroup was just written: it is used after the first one. */
	CHECK(fs_learn_distance(&l, file_id(0, 0)) < fs_learn_distance(&l, file_id(SGS - 1, 0)));
	for (int i = 0; i < 3; i++)
		pipelined_iteration(&l, &seed);
	fs_learn_stats(&l, &st);
	CHECK(st.period != 0);
	fs_learn_fini(&l);
}

/*
 * A use goes on where it reached, whatever went to other files meanwhile:
 * a write interrupted by more than REPEAT_MIN of reads is one use, not one
 * per interruption; a pass from the start, or the other direction, is a
 * new one.
 */
static void run(struct fs_learner *l, uint64_t ino, uint64_t size, uint64_t off, uint64_t len,
		bool write)
{
	for (uint64_t at = off; at < off + len; at += CHUNK)
		fs_learn_touch(l, ino, 0, size, at, CHUNK, write);
}

static void test_use_goes_on(void)
{
	const uint64_t mib = 1ULL << 20, w_size = 64 * mib, r_size = 1024 * mib;
	struct fs_learner l;
	struct fs_learn_stats st;

	/* W: 16 MiB to other files leave it alone; R: 256 MiB (never, here). */
	CHECK_EQ(fs_learn_init(&l), 0);
	run(&l, 1, w_size, 0, mib, true);
	run(&l, 2, r_size, 0, 32 * mib, false);
	fs_learn_stats(&l, &st);
	CHECK_EQ(st.records, 2);
	/* 32 MiB went to R since: W goes on where it reached, one use still. */
	run(&l, 1, w_size, mib, mib, true);
	fs_learn_stats(&l, &st);
	CHECK_EQ(st.records, 2);
	/* A little behind where it reached (requests out of order) too. */
	run(&l, 2, r_size, 32 * mib, 32 * mib, false);
	fs_learn_touch(&l, 1, 0, w_size, mib + mib / 2, mib / 2, true);
	fs_learn_stats(&l, &st);
	CHECK_EQ(st.records, 2);
	/* From the start: a new use. */
	run(&l, 2, r_size, 64 * mib, 32 * mib, false);
	run(&l, 1, w_size, 0, mib, true);
	fs_learn_stats(&l, &st);
	CHECK_EQ(st.records, 3);
	/* Read where the write reached: a new use. */
	run(&l, 2, r_size, 96 * mib, 32 * mib, false);
	run(&l, 1, w_size, mib, mib, false);
	fs_learn_stats(&l, &st);
	CHECK_EQ(st.records, 4);
	/* Further on than GO_ON_SLACK beyond it: a new use. */
	run(&l, 2, r_size, 128 * mib, 32 * mib, false);
	run(&l, 1, w_size, 80 * mib, mib, false);
	fs_learn_stats(&l, &st);
	CHECK_EQ(st.records, 5);
	fs_learn_fini(&l);
}

/*
 * The pipelined swapper's first iteration writes its new files slowly:
 * each subgroup's state write is interrupted by more than REPEAT_MIN of
 * reads, and was recorded once per interruption. The second iteration,
 * at full speed, then matched the first nowhere near, and the cycle came
 * an iteration late, or went again. Now each iteration makes the same
 * uses, and the cycle is known during the second and holds.
 */
static void test_pipelined_stalls(void)
{
	struct fs_learner l;
	struct fs_learn_stats st;
	unsigned seed = 777;
	uint64_t first;

	CHECK_EQ(fs_learn_init(&l), 0);
	pipelined_iteration_stalls(&l, &seed, 10);
	fs_learn_stats(&l, &st);
	first = st.records;
	CHECK_EQ(st.period, 0);
	pipelined_iteration(&l, &seed);
	fs_learn_stats(&l, &st);
	CHECK_EQ(st.records, 2 * first); /* the same uses in both */
	CHECK(st.period != 0);
	for (int i = 0; i < 4; i++) {
		pipelined_iteration(&l, &seed);
		fs_learn_stats(&l, &st);
		CHECK(st.period + first / 8 >= first && st.period <= first + first / 8);
		CHECK(st.confidence > 0.7);
	}
	fs_learn_fini(&l);
}

/*
 * The period holds at every record once it is known. Within one iteration,
 * a subgroup's state read and then written back repeats at a short
 * distance, and for a while the last records fit that sub-period too; the
 * learner must not take it (the cache would evict on the wrong cycle for
 * part of every iteration), nor a period a few records off the true one.
 */
static void test_period_holds(void)
{
	const uint64_t period = SGS * GRADS + SGS * (3 + GRADS + 3);
	struct fs_learner l;
	struct fs_learn_stats st;
	unsigned changes = 0;

	CHECK_EQ(fs_learn_init(&l), 0);
	for (int i = 0; i < 3; i++)
		iteration(&l, -1);
	fs_learn_stats(&l, &st);
	CHECK_EQ(st.period, period);
	/* Four more iterations, in iteration()'s order, a record at a time. */
	for (int i = 0; i < 4; i++) {
		uint64_t order[SGS * (3 + GRADS + 3)];
		bool wr[SGS * (3 + GRADS + 3)];
		unsigned n = 0;

		for (int sg = SGS - 1; sg >= 0; sg--)
			for (int g = 0; g < GRADS; g++) {
				use(&l, file_id(sg, 3 + g), true);
				fs_learn_stats(&l, &st);
				changes += st.period != period;
			}
		for (int sg = 0; sg < SGS; sg++) {
			for (int k = 0; k < 3; k++)
				order[n] = file_id(sg, k), wr[n++] = false;
			for (int g = 0; g < GRADS; g++)
				order[n] = file_id(sg, 3 + g), wr[n++] = false;
			for (int k = 0; k < 3; k++)
				order[n] = file_id(sg, k), wr[n++] = true;
		}
		for (unsigned j = 0; j < n; j++) {
			use(&l, order[j], wr[j]);
			fs_learn_stats(&l, &st);
			changes += st.period != period;
		}
	}
	CHECK_EQ(changes, 0);
	fs_learn_fini(&l);
}

/* ---- ranks: one folder each, interleaved at random ---- */

#define RANKS 8
#define RANK_RECORDS (SGS * GRADS + SGS * (3 + GRADS + 3))

/* Rank r's file: file_id's numbers, apart for each rank. */
static uint64_t rank_file(int r, int sg, int kind)
{
	return (uint64_t)(r + 1) * 1000 + file_id(sg, kind);
}

/* Rank r's iteration, as iteration() records it. */
static unsigned rank_iteration(int r, uint64_t *ino, bool *wr)
{
	unsigned n = 0;

	for (int sg = SGS - 1; sg >= 0; sg--)
		for (int g = 0; g < GRADS; g++)
			ino[n] = rank_file(r, sg, 3 + g), wr[n++] = true;
	for (int sg = 0; sg < SGS; sg++) {
		for (int k = 0; k < 3; k++)
			ino[n] = rank_file(r, sg, k), wr[n++] = false;
		for (int g = 0; g < GRADS; g++)
			ino[n] = rank_file(r, sg, 3 + g), wr[n++] = false;
		for (int k = 0; k < 3; k++)
			ino[n] = rank_file(r, sg, k), wr[n++] = true;
	}
	return n;
}

/*
 * Eight iterations of nranks ranks, rank r in folder key[r], their records
 * taken in a random order, all done before the next iteration begins.
 * Returns after how many of the last five every rank's cycle held.
 */
static unsigned ranks_run(struct fs_learner *l, int nranks, const uint64_t *key, unsigned seed)
{
	static uint64_t ino[RANKS][RANK_RECORDS];
	static bool wr[RANKS][RANK_RECORDS];
	struct fs_learn_stats st;
	unsigned held = 0;

	for (int it = 0; it < 8; it++) {
		unsigned at[RANKS] = {0}, left = (unsigned)nranks;

		for (int r = 0; r < nranks; r++)
			CHECK_EQ(rank_iteration(r, ino[r], wr[r]), RANK_RECORDS);
		while (left) {
			int r = (int)(rand_r(&seed) % (unsigned)nranks);
			unsigned run = 1 + rand_r(&seed) % 8;

			for (; run && at[r] < RANK_RECORDS; run--, at[r]++) {
				fs_learn_touch(l, ino[r][at[r]], key[r], FILE_BYTES, 0, FILE_BYTES,
					       wr[r][at[r]]);
				if (at[r] + 1 == RANK_RECORDS)
					left--;
			}
		}
		fs_learn_stats(l, &st);
		if (it >= 3)
			held += st.period == (uint64_t)nranks * RANK_RECORDS;
	}
	return held;
}

/*
 * Eight ranks, each in its own folder: an iteration of each, their records
 * taken in a random order (a rank runs ahead of the others for a while,
 * then falls behind), all of them done before the next iteration begins,
 * as the gradients' all-reduce makes them. Each rank's stream holds its
 * cycle; in one sequence, the ranks' records drift by more than the jitter
 * and no cycle held (what swapbench --ranks 8 showed on a mount).
 */
static void test_ranks(void)
{
	uint64_t key[RANKS];
	struct fs_learner l;
	struct fs_learn_stats st;
	unsigned held;

	for (int r = 0; r < RANKS; r++)
		key[r] = 500 + (uint64_t)r;
	CHECK_EQ(fs_learn_init(&l), 0);
	held = ranks_run(&l, RANKS, key, 777);
	fs_learn_stats(&l, &st);
	CHECK_EQ(st.streams, RANKS);
	CHECK_EQ(held, 5); /* every rank's cycle, after each of the last five iterations */
	CHECK(st.confidence > 0.7);
	CHECK_EQ(st.bytes, (uint64_t)RANKS * SGS * (3 + GRADS) * FILE_BYTES);
	/* Each rank: its first subgroup is used before its last one, just written. */
	for (int r = 0; r < RANKS; r++)
		CHECK(fs_learn_distance(&l, rank_file(r, 0, 0)) <
		      fs_learn_distance(&l, rank_file(r, SGS - 1, 0)));
	/*
	 * Distances are the share of a rank's cycle left, in all the ranks'
	 * records: a file due in a rank's next record is due in about RANKS
	 * records of all of them, and none is further than a whole cycle.
	 */
	for (int r = 0; r < RANKS; r++)
		for (int sg = 0; sg < SGS; sg++)
			CHECK(fs_learn_distance(&l, rank_file(r, sg, 0)) <= st.period);
	{
		uint64_t next[16], gen;
		unsigned k = fs_learn_next(&l, next, 16, 64 * FILE_BYTES, &gen), firsts = 0;

		/* What comes next to load: every rank's subgroup 0, not one rank's files. */
		CHECK(k >= RANKS);
		for (unsigned i = 0; i < k; i++)
			for (int r = 0; r < RANKS; r++)
				firsts += next[i] == rank_file(r, 0, 0);
		CHECK_EQ(firsts, RANKS);
	}
	{
		/*
		 * The ranks' files tie at every distance: the first to load is
		 * each rank's in turn, one call after another (in the streams'
		 * order it was the first stream's every time, so that one rank's
		 * files were always loaded first).
		 */
		uint64_t next[16], gen;
		unsigned seen = 0;

		for (int call = 0; call < RANKS; call++) {
			CHECK(fs_learn_next(&l, next, 16, 64 * FILE_BYTES, &gen) >= RANKS);
			CHECK(next[0] >= 1000 && next[0] / 1000 - 1 < RANKS); /* a rank's file */
			seen |= 1u << (next[0] / 1000 - 1);
		}
		CHECK_EQ(seen, (1u << RANKS) - 1);
	}
	fs_learn_fini(&l);
}

/*
 * More folders than streams: 64 folders used once long ago, then two ranks
 * at once, the second in a 65th folder whose number would share the first
 * rank's stream by hash. The new folder takes over the stream used least
 * recently instead, and both ranks hold their cycles.
 */
static void test_streams_full(void)
{
	/* Rank 0 in folder 1040, the 41st; rank 1 in 1064, the 65th. */
	const uint64_t key[2] = {1040, 1064};
	struct fs_learner l;
	struct fs_learn_stats st;
	unsigned held;

	CHECK_EQ(fs_learn_init(&l), 0);
	for (uint64_t k = 0; k < FS_LEARN_STREAMS; k++)
		fs_learn_touch(&l, 90000 + k, 1000 + k, FILE_BYTES, 0, FILE_BYTES, true);
	fs_learn_stats(&l, &st);
	CHECK_EQ(st.streams, FS_LEARN_STREAMS);
	held = ranks_run(&l, 2, key, 4242);
	fs_learn_stats(&l, &st);
	CHECK_EQ(st.streams, FS_LEARN_STREAMS);
	CHECK_EQ(held, 5);
	fs_learn_fini(&l);
}

/*
 * A folder of LONG_FILES files read in turn, pass after pass: a cycle of
 * more uses than the stream's ring first keeps (8192 records, periods up to
 * 4096), as a large model's optimizer with a gradient file per parameter
 * makes. It is found once the ring has grown, by the third pass, ranks
 * the files by their next use, and its sizes are those of every file.
 */
#define LONG_FILES 20000

static void test_long_cycle(void)
{
	struct fs_learner l;
	struct fs_learn_stats st;
	uint64_t next[4], gen;
	int found = -1;

	CHECK_EQ(fs_learn_init(&l), 0);
	l.block = 1ULL << 20;
	for (int pass = 0; pass < 4; pass++) {
		for (uint64_t i = 0; i < LONG_FILES; i++)
			fs_learn_touch(&l, 1000000 + i, 0, CHUNK, 0, CHUNK, false);
		fs_learn_stats(&l, &st);
		if (found < 0 && st.period)
			found = pass;
	}
	CHECK(found >= 1 && found <= 2);
	CHECK_EQ(st.period, LONG_FILES);
	CHECK(st.confidence > 0.9);
	CHECK_EQ(st.bytes, LONG_FILES * CHUNK);
	CHECK_EQ(st.blocks, LONG_FILES);
	CHECK_EQ(st.written, 0); /* a cycle that only reads */
	/* After a pass, the first file is next, the last furthest. */
	CHECK_EQ(fs_learn_distance(&l, 1000000), 0);
	CHECK_EQ(fs_learn_distance(&l, 1000000 + LONG_FILES - 2), LONG_FILES - 2);
	CHECK_EQ(fs_learn_next(&l, next, 4, 4 * CHUNK, &gen), 4);
	CHECK_EQ(next[0], 1000000 + LONG_FILES - 1); /* the one in use, for the rest of it */
	CHECK_EQ(next[1], 1000000);
	CHECK_EQ(next[2], 1000001);
	fs_learn_fini(&l);
}

/*
 * A deleted file's record goes (fs_learn_forget): files made and deleted
 * every iteration, as activations are, leave none behind, and a cycle of
 * files that live goes on.
 */
static void test_forget(void)
{
	struct fs_learner l;
	struct fs_learn_stats st;

	CHECK_EQ(fs_learn_init(&l), 0);
	for (int it = 0; it < 4; it++) {
		iteration(&l, -1);
		for (uint64_t i = 0; i < 1000; i++) {
			uint64_t ino = 100000 + (uint64_t)it * 1000 + i;

			use(&l, ino, true);
			use(&l, ino, false);
			fs_learn_forget(&l, ino);
		}
		fs_learn_stats(&l, &st);
		CHECK_EQ(st.files, SGS * (3 + GRADS)); /* the cycle's files only */
	}
	fs_learn_forget(&l, 42); /* never known: nothing happens */
	fs_learn_forget(&l, file_id(0, 0));
	fs_learn_stats(&l, &st);
	CHECK_EQ(st.files, SGS * (3 + GRADS) - 1);
	CHECK_EQ(fs_learn_distance(&l, file_id(0, 0)), FS_LEARN_UNKNOWN);
	use(&l, file_id(0, 0), false); /* a file by that number again: known anew */
	fs_learn_stats(&l, &st);
	CHECK_EQ(st.files, SGS * (3 + GRADS));
	fs_learn_fini(&l);
}

int main(void)
{
	struct fs_learner l;
	struct fs_learn_stats st;
	uint64_t next[8], gen;

	CHECK_EQ(fs_learn_init(&l), 0);
	l.block = 1ULL << 20; /* the owner's block size: the cycle's blocks are counted */
	iteration(&l, -1);
	fs_learn_stats(&l, &st);
	CHECK_EQ(st.period, 0); /* one pass is no cycle yet */
	CHECK_EQ(fs_learn_distance(&l, file_id(0, 0)), FS_LEARN_UNKNOWN);
	iteration(&l, -1);
	iteration(&l, -1);
	fs_learn_stats(&l, &st);
	/* grads 6*3, then per subgroup 3 + 3 + 3 records */
	CHECK_EQ(st.period, SGS * GRADS + SGS * (3 + GRADS + 3));
	CHECK(st.confidence > 0.8);
	/* Each file once, whether its last use was a read or a write. */
	CHECK_EQ(st.bytes, SGS * (3 + GRADS) * FILE_BYTES);
	CHECK_EQ(st.blocks, SGS * (3 + GRADS) * (FILE_BYTES >> 20));
	CHECK_EQ(st.tails, 0);
	CHECK_EQ(st.written, st.blocks); /* the step rewrites every file it reads */
	{
		struct fs_learn_use u;

		fs_learn_next_use(&l, file_id(0, 0), &u);
		CHECK_EQ(u.size, FILE_BYTES);
	}

	/* Right after the step, subgroup 0's weights are next used after the
	 * backward pass: sooner than the last subgroup's, which were just used. */
	CHECK(fs_learn_distance(&l, file_id(0, 0)) < fs_learn_distance(&l, file_id(SGS - 1, 0)));
	CHECK_EQ(fs_learn_distance(&l, 999), FS_LEARN_UNKNOWN);

	/*
	 * What comes next to load: the backward pass writes the gradient files
	 * (nothing to read, so not loaded), then subgroup 0's state is read.
	 */
	CHECK(fs_learn_next(&l, next, 8, 4 * FILE_BYTES, &gen) >= 3);
	CHECK_EQ(next[0], file_id(0, 0));
	CHECK_EQ(next[1], file_id(0, 1));
	{
		struct fs_learn_use u;

		fs_learn_next_use(&l, file_id(SGS - 1, 3), &u);
		CHECK(u.write); /* the last subgroup's gradients are written next */
		fs_learn_next_use(&l, file_id(0, 0), &u);
		CHECK(!u.write); /* subgroup 0's weights are read next */
		CHECK(!u.now);
		fs_learn_next_use(&l, file_id(SGS - 1, 2), &u);
		CHECK(u.now); /* just written */
	}

	/* A skipped step keeps the cycle. */
	iteration(&l, 2);
	iteration(&l, -1);
	fs_learn_stats(&l, &st);
	CHECK(st.period != 0);

	/* Another workload drops it. */
	for (uint64_t i = 0; i < 400; i++)
		touch(&l, 5000 + (i * 7919) % 1000);
	fs_learn_stats(&l, &st);
	CHECK_EQ(st.period, 0);
	fs_learn_fini(&l);

	test_pipelined();
	test_use_goes_on();
	test_pipelined_stalls();
	test_period_holds();
	test_ranks();
	test_streams_full();
	test_long_cycle();
	test_forget();
	return 0;
}

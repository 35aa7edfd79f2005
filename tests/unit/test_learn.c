/*
 * Unit test of the access-trace learner: it finds the cycle of a
 * DeepSpeed-like optimizer step (gradients written, then per subgroup the
 * weights and Adam states read, gradients read, states written back), ranks
 * files by their next use, survives a skipped file, and drops the cycle when
 * the workload changes.
 */
#include "learn.h"
#include "test.h"

#define SGS 6
#define GRADS 3 /* gradient files per subgroup */

static uint64_t file_id(int sg, int kind)
{
	return 100 + (uint64_t)sg * 10 + (uint64_t)kind; /* kind 0..2 state, 3.. grads */
}

static void touch(struct fs_learner *l, uint64_t ino)
{
	fs_learn_touch(l, ino, 1 << 20);
}

/* One training iteration; skip_sg >= 0 leaves one subgroup's grads out. */
static void iteration(struct fs_learner *l, int skip_sg)
{
	for (int sg = SGS - 1; sg >= 0; sg--) /* backward: last layer first */
		for (int g = 0; g < GRADS; g++)
			if (sg != skip_sg)
				touch(l, file_id(sg, 3 + g));
	for (int sg = 0; sg < SGS; sg++) {
		for (int k = 0; k < 3; k++)
			touch(l, file_id(sg, k));
		for (int g = 0; g < GRADS; g++)
			if (sg != skip_sg)
				touch(l, file_id(sg, 3 + g));
		for (int k = 0; k < 3; k++)
			touch(l, file_id(sg, k));
	}
}

int main(void)
{
	struct fs_learner l;
	struct fs_learn_stats st;
	uint64_t next[8], gen;

	CHECK_EQ(fs_learn_init(&l), 0);
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

	/* Right after the step, subgroup 0's weights are next used after the
	 * backward pass: sooner than the last subgroup's, which were just used. */
	CHECK(fs_learn_distance(&l, file_id(0, 0)) < fs_learn_distance(&l, file_id(SGS - 1, 0)));
	CHECK_EQ(fs_learn_distance(&l, 999), FS_LEARN_UNKNOWN);

	/* What comes next: the backward pass's gradient files, last subgroup first. */
	CHECK(fs_learn_next(&l, next, 8, 64ULL << 20, &gen) >= 3);
	CHECK_EQ(next[0], file_id(SGS - 1, 3));

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
	return 0;
}

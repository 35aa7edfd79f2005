/*
 * Unit test of the learner's choice of period, on the uses it recorded in
 * a real run: the first 240 records of `swapbench --swapper pipelined
 * --params 1e8 --sub-group-size 2.5e7` through tensorfs (dram=800M), one
 * stream: the gradients and state written, then the first iterations, 116
 * or 120 uses each. The records are replayed into the learner's own
 * functions (this file includes learn.c).
 *
 * Two choices are checked:
 *   - A file recorded twice in a row (record 154: file 47, read and then
 *     written) made a period of 1 that fit, compared over one record, and
 *     it replaced the cycle learned so far. A period is now compared over
 *     MATCH_MIN records at least.
 *   - Once the cycle was known (120 records), a file that came late kept
 *     it from fitting for a moment, and a candidate 12 records short that
 *     fit worse than it took its place (records 217-233). A held period
 *     is now replaced only by one that fits better than it does.
 */
#include "learn.c"
#include "test.h"

static const uint16_t rec_ino[] = {
	6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29,
	30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52,
	53, 54, 55, 56, 57, 6, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 7, 6, 34, 58, 35, 36,
	37, 38, 39, 40, 41, 42, 43, 44, 45, 8, 22, 23, 24, 25, 26, 27, 28, 29, 59, 30, 31, 32, 33, 7,
	9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 60, 61, 8, 62, 63, 9, 64, 65, 10, 11, 12,
	13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35,
	36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 6,
	58, 59, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 7, 60, 6, 61, 58, 34, 35, 36, 37, 38,
	39, 40, 41, 42, 43, 44, 45, 8, 62, 59, 63, 7, 22, 23, 24, 25, 26, 27, 28, 60, 29, 30, 31, 32,
	33, 9, 64, 61, 65, 10, 11, 12, 8, 13, 14, 15, 16, 17, 18, 62, 19, 20, 21, 63, 9, 64, 65, 10,
	11, 12
};

static const uint8_t rec_write[] = {
	1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
	1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0,
	0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
	1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
	1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0,
	0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0,
	1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1
};

int main(void)
{
	struct fs_learner l;
	const size_t n = sizeof(rec_ino) / sizeof(rec_ino[0]);
	uint64_t seen = 0;

	CHECK_EQ(n, sizeof(rec_write));
	CHECK_EQ(fs_learn_init(&l), 0);
	for (size_t i = 0; i < n; i++) {
		struct learn_file *f = file_get(&l, rec_ino[i]);

		CHECK(f != NULL);
		if (!f->st)
			f->st = stream_get(&l, 1);
		CHECK(f->st != NULL);
		f->size = 100ULL << 20;
		record(&l, f, rec_write[i]);
		uint64_t p = f->st->period;

		/* No period shorter than the records it was compared over. */
		CHECK(p == 0 || p >= MATCH_MIN);
		/* The cycle once known (116 to 121 records) is kept. */
		if (p >= 115 && p <= 125)
			seen = i;
		if (seen)
			CHECK(p >= 115 && p <= 125);
	}
	CHECK(seen != 0);
	fs_learn_fini(&l);
	return 0;
}

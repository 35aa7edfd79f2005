/*
 * stamp.c - stamping and checking file contents.
 *
 * A STAMP_UNIT at file offset U holds, as 64-bit words: w[0] magic and file
 * id, w[1] iteration and generation, w[2] U, w[3] a seed hashed from those,
 * and pattern words w[i] = seed + i * STAMP_STEP.  The pattern words are the
 * first word of each KiB (DeepSpeed's thread slices start on 1 KiB
 * boundaries) and the unit's last word, or every word in full mode.
 */
#include <assert.h>
#include <errno.h>
#include <stdbool.h>
#include <inttypes.h>
#include <string.h>

#include "stamp.h"

#define STAMP_MAGIC 0x5357424eull /* "SWBN" */
#define STAMP_STEP 0x9e3779b97f4a7c15ull
#define STAMP_HEADER_WORDS 4u
#define STAMP_WORD sizeof(uint64_t)
/*
 * Sparse mode touches 5 cache lines in 64 per unit, which keeps stamping and
 * checking a few per cent of the I/O time where memory bandwidth is low;
 * full mode costs a pass over memory.
 */
#define STAMP_SPARSE_WORDS (1024u / STAMP_WORD)

/* Distance between pattern words; set once by stamp_set_full(). */
static size_t stamp_stride = STAMP_SPARSE_WORDS;

void stamp_set_full(bool full)
{
	stamp_stride = full ? 1 : STAMP_SPARSE_WORDS;
}

/* Index of the first pattern word of a unit. */
static size_t first_pattern_word(void)
{
	return stamp_stride == 1 ? STAMP_HEADER_WORDS : stamp_stride;
}

/* Whether word @i of a unit of @nwords words is a pattern word. */
static bool is_pattern_word(size_t i, size_t nwords)
{
	if (i < STAMP_HEADER_WORDS)
		return false;
	if (i == nwords - 1)
		return true;
	return i >= first_pattern_word() && (i - first_pattern_word()) % stamp_stride == 0;
}

/* splitmix64 finalizer: a cheap, well-mixed 64-bit hash. */
static uint64_t mix64(uint64_t x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebull;
	x ^= x >> 31;
	return x;
}

static uint64_t unit_seed(const struct stamp_key *key, uint64_t off)
{
	uint64_t k = (uint64_t)key->file_id << 32 | key->iter;

	return mix64(mix64(k ^ ((uint64_t)key->gen << 48)) ^ off);
}

static void unit_header(uint64_t *h, const struct stamp_key *key, uint64_t off)
{
	h[0] = STAMP_MAGIC << 32 | key->file_id;
	h[1] = (uint64_t)key->iter << 32 | key->gen;
	h[2] = off;
	h[3] = unit_seed(key, off);
}

static void fill_unit(uint64_t *w, size_t nwords, const struct stamp_key *key, uint64_t off)
{
	uint64_t h[STAMP_HEADER_WORDS];
	size_t stride = stamp_stride;
	uint64_t seed;
	size_t i;

	unit_header(h, key, off);
	seed = h[3];
	for (i = 0; i < STAMP_HEADER_WORDS && i < nwords; i++)
		w[i] = h[i];
	for (i = first_pattern_word(); i < nwords; i += stride)
		w[i] = seed + i * STAMP_STEP;
	if (nwords > STAMP_HEADER_WORDS)
		w[nwords - 1] = seed + (nwords - 1) * STAMP_STEP;
}

void stamp_fill(void *buf, uint64_t len, const struct stamp_key *key)
{
	uint64_t off;

	assert(len % SB_AIO_ALIGNED_BYTES == 0);
	for (off = 0; off < len; off += STAMP_UNIT) {
		uint64_t n = len - off < STAMP_UNIT ? len - off : STAMP_UNIT;

		fill_unit((uint64_t *)((char *)buf + off), n / STAMP_WORD, key, off);
	}
}

/* OR of the differences between a unit and what it should hold. */
static uint64_t unit_diff(const uint64_t *w, size_t nwords, const uint64_t *h)
{
	size_t stride = stamp_stride;
	uint64_t seed = h[3];
	uint64_t acc = 0;
	size_t i;

	for (i = 0; i < STAMP_HEADER_WORDS && i < nwords; i++)
		acc |= w[i] ^ h[i];
	for (i = first_pattern_word(); i < nwords; i += stride)
		acc |= w[i] ^ (seed + i * STAMP_STEP);
	if (nwords > STAMP_HEADER_WORDS)
		acc |= w[nwords - 1] ^ (seed + (nwords - 1) * STAMP_STEP);
	return acc;
}

/* Say what is wrong with a unit that differs, in one line. */
static void report_unit(const uint64_t *w, size_t nwords, const uint64_t *h, uint64_t off,
			const struct stamp_key *key, const char *path)
{
	uint32_t got_iter = (uint32_t)(w[1] >> 32);
	uint32_t got_gen = (uint32_t)w[1];
	size_t i;

	if (w[0] == h[0] && w[2] == h[2] && w[1] != h[1] &&
	    w[3] == unit_seed(&(struct stamp_key){key->file_id, got_iter, got_gen}, off)) {
		if (got_iter != key->iter)
			sb_err("verify: %s offset %" PRIu64 ": expected iter %u got iter %u", path,
			       off, key->iter, got_iter);
		else
			sb_err("verify: %s offset %" PRIu64
			       ": expected micro-batch %u got micro-batch %u (iter %u)",
			       path, off, key->gen, got_gen, got_iter);
		return;
	}
	if ((w[0] >> 32) == STAMP_MAGIC && w[0] != h[0]) {
		sb_err("verify: %s offset %" PRIu64 ": block of file id %u (offset %" PRIu64
		       ", iter %u) where file id %u belongs",
		       path, off, (uint32_t)w[0], w[2], got_iter, key->file_id);
		return;
	}
	if (w[0] == h[0] && w[2] != h[2] && (w[2] % STAMP_UNIT) == 0) {
		sb_err("verify: %s offset %" PRIu64 ": holds the block of offset %" PRIu64
		       " (iter %u)",
		       path, off, w[2], got_iter);
		return;
	}
	for (i = 0; i < nwords; i++) {
		uint64_t want = i < STAMP_HEADER_WORDS ? h[i] : h[3] + i * STAMP_STEP;

		if (i >= STAMP_HEADER_WORDS && !is_pattern_word(i, nwords))
			continue;
		if (w[i] != want) {
			sb_err("verify: %s offset %" PRIu64 ": expected 0x%016" PRIx64
			       " got 0x%016" PRIx64 " (iter %u)",
			       path, off + i * STAMP_WORD, want, w[i], key->iter);
			return;
		}
	}
}

int stamp_check(const void *buf, uint64_t len, const struct stamp_key *key, const char *path,
		struct sb_verify *v)
{
	uint64_t h[STAMP_HEADER_WORDS];
	uint64_t off;
	int ret = 0;

	assert(len % SB_AIO_ALIGNED_BYTES == 0);
	for (off = 0; off < len; off += STAMP_UNIT) {
		uint64_t n = len - off < STAMP_UNIT ? len - off : STAMP_UNIT;
		const uint64_t *w = (const uint64_t *)((const char *)buf + off);
		size_t nwords = n / STAMP_WORD;

		unit_header(h, key, off);
		if (!unit_diff(w, nwords, h))
			continue;
		ret = -EIO;
		v->errors++;
		if (v->reported++ < SB_MAX_REPORTED_ERRORS)
			report_unit(w, nwords, h, off, key, path);
		else if (v->reported == SB_MAX_REPORTED_ERRORS + 1)
			sb_err("verify: more errors, no longer printed");
	}
	v->checked_bytes += len;
	return ret;
}
